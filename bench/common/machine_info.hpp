// What a benchmark report says about the machine it ran on.
#pragma once

#include <string>
#include <vector>

namespace caracal::bench {

struct MachineInfo {
  std::string cpu_model;  // first "model name" of /proc/cpuinfo
  unsigned online_cpus = 0;
  std::vector<int> allowed_cpus;  // this process's affinity mask
  bool hypervisor = false;        // the CPU reports the "hypervisor" flag: a virtual machine
  std::string kernel;             // uname -sr
  std::string hostname;
  std::string clocksource;  // what steady_clock reads underneath
  std::string date_utc;     // ISO 8601, when the run started
};

MachineInfo collect_machine_info();

// The CPUs this process may run on, ascending.
std::vector<int> allowed_cpus();

}  // namespace caracal::bench
