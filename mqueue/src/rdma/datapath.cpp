// RdmaTransport's data path: posting READs and WRITEs in post lists, selective signalling,
// completions, and failure. Setup is in connect.cpp.
#include <algorithm>
#include <cstring>
#include <utility>

#include "caracal/mqueue/rdma_transport.hpp"
#include "cm.hpp"

namespace caracal::mqueue {
namespace {

const char* op_name(uint8_t kind) {
  switch (kind) {
    case 0:
      return "RDMA WRITE";
    case 1:
      return "RDMA READ";
    default:
      return "index RDMA WRITE";
  }
}

}  // namespace

using rdma_detail::errno_text;

uint64_t RdmaTransport::publish_index(uint64_t offset, uint32_t value) {
  if (offset <= region_.bytes && sizeof(uint32_t) <= region_.bytes - offset) {
    std::memcpy(staging_ + offset, &value, sizeof(value));  // what load_index reports
  }
  return enqueue(Op{OpKind::kIndex, offset, sizeof(uint32_t), value});
}

uint64_t RdmaTransport::enqueue(const Op& op) {
  const uint64_t ticket = ++posted_;
  if (!error_.ok()) return ticket;  // never completes; progress() reports the failure
  if (op.offset > region_.bytes || op.length > region_.bytes - op.offset) {
    fail(invalid_argument(describe(op, ticket) + " is outside the region of " +
                          std::to_string(region_.bytes) + " bytes"));
    return ticket;
  }
  waiting_.push_back(op);
  if (waiting() >= post_batch_) flush();
  return ticket;
}

void RdmaTransport::flush() {
  while (error_.ok() && waiting() != 0) {
    // Requests on the send queue and not known complete hold its slots (unsignalled ones until
    // a later signalled completion retires them).
    const uint64_t room = sq_depth_ - (submitted_ - completed_);
    if (room == 0) return;  // progress() retries once completions have made room
    const uint32_t n = static_cast<uint32_t>(
        std::min<uint64_t>({uint64_t{waiting()}, room, uint64_t{post_batch_}}));
    for (uint32_t i = 0; i < n; ++i) {
      const Op& op = waiting_[waiting_head_ + i];
      const uint64_t ticket = submitted_ + 1 + i;
      const uint32_t slot = static_cast<uint32_t>(ticket % sq_depth_);
      in_flight_[slot] = op;
      ibv_sge& sge = sges_[i];
      ibv_send_wr& wr = wrs_[i];
      wr = ibv_send_wr{};
      wr.wr_id = ticket;
      wr.next = i + 1 < n ? &wrs_[i + 1] : nullptr;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = region_.address + op.offset;
      wr.wr.rdma.rkey = region_.rkey;
      if (op.kind == OpKind::kIndex) {
        // The cell of this ticket is free: the ticket sq_depth_ before it has completed, or
        // there would be no room on the send queue.
        cells_[slot] = op.value;
        sge.addr = reinterpret_cast<uintptr_t>(&cells_[slot]);
        sge.length = sizeof(uint32_t);
        sge.lkey = cells_mr_->lkey;
        wr.opcode = IBV_WR_RDMA_WRITE;
      } else {
        sge.addr = reinterpret_cast<uintptr_t>(staging_ + op.offset);
        sge.length = op.length;
        sge.lkey = staging_mr_->lkey;
        wr.opcode = op.kind == OpKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      }
      // The last of every post list is signalled, so every ticket on the send queue has a
      // signalled completion at or after it and completed() never stalls short of it.
      if (++unsignalled_ >= signal_every_ || i + 1 == n) {
        wr.send_flags = IBV_SEND_SIGNALED;
        unsignalled_ = 0;
      }
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(id_->qp, wrs_.data(), &bad); rc != 0) {
      const uint64_t ticket = bad != nullptr ? bad->wr_id : submitted_ + 1;
      fail(Status(StatusCode::kIoError, "rdma transport to " + peer_ + ": ibv_post_send refused " +
                                            describe(in_flight_[ticket % sq_depth_], ticket) +
                                            ": " + errno_text(rc)));
      return;
    }
    submitted_ += n;
    waiting_head_ += n;
  }
  if (waiting_head_ == waiting_.size()) {
    waiting_.clear();
    waiting_head_ = 0;
  } else if (waiting_head_ > 4096 && waiting_head_ * 2 > waiting_.size()) {
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(waiting_head_));
    waiting_head_ = 0;
  }
}

Status RdmaTransport::progress() {
  if (!error_.ok()) return error_;
  ibv_wc wc[16];
  for (;;) {
    const int n = ibv_poll_cq(cq_, 16, wc);
    if (n < 0) {
      fail(Status(StatusCode::kIoError, "rdma transport to " + peer_ + ": ibv_poll_cq failed"));
      return error_;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        // Completions come in order: the first error is the request that failed; the flushed
        // requests behind it only repeat it.
        const uint64_t ticket = wc[i].wr_id;
        fail(Status(StatusCode::kUnavailable, "rdma transport to " + peer_ + ": " +
                                                  describe(in_flight_[ticket % sq_depth_], ticket) +
                                                  " failed: " + ibv_wc_status_str(wc[i].status) +
                                                  " (wc status " +
                                                  std::to_string(static_cast<int>(wc[i].status)) +
                                                  ", vendor error " + hex(wc[i].vendor_err) + ")"));
        return error_;
      }
      completed_ = std::max<uint64_t>(completed_, wc[i].wr_id);
    }
    if (n < 16) break;
  }
  flush();
  // A disconnect is seen here even while nothing is posted; a syscall, so not every call.
  if (++progress_calls_ % 64 == 0) poll_cm_events();
  return error_;
}

void RdmaTransport::poll_cm_events() {
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel_, &event) != 0) return;  // EAGAIN: none pending
    const rdma_cm_event_type type = event->event;
    const int status = event->status;
    rdma_ack_cm_event(event);
    if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
        type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
      connected_ = false;
      fail(Status(StatusCode::kUnavailable, "rdma transport to " + peer_ + ": " +
                                                rdma_event_str(type) + " (status " +
                                                std::to_string(status) + "): the peer is gone"));
      return;
    }
  }
}

void RdmaTransport::fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
}

std::string RdmaTransport::describe(const Op& op, uint64_t ticket) const {
  return std::string(op_name(static_cast<uint8_t>(op.kind))) + " of " + std::to_string(op.length) +
         " bytes at region offset " + std::to_string(op.offset) + " (remote address " +
         hex(region_.address + op.offset) + ", rkey " + hex(region_.rkey) + ", ticket " +
         std::to_string(ticket) + ")";
}

}  // namespace caracal::mqueue
