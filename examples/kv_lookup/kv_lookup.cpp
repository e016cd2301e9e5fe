// caracal_kv_agent: serves the key-lookup handler. Run it next to a server started with
// configs/kv-server.yaml and a memcached on 127.0.0.1:11211:
//
//   caracal_kv_agent --config configs/kv-agent.yaml
#include <caracal/agent/agent.hpp>

#include "kv_lookup.hpp"

int main(int argc, char** argv) {
  return caracal::agent::agent_main<caracal::examples::KeyLookup>(argc, argv);
}
