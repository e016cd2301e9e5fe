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
// A handler with settings of its own takes them on the same command line: agent_main with a
// list of HandlerFlag and a function that makes the handler once they are parsed:
//
//   uint32_t rounds = 1;
//   return agent_main<MatVec>(argc, argv, {{"--rounds", "networks per vector", &rounds, 1, 65536}},
//                             [&] { return MatVec{rounds}; });
//
// The command line:
//   AGENT --config FILE [--log-level LEVEL] [HANDLER FLAGS]   run (runtime.hpp says what that does)
//   AGENT --config FILE --check-config        validate the configuration and exit
//   AGENT --version
//
// Exit status: 0 after a clean stop (SIGINT/SIGTERM) or a valid --check-config; 1 when the
// agent fails at run time (refused by the server, a region or an accelerator that cannot be
// set up); 2 for a configuration error; CLI11's codes for a bad command line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "caracal/accel/handler.hpp"
#include "caracal/agent/accelerator.hpp"

namespace caracal::agent {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfigError = 2;

// One setting of the handler on the agent's command line: `NAME VALUE`, an unsigned integer in
// [min, max]. *value holds the default (shown by --help) and receives what the command line
// gives, before the handler is made.
struct HandlerFlag {
  std::string name;  // with its dashes: "--rounds"
  std::string description;
  uint32_t* value = nullptr;
  uint32_t min = 0;
  uint32_t max = UINT32_MAX;
};

namespace detail {
// Parses the command line (the agent's options and `flags`), then calls `make_backends`.
int run_agent_main(int argc, char** argv, const std::vector<HandlerFlag>& flags,
                   const std::function<HandlerBackends()>& make_backends);
}  // namespace detail

template <accel::Handler H>
int agent_main(int argc, char** argv, H handler = H{}) {
  return detail::run_agent_main(argc, argv, {},
                                [&handler] { return make_backends<H>(std::move(handler)); });
}

// The handler made by `make_handler()` once the command line, `flags` included, is parsed. H is
// named (agent_main<MyHandler>(...)): nvcc's kernel stubs cannot spell a type deduced through
// the lambda's.
template <accel::Handler H, class MakeHandler>
requires std::is_convertible_v<std::invoke_result_t<MakeHandler&>, H>
int agent_main(int argc, char** argv, const std::vector<HandlerFlag>& flags,
               MakeHandler make_handler) {
  return detail::run_agent_main(argc, argv, flags,
                                [&make_handler] { return make_backends<H>(H(make_handler())); });
}

}  // namespace caracal::agent
