// The host-centric server's kernels: one launch serves a whole batch, each request by the
// group its handler's granularity asks for.
#include <cuda_runtime.h>

#include "caracal/accel/handler.hpp"
#include "face_items.hpp"
#include "gpu_batch.hpp"
#include "handlers.hpp"

namespace caracal::bench::baseline {
namespace {

constexpr uint32_t kBlockThreads = 128;

template <class H>
__global__ void serve_batch(H handler, const std::byte* in, std::byte* out, uint32_t count,
                            uint32_t max_batch) {
  const auto* descs = reinterpret_cast<const BatchDesc*>(in);
  auto* results = reinterpret_cast<BatchResult*>(out);
  const std::byte* in_data = in + size_t{max_batch} * sizeof(BatchDesc);
  std::byte* out_data = out + size_t{max_batch} * sizeof(BatchResult);
  constexpr accel::Granularity g = accel::granularity_of<H>();
  uint32_t index, rank, size;
  if constexpr (g == accel::Granularity::kThread) {
    index = blockIdx.x * blockDim.x + threadIdx.x;
    rank = 0;
    size = 1;
  } else if constexpr (g == accel::Granularity::kWarp) {
    index = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    rank = threadIdx.x % 32;
    size = 32;
  } else {
    index = blockIdx.x;
    rank = threadIdx.x;
    size = blockDim.x;
  }
  // Uniform across a group: its threads share the index.
  if (index >= count) return;
  const BatchDesc d = descs[index];
  accel::Request req{in_data + d.in_offset, d.size, 0, index};
  accel::Response resp{out_data + d.out_offset, d.capacity};
  accel::Context ctx(accel::Group(g, rank, size), nullptr, 0, index);
  H h = handler;
  h(req, resp, ctx);
  if (rank == 0) results[index] = BatchResult{resp.size, resp.flags, 0};
}

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

template <class H>
class Runner final : public GpuBatchRunner {
  static_assert(accel::batch_of<H>() == 1, "the host-centric server calls one request at a time");

 public:
  Runner(H handler, uint32_t max_batch, size_t data_bytes)
      : handler_(handler), max_batch_(max_batch) {
    in_bytes_ = max_batch * sizeof(BatchDesc) + data_bytes;
    out_bytes_ = max_batch * sizeof(BatchResult) + data_bytes;
  }
  ~Runner() override {
    for (int s = 0; s < 2; ++s) {
      if (host_in_[s] != nullptr) cudaFreeHost(host_in_[s]);
      if (host_out_[s] != nullptr) cudaFreeHost(host_out_[s]);
    }
    if (dev_in_ != nullptr) cudaFree(dev_in_);
    if (dev_out_ != nullptr) cudaFree(dev_out_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::string init(int device) {
    device_ = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_error("cudaSetDevice", e);
    for (int s = 0; s < 2; ++s) {
      if ((e = cudaHostAlloc(&host_in_[s], in_bytes_, cudaHostAllocDefault)) != cudaSuccess)
        return cuda_error("cudaHostAlloc", e);
      if ((e = cudaHostAlloc(&host_out_[s], out_bytes_, cudaHostAllocDefault)) != cudaSuccess)
        return cuda_error("cudaHostAlloc", e);
    }
    if ((e = cudaMalloc(&dev_in_, in_bytes_)) != cudaSuccess) return cuda_error("cudaMalloc", e);
    if ((e = cudaMalloc(&dev_out_, out_bytes_)) != cudaSuccess) return cuda_error("cudaMalloc", e);
    if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess)
      return cuda_error("cudaStreamCreate", e);
    return {};
  }
  std::byte* host_in(int set) override { return static_cast<std::byte*>(host_in_[set]); }
  std::byte* host_out(int set) override { return static_cast<std::byte*>(host_out_[set]); }

  std::string run(int set, uint32_t count, size_t in_data_bytes, size_t out_data_bytes) override {
    if (count == 0) return {};
    // The calling thread's current device is its own (a GPU thread per device): a launch must
    // be on it. Cheap when it already is.
    cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return cuda_error("cudaSetDevice", e);
    const size_t in = max_batch_ * sizeof(BatchDesc) + in_data_bytes;
    const size_t out = max_batch_ * sizeof(BatchResult) + out_data_bytes;
    e = cudaMemcpyAsync(dev_in_, host_in_[set], in, cudaMemcpyHostToDevice, stream_);
    if (e != cudaSuccess) return cuda_error("cudaMemcpyAsync to the GPU", e);
    constexpr accel::Granularity g = accel::granularity_of<H>();
    uint32_t threads = kBlockThreads;
    if constexpr (g == accel::Granularity::kBlock && requires { H::kBlockThreads; }) {
      threads = H::kBlockThreads;
    }
    uint32_t blocks;
    if constexpr (g == accel::Granularity::kThread) {
      blocks = (count + kBlockThreads - 1) / kBlockThreads;
    } else if constexpr (g == accel::Granularity::kWarp) {
      blocks = (count + kBlockThreads / 32 - 1) / (kBlockThreads / 32);
    } else {
      blocks = count;
    }
    serve_batch<H>
        <<<blocks, threads, 0, stream_>>>(handler_, static_cast<const std::byte*>(dev_in_),
                                          static_cast<std::byte*>(dev_out_), count, max_batch_);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_error("kernel launch", e);
    e = cudaMemcpyAsync(host_out_[set], dev_out_, out, cudaMemcpyDeviceToHost, stream_);
    if (e != cudaSuccess) return cuda_error("cudaMemcpyAsync from the GPU", e);
    if ((e = cudaStreamSynchronize(stream_)) != cudaSuccess) return cuda_error("the batch", e);
    return {};
  }

 private:
  H handler_;
  int device_ = 0;
  uint32_t max_batch_;
  size_t in_bytes_ = 0, out_bytes_ = 0;
  void* host_in_[2] = {nullptr, nullptr};
  void* host_out_[2] = {nullptr, nullptr};
  void* dev_in_ = nullptr;
  void* dev_out_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

template <class H>
std::unique_ptr<GpuBatchRunner> make(const HandlerParams& params, int device, uint32_t max_batch,
                                     size_t data_bytes, std::string& error) {
  auto r = std::make_unique<Runner<H>>(make_handler<H>(params), max_batch, data_bytes);
  error = r->init(device);
  if (!error.empty()) return nullptr;
  return r;
}

}  // namespace

std::unique_ptr<GpuBatchRunner> make_gpu_batch_runner(const std::string& handler,
                                                      const HandlerParams& params, int device,
                                                      uint32_t max_batch, size_t data_bytes,
                                                      std::string& error) {
  std::unique_ptr<GpuBatchRunner> out;
  if (handler == "face") {
    return make<FaceItemHandler>(params, device, max_batch, data_bytes, error);
  }
  if (!with_handler(handler, [&]<class H>() {
        out = make<H>(params, device, max_batch, data_bytes, error);
      })) {
    error = "unknown handler '" + handler + "'";
  }
  return out;
}

}  // namespace caracal::bench::baseline
