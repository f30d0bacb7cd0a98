// A seccomp-BPF filter answers fallocate(2) with a chosen errno: the way an unprivileged
// test makes the reservation of a shared segment fail as it does when the kernel's shared
// memory is exhausted (ENOSPC) or a memory cgroup is at its limit (ENOMEM). memfds live on
// the kernel's internal tmpfs, which has no size limit of its own, so that cannot be
// provoked without privileges; the library's code path is exactly the real one, only the
// errno comes from the filter.
#include "support/syscall_fault.hpp"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace ferry::test {
namespace {

#if defined(__x86_64__)
constexpr std::uint32_t kNativeArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
#else
constexpr std::uint32_t kNativeArch = 0;
#endif

// Offsets of the low and high 32-bit halves of fallocate's `len` argument (the fourth),
// on the little-endian architectures above.
constexpr std::uint32_t kLengthLow = offsetof(seccomp_data, args) + 3 * sizeof(std::uint64_t);
constexpr std::uint32_t kLengthHigh = kLengthLow + sizeof(std::uint32_t);

}  // namespace

namespace {

std::string install(sock_filter* program, std::size_t length) {
  sock_fprog filter{static_cast<unsigned short>(length), program};
  // Without privileges, a filter may only be installed by a process that can never gain
  // any (no set-uid exec): PR_SET_NO_NEW_PRIVS.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return std::string("PR_SET_NO_NEW_PRIVS: ") + std::strerror(errno);
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) != 0) {
    return std::string("seccomp filters are not available here: ") + std::strerror(errno);
  }
  return "";
}

// Installs the filter made of the prelude every filter here starts with (a system call of
// another architecture passes; the call's number is loaded) followed by `rules`.
std::string install_after_prelude(std::initializer_list<sock_filter> rules) {
  std::vector<sock_filter> program{
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kNativeArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
  };
  program.insert(program.end(), rules);
  return install(program.data(), program.size());
}

// The filter's answer that fails a call with `error`.
std::uint32_t fail_with(int error) {
  return SECCOMP_RET_ERRNO | (static_cast<std::uint32_t>(error) & SECCOMP_RET_DATA);
}

}  // namespace

std::string fail_syscall(long number, int error) {
  if (kNativeArch == 0) return "no seccomp filter is written for this architecture";
  return install_after_prelude({
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(number), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, fail_with(error)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  });
}

std::string fail_fcntl_command(int command, int error) {
  if (kNativeArch == 0) return "no seccomp filter is written for this architecture";
  constexpr std::uint32_t kCommand = offsetof(seccomp_data, args) + sizeof(std::uint64_t);  // low half
  return install_after_prelude({
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fcntl, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kCommand),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(command), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, fail_with(error)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  });
}

std::string fail_fallocate_from(std::uint64_t min_bytes, int error) {
  if (kNativeArch == 0) return "no seccomp filter is written for this architecture";
  if (min_bytes >= (std::uint64_t{1} << 32)) return "min_bytes must be below 4 GiB";
  const std::uint32_t fail = fail_with(error);
  return install_after_prelude({
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kLengthHigh),  // len >= 4 GiB: fail
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, fail),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kLengthLow),
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, static_cast<std::uint32_t>(min_bytes), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, fail),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  });
}

std::string syscall_faults_unavailable_reason() {
  static const std::string reason = [] {
    const pid_t child = ::fork();
    if (child < 0) return std::string("fork failed: ") + std::strerror(errno);
    if (child == 0) ::_exit(fail_fallocate_from(1, ENOSPC).empty() ? 0 : 1);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
      if (errno != EINTR) return std::string("waitpid failed: ") + std::strerror(errno);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::string();
    return std::string("a child could not install a seccomp filter (PR_SET_SECCOMP refused)");
  }();
  return reason;
}

}  // namespace ferry::test
