#!/usr/bin/env bash
# Cores that add throughput (issue 35): what one request costs the router with 1, 2, 4 and 8
# shards, for each placement of its owners relative to the shard that read it (the "front"):
# instructions (callgrind, as perf/instructions.sh counts them), system calls (perf stat,
# raw_syscalls:sys_enter, every thread of the router) and context switches (voluntary +
# involuntary, /proc/PID/task/*/status, every thread), per request, and the instructions over the
# one-shard all-local figure.
#
# Placements (front = the shard whose SO_REUSEPORT listener the kernel gave the connection;
# key owner = the shard of the key's tenant, which answers the quota visits; model owner = the
# shard of the model's name, which answers the slot visit and takes the release notices):
#   all-local              key owner = model owner = front
#   key-remote             key owner another shard, model owner = front
#   model-remote           key owner = front, model owner another shard
#   both-remote-same       key and model owned by the same other shard
#   both-remote-different  key and model owned by two different other shards (3+ shards)
# The kernel picks the front shard (a hash of the connection's addresses and ports over the
# listeners): each placement gets a connection of its own, opened again until one lands on
# shard 0 (read from hivenet_shard_connections_accepted_total), its first request carrying the
# placement's key and model (perf/shard_scaling.py: eight keys whose tenants are owned by shards
# 0..7 modulo the shard count, eight models model-0..7 owned the same way). With connection
# handoff on (the router's default; --connection-handoff off in ROUTER_ARGS, or
# HIVENET_ROUTER_CONNECTION_HANDOFF=off in the environment, turns it off) a connection
# accepted away from its key's owner moves there after that first
# request, and the rows say "moved". The native run checks the placement from which shard
# threads made system calls.
#
# Two router runs per (kind, shards): one under callgrind (instructions; valgrind runs one thread
# at a time, so its switches and system calls mean nothing), one native (system calls and
# switches; the instructions are not counted there). Both use the epoll driver (valgrind does not
# see io_uring's rings) unless DRIVER says otherwise for the native run. Each placement's
# keep-alive connection sends the requests one after the other: every visit finds its owner asleep, the
# worst case for the doorbell (perf/notes/2026-12-01-two-shards-what-the-mesh-costs.md).
#
# Environment (all optional):
#   SHARD_COUNTS="1 2 4 8"  router --shards values
#   KINDS=json              json and/or stream ("json stream")
#   MODES="callgrind native" which runs: callgrind (instructions), native (syscalls, switches)
#   REQUESTS=1000           requests counted per placement under callgrind
#   PLACEMENTS=""           only these placements (e.g. "all-local model-remote"); every one when
#                           empty. With KEEP_TMP=1 and one placement per shard count, the kept
#                           callgrind dumps are that placement's (each count overwrites the last)
#   NATIVE_REQUESTS=5000    requests counted per placement in the native run
#   WARMUP_REQUESTS=200     uncounted requests before each placement's count
#   REPEATS=1               router runs per (kind, shards, mode); each restarts the router, so the
#                           connection may land on another front shard; the table gives the mean
#                           and the range
#   DRIVER=epoll            the native run's io driver (epoll or io_uring); callgrind is always epoll
#   ROUTER_ARGS=""          extra router flags (the auth config is the script's own: eight keys)
#   BIN=target/release      the directory of hivenet-{router,agent,sim}
#   SKIP_BUILD=0            1: use the existing BIN binaries
#   OUT=perf/results/shard-scaling-latest  rows.jsonl (one JSON line per cell and run),
#                           summary.md (the table), run.txt (commit, settings, load average)
#   PORT_BASE=24500         ports used: +80 router http, +51 grpc, +12 metrics, +900 tunnel, +888 sim
#   RUN_TIMEOUT=900         seconds one router run's client may take before it is stopped
#   KEEP_TMP=0              1: keep the logs and callgrind dumps
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PERF="$ROOT/perf"
BIN=${BIN:-$ROOT/target/release}
SHARD_COUNTS=${SHARD_COUNTS:-1 2 4 8}
KINDS=${KINDS:-json}
MODES=${MODES:-callgrind native}
REQUESTS=${REQUESTS:-1000}
NATIVE_REQUESTS=${NATIVE_REQUESTS:-5000}
WARMUP_REQUESTS=${WARMUP_REQUESTS:-200}
REPEATS=${REPEATS:-1}
DRIVER=${DRIVER:-epoll}
ROUTER_ARGS=${ROUTER_ARGS:-}
SKIP_BUILD=${SKIP_BUILD:-0}
OUT=${OUT:-$PERF/results/shard-scaling-latest}
PORT_BASE=${PORT_BASE:-24500}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
HOST=127.0.0.1
HTTP_PORT=$((PORT_BASE + 80))
METRICS_PORT=$((PORT_BASE + 12))
SIM_PORT=$((PORT_BASE + 888))
MODELS=model-0,model-1,model-2,model-3,model-4,model-5,model-6,model-7
export HIVENET_ROUTER_JWT_SECRET=${HIVENET_ROUTER_JWT_SECRET:-devsecret}

for tool in python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
if [[ " $MODES " == *" callgrind "* ]] && ! command -v callgrind_control >/dev/null; then
  echo "valgrind is missing (apt-get install valgrind)" >&2
  exit 1
fi
if [[ " $MODES " == *" native "* ]] && ! command -v perf >/dev/null; then
  echo "perf is missing (MODES=callgrind counts instructions only)" >&2
  exit 1
fi

