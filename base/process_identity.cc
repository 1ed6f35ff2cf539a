#include "process_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "bytes.h"

namespace gradcomm::detail {

namespace {

constexpr size_t kMaxBootId = 64;

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// /proc/PID/stat's text; `gone` says whether it failed because there is no such process
// (ENOENT, ESRCH), as against anything else (out of descriptors, a procfs that hides it),
// which must never read as a death.
std::optional<std::string> read_stat(uint64_t pid, bool& gone) {
  gone = false;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    gone = errno == ENOENT || errno == ESRCH;
    return std::nullopt;
  }
  char buffer[1024];
  std::string text;
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      gone = got < 0 && errno == ESRCH;  // the process went between the open and the read
      if (got < 0) text.clear();
      break;
    }
    text.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  if (text.empty()) return std::nullopt;
  return text;
}

std::optional<std::string> boot_id() {
  auto text = read_file("/proc/sys/kernel/random/boot_id");
  if (!text) return std::nullopt;
  while (!text->empty() && (text->back() == '\n' || text->back() == ' ')) text->pop_back();
  if (text->empty() || text->size() > kMaxBootId) return std::nullopt;
  return text;
}

std::optional<uint64_t> pid_namespace() {
  struct stat st{};
  if (::stat("/proc/self/ns/pid", &st) != 0) return std::nullopt;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace

std::vector<uint8_t> ProcessIdentity::serialize() const {
  std::vector<uint8_t> out(28 + boot_id.size());
  put_u64(out.data(), pid);
  put_u64(out.data() + 8, start_ticks);
  put_u64(out.data() + 16, pid_namespace);
  put_u32(out.data() + 24, static_cast<uint32_t>(boot_id.size()));
  for (size_t i = 0; i < boot_id.size(); ++i) out[28 + i] = static_cast<uint8_t>(boot_id[i]);
  return out;
}

std::optional<ProcessIdentity> ProcessIdentity::parse(const std::vector<uint8_t>& bytes) {
  if (bytes.size() < 28) return std::nullopt;
  const uint32_t length = get_u32(bytes.data() + 24);
  if (length > kMaxBootId || bytes.size() != 28 + static_cast<size_t>(length)) return std::nullopt;
  ProcessIdentity p;
  p.pid = get_u64(bytes.data());
  p.start_ticks = get_u64(bytes.data() + 8);
  p.pid_namespace = get_u64(bytes.data() + 16);
  p.boot_id.assign(bytes.begin() + 28, bytes.end());
  if (p.pid == 0 || p.pid > INT32_MAX) return std::nullopt;
  return p;
}

std::optional<StatLine> parse_stat_line(const std::string& text) {
  // "PID (COMM) S PPID ...": COMM may hold spaces and parentheses, so the fields start
  // after the last ')'. Field 3 is the state, field 22 the start time.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return std::nullopt;
  std::istringstream rest(text.substr(close + 2));
  StatLine line;
  std::string field;
  if (!(rest >> field) || field.size() != 1) return std::nullopt;
  line.state = field[0];
  for (int index = 4; index <= 22; ++index) {
    if (!(rest >> field)) return std::nullopt;
    if (index == 22) {
      char* end = nullptr;
      errno = 0;
      line.start_ticks = std::strtoull(field.c_str(), &end, 10);
      if (errno != 0 || end == field.c_str() || *end != '\0') return std::nullopt;
    }
  }
  return line;
}

std::optional<ProcessIdentity> this_process() {
  const auto stat = read_file("/proc/self/stat");
  const auto line = stat ? parse_stat_line(*stat) : std::nullopt;
  const auto boot = boot_id();
  const auto ns = pid_namespace();
  if (!line || !boot || !ns) return std::nullopt;
  return ProcessIdentity{static_cast<uint64_t>(::getpid()), line->start_ticks, *ns, *boot};
}

std::optional<ProcessState> observe(const ProcessIdentity& process) {
  static const std::optional<std::string> boot = boot_id();
  static const std::optional<uint64_t> ns = pid_namespace();
  if (!boot || !ns || *boot != process.boot_id || *ns != process.pid_namespace) return std::nullopt;
  bool gone = false;
  const auto stat = read_stat(process.pid, gone);
  if (!stat) {
    if (gone) return ProcessState::kGone;  // no /proc/PID: reaped
    return std::nullopt;                   // cannot tell now (descriptors, permissions): not a death
  }
  const auto line = parse_stat_line(*stat);
  if (!line) return std::nullopt;
  if (line->start_ticks != process.start_ticks) return ProcessState::kGone;  // the pid was reused
  switch (line->state) {
    case 'Z':
    case 'X':
    case 'x':
      return ProcessState::kZombie;
    case 'T':
    case 't':
      return ProcessState::kStopped;
    default:
      return ProcessState::kRunning;
  }
}

const char* process_state_name(ProcessState state) {
  switch (state) {
    case ProcessState::kRunning: return "running";
    case ProcessState::kStopped: return "stopped (by a signal such as SIGSTOP, or a debugger)";
    case ProcessState::kZombie: return "a zombie (it exited; its parent has not reaped it yet)";
    case ProcessState::kGone: return "gone";
  }
  return "unknown";
}

}  // namespace gradcomm::detail
