#include "support/leak_check.hpp"

#include <dirent.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "ferry/shared_allocator.hpp"

namespace ferry::test {
namespace {

std::set<std::string> entries(const char* path) {
  std::set<std::string> names;
  DIR* dir = ::opendir(path);
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.insert(std::move(name));
  }
  ::closedir(dir);
  return names;
}

// The names in `after` that are not in `before`, for a failure message.
std::string added_names(const std::set<std::string>& before, const std::set<std::string>& after) {
  std::string added;
  for (const auto& name : after) {
    if (!before.contains(name)) added += (added.empty() ? "" : ", ") + name;
  }
  return added.empty() ? "none added (some were removed)" : added;
}

// Entries that other programs of this suite create while ctest runs tests in parallel:
// Python multiprocessing's semaphores and shared_memory blocks, torch's file_system
// strategy, Intel OpenMP's registration. ferry itself names nothing in /dev/shm.
bool made_by_another_program(const std::string& name) {
  for (const char* prefix : {"sem.mp-", "psm_", "torch_", "__KMP_REGISTERED_LIB_"}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace

std::size_t count_open_fds() {
  // opendir itself holds one fd while counting.
  return entries("/proc/self/fd").size() - 1;
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names = entries("/dev/shm");
  std::erase_if(names, made_by_another_program);
  return names;
}

std::size_t count_dev_shm_entries() { return dev_shm_entries().size(); }

std::size_t count_ferry_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);) {
    // Tensor segments are "/memfd:ferry (deleted)"; return boards are "/memfd:ferry-returns".
    if (line.find("/memfd:ferry (deleted)") != std::string::npos) ++count;
  }
  return count;
}

std::size_t count_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);) ++count;
  return count;
}

std::size_t count_shared_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);) {
    // "start-end perms ...": the fourth permission letter is 's' for MAP_SHARED.
    const std::size_t perms = line.find(' ');
    if (perms != std::string::npos && perms + 4 < line.size() && line[perms + 4] == 's') ++count;
  }
  return count;
}

void LeakCheckedTest::SetUp() {
  release_cached_shared_memory();
  fds_before_ = count_open_fds();
  shm_before_ = dev_shm_entries();
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
  const std::set<std::string> shm_after = dev_shm_entries();
  EXPECT_EQ(shm_after.size(), shm_before_.size()) << "/dev/shm entries leaked: " << added_names(shm_before_, shm_after);
}

}  // namespace ferry::test
