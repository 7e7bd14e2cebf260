#!/usr/bin/env bash
# Instructions per request of the router or the agent, counted by callgrind: a figure that repeats
# to a fraction of a percent on a quiet machine, for changes too small for perf/bench.sh's
# wall-clock noise (±5-20 % on a shared 2-core machine). Not on a busy one: how often the
# runtime parks and wakes depends on timing, and a run beside a build or a test suite counted up
# to 6 % more for the same binary. It counts work, not time: a cache miss, an atomic operation or
# a system call costs one instruction here, and valgrind's CPU has no SHA extensions (the key's
# SHA-256 runs in software). Use both: bench.sh for what an operator sees, this for whether a
# change removed work. See perf/README.md.
#
# Environment (all optional):
#   TARGET=router      which process runs under callgrind: router or agent
#   REQUESTS=2000      requests counted (after WARMUP_REQUESTS uncounted ones)
#   WARMUP_REQUESTS=200
#   KIND=json          json or stream
#   VARIANTS=""        binary directories to compare, separated by '|'; empty entry = target/release.
#                      VARIANTS='/tmp/before|' counts /tmp/before/hivenet-{router,agent} then the
#                      current build, one after the other. An entry may add router flags after
#                      the directory and a space: VARIANTS='|  --sync-store valkey ...' counts the
#                      current build without, then with, those flags
#   ROUTER_ARGS=""     router flags for every variant (e.g. --auth-config-file perf/auth-bench.yaml)
#   BENCH_API_KEY=""   sent as the bearer key of every request when set (sk-hivenet-bench for
#                      perf/auth-bench.yaml)
#   SKIP_BUILD=0       1: use the existing target/release binaries
#   PORT_BASE=24000    ports used: +80 router http, +51 grpc, +12 metrics, +900 tunnel, +888 sim
#   SHARDS=1           the router's shards; with 2, the client's connection lands on one shard and
#                      the model may be owned by the other: what the mesh costs (issue 14, target 4)
#
# The router runs with SHARDS shards (one by default) and the epoll driver (valgrind does not see
# io_uring's shared rings); the client is one keep-alive connection sending requests one after the other.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/target/release"
TARGET=${TARGET:-router}
REQUESTS=${REQUESTS:-2000}
WARMUP_REQUESTS=${WARMUP_REQUESTS:-200}
KIND=${KIND:-json}
VARIANTS=${VARIANTS:-}
SKIP_BUILD=${SKIP_BUILD:-0}
PORT_BASE=${PORT_BASE:-24000}
SHARDS=${SHARDS:-1}
HOST=127.0.0.1
MODEL=sim-model
export HIVENET_ROUTER_JWT_SECRET=${HIVENET_ROUTER_JWT_SECRET:-devsecret}

