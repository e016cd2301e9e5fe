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
#include "caracal/agent/settings.hpp"
#include "caracal/agent/setup.hpp"

namespace caracal::agent {

std::string flag_setting_name(const std::string& flag) {
  std::string name = flag.substr(flag.find_first_not_of('-'));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

}  // namespace caracal::agent

namespace caracal::agent::detail {
namespace {

void set_up_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("agent");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");  // as snic_server's
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
}

// `--set NAME=VALUE` arguments as overrides; an error names the bad one.
std::vector<SettingOverride> parse_sets(const std::vector<std::string>& sets) {
  std::vector<SettingOverride> out;
  for (const std::string& set : sets) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw config::ConfigError("command line (--set " + set +
                                "): expected NAME=VALUE, a handler setting and its value");
    }
    out.push_back(SettingOverride{set.substr(0, eq), set.substr(eq + 1), "--set " + set});
  }
  return out;
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
  std::vector<std::string> sets;
  app.add_option("--set", sets,
                 "a handler setting for every service, over the configuration's `handler:` "
                 "(NAME=VALUE, VALUE as YAML: 4, true, /srv/words, [a, b]); repeatable")
      ->take_all()
      ->allow_extra_args(false)
      ->type_name("NAME=VALUE");
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
  std::vector<std::string> settings;
  try {
    config = load_agent_config(config_path, [&backends](const AcceleratorSetting& a) {
      return check_accelerator_available(a, backends);
    });
    SettingsOptions options;
    options.base_dir = std::filesystem::absolute(config_path).parent_path();
    options.overrides = parse_sets(sets);
    // A flag given on the command line overrides the setting it feeds, for every service.
    for (const HandlerFlag& f : flags) {
      if (app.count(f.name) == 0) continue;
      const std::string v = std::to_string(*f.value);
      options.overrides.push_back(SettingOverride{flag_setting_name(f.name), v, f.name + " " + v});
    }
    settings = configure_services(config, backends, options);
  } catch (const config::ConfigError& e) {
    std::fprintf(stderr, "%s: configuration error: %s\n", program.c_str(), e.what());
    return kExitConfigError;
  }
  if (check_only) {
    std::printf(
        "%s: configuration is valid: agent '%s', %zu service(s), accelerator %s, server %s\n",
        config_path.c_str(), config.agent.c_str(), config.services.size(),
        config.accelerator.str().c_str(), config.server.str().c_str());
    for (size_t i = 0; i < config.services.size(); ++i) {
      if (backends.configure) {
        std::printf("service '%s': handler settings: %s\n", config.services[i].name.c_str(),
                    settings[i].c_str());
      }
    }
    return kExitOk;
  }

  set_up_logging(log_level.empty() ? config.log_level : log_level);
  for (size_t i = 0; i < config.services.size(); ++i) {
    if (backends.configure) {
      spdlog::info("service '{}': handler settings: {}", config.services[i].name, settings[i]);
    }
  }
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
