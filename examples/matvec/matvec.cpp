// caracal_matvec_agent: serves the matvec compute handler (matvec.hpp). Run it next to a
// server with a `matvec` service whose max_message_bytes is a multiple of 64, with an agent
// config naming that service (see bench/compare/run.sh for one).
#include <caracal/agent/agent.hpp>

#include "matvec.hpp"

int main(int argc, char** argv) {
  return caracal::agent::agent_main<caracal::examples::MatVec>(argc, argv);
}
