#!/usr/bin/env bash
# The arm64 build (BlueField's Arm cores) from an amd64 Debian 12 host: sets up the cross
# toolchain and arm64 libraries (apt, idempotent), builds the server, the agents and the unit
# suites with DPDK and rdma on and CUDA off, runs the unit suites under qemu-user, and makes the
# arm64 packages.
#
#   scripts/cross-arm64.sh              # all of it, in build-arm64/
#   scripts/cross-arm64.sh --no-tests   # build and package only
#
# Debian only: Ubuntu serves arm64 from another archive (ports.ubuntu.com), which this script
# does not configure; it says so and exits 77.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=1
[ "${1:-}" = "--no-tests" ] && tests=0
if ! grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
  echo "cross-arm64.sh: needs Debian's multiarch archive (this is $(. /etc/os-release; echo "$PRETTY_NAME"))"
  exit 77
fi
BUILD=${BUILD:-build-arm64}
export CARACAL_ARM64_SYSROOT=${CARACAL_ARM64_SYSROOT:-$PWD/.cache/arm64-sysroot}
A=aarch64-linux-gnu
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

# --- the toolchain and arm64 libraries ----------------------------------------------------------
# The arm64 -dev packages DPDK's .pc needs for its private requirements, and the runtime
# libraries of what is unpacked into the sysroot below.
packages=(crossbuild-essential-arm64 qemu-user-static binfmt-support ninja-build cmake
  pkg-config:arm64 libboost-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64 libcli11-dev
  libsystemd-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libibverbs-dev:arm64
  librdmacm-dev:arm64 libyaml-cpp0.7:arm64 libbsd-dev:arm64 libssl-dev:arm64 libxdp-dev:arm64
  libbpf-dev:arm64 zlib1g-dev:arm64 libpcap-dev:arm64 libelf-dev:arm64 libjansson-dev:arm64
  libnuma-dev:arm64)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "cross-arm64: installing ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
L=$CARACAL_ARM64_SYSROOT/usr/lib/$A
if [ ! -e "$L/pkgconfig/libdpdk.pc" ]; then
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download -q libyaml-cpp-dev:arm64 libyaml-cpp0.7:arm64 libdpdk-dev:arm64)
  mkdir -p "$CARACAL_ARM64_SYSROOT"
  for d in "$debs"/*.deb; do dpkg -x "$d" "$CARACAL_ARM64_SYSROOT"; done
  rm -rf "$debs"
  sed -i "s|^prefix=/usr\$|prefix=$CARACAL_ARM64_SYSROOT/usr|" "$L/pkgconfig/libdpdk.pc" \
    "$L/pkgconfig/libdpdk-libs.pc"
fi
# DPDK's runtime libraries (and the drivers EAL loads at run time), installed multiarch; the
# sysroot's lib*.so links point at them.
abi=$(sed -nE 's/^Version: ([0-9]+)\..*/\1/p' "$L/pkgconfig/libdpdk.pc")
abi=$((abi + 1))
rte=$(grep -o -- '-lrte_[a-z0-9_]*' "$L/pkgconfig/libdpdk-libs.pc" | sed 's/-lrte_//; s/_/-/g' |
  sed "s/.*/librte-&$abi:arm64/")
rte_missing=()
for p in $rte librte-mempool-ring$abi:arm64 librte-bus-vdev$abi:arm64 \
         librte-net-af-packet$abi:arm64 librte-net-tap$abi:arm64; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || rte_missing+=("$p")
done
if [ ${#rte_missing[@]} -gt 0 ]; then
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${rte_missing[@]}"
fi
for l in "$L"/librte_*.so; do
  t=$(readlink "$l")
  [ -e "$L/$t" ] || [ ! -e "/usr/lib/$A/$t" ] || ln -sf "/usr/lib/$A/$t" "$L/$t"
done
# Tests that fork and exec an arm64 peer need the kernel to run arm64 programs (binfmt_misc).
mountpoint -q /proc/sys/fs/binfmt_misc || $sudo mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
$sudo update-binfmts --enable qemu-aarch64 2>/dev/null || true

# --- build, test, package -------------------------------------------------------------------------
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchains/$A.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DCARACAL_WITH_CUDA=OFF \
  -DCARACAL_WITH_DPDK=ON -DCARACAL_WITH_RDMA=ON -DCARACAL_WITH_SYSTEMD=ON \
  -DCARACAL_BUILD_TESTS="$([ $tests = 1 ] && echo ON || echo OFF)" -DCARACAL_BUILD_BENCH=OFF
labels='mqueue|control|accel|server|agent'
# What the packages hold: the programs and their manual pages (help2man runs them under qemu).
packaged=(snic_server caracal_examples caracal_man_pages)
if [ $tests = 1 ]; then
  cmake --build "$BUILD" --target "${packaged[@]}" caracal_tests_mqueue caracal_tests_control \
    caracal_tests_accel caracal_tests_server caracal_tests_agent
  file "$BUILD/snic_server/snic_server" | grep -q 'ARM aarch64' || { echo "snic_server is not arm64"; exit 1; }
  # Under emulation the stress tests take their reduced size, as under the sanitizers. A test
  # gets a second run if its first fails: under load, qemu-user has been seen to keep a
  # finished thread in /proc/self/task for over a minute (the thread-count checks of two CPU
  # accelerator tests, which pass alone and natively); one that fails twice fails.
  CARACAL_STRESS_MESSAGES=${CARACAL_STRESS_MESSAGES:-200000} \
    ctest --test-dir "$BUILD" -L "$labels" -LE gpu -j "$(nproc)" --output-on-failure \
      --timeout 600 --no-tests=error --repeat until-pass:2
else
  cmake --build "$BUILD" --target "${packaged[@]}"
fi
rm -rf "$BUILD/packages"
cpack --config "$BUILD/CPackConfig.cmake" -B "$BUILD/packages"
for deb in "$BUILD"/packages/*.deb; do
  echo "$(basename "$deb"): $(dpkg-deb -f "$deb" Architecture), Depends: $(dpkg-deb -f "$deb" Depends)"
done
