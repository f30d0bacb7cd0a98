// CUDA support as a user sees it: whether this build and this machine have it, the
// controls of ferry's caching device allocator, and the error CUDA failures raise.
// Usable in every build: without CUDA, cuda_built() is false, cuda_device_count() is 0 and
// allocating a CUDA tensor throws Error saying so.
//
// CUDA does not survive fork(): a process that forks workers which use CUDA must not touch
// CUDA (these functions included, except cuda_built()) before it forks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/error.hpp"

namespace ferry {

/// A CUDA runtime call failed, or CUDA cannot do what was asked (no device, out of device
/// memory). `code()` is the cudaError_t value; the message names the call, CUDA's own
/// description and what to do.
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// True when ferry was built with CUDA (FERRY_HAS_CUDA is 1 for code compiled against it).
bool cuda_built() noexcept;

/// Number of CUDA devices this process can use: 0 when ferry was built without CUDA, when no
/// driver is installed, or when there is no device. Initialises CUDA in this process.
int cuda_device_count();

/// True when cuda_device_count() > 0.
bool cuda_available();

/// Why CUDA tensors cannot be used in this process ("" when they can): "ferry was built
/// without CUDA", or the CUDA runtime's own explanation (no driver, no device, ...).
std::string cuda_unavailable_reason();

/// Frees every device range of this process that waited in the producer's limbo (a storage
/// this process sent and then dropped) and that all its receivers have let go since (or whose
/// receivers died). The allocator also does this on every free and when it runs short of
/// memory; call it to see memory come back sooner. Returns the bytes freed.
std::size_t cuda_collect();

/// Gives the allocator's cached device blocks that hold no storage back to CUDA (cudaFree),
/// after collect(). Returns the bytes given back.
std::size_t cuda_empty_cache();

/// The state of ferry's caching allocator on one device.
struct CudaMemoryStats {
  std::size_t reserved_bytes = 0;   ///< bytes of every block obtained with cudaMalloc
  std::size_t allocated_bytes = 0;  ///< bytes of live storages (rounded to the allocator's 512 B)
  std::size_t limbo_bytes = 0;      ///< bytes of dropped storages that receivers still hold
  std::size_t limbo_ranges = 0;     ///< storages in limbo
  std::size_t blocks = 0;           ///< blocks obtained with cudaMalloc and not yet freed
};

/// Statistics of the allocator of `device` (all zero when nothing was allocated there).
CudaMemoryStats cuda_memory_stats(int device);

/// Counters of the receiving side of CUDA IPC in this process.
struct CudaIpcStats {
  std::uint64_t blocks_opened = 0;         ///< cudaIpcOpenMemHandle calls so far
  std::uint64_t blocks_closed = 0;         ///< cudaIpcCloseMemHandle calls so far
  std::uint64_t blocks_open = 0;           ///< blocks of other processes mapped now
  std::uint64_t events_opened = 0;         ///< cudaIpcOpenEventHandle calls so far (the fallback signal)
  std::uint64_t fence_buffers_opened = 0;  ///< other processes' fence buffers opened so far (the usual signal)
  std::uint64_t fences_released = 0;       ///< fences this process wrote itself because their producer died first
};

/// The receiving side's IPC counters of this process.
CudaIpcStats cuda_ipc_stats();

}  // namespace ferry
