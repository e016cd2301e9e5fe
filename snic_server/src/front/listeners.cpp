// The listener factory and what the listener kinds share: binding a TCP acceptor (listeners and
// the control endpoint) and the text of an error reply. The kinds themselves are tcp.cpp,
// udp.cpp and, for `kind: dpdk`, the DPDK port (dpdk_port.cpp).
#include "front/listeners.hpp"

#include <stdexcept>
#include <string_view>

#include "front/dpdk_port.hpp"
#include "listener_common.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

Result<asio::ip::address> parse_address(const config::HostPort& hp) {
  error_code ec;
  const auto a = asio::ip::make_address(hp.host == "localhost" ? "127.0.0.1" : hp.host, ec);
  if (ec) return invalid_argument("'" + hp.host + "' is not an IP address");
  return a;
}

Result<uint16_t> listen_tcp(tcp::acceptor& acceptor, const config::HostPort& at,
                            const std::string& what) {
  Result<asio::ip::address> address = parse_address(at);
  if (!address.ok()) return invalid_argument(what + ": " + address.status().message());
  const tcp::endpoint ep(*address, at.port);
  error_code ec;
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) {
    const uint16_t port = acceptor.local_endpoint(ec).port();
    if (!ec) return port;
  }
  return Status(StatusCode::kIoError,
                what + ": cannot listen on " + at.str() + ": " + ec.message());
}

std::optional<std::string> format_error_reply(const ListenerConfig& config,
                                              std::string_view reason) {
  if (!config.error_reply) return std::nullopt;
  std::string text = *config.error_reply;
  constexpr std::string_view kPlaceholder = "{reason}";
  const size_t at = text.find(kPlaceholder);
  if (at != std::string::npos) text.replace(at, kPlaceholder.size(), reason);
  return text;
}

std::unique_ptr<Listener> make_listener(const ListenerConfig& config, const ListenerDeps& deps) {
  if (config.kind == ListenerKind::kDpdk) {
    if (deps.dpdk != nullptr) return deps.dpdk->make_listener(config, deps.service);
    throw std::invalid_argument(listener_name(config) + ": the server has no DPDK port");
  }
  if (config.protocol == Protocol::kUdp) return make_udp_listener(config, deps);
  return make_tcp_listener(config, deps);
}

}  // namespace caracal::server
