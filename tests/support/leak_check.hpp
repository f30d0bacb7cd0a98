// Counting a process's open fds and /dev/shm entries, to prove tests leak nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string>

namespace ferry::test {

/// Number of open file descriptors of this process.
std::size_t count_open_fds();
/// Number of entries in /dev/shm, less those of the suite's Python and torch tests that
/// ctest may run beside this one (see dev_shm_entries()).
std::size_t count_dev_shm_entries();
/// Names of the entries in /dev/shm, less those other programs of the suite make while
/// running in parallel (multiprocessing's "sem.mp-*" and "psm_*", torch's "torch_*").
std::set<std::string> dev_shm_entries();
/// Number of memory mappings of ferry's tensor segments in this process (lines of
/// /proc/self/maps that name "/memfd:ferry"; return boards, "/memfd:ferry-returns", are
/// not counted).
std::size_t count_ferry_mappings();
/// Number of memory mappings of this process (lines of /proc/self/maps).
std::size_t count_mappings();
/// The shared (MAP_SHARED) lines of /proc/self/maps: a sanitizer's allocator maps only private memory.
std::size_t count_shared_mappings();

/// A fixture that records fds and /dev/shm entries in SetUp and checks in TearDown that
/// both returned to their starting values. Both first empty the shared-memory cache
/// (release_cached_shared_memory()): cached segments hold fds, but are not leaks.
class LeakCheckedTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

 private:
  std::size_t fds_before_ = 0;
  std::set<std::string> shm_before_;
};

}  // namespace ferry::test
