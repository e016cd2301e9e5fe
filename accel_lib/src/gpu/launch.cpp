#include "caracal/accel/gpu/launch.hpp"

#include <cstring>

#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/validate.hpp"

namespace caracal::accel::gpu::detail {

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::kThread:
      return "thread";
    case Granularity::kWarp:
      return "warp";
    case Granularity::kBlock:
      return "block";
  }
  return "?";
}

Result<LaunchShape> launch_shape(Granularity g, uint32_t server_queues, uint32_t client_queues,
                                 const GpuOptions& options, uint32_t block_threads,
                                 uint32_t mailbox_bytes) {
  if (server_queues == 0)
    return invalid_argument("GPU accelerator: the region has no server queue");
  if (block_threads == 0 || block_threads % 32 != 0 || block_threads > 1024) {
    return invalid_argument("GPU accelerator: block_threads is " + std::to_string(block_threads) +
                            "; it must be a multiple of 32 from 32 to 1024");
  }
  LaunchShape s;
  if (options.workers != 0) {
    s.workers = options.workers < server_queues ? options.workers : server_queues;
  } else {
    s.workers = server_queues;
    if (client_queues != 0 && client_queues < s.workers) s.workers = client_queues;
  }
  switch (g) {
    case Granularity::kThread:
      s.threads = s.workers < block_threads ? (s.workers + 31) / 32 * 32 : block_threads;
      s.blocks = (s.workers + s.threads - 1) / s.threads;
      s.shared_bytes = 0;  // a thread is its own group: its mailbox is a local
      break;
    case Granularity::kWarp: {
      const uint32_t warps_per_block = block_threads / 32;
      const uint32_t warps = s.workers < warps_per_block ? s.workers : warps_per_block;
      s.threads = warps * 32;
      s.blocks = (s.workers + warps - 1) / warps;
      s.shared_bytes = warps * mailbox_bytes;
      break;
    }
    case Granularity::kBlock:
      s.threads = block_threads;
      s.blocks = s.workers;
      s.shared_bytes = mailbox_bytes;
      break;
  }
  return s;
}

Status check_resident(const void* kernel, const LaunchShape& shape, int device,
                      const std::string& what) {
  int per_sm = 0;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                      &per_sm, kernel, static_cast<int>(shape.threads), shape.shared_bytes),
                  what + ": occupancy"));
  int sms = 0;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                  what + ": multiprocessor count"));
  const uint64_t resident = uint64_t(per_sm) * uint64_t(sms);
  if (shape.blocks > resident) {
    return Status(StatusCode::kUnavailable,
                  what + ": needs " + std::to_string(shape.blocks) +
                      " blocks resident at once, and gpu:" + std::to_string(device) + " holds " +
                      std::to_string(resident) + " of this kernel (" + std::to_string(per_sm) +
                      " on each of " + std::to_string(sms) +
                      " multiprocessors); lower gpu.workers or gpu.block_threads");
  }
  return Status::ok_status();
}

Status write_stop_word(const GpuRegion& region, const mqueue::RegionHeader& h, uint32_t value,
                       cudaStream_t stream) {
  const uint64_t offset = mqueue::stop_word_offset(h);
  if (region.host != nullptr) {
    // Release: whatever the stopper wrote before stays ordered ahead of the word (the kernel
    // reads it relaxed; it carries no data).
    mqueue::store_release(reinterpret_cast<uint32_t*>(region.host + offset), value);
    return Status::ok_status();
  }
  // From pageable memory a copy is staged before cudaMemcpyAsync returns, so `value` may go.
  CARACAL_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(region.device + offset, &value, sizeof(value),
                                                      cudaMemcpyHostToDevice, stream),
                                      "writing the stop word of a device-memory region"));
  return cuda_status(cudaStreamSynchronize(stream), "writing the stop word");
}

Result<mqueue::RegionHeader> read_header(const GpuRegion& region) {
  mqueue::RegionHeader h{};
  if (region.host != nullptr) {
    std::memcpy(&h, region.host, sizeof(h));
  } else if (Status s =
                 cuda_status(cudaMemcpy(&h, region.device, sizeof(h), cudaMemcpyDeviceToHost),
                             "reading the header of a device-memory region");
             !s.ok()) {
    return s;
  }
  CARACAL_RETURN_IF_ERROR(mqueue::validate_region(h, h.region_bytes));
  return h;
}

}  // namespace caracal::accel::gpu::detail
