// The introspection server's entry points inside the library (the public ones are in
// ferry/introspection.hpp).
#pragma once

#include "ferry/introspection.hpp"

namespace ferry::detail {

/// Turns introspection on when FERRY_INTROSPECT=1; reports a failure on stderr (the program
/// goes on without it). Called once, as the library's channel layer starts (live_ends.cpp).
bool start_introspection_from_environment() noexcept;

/// The server's own counters (zero when it never ran).
IntrospectionServerStats introspection_server_stats() noexcept;

}  // namespace ferry::detail
