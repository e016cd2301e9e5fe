// Every constant of snic_server that a reader would tune, in one place, each with the reason for
// its value (eRPC's habit). Where two depend on each other a static_assert ties them.
//
// Not here: what the configuration sets (config.hpp, with its defaults and limits), and protocol
// facts, which stay with their protocol (the token's bit widths in reply_routing.hpp, frame and
// datagram limits in framing and the listeners, the control protocol's frame limit).
//
// Figures that explain a value (latencies, rates) live in bench/results/EXPERIMENTS.md and the
// README, not here: they go stale, the reasons do not.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace caracal::server::tunables {

using namespace std::chrono_literals;

// ---- mqueue manager: engine threads and their idle policy (mqueue_manager/idle_policy.hpp) ----

// I/O threads a server may run (the `io_threads` key). Far more than any SmartNIC has cores (a
// BlueField-3 has 16, a BlueField-4 64): the bound only keeps a typo from starting thousands.
inline constexpr uint32_t kMaxIoThreads = 256;

// Engine threads a server may run. With the engine in the I/O threads (`engine_threads: 0`, the
// default) each I/O thread hosts one, so there must be room for one per I/O thread: a cap below
// io_threads would force the engine out of the I/O threads into a few threads of their own that
// every request is handed to. Whatever a reply sink holds per engine thread (a burst buffer in
// each TCP connection and UDP socket) is sized by the engine's actual thread count, not by this.
inline constexpr uint32_t kMaxEngineThreads = kMaxIoThreads;
static_assert(kMaxEngineThreads >= kMaxIoThreads, "every I/O thread can host an engine thread");

// Rounds without work an engine thread spins before it yields, then sleeps
// (EngineOptions::spin_rounds). Long enough that a thread which just wrote requests catches
// their replies while it still polls instead of after a wake-up; short enough that an idle
// thread gives its core back soon. While replies are outstanding the thread then yields for as
// many rounds again before it naps. What a spin costs depends on the round: an engine thread of
// its own looks at its rings only, an I/O thread that hosts the engine also polls its host's
// reactor (an epoll_wait() a round), so its spin lasts longer; a request that comes after a
// spin has ended costs a whole spin of CPU (the figures: snic_server/README.md, "The engine").
inline constexpr uint32_t kSpinRounds = 20000;

// An I/O thread that hosts an engine thread and is woken from its sleep by a handler that
// brought no request (a timer such as the acceptor's retry at the file limit, a control
// message, a new connection) spins this many rounds before it sleeps again, not kSpinRounds:
// the long spin is for a thread that expects replies or more requests. (Such a handler run
// between rounds leaves the spin where it was: EngineThread::run_hosted().) A timer that fires
// more often than a spin lasts would otherwise keep an idle thread spinning for as long as it
// fires (e2e.conn_limits bounds an idle thread's CPU at the file limit; the figures:
// snic_server/README.md, "The engine").
inline constexpr uint32_t kQuietWakeSpinRounds = 256;

// An I/O thread that hosts an engine thread runs at most this many of its host's ready
// handlers between two engine rounds. Under a flood a socket's handler is ready again as soon
// as it ends (its next receive finds data at once), and a host that ran handlers until none
// was ready would run no round, take no reply and give no ring slot back for as long as the
// flood lasts (snic_server/README.md, "The engine"). A UDP handler takes up to
// kUdpReceiveBatch * kUdpDrainRounds datagrams and a TCP one a read of one connection, so the
// bound leaves a round every few thousand datagrams or every 64 connections' reads, and costs
// no throughput that shows at the benchmark's loads (bench/results/EXPERIMENTS.md,
// handler-bound-nap-h100x4).
inline constexpr size_t kHostHandlersPerRound = 64;

