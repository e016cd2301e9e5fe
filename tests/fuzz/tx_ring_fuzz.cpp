// The server reading TX rings that a buggy or hostile agent fills (snic_server/src/mqueue_manager/
// datapath.cpp over mqueue/include/caracal/mqueue/remote_ring.hpp and ring.hpp): the real
// binding of an shm region (make_transport_binding<ShmTransport>), served round by round as an
// engine thread serves it, over a region in local memory.
//
// The first bytes choose the region's geometry (slot size, capacity, server and client queues,
// RX and TX lines); the rest is a script of steps, taken in turn:
//  - a client's request enters a server queue's inbox (three clients, each a reply slot of its
//    own, as TCP connections hold them);
//  - the agent answers through its real producer (mqueue::RingProducer), with the token of a
//    request of any queue and any client, an old token, or any 64-bit value, any flags, and
//    maybe a TX line; or it writes raw slot headers (lengths, slot counts, skip markers,
//    flags), raw TX tails and raw line words; or it reads its RX rings and publishes their
//    heads (or writes any head);
//  - a client closes, and its reply slot goes to a new client;
//  - the server serves one round; a round that reports a fault ends the script, as the engine
//    then drops the region.
//
// Besides sanitizer findings (the gaps between rings and past the control words are poisoned,
// so a read outside a ring is one):
//  - a reply reaches only the client whose request carried its token, once, and only when the
//    agent wrote that token into the TX ring of the queue the request went to;
//  - a client that closed gets nothing more, and its slot's next owner gets none of its
//    replies;
//  - a reply or a call-out is at most max_message_bytes long, and a call-out leaves only from
//    a client queue whose TX ring carried its token.
#include <sanitizer/asan_interface.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"
#include "caracal/mqueue/validate.hpp"
#include "fuzz_check.hpp"
#include "mqueue_manager/datapath.hpp"
#include "mqueue_manager/engine.hpp"
#include "mqueue_manager/engine_thread.hpp"
#include "mqueue_manager/region.hpp"
#include "reply_routing.hpp"

namespace {

namespace mq = caracal::mqueue;
namespace srv = caracal::server;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kClients = 3;
constexpr uint32_t kMaxSteps = 256;

struct Delivery {
  uint64_t token;
  srv::Reply reply;
};

class Client final : public srv::ReplySink {
 public:
  // A lane for each of the engine's threads (the fuzzer serves from thread 0).
  explicit Client(uint32_t engine_threads) : srv::ReplySink(engine_threads) {}
  void deliver(uint32_t, uint64_t token, const boost::asio::ip::udp::endpoint&,
               srv::ReplyView reply) override {
    got.push_back(Delivery{token, reply.owned()});
  }
  uint64_t base = 0;  // the token of sequence 0: slot and generation
  std::vector<Delivery> got;
};

class Events final : public srv::EngineEvents {
 public:
  const std::string& name() const override { return name_; }
  void on_room() override {}
  void on_region_unusable(const srv::AgentRegion&) override {}
  void on_answer(srv::Reply::Kind, Clock::duration) override {}
  void on_line_reply() override {}
  void on_unrouted(srv::DropReason) override {}
  void on_reply_timeouts(const srv::AgentRegion&, uint32_t, uint32_t) override {}
  void on_ejection_over(const srv::AgentRegion&, bool) override {}

