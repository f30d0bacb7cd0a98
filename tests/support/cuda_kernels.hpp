// Small CUDA kernels for the GPU tests (compiled by nvcc; see cuda_kernels.cu). Each returns
// the launch's error; the caller checks it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::test {

/// Sets `count` floats at `data` to `value`, on `stream`.
cudaError_t fill_on_device(float* data, std::int64_t count, float value, cudaStream_t stream);

/// Like fill_on_device, but the kernel first spins for `delay_ns` nanoseconds of GPU time:
/// a slow write that the host does not wait for.
cudaError_t slow_fill_on_device(float* data, std::int64_t count, float value, std::uint64_t delay_ns,
                                cudaStream_t stream);

/// Counts, with a kernel on `stream`, the floats at `data` that differ from `expected`, and
/// waits for the answer.
cudaError_t count_mismatches_on_device(const float* data, std::int64_t count, float expected, cudaStream_t stream,
                                       unsigned long long* mismatches);

}  // namespace ferry::test
