// A preloadable library that records when each send and receive system call of a process
// starts and ends (CLOCK_MONOTONIC, shared by all processes), for scripts/round-trip-timeline:
// it splits a two-process round trip into the time spent inside the sends, the peers'
// wake-ups and each side's own work. Diagnostics only; never linked into ferry.
//
// Each process appends fixed-size records to $FERRY_TIMELINE_DIR/<pid> through a shared
// mapping (no buffering, so a process that ends with _exit loses nothing). Calls on fds 0-2
// are not recorded.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

enum class Kind : std::int32_t { Send = 1, Receive = 2 };

// Little-endian on disk as in memory: start, end, result (bytes moved, or -1), kind, fd.
struct Record {
  std::int64_t start_ns;
  std::int64_t end_ns;
  std::int64_t result;
  std::int32_t kind;
  std::int32_t fd;
};

constexpr std::size_t kMaxRecords = 1 << 20;

std::int64_t now_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return std::int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// The calling process's records (re-opened after fork: the pid changes).
struct Log {
  pid_t owner = 0;
  Record* records = nullptr;
  std::size_t count = 0;
};
Log g_log;

Record* next_record() {
  const pid_t pid = ::getpid();
  if (g_log.owner != pid) {
    g_log = Log{pid, nullptr, 0};
    const char* dir = std::getenv("FERRY_TIMELINE_DIR");
    if (dir == nullptr) return nullptr;
    char path[4096];
    std::snprintf(path, sizeof path, "%s/%d", dir, static_cast<int>(pid));
    const int fd = ::open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return nullptr;
    if (::ftruncate(fd, sizeof(Record) * kMaxRecords) == 0) {
      void* memory = ::mmap(nullptr, sizeof(Record) * kMaxRecords, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (memory != MAP_FAILED) g_log.records = static_cast<Record*>(memory);
    }
    ::close(fd);
  }
  if (g_log.records == nullptr || g_log.count == kMaxRecords) return nullptr;
  return &g_log.records[g_log.count++];
}

void record(Kind kind, int fd, std::int64_t start_ns, ssize_t result) {
  if (fd <= 2) return;
  const int saved_errno = errno;  // the caller reads the real call's errno
  const std::int64_t end_ns = now_ns();
  if (Record* slot = next_record()) *slot = Record{start_ns, end_ns, result, static_cast<std::int32_t>(kind), fd};
  errno = saved_errno;
}

// The libc definition that the wrapper of `name` hides.
template <class Function>
Function* next_definition(const char* name) {
  return reinterpret_cast<Function*>(::dlsym(RTLD_NEXT, name));
}

// Calls `real(fd, rest...)` and records it as a `kind` call on `fd`.
template <class Function, class... Rest>
ssize_t timed(Kind kind, Function* real, int fd, Rest... rest) {
  const std::int64_t start = now_ns();
  const ssize_t result = real(fd, rest...);
  record(kind, fd, start, result);
  return result;
}

}  // namespace

extern "C" {

ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  static auto* real = next_definition<ssize_t(int, const msghdr*, int)>("sendmsg");
  return timed(Kind::Send, real, fd, message, flags);
}

ssize_t recvmsg(int fd, msghdr* message, int flags) {
  static auto* real = next_definition<ssize_t(int, msghdr*, int)>("recvmsg");
  return timed(Kind::Receive, real, fd, message, flags);
}

ssize_t writev(int fd, const iovec* parts, int count) {
  static auto* real = next_definition<ssize_t(int, const iovec*, int)>("writev");
  return timed(Kind::Send, real, fd, parts, count);
}

ssize_t write(int fd, const void* data, size_t size) {
  static auto* real = next_definition<ssize_t(int, const void*, size_t)>("write");
  return timed(Kind::Send, real, fd, data, size);
}

ssize_t read(int fd, void* data, size_t size) {
  static auto* real = next_definition<ssize_t(int, void*, size_t)>("read");
  return timed(Kind::Receive, real, fd, data, size);
}

}  // extern "C"
