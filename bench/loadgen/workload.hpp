// What caracal_loadgen sends and how it checks each reply, for the two handlers the
// benchmarks serve: echo (examples/echo: the reply is the request) and matvec
// (examples/matvec: the reply is the network's output, checked against the CPU reference).
//
// Requests come from a pool made at start (kPoolPerSize distinct requests per size), so checking
// a matvec reply costs a comparison, not a reference computation. Every request a slot sends is
// one of them:
//  - echo: the pool entry with the request's id (slot id << 32 | the slot's sequence number) in
//    its first 8 bytes and zeros in bytes 8-9, so the echo handler never takes it for a sockperf
//    message; the reply must be the same bytes. A reply carrying an earlier id of the same slot
//    is late (a UDP reply after its timeout), not wrong. A wrong reply is told apart by its id
//    (WrongKind): another client's (the slot id's top 8 bits, loadgen's --client-id), another
//    slot's of this client, another request of this slot, or the right id with other bytes.
//  - matvec: pool entry (sequence % kPoolPerSize); the reply must match that entry's reference
//    output (with the handler's rounds) to the tolerance of matvec_close. A reply that matches the
//    entry of the slot's previous request instead is late.
//  - face (examples/face_verify): kFacePool requests over the persons of the synthetic face set
//    that caracal_face_loader stored (FaceSet: its seed and size), each a later capture of the
//    person claimed or of another person; the reply must be the CPU reference's verdict with
//    exactly its distance (face_reference.hpp: check_reply). Every request is 4104 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "face_reference.hpp"

namespace caracal::bench {

enum class HandlerKind { kEcho, kMatVec, kFace };

// The face set the references were loaded from (caracal_face_loader --seed, --persons).
struct FaceSet {
  uint64_t seed = 0x5eedface;
  uint32_t persons = 1000;
};

// One size of a size distribution and its weight.
struct SizeWeight {
  uint32_t bytes = 0;
  double weight = 1;
};

// Parses "64" or "64:0.5,1024:0.3,16384:0.2" (weights need not sum to 1). Returns what is
// wrong in `error` and an empty list when the text is not such a list.
std::vector<SizeWeight> parse_sizes(const std::string& text, std::string& error);

// Empty when every size suits the handler (matvec: a nonzero multiple of 64; echo: at least
// 10 bytes, room for the id and the two zero bytes; face: 4104), else what is wrong.
std::string check_sizes(HandlerKind kind, const std::vector<SizeWeight>& sizes);

enum class Verdict { kOk, kLate, kWrong };

// What a wrong echo reply is, by the id it carries (matvec and face replies carry none: always
// kCorrupt).
enum class WrongKind {
  kCorrupt,       // the request's own id (or none readable), other bytes or another size
  kOtherClient,   // the id of another client's slot (a reply sent to the wrong client)
  kOtherSlot,     // the id of another slot of this client
  kOtherRequest,  // this slot's id with a sequence number that is not its current or earlier
};
const char* wrong_kind_name(WrongKind kind);

// A slot id: the client's id (loadgen's --client-id) in the top 8 bits, its place in the rest.
constexpr uint32_t kSlotClientShift = 24;
constexpr uint32_t kMaxSlotsPerClient = uint32_t{1} << kSlotClientShift;

class Workload {
 public:
  static constexpr uint32_t kPoolPerSize = 16;
  static constexpr uint32_t kFacePool = 256;

  // matvec_rounds: the rounds the matvec handler serves with (matvec.hpp); replies are checked
  // against the reference with as many. faces: the face set the face handler's references were
  // loaded from.
  Workload(HandlerKind kind, std::vector<SizeWeight> sizes, uint64_t seed,
           uint32_t matvec_rounds = 1, FaceSet faces = {});

  HandlerKind kind() const { return kind_; }
  uint32_t max_bytes() const { return max_bytes_; }

  // What one slot (one outstanding request's place) keeps about its request in flight.
  struct Slot {
    uint32_t slot_id = 0;
    uint32_t seq = 0;         // the slot's requests so far; the current one's number
    uint32_t entry = 0;       // pool entry of the current request
    uint32_t prev_entry = 0;  // and of the one before it
    bool has_prev = false;
    std::vector<std::byte> bytes;  // the request as sent
    std::mt19937_64 rng;
    std::discrete_distribution<uint32_t> pick;  // the size distribution, the slot's copy
  };

  Slot make_slot(uint32_t slot_id) const;
  // Prepares the slot's next request in slot.bytes.
  void next_request(Slot& slot) const;
  // Checks a reply against the slot's current request; `why` says what is wrong for kWrong, and
  // `kind` (when given) which kind of wrong it is.
  Verdict verify(const Slot& slot, const std::byte* reply, uint32_t size, std::string& why,
                 WrongKind* kind = nullptr) const;

 private:
  struct Entry {
    std::vector<std::byte> request;
    std::vector<float> expected;    // matvec only
    examples::face::Expected face;  // face only
  };
  HandlerKind kind_;
  std::vector<SizeWeight> sizes_;
  std::discrete_distribution<uint32_t> pick_;
  std::vector<std::vector<Entry>> pool_;  // [size index][entry]
  uint32_t max_bytes_ = 0;
  uint64_t seed_;
  uint32_t pool_per_size_ = kPoolPerSize;

  const Entry& entry_of(uint32_t packed) const {
    return pool_[packed / pool_per_size_][packed % pool_per_size_];
  }
};

}  // namespace caracal::bench
