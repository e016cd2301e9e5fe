#include "workload.hpp"

#include <charconv>
#include <cstring>

#include "matvec_reference.hpp"

namespace caracal::bench {

std::vector<SizeWeight> parse_sizes(const std::string& text, std::string& error) {
  std::vector<SizeWeight> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    const size_t colon = item.find(':');
    SizeWeight sw;
    const std::string bytes = item.substr(0, colon);
    const auto [p, ec] = std::from_chars(bytes.data(), bytes.data() + bytes.size(), sw.bytes);
    if (bytes.empty() || ec != std::errc() || p != bytes.data() + bytes.size() || sw.bytes == 0) {
      error = "size '" + bytes + "' in '" + text + "' is not a positive number of bytes";
      return {};
    }
    if (colon != std::string::npos) {
      const std::string w = item.substr(colon + 1);
      char* end = nullptr;
      sw.weight = std::strtod(w.c_str(), &end);
      if (w.empty() || end != w.c_str() + w.size() || !(sw.weight > 0)) {
        error =
            "weight '" + w + "' of size " + bytes + " in '" + text + "' is not a positive number";
        return {};
      }
    }
    out.push_back(sw);
    pos = comma + 1;
  }
  return out;
}

std::string check_sizes(HandlerKind kind, const std::vector<SizeWeight>& sizes) {
  if (sizes.empty()) return "no message size given";
  for (const SizeWeight& s : sizes) {
    if (kind == HandlerKind::kMatVec && s.bytes % examples::MatVecSpec::kVectorBytes != 0) {
      return "matvec requests are whole 64-byte vectors; size " + std::to_string(s.bytes) +
             " is not a multiple of 64";
    }
    if (kind == HandlerKind::kFace && s.bytes != examples::face::kRequestBytes) {
      return "face requests are " + std::to_string(examples::face::kRequestBytes) +
             " bytes (a person id and a 64x64 image); size " + std::to_string(s.bytes) + " is not";
    }
    if (kind == HandlerKind::kEcho && s.bytes < 10) {
      return "echo requests carry a 10-byte id; size " + std::to_string(s.bytes) +
             " is smaller than 10";
    }
  }
  return {};
}

Workload::Workload(HandlerKind kind, std::vector<SizeWeight> sizes, uint64_t seed,
                   uint32_t matvec_rounds, FaceSet faces)
    : kind_(kind), sizes_(std::move(sizes)), seed_(seed) {
  if (kind_ == HandlerKind::kFace) pool_per_size_ = kFacePool;
  // face: the references of the persons the pool claims, made once.
  std::vector<std::vector<uint8_t>> references;
  std::vector<double> weights;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const SizeWeight& s : sizes_) {
    weights.push_back(s.weight);
    max_bytes_ = std::max(max_bytes_, s.bytes);
    std::vector<Entry> entries(pool_per_size_);
    for (uint32_t j = 0; j < pool_per_size_; ++j) {
      Entry& e = entries[j];
      e.request.resize(s.bytes);
      if (kind_ == HandlerKind::kFace) {
        namespace face = examples::face;
        // Persons spread over the set; three in four requests are a later capture of the person
        // claimed, the fourth another person's face.
        const uint32_t person =
            static_cast<uint32_t>((uint64_t{j} * 7919 + rng() % 7) % faces.persons);
        const uint32_t face_of = j % 4 == 3 ? (person + 1 + j) % faces.persons : person;
        const face::Image image = face::synthetic_face(faces.seed, face_of, 1 + j % 5);
        const std::vector<uint8_t> request = face::encode_request(person, image);
        std::memcpy(e.request.data(), request.data(), request.size());
        const std::vector<uint8_t> reference =
            face::reference_histograms(face::synthetic_face(faces.seed, person, 0).data());
        e.face = face::reference_answer(person, image.data(), &reference);
      } else if (kind_ == HandlerKind::kMatVec) {
        for (uint32_t i = 0; i < s.bytes / sizeof(float); ++i) {
          const float f = value(rng);
          std::memcpy(e.request.data() + i * sizeof(float), &f, sizeof(float));
        }
        e.expected = examples::matvec_reference(e.request.data(), s.bytes, matvec_rounds);
      } else {
        for (std::byte& b : e.request)
          b = static_cast<std::byte>(rng() & 0xFF);
      }
    }
    pool_.push_back(std::move(entries));
  }
  pick_ = std::discrete_distribution<uint32_t>(weights.begin(), weights.end());
}

