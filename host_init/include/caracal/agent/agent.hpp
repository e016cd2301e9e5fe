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
// The forms of agent_main, by what the handler needs:
//  - agent_main<H>(argc, argv[, handler]): a handler with neither settings nor state; every
//    worker of every service copies `handler`.
//  - agent_main<H>(argc, argv, configure): a handler made from its settings, once per service:
//    `configure(Settings&)` reads them (settings.hpp) and returns the handler.
//      return agent_main<MatVec>(argc, argv, [](caracal::agent::Settings& s) {
//        return MatVec{s.integer<uint32_t>("rounds", 1, 1, 65536)};
//      });
//  - agent_main<S>(argc, argv): a handler with state, S owning it (setup.hpp says what S
//    declares: configure, setup, handler, teardown).
//  - agent_main<H>(argc, argv, flags, make_handler): integer settings declared as HandlerFlags,
//    which the command line takes as `--NAME VALUE`; each is also the setting NAME (dashes
//    inside the name become _) of every service's `handler:` mapping. For each service,
//    make_handler() is called with the flags' variables holding that service's values.
//
// Settings come from the service's `handler:` mapping in the configuration, overridden for
// every service by the command line (`--set NAME=VALUE`, a HandlerFlag `--NAME VALUE`).
//
// The command line:
//   AGENT --config FILE [--log-level LEVEL] [--set NAME=VALUE]... [HANDLER FLAGS]   run
//   AGENT --config FILE [--set ...] --check-config   validate the configuration, handler
//                                                     settings included, and exit
//   AGENT --version
//
// Exit status: 0 after a clean stop (SIGINT/SIGTERM) or a valid --check-config; 1 when the
// agent fails at run time (a handler setup that failed, refused by the server, a region or an
// accelerator that cannot be set up); 2 for a configuration error (handler settings included);
// CLI11's codes for a bad command line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "caracal/accel/handler.hpp"
#include "caracal/agent/accelerator.hpp"
#include "caracal/agent/settings.hpp"
#include "caracal/agent/setup.hpp"

namespace caracal::agent {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfigError = 2;

// An integer setting of the handler with a command-line flag: `NAME VALUE`, an unsigned integer
// in [min, max], and the setting NAME without its dashes (others become _: --delay-us is
// delay_us) of every service's `handler:` mapping; the command line wins. *value holds the
// default (shown by --help) and receives the service's value before make_handler() makes its
// handler.
struct HandlerFlag {
  std::string name;  // with its dashes: "--rounds"
  std::string description;
  uint32_t* value = nullptr;
  uint32_t min = 0;
  uint32_t max = UINT32_MAX;
};

// "--delay-us" -> "delay_us": the setting a HandlerFlag feeds.
std::string flag_setting_name(const std::string& flag);

namespace detail {
// Parses the command line (the agent's options and `flags`), calls `make_backends`, reads the
// configuration and the handler's settings, and runs the agent.
int run_agent_main(int argc, char** argv, const std::vector<HandlerFlag>& flags,
                   const std::function<HandlerBackends()>& make_backends);
}  // namespace detail

template <accel::Handler H>
int agent_main(int argc, char** argv, H handler = H{}) {
  return detail::run_agent_main(argc, argv, {},
                                [&handler] { return make_backends<H>(std::move(handler)); });
}

// The handler made by `configure(Settings&)` for each service.
template <accel::Handler H, class Configure>
requires std::is_convertible_v<std::invoke_result_t<Configure&, Settings&>, H>
int agent_main(int argc, char** argv, Configure configure) {
  return detail::run_agent_main(
      argc, argv, {}, [&configure] { return make_configured_backends<H>(std::move(configure)); });
}

// A handler with state: S's setup makes each service's (setup.hpp).
template <StatefulHandler S>
int agent_main(int argc, char** argv) {
  return detail::run_agent_main(argc, argv, {}, [] { return make_stateful_backends<S>(); });
}

// The handler made by `make_handler()` for each service, with `flags` holding that service's
// settings. H is named (agent_main<MyHandler>(...)): nvcc's kernel stubs cannot spell a type
// deduced through the lambda's.
template <accel::Handler H, class MakeHandler>
requires std::is_convertible_v<std::invoke_result_t<MakeHandler&>, H>
int agent_main(int argc, char** argv, const std::vector<HandlerFlag>& flags,
               MakeHandler make_handler) {
  struct Declared {
    HandlerFlag flag;
    uint32_t fallback;  // *value before the command line is parsed
  };
  std::vector<Declared> declared;
  for (const HandlerFlag& f : flags)
    declared.push_back(Declared{f, *f.value});
  return detail::run_agent_main(argc, argv, flags, [&] {
    return make_configured_backends<H>([declared, &make_handler](Settings& s) {
      for (const Declared& d : declared) {
        *d.flag.value =
            s.integer<uint32_t>(flag_setting_name(d.flag.name), d.fallback, d.flag.min, d.flag.max);
      }
      return H(make_handler());
    });
  });
}

}  // namespace caracal::agent
