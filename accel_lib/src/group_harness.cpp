#include "caracal/accel/group_harness.hpp"

#include <algorithm>

namespace caracal::accel::detail {

const char* group_op_name(GroupOp op) {
  switch (op) {
    case GroupOp::kSync:
      return "sync";
    case GroupOp::kBroadcast:
      return "broadcast";
    case GroupOp::kSum:
      return "sum";
    case GroupOp::kMax:
      return "max";
    case GroupOp::kMin:
      return "min";
    case GroupOp::kAll:
      return "all";
    case GroupOp::kAny:
      return "any";
    case GroupOp::kExclusiveSum:
      return "exclusive_sum";
  }
  return "?";
}

void host_collective(void* group, uint32_t rank, GroupOp op, const void* value, void* result,
                     uint32_t bytes,
                     void (*combine)(GroupOp, const void*, uint32_t, uint32_t, uint32_t, void*),
                     uint32_t from) {
  static_cast<HostGroup*>(group)->collective(rank, op, value, result, bytes, combine, from);
}

HostGroup::HostGroup(uint32_t size)
    : size_(size), barrier_(size), slots_(size), values_(size_t{size} * 8) {}

void HostGroup::collective(
    uint32_t rank, GroupOp op, const void* value, void* result, uint32_t bytes,
    void (*combine)(GroupOp, const void*, uint32_t, uint32_t, uint32_t, void*), uint32_t from) {
  Slot& mine = slots_[rank];
  std::memcpy(values_.data() + size_t{rank} * bytes, value, bytes);
  mine.op = op;
  mine.from = from;
  mine.bytes = bytes;
  ++mine.calls;
  // Every rank's writes above happen before any rank returns from the barrier (its phase
  // completes only once all have arrived or left): the slots are whole when read below.
  barrier_.arrive_and_wait();
  for (uint32_t i = 0; i < size_; ++i) {
    const Slot& other = slots_[i];
    if (i == rank) continue;
    // Built only for a break of the contract: a collective that keeps it allocates nothing.
    const auto here = [&] {
      return "request " + std::to_string(mine.request) + ", group call " +
             std::to_string(mine.calls) + " of rank " + std::to_string(rank) + " (" +
             group_op_name(op) + ")";
    };
    if (other.left) {
      note_broken(here() + ": rank " + std::to_string(i) +
                  " had returned from the handler: every rank makes the same group calls");
    } else if (other.op != op || other.calls != mine.calls) {
      note_broken(here() + " met rank " + std::to_string(i) + "'s group call " +
                  std::to_string(other.calls) + " (" + group_op_name(other.op) +
                  "): every rank makes the same group calls in the same order");
    } else if (other.bytes != bytes || other.from != from) {
      note_broken(here() + ": rank " + std::to_string(i) + " gave a " +
                  std::to_string(other.bytes) + "-byte value from rank " +
                  std::to_string(other.from) + ", this one a " + std::to_string(bytes) +
                  "-byte value from rank " + std::to_string(from));
    }
  }
  if (op == GroupOp::kBroadcast && from >= size_) {
    note_broken("request " + std::to_string(mine.request) + ": a broadcast from rank " +
                std::to_string(from) + " in a group of " + std::to_string(size_));
  } else if (combine != nullptr) {
    combine(op, values_.data(), size_, rank, from, result);
  }
  // Every rank has read the values before any writes its next one.
  barrier_.arrive_and_wait();
}

void HostGroup::leave(uint32_t rank) {
  // Seen by the ranks still calling after the phase this arrival completes.
  slots_[rank].left = true;
  barrier_.arrive_and_drop();
}

std::string HostGroup::broken() const {
  std::lock_guard lock(m_);
  return broken_;
}

void HostGroup::note_broken(std::string what) {
  std::lock_guard lock(m_);
  if (broken_.empty()) broken_ = std::move(what);
}

HarnessReply harness_reply(const Response& leader) {
  HarnessReply r;
  r.flags = leader.flags;
  if (leader.size > leader.capacity) {
    r.bytes = "handler wrote " + std::to_string(leader.size) + " bytes into a " +
              std::to_string(leader.capacity) + "-byte response";
    r.flags = static_cast<uint16_t>(r.flags | mqueue::kSlotError);
    return r;
  }
  r.bytes.assign(reinterpret_cast<const char*>(leader.data), leader.size);
  return r;
}

}  // namespace caracal::accel::detail
