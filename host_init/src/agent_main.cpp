#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "caracal/agent/accelerator.hpp"
#include "caracal/agent/agent.hpp"
#include "caracal/agent/config.hpp"
#include "caracal/agent/runtime.hpp"

namespace caracal::agent::detail {
namespace {

void set_up_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("agent");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");  // as snic_server's
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace

int run_agent_main(int argc, char** argv, const std::vector<HandlerFlag>& flags,
                   const std::function<HandlerBackends()>& make_backends) {
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "caracal-agent";
  CLI::App app{"Caracal host agent: serves this handler's services for a Caracal server", program};
  std::string config_path;
  std::string log_level;
  bool check_only = false;
  app.set_version_flag("--version", program + " (Caracal " CARACAL_VERSION ")");
  app.add_option("--config", config_path, "agent configuration (YAML)")->required();
  app.add_flag("--check-config", check_only, "validate the configuration and exit");
  app.add_option("--log-level", log_level, "overrides the configuration's log_level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  for (const HandlerFlag& f : flags) {
    app.add_option(f.name, *f.value, f.description + " (the handler's)")
        ->check(CLI::Range(f.min, f.max))
        ->capture_default_str();
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  HandlerBackends backends = make_backends();

  AgentConfig config;
  try {
    config = load_agent_config(config_path, [&backends](const AcceleratorSetting& a) {
      return check_accelerator_available(a, backends);
    });
  } catch (const config::ConfigError& e) {
    std::fprintf(stderr, "%s: configuration error: %s\n", program.c_str(), e.what());
    return kExitConfigError;
  }
  if (check_only) {
    std::printf(
        "%s: configuration is valid: agent '%s', %zu service(s), accelerator %s, server %s\n",
        config_path.c_str(), config.agent.c_str(), config.services.size(),
        config.accelerator.str().c_str(), config.server.str().c_str());
    return kExitOk;
  }

  set_up_logging(log_level.empty() ? config.log_level : log_level);
  RuntimeOptions options;
  options.handle_signals = true;
  AgentRuntime runtime(std::move(config), std::move(backends), options);
  if (Status s = runtime.run(); !s.ok()) {
    spdlog::error("{}", s.message());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace caracal::agent::detail