[[ $TARGET == router || $TARGET == agent ]] || { echo "TARGET is router or agent" >&2; exit 2; }
[[ $KIND == json || $KIND == stream ]] || { echo "KIND is json or stream" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/hivenet-instructions.XXXXXX)
declare -a PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  [[ ${KEEP_TMP:-0} == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT

log() { printf '[instructions %s] %s\n' "$(date +%T)" "$*" >&2; }

wait_until() { # pid seconds description command... (gives up when pid exits)
  local pid=$1 deadline=$((SECONDS + $2)) what=$3
  shift 3
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { log "exited while waiting for $what: see $WORK"; exit 1; }
    ((SECONDS < deadline)) || { log "timed out waiting for $what"; exit 1; }
    sleep 0.2
  done
}

if [[ $SKIP_BUILD != 1 ]]; then
  log "building release binaries"
  (cd "$ROOT" && cargo build --release --bins --locked >&2)
fi

# One keep-alive connection, requests one after the other; prints nothing, fails on a non-200.
client() { # port count
  python3 - "$1" "$2" "$KIND" "$MODEL" "${BENCH_API_KEY:-}" <<'PY'
import http.client, json, sys
port, count, kind, model, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
if kind == "stream":
    body["stream"] = True
payload = json.dumps(body).encode()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for _ in range(count):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", "/v1/chat/completions", payload, headers)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        sys.exit(f"status {response.status}")
PY
}

SIM_PORT=$((PORT_BASE + 888))
log "starting hivenet-sim on $HOST:$SIM_PORT"
"$BIN/hivenet-sim" --listen "$HOST:$SIM_PORT" --models "$MODEL" --output-tokens 18 \
  >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_until "$!" 20 "hivenet-sim" curl -sf "http://$HOST:$SIM_PORT/v1/models"

count_one() { # dir [router flags] index -> prints instructions per request
  local dir=${1%% *} index=$2 router_cmd agent_cmd out extra=()
  [[ $1 == *" "* ]] && read -r -a extra <<<"${1#* }"
  [[ -n ${ROUTER_ARGS:-} ]] && read -r -a base_args <<<"$ROUTER_ARGS" && extra=("${base_args[@]}" "${extra[@]}")
  out="$WORK/callgrind.$index.out"
  local grind=(valgrind --tool=callgrind "--callgrind-out-file=$out")
  router_cmd=("$dir/hivenet-router")
  agent_cmd=("$dir/hivenet-agent")
  if [[ $TARGET == router ]]; then router_cmd=("${grind[@]}" "${router_cmd[@]}"); fi
  if [[ $TARGET == agent ]]; then agent_cmd=("${grind[@]}" "${agent_cmd[@]}"); fi
  HIVENET_ROUTER_IO_DRIVER=epoll HIVENET_ROUTER_AUDIT_LOG_PATH="$WORK/audit.$index.jsonl" \
    "${router_cmd[@]}" --shards "$SHARDS" --http-port "$HOST:$((PORT_BASE + 80))" \
    --grpc-port "$HOST:$((PORT_BASE + 51))" --metrics-port "$HOST:$((PORT_BASE + 12))" \
    --p2p-port "$((PORT_BASE + 900))" --identity-path "$WORK/router.$index.key" "${extra[@]}" \
    >"$WORK/router.$index.log" 2>&1 &
  local router=$!
  PIDS+=("$router")
  wait_until "$router" 120 "hivenet-router" curl -sf "http://$HOST:$((PORT_BASE + 80))/health"
  "${agent_cmd[@]}" --backend-url "http://$HOST:$SIM_PORT" \
    --router-grpc "$HOST:$((PORT_BASE + 51))" --identity-path "$WORK/agent.$index.key" \
    --capacity 1000 >"$WORK/agent.$index.log" 2>&1 &
  local agent=$!
  PIDS+=("$agent")
  wait_until "$agent" 120 "the agent's model on the router" \
    bash -c "curl -sf -H 'authorization: Bearer ${BENCH_API_KEY:-}' 'http://$HOST:$((PORT_BASE + 80))/v1/models' | grep -q '\"$MODEL\"'"
  client "$((PORT_BASE + 80))" "$WARMUP_REQUESTS"
  local grinding=$router
  [[ $TARGET == agent ]] && grinding=$agent
  # Zero the counters after the warm-up, dump them after the counted requests: the dump holds
  # exactly what those requests (and whatever timers fired meanwhile) cost.
  callgrind_control -z "$grinding" >/dev/null
  client "$((PORT_BASE + 80))" "$REQUESTS"
  callgrind_control -d "$grinding" >/dev/null
  kill -TERM "$agent" "$router" 2>/dev/null || true
  wait "$agent" "$router" 2>/dev/null || true
  local total
  # The events line of the summary: "summary: <Ir>".
  # shellcheck disable=SC2016 # awk's own $2
  total=$(grep -l '^desc: Trigger: .*[Dd]ump' "$out"* | head -n1 | xargs awk '/^summary:/ {print $2; exit}')
  [[ -n $total ]] || { log "no callgrind summary in $out"; exit 1; }
  awk -v t="$total" -v n="$REQUESTS" 'BEGIN { printf "%.0f\n", t / n }'
}

DIRS=()
rest=$VARIANTS
while :; do
  DIRS+=("${rest%%|*}")
  [[ $rest == *"|"* ]] || break
  rest=${rest#*|}
done
echo "instructions per $KIND request of the $TARGET ($REQUESTS requests, one connection):"
for i in "${!DIRS[@]}"; do
  dir=${DIRS[$i]}
  [[ -z ${dir%% *} ]] && dir="$BIN$dir"
  log "counting $dir"
  per_request=$(count_one "$dir" "$i")
  printf '%-40s %12s\n' "$dir" "$per_request"
done
