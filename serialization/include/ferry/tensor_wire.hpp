// How a Tensor is written into a message: dtype, device, shape, strides, storage offset
// and the index of its storage in the frame's handle table. The storage's bytes are not
// part of the body; the frame's handle table says how the receiver maps them.
#pragma once

#include "ferry/detail/archive.hpp"
#include "ferry/tensor.hpp"

namespace ferry {

/// Writes `tensor`; its storage (moved into shared memory first if it lives on the heap)
/// is added to the frame's handle table once, however many views of it the message holds.
void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const Tensor& tensor);

/// Reads a tensor and rebuilds it as a view of the received storage, after checking
/// dtype, dimensions, handle index and that the view stays inside the storage
/// (ProtocolError naming the failed check otherwise).
void CEREAL_LOAD_FUNCTION_NAME(detail::FrameInputArchive& archive, Tensor& tensor);

}  // namespace ferry
