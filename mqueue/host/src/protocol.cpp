#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "caracal/config/yaml.hpp"
#include "caracal/control/protocol.hpp"

namespace caracal::control {
namespace {

std::string name_of(const config::Field& f) {
  std::string v = f.as_string();
  if (!is_valid_name(v)) f.fail("'" + v + "' is not a name (1-64 of A-Z a-z 0-9 - _ .)");
  return v;
}

struct Emit {
  YAML::Emitter out;
  explicit Emit(const char* type) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "type" << YAML::Value << type;
  }
  template <class V>
  Emit& kv(const char* key, const V& value) {
    out << YAML::Key << key << YAML::Value << value;
    return *this;
  }
  std::string finish() {
    out << YAML::EndMap;
    return out.c_str();
  }
};

std::string emit(const Hello& m) {
  return Emit("hello")
      .kv("protocol", m.protocol)
      .kv("secret", m.secret)
      .kv("agent", m.agent)
      .kv("epoch", m.epoch)
      .kv("accelerator", m.accelerator)
      .finish();
}
std::string emit(const Welcome& m) {
  return Emit("welcome")
      .kv("heartbeat_interval_ms", m.heartbeat_interval_ms)
      .kv("agent_timeout_ms", m.agent_timeout_ms)
      .finish();
}
std::string emit(const RegionAnnounce& m) {
  Emit e("region");
  e.kv("service", m.service).kv("transport", m.transport);
  if (m.transport == "rdma") {
    e.kv("rdma_host", m.rdma_host)
        .kv("rdma_port", m.rdma_port)
        .kv("rdma_address", m.rdma_address)
        .kv("rdma_rkey", m.rdma_rkey);
  } else {
    e.kv("shm_name", m.shm_name);
  }
  e.kv("region_bytes", m.region_bytes);
  e.out << YAML::Key << "destinations" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const std::string& d : m.destinations)
    e.out << d;
  e.out << YAML::EndSeq;
  return e.finish();
}
std::string emit(const Attached& m) {
  return Emit("attached").kv("service", m.service).finish();
}
std::string emit(const Heartbeat&) {
  return Emit("heartbeat").finish();
}
std::string emit(const Bye&) {
  return Emit("bye").finish();
}
std::string emit(const Refused& m) {
  Emit e("refused");
  e.kv("service", m.service).kv("message", m.message);
  if (m.retry_after_ms != 0) e.kv("retry_after_ms", m.retry_after_ms);
  return e.finish();
}

Message parse(const config::Field& root) {
  const std::string type = root.required("type").as_string();
  if (type == "hello") {
    root.allow_only({"type", "protocol", "secret", "agent", "epoch", "accelerator"});
    Hello m;
    // Any version decodes; the server refuses one it does not speak (and counts it apart).
    m.protocol = static_cast<uint32_t>(root.required("protocol").as_uint(0, UINT32_MAX));
    m.secret = root.required("secret").as_string();
    m.agent = name_of(root.required("agent"));
    m.epoch = root.required("epoch").as_uint(1);
    if (auto a = root.optional("accelerator")) m.accelerator = a->as_string();
    return m;
  }
  if (type == "welcome") {
    root.allow_only({"type", "heartbeat_interval_ms", "agent_timeout_ms"});
    Welcome m;
    m.heartbeat_interval_ms =
        static_cast<uint32_t>(root.required("heartbeat_interval_ms").as_uint(1, 3'600'000));
    m.agent_timeout_ms =
        static_cast<uint32_t>(root.required("agent_timeout_ms").as_uint(1, 3'600'000));
    return m;
  }
  if (type == "region") {
    root.allow_only({"type", "service", "transport", "shm_name", "rdma_host", "rdma_port",
                     "rdma_address", "rdma_rkey", "region_bytes", "destinations"});
    RegionAnnounce m;
    m.service = name_of(root.required("service"));
    const config::Field transport = root.required("transport");
    m.transport = transport.as_string();
    if (m.transport == "shm") {
      const config::Field shm = root.required("shm_name");
      m.shm_name = shm.as_string();
      if (m.shm_name.size() < 2 || m.shm_name.size() > 200 || m.shm_name[0] != '/' ||
          m.shm_name.find('/', 1) != std::string::npos) {
        shm.fail("'" + m.shm_name + "' is not a POSIX shared memory name (\"/name\", no other /)");
      }
      for (const char* key : {"rdma_host", "rdma_port", "rdma_address", "rdma_rkey"}) {
        if (auto f = root.optional(key)) f->fail(std::string(key) + " belongs to transport rdma");
      }
    } else if (m.transport == "rdma") {
      if (!rdma_available()) {
        transport.fail(
            "transport 'rdma' is not served by this server: it was built without rdma-core "
            "(libibverbs, librdmacm); use transport shm");
      }
      if (auto f = root.optional("shm_name")) f->fail("shm_name belongs to transport shm");
      const config::Field host = root.required("rdma_host");
      m.rdma_host = host.as_string();
      if (m.rdma_host.empty() || m.rdma_host.size() > 255 ||
          m.rdma_host.find_first_of(" \t\r\n/") != std::string::npos) {
        host.fail("'" + m.rdma_host + "' is not an address or host name");
      }
      m.rdma_port = static_cast<uint16_t>(root.required("rdma_port").as_uint(1, 65535));
      m.rdma_address = root.required("rdma_address").as_uint(1);
      m.rdma_rkey = static_cast<uint32_t>(root.required("rdma_rkey").as_uint(0, UINT32_MAX));
    } else {
      transport.fail("transport '" + m.transport + "' is not one of: shm, rdma");
    }
    m.region_bytes = root.required("region_bytes").as_uint(1);
    if (m.transport == "rdma" && m.rdma_address > UINT64_MAX - m.region_bytes) {
      root.required("region_bytes")
          .fail(std::to_string(m.region_bytes) + " bytes from rdma_address " +
                std::to_string(m.rdma_address) + " wrap around the address space");
    }
    if (auto d = root.optional("destinations")) {
      for (const config::Field& item : d->items())
        m.destinations.push_back(name_of(item));
    }
    return m;
  }
  if (type == "attached") {
    root.allow_only({"type", "service"});
    return Attached{name_of(root.required("service"))};
  }
  if (type == "heartbeat") {
    root.allow_only({"type"});
    return Heartbeat{};
  }
  if (type == "bye") {
    root.allow_only({"type"});
    return Bye{};
  }
  if (type == "refused") {
    root.allow_only({"type", "service", "message", "retry_after_ms"});
    Refused m;
    if (auto s = root.optional("service")) m.service = s->as_string();
    m.message = root.required("message").as_string();
    if (auto r = root.optional("retry_after_ms")) {
      m.retry_after_ms = static_cast<uint32_t>(r->as_uint(1, 3'600'000));
    }
    return m;
  }
  root.required("type").fail("unknown message type '" + type + "'");
}

}  // namespace

