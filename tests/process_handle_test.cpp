// ProcessHandle, the one liveness helper: a pidfd opened with the process's start time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "ferry/detail/process_handle.hpp"
#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

using std::chrono::milliseconds;

class ProcessHandleTest : public test::LeakCheckedTest {};

TEST_F(ProcessHandleTest, ExitedFollowsTheProcessThroughItsZombieState) {
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  detail::UniqueFd release_read(ends[0]);
  detail::UniqueFd release_write(ends[1]);
  const pid_t child = test::fork_child([&] {
    release_write.reset();
    char byte = 0;
    CHILD_CHECK(::read(release_read.get(), &byte, 1) == 0);  // until the parent closes its end
  });
  release_read.reset();
  {
    const detail::ProcessHandle handle = detail::ProcessHandle::open(child);
    ASSERT_TRUE(handle) << "pidfd_open failed with errno " << handle.error();
    EXPECT_EQ(handle.pid(), child);
    EXPECT_EQ(handle.error(), 0);
    const auto identity = detail::identify_process(child);
    ASSERT_TRUE(identity.has_value());
    EXPECT_EQ(handle.identity(), *identity);
    EXPECT_FALSE(handle.exited());
    release_write.reset();                            // the child exits, and stays a zombie:
    EXPECT_TRUE(handle.exited(milliseconds(10000)));  // nobody reaps it before the check
    EXPECT_TRUE(test::child_succeeded(child));
    EXPECT_TRUE(handle.exited());
  }
  // Reaped: no such process any more (a pid is not reused this soon).
  const detail::ProcessHandle gone = detail::ProcessHandle::open(child);
  EXPECT_FALSE(gone);
  EXPECT_EQ(gone.error(), ESRCH);
  EXPECT_TRUE(gone.exited());
}

TEST_F(ProcessHandleTest, AnIdentityWhosePidNowNamesAnotherProcessReadsAsExited) {
  const detail::ProcessIdentity self = detail::current_process();
  const detail::ProcessHandle handle = detail::ProcessHandle::open(self);
  ASSERT_TRUE(handle);
  EXPECT_EQ(handle.identity(), self);
  EXPECT_FALSE(handle.exited());

  const detail::ProcessHandle earlier =
      detail::ProcessHandle::open(detail::ProcessIdentity{self.pid, self.start_time + 1});
  EXPECT_FALSE(earlier) << "the pid now names a later process";
  EXPECT_EQ(earlier.error(), ESRCH);
  EXPECT_TRUE(earlier.exited());
}

TEST_F(ProcessHandleTest, AnInvalidPidOpensNothingAndIsNotCalledExited) {
  const detail::ProcessHandle none = detail::ProcessHandle::open(pid_t{0});
  EXPECT_FALSE(none);
  EXPECT_EQ(none.error(), EINVAL);
  EXPECT_FALSE(none.exited());
  const detail::ProcessHandle moved_from = [] {
    detail::ProcessHandle handle = detail::ProcessHandle::open(::getpid());
    detail::UniqueFd fd = handle.release_fd();
    EXPECT_TRUE(fd);
    EXPECT_FALSE(handle);
    return handle;
  }();
  EXPECT_FALSE(moved_from);
}

}  // namespace
}  // namespace ferry
