// The handlers a baseline server can serve, by name: the same types Caracal's agents run
// (examples/echo, examples/matvec), so the comparison is of the serving, not of the handler.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "echo.hpp"
#include "matvec.hpp"

namespace caracal::bench::baseline {

// The handlers' settings from the command line (--matvec-rounds).
struct HandlerParams {
  uint32_t matvec_rounds = 1;  // MatVec::rounds
};

// A handler of type H with the settings that apply to it.
template <class H>
H make_handler(const HandlerParams& p) {
  if constexpr (std::is_same_v<H, examples::MatVec>) {
    return examples::MatVec{p.matvec_rounds};
  } else {
    return H{};
  }
}

// Calls fn.template operator()<Handler>() for the handler named `name`; false for an unknown one.
template <class Fn>
bool with_handler(const std::string& name, Fn&& fn) {
  if (name == "echo") {
    fn.template operator()<examples::Echo>();
    return true;
  }
  if (name == "matvec") {
    fn.template operator()<examples::MatVec>();
    return true;
  }
  return false;
}

}  // namespace caracal::bench::baseline
