#include "caracal/accel/gpu/launch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <utility>

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

Runtime::Runtime(GpuRegion region, GpuOptions options, int device, HandlerNeeds needs)
    : region_(region), options_(options), device_(device), needs_(needs) {}

Runtime::~Runtime() {
  (void)stop();
}

cudaStream_t Runtime::stream() const {
  const LaunchResources* r = prepared_ ? prepared_.get() : resources_.get();
  return r != nullptr ? r->stream.get() : nullptr;
}

Status Runtime::prepare(const void* kernel, KernelArgs& args) {
  if (running_) return invalid_argument("GPU accelerator already started");
  prepared_.reset();
  CARACAL_RETURN_IF_ERROR(use_device(device_));
  Result<mqueue::RegionHeader> header = read_header(region_);
  if (!header.ok()) return header.status();
  header_ = *header;
  const uint32_t block_threads =
      needs_.block_threads != 0 ? needs_.block_threads : options_.block_threads;
  Result<LaunchShape> shape =
      launch_shape(needs_.granularity, header_.server_queue_count, header_.client_queue_count,
                   options_, block_threads, needs_.mailbox_bytes);
  if (!shape.ok()) return shape.status();
  shape_ = *shape;
  CARACAL_RETURN_IF_ERROR(check_resident(kernel, shape_, device_, summary()));

  auto res = std::make_unique<LaunchResources>();
  const uint32_t w = shape_.workers;
  const uint32_t batch = needs_.batch;
  const bool overlapped = needs_.overlap_table_bytes != 0;
  const uint32_t max_response = std::min(needs_.max_response_bytes, header_.max_message_bytes);
  const uint32_t per_worker = (header_.client_queue_count + w - 1) / w;
  const auto stride = static_cast<uint32_t>(mqueue::round_up(max_response, 16));
  auto alloc = [](DeviceBuffer& b, uint64_t bytes, const char* what) -> Status {
    if (bytes == 0) return Status::ok_status();
    Result<DeviceBuffer> r = DeviceBuffer::allocate(bytes, what);
    if (!r.ok()) return r.status();
    b = std::move(r).value();
    return Status::ok_status();
  };
  const uint64_t batch_entry = sizeof(Request) + sizeof(std::byte*) + sizeof(uint32_t);
  CARACAL_RETURN_IF_ERROR(
      alloc(res->queues, sizeof(QueueState) * header_.server_queue_count, "GPU queue state"));
  CARACAL_RETURN_IF_ERROR(
      alloc(res->channels, sizeof(ClientChannel) * w * per_worker, "GPU client state"));
  if (batch > 1) {
    CARACAL_RETURN_IF_ERROR(alloc(res->batch, batch_entry * w * batch, "GPU batch state"));
  }
  if (overlapped) {
    // The tables outlive a launch (their sequence numbers keep tokens from repeating), so they
    // are allocated once for the accelerator's life, zero-filled.
    const uint64_t tables = needs_.overlap_table_bytes * w;
    if (overlap_tables_.size() < tables) {
      CARACAL_RETURN_IF_ERROR(alloc(overlap_tables_, tables, "GPU open-request tables"));
    }
    CARACAL_RETURN_IF_ERROR(
        alloc(res->channel_stopped, sizeof(uint32_t) * w * per_worker, "GPU client queue flags"));
  }
  // Batched handlers' replies; with TX lines, a warp's or block's single reply.
  const bool stage_replies =
      batch > 1 || (mqueue::has_tx_lines(header_) && needs_.granularity != Granularity::kThread);
  if (stage_replies) {
    CARACAL_RETURN_IF_ERROR(alloc(res->staging, uint64_t{stride} * w * batch, "GPU reply staging"));
  }
  Result<MappedBuffer> counters =
      MappedBuffer::allocate(sizeof(WorkerCounters) * w, "GPU worker counters");
  if (!counters.ok()) return counters.status();
  res->counters = std::move(counters).value();
  Result<Stream> stream = Stream::create("GPU accelerator");
  if (!stream.ok()) return stream.status();
  res->stream = std::move(stream).value();
  Result<Stream> control = Stream::create("GPU accelerator control");
  if (!control.ok()) return control.status();
  res->control = std::move(control).value();

  // This accelerator's own earlier stop() left the stop word raised: starting again clears
  // it. A stop raised by anyone else (the SmartNIC, the agent) stays in force.
  if (raised_stop_) {
    CARACAL_RETURN_IF_ERROR(write_stop_word(region_, header_, 0, res->control.get()));
    raised_stop_ = false;
  }

  args = KernelArgs{};
  args.region = region_.device;
  args.queues = reinterpret_cast<QueueState*>(res->queues.data());
  args.channels = reinterpret_cast<ClientChannel*>(res->channels.data());
  args.channels_per_worker = per_worker;
  args.counters = reinterpret_cast<WorkerCounters*>(res->counters.device());
  if (batch > 1) {
    std::byte* b = res->batch.data();
    args.batch_requests = reinterpret_cast<Request*>(b);
    args.batch_out = reinterpret_cast<std::byte**>(b + sizeof(Request) * w * batch);
    args.batch_sizes =
        reinterpret_cast<uint32_t*>(b + (sizeof(Request) + sizeof(std::byte*)) * w * batch);
  }
  args.staging = stage_replies ? res->staging.data() : nullptr;
  args.staging_stride = stride;
  if (overlapped) {
    args.overlap_tables = overlap_tables_.data();
    args.channel_stopped = reinterpret_cast<uint32_t*>(res->channel_stopped.data());
  }
  args.workers = w;
  args.burst = options_.burst == 0 ? 1 : options_.burst;
  args.busy_polls = options_.busy_polls;
  args.idle_sleep_max_ns = options_.idle_sleep_max_ns == 0 ? 1 : options_.idle_sleep_max_ns;
  args.max_response = max_response;
  prepared_ = std::move(res);
  return Status::ok_status();
}