WORK=$(mktemp -d /tmp/hivenet-shard-scaling.XXXXXX)
declare -a PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  if [[ ${KEEP_TMP:-0} == 1 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[shard-scaling %s] %s\n' "$(date +%T)" "$*" >&2; }

wait_until() { # pid seconds description command... (gives up when pid exits)
  local pid=$1 deadline=$((SECONDS + $2)) what=$3
  shift 3
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { log "exited while waiting for $what: see $WORK"; KEEP_TMP=1; exit 1; }
    ((SECONDS < deadline)) || { log "timed out waiting for $what"; KEEP_TMP=1; exit 1; }
    sleep 0.2
  done
}

stop() { # pid...: TERM, then KILL after 5 s
  local pid deadline=$((SECONDS + 5))
  kill -TERM "$@" 2>/dev/null || true
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

if [[ $SKIP_BUILD != 1 ]]; then
  log "building release binaries"
  (cd "$ROOT" && cargo build --release --bins --locked >&2)
fi

mkdir -p "$OUT"
ROWS="$OUT/rows.jsonl"
: >"$ROWS"
python3 "$PERF/shard_scaling.py" auth "$WORK/auth.yaml"
{
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "binaries: $BIN"
  echo "started: $(date -u +%FT%TZ), load average: $(cut -d' ' -f1-3 /proc/loadavg), cores: $(nproc)"
  echo "SHARD_COUNTS='$SHARD_COUNTS' KINDS='$KINDS' MODES='$MODES' REQUESTS=$REQUESTS"
  echo "NATIVE_REQUESTS=$NATIVE_REQUESTS WARMUP_REQUESTS=$WARMUP_REQUESTS REPEATS=$REPEATS DRIVER=$DRIVER ROUTER_ARGS='$ROUTER_ARGS'"
  python3 "$PERF/shard_scaling.py" owners
} >"$OUT/run.txt"

log "starting hivenet-sim on $HOST:$SIM_PORT serving $MODELS"
"$BIN/hivenet-sim" --listen "$HOST:$SIM_PORT" --models "$MODELS" --output-tokens 18 \
  >"$WORK/sim.log" 2>&1 &
SIM=$!
PIDS+=("$SIM")
wait_until "$SIM" 20 "hivenet-sim" curl -sf "http://$HOST:$SIM_PORT/v1/models"

measure() { # kind shards mode repeat
  local kind=$1 shards=$2 mode=$3 tag="$1.$2.$3.$4" driver=$DRIVER extra=() router_cmd
  [[ -n $ROUTER_ARGS ]] && read -r -a extra <<<"$ROUTER_ARGS"
  router_cmd=("$BIN/hivenet-router")
  if [[ $mode == callgrind ]]; then
    driver=epoll
    router_cmd=(valgrind --tool=callgrind "--callgrind-out-file=$WORK/callgrind.$tag.out" "${router_cmd[@]}")
  fi
  HIVENET_ROUTER_IO_DRIVER=$driver HIVENET_ROUTER_AUDIT_LOG_PATH="$WORK/audit.$tag.jsonl" \
    "${router_cmd[@]}" --shards "$shards" --http-port "$HOST:$HTTP_PORT" \
    --grpc-port "$HOST:$((PORT_BASE + 51))" --metrics-port "$HOST:$METRICS_PORT" \
    --p2p-port "$((PORT_BASE + 900))" --identity-path "$WORK/router.$tag.key" \
    --auth-config-file "$WORK/auth.yaml" "${extra[@]}" >"$WORK/router.$tag.log" 2>&1 &
  local router=$!
  PIDS+=("$router")
  wait_until "$router" 180 "hivenet-router" curl -sf "http://$HOST:$HTTP_PORT/health"
  "$BIN/hivenet-agent" --backend-url "http://$HOST:$SIM_PORT" \
    --router-grpc "$HOST:$((PORT_BASE + 51))" --identity-path "$WORK/agent.$tag.key" \
    --capacity 1000 >"$WORK/agent.$tag.log" 2>&1 &
  local agent=$!
  PIDS+=("$agent")
  wait_until "$agent" 180 "the agent's models on the router" \
    bash -c "curl -sf -H 'authorization: Bearer sk-hivenet-shard-0' 'http://$HOST:$HTTP_PORT/v1/models' | grep -q '\"model-7\"'"
  # The model owners follow the order the control core first saw the names: the agent's.
  grep -q 'serving models.*model-0.*model-1.*model-2.*model-3.*model-4.*model-5.*model-6.*model-7' \
    "$WORK/agent.$tag.log" || log "warning: the agent did not list model-0..7 in order (see $WORK/agent.$tag.log)"
  log "counting $kind, $shards shard(s), $mode, run $4 of $REPEATS"
  local requests=$REQUESTS
  [[ $mode == native ]] && requests=$NATIVE_REQUESTS
  timeout "$RUN_TIMEOUT" python3 "$PERF/shard_scaling.py" run --mode "$mode" --pid "$router" \
    --port "$HTTP_PORT" --metrics-port "$METRICS_PORT" --shards "$shards" --kind "$kind" \
    --requests "$requests" --warmup "$WARMUP_REQUESTS" --out "$ROWS" \
    --cgout "$WORK/callgrind.$tag.out" --scratch "$WORK/perf.$tag" ||
    { log "the $tag run failed: see $WORK"; KEEP_TMP=1; stop "$agent" "$router"; return 1; }
  stop "$agent" "$router"
}

for kind in $KINDS; do
  for shards in $SHARD_COUNTS; do
    for repeat in $(seq "$REPEATS"); do
      for mode in $MODES; do
        measure "$kind" "$shards" "$mode" "$repeat"
      done
    done
  done
done

echo "finished: $(date -u +%FT%TZ), load average: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/run.txt"
python3 "$PERF/shard_scaling.py" table "$ROWS" | tee "$OUT/summary.md"
