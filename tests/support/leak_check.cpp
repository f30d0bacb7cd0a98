#include "support/leak_check.hpp"

#include <dirent.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "ferry/shared_allocator.hpp"

namespace ferry::test {
namespace {

std::size_t count_entries(const char* path) {
  DIR* dir = ::opendir(path);
  if (dir == nullptr) return 0;
  std::size_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") ++count;
  }
  ::closedir(dir);
  return count;
}

}  // namespace

std::size_t count_open_fds() {
  // opendir itself holds one fd while counting.
  return count_entries("/proc/self/fd") - 1;
}

std::size_t count_dev_shm_entries() { return count_entries("/dev/shm"); }

std::size_t count_ferry_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);) {
    // Tensor segments are "/memfd:ferry (deleted)"; return boards are "/memfd:ferry-returns".
    if (line.find("/memfd:ferry (deleted)") != std::string::npos) ++count;
  }
  return count;
}

void LeakCheckedTest::SetUp() {
  release_cached_shared_memory();
  fds_before_ = count_open_fds();
  shm_before_ = count_dev_shm_entries();
}

void LeakCheckedTest::TearDown() {
  // Cached shared memory is not a leak: give it back first (this also collects the blocks
  // that receivers returned or that dead receivers held). Children may still be closing
  // their ends; give the kernel a moment to settle.
  release_cached_shared_memory();
  for (int attempt = 0; attempt < 50 && count_open_fds() != fds_before_; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    release_cached_shared_memory();
  }
  EXPECT_EQ(count_open_fds(), fds_before_) << "file descriptors leaked";
  EXPECT_EQ(count_dev_shm_entries(), shm_before_) << "/dev/shm entries leaked";
}

}  // namespace ferry::test
