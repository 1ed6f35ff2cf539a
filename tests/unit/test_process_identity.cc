// base/process_identity.h: a process's state as a peer on the same machine sees it,
// a zombie counted as exited (issue 42, item 1), and the record ranks publish.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "process_identity.h"

namespace gradcomm::detail {
namespace {

using namespace std::chrono_literals;

TEST(ProcessIdentity, StatLineFieldsAreReadAfterTheLastParenthesis) {
  // The command name may hold spaces and parentheses.
  const std::string line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
  const auto parsed = parse_stat_line(line);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->state, 'S');
  EXPECT_EQ(parsed->start_ticks, 987654u);
  EXPECT_FALSE(parse_stat_line("4242 (truncated) Z 1 2"));
  EXPECT_FALSE(parse_stat_line("no parenthesis at all"));
  EXPECT_FALSE(parse_stat_line("1 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19"));
}

TEST(ProcessIdentity, RecordRoundTripsAndRefusesGarbage) {
  const auto me = this_process();
  ASSERT_TRUE(me);
  const auto back = ProcessIdentity::parse(me->serialize());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->pid, me->pid);
  EXPECT_EQ(back->start_ticks, me->start_ticks);
  EXPECT_EQ(back->pid_namespace, me->pid_namespace);
  EXPECT_EQ(back->boot_id, me->boot_id);
  auto bytes = me->serialize();
  bytes.pop_back();
  EXPECT_FALSE(ProcessIdentity::parse(bytes));
  EXPECT_FALSE(ProcessIdentity::parse({}));
  EXPECT_FALSE(ProcessIdentity::parse(std::vector<uint8_t>(28, 0)));  // pid 0
}

TEST(ProcessIdentity, ThisProcessRunsAndAnotherMachinesCannotBeObserved) {
  const auto me = this_process();
  ASSERT_TRUE(me);
  EXPECT_EQ(observe(*me), ProcessState::kRunning);
  ProcessIdentity elsewhere = *me;
  elsewhere.boot_id = "00000000-0000-0000-0000-000000000000";
  EXPECT_FALSE(observe(elsewhere));
  ProcessIdentity other_namespace = *me;
  other_namespace.pid_namespace += 1;
  EXPECT_FALSE(observe(other_namespace));
  ProcessIdentity reused = *me;  // this pid, another start: the process it named is gone
  reused.start_ticks += 1;
  EXPECT_EQ(observe(reused), ProcessState::kGone);
}

// A child's life as its peers see it: running, stopped, a zombie until it is reaped
// (kill(pid, 0) says "alive" then), gone after.
TEST(ProcessIdentity, ZombieAndStoppedChildrenAreToldApart) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto me = this_process();
    const auto bytes = me ? me->serialize() : std::vector<uint8_t>{};
    (void)!::write(ready[1], bytes.data(), bytes.size());
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  std::vector<uint8_t> bytes(256);
  const ssize_t got = ::read(ready[0], bytes.data(), bytes.size());
  ::close(ready[0]);
  ASSERT_GT(got, 0);
  bytes.resize(static_cast<size_t>(got));
  const auto identity = ProcessIdentity::parse(bytes);
  ASSERT_TRUE(identity);
  EXPECT_EQ(observe(*identity), ProcessState::kRunning);

  const auto wait_for = [&](ProcessState want) {
    for (int i = 0; i < 500 && observe(*identity) != want; ++i) std::this_thread::sleep_for(10ms);
    return observe(*identity);
  };
  ::kill(child, SIGSTOP);
  EXPECT_EQ(wait_for(ProcessState::kStopped), ProcessState::kStopped);
  ::kill(child, SIGCONT);
  EXPECT_EQ(wait_for(ProcessState::kRunning), ProcessState::kRunning);
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_for(ProcessState::kZombie), ProcessState::kZombie);
  EXPECT_EQ(::kill(child, 0), 0) << "a zombie's pid exists: the check this replaces says alive";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(observe(*identity), ProcessState::kGone);
}

}  // namespace
}  // namespace gradcomm::detail
