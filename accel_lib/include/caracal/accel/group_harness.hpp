// A handler's own tests: run it on given requests, without a server, an agent or a region, with
// its groups the size they have on a GPU. run_on_cpu() gives each rank a host thread of its own
// and the group real barriers (Group::sync and the collectives), so a warp- or block-granular
// handler's split of the work, its reductions and its shared scratch are tested on any machine;
// and it checks the group contract a GPU does not check: every rank makes the same group calls
// in the same order (on a GPU a rank that skips one hangs its group or reads garbage).
// gpu/group_harness.cuh's run_on_gpu() runs the same requests as kernels.
//
//   const std::vector<HarnessReply> replies = run_on_cpu(MyHandler{...}, {"a", "bb"});
//   EXPECT_EQ(replies[1].bytes, "...");
//
// Call-operator handlers, single or batched (kBatch: requests are taken kBatch at a time, in
// order); an overlapped handler (kInFlight) is tested on an accelerator, as its calls need
// client queues. The handler sees no client queues (ctx.client_count() is 0) and worker 0.
// Host code.
#pragma once

#include <barrier>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/layout.hpp"

namespace caracal::accel {

// One request's response as the server would get it: the leader's size and flags.
struct HarnessReply {
  std::string bytes;
  uint16_t flags = 0;  // mqueue::SlotFlags
  bool error() const { return (flags & mqueue::kSlotError) != 0; }
  bool no_reply() const { return (flags & mqueue::kSlotNoReply) != 0; }
};

struct HarnessOptions {
  // Each response's capacity (the handler's kMaxResponseBytes where that is smaller): the
  // region's max_message_bytes in an agent.
  uint32_t max_response_bytes = 4096;
  // A block-granular handler's group size when it declares no kBlockThreads: the agent's
  // gpu.block_threads (a multiple of 32).
  uint32_t block_threads = 128;
};

// The group contract broken: ranks that made different group calls, or did not all make them.
// What() names the request, the ranks and the calls.
class GroupContractError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

const char* group_op_name(GroupOp op);

// The meeting place of one host group's threads (Group::host_, host_collective): a barrier,
// and a slot per rank for its value and what it called.
class HostGroup {
 public:
  explicit HostGroup(uint32_t size);
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;

  void collective(uint32_t rank, GroupOp op, const void* value, void* result, uint32_t bytes,
                  void (*combine)(GroupOp, const void*, uint32_t, uint32_t, uint32_t, void*),
                  uint32_t from);
  // Rank `rank` is done (its handler returned or threw): the barriers stop waiting for it.
  void leave(uint32_t rank);
  // Group calls (sync and collectives) rank `rank` made so far; read by that rank only.
  uint64_t calls(uint32_t rank) const { return slots_[rank].calls; }
  // The first break of the contract seen, or empty.
  std::string broken() const;
  // Says which request the calls being made belong to, for broken()'s text.
  void set_request(uint32_t rank, uint64_t request) { slots_[rank].request = request; }

 private:
  struct Slot {
    GroupOp op = GroupOp::kSync;
    uint32_t from = 0;
    uint32_t bytes = 0;
    uint64_t calls = 0;
    uint64_t request = 0;
    bool left = false;
  };
  void note_broken(std::string what);

  uint32_t size_;
  std::barrier<> barrier_;
  std::vector<Slot> slots_;
  std::vector<std::byte> values_;  // rank r's value at r * bytes
  mutable std::mutex m_;
  std::string broken_;
};

template <class H>
constexpr uint32_t harness_group_size(const HarnessOptions& o) {
  switch (granularity_of<H>()) {
    case Granularity::kWarp:
      return 32;
    case Granularity::kBlock:
      if constexpr (requires { H::kBlockThreads; }) {
        return H::kBlockThreads;
      } else {
        return o.block_threads;
      }
    default:
      return 1;
  }
}

// The leader's response as the server would get it (an overrun is the accelerator's error).
HarnessReply harness_reply(const Response& leader);

}  // namespace detail

