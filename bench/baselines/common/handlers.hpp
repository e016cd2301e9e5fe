// The handlers a baseline server can serve, by name: the same types Caracal's agents run
// (examples/echo, examples/matvec), so the comparison is of the serving, not of the handler.
#pragma once

#include <string>

#include "echo.hpp"
#include "matvec.hpp"

namespace caracal::bench::baseline {

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
