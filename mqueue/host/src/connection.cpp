#include "caracal/control/connection.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <utility>

namespace caracal::control {

namespace asio = boost::asio;
using boost::system::error_code;

Connection::Connection(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {}

void Connection::start(Callbacks callbacks) {
  callbacks_ = std::make_shared<const Callbacks>(std::move(callbacks));
  error_code ec;
  const auto peer = socket_.remote_endpoint(ec);
  if (!ec) origin_ = "control " + peer.address().to_string() + ":" + std::to_string(peer.port());
  read_prefix();
}

void Connection::read_prefix() {
  asio::async_read(socket_, asio::buffer(prefix_),
                   [self = shared_from_this()](const error_code& ec, size_t) {
                     if (self->closed_) return;
                     if (ec == asio::error::eof) return self->end(Ending::kClosed, "");
                     if (ec) return self->end(Ending::kBroken, "read failed: " + ec.message());
                     Result<uint32_t> n = frame_length(self->prefix_.data());
                     if (!n.ok()) {
                       return self->end(Ending::kMalformed, n.status().message());
                     }
                     self->payload_.resize(*n);
                     self->read_payload();
                   });
}

void Connection::read_payload() {
  asio::async_read(socket_, asio::buffer(payload_),
                   [self = shared_from_this()](const error_code& ec, size_t) {
                     if (self->closed_) return;
                     // A frame cut short is a failure, not a clean close.
                     if (ec) return self->end(Ending::kBroken, "read failed: " + ec.message());
                     Result<Message> m = decode(self->payload_, self->origin_);
                     if (!m.ok()) return self->end(Ending::kMalformed, m.status().message());
                     // A local reference: on_message may close() the connection, which drops
                     // the callbacks while this one runs.
                     const std::shared_ptr<const Callbacks> callbacks = self->callbacks_;
                     if (callbacks->on_message(std::move(*m)) && !self->closed_) {
                       self->read_prefix();
                     }
                   });
}

void Connection::send(const Message& message) {
  if (closed_) return;
  outbox_.push_back(encode(message));
  if (!writing_) write_next();
}

void Connection::write_next() {
  writing_ = true;
  asio::async_write(socket_, asio::buffer(outbox_.front()),
                    [self = shared_from_this()](const error_code& ec, size_t) {
                      self->writing_ = false;
                      if (self->closed_) return;
                      if (ec) {
                        self->end(Ending::kBroken, "write failed: " + ec.message());
                        if (self->close_after_sending_) self->close();
                        return;
                      }
                      self->outbox_.pop_front();
                      if (!self->outbox_.empty()) return self->write_next();
                      if (self->close_after_sending_) self->close();
                    });
}

void Connection::close_after_sending() {
  close_after_sending_ = true;
  if (!writing_) close();
}

void Connection::end(Ending ending, const std::string& why) {
  if (ended_) return;
  ended_ = true;
  const std::shared_ptr<const Callbacks> callbacks = callbacks_;  // on_end may close()
  if (callbacks && callbacks->on_end) callbacks->on_end(ending, why);
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  // The outbox stays: a write in flight reads its front until its handler runs (aborted).
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // The callbacks may hold the owner, which holds this connection: drop them now to break the
  // cycle (a callback running meanwhile holds its own reference). Not later through a posted
  // handler: an io_context stopped before it ran would destroy it unrun, and leak the pair.
  callbacks_.reset();
}

}  // namespace caracal::control
