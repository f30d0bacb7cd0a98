// Making one system call fail on purpose, in a forked child, to test how ferry handles an
// error that this machine cannot produce for real (see syscall_fault.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace ferry::test {

/// Installs a seccomp filter in the calling process under which every fallocate(2) (what
/// posix_fallocate calls) asking for at least `min_bytes` bytes fails with `error` without
/// reaching the kernel's file system; every other system call runs as usual. The filter
/// cannot be removed: call this only in a forked child. `min_bytes` must be below 4 GiB.
/// Returns "" once installed, otherwise why it could not be (no seccomp here, an
/// unsupported architecture).
std::string fail_fallocate_from(std::uint64_t min_bytes, int error);

/// Installs a seccomp filter in the calling process under which every call of system call
/// `number` fails with `error` (as under a container's seccomp profile, or on a kernel
/// that lacks the call: ENOSYS). Forked children only, as above; returns "" once installed.
std::string fail_syscall(long number, int error);

/// Installs a seccomp filter under which every fcntl(2) with command `command` (its second
/// argument, e.g. F_SETPIPE_SZ) fails with `error`; other fcntl commands and other calls run
/// as usual. Forked children only, as above; returns "" once installed.
std::string fail_fcntl_command(int command, int error);

/// "" when fail_fallocate_from() works here (asked once, in a forked child); otherwise why not.
std::string syscall_faults_unavailable_reason();

}  // namespace ferry::test

/// Skips the current test, naming the reason, when system calls cannot be made to fail.
#define FERRY_SKIP_WITHOUT_SYSCALL_FAULTS()                                                               \
  do {                                                                                                    \
    if (const std::string reason = ::ferry::test::syscall_faults_unavailable_reason(); !reason.empty()) { \
      GTEST_SKIP() << "needs a seccomp filter to make fallocate fail: " << reason;                        \
    }                                                                                                     \
  } while (false)