 private:
  std::string name_ = "fuzz";
};

class Link final : public srv::ClientLink {
 public:
  void send(uint64_t token, std::string bytes) override {
    sent.emplace_back(token, std::move(bytes));
  }
  void close() override {}
  std::vector<std::pair<uint64_t, std::string>> sent;
};

// The agent's memory: exactly the region, with what the server must not touch poisoned.
class Memory {
 public:
  explicit Memory(const mq::RegionHeader& h) : h_(h), bytes_(new std::byte[h.region_bytes]()) {
    mq::initialize_region(bytes_.get(), h);
    // Past the control words in use, up to the rings.
    const uint64_t words =
        (mq::kControlPreambleLines + 4 * uint64_t{mq::queue_count(h)}) * mq::kControlLineBytes;
    poison(h.control_offset + words, h.rings_offset);
    // Between each ring's last slot and the next ring, and each block of lines' end and the next.
    const uint64_t ring_bytes = uint64_t{h.slot_bytes} * h.ring_capacity;
    for (uint32_t r = 0; r < 2 * mq::queue_count(h); ++r) {
      const uint64_t start = h.rings_offset + r * h.ring_stride;
      poison(start + ring_bytes, start + h.ring_stride);
    }
    if (mq::has_rx_lines(h) || mq::has_tx_lines(h)) {
      const uint64_t lines = uint64_t{h.ring_capacity} * mq::kLineBytes;
      for (uint32_t q = 0; q < mq::queue_count(h); ++q) {
        if (mq::has_rx_lines(h)) {
          poison(mq::rx_lines_offset(h, q) + lines,
                 mq::rx_lines_offset(h, q) + mq::line_block_bytes(h));
        }
        if (mq::has_tx_lines(h)) {
          poison(mq::tx_lines_offset(h, q) + lines,
                 mq::tx_lines_offset(h, q) + mq::line_block_bytes(h));
        }
      }
    }
  }
  ~Memory() { ASAN_UNPOISON_MEMORY_REGION(bytes_.get(), h_.region_bytes); }
  std::byte* at(uint64_t offset) const { return bytes_.get() + offset; }
  uint32_t* word(uint64_t offset) const { return reinterpret_cast<uint32_t*>(at(offset)); }

 private:
  void poison(uint64_t from, uint64_t to) {
    if (to > from) ASAN_POISON_MEMORY_REGION(at(from), to - from);
  }
  mq::RegionHeader h_;
  std::unique_ptr<std::byte[]> bytes_;
};

struct Request {
  const void* client;  // the Client that sent it
  uint32_t queue;
};

class Script {
 public:
  Script(const mq::RegionHeader& h, caracal::fuzz::Input& in)
      : h_(h), in_(in), memory_(h), replies_(64), engine_(replies_), thread_(engine_, 0) {
    auto transport = std::make_unique<mq::ShmTransport>(memory_.at(0), h.region_bytes);
    caracal::Result<mq::RemoteRegion<mq::ShmTransport>> attached =
        mq::RemoteRegion<mq::ShmTransport>::attach(transport.get());
    CARACAL_FUZZ_CHECK(attached.ok(), "attach: %s", attached.status().message().c_str());
    region_ = std::make_unique<srv::AgentRegion>(
        "fuzz", h.agent_epoch, &events_,
        srv::make_transport_binding(std::move(transport), std::move(attached).value(), nullptr));
    std::vector<std::shared_ptr<srv::ClientLink>> links;
    for (uint32_t c = 0; c < h.client_queue_count; ++c) {
      links_.push_back(std::make_shared<Link>());
      links.push_back(links_.back());
    }
    region_->set_links(std::move(links));
    for (uint32_t c = 0; c < kClients; ++c)
      clients_.push_back(connect());
    const mq::RingGeometry g = mq::ring_geometry(h);
    for (uint32_t q = 0; q < mq::queue_count(h); ++q) {
      queues_.push_back(q);
      tx_.emplace_back(memory_.at(mq::tx_ring_offset(h, q)), g,
                       memory_.word(mq::index_offset(h, mq::IndexArray::kTxTail, q)),
                       memory_.word(mq::index_offset(h, mq::IndexArray::kTxHead, q)),
                       mq::has_tx_lines(h) ? tx_lines(q) : nullptr);
      rx_.emplace_back(memory_.at(mq::rx_ring_offset(h, q)), g,
                       memory_.word(mq::index_offset(h, mq::IndexArray::kRxTail, q)),
                       memory_.word(mq::index_offset(h, mq::IndexArray::kRxHead, q)),
                       mq::has_rx_lines(h) ? reinterpret_cast<const uint64_t*>(
                                                 memory_.at(mq::rx_lines_offset(h, q)))
                                           : nullptr);
    }
    written_.resize(mq::queue_count(h));
  }

  ~Script() {
    region_.reset();
    for (const std::shared_ptr<Client>& c : clients_)
      replies_.release(c->base);
  }

  void run() {
    for (uint32_t step = 0; step < kMaxSteps && !in_.empty(); ++step) {
      switch (in_.u8() % 9) {
        case 0:
          submit();
          break;
        case 1:
          produce();
          break;
        case 2:
          raw_header();
          break;
        case 3:
          raw_tail();
          break;
        case 4:
          raw_line();
          break;
        case 5:
          take_rx();
          break;
        case 6:
          close_client();
          break;
        default:
          if (!serve()) return;
          break;
      }
    }
    serve();
  }

