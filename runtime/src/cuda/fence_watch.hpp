// Receivers' streams must not wait for ever on a fence whose producer died before its stream
// wrote it (a SIGKILL while the work before a send was still queued: the driver drops that
// work, and the fence's value never comes). Measured on an H200: such a stream stays blocked
// (and so does every cudaStreamSynchronize on it) until someone writes the value. Private to
// runtime/src/cuda.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "ferry/detail/cuda/ipc.hpp"

namespace ferry::cuda {

/// Remembers that a stream of this process waits for the word at `offset` of `buffer` (an
/// opened fence buffer of `producer`, on local device `device`). When the producer exits, a
/// thread of this process writes into every such word a value that all waits on it pass, so
/// those streams go on (the storages' contents are then undefined, and the producer's
/// channels report PeerDied). Where pidfds are not available, warns once and watches nothing.
void watch_fence(pid_t producer, const std::shared_ptr<ReceivedCudaRange>& buffer, std::uint64_t offset, int device);

/// Fence values written by this process because their producer died (for cuda_ipc_stats()).
std::uint64_t fences_released_for_dead_producers() noexcept;

}  // namespace ferry::cuda
