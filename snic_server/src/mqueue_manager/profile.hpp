// Where the engine thread's time goes, for benchmarks: with the CMake option
// CARACAL_ENGINE_PROFILE the engine times each stage of its loop with steady_clock and, when its
// thread ends, logs the totals (time, count, time per item) with the thread's CPU time, page
// faults and context switches. Without the option every Scope is empty and costs nothing.
//
// Engine thread only: the totals are thread_local, so two engines in one process (tests) keep
// their own.
#pragma once

#include <chrono>
#include <cstdint>

namespace caracal::server::engine_profile {

enum Stage : uint32_t {
  kRound,        // one whole loop round (commands, every region, flushes)
  kServe,        // RegionBinding::serve of one region
  kInboxTake,    // QueueInbox::take
  kRxWrite,      // the RX loop of one queue: reserve, copy, commit, bookkeeping, request free
  kRxCopy,       // memcpy of a request into its RX slot
  kRequestFree,  // destroying the request's Message (its buffer came from an I/O thread)
  kRxReserve,    // RingProducer::reserve of a request's slots (a read of the head when short)
  kRxCommit,     // its header (and its lines) written: RingProducer::commit
  kRxPublish,    // after a queue's RX writes: the tail's publication, the inbox's count, on_room
  kTxFetch,      // fetch_tx_tails + deliver_tx_tails (rdma; shm loads its tails in kTxNext)
  kTxNext,       // RemoteRingConsumer::next_by_line, the tail's load (shm), next
  kRoute,        // ReplyTable::route
  kDeliver,      // ReplySink::deliver (the sink's copy of the reply from its TX slot)
  kAnswerOther,  // the rest of EngineThread::answer (counters)
  kTxRelease,    // release + publish of a TX ring's head
  kFlush,        // flush_replies (end_burst: sends, or posts to I/O threads)
  kIdle,         // EngineThread::idle
  kStageCount
};

#ifdef CARACAL_ENGINE_PROFILE
inline constexpr bool kEnabled = true;

struct Totals {
  uint64_t ns[kStageCount] = {};
  uint64_t count[kStageCount] = {};
};
inline thread_local Totals totals;

class Scope {
 public:
  explicit Scope(Stage s) : stage_(s), start_(std::chrono::steady_clock::now()) {}
  ~Scope() {
    totals.ns[stage_] += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                   std::chrono::steady_clock::now() - start_)
                                                   .count());
    ++totals.count[stage_];
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Stage stage_;
  std::chrono::steady_clock::time_point start_;
};

// Called when the engine thread starts and when it ends: the second call logs the report.
void thread_begin();
void thread_end();
#else
inline constexpr bool kEnabled = false;

class Scope {
 public:
  explicit Scope(Stage) {}
};
inline void thread_begin() {}
inline void thread_end() {}
#endif

}  // namespace caracal::server::engine_profile
