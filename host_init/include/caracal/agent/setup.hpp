// A handler with state for the agent's life: settings read once per service, a setup step run
// once per service on the host after the accelerator is chosen and before the agent registers,
// a view of the result that every worker copies, and a teardown after serving.
//
//   // The functor every worker runs (handler.hpp): a small, trivially copyable view of the
//   // state, holding pointers the accelerator can read.
//   struct Lookup {
//     const Entry* table;
//     uint32_t buckets;
//     CARACAL_HOST_DEVICE void operator()(const Request&, Response&, Context&);
//   };
//
//   // What owns the state: one per service, alive from setup to teardown.
//   class Dictionary {
//    public:
//     struct Config { std::filesystem::path words; uint32_t buckets; };
//     // Optional. Reads the service's settings (settings.hpp): at configuration time, with no
//     // accelerator, under --check-config too.
//     static Config configure(caracal::agent::Settings& s);
//     // Runs once per service, on the host, once the accelerator is chosen: loads files,
//     // allocates the accelerator's memory (ctx.allocate, ctx.upload), builds the state. Without
//     // configure it takes the SetupContext alone. It fails by throwing, or by returning a
//     // Result<Dictionary> with an error status.
//     static Dictionary setup(const Config& config, caracal::agent::SetupContext& ctx);
//     // The view every worker gets, copied into each of them (on a GPU, into every thread).
//     Lookup handler() const;
//     // Optional (or takes no argument): after every worker on the service has stopped.
//     void teardown(caracal::agent::SetupContext& ctx);
//   };
//
//   int main(int argc, char** argv) {
//     return caracal::agent::agent_main<Dictionary>(argc, argv);
//   }
//
// The life of one service's state, in the agent (runtime.hpp):
//  1. configure(settings): after the configuration is read; an error is a configuration error
//     (exit 2), reported at the setting's line.
//  2. setup(config, ctx): after the accelerator is chosen (ctx.accelerator(): cpu or gpu:N, the
//     GPU current on the calling thread) and before the agent connects to the server. A setup
//     that throws or returns an error stops the agent (exit 1) with "service 'NAME': handler
//     setup on ACCELERATOR failed: WHAT", and nothing has been registered. Services are set up
//     in configuration order; those set up before a failure are torn down.
//  3. handler(): called once, after setup. Its view is copied into the workers each time the
//     service's region is started (every registration), so it survives re-registration.
//  4. teardown(ctx), then the destructor, then the memory from ctx is freed: when the agent
//     stops, after every worker of every service has stopped, in reverse configuration order.
//     Where an accelerator could not be stopped (a GPU kernel that ignores its stop word), the
//     state is neither torn down nor freed: the kernel may still read it.
//
// What workers may do with the state is handler.hpp's contract ("State shared by workers").
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "caracal/agent/accelerator.hpp"
#include "caracal/agent/config.hpp"
#include "caracal/agent/settings.hpp"
#include "caracal/core/status.hpp"

namespace caracal::agent {

// What SetupContext's helpers throw; setup may throw it too (any std::exception will do).
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where a setup runs: the service, the chosen accelerator, and memory for it that lives until
// after the teardown.
class SetupContext {
 public:
  SetupContext(const ServiceConfig& service, AcceleratorChoice accelerator,
               AcceleratorMemory memory, uint32_t cpu_workers)
      : service_(service),
        accelerator_(accelerator),
        memory_(std::move(memory)),
        cpu_workers_(cpu_workers) {}
  SetupContext(const SetupContext&) = delete;
  SetupContext& operator=(const SetupContext&) = delete;

  const ServiceConfig& service() const { return service_; }
  AcceleratorChoice accelerator() const { return accelerator_; }
  bool on_gpu() const { return accelerator_.kind == AcceleratorKind::kGpu; }
  // The CPU workers that will serve each region of the service (cpu.workers); 0 on a GPU.
  uint32_t cpu_workers() const { return on_gpu() ? 0 : cpu_workers_; }

  // `count` zero-filled T the workers can read and write: device memory of the GPU, host memory
  // on the CPU (aligned to 256 bytes either way). Throws SetupError naming `what`.
  template <class T>
  T* allocate(size_t count, const std::string& what) {
    static_assert(std::is_trivially_copyable_v<T>, "accelerator memory holds plain data");
    return reinterpret_cast<T*>(allocate_bytes(count * sizeof(T), what));
  }
  // Copies host data into memory from allocate(). Throws SetupError naming `what`.
  template <class T>
  void copy_to_accelerator(T* to, std::span<const T> from, const std::string& what) {
    static_assert(std::is_trivially_copyable_v<T>, "accelerator memory holds plain data");
    copy_bytes(to, from.data(), from.size_bytes(), what);
  }
  // Copies memory from allocate() back to the host (a teardown that reads what workers wrote).
  template <class T>
  void copy_to_host(std::span<T> to, const T* from, const std::string& what) {
    static_assert(std::is_trivially_copyable_v<T>, "accelerator memory holds plain data");
    copy_bytes(to.data(), from, to.size_bytes(), what);
  }
  // allocate() and copy_to_accelerator() in one.
  template <class T>
  const T* upload(std::span<const T> from, const std::string& what) {
    T* to = allocate<T>(from.size(), what);
    copy_to_accelerator(to, from, what);
    return to;
  }
  template <class T>
  const T* upload(const std::vector<T>& from, const std::string& what) {
    return upload(std::span<const T>(from), what);
  }