std::string encode(const Message& message) {
  const std::string body = std::visit([](const auto& m) { return emit(m); }, message);
  std::string frame(kFramePrefixBytes, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (uint32_t i = 0; i < kFramePrefixBytes; ++i) {
    frame[i] = static_cast<char>((n >> (8 * (kFramePrefixBytes - 1 - i))) & 0xFF);
  }
  return frame + body;
}

Result<uint32_t> frame_length(const std::byte* prefix) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < kFramePrefixBytes; ++i) {
    n = (n << 8) | static_cast<uint8_t>(prefix[i]);
  }
  if (n == 0 || n > kMaxFrameBytes) {
    return invalid_argument("control frame of " + std::to_string(n) + " bytes (frames carry 1 to " +
                            std::to_string(kMaxFrameBytes) + " bytes)");
  }
  return n;
}

Result<Message> decode(std::string_view payload, const std::string& origin) {
  try {
    return parse(config::load_yaml_text(std::string(payload), origin));
  } catch (const config::ConfigError& e) {
    return invalid_argument(e.what());
  } catch (const YAML::Exception& e) {
    return invalid_argument(origin + ": " + e.what());
  }
}

const char* type_name(const Message& message) {
  static constexpr const char* kNames[] = {"hello",     "welcome", "region", "attached",
                                           "heartbeat", "bye",     "refused"};
  return kNames[message.index()];
}

bool rdma_available() {
#ifdef CARACAL_HAVE_RDMA
  return true;
#else
  return false;
#endif
}

bool is_valid_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string read_secret(const config::Field& mapping) {
  const auto inline_secret = mapping.optional("secret");
  const auto file = mapping.optional("secret_file");
  if (inline_secret && file) file->fail("give either 'secret' or 'secret_file', not both");
  const std::string too_short =
      "must be at least " + std::to_string(kMinSecretBytes) + " characters";
  if (inline_secret) {
    std::string secret = inline_secret->as_string();
    if (secret.size() < kMinSecretBytes) inline_secret->fail("the shared secret " + too_short);
    return secret;
  }
  if (!file) mapping.fail("missing required setting 'secret' or 'secret_file'");
  const std::string path = file->as_string();
  std::ifstream in(path);
  if (!in) file->fail("cannot read secret file '" + path + "'");
  // Anyone who can read the secret can register an agent and receive requests.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IRWXO) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    file->fail("secret file '" + path + "' is open to other users (mode " + mode +
               "); allow its owner and group only: chmod o= '" + path + "'");
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r'))
    secret.pop_back();
  if (secret.empty()) file->fail("secret file '" + path + "' is empty");
  if (secret.size() < kMinSecretBytes) {
    file->fail("the shared secret in '" + path + "' " + too_short);
  }
  return secret;
}

std::string unsupported_protocol(uint32_t version) {
  return "protocol version " + std::to_string(version) + " is not supported (this server speaks " +
         std::to_string(kProtocolVersion) + ")";
}

bool secrets_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer input is visited and differences are OR-ed together, so the time
  // taken does not reveal how long a matching prefix was.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace caracal::control
