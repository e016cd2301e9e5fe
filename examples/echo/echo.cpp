// caracal_echo_agent: serves the echo handler. Run it next to a server started with
// configs/echo-server.yaml:
//
//   caracal_echo_agent --config configs/echo-agent.yaml
#include <caracal/host_init/agent.hpp>

#include "echo.hpp"

int main(int argc, char** argv) {
  return caracal::host::agent_main<caracal::examples::Echo>(argc, argv);
}