  // Bytes held by allocate() so far.
  uint64_t allocated_bytes() const { return allocated_bytes_; }

 private:
  std::byte* allocate_bytes(uint64_t bytes, const std::string& what);
  void copy_bytes(void* to, const void* from, uint64_t bytes, const std::string& what);

  const ServiceConfig& service_;
  AcceleratorChoice accelerator_;
  AcceleratorMemory memory_;
  uint32_t cpu_workers_;
  std::vector<std::shared_ptr<std::byte>> held_;  // freed with the context, after teardown
  uint64_t allocated_bytes_ = 0;
};

namespace detail {

template <class S>
concept HasConfigure = requires(Settings& s) {
  S::configure(s);
};

template <class S>
struct ConfigOf {
  using type = std::monostate;
};
template <HasConfigure S>
struct ConfigOf<S> {
  using type = std::decay_t<decltype(S::configure(std::declval<Settings&>()))>;
};

template <class S>
decltype(auto) call_setup(const typename ConfigOf<S>::type& config, SetupContext& ctx) {
  if constexpr (HasConfigure<S>) {
    return S::setup(config, ctx);
  } else {
    (void)config;
    return S::setup(ctx);
  }
}

template <class T>
struct IsResult : std::false_type {};
template <class T>
struct IsResult<Result<T>> : std::true_type {};

}  // namespace detail

// A type that owns a handler's state: setup() (with configure() before it, optionally), a
// handler() view, optionally teardown(). See the top of this file.
template <class S>
concept StatefulHandler =
    !accel::Handler<S> &&
    requires(const S& s, const typename detail::ConfigOf<S>::type& c, SetupContext& ctx) {
  { s.handler() } -> accel::Handler;
  detail::call_setup<S>(c, ctx);
};

// The backends of a StatefulHandler: each service's handler is made by its setup, on the
// accelerator the agent chose (HandlerBackends::setup).
template <StatefulHandler S>
HandlerBackends make_stateful_backends() {
  using Config = typename detail::ConfigOf<S>::type;
  using H = std::decay_t<decltype(std::declval<const S&>().handler())>;
  HandlerBackends b;
#if defined(__CUDACC__) && defined(CARACAL_HAVE_CUDA)
  b.gpu = make_gpu_probe();
#endif
  b.configure = [](Settings& settings) -> std::any {
    if constexpr (detail::HasConfigure<S>) {
      return std::any(S::configure(settings));
    } else {
      (void)settings;
      return std::any(Config{});
    }
  };
  b.setup = [](const std::any& configured,
               std::unique_ptr<SetupContext> ctx) -> Result<ServiceHandler> {
    const Config& config = std::any_cast<const Config&>(configured);
#if defined(__CUDACC__) && defined(CARACAL_HAVE_CUDA)
    if (ctx->on_gpu()) {
      CARACAL_RETURN_IF_ERROR(accel::gpu::use_device(static_cast<int>(ctx->accelerator().gpu)));
    }
#endif
    std::unique_ptr<S> state;
    using Made = decltype(detail::call_setup<S>(config, *ctx));
    if constexpr (detail::IsResult<std::decay_t<Made>>::value) {
      Made made = detail::call_setup<S>(config, *ctx);
      if (!made.ok()) return made.status();
      state = std::make_unique<S>(std::move(made).value());
    } else {
      // Made in place: S need not be movable.
      state.reset(new S(detail::call_setup<S>(config, *ctx)));
    }
    ServiceHandler out;
    out.backends = make_backends<H>(state->handler());
    // The state, its context and its memory, dropped in that order once teardown has run.
    std::shared_ptr<S> owned(state.release());
    std::shared_ptr<SetupContext> context(ctx.release());
    out.teardown = [owned, context]() mutable {
      if constexpr (requires { owned->teardown(*context); }) {
        owned->teardown(*context);
      } else if constexpr (requires { owned->teardown(); }) {
        owned->teardown();
      }
      owned.reset();
      context.reset();
    };
    return out;
  };
  return b;
}

}  // namespace caracal::agent

namespace caracal::agent {

// Where handler settings come from besides the configuration.
struct SettingsOptions {
  std::filesystem::path base_dir;  // relative paths of the file: its directory
  std::vector<SettingOverride> overrides;
};

// Reads every service's handler settings with the handler's configure (none declared: any key
// or override is refused) and keeps what it read in backends.configured. Returns, per service
// in order, what the settings came to (Settings::summary). Throws config::ConfigError.
std::vector<std::string> configure_services(const AgentConfig& config, HandlerBackends& backends,
                                            const SettingsOptions& options);

}  // namespace caracal::agent

namespace caracal::agent {

// The backends of a handler without state that its settings make: `configure(settings)`
// returns the handler for one service, and every worker of that service copies it.
template <accel::Handler H, class Configure>
HandlerBackends make_configured_backends(Configure configure) {
  HandlerBackends b;
#if defined(__CUDACC__) && defined(CARACAL_HAVE_CUDA)
  b.gpu = make_gpu_probe();
#endif
  b.configure = [configure](Settings& settings) mutable -> std::any {
    return std::any(H(configure(settings)));
  };
  b.setup = [](const std::any& configured,
               std::unique_ptr<SetupContext> /*context*/) -> Result<ServiceHandler> {
    ServiceHandler out;
    out.backends = make_backends<H>(std::any_cast<const H&>(configured));
    return out;
  };
  return b;
}

}  // namespace caracal::agent
