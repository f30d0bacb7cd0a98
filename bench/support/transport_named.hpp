// The transports the diagnostics programs take on their command line, by short name.
#pragma once

#include <stdexcept>
#include <string>

#include "ferry/ferry.hpp"

namespace ferry::bench {

/// "in-process", "pipe", "socket" or "ring"; throws std::invalid_argument naming the choices
/// for anything else.
inline Transport transport_named(const std::string& name) {
  if (name == "in-process") return Transport::InProcess;
  if (name == "pipe") return Transport::Pipe;
  if (name == "socket") return Transport::UnixSocket;
  if (name == "ring") return Transport::ShmRing;
  throw std::invalid_argument("unknown transport " + name + " (in-process, pipe, socket or ring)");
}

}  // namespace ferry::bench