// Spinning pays only on a core of the thread's own. Every kContendedLookRounds rounds without
// work a thread compares its CPU clock with the wall clock; one that lost at least
// kContendedLostMin, and 1/kContendedLostShare of the time, to other threads since it last
// looked spins only kContendedSpinRounds for kContendedHold (EngineOptions::contended_*).
// A look is a system call, a round without work far less: looking every 256 rounds keeps the
// looks a small part of the spin.
inline constexpr uint32_t kContendedLookRounds = 256;
// A short preemption (a kernel worker, a client woken on the same core) loses less than this;
// a time slice lost to another runnable thread loses more.
inline constexpr std::chrono::microseconds kContendedLostMin = 500us;
inline constexpr uint32_t kContendedLostShare = 8;
// Enough rounds to take a reply that is already there, few enough that the core goes to the
// thread being waited for (the agent's worker, a client) within microseconds.
inline constexpr uint32_t kContendedSpinRounds = 64;
// The number of runnable threads changes slowly; the long spin is tried again after this.
inline constexpr std::chrono::milliseconds kContendedHold = 1000ms;

// Longest nap while replies are outstanding (EngineOptions::max_poll_sleep): nothing wakes a
// thread for an entry in a TX ring, so this is what an idle engine may add to a reply's latency.
inline constexpr std::chrono::microseconds kMaxPollSleep = 50us;
// Longest sleep with nothing in flight: requests and commands wake the thread, so the timeout
// only paces the deadlines of draining regions and a stop it missed (an idle thread wakes
// 1 s / kIdleSleep times a second, counted in caracal_engine_sleeps_total).
inline constexpr std::chrono::milliseconds kIdleSleep = 5ms;

// TX polling of an rdma region with nothing outstanding: every fetch of the TX tails is an RDMA
// READ, so the gap between fetches doubles from Min to Max after each empty one. An idle region
// costs at most one READ per kRdmaIdleFetchMax, and a call that a client queue makes waits at
// most that long to be seen.
inline constexpr std::chrono::microseconds kRdmaIdleFetchMin = 20us;
inline constexpr std::chrono::microseconds kRdmaIdleFetchMax = 1000us;

// Reply deadlines (ServiceConfig::reply_timeout_ms, mqueue_manager/flights.hpp). An engine thread
// reads the clock every kDeadlineClockRounds rounds (and after every sleep), and looks for
// expired requests and ejections that are over at most once per kReplyCheckPeriod: a timeout
// then comes at most about that late, and the look, a few loads per queue when nothing expired,
// stays off the path of every request. Reading the clock every round would add a vDSO call to
// rounds of tens of nanoseconds; a busy round serves a burst, so 16 of them are well under the
// period.
inline constexpr std::chrono::milliseconds kReplyCheckPeriod = 1ms;
inline constexpr uint32_t kDeadlineClockRounds = 16;
// Expired requests a queue remembers, so that an answer that comes for one afterwards is counted
// as `late` rather than as an unknown token (either way it is dropped); past this the oldest are
// forgotten. A stalled agent holds at most a ring's worth of written requests, so this covers
// rings of up to 4096 slots whole, and bounds what an agent that never answers costs the server
// (a few hundred KiB per queue).
inline constexpr size_t kLateRepliesRemembered = 4096;

static_assert(kContendedSpinRounds < kSpinRounds, "the short spin must be shorter");
static_assert(kQuietWakeSpinRounds < kSpinRounds, "a quiet wake-up spins shorter than work");
static_assert(kContendedLookRounds <= kSpinRounds, "a thread must look during a long spin");
static_assert(kContendedLostShare >= 2, "losing the core means losing a good part of the time");
static_assert(kMaxPollSleep < kIdleSleep,
              "a thread waiting for replies must poll more often than one with nothing to do");
static_assert(kRdmaIdleFetchMin > 0us && kRdmaIdleFetchMin < kRdmaIdleFetchMax,
              "the gap starts above zero (it doubles) and grows to the maximum");

// ---- network front (front/) ----