 private:
  uint64_t* tx_lines(uint32_t q) {
    return reinterpret_cast<uint64_t*>(memory_.at(mq::tx_lines_offset(h_, q)));
  }

  std::shared_ptr<Client> connect() {
    auto client = std::make_shared<Client>(engine_.threads());
    const std::optional<uint64_t> base = replies_.acquire(client);
    CARACAL_FUZZ_CHECK(base.has_value(), "no reply slot left");
    client->base = *base;
    return client;
  }

  uint32_t pick_queue(uint32_t count) { return in_.u8() % count; }

  // A token for the agent to write: a request's (of any queue or client), an old one, or any.
  uint64_t pick_token() {
    const uint8_t how = in_.u8();
    if (how < 160 && !requests_.empty()) {
      auto it = requests_.begin();
      std::advance(it, in_.u8() % requests_.size());
      return it->first;
    }
    if (how < 200) return clients_[in_.u8() % kClients]->base | (in_.u8() & 7);
    return in_.u64();
  }

  void submit() {
    const uint32_t c = in_.u8() % kClients;
    const uint32_t q = pick_queue(h_.server_queue_count);
    const uint32_t length = in_.u16() % (h_.max_message_bytes + 1);
    const uint64_t token = clients_[c]->base | (next_sequence_++ & srv::kTokenSequenceMask);
    srv::Message m{token, 0, std::string(length, 'q'), Clock::now()};
    if (region_->inbox(q).submit(m)) requests_[token] = Request{clients_[c].get(), q};
  }

  void produce() {
    const uint32_t q = pick_queue(mq::queue_count(h_));
    const uint32_t length = in_.u16() % (h_.max_message_bytes + 1);
    const uint64_t token = pick_token();
    const uint8_t flags = in_.u8();
    std::string payload(length, 'a');
    mq::RingProducer& p = tx_[q];
    if (!p.push(payload.data(), length, token, flags & mq::kKnownSlotFlags)) return;
    written_[q].insert(token);
    if ((flags & 0x80) != 0) p.write_line();
    if ((flags & 0x40) == 0) p.publish();
  }

  void raw_header() {
    const uint32_t q = pick_queue(mq::queue_count(h_));
    const uint32_t position = in_.u8() % h_.ring_capacity;
    mq::SlotHeader s{};
    s.length = (in_.u8() & 1) != 0 ? in_.u32() : in_.u16() % (h_.max_message_bytes + 64);
    s.flags = in_.u16();
    s.slots = in_.u16() % (h_.ring_capacity + 2);
    s.token = pick_token();
    std::memcpy(memory_.at(mq::tx_ring_offset(h_, q) + uint64_t{position} * h_.slot_bytes), &s,
                sizeof(s));
    written_[q].insert(s.token);
  }

  void raw_tail() {
    const uint32_t q = pick_queue(mq::queue_count(h_));
    const uint8_t how = in_.u8();
    const uint32_t tail = how < 128 ? tx_[q].tail() + static_cast<int8_t>(in_.u8()) : in_.u32();
    mq::store_release(memory_.word(mq::index_offset(h_, mq::IndexArray::kTxTail, q)), tail);
  }

  void raw_line() {
    if (!mq::has_tx_lines(h_)) return;
    const uint32_t q = pick_queue(mq::queue_count(h_));
    const uint32_t line = in_.u8() % h_.ring_capacity;
    const uint8_t how = in_.u8();
    const uint32_t flag =
        how < 192 ? mq::line_flag(tx_[q].entries() + static_cast<int8_t>(in_.u8())) : in_.u32();
    mq::SlotHeader s{};
    s.length = in_.u8() % (mq::kLineInlineBytes + 16);
    s.flags = in_.u8() & 0x0f;
    s.slots = in_.u8() % 4;
    s.token = pick_token();
    uint32_t data[mq::kLineWords] = {};
    std::memcpy(data, &s, sizeof(s));
    const uint32_t words = in_.u8() % (mq::kLineWords + 1);  // a line still landing
    uint64_t* w = tx_lines(q) + uint64_t{line} * mq::kLineWords;
    for (uint32_t k = 0; k < words; ++k)
      mq::store_relaxed(w + k, mq::line_word(flag, data[k]));
    written_[q].insert(s.token);
  }

