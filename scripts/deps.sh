#!/usr/bin/env bash
# Installs what Caracal needs on Debian 12 or Ubuntu 24.04, by what it is for:
#
#   scripts/deps.sh run    # build snic_server and the agents, and the clients the README's
#                          # "try it" lines use (scripts/run.sh)
#   scripts/deps.sh test   # the above, and every tool the tests use (scripts/test.sh)
#   scripts/deps.sh --list run|test   # print the packages of a set, install nothing
#
# Idempotent: asks apt only for the packages that are missing, so a second run touches nothing.
# The tests start their own memcached on a loopback port: when this script is what installed
# memcached, it stops and disables the system service the package starts.
set -euo pipefail

run_packages=(
  # A compiler and the server's and agents' libraries.
  build-essential cmake ninja-build pkg-config
  libboost-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  # Readiness notification for the systemd units (sd_notify).
  libsystemd-dev
  # The clients of the README's "try it" lines (and of run.sh's own check).
  netcat-openbsd socat sockperf curl
)
test_packages=(
  # scripts/lint.sh's gates: the sources' format and the shell scripts' findings.
  git clang-format clang-tidy shellcheck
  # scripts/package.sh makes the manual pages with help2man and checks the packages with
  # lintian; package-install-check.sh installs them into a fresh root that mmdebstrap makes.
  lintian mmdebstrap help2man
  libgtest-dev libgmock-dev
  # End-to-end tests: unmodified clients, and a memcached for destinations to call.
  memcached libmemcached-tools python3
  # The rdma transport (rdma-core), and its tests and benchmark in a Soft-RoCE VM
  # (tests/vm/rxe-vm.sh: QEMU, a static busybox for the guest, rdma-core's tools and rxe
  # provider, perftest's ib_*_lat; zstd unpacks Ubuntu's kernel modules).
  libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils rdmacm-utils perftest iproute2
  qemu-system-x86 busybox-static zstd
  # The BlueField topology (tests/bluefield): an arm64 VM (qemu-system-arm) whose root is made
  # with mmdebstrap under qemu-user (binfmt), reached over ssh. mmdebstrap only recommends
  # arch-test, and refuses a foreign architecture without it.
  qemu-system-arm qemu-user-static binfmt-support openssh-client arch-test
  # The DPDK port (libdpdk-dev on Debian 12 and Ubuntu 24.04 alike; its PMDs, net_tap and
  # net_af_packet among them, come with it) and its end-to-end tests: a veth pair in a network
  # namespace, the kernel side's checksum offload turned off, frames made by python3.
  libdpdk-dev ethtool
  # The fuzz targets (scripts/fuzz.sh): clang, its libFuzzer and sanitizer runtimes (Debian 12
  # and Ubuntu 24.04 both name the default version's libclang-rt-dev), and llvm for
  # llvm-symbolizer, which puts file:line into a finding's stack.
  clang libclang-rt-dev llvm
)
# perf, for the profiles of bench/compare (and their check in the tests): Debian packages it as
# linux-perf; Ubuntu's perf belongs to its running kernel's linux-tools, which a container may
# not have, and the tests do without it.
if grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
  test_packages+=(linux-perf)
fi

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
list=0
if [ "${1:-}" = "--list" ]; then
  list=1
  shift
fi
case "${1:-}" in
  run) packages=("${run_packages[@]}") ;;
  test) packages=("${run_packages[@]}" "${test_packages[@]}") ;;
  -h | --help) usage; exit 0 ;;
  *) echo "deps.sh: say what for: 'run' or 'test' (got '${1:-}')" >&2; usage >&2; exit 2 ;;
esac
if [ $list = 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "deps: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"

# memcached's package enables and starts a system service on port 11211; the tests start their
# own. Stop and disable it only when this run installed it, so a memcached set up by hand stays.
if printf '%s\n' "${missing[@]}" | grep -qx memcached && command -v systemctl >/dev/null; then
  $sudo systemctl disable --now memcached.service >/dev/null 2>&1 || true
  echo "deps: memcached installed for the tests; its system service is stopped and disabled"
fi