// UDP: requests outstanding on a listener from which the engine hands reply bursts to the I/O
// threads instead of sending them itself. Below it, sending from the engine thread saves the
// wake-up of an I/O thread per reply; above it, the sends' network-stack work would make the
// engine thread (which serves every socket) the serial stage.
inline constexpr int64_t kUdpHandOffOutstanding = 16;
// UDP: datagrams taken per recvmmsg() once a receive has completed, and calls per turn: a socket
// that never runs dry gives its I/O thread back after kUdpReceiveBatch * kUdpDrainRounds
// datagrams, so that the other handlers queued there get a turn.
inline constexpr size_t kUdpReceiveBatch = 16;
inline constexpr int kUdpDrainRounds = 8;
// UDP: replies per sendmmsg().
inline constexpr size_t kUdpSendBatch = 64;
// sendmmsg() and recvmmsg() take at most UIO_MAXIOV (1024) messages per call.
static_assert(kUdpReceiveBatch <= 1024 && kUdpSendBatch <= 1024);

// TCP (listeners and destinations): a connection's read buffer holds its largest message, its
// framing, and this much more, so that a stream of small messages is read in large reads.
inline constexpr size_t kStreamReadSlack = 64 * 1024;
// TCP listeners: a connection's read buffer starts this small, allocated at its first read, and
// doubles (up to the size above) when a read fills it or a message does not fit. Most clients
// send requests far smaller than the largest, and thousands of connections each holding the
// largest buffer is what a server's memory goes to. A page: the kernel hands a read no more
// than it has, and the next read grows the buffer if it came full.
inline constexpr size_t kTcpReadInitial = 4096;
// After this many reads in a row that each took at most a quarter of kTcpReadInitial, a
// connection whose buffer grew and is empty goes back to kTcpReadInitial: a burst's buffer is
// not held for the rest of a quiet connection's life, and one busy stream does not give its
// buffer back between two reads.
inline constexpr uint32_t kTcpReadShrinkAfter = 8;
// TCP (listeners and destinations): a write buffer larger than this is freed once written,
// rather than kept for the next replies: a large burst of replies is not held by a connection
// that then goes quiet (it holds at most two buffers of this size). Up to it a busy connection
// reuses its buffers from burst to burst, allocating nothing: 16 pipelined replies of 1 KiB
// and their framing are just over 16 KiB.
inline constexpr size_t kStreamWriteKeep = 64 * 1024;
// TCP listeners: the wait before accepting again after accept() failed for want of descriptors
// or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM); the connection waits in the listen backlog
// meanwhile. Retrying at once would spin a core on the same failure.
inline constexpr std::chrono::milliseconds kAcceptRetry = 100ms;
// TCP listeners: accept failures are logged at most once per this interval each, with how many
// there were since the last line.
inline constexpr std::chrono::seconds kAcceptFailureLogInterval = 5s;
static_assert(kTcpReadInitial <= kStreamReadSlack,
              "the first read buffer is no larger than the slack");

// DPDK, with `idle_sleep_us` set: empty polls before a worker sleeps, and the timer slack it
// asks for. Its sleeps are microseconds; the kernel's default slack (50 us) would stretch each.
inline constexpr uint32_t kDpdkEmptyPollsBeforeSleep = 1000;
inline constexpr std::chrono::nanoseconds kDpdkTimerSlack = 1000ns;

// ---- reply routing (reply_routing.hpp) and the threads that share it ----

// Requests of one server in flight at once: TCP connections hold one each, UDP requests one
// until answered (ServerOptions::reply_slots). The token has room for 2^20 (kMaxReplySlots).
inline constexpr uint32_t kReplySlots = 65536;
// Cells that sharded counters and free lists keep, one cache line each (thread_shard.hpp): each
// of the first kThreadShards threads that touch them has a cell of its own, and the threads
// beyond that share cells (still correct, no longer free of sharing). 64 covers a server with the
// engine in 64 I/O threads, or 32 I/O threads next to 32 engine threads of their own; a counter
// costs 64 cache lines (4 KiB), and a histogram 64 times its buckets.
inline constexpr uint32_t kThreadShards = 64;
static_assert(kThreadShards >= 32, "the I/O threads of a 32-core host have a shard each");

