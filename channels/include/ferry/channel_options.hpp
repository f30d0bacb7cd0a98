// What a user chooses when making a channel: its transport (Transport) and its settings
// (ChannelOptions). ferry/channel.hpp includes it.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/frame_limits.hpp"
#include "ferry/shared_allocator.hpp"

namespace ferry {

/// The kinds of channel ferry offers; pick one when creating a channel.
enum class Transport {
  Pipe,        ///< a pipe for frames (plus a socket pair beside it); storages by /proc/<pid>/fd
  UnixSocket,  ///< a Unix stream socket; storages' memfds travel as SCM_RIGHTS
  ShmRing,     ///< a ring buffer in a shared memfd (ring_transport.hpp); storages by /proc/<pid>/fd
  InProcess,   ///< a queue between threads of one process; values are moved, not serialized
  Ucx,         ///< UCX across hosts (ucx:// endpoints, library ferry::ucx): tensors' bytes travel, copied
};

/// "pipe", "unix_socket", "shm_ring", "in_process" or "ucx".
std::string_view transport_name(Transport transport);

/// The transport whose transport_name() is `name`; std::nullopt when there is none.
std::optional<Transport> transport_from_name(std::string_view name);

/// Outcome of FrameReader::read.
enum class ReadStatus {
  Frame,    ///< a whole frame was read
  Timeout,  ///< the deadline passed before a frame began
  Closed,   ///< the peer closed its end cleanly (a Close frame) or this end was closed
};

/// How long a waiting end of a shared-memory ring spins before it sleeps on its futex by
/// default: 20 us where the machine has more than one CPU, 0 (sleep at once) otherwise.
std::chrono::nanoseconds default_ring_spin();

/// How the ends of a shared-memory ring (Transport::ShmRing) wait.
struct RingTiming {
  /// Time an end that has nothing to do (no frame, no room) spins before it sleeps; a
  /// setting above an hour counts as an hour.
  std::chrono::nanoseconds spin = default_ring_spin();
  /// How often an end checks that its peer still exists: a waiting end whose peer died
  /// (or dropped its end) learns it within about this long, and a sending end checks at
  /// most this often while it finds room. At least 1 ms; above an hour counts as an hour.
  std::chrono::milliseconds peer_check_interval{100};
};

/// Settings of a channel.
struct ChannelOptions {
  /// Limits the receiver enforces on incoming frames.
  FrameLimits limits{};
  /// Bytes of the ring buffer (Transport::ShmRing); rounded up to a power of two, at
  /// least 4 KiB. Frames larger than the ring still pass: they stream through it.
  std::size_t ring_capacity = std::size_t{1} << 20;
  /// How long a ring end with nothing to do spins before it sleeps on its futex
  /// (Transport::ShmRing); 0 sleeps at once; above an hour counts as an hour.
  std::chrono::nanoseconds ring_spin = default_ring_spin();
  /// How often a waiting ring end checks that its peer still exists: a peer that died is
  /// reported (ChannelClosed / PeerDied) within about this long (Transport::ShmRing);
  /// 1 ms at least, an hour at most.
  std::chrono::milliseconds peer_check_interval{100};
  /// Values an InProcess channel holds before send() blocks (Transport::InProcess).
  std::size_t queue_capacity = 1024;
  /// How long close() waits, in all: for room to write the end of the stream (a 56-byte
  /// frame) when the pipe, socket or ring has no room even for that (a receiver that
  /// stopped reading then gets PeerDied instead of end-of-stream; with room for it, close()
  /// does not wait for that), and for the receiver to map storages it was sent by /proc
  /// path (Transport::Pipe and ShmRing: the sender's fds must stay open until then). A
  /// receiver in the sender's own process is not waited for: close() returns at once and
  /// keeps those fds until it has read them, and the process's normal exit waits for them,
  /// at most this long, in case a forked child took the receiver over.
  std::chrono::milliseconds close_linger{10'000};
  /// Memory isolation between peers. Empty (the default): a storage travels from whatever
  /// segment it lives in (usually one of the process-wide caching allocator's), so the
  /// receiver maps whole segments that may also hold blocks sent to other peers. Set to a
  /// pool (`SharedAllocator(settings)`, one per peer): the channel passes only segments of
  /// that pool; a storage from anywhere else is copied into the pool for each send, and a
  /// heap storage moves into the pool. Allocate tensors for this peer from the pool
  /// (`Tensor::empty(shape, dtype, pool)`) to send them without a copy.
  std::optional<SharedAllocator> pool;
  /// A label for the channel's ends in introspection (ferry::snapshot(), `ferry ps`,
  /// `ferry top`); empty by default. Never sent to the peer.
  std::string name;

  /// The ring's waiting settings (ring_spin, peer_check_interval) as the transport takes them.
  RingTiming ring_timing() const noexcept { return RingTiming{ring_spin, peer_check_interval}; }
};

}  // namespace ferry
