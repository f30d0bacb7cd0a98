// ferry.channel(), ferry.duplex() and what they share with spawn and the fan-outs: the
// transport named as C++'s transport_name() and ChannelOptions taken from keyword
// arguments with C++'s names and defaults (durations in seconds).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "ferry/channel_options.hpp"

namespace ferry::python {

/// The transport named `name` (C++'s transport_name(): "pipe", "unix_socket", "shm_ring",
/// "in_process"; "unix" is kept as another name of "unix_socket"); ValueError otherwise.
Transport transport_named(const std::string& name);

/// ChannelOptions from a dict of keyword arguments (ring_capacity, ring_spin,
/// peer_check_interval, queue_capacity, close_linger, limits); TypeError naming the
/// accepted ones for any other key.
ChannelOptions channel_options(const pybind11::dict& options);

/// Adds _ferry._make_channel, _ferry._make_duplex and _ferry._call_for to `module`.
void bind_channels(pybind11::module_& module);

}  // namespace ferry::python