// ---- shutdown (server.cpp) and agents (control_endpoint.cpp) ----

// How long stop() waits for requests in flight before failing them (ServerOptions::drain).
inline constexpr std::chrono::milliseconds kStopDrain = 3000ms;
// After agents are dropped: how long connections get to write their last replies before every
// one still open is closed.
inline constexpr std::chrono::milliseconds kStopCloseWait = 500ms;
// How often stop() looks whether those waits are over.
inline constexpr std::chrono::milliseconds kStopPoll = 5ms;
static_assert(kStopPoll < kStopCloseWait && kStopPoll < kStopDrain);

// An agent's `bye`: how long the requests already in its rings get to be answered.
inline constexpr std::chrono::milliseconds kByeDrain = 5000ms;
// Heartbeat checks per agent_timeout_ms: an agent is found lost at most 1/4 of its timeout late.
inline constexpr uint32_t kHeartbeatChecksPerTimeout = 4;
// The first wait before reconnecting an rdma region whose transport failed; it doubles up to
// control.rdma_reconnect_max_ms, which may not be set below it (config.cpp).
inline constexpr std::chrono::milliseconds kRdmaReconnectFirst = 100ms;

// ---- metrics and logs (metrics/) ----

// /metrics: the largest request header and body (Prometheus sends a few hundred bytes), how long
// an idle keep-alive connection stays open, and the wait before accepting again after an accept
// failed (out of descriptors, say).
inline constexpr size_t kMetricsMaxRequestBytes = 8192;
inline constexpr std::chrono::seconds kMetricsIdleTimeout = 60s;
inline constexpr std::chrono::milliseconds kMetricsAcceptRetry = 100ms;

// Repeated warnings (log_summary.hpp): the lines let through from one place in each window; the
// rest are counted into one summary line. The log is flushed (and a pending summary written)
// every kLogFlushPeriod, so that a summary never waits long for a next line from its place.
inline constexpr uint32_t kLogRepeatBurst = 5;
inline constexpr std::chrono::milliseconds kLogRepeatWindow = 1000ms;
inline constexpr std::chrono::seconds kLogFlushPeriod = 1s;  // spdlog::flush_every() takes seconds
static_assert(kLogFlushPeriod <= kLogRepeatWindow, "a summary is written within one window");

// ---- memory (main.cpp) ----

// Every request and reply is a heap buffer that one thread allocates and another frees. glibc
// gives memory back to the kernel when more than M_TRIM_THRESHOLD is free at the top of an arena,
// and the next allocations fault the pages in again; buffers above M_MMAP_THRESHOLD get mappings
// of their own, with the same cost. The server keeps this much free per arena, and buffers below
// the threshold off mmap.
inline constexpr int kMallocTrimThreshold = 64 << 20;
inline constexpr int kMallocMmapThreshold = 1 << 20;
// glibc ignores an M_MMAP_THRESHOLD above 32 MiB (HEAP_MAX_SIZE / 2 on 64-bit).
static_assert(kMallocMmapThreshold <= 32 << 20 && kMallocMmapThreshold < kMallocTrimThreshold);
// What the threshold above keeps is what a burst of closed connections leaves free, too. So
// every kTrimPeriod the server looks whether at least kTrimAfterCloses connections closed since
// it last gave memory back, and if so calls malloc_trim() (memory_trim.hpp). A burst of closes
// is rare next to requests, so the pages faulted in again afterwards cost nothing that shows;
// steady traffic with few closes never trims.
inline constexpr std::chrono::milliseconds kTrimPeriod = 1000ms;
inline constexpr uint64_t kTrimAfterCloses = 64;

}  // namespace caracal::server::tunables
