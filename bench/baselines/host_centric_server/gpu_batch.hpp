// The GPU side of the host-centric server, behind a plain C++ interface so the network side
// (Boost.Asio) stays on the host compiler. One batch = one copy to the GPU, one kernel launch,
// one copy back.
//
// Host buffers of one set (two sets, so the I/O threads fill one while the GPU runs the other):
//   in:  BatchDesc[max_batch], then the requests' bytes (at in_offset from the data start)
//   out: BatchResult[max_batch], then the replies' bytes (at out_offset)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "handlers.hpp"

namespace caracal::bench::baseline {

struct BatchDesc {
  uint32_t in_offset = 0;
  uint32_t size = 0;
  uint32_t out_offset = 0;
  uint32_t capacity = 0;
};

struct BatchResult {
  uint32_t size = 0;
  uint16_t flags = 0;  // mqueue::SlotFlags the handler set (no reply, error)
  uint16_t pad = 0;
};

class GpuBatchRunner {
 public:
  virtual ~GpuBatchRunner() = default;
  virtual std::byte* host_in(int set) = 0;   // pinned
  virtual std::byte* host_out(int set) = 0;  // pinned
  // Runs `count` requests of `set`: copies the descriptors and in_data_bytes of requests to
  // the GPU, launches the handler (a thread, warp or block per request, as its granularity
  // says), copies the results and out_data_bytes of replies back and waits. Empty, or the CUDA
  // error.
  virtual std::string run(int set, uint32_t count, size_t in_data_bytes, size_t out_data_bytes) = 0;
};

// For the handler named `handler` (echo, matvec, face: items of common/face_items.hpp), with
// `params`, on GPU `device`, with room for `max_batch` requests and `data_bytes` of request (and
// of reply) bytes per batch. Null with `error` set when the GPU or the memory cannot be had.
std::unique_ptr<GpuBatchRunner> make_gpu_batch_runner(const std::string& handler,
                                                      const HandlerParams& params, int device,
                                                      uint32_t max_batch, size_t data_bytes,
                                                      std::string& error);

}  // namespace caracal::bench::baseline
