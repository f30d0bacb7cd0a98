// listen(), and the small pieces of endpoint.hpp that are not templates.
#include "ferry/endpoint.hpp"

#include <algorithm>

#include "endpoints/address.hpp"
#include "endpoints/scheme_registry.hpp"

namespace ferry {

bool AllowedPeers::allows(const PeerCredentials& peer) const {
  return std::find(uids.begin(), uids.end(), peer.uid) != uids.end() ||
         std::find(gids.begin(), gids.end(), peer.gid) != gids.end();
}

std::string AllowedPeers::describe() const {
  const auto list = [](const auto& ids) {
    std::string text;
    for (std::size_t i = 0; i < ids.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(ids[i]);
    return text;
  };
  std::string text;
  if (!uids.empty()) text = (uids.size() == 1 ? "user " : "users ") + list(uids);
  if (!gids.empty())
    text += (text.empty() ? "" : " and ") + std::string(gids.size() == 1 ? "group " : "groups ") + list(gids);
  return text.empty() ? "nobody" : text;
}

Listener listen(std::string_view address, const EndpointOptions& options) {
  const detail::Address parsed = detail::parse_address(address);
  const detail::Scheme& scheme = detail::scheme_of(address, parsed.scheme);
  if (options.transport == Transport::InProcess) {
    throw Error("an endpoint connects processes: Transport::InProcess cannot carry it (use UnixSocket or ShmRing)");
  }
  return Listener(scheme.listen(address, parsed.rest, options));
}

namespace detail {

std::string EndKind::describe() const {
  switch (end) {
    case ClientEnd::Receiver: return "Receiver<" + receives_name + ">";
    case ClientEnd::Sender: return "Sender<" + sends_name + ">";
    case ClientEnd::Duplex: return "DuplexEnd<" + sends_name + ", " + receives_name + ">";
  }
  return "an unknown end";
}

ChannelOptions per_connection_options(const ChannelOptions& options) {
  ChannelOptions copy = options;
  if (options.pool) copy.pool.emplace(options.pool->settings());
  return copy;
}

}  // namespace detail
}  // namespace ferry
