// The test-support library's own promises: exit codes and signals as documented, nothing a test
// starts outlives it (its whole process group dies with the handle), output captured apart or
// interleaved, temporary directories removed, free ports bindable.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/net.h"

namespace ampscope::testing {
namespace {

using namespace std::chrono_literals;

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST(ChildProcessTest, ReportsExitCodesSignalsAndTimeouts) {
  TempDir dir;
  ChildProcess exits({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, dir / "a.log");
  EXPECT_EQ(exits.wait(10s), 7);
  EXPECT_EQ(lines_of(exits.log()), (std::vector<std::string>{"out", "err"}));

  ChildProcess killed({"/bin/sh", "-c", "kill -TERM $$"}, dir / "b.log");
  EXPECT_EQ(killed.wait(10s), 128 + SIGTERM);

  ChildProcess sleeper({"/bin/sleep", "30"}, dir / "c.log");
  EXPECT_EQ(sleeper.wait(50ms), -1);
  EXPECT_TRUE(sleeper.running());
  EXPECT_EQ(sleeper.stop(5s), 128 + SIGTERM);
  EXPECT_FALSE(sleeper.running());
}

TEST(ChildProcessTest, StopKillsWhatIgnoresSigterm) {
  TempDir dir;
  // A shell that ignores SIGTERM and runs until killed; "ready" once the trap is set.
  ChildProcess stubborn({"/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"},
                        dir / "log");
  for (int i = 0; i < 200 && stubborn.log().empty(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(stubborn.stop(200ms), -1) << "-1: it outlived the grace period and was killed";
  EXPECT_FALSE(stubborn.running());
}

// The handle kills the child's whole group: a grandchild does not outlive the test either.
TEST(ChildProcessTest, DestructionKillsTheWholeProcessGroup) {
  TempDir dir;
  const auto pid_file = dir / "grandchild.pid";
  pid_t grandchild = -1;
  {
    ChildProcess parent({"/bin/sh", "-c", "sleep 30 & echo $! > " + pid_file.string() + "; wait"},
                        dir / "log");
    for (int i = 0; i < 500 && read_text(pid_file).empty(); ++i) std::this_thread::sleep_for(10ms);
    grandchild = static_cast<pid_t>(std::stoi(read_text(pid_file)));
    ASSERT_TRUE(alive(grandchild));
  }
  // The grandchild is reaped by init once killed; give it a moment.
  for (int i = 0; i < 500 && alive(grandchild); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(alive(grandchild));
}

TEST(RunProcessTest, CapturesOutputApartOrInterleavedAndKillsAtTheTimeout) {
  const CommandResult r = run_process({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");

  std::string both;
  EXPECT_EQ(run_to_completion({"/bin/sh", "-c", "echo a; echo b >&2"}, &both), 0);
  EXPECT_EQ(lines_of(both), (std::vector<std::string>{"a", "b"}));

  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run_process({"/bin/sleep", "30"}, 200ms).code, -1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);

  EXPECT_FALSE(find_in_path("sh").empty());
  EXPECT_TRUE(find_in_path("no-such-program-ampscope").empty());
}

TEST(TempDirTest, IsFreshAndRemovedWithEverythingInIt) {
  std::filesystem::path kept;
  {
    TempDir a, b;
    EXPECT_NE(a.path(), b.path());
    EXPECT_TRUE(std::filesystem::is_empty(a.path()));
    std::filesystem::create_directories(a / "x/y");
    write_text(a / "x/y/z.txt", "one\ntwo");
    EXPECT_EQ(read_text(a / "x/y/z.txt"), "one\ntwo");
    EXPECT_EQ(lines_of(read_text(a / "x/y/z.txt")), (std::vector<std::string>{"one", "two"}));
    kept = a.path();
  }
  EXPECT_FALSE(std::filesystem::exists(kept));
  EXPECT_EQ(read_text(kept / "x/y/z.txt"), "");
}

TEST(FreePortTest, TheReturnedPortCanBeBound) {
  const int port = free_loopback_port();
  ASSERT_GT(port, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
}

}  // namespace
}  // namespace ampscope::testing
