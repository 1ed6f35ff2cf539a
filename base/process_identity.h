// A process, named so that another process on the same machine can tell whether it is
// still running: its pid, its start time (so a reused pid is not mistaken for it), and
// the machine and pid namespace it lives in (so a pid is only read where it means the
// same process). Ranks publish theirs at connection; a peer that shares shared memory
// with a rank checks it while it waits on it (transport/ucx/ucx_transport_impl.h).
//
// Why not kill(pid, 0). A process killed while its parent has not wait()ed for it yet is
// a zombie: it holds no memory, runs nothing and will never write to the shared memory
// its peers read, yet its pid still exists, so kill(pid, 0) and UCX's own process check
// say it is alive (issue 42: its peers then waited for their whole deadline). Its state
// in /proc/PID/stat is 'Z' (or 'X' while it is torn down): that is what observe() reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradcomm::detail {

struct ProcessIdentity {
  uint64_t pid = 0;
  uint64_t start_ticks = 0;    // /proc/PID/stat field 22: clock ticks after boot
  uint64_t pid_namespace = 0;  // the inode of /proc/self/ns/pid
  std::string boot_id;         // /proc/sys/kernel/random/boot_id: one boot of one machine

  // Little-endian u64 pid | u64 start_ticks | u64 pid_namespace | u32 length | boot id.
  std::vector<uint8_t> serialize() const;
  // nullopt for bytes that are not such a record (a boot id of at most 64 bytes).
  static std::optional<ProcessIdentity> parse(const std::vector<uint8_t>& bytes);
};

// This process; nullopt where /proc cannot tell (no procfs mounted).
std::optional<ProcessIdentity> this_process();

enum class ProcessState : uint8_t {
  kRunning,  // running or sleeping: alive
  kStopped,  // stopped by a signal or traced (SIGSTOP, a debugger): alive, but runs nothing
  kZombie,   // exited, not yet reaped by its parent (or being torn down)
  kGone,     // no such process any more (or its pid now belongs to another process)
};
const char* process_state_name(ProcessState state);

// The state of `process` as this process sees it; nullopt when it cannot be observed
// from here (another machine, another pid namespace, or no procfs).
std::optional<ProcessState> observe(const ProcessIdentity& process);

// Parses the text of /proc/PID/stat: the state letter and the start time (field 22).
// nullopt when the text is not such a line. Pure: tests feed it names with spaces and
// parentheses, which the line carries unescaped.
struct StatLine {
  char state = '?';
  uint64_t start_ticks = 0;
};
std::optional<StatLine> parse_stat_line(const std::string& text);

}  // namespace gradcomm::detail
