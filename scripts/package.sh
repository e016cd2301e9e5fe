#!/usr/bin/env bash
# Builds the Debian packages (caracal-server, caracal-agent, caracal-dev) for this machine's
# architecture into build-package/packages/, from a Release build configured for /usr, and
# checks them with lintian when it is installed.
#
#   scripts/package.sh              # installs what the build needs (deps.sh run), builds, packs
#   BUILD=dir scripts/package.sh    # another build folder
#   scripts/package.sh --from build # packs an existing Release build of this tree (CI's way)
#
# --from DIR takes a folder that scripts/test.sh or scripts/run.sh configured and built: only its
# install prefix is set to /usr (nothing compiled depends on it) and what is missing is built, so
# CI compiles the packaged programs once. Its tests and benchmarks stay configured; they install
# nothing, so the packages are the same as from a folder of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-package}
from=0
case "${1:-}" in
  --from)
    BUILD=${2:?"package.sh: --from needs a build folder"}
    from=1
    shift 2
    ;;
esac
scripts/deps.sh run
if [ $from = 1 ]; then
  [ -f "$BUILD/CMakeCache.txt" ] || { echo "package.sh: $BUILD is not a configured build" >&2; exit 2; }
  grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BUILD/CMakeCache.txt" &&
    grep -qx 'CARACAL_SANITIZE:STRING=' "$BUILD/CMakeCache.txt" &&
    ! grep -qx 'CARACAL_ENGINE_PROFILE:BOOL=ON' "$BUILD/CMakeCache.txt" ||
    { echo "package.sh: $BUILD is not a plain Release build (no sanitizer, no engine profile)" >&2; exit 2; }
  cmake -S . -B "$BUILD" -DCMAKE_INSTALL_PREFIX=/usr "$@"
else
  # CMake's default generator (Unix Makefiles), as a user who types the two cmake lines gets. A
  # folder that an earlier run configured with another generator is made anew (CMake refuses to
  # switch).
  if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Unix Makefiles' "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD"
  fi
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
    -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=OFF -DCARACAL_SANITIZE= \
    -DCMAKE_SKIP_BUILD_RPATH=ON "$@"
fi
cmake --build "$BUILD" -j "$(nproc)"
rm -rf "$BUILD/packages"
cpack --config "$BUILD/CPackConfig.cmake" -B "$BUILD/packages"
ls -1 "$BUILD"/packages/*.deb

# What the packages must say that no tool checks for us.
fail() { echo "package.sh: $*" >&2; exit 1; }
field() { dpkg-deb -f "$BUILD"/packages/"$1"_*.deb "$2"; }
version=$(sed -nE 's/^project\(caracal VERSION ([0-9.]+).*/\1/p' CMakeLists.txt)
for p in caracal-server caracal-agent caracal-dev; do
  [ "$(field $p Version)" = "$version" ] || fail "$p is not version $version"
done
[ "$("$BUILD"/snic_server/snic_server --version)" = "snic_server $version" ] ||
  fail "snic_server --version does not say $version"
for p in caracal-server caracal-agent; do
  conffiles=$(dpkg-deb --ctrl-tarfile "$BUILD"/packages/"$p"_*.deb | tar -xO ./conffiles)
  for f in $(dpkg-deb -c "$BUILD"/packages/"$p"_*.deb | awk '{print $6}' | grep '^\./etc/.*[^/]$'); do
    grep -qx "${f#.}" <<<"$conffiles" || fail "$p: ${f#.} is not a conffile"
  done
done
# Libraries loaded with dlopen, which dpkg-shlibdeps cannot see.
server_depends=$(field caracal-server Depends)
cache=$BUILD/CMakeCache.txt
if grep -q '^CARACAL_WITH_DPDK:STRING=\(ON\|AUTO\)' "$cache" && ldd "$BUILD/snic_server/snic_server" | grep -q librte_eal; then
  for lib in librte-mempool-ring librte-net-af-packet librte-net-tap; do
    grep -q "${lib}[0-9]" <<<"$server_depends" || fail "caracal-server does not depend on $lib"
  done
fi
if ldd "$BUILD/snic_server/snic_server" | grep -q libibverbs; then
  grep -q ibverbs-providers <<<"$server_depends" || fail "caracal-server does not depend on ibverbs-providers"
fi
echo "package.sh: versions, conffiles and the dlopen dependencies are as they should be"
if command -v lintian >/dev/null; then
  # Errors fail the build; warnings are printed.
  lintian --fail-on error --suppress-tags-from-file deploy/debian/lintian-overrides.txt \
    "$BUILD"/packages/*.deb
fi
