// What the mqueue manager reports to the layer above it about the requests of one service.
//
// Dispatch calls down into the engine (a request into an inbox, Engine::note_dispatched) and the
// engine never calls back into dispatch: it reports through this interface, which Service
// implements (dispatch.hpp) and each AgentRegion carries for the service it serves. So the
// dependency points one way, front -> framing -> dispatch -> mqueue manager -> reply routing, and
// nothing under mqueue_manager/ includes dispatch.hpp.
//
// Every call comes from an engine thread, often several at once (one per engine thread that
// serves a queue of the service), and from the data path: an implementation must be
// thread-safe, must not block, and must not call back into the engine.
#pragma once

#include <chrono>
#include <string>

#include "metrics/drops.hpp"
#include "reply_routing.hpp"

namespace caracal::server {

class AgentRegion;

class EngineEvents {
 public:
  // The service's name, for logs ("agent echo-1 epoch ..., service echo").
  virtual const std::string& name() const = 0;

  // Requests left some of the service's inboxes for their RX rings: a queue that was congested
  // may have room again (TCP connections parked on the service resume).
  virtual void on_room() = 0;

  // The engine dropped `region` for a fault (a corrupt TX entry, a failed transport): it must
  // leave dispatch at once. The engine fails the region's requests in flight itself, each
  // reported through on_answer().
  virtual void on_region_unusable(const AgentRegion& region) = 0;

  // One answer to a request of the service, dispatched `latency` ago: a handler's reply, or a
  // failure the engine made (kError: agent lost, detached or faulty, server shutting down).
  virtual void on_answer(Reply::Kind kind, std::chrono::steady_clock::duration latency) = 0;

  // A reply taken from its TX line, ahead of the tail that publishes it (mqueue/layout.hpp).
  virtual void on_line_reply() = 0;

  // An answer that could not be routed: DropReason::kUnknownToken (a token the queue was not
  // given, or one already answered), kLate (its request had timed out) or kConnectionClosed
  // (its client is gone).
  virtual void on_unrouted(DropReason reason) = 0;

  // Requests on one of `region`'s server queues went unanswered past the region's reply bound
  // (AgentRegion::reply_timeout()): `expired` of them in this look, each already answered with
  // an error through on_answer(). `in_a_row` is how many requests of that queue have now timed
  // out with no answer in time between them (an answer in time starts it again from 0): what
  // outlier ejection goes by. At most once per queue per tunables::kReplyCheckPeriod.
  virtual void on_reply_timeouts(const AgentRegion& region, uint32_t expired,
                                 uint32_t in_a_row) = 0;

  // `region` is ejected (AgentRegion::ejected_until()) and may return to dispatch: it answered
  // a request in time (`answered`), or an engine thread found its ejection period over. Either
  // may come from several engine threads at once, and after the region has returned.
  virtual void on_ejection_over(const AgentRegion& region, bool answered) = 0;

 protected:
  ~EngineEvents() = default;  // not owned through this interface
};

}  // namespace caracal::server