template <Handler H>
std::vector<HarnessReply> run_on_cpu(const H& handler, const std::vector<std::string>& requests,
                                     const HarnessOptions& options = {}) {
  static_assert(!DeclaresInFlight<H>,
                "the group harness runs call-operator handlers; test an overlapped handler on an "
                "accelerator (its calls need client queues)");
  constexpr uint32_t kBatch = batch_of<H>();
  const uint32_t size = detail::harness_group_size<H>(options);
  if (size == 0 || (granularity_of<H>() == Granularity::kBlock && size % 32 != 0)) {
    throw std::invalid_argument("a block-granular group of " + std::to_string(size) +
                                " threads: it must be a multiple of 32 (a warp)");
  }
  const uint32_t capacity = max_response_of<H>(options.max_response_bytes);
  const size_t n = requests.size();
  const size_t batches = (n + kBatch - 1) / kBatch;
  std::vector<std::byte> out(n * capacity);
  std::vector<Response> leader(n);
  std::vector<std::vector<uint64_t>> calls(batches, std::vector<uint64_t>(size));
  detail::HostGroup group(size);
  std::mutex failure_m;
  std::exception_ptr failure;
  size_t failed_at = 0;

  const auto run_rank = [&](uint32_t rank) {
    H h = handler;  // every thread its own copy, as every GPU thread has
    Context ctx(Group(granularity_of<H>(), rank, size, size > 1 ? &group : nullptr), nullptr, 0, 0);
    for (size_t b = 0; b < batches; ++b) {
      const size_t first = b * kBatch;
      const uint32_t count = static_cast<uint32_t>(std::min<size_t>(kBatch, n - first));
      Request reqs[kBatch];
      Response resps[kBatch];
      for (uint32_t i = 0; i < count; ++i) {
        const std::string& r = requests[first + i];
        reqs[i] = Request{reinterpret_cast<const std::byte*>(r.data()),
                          static_cast<uint32_t>(r.size()), 0, first + i};
        resps[i] = Response{out.data() + (first + i) * capacity, capacity, 0, 0};
      }
      group.set_request(rank, first);
      try {
        if constexpr (kBatch == 1) {
          h(reqs[0], resps[0], ctx);
        } else {
          h(reqs, resps, count, ctx);
        }
      } catch (...) {
        {
          std::lock_guard lock(failure_m);
          if (!failure) {
            failure = std::current_exception();
            failed_at = first;
          }
        }
        group.leave(rank);
        return;
      }
      calls[b][rank] = group.calls(rank);
      if (rank == 0) {
        for (uint32_t i = 0; i < count; ++i)
          leader[first + i] = resps[i];
      }
    }
    group.leave(rank);
  };
  {
    std::vector<std::jthread> ranks;
    ranks.reserve(size);
    for (uint32_t r = 0; r < size; ++r)
      ranks.emplace_back(run_rank, r);
  }  // joined

  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      throw std::runtime_error("request " + std::to_string(failed_at) +
                               ": the handler threw: " + e.what());
    }
  }
  // The first request whose calls differ in number says most; then what the calls met.
  for (size_t b = 0; b < batches; ++b) {
    for (uint32_t r = 1; r < size; ++r) {
      if (calls[b][r] != calls[b][0]) {
        throw GroupContractError(
            "request " + std::to_string(b * kBatch) + ": rank " + std::to_string(r) + " made " +
            std::to_string(calls[b][r]) + " group call(s) by its end, rank 0 " +
            std::to_string(calls[b][0]) + ": every rank makes the same group calls");
      }
    }
  }
  if (std::string broken = group.broken(); !broken.empty()) throw GroupContractError(broken);
  std::vector<HarnessReply> replies;
  replies.reserve(n);
  for (const Response& r : leader)
    replies.push_back(detail::harness_reply(r));
  return replies;
}

}  // namespace caracal::accel
