// The end of a received body that its transport has not read yet: the input archive reads it
// as it gets there, a large array straight from the transport into its destination.
#pragma once

#include <cstddef>

namespace ferry::detail {

/// The bytes of a received body after its first ready() ones, still in the transport (a
/// stream reader hands a large message out before its body arrived: StreamFrameReader).
/// They are read in order, each once: fill() reads them into their place in the body the
/// archive views, read_out() reads the next ones into memory of the caller's instead (a
/// vector's storage), so that they are copied once, by the kernel, as a raw read copies them.
class PendingBody {
 public:
  /// How many of the body's bytes, from its start, are in place or were read out.
  virtual std::size_t ready() const noexcept = 0;
  /// Reads body bytes into place until at least `end` (at most the body's size) are
  /// ready(); returns ready(). Throws PeerDied when the sender vanishes first.
  virtual std::size_t fill(std::size_t end) = 0;
  /// Reads the `size` bytes after the ready() ones into `into` (at most up to the body's
  /// end); they count as ready() then, and their place in the body is left unwritten.
  virtual void read_out(std::byte* into, std::size_t size) = 0;

 protected:
  ~PendingBody() = default;
};

}  // namespace ferry::detail
