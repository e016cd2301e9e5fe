// Compiles the handler-facing headers for the device: a handler of the documented shape and a
// client-queue call, invoked from a kernel. The build of this object is the proof that
// handler.hpp and client.hpp stay device-clean, so one handler source serves CPU and GPU.
#include "caracal/accel/client.hpp"
#include "caracal/accel/handler.hpp"

namespace caracal::accel {
namespace {

struct DeviceEcho {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) {
    for (uint32_t i = ctx.group().rank(); i < req.size; i += ctx.group().size()) {
      resp.data[i] = req.data[i];
    }
    ctx.group().sync();
    resp.size = req.size;
    if (ctx.client_count() != 0 && ctx.group().leader()) {
      uint64_t reply = 0;
      ctx.client(0).call(req.token, req.data, req.size, &reply, sizeof(reply));
    }
  }
};
static_assert(Handler<DeviceEcho>);
static_assert(granularity_of<DeviceEcho>() == Granularity::kWarp);

}  // namespace

__global__ void accel_device_handler_check(std::byte* region, const std::byte* in, uint32_t n,
                                           std::byte* out) {
  mqueue::RegionView view(region);
  ClientChannel client(view, 0);
  Context ctx(Group(Granularity::kWarp, threadIdx.x % 32, 32), &client,
              view.client_queue_count() != 0 ? 1 : 0, blockIdx.x);
  Request req{in, n, 0, 7};
  Response resp{out, n, 0, 0};
  DeviceEcho{}(req, resp, ctx);
}

}  // namespace caracal::accel
