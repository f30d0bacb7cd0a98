// The CUDA half of a connection's codec in a build without CUDA: there is none, and the
// encoder and decoder refuse CUDA storages (cuda_records.hpp).
#include "ferry/detail/cuda_records.hpp"

namespace ferry::detail {

std::unique_ptr<CudaRecordWriter> CudaRecordWriter::make(const std::optional<SharedAllocator>& /*pool*/) {
  return nullptr;
}

std::unique_ptr<CudaRecordReader> CudaRecordReader::make() { return nullptr; }

}  // namespace ferry::detail
