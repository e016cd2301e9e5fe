// caracal_echo_agent: serves the echo handler. Run it next to a server started with
// configs/echo-server.yaml:
//
//   caracal_echo_agent --config configs/echo-agent.yaml
//       [--stall-after N] [--delay-us D] [--fault-after N]
//
// The three options make a bad agent on purpose, for tests (echo.hpp says what each does):
// each worker stops answering after N requests, answers every request D us late, or faults on
// its N+1-th request. All off by default.
#include <caracal/agent/agent.hpp>

#include "echo.hpp"

int main(int argc, char** argv) {
  using caracal::examples::Echo;
  Echo echo;
  return caracal::agent::agent_main<Echo>(
      argc, argv,
      {{"--stall-after",
        "Each worker stops answering after this many requests, the agent still running (0: never)",
        &echo.faults.stall_after, 0, UINT32_MAX},
       {"--delay-us", "Microseconds added to every request, the answer unchanged",
        &echo.faults.delay_us, 0, 10'000'000},
       {"--fault-after",
        "Each worker's handler faults on the request after this many (0: never); the agent "
        "exits 1",
        &echo.faults.fault_after, 0, UINT32_MAX}},
      [&] { return echo; });
}
