// What a transport says when the other side of a channel went away, in one place, so
// that every transport names the same possible causes and where to look next.
#pragma once

#include "ferry/error.hpp"

namespace ferry::detail {

/// A send found the receiving end gone.
inline constexpr const char* kReceiverGone =
    "cannot send: the receiving end was closed or its process died; if the peer is a spawned worker, "
    "WorkerGroup::join() says how it ended";
/// A receive found the sender gone between frames, without an end of stream.
inline constexpr const char* kSenderGone =
    "the sender went away without closing the channel: its process died, its Sender was dropped by an exception, "
    "or its close() gave up because this end did not read for ChannelOptions::close_linger; if the peer is a "
    "spawned worker, WorkerGroup::join() says how it ended";
/// A receive found the sender gone with a frame half written.
inline constexpr const char* kSenderGoneMidFrame =
    "the sender went away in the middle of a frame: its process died, or its close() gave up because this end did "
    "not read for ChannelOptions::close_linger; if the peer is a spawned worker, WorkerGroup::join() says how it "
    "ended";

/// Throws ChannelClosed saying kReceiverGone.
[[noreturn]] inline void throw_receiver_gone() { throw ChannelClosed(kReceiverGone); }

}  // namespace ferry::detail
