// Telling the service manager how the process is doing (systemd's sd_notify protocol), so a
// unit can be Type=notify: `systemctl start` returns once the server serves or the agent is
// registered, and `systemctl status` shows the last STATUS line. Without libsystemd in the build
// (CARACAL_WITH_SYSTEMD off), or when the process was not started by a service manager (no
// NOTIFY_SOCKET), every call does nothing.
#pragma once

#include <string_view>

namespace caracal {

// `status` is a line for `systemctl status`.
void notify_ready(std::string_view status);
void notify_status(std::string_view status);
void notify_reloading();
void notify_stopping();

}  // namespace caracal
