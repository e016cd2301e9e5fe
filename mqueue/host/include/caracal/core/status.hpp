// Errors of setup and control code: a code plus a message a user can act on. The data path
// reports through return values of its own (PollResult, nullptr from reserve) and never throws.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace caracal {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a caller or a peer handed us something malformed
  kUnavailable,      // a resource (memory, a peer, a device) is not there or went away
  kIoError,          // a system call failed
  kAborted,          // stopped on request
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

// "0x1f": a number in an error message where hex is how the reader knows it (magic words,
// feature bits, addresses, keys).
inline std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A value or the Status that says why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit, like expected<T>
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace caracal

// Returns the Status of `expr` from the calling function when it is not ok, as NCCL's NCCLCHECK
// does; setup code chains its steps with it:
//   CARACAL_RETURN_IF_ERROR(validate_geometry(geometry));
#define CARACAL_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                             \
    if (::caracal::Status caracal_status_ = (expr); !caracal_status_.ok()) return caracal_status_; \
  } while (false)
