#include "support/copied_frame.hpp"

namespace ferry::test {

std::deque<std::shared_ptr<Storage>> deliver_copies(const std::vector<iovec>& copies) {
  std::deque<std::shared_ptr<Storage>> storages;
  for (const iovec& copy : copies) {
    auto storage = Storage::allocate(copy.iov_len, Device::SharedCpu);
    if (copy.iov_len > 0) std::memcpy(storage->data(), copy.iov_base, copy.iov_len);
    storages.push_back(std::move(storage));
  }
  return storages;
}

}  // namespace ferry::test
