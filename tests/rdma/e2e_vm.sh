#!/usr/bin/env bash
# Inside the Soft-RoCE VM (tests/vm/rxe-vm.sh, cwd /opt/test): runs the given end-to-end scripts
# of tests/e2e (copied to /opt/test/e2e) against the binaries copied to /opt/test, with the
# transport of CARACAL_E2E_TRANSPORT (rdma: the agents export their regions on rxe0's address,
# the server connects to them). lib.sh expects a build tree: a small one of links is made here.
# Every script must pass; a script that skips (77) counts as a failure here, since the VM test
# copies in every tool the scripts need.
set -u
export PATH=/opt/test:$PATH
# Scripts that rewire the network (link_fault.sh) run only where this is set.
export CARACAL_E2E_VM=1
B=/tmp/caracal-build
mkdir -p "$B/snic_server" "$B/examples/echo" "$B/tests/e2e"
ln -sf /opt/test/snic_server "$B/snic_server/snic_server"
ln -sf /opt/test/caracal_echo_agent "$B/examples/echo/caracal_echo_agent"
ln -sf /opt/test/caracal_pipeline_client "$B/tests/e2e/caracal_pipeline_client"
# Scripts of tests/rdma run with tests/e2e's lib.sh.
for s in /opt/test/*.sh; do
  [ "$(basename "$s")" = e2e_vm.sh ] || cp "$s" /opt/test/e2e/
done
failed=()
for s in "$@"; do
  echo "=== $s (transport ${CARACAL_E2E_TRANSPORT:-shm})"
  t0=$(date +%s)
  rc=0
  bash "/opt/test/e2e/$s" "$B" /opt/test || rc=$?
  echo "=== $s: exit $rc after $(($(date +%s) - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$s (exit $rc)")
done
if [ "${#failed[@]}" -ne 0 ]; then
  # rxe's own counters: retransmissions and sequence errors say whether packets were lost.
  for c in /sys/class/infiniband/*/ports/1/hw_counters/*; do
    [ -r "$c" ] && [ "$(cat "$c")" != 0 ] && echo "rxe counter $(basename "$c") = $(cat "$c")"
  done
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "ALL PASSED: $*"
