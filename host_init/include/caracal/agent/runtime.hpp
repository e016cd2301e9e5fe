// The agent's lifecycle, for any handler: register with the server, serve, re-register when
// the server goes away, detach on request.
//
//  1. Connect to the server's control endpoint, retrying every reconnect_interval_ms while it
//     is not there (logged once, then quietly).
//  2. hello with a fresh epoch -> welcome. refused ends the run with an error: a wrong secret
//     or a name already registered does not fix itself.
//  3. For each service, in order: create its named shm region (region_shm_name), start the
//     handler on it, announce it (`region`) -> attached: remove the name (the server holds its
//     own mapping). refused ends the run with an error.
//  4. heartbeat every heartbeat_interval_ms (the server's welcome says how often); every
//     message from the server counts as an answer. No answer for agent_timeout_ms, the
//     connection closing, a protocol error or an unrequested bye from the server: stop the
//     accelerators, drop the regions and go back to 1 with a new epoch.
//  5. request_stop() (SIGINT/SIGTERM with handle_signals): bye, wait for the server's bye
//     (replies in flight still go out meanwhile) at most bye_timeout, stop the accelerators,
//     drop the regions, return OK.
//
// No named shm object outlives a run on any path the agent controls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "caracal/agent/accelerator.hpp"
#include "caracal/agent/config.hpp"
#include "caracal/core/status.hpp"

namespace caracal::agent {

struct RuntimeOptions {
  // Stop on SIGINT and SIGTERM (what agent_main sets). The signals are handled by the runtime's
  // own event loop, never by code running in a signal handler.
  bool handle_signals = false;
  // A TCP connect that takes longer counts as a failed attempt.
  std::chrono::milliseconds connect_timeout{5000};
  // How long the server may take to answer hello (before its welcome says agent_timeout_ms).
  std::chrono::milliseconds handshake_timeout{5000};
  // How long to wait for the server's bye after ours.
  std::chrono::milliseconds bye_timeout{3000};
};

class AgentRuntime {
 public:
  AgentRuntime(AgentConfig config, HandlerBackends backends, RuntimeOptions options = {});
  ~AgentRuntime();
  AgentRuntime(const AgentRuntime&) = delete;
  AgentRuntime& operator=(const AgentRuntime&) = delete;

  // Runs until request_stop() (OK) or a failure that retrying cannot fix (the error says
  // what and where). Call once.
  Status run();

  // Asks run() to detach and return. Any thread, any time (before run() too).
  void request_stop();

  // Registrations completed (welcome received and every service attached), for tests and logs.
  uint64_t registrations() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace caracal::agent
