#!/usr/bin/env bash
# Installs the packages that scripts/package.sh built into a fresh Debian root (mmdebstrap,
# minbase, this machine's release and architecture) with apt, as an operator would, and checks
# what the maintainer scripts did: the caracal user, the generated secret (mode 0640, group
# caracal), the conffiles, the units in place (and `systemd-analyze verify` of them there), the
# manual pages; then runs the installed snic_server as caracal with the installed configuration
# and asks it for an echo through the installed agent; then runs end-to-end scripts of
# tests/e2e against the installed server and agent.
#
#   scripts/package-install-check.sh [PACKAGES_DIR [BUILD_DIR]]
#     PACKAGES_DIR default build-package/packages; BUILD_DIR (default build) gives the test
#     clients of the end-to-end scripts (caracal_pipeline_client); without it they are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=$(realpath "${1:-build-package/packages}")
CLIENTS=$(realpath "${2:-build}" 2>/dev/null || true)
ls "$PKGS"/caracal-server_*.deb "$PKGS"/caracal-agent_*.deb >/dev/null
command -v mmdebstrap >/dev/null || { echo "SKIP: mmdebstrap is not installed"; exit 77; }
. /etc/os-release
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/caracal-root.XXXXXX")
# Signals every process running inside the root (runuser does not pass SIGTERM on).
signal_root() {
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && kill "-$1" "${p#/proc/}" 2>/dev/null
  done
  return 0
}
# Stops what runs inside the root, then its mounts, then the root.
cleanup() {
  signal_root KILL
  sleep 0.2
  for m in dev/shm proc; do
    if mountpoint -q "$ROOT/$m"; then umount "$ROOT/$m" || umount -l "$ROOT/$m"; fi
  done
  rm -rf "$ROOT"
}
trap cleanup EXIT
fail() { echo "package-install-check: $*" >&2; exit 1; }

# A root with apt, then our packages installed by apt from local files (it resolves Depends
# from the mirror). No services start in a chroot: policy-rc.d says so, as in Debian's builds.
mmdebstrap --variant=apt --mode=root --include=netcat-openbsd,ca-certificates,systemd,curl,python3 \
  --customize-hook='printf "#!/bin/sh\nexit 101\n" >"$1/usr/sbin/policy-rc.d"; chmod +x "$1/usr/sbin/policy-rc.d"' \
  --customize-hook="mkdir -p \"\$1/tmp/debs\"" \
  --customize-hook="sync-in $PKGS /tmp/debs" \
  --customize-hook='chroot "$1" sh -c "apt-get install -y -q --no-install-recommends /tmp/debs/caracal-server_*.deb /tmp/debs/caracal-agent_*.deb /tmp/debs/caracal-dev_*.deb"' \
  "$VERSION_CODENAME" "$ROOT" >"$ROOT.log" 2>&1 || { tail -30 "$ROOT.log"; fail "mmdebstrap or apt failed"; }
rm -f "$ROOT.log"

in_root() { chroot "$ROOT" "$@"; }
in_root getent passwd caracal >/dev/null || fail "no caracal user"
mode=$(in_root stat -c "%a %U:%G" /etc/caracal/secret)
[ "$mode" = "640 root:caracal" ] || fail "/etc/caracal/secret is $mode, not 640 root:caracal"
[ "$(wc -c <"$ROOT/etc/caracal/secret")" -ge 17 ] || fail "the secret is too short"
for f in /etc/caracal/server.yaml /etc/caracal/agents/echo.yaml; do
  grep -qx "$f" "$ROOT"/var/lib/dpkg/info/caracal-*.conffiles || fail "$f is not a conffile"
done
for u in caracal-server.service caracal-agent@.service; do
  [ -e "$ROOT/lib/systemd/system/$u" ] || [ -e "$ROOT/usr/lib/systemd/system/$u" ] || fail "no $u"
done
[ -L "$ROOT/etc/systemd/system/multi-user.target.wants/caracal-server.service" ] ||
  fail "caracal-server.service is not enabled"
# systemd's own check of the installed units (directives, the programs they run, the user).
out=$(in_root systemd-analyze verify caracal-server.service caracal-agent@echo.service 2>&1) ||
  fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
