#include "support/cuda_kernels.hpp"

namespace ferry::test {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

int blocks_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

__device__ unsigned long long global_time_ns() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void fill_kernel(float* data, std::int64_t count, float value) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = value;
  }
}

// One block, so that the delay is paid once, not once per wave of blocks.
__global__ void slow_fill_kernel(float* data, std::int64_t count, float value, unsigned long long delay_ns) {
  const unsigned long long start = global_time_ns();
  while (global_time_ns() - start < delay_ns) {
  }
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) data[i] = value;
}

__global__ void count_kernel(const float* data, std::int64_t count, float expected, unsigned long long* mismatches) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    mine += data[i] != expected ? 1 : 0;
  }
  if (mine != 0) atomicAdd(mismatches, mine);
}

}  // namespace

cudaError_t fill_on_device(float* data, std::int64_t count, float value, cudaStream_t stream) {
  fill_kernel<<<blocks_for(count), kThreads, 0, stream>>>(data, count, value);
  return cudaGetLastError();
}

cudaError_t slow_fill_on_device(float* data, std::int64_t count, float value, std::uint64_t delay_ns,
                                cudaStream_t stream) {
  slow_fill_kernel<<<1, kThreads, 0, stream>>>(data, count, value, delay_ns);
  return cudaGetLastError();
}

cudaError_t count_mismatches_on_device(const float* data, std::int64_t count, float expected, cudaStream_t stream,
                                       unsigned long long* mismatches) {
  unsigned long long* counter = nullptr;
  cudaError_t status = cudaMalloc(&counter, sizeof *counter);
  if (status != cudaSuccess) return status;
  status = cudaMemsetAsync(counter, 0, sizeof *counter, stream);
  if (status == cudaSuccess) {
    count_kernel<<<blocks_for(count), kThreads, 0, stream>>>(data, count, expected, counter);
    status = cudaGetLastError();
  }
  if (status == cudaSuccess)
    status = cudaMemcpyAsync(mismatches, counter, sizeof *counter, cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  const cudaError_t freed = cudaFree(counter);
  return status != cudaSuccess ? status : freed;
}

}  // namespace ferry::test