  // The agent reads its RX rings (as a handler polls them) and publishes the heads, or writes
  // any head.
  void take_rx() {
    const uint32_t q = pick_queue(mq::queue_count(h_));
    if ((in_.u8() & 1) != 0) {
      mq::store_release(memory_.word(mq::index_offset(h_, mq::IndexArray::kRxHead, q)), in_.u32());
      return;
    }
    mq::RingConsumer& c = rx_[q];
    mq::Entry e;
    while (c.next(e) == mq::PollResult::kReady) {
    }
    c.release();
    c.publish();
  }

  void close_client() {
    const uint32_t c = in_.u8() % kClients;
    replies_.release(clients_[c]->base);
    closed_.push_back(clients_[c]);
    clients_[c] = connect();
  }

  // One round; false when the region reported a fault (the engine would drop it).
  bool serve() {
    std::string fault;
    region_->binding().serve(thread_, *region_, queues_, fault);
    check_deliveries();
    return fault.empty();
  }

  void check_deliveries() {
    for (const std::shared_ptr<Client>& c : clients_)
      check_client(*c, false);
    for (const std::shared_ptr<Client>& c : closed_)
      check_client(*c, true);
    for (uint32_t c = 0; c < links_.size(); ++c) {
      const uint32_t q = h_.server_queue_count + c;
      for (const auto& [token, bytes] : links_[c]->sent) {
        CARACAL_FUZZ_CHECK(written_[q].contains(token),
                           "a call-out with token %llx that client queue %u's TX ring never held",
                           static_cast<unsigned long long>(token), q);
        CARACAL_FUZZ_CHECK(bytes.size() <= h_.max_message_bytes, "a call-out of %zu bytes",
                           bytes.size());
      }
      links_[c]->sent.clear();
    }
  }

  void check_client(Client& client, bool closed) {
    for (const Delivery& d : client.got) {
      const auto it = requests_.find(d.token);
      CARACAL_FUZZ_CHECK(it != requests_.end(), "a reply with token %llx nobody asked for",
                         static_cast<unsigned long long>(d.token));
      const Request r = it->second;
      CARACAL_FUZZ_CHECK(
          !closed && r.client == &client, "a reply (token %llx) went to another client%s",
          static_cast<unsigned long long>(d.token), closed ? ", one that closed" : "");
      CARACAL_FUZZ_CHECK(written_[r.queue].contains(d.token),
                         "a reply (token %llx) that queue %u's TX ring never held",
                         static_cast<unsigned long long>(d.token), r.queue);
      CARACAL_FUZZ_CHECK(d.reply.bytes.size() <= h_.max_message_bytes, "a reply of %zu bytes",
                         d.reply.bytes.size());
      requests_.erase(it);  // answered: a second reply is one nobody asked for
    }
    client.got.clear();
  }

  const mq::RegionHeader h_;
  caracal::fuzz::Input& in_;
  Memory memory_;
  Events events_;
  srv::ReplyTable replies_;
  srv::Engine engine_;
  srv::EngineThread thread_;
  std::unique_ptr<srv::AgentRegion> region_;
  std::vector<std::shared_ptr<Link>> links_;
  std::vector<std::shared_ptr<Client>> clients_;
  std::vector<std::shared_ptr<Client>> closed_;
  std::vector<uint32_t> queues_;
  std::vector<mq::RingProducer> tx_;         // the agent's producers of the TX rings
  std::vector<mq::RingConsumer> rx_;         // the agent's consumers of the RX rings
  std::map<uint64_t, Request> requests_;     // submitted and not answered
  std::vector<std::set<uint64_t>> written_;  // per queue: tokens the agent wrote into its TX
  uint32_t next_sequence_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  caracal::fuzz::Input in(data, size);
  const uint8_t shape = in.u8();
  const uint8_t counts = in.u8();
  mq::RegionGeometry g;
  g.slot_bytes = 64u << (shape & 3);           // 64 to 512
  g.ring_capacity = 2u << ((shape >> 2) & 3);  // 2 to 16
  g.rx_lines = (shape & 0x10) != 0;
  g.tx_lines = (shape & 0x20) != 0;
  g.server_queue_count = 1 + (counts & 1);
  g.client_queue_count = (counts >> 1) & 1;
  const uint32_t slots = g.ring_capacity / 2;
  const uint32_t limit = slots * g.slot_bytes - mq::kSlotHeaderBytes;
  g.max_message_bytes = 1 + in.u16() % limit;
  if (!mq::validate_geometry(g).ok()) return 0;
  const mq::RegionHeader h = mq::compute_layout(g, 1);
  Script script(h, in);
  script.run();
  return 0;
}
