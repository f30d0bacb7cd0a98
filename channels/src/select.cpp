#include "ferry/select.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>

namespace ferry {
namespace {

// How often a transport without a pollable descriptor is re-checked.
constexpr std::chrono::microseconds kRecheckInterval{200};

}  // namespace

std::size_t Selector::add_core(detail::ReceiverCore& core) {
  cores_.push_back(&core);
  ++active_;
  return cores_.size() - 1;
}

void Selector::remove(std::size_t index) {
  if (index < cores_.size() && cores_[index] != nullptr) {
    cores_[index] = nullptr;
    --active_;
  }
}

bool Selector::contains(std::size_t index) const noexcept { return index < cores_.size() && cores_[index] != nullptr; }

std::size_t Selector::wait() {
  if (empty()) throw Error("Selector::wait() on an empty set would wait for ever; add a receiver first");
  return *wait_until(Deadline::never());
}

std::optional<std::size_t> Selector::wait_for(std::chrono::nanoseconds timeout) {
  return wait_until(Deadline::after(timeout));
}

std::optional<std::size_t> Selector::try_wait() { return wait_until(Deadline::now()); }

std::optional<std::size_t> Selector::wait_until(const Deadline& deadline) {
  const std::size_t count = cores_.size();
  std::vector<bool> ready(count, false);
  std::vector<pollfd> fds;
  std::vector<std::size_t> owners;  // fds[i] belongs to cores_[owners[i]]
  while (true) {
    // Frames already in user space count as ready: poll() cannot see them.
    fds.clear();
    owners.clear();
    std::fill(ready.begin(), ready.end(), false);
    bool any_buffered = false;
    bool unpollable = false;
    for (std::size_t index = 0; index < count; ++index) {
      detail::ReceiverCore* core = cores_[index];
      if (core == nullptr) continue;
      if (core->has_buffered_frame()) {
        ready[index] = any_buffered = true;
        continue;
      }
      const int fd = core->readiness_fd();
      // Without a descriptor that reports data (none at all, or a ring's companion socket,
      // which reports only a hang-up), the receiver is re-checked at short intervals.
      if (fd < 0 || !core->readiness_fd_reports_data()) unpollable = true;
      if (fd < 0) continue;
      fds.push_back(pollfd{fd, POLLIN, 0});
      owners.push_back(index);
    }
    if (fds.empty() && !unpollable && !any_buffered) {
      if (!deadline.is_never()) return std::nullopt;
      throw Error("Selector::wait(): no receiver in the set can become ready");
    }

    // With a frame buffered, look at the descriptors without waiting: the pick among
    // everything ready must be fair.
    timespec zero{};
    timespec left{};
    const timespec* timeout = nullptr;
    if (any_buffered) {
      timeout = &zero;
    } else if (!deadline.is_never()) {
      left = deadline.remaining_timespec();
      timeout = &left;
    }
    timespec recheck{};
    if (unpollable && !any_buffered) {
      recheck.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(kRecheckInterval).count();
      if (timeout == nullptr || recheck.tv_sec < left.tv_sec ||
          (recheck.tv_sec == left.tv_sec && recheck.tv_nsec < left.tv_nsec)) {
        timeout = &recheck;
      }
    }
    const int rc = fds.empty() && timeout == &zero ? 0 : ::ppoll(fds.data(), fds.size(), timeout, nullptr);
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw_errno("ppoll in Selector::wait");
    }
    for (std::size_t i = 0; rc > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) ready[owners[i]] = true;
    }
    // Receivers without a descriptor that reports data are looked at again after the wait.
    for (std::size_t index = 0; unpollable && index < count; ++index) {
      if (cores_[index] != nullptr && !ready[index] &&
          (cores_[index]->readiness_fd() < 0 || !cores_[index]->readiness_fd_reports_data()) &&
          cores_[index]->has_buffered_frame()) {
        ready[index] = true;
      }
    }
    for (std::size_t step = 0; step < count; ++step) {
      const std::size_t index = (next_ + step) % count;
      if (ready[index]) {
        next_ = index + 1;
        return index;
      }
    }
    if (deadline.expired()) return std::nullopt;
  }
}

}  // namespace ferry
