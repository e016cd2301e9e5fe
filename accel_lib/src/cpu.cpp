#include "caracal/accel/cpu.hpp"

#include <pthread.h>
#include <sched.h>

#include <cstring>

namespace caracal::accel::detail {

Status pin_current_thread(uint32_t worker, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return invalid_argument("CPU worker " + std::to_string(worker) + ": CPU " +
                            std::to_string(cpu) + " is out of range");
  }
  CPU_SET(cpu, &set);
  if (int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); err != 0) {
    return Status(StatusCode::kInvalidArgument, "CPU worker " + std::to_string(worker) +
                                                    ": cannot pin to CPU " + std::to_string(cpu) +
                                                    ": " + std::strerror(err));
  }
  return Status::ok_status();
}

void write_error(Response& resp, const std::string& text) {
  const uint32_t n =
      static_cast<uint32_t>(text.size() < resp.capacity ? text.size() : resp.capacity);
  std::memcpy(resp.data, text.data(), n);
  resp.size = n;
  resp.flags = static_cast<uint16_t>(resp.flags | mqueue::kSlotError);
}

}  // namespace caracal::accel::detail
