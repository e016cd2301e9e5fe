// DpdkPort in a build without DPDK: configurations that ask for it are refused when they are
// read (config.cpp), so open() only answers why it cannot run.
#include <stdexcept>

#include "front/dpdk_port.hpp"
#include "front/listeners.hpp"

namespace caracal::server {

DpdkPort::DpdkPort(std::shared_ptr<DpdkPortState> state) : state_(std::move(state)) {}

DpdkPort::~DpdkPort() = default;

Result<std::unique_ptr<DpdkPort>> DpdkPort::open(const DpdkConfig&, ReplyTable&, Registry&,
                                                 uint32_t) {
  return invalid_argument("dpdk: this snic_server was built without DPDK");
}

std::unique_ptr<Listener> DpdkPort::make_listener(const ListenerConfig&, Service&) {
  throw std::logic_error("dpdk: this snic_server was built without DPDK");
}

Status DpdkPort::run() {
  return invalid_argument("dpdk: this snic_server was built without DPDK");
}

void DpdkPort::stop() {}

const std::string& DpdkPort::description() const {
  static const std::string none = "none (built without DPDK)";
  return none;
}

}  // namespace caracal::server
