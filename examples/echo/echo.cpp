// caracal_echo_agent: serves the echo handler. Run it next to a server started with
// configs/echo-server.yaml:
//
//   caracal_echo_agent --config configs/echo-agent.yaml
#include <caracal/agent/agent.hpp>

#include "echo.hpp"

int main(int argc, char** argv) {
  return caracal::agent::agent_main<caracal::examples::Echo>(argc, argv);
}