for p in snic_server caracal_echo_agent caracal_kv_agent caracal_matvec_agent caracal_face_agent \
         caracal_face_loader caracal_face_client; do
  [ -e "$ROOT/usr/share/man/man1/$p.1.gz" ] || fail "no manual page for $p"
done

# The installed programs, as the units run them (user caracal, the installed configurations).
mount -t proc proc "$ROOT/proc"
mount -t tmpfs -o mode=1777 tmpfs "$ROOT/dev/shm"
in_root runuser -u caracal -- snic_server --config /etc/caracal/server.yaml --check-config
in_root runuser -u caracal -- snic_server --config /etc/caracal/server.yaml >"$ROOT/tmp/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do grep -qs "serving 1 service" "$ROOT/tmp/server.log" && break; sleep 0.1; done
in_root runuser -u caracal -- caracal_echo_agent --config /etc/caracal/agents/echo.yaml \
  >"$ROOT/tmp/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do grep -qs "serving 1 service" "$ROOT/tmp/agent.log" && break; sleep 0.1; done
reply=$(echo installed | timeout 10 nc -q1 127.0.0.1 7002 || true)
signal_root TERM
wait "$agent" "$server" 2>/dev/null || true
[ "$reply" = installed ] || { tail -5 "$ROOT"/tmp/*.log; fail "no echo from the installed server and agent ('$reply')"; }

# A secret file opened to others is refused, with its path and mode.
chmod 0644 "$ROOT/etc/caracal/secret"
out=$(in_root runuser -u caracal -- snic_server --config /etc/caracal/server.yaml --check-config 2>&1 || true)
grep -q "secret file '/etc/caracal/secret' is open to other users (mode 0644)" <<<"$out" ||
  fail "a world-readable secret was not refused: $out"
chmod 0640 "$ROOT/etc/caracal/secret"

# The SDK as installed: inside the root, where apt installed caracal-dev with only what its
# Depends pulled in, a handler project of its own (tests/e2e/sdk.sh) is configured, built and
# served by the installed snic_server.
mkdir -p "$ROOT/tmp/src/tests" "$ROOT/tmp/sdk-build"
cp -r tests/e2e "$ROOT/tmp/src/tests/"
rc=0
in_root env CARACAL_SDK_PREFIX=/usr bash /tmp/src/tests/e2e/sdk.sh /tmp/sdk-build /tmp/src \
  >"$ROOT/tmp/e2e-sdk.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -30 "$ROOT/tmp/e2e-sdk.log"; fail "a handler project against the installed caracal-dev: sdk.sh exited $rc"; }

# The end-to-end scripts, run with the installed programs in place of a build tree's. The tests
# ran them at full load against the build's programs; here a quarter of it (as in the sanitizer
# runs) shows the installed ones serving.
export CARACAL_E2E_LOAD_PERCENT=${CARACAL_E2E_LOAD_PERCENT:-25}
ran=(sdk)
if [ -x "$CLIENTS/tests/e2e/caracal_pipeline_client" ]; then
  T=$ROOT/tmp/as-built
  mkdir -p "$T/snic_server" "$T/examples/echo" "$T/tests/e2e"
  ln -s "$ROOT/usr/bin/snic_server" "$T/snic_server/snic_server"
  ln -s "$ROOT/usr/bin/caracal_echo_agent" "$T/examples/echo/caracal_echo_agent"
  ln -s "$CLIENTS/tests/e2e/caracal_pipeline_client" "$T/tests/e2e/caracal_pipeline_client"
  for s in pipeline bad_input agent_loss sockperf; do
    rc=0
    tests/e2e/$s.sh "$T" "$PWD" >"$ROOT/tmp/e2e-$s.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || { tail -30 "$ROOT/tmp/e2e-$s.log"; fail "tests/e2e/$s.sh against the installed programs exited $rc"; }
    [ "$rc" -eq 0 ] && ran+=("$s")
  done
fi
echo "package-install-check: installed with apt into a fresh $PRETTY_NAME root; user, secret," \
  "conffiles, units (systemd-analyze verify) and manual pages in place; the installed server" \
  "and agent served an echo as caracal; e2e scripts against the installed programs passed: ${ran[*]:-none run}"