Workload::Slot Workload::make_slot(uint32_t slot_id) const {
  Slot slot;
  slot.slot_id = slot_id;
  slot.rng.seed(seed_ ^ (0x9E3779B97F4A7C15ull * (slot_id + 1)));
  slot.pick = pick_;
  slot.bytes.reserve(max_bytes_);
  return slot;
}

void Workload::next_request(Slot& slot) const {
  if (slot.seq != 0) {
    slot.prev_entry = slot.entry;
    slot.has_prev = true;
  }
  ++slot.seq;
  const uint32_t size_index = sizes_.size() == 1 ? 0 : slot.pick(slot.rng);
  slot.entry = size_index * pool_per_size_ + slot.seq % pool_per_size_;
  const Entry& e = entry_of(slot.entry);
  slot.bytes.assign(e.request.begin(), e.request.end());
  if (kind_ == HandlerKind::kEcho) {
    const uint64_t id = (uint64_t{slot.slot_id} << 32) | slot.seq;
    std::memcpy(slot.bytes.data(), &id, sizeof id);
    slot.bytes[8] = std::byte{0};  // sockperf flags: not a sockperf message
    slot.bytes[9] = std::byte{0};
  }
}

const char* wrong_kind_name(WrongKind kind) {
  switch (kind) {
    case WrongKind::kCorrupt:
      return "corrupt";
    case WrongKind::kOtherClient:
      return "another client's reply";
    case WrongKind::kOtherSlot:
      return "another slot's reply";
    case WrongKind::kOtherRequest:
      return "another request's reply";
  }
  return "?";
}

Verdict Workload::verify(const Slot& slot, const std::byte* reply, uint32_t size, std::string& why,
                         WrongKind* kind) const {
  WrongKind wrong = WrongKind::kCorrupt;
  if (kind_ == HandlerKind::kEcho) {
    if (size == slot.bytes.size() && std::memcmp(reply, slot.bytes.data(), size) == 0) {
      return Verdict::kOk;
    }
    if (size >= 8) {
      uint64_t id;
      std::memcpy(&id, reply, sizeof id);
      const auto id_slot = static_cast<uint32_t>(id >> 32);
      const auto id_seq = static_cast<uint32_t>(id);
      if (id_slot == slot.slot_id && id_seq < slot.seq) return Verdict::kLate;
      if (id_slot >> kSlotClientShift != slot.slot_id >> kSlotClientShift) {
        wrong = WrongKind::kOtherClient;
      } else if (id_slot != slot.slot_id) {
        wrong = WrongKind::kOtherSlot;
      } else if (id_seq != slot.seq) {
        wrong = WrongKind::kOtherRequest;
      }
      if (wrong != WrongKind::kCorrupt) {
        why = std::string("echo reply carries the id of ") + wrong_kind_name(wrong) + " (slot " +
              std::to_string(id_slot) + ", request " + std::to_string(id_seq) + "; expected slot " +
              std::to_string(slot.slot_id) + ", request " + std::to_string(slot.seq) + ")";
        if (kind != nullptr) *kind = wrong;
        return Verdict::kWrong;
      }
    }
    if (kind != nullptr) *kind = wrong;
    if (size != slot.bytes.size()) {
      why = "echo reply is " + std::to_string(size) + " bytes, the request " +
            std::to_string(slot.bytes.size());
      return Verdict::kWrong;
    }
    for (uint32_t i = 0; i < size; ++i) {
      if (reply[i] != slot.bytes[i]) {
        why = "echo reply differs from the request at byte " + std::to_string(i) + " of " +
              std::to_string(size);
        break;
      }
    }
    return Verdict::kWrong;
  }
  if (kind != nullptr) *kind = wrong;
  if (kind_ == HandlerKind::kFace) {
    why = examples::face::check_reply(reply, size, entry_of(slot.entry).face);
    if (why.empty()) return Verdict::kOk;
    if (slot.has_prev &&
        examples::face::check_reply(reply, size, entry_of(slot.prev_entry).face).empty()) {
      why.clear();
      return Verdict::kLate;
    }
    why = "face reply: " + why;
    return Verdict::kWrong;
  }
  why = examples::matvec_check(reply, size, entry_of(slot.entry).expected);
  if (why.empty()) return Verdict::kOk;
  if (slot.has_prev &&
      examples::matvec_check(reply, size, entry_of(slot.prev_entry).expected).empty()) {
    why.clear();
    return Verdict::kLate;
  }
  why = "matvec reply: " + why;
  return Verdict::kWrong;
}

}  // namespace caracal::bench
