// The CUDA runtime, loaded with dlopen when ferry first uses CUDA: a ferry built with the
// CUDA toolkit links no CUDA library, so a program that never touches a GPU needs neither
// the toolkit to build against an installed ferry nor the runtime to run (see
// docs/design/cuda-runtime-loading.md). Only for builds with CUDA (FERRY_HAS_CUDA == 1).
#pragma once

#include <cuda_runtime_api.h>

namespace ferry::cuda {

// The CUDA runtime functions ferry calls, by name. Add one here to call it (as
// cudart().name(...)); its type is the one the headers ferry was built with declare.
// (clang-format 14 cannot lay a macro list out the same way twice: it is left as written.)
// clang-format off
#define FERRY_CUDART_FUNCTIONS(X)                                                                                \
  X(cudaDeviceGetByPCIBusId) X(cudaDeviceGetPCIBusId) X(cudaEventCreateWithFlags) X(cudaEventDestroy)             \
  X(cudaEventRecord) X(cudaFree) X(cudaGetDevice) X(cudaGetDeviceCount) X(cudaGetDriverEntryPointByVersion)       \
  X(cudaGetErrorName) X(cudaGetErrorString) X(cudaGetLastError) X(cudaIpcCloseMemHandle) X(cudaIpcGetEventHandle) \
  X(cudaIpcGetMemHandle) X(cudaIpcOpenEventHandle) X(cudaIpcOpenMemHandle) X(cudaMalloc) X(cudaMemcpyAsync)       \
  X(cudaMemset) X(cudaMemsetAsync) X(cudaSetDevice) X(cudaStreamCreateWithFlags) X(cudaStreamQuery)               \
  X(cudaStreamSynchronize) X(cudaStreamWaitEvent)
// clang-format on

/// Pointers to the loaded runtime's functions, one member per FERRY_CUDART_FUNCTIONS entry.
struct Cudart {
// NOLINTNEXTLINE(bugprone-macro-parentheses): `name` is a declarator's name, never an expression
#define FERRY_CUDART_MEMBER(name) decltype(&::name) name = nullptr;
  FERRY_CUDART_FUNCTIONS(FERRY_CUDART_MEMBER)
#undef FERRY_CUDART_MEMBER
};

/// The CUDA runtime, loaded on the first call (thread-safe) and kept for the process's
/// lifetime: the soname of the toolkit ferry was built with (found on the library path, or
/// in that toolkit's library folder). Throws CudaError, saying what is missing, when it
/// cannot be loaded or lacks a function; every later call throws the same.
const Cudart& cudart();

}  // namespace ferry::cuda
