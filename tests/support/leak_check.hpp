// Counting a process's open fds and /dev/shm entries, to prove tests leak nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

namespace ferry::test {

/// Number of open file descriptors of this process.
std::size_t count_open_fds();
/// Number of entries in /dev/shm.
std::size_t count_dev_shm_entries();
/// Number of memory mappings of ferry memfds in this process (lines of /proc/self/maps
/// that name "/memfd:ferry").
std::size_t count_ferry_mappings();

/// A fixture that records fds and /dev/shm entries in SetUp and checks in TearDown that
/// both returned to their starting values.
class LeakCheckedTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

 private:
  std::size_t fds_before_ = 0;
  std::size_t shm_before_ = 0;
};

}  // namespace ferry::test
