#include "caracal/core/service_manager.hpp"

#include <string>

#ifdef CARACAL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace caracal {
namespace {

void notify(const std::string& state) {
#ifdef CARACAL_HAVE_SYSTEMD
  // unset_environment 0: an agent's handler processes, if any, may speak for it too. A failure
  // to notify is not the process's failure; sd_notify returns 0 when there is no manager.
  (void)sd_notify(0, state.c_str());
#else
  (void)state;
#endif
}

}  // namespace

void notify_ready(std::string_view status) {
  notify("READY=1\nSTATUS=" + std::string(status));
}

void notify_status(std::string_view status) {
  notify("STATUS=" + std::string(status));
}

void notify_reloading() {
  notify("RELOADING=1");
}

void notify_stopping() {
  notify("STOPPING=1");
}

}  // namespace caracal
