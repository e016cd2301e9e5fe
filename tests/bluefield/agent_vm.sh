#!/bin/sh
# The GPU host's side of tests/bluefield/topology.sh, run inside tests/vm/rxe-vm.sh's Soft-RoCE
# VM (cwd /opt/test): rxe0 sits on the link to the BlueField VM. It serves commands that the
# host writes one per line to the control channel ($RXE_VM_CTL) and answers each with one line:
#   start       starts the echo agent with agent.yaml (transport rdma on this VM's rxe0 address)
#   kill        kill -9 of the agent (its requests in flight must fail on the server's side)
#   log         the agent log's last lines, joined by " | "
#   quit        stops the agent (SIGTERM) and ends the VM
set -u
[ -n "${RXE_VM_CTL:-}" ] || { echo "agent_vm: no control channel (rxe-vm.sh -c)"; exit 2; }
AGENT=
exec 3<>"$RXE_VM_CTL"
reply() { printf '%s\n' "$*" >&3; echo "agent_vm: $*"; }
reply "ready ip=$RXE_IP gid=$RXE_GID_IDX"
while read -r cmd <&3; do
  case $cmd in
    start)
      ./caracal_echo_agent --config agent.yaml >>agent.log 2>&1 &
      AGENT=$!
      reply "started $AGENT";;
    kill)
      [ -n "$AGENT" ] && kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null; AGENT=
      reply "killed";;
    log) reply "$(tail -n 5 agent.log 2>/dev/null | tr '\n' '|')";;
    quit)
      [ -n "$AGENT" ] && { kill -TERM "$AGENT"; wait "$AGENT"; }
      reply "bye"; cat agent.log 2>/dev/null | tail -n 20; exit 0;;
    "") ;;
    *) reply "unknown command '$cmd'";;
  esac
done
echo "agent_vm: control channel closed"
exit 1
