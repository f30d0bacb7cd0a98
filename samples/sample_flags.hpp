// Command-line flags of the samples: --name value, --switch, --help.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ferry/channel_options.hpp"
#include "ferry/spawn.hpp"

namespace samples {

/// Parsed flags; unknown flags are an error.
class Flags {
 public:
  /// `known` maps every accepted flag ("--transport") to its help text; switches end in "!".
  Flags(int argc, char** argv, std::map<std::string, std::string> known, std::string_view usage)
      : known_(std::move(known)) {
    for (int i = 1; i < argc; ++i) {
      const std::string name = argv[i];
      if (name == "--help" || name == "-h") {
        std::printf("%.*s\n", static_cast<int>(usage.size()), usage.data());
        for (const auto& [flag, help] : known_) std::printf("  %-16s %s\n", flag.c_str(), help.c_str());
        std::exit(0);
      }
      auto it = known_.find(name);
      if (it == known_.end()) throw std::invalid_argument("unknown flag " + name + " (see --help)");
      if (!it->second.empty() && it->second.back() == '!') {
        values_[name] = "1";
      } else {
        if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
        values_[name] = argv[++i];
      }
    }
  }

  std::string text(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  long number(const std::string& name, long fallback, long minimum = 1) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    char* end = nullptr;
    const long value = std::strtol(it->second.c_str(), &end, 10);
    if (end == it->second.c_str() || *end != '\0' || value < minimum) {
      throw std::invalid_argument(name + " needs a whole number of at least " + std::to_string(minimum) + ", not " +
                                  it->second);
    }
    return value;
  }
  bool enabled(const std::string& name) const { return values_.count(name) != 0; }

  ferry::Transport transport() const {
    const std::string name = text("--transport", "unix_socket");
    const std::optional<ferry::Transport> transport = ferry::transport_from_name(name);
    if (!transport) throw std::invalid_argument("unknown transport " + name + " (pipe, unix_socket, shm_ring)");
    return *transport;
  }
  ferry::StartMethod start_method() const {
    const std::string name = text("--start", "fork");
    if (name == "fork") return ferry::StartMethod::Fork;
    if (name == "spawn") return ferry::StartMethod::Spawn;
    throw std::invalid_argument("--start is fork or spawn, not " + name);
  }

 private:
  std::map<std::string, std::string> known_;
  std::map<std::string, std::string> values_;
};

}  // namespace samples
