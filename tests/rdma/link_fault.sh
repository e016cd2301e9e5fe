#!/usr/bin/env bash
# The rdma transport fails while its agent stays registered, then comes back.
#
# Inside the Soft-RoCE VM only (tests/rdma/e2e_vm.sh, as root): it rewires the VM's network.
# echo-1 exports its region on a second pair of Soft-RoCE devices joined by a veth pair
# (198.51.100.1 on the server's side, 198.51.100.2 on the agent's), so the server's packets to
# it cross a real link instead of rxe's in-device loopback; echo-2 stays on rxe0 (192.0.2.1).
# Both register over TCP on 127.0.0.1, which the fault does not touch.
#
# The fault: the server's neighbour entry for echo-1's address is pointed at a MAC address no
# device has, so its frames are dropped at the far end of the veth while the link stays up.
# Expected, under a pipelined load with every reply checked:
#   - the server's queue pair to echo-1 exhausts its retries (a completion error after
#     rdma_retry_count + 1 ACK timeouts, as set below), echo-1's region leaves dispatch and its
#     requests in flight fail with error replies; no reply goes to the wrong request;
#   - echo-1 stays registered (heartbeats flow), echo-2 serves everything meanwhile;
#   - the server tries to reconnect with backoff, and the tries fail while frames are lost;
#   - once the neighbour entry is right again, a reconnect succeeds and the region is
#     re-admitted: with echo-2 gone, echo-1 alone serves a load with no error.
source "$(dirname "$0")/lib.sh"
need curl ip rdma
if [ "$TRANSPORT" != rdma ] || [ -z "${CARACAL_E2E_VM:-}" ]; then
  echo "SKIP: rewires the network: runs only inside the Soft-RoCE VM (tests/rdma/e2e_vm.sh)"
  exit 77
fi
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"
SNIC_IP=198.51.100.1
AGENT_IP=198.51.100.2

# --- the link ---------------------------------------------------------------------------------
# Both ends live in this one network namespace (rxe listens for RoCE only in the initial one),
# so policy routing sends traffic between the two addresses over the veth instead of `lo`:
#   - locally made packets to the agent's address leave by the server's end (rule 100);
#   - lookups bound to the agent's end for the server's address go out by it (rule 101: rxe's
#     own sends, and rdma_cm's check that a connection request came in where its reply would
#     go out);
#   - the `local` table moves behind them, and both ends accept packets from local addresses.
ip link add cr-snic type veth peer name cr-agent
ip addr add "$SNIC_IP/32" dev cr-snic
ip addr add "$AGENT_IP/32" dev cr-agent
for i in all default cr-snic cr-agent; do
  echo 1 >"/proc/sys/net/ipv4/conf/$i/accept_local"
  echo 0 >"/proc/sys/net/ipv4/conf/$i/rp_filter"
done
ip link set cr-snic up
ip link set cr-agent up
ip rule add pref 100 to "$AGENT_IP" iif lo lookup 100
ip route add "$AGENT_IP" dev cr-snic src "$SNIC_IP" table 100
ip rule add pref 101 to "$SNIC_IP" oif cr-agent lookup 101
ip route add "$SNIC_IP" dev cr-agent src "$AGENT_IP" table 101
ip rule add pref 1000 lookup local
ip rule del pref 0
# Fixed neighbour entries: no ARP between two addresses of one host, and the fault below is a
# change of one of them.
SNIC_MAC=$(cat /sys/class/net/cr-snic/address)
AGENT_MAC=$(cat /sys/class/net/cr-agent/address)
ip neigh replace "$AGENT_IP" lladdr "$AGENT_MAC" dev cr-snic nud permanent
ip neigh replace "$SNIC_IP" lladdr "$SNIC_MAC" dev cr-agent nud permanent
rdma link add rxe_snic type rxe netdev cr-snic
rdma link add rxe_agent type rxe netdev cr-agent
for _ in $(seq 50); do
  [ -e /sys/class/infiniband/rxe_agent/ports/1/gids/1 ] && break
  sleep 0.1
done
frames() { cat "/sys/class/net/$1/statistics/$2_packets"; }

