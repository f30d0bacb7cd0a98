// Copies between the CPU and CUDA devices: one cudaMemcpy for dense tensors, staging
// through host memory for strided ones.
#include <string>

#include "cuda/cudart.hpp"
#include "cuda/memory.hpp"
#include "ferry/cuda/runtime.hpp"
#include "ferry/tensor.hpp"

namespace ferry::cuda {
namespace {

// Bytes from a tensor's first element to just past the last element it can reach.
std::size_t span_bytes(const Tensor& tensor) {
  std::int64_t last = 0;
  for (std::size_t d = 0; d < tensor.shape().size(); ++d) last += (tensor.shape()[d] - 1) * tensor.strides()[d];
  return static_cast<std::size_t>(last + 1) * tensor.element_size();
}

// Copies `bytes` with cudaMemcpyDefault (unified addressing tells the directions apart) on
// the current stream of `device`, and waits for it. A copy to or from pageable host memory
// blocks inside the driver until the stream gets to it, so the stream is waited for by
// polling first (see wait_for_stream).
void copy_bytes(void* destination, const void* source, std::size_t bytes, int device) {
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  wait_for_stream(stream, "waiting for cuda:" + std::to_string(device) + " before a copy");
  check_cuda(cuda::cudart().cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream),
             "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes (cuda:" + std::to_string(device) + ")");
  wait_for_stream(stream, "waiting for a copy on cuda:" + std::to_string(device));
}

// A CPU tensor with the layout of `tensor` (a CUDA tensor) and a copy of the bytes it spans.
Tensor download(const Tensor& tensor) {
  const std::size_t bytes = span_bytes(tensor);
  auto storage = Storage::allocate(bytes, Device::Cpu);
  copy_bytes(storage->data(), tensor.data_ptr(), bytes, tensor.device().index);
  return Tensor::from_storage(std::move(storage), tensor.dtype(), tensor.shape(), tensor.strides(), 0);
}

}  // namespace

void copy(const Tensor& destination, const Tensor& source) {
  // Tensor::copy_from checked shapes and dtypes, and that there is at least one element.
  const int device = destination.device().is_cpu() ? source.device().index : destination.device().index;
  if (destination.is_contiguous() && source.is_contiguous()) {
    copy_bytes(destination.data_ptr(), source.data_ptr(), destination.nbytes(), device);
    return;
  }
  const Tensor host_source = source.device().is_cpu() ? source : download(source);
  Tensor target = destination;  // a view: copying into it writes destination's elements
  if (target.device().is_cpu()) {
    target.copy_from(host_source);
    return;
  }
  if (target.is_contiguous()) {
    const Tensor dense = host_source.contiguous();
    copy_bytes(target.data_ptr(), dense.data_ptr(), target.nbytes(), device);
    return;
  }
  // A strided device destination: read the bytes it spans, write its elements, put them back.
  Tensor staged = download(target);
  staged.copy_from(host_source);
  copy_bytes(target.data_ptr(), staged.data_ptr(), span_bytes(target), device);
}

}  // namespace ferry::cuda