Status Runtime::launched(cudaError_t launch) {
  if (!prepared_) return invalid_argument("GPU accelerator: launched() without prepare()");
  std::unique_ptr<LaunchResources> res = std::move(prepared_);
  CARACAL_RETURN_IF_ERROR(cuda_status(launch, "launching " + summary()));
  resources_ = std::move(res);
  running_ = true;
  failure_ = Status::ok_status();
  return Status::ok_status();
}

Status Runtime::stop() {
  if (!running_) return Status::ok_status();
  Status raised = write_stop_word(region_, header_, 1, resources_->control.get());
  raised_stop_ = raised.ok();
  bool timed_out = false;
  Status done = raised.ok() ? wait_stream(resources_->stream.get(),
                                          std::chrono::milliseconds(options_.stop_timeout_ms),
                                          "stopping " + summary(), &timed_out)
                            : raised;
  running_ = false;
  if (timed_out) {
    (void)resources_.release();  // the kernel may still use it: see launch.hpp
    overlap_tables_.leak();
    failure_ = done;
    return done;
  }
  snapshot_counters();
  resources_.reset();
  if (!done.ok()) failure_ = done;
  return done;
}

Status Runtime::health() {
  if (!running_) return failure_;
  const cudaError_t e = cudaStreamQuery(resources_->stream.get());
  if (e == cudaErrorNotReady) return Status::ok_status();
  if (e == cudaSuccess) {
    return Status(StatusCode::kAborted,
                  summary() + " returned: the region's stop word was raised by its peer");
  }
  return cuda_status(e, summary() + " failed");
}

WorkerCounters Runtime::counters(uint32_t worker) const {
  if (running_) return read_counters(worker);
  return worker < last_counters_.size() ? last_counters_[worker] : WorkerCounters{};
}

uint64_t Runtime::total_requests() const {
  uint64_t n = 0;
  for (uint32_t w = 0; w < shape_.workers; ++w)
    n += counters(w).requests;
  return n;
}

std::string Runtime::summary() const {
  return "gpu:" + std::to_string(device_) + " kernel: " + std::to_string(shape_.workers) + " " +
         granularity_name(needs_.granularity) + "-granular worker(s) in " +
         std::to_string(shape_.blocks) + " block(s) of " + std::to_string(shape_.threads) +
         " threads";
}

WorkerCounters Runtime::read_counters(uint32_t worker) const {
  WorkerCounters out;
  if (!resources_ || worker >= shape_.workers) return out;
  auto* c = reinterpret_cast<WorkerCounters*>(resources_->counters.host()) + worker;
  // Relaxed: the GPU writes these for reporting only.
  out.requests = std::atomic_ref<uint64_t>(c->requests).load(std::memory_order_relaxed);
  out.handler_errors = std::atomic_ref<uint64_t>(c->handler_errors).load(std::memory_order_relaxed);
  out.reply_ring_full =
      std::atomic_ref<uint64_t>(c->reply_ring_full).load(std::memory_order_relaxed);
  out.corrupt_entries =
      std::atomic_ref<uint64_t>(c->corrupt_entries).load(std::memory_order_relaxed);
  out.stale_replies = std::atomic_ref<uint64_t>(c->stale_replies).load(std::memory_order_relaxed);
  return out;
}

void Runtime::snapshot_counters() {
  last_counters_.assign(shape_.workers, WorkerCounters{});
  for (uint32_t w = 0; w < shape_.workers; ++w)
    last_counters_[w] = read_counters(w);
}

}  // namespace caracal::accel::gpu::detail
