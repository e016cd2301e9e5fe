#!/usr/bin/env bash
# The SDK as a handler author outside the tree gets it: `cmake --install` of this build (under
# a DESTDIR, so that nothing of the machine's is touched) or CARACAL_SDK_PREFIX, then a project
# of its own (the three lines of CMake of host_init/README.md, and a handler that reverses each
# message) found with find_package(Caracal), built, and served by the installed snic_server:
# the reply over TCP is the message reversed. Then the first-handler guide
# (examples/first_handler/README.md, installed with its template) is run step by step.
source "$(dirname "$0")/lib.sh"
need cmake nc python3
# CARACAL_SDK_PREFIX: an installation made otherwise (scripts/package-install-check.sh: the
# caracal-dev and caracal-server packages installed by apt into a fresh root) is used as it is.
if [ -n "${CARACAL_SDK_PREFIX:-}" ]; then
  PREFIX=$CARACAL_SDK_PREFIX
else
  PREFIX="$WORK/root$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")"
  DESTDIR="$WORK/root" cmake --install "$BUILD" >"$WORK/install.log" 2>&1 ||
    fail "cmake --install failed: $(tail -5 "$WORK/install.log")"
fi
for f in bin/snic_server include/caracal/accel/handler.hpp include/caracal/agent/agent.hpp; do
  [ -e "$PREFIX/$f" ] || fail "the install has no $f"
done
# lib/ or, on Debian with prefix /usr, lib/<multiarch triplet>/
[ -n "$(find "$PREFIX"/lib* -path '*/cmake/Caracal/CaracalConfig.cmake' 2>/dev/null)" ] ||
  fail "the install has no cmake/Caracal/CaracalConfig.cmake"

mkdir -p "$WORK/reverse"
cat >"$WORK/reverse/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(reverse LANGUAGES CXX)
find_package(Caracal 0.1 REQUIRED)
caracal_add_handler(reverse_agent SOURCES reverse.cpp)
CMAKE
cat >"$WORK/reverse/reverse.cpp" <<'CPP'
#include <caracal/accel/handler.hpp>
#include <caracal/agent/agent.hpp>

struct Reverse {
  CARACAL_HOST_DEVICE void operator()(const caracal::accel::Request& req,
                                      caracal::accel::Response& resp,
                                      caracal::accel::Context&) const {
    for (uint32_t i = 0; i < req.size; ++i) resp.data[i] = req.data[req.size - 1 - i];
    resp.size = req.size;
  }
};

int main(int argc, char** argv) { return caracal::agent::agent_main<Reverse>(argc, argv); }
CPP
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$WORK/reverse" -B "$WORK/reverse/build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release >"$WORK/configure.log" 2>&1 ||
  fail "the handler project does not configure: $(tail -20 "$WORK/configure.log")"
cmake --build "$WORK/reverse/build" >"$WORK/build.log" 2>&1 ||
  fail "the handler project does not build: $(grep -m3 -B2 -A6 "error" "$WORK/build.log")"

# shellcheck disable=SC2034 # read by start_server (lib.sh)
SERVER_BIN="$PREFIX/bin/snic_server"
start_server "io_threads: 1
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: reverse
    max_message_bytes: 256
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line } }"
PORT=$(port_of "tcp/127.0.0.1:0")
start_agent reverse-1 "$WORK/reverse/build/reverse_agent" \
  "  - { name: reverse, queues: 1, ring_capacity: 16, slot_bytes: 64, max_message_bytes: 256 }"

reply=$(echo "caracal sdk" | timeout 10 nc -q1 127.0.0.1 "$PORT")
[ "$reply" = "kds lacarac" ] || fail "the reply to 'caracal sdk' was '$reply'"
echo "an out-of-tree handler built against the install serves through the installed server"

# The first-handler guide, every step of it as a reader runs it, from the installed copy: the
# template copied out of the install, built, served by the installed server and asked, its
# settings changed and refused (tests/e2e/run_guide.py).
GUIDE="$PREFIX/share/caracal/handler-template/README.md"
[ -f "$GUIDE" ] || fail "the install has no handler template (share/caracal/handler-template)"
python3 "$(dirname "$0")/run_guide.py" --prefix "$PREFIX" "$GUIDE" "$WORK/guide" \
  >"$WORK/guide.log" 2>&1 || fail "the first-handler guide failed: $(tail -30 "$WORK/guide.log")"
grep -q "stop words from" "$WORK/guide.log" || fail "the guide's agent did not load its stop words"
echo "PASS: the first-handler guide ran, every step of it ($(grep -c '^\$ ' "$WORK/guide.log") commands)"
