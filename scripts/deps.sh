#!/usr/bin/env bash
# Installs what Caracal needs to build and test on Debian 12 or Ubuntu 24.04. Idempotent: asks
# apt only for packages that are missing, so a second run touches nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev
  libboost-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  clang-format
  # End-to-end tests: unmodified clients, and a memcached for destinations to call.
  sockperf socat netcat-openbsd memcached libmemcached-tools curl
  # The rdma transport (rdma-core), and its tests and benchmark in a Soft-RoCE VM
  # (scripts/rxe-vm.sh: QEMU, a static busybox for the guest, rdma-core's tools and rxe
  # provider, perftest's ib_*_lat; zstd unpacks Ubuntu's kernel modules).
  libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils rdmacm-utils perftest iproute2
  qemu-system-x86 busybox-static zstd
  # The DPDK port (libdpdk-dev on Debian 12 and Ubuntu 24.04 alike; its PMDs, net_tap and
  # net_af_packet among them, come with it) and its end-to-end tests: a veth pair in a network
  # namespace, the kernel side's checksum offload turned off, frames made by python3.
  libdpdk-dev ethtool python3
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
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
