#include "error_text.hpp"

#include <array>
#include <utility>

namespace ferry::python {
namespace {

// Longer phrases first: a phrase may contain a shorter one.
constexpr std::array<std::pair<std::string_view, std::string_view>, 18> kPythonNames{{
    {"; a program that uses the spawn start method must call ferry::init(argc, argv) first thing in main()",
     "; the new interpreter ended before it reached ferry's worker entry (its stderr says why)"},
    {"use SpawnOptions::start_method = StartMethod::Spawn (the worker registered with FERRY_WORKER, and ferry::init "
     "in main)",
     "use ferry.spawn(..., start_method='spawn')"},
    {"set SpawnOptions::fork_with_threads", "pass fork_with_threads=True to ferry.spawn"},
    {"signal(SIGCHLD, SIG_DFL)", "signal.signal(signal.SIGCHLD, signal.SIG_DFL)"},
    {"(or use StartMethod::Fork)", "(or use start_method='fork')"},
    {"WorkerGroup::join()", "the join() of the group ferry.spawn returned"},
    {"ChannelOptions::close_linger", "the channel's close_linger option"},
    {"ChannelOptions::ring_capacity", "the channel's ring_capacity option"},
    {"ChannelOptions::limits.", "the channel's limits option "},
    {"FrameLimits::max_fds", "the max_fds of the channel's limits option"},
    {"Transport::Pipe, UnixSocket or ShmRing", "transport='pipe', 'unix_socket' or 'shm_ring'"},
    {"EndpointOptions::connect_timeout", "the timeout argument"},
    {"EndpointOptions::transport", "transport argument"},
    {"Selector::wait()", "Selector.wait()"},
    {"Selector::add()", "Selector.add()"},
    {"Tensor::clone()", "a copy"},
    {"Transport::InProcess", "transport='in_process'"},
    {"FanoutOptions::max_in_flight", "max_in_flight"},
}};

}  // namespace

std::string python_error_text(std::string_view message) {
  std::string text(message);
  for (const auto& [cpp, python] : kPythonNames) {
    for (std::size_t at = text.find(cpp); at != std::string::npos; at = text.find(cpp, at + python.size())) {
      text.replace(at, cpp.size(), python);
    }
  }
  return text;
}

}  // namespace ferry::python
