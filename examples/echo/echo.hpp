// The echo handler: the reply is the request. Host/device code, so the same type runs on
// every accelerator backend.
#pragma once

#include <cstdint>

#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::examples {

struct Echo {
  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) const {
    // The runtime sizes the response for the region's largest message, so any request fits;
    // a group splits the copy by rank (on the CPU the group is one thread).
    for (uint32_t i = ctx.group().rank(); i < req.size; i += ctx.group().size())
      resp.data[i] = req.data[i];
    resp.size = req.size;
  }
};

}  // namespace caracal::examples
