// Runs one multi-process job (a shell command, usually gradcomm-run starting a
// worker) and parses the "RESULT key=value ... [message=free text]" lines its
// ranks print. Shared by the multi-process test files.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace gradcomm::testing {

struct Job {
  int exit_code = -1;
  std::string output;
  std::vector<std::map<std::string, std::string>> results;  // key=value pairs of each RESULT line
};

// The key=value pairs of every "RESULT ..." line in `output`.
inline std::vector<std::map<std::string, std::string>> parse_results(const std::string& output) {
  std::vector<std::map<std::string, std::string>> results;
  static const std::regex kResult(R"(RESULT (.*))");
  static const std::regex kPair(R"((\w+)=(\S+))");
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, kResult)) continue;
    std::map<std::string, std::string> fields;
    std::string rest = m[1];
    if (const auto at = rest.find("message="); at != std::string::npos) {  // free text, to the end of the line
      fields["message"] = rest.substr(at + 8);
      rest = rest.substr(0, at);
    }
    for (std::sregex_iterator it(rest.begin(), rest.end(), kPair), end; it != end; ++it) fields[(*it)[1]] = (*it)[2];
    results.push_back(fields);
  }
  return results;
}

// `command` should bound its own run time (timeout -k ...) and merge stderr (2>&1).
inline Job run_command(const std::string& command) {
  Job job;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return job;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) job.output += buffer;
  const int status = pclose(pipe);
  job.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  job.results = parse_results(job.output);
  return job;
}

}  // namespace gradcomm::testing
