// The two YAML configurations, as their programs load them: snic_server's
// (CARACAL_FUZZ_CONFIG_SERVER: server::parse_server_config) and an agent's (agent::
// parse_agent_config, accelerators taken as present). The input is the file's text.
//
// Besides sanitizer findings: both promise that a bad file throws config::ConfigError naming the
// file, line and column, and nothing else; any other exception escaping is a failure (the
// programs catch ConfigError to print it and exit, so anything else ends them with a bare
// terminate).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <typeinfo>

#include "caracal/config/yaml.hpp"
#include "fuzz_check.hpp"
#ifdef CARACAL_FUZZ_CONFIG_SERVER
#include "config.hpp"
#else
#include "caracal/agent/config.hpp"
#endif

namespace {

const std::string kFile = "fuzz.yaml";

void parse(const std::string& text) {
  const caracal::config::Field root = caracal::config::load_yaml_text(text, kFile);
#ifdef CARACAL_FUZZ_CONFIG_SERVER
  (void)caracal::server::parse_server_config(root);
#else
  // Whether an accelerator is present is the machine's, not the file's: take every one as
  // present, so that the rest of the file is read.
  (void)caracal::agent::parse_agent_config(
      root, [](const caracal::agent::AcceleratorSetting&) { return caracal::Status::ok_status(); });
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    parse(text);
  } catch (const caracal::config::ConfigError& e) {
    const std::string what = e.what();
    CARACAL_FUZZ_CHECK(what.starts_with(kFile + ":"), "the error does not name the file: %s",
                       what.c_str());
  } catch (const std::exception& e) {
    CARACAL_FUZZ_CHECK(false, "%s escaped instead of a ConfigError: %s", typeid(e).name(),
                       e.what());
  }
  return 0;
}
