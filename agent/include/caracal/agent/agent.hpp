// An agent executable from one handler source:
//
//   #include <caracal/agent/agent.hpp>
//
//   struct Echo { /* a MessageHandler or BatchHandler, see caracal/accel/handler.hpp */ };
//
//   int main(int argc, char** argv) { return caracal::agent::agent_main<Echo>(argc, argv); }
//
// and in CMake, `caracal_add_handler(my_agent SOURCES echo.cpp)` (cmake/CaracalHandler.cmake).
//
// The command line:
//   AGENT --config FILE [--log-level LEVEL]   run (runtime.hpp says what that does)
//   AGENT --config FILE --check-config        validate the configuration and exit
//   AGENT --version
//
// Exit status: 0 after a clean stop (SIGINT/SIGTERM) or a valid --check-config; 1 when the
// agent fails at run time (refused by the server, a region or an accelerator that cannot be
// set up); 2 for a configuration error; CLI11's codes for a bad command line.
#pragma once

#include <utility>

#include "caracal/accel/handler.hpp"
#include "caracal/agent/accelerator.hpp"

namespace caracal::agent {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfigError = 2;

namespace detail {
int run_agent_main(int argc, char** argv, HandlerBackends backends);
}  // namespace detail

template <accel::Handler H>
int agent_main(int argc, char** argv, H handler = H{}) {
  return detail::run_agent_main(argc, argv, make_backends<H>(std::move(handler)));
}

}  // namespace caracal::agent
