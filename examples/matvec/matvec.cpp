// caracal_matvec_agent: serves the matvec compute handler (matvec.hpp). Run it next to a
// server with a `matvec` service whose max_message_bytes is a multiple of 64, with an agent
// config naming that service (see bench/compare/run.sh for one).
//
//   caracal_matvec_agent --config FILE [--rounds N] [--delay-us D]
//
// --rounds: networks averaged per vector (the work per request; clients that check replies,
// such as caracal_loadgen --matvec-rounds, must use the same). --delay-us: every request takes
// at least D us longer, with the same answer (an agent made slower on purpose). Both are also
// settings of each service in the agent configuration, `handler: { rounds: N, delay_us: D }`;
// the command line wins.
#include <caracal/agent/agent.hpp>

#include "matvec.hpp"

int main(int argc, char** argv) {
  using caracal::examples::MatVec;
  using caracal::examples::MatVecSpec;
  uint32_t rounds = 1;
  uint32_t delay_us = 0;
  return caracal::agent::agent_main<MatVec>(
      argc, argv,
      {{"--rounds", "Networks averaged per vector: the work per request", &rounds, 1,
        MatVecSpec::kMaxRounds},
       {"--delay-us", "Microseconds added to every request, the answer unchanged", &delay_us, 0,
        1000000}},
      [&] {
        return MatVec{rounds, delay_us * 1000};
      });
}
