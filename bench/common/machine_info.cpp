#include "machine_info.hpp"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>

namespace caracal::bench {
namespace {

std::string trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return "";
  const size_t end = s.find_last_not_of(" \t\n");
  return s.substr(begin, end - begin + 1);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

}  // namespace

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

MachineInfo collect_machine_info() {
  MachineInfo m;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = trim(line.substr(0, colon));
    if (name == "model name" && m.cpu_model.empty()) m.cpu_model = trim(line.substr(colon + 1));
    if (name == "flags" && !m.hypervisor) {
      std::istringstream flags(line.substr(colon + 1));
      std::string flag;
      while (flags >> flag) {
        if (flag == "hypervisor") m.hypervisor = true;
      }
    }
  }
  if (m.cpu_model.empty()) m.cpu_model = "unknown";
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  m.online_cpus = online > 0 ? static_cast<unsigned>(online) : 0;
  m.allowed_cpus = allowed_cpus();
  utsname u{};
  if (uname(&u) == 0) {
    m.kernel = std::string(u.sysname) + " " + u.release;
    m.hostname = u.nodename;
  }
  m.clocksource =
      read_first_line("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  if (m.clocksource.empty()) m.clocksource = "unknown";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &utc);
  m.date_utc = date;
  return m;
}

}  // namespace caracal::bench
