// For the multi-process tests that are their own launcher (they must leave a victim
// unreaped, or end a stopped one): start one rank of a worker with the launcher's
// variables, read its log, and list /dev/shm to show nothing was left there.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gradcomm::testing {

inline std::set<std::string> dev_shm_names() {
  std::set<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') names.insert(e->d_name);
    }
    ::closedir(dir);
  }
  return names;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Forks rank `rank` of `ranks`: RANK, WORLD_SIZE, then `env` (name, value; an empty value
// unsets it), stdout and stderr to `log`, exec `worker` with `args`.
inline pid_t start_rank(const char* worker, int rank, int ranks,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  for (const auto& [name, value] : env) {
    if (value.empty()) {
      ::unsetenv(name.c_str());
    } else {
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  std::vector<char*> argv{const_cast<char*>(worker)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(worker, argv.data());
  ::_exit(127);
}

}  // namespace gradcomm::testing
