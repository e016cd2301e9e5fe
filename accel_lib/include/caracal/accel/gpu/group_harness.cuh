// The group harness on a GPU (group_harness.hpp has the CPU's): the same requests, each batch
// of them served by one block whose threads are the handler's group (one thread, a warp's 32
// lanes, or the block's threads), the handler copied into every thread as the persistent
// kernel copies it. For a handler's own tests on a GPU machine, next to run_on_cpu().
//
//   Result<std::vector<HarnessReply>> replies = gpu::run_on_gpu(MyHandler{...}, {"a", "bb"});
//
// A fault() in the handler (__trap) fails the run with CUDA's error, and leaves the device's
// context unusable for the rest of the process, as it does in an agent. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/accel/group_harness.hpp"

namespace caracal::accel::gpu {
namespace detail {

template <class H>
__global__ void group_harness_kernel(H handler, const std::byte* bytes, const uint64_t* offsets,
                                     const uint32_t* sizes, uint32_t n, std::byte* out,
                                     uint32_t capacity, uint32_t* out_sizes, uint16_t* out_flags) {
  constexpr uint32_t kBatch = batch_of<H>();
  const uint32_t first = blockIdx.x * kBatch;
  const uint32_t count = n - first < kBatch ? n - first : kBatch;
  Request reqs[kBatch];
  Response resps[kBatch];
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t k = first + i;
    reqs[i] = Request{bytes + offsets[k], sizes[k], 0, k};
    resps[i] = Response{out + uint64_t{k} * capacity, capacity, 0, 0};
  }
  Context ctx(Group(granularity_of<H>(), threadIdx.x, blockDim.x), nullptr, 0, 0);
  if constexpr (kBatch == 1) {
    handler(reqs[0], resps[0], ctx);
  } else {
    handler(reqs, resps, count, ctx);
  }
  if (threadIdx.x == 0) {  // the leader's size and flags are the response's
    for (uint32_t i = 0; i < count; ++i) {
      out_sizes[first + i] = resps[i].size;
      out_flags[first + i] = resps[i].flags;
    }
  }
}

}  // namespace detail

template <Handler H>
Result<std::vector<HarnessReply>> run_on_gpu(const H& handler,
                                             const std::vector<std::string>& requests,
                                             const HarnessOptions& options = {}, int device = 0) {
  static_assert(!DeclaresInFlight<H>,
                "the group harness runs call-operator handlers; test an overlapped handler on an "
                "accelerator (its calls need client queues)");
  constexpr uint32_t kBatch = batch_of<H>();
  const uint32_t threads = accel::detail::harness_group_size<H>(options);
  if (granularity_of<H>() == Granularity::kBlock && (threads == 0 || threads % 32 != 0)) {
    return invalid_argument("a block-granular group of " + std::to_string(threads) +
                            " threads: it must be a multiple of 32 (a warp)");
  }
  std::vector<HarnessReply> replies;
  const uint32_t n = static_cast<uint32_t>(requests.size());
  if (n == 0) return replies;
  const uint32_t capacity = max_response_of<H>(options.max_response_bytes);
  CARACAL_RETURN_IF_ERROR(use_device(device));

  std::string packed;
  std::vector<uint64_t> offsets(n);
  std::vector<uint32_t> sizes(n);
  for (uint32_t i = 0; i < n; ++i) {
    offsets[i] = packed.size();
    sizes[i] = static_cast<uint32_t>(requests[i].size());
    packed += requests[i];
  }
  const auto buffer = [](uint64_t bytes, const char* what) {
    return DeviceBuffer::allocate(bytes == 0 ? 1 : bytes, std::string("group harness: ") + what);
  };
  Result<DeviceBuffer> d_bytes = buffer(packed.size(), "requests");
  Result<DeviceBuffer> d_offsets = buffer(n * sizeof(uint64_t), "request offsets");
  Result<DeviceBuffer> d_sizes = buffer(n * sizeof(uint32_t), "request sizes");
  Result<DeviceBuffer> d_out = buffer(uint64_t{n} * capacity, "responses");
  Result<DeviceBuffer> d_out_sizes = buffer(n * sizeof(uint32_t), "response sizes");
  Result<DeviceBuffer> d_out_flags = buffer(n * sizeof(uint16_t), "response flags");
  for (const Result<DeviceBuffer>* b :
       {&d_bytes, &d_offsets, &d_sizes, &d_out, &d_out_sizes, &d_out_flags}) {
    if (!b->ok()) return b->status();
  }
  const auto to_device = [](const DeviceBuffer& to, const void* from, size_t bytes) {
    return cuda_status(cudaMemcpy(to.data(), from, bytes, cudaMemcpyHostToDevice),
                       "group harness: copying the requests in");
  };
  CARACAL_RETURN_IF_ERROR(to_device(*d_bytes, packed.data(), packed.size()));
  CARACAL_RETURN_IF_ERROR(to_device(*d_offsets, offsets.data(), n * sizeof(uint64_t)));
  CARACAL_RETURN_IF_ERROR(to_device(*d_sizes, sizes.data(), n * sizeof(uint32_t)));

  const uint32_t blocks = (n + kBatch - 1) / kBatch;
  detail::group_harness_kernel<H><<<blocks, threads>>>(
      handler, d_bytes->data(), reinterpret_cast<const uint64_t*>(d_offsets->data()),
      reinterpret_cast<const uint32_t*>(d_sizes->data()), n, d_out->data(), capacity,
      reinterpret_cast<uint32_t*>(d_out_sizes->data()),
      reinterpret_cast<uint16_t*>(d_out_flags->data()));
  CARACAL_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "group harness: launching the kernel"));
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaDeviceSynchronize(), "group harness: the handler's kernel failed"));

  std::vector<std::byte> out(uint64_t{n} * capacity);
  std::vector<uint32_t> out_sizes(n);
  std::vector<uint16_t> out_flags(n);
  const auto to_host = [](void* to, const DeviceBuffer& from, size_t bytes) {
    return cuda_status(cudaMemcpy(to, from.data(), bytes, cudaMemcpyDeviceToHost),
                       "group harness: copying the responses out");
  };
  CARACAL_RETURN_IF_ERROR(to_host(out.data(), *d_out, out.size()));
  CARACAL_RETURN_IF_ERROR(to_host(out_sizes.data(), *d_out_sizes, n * sizeof(uint32_t)));
  CARACAL_RETURN_IF_ERROR(to_host(out_flags.data(), *d_out_flags, n * sizeof(uint16_t)));
  replies.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    Response leader{out.data() + uint64_t{i} * capacity, capacity, out_sizes[i], out_flags[i]};
    replies.push_back(accel::detail::harness_reply(leader));
  }
  return replies;
}

}  // namespace caracal::accel::gpu