# --- server and agents ------------------------------------------------------------------------
start_fault_server ", rdma_reconnect_max_ms: 1000, rdma_ack_timeout: 17, rdma_retry_count: 6"
TRANSPORT_YAML="transport: rdma
rdma: { bind_address: $AGENT_IP }"
start_agent echo-1 "$ECHO_AGENT" "$SERVICE"
# shellcheck disable=SC2034 # read by start_agent (lib.sh)
TRANSPORT_YAML="transport: rdma
rdma: { bind_address: $RDMA_ADDRESS }"
start_agent echo-2 "$ECHO_AGENT" "$SERVICE"
echo "echo-1's region over the veth: $(frames cr-snic tx) frames out of the server's end so far"
[ "$(frames cr-snic tx)" -gt 0 ] || fail "the connection to echo-1 did not cross the veth"

# --- the fault, under load --------------------------------------------------------------------
start_load 17
wait_for_replies
ip neigh replace "$AGENT_IP" lladdr 02:00:00:00:00:01 dev cr-snic nud permanent
echo "frames to echo-1 lost from now on, after $(metric caracal_service_replies_total) replies"
dropped_before=$(frames cr-agent rx)
wait_for_line "$WORK/server.log" "agent 'echo-1' region for service 'echo' left dispatch" 30
grep -m1 "left dispatch" "$WORK/server.log"

finish_load
echo "requests failed visibly when echo-1's transport failed: $LOAD_ERRORS"
[ "${LOAD_ERRORS:-0}" -gt 0 ] || fail "no request failed visibly, yet echo-1 had requests in flight"

# The agent is still registered, the server is retrying and failing, and echo-2 serves alone.
for _ in $(seq $((100 * TIME_SCALE))); do
  [ "$(metric caracal_rdma_reconnect_failures_total)" -ge 1 ] && break
  sleep 0.1
done
[ "$(metric caracal_rdma_reconnect_failures_total)" -ge 1 ] ||
  fail "no failed reconnect while echo-1's frames were lost"
grep -m1 "reconnect 1 failed" "$WORK/server.log" || true
[ "$(metric caracal_agents)" -eq 2 ] || fail "the server counts $(metric caracal_agents) agents, not 2"
grep -q "lost the server" "$WORK/echo-1.log" && fail "echo-1 lost its registration"
[ "$(metric caracal_rdma_reconnects_total)" -eq 0 ] || fail "a reconnect succeeded while frames were lost"
"$CLIENT" --connect "127.0.0.1:$PORT" --connections 20 --requests 100 --pipeline 8 \
  --max-bytes 500 --framing line --seed 18 --timeout-s 120 ||
  fail "echo-2 did not serve cleanly alone"
echo "echo-1's end of the veth received $(($(frames cr-agent rx) - dropped_before)) frames meant for another MAC"

# --- the link comes back ----------------------------------------------------------------------
ip neigh replace "$AGENT_IP" lladdr "$AGENT_MAC" dev cr-snic nud permanent
echo "frames to echo-1 flow again"
wait_for_line "$WORK/server.log" "agent 'echo-1' region for service 'echo' re-admitted after an rdma reconnect" 30
grep -m1 "re-admitted" "$WORK/server.log"
echo "failed reconnects: $(metric caracal_rdma_reconnect_failures_total), reconnects: $(metric caracal_rdma_reconnects_total)"
[ "$(metric caracal_rdma_reconnects_total)" -eq 1 ] || fail "expected 1 reconnect"

# echo-2 leaves; echo-1 alone, over its new queue pair, serves a load with no error.
# shellcheck disable=SC2154 # start_agent (lib.sh) sets AGENT_PID_<name> through eval
kill -TERM "$AGENT_PID_echo_2"
wait_for_line "$WORK/server.log" "agent 'echo-2' detached" 30
for _ in $(seq $((50 * TIME_SCALE))); do
  [ "$(metric caracal_agents)" -eq 1 ] && break
  sleep 0.1
done
[ "$(metric caracal_agents)" -eq 1 ] || fail "the server counts $(metric caracal_agents) agents, not 1"
"$CLIENT" --connect "127.0.0.1:$PORT" --connections 20 --requests 100 --pipeline 8 \
  --max-bytes 500 --framing line --seed 19 --timeout-s 120 ||
  fail "echo-1 did not serve cleanly after its reconnect"
echo "PASS"
