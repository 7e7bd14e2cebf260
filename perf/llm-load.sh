#!/usr/bin/env bash
# LLM-shaped load (issue 35): thousands of long streams open at once, each a token every 25 ms,
# through router -> agent -> sim, nginx -> nginx -> sim, SMG -> sim and the sim direct (the
# baseline). For each target and each number of open streams (OPEN): CPU per streamed token and
# memory (RSS, Pss) per open stream of every process on the path, time to first token and the gap
# between tokens (and what they add over the direct sim at the same level), streams failed, the
# client's own CPU, and the level where each target first falls behind. See perf/README.md,
# "LLM-shaped load".
#
# Environment (all optional; perf/lib.sh lists the stack's: SHARDS, NGINX_WORKERS, SKIP_BUILD,
# SKIP_INSTALL, KEEP_TMP):
#   OPEN="500 1000 2000"   open streams per level (each level's rate = OPEN / stream duration)
#   HOLD=20                seconds measured per level, after a ramp of one stream duration + 1 s
#   DRAIN=15  SETTLE=2     seconds the streams in flight may take to end after a level; seconds
#                          waited before the next level's idle memory reading
#   TARGETS="sim router nginx2 smg"   run in this order; smg is skipped when SMG_BIN is missing
#   TTFT=20ms ITL=25ms TOKENS=200     the sim's pace: a stream lasts TTFT + TOKENS x ITL (5.02 s)
#   PROMPT_BYTES=3072      prompt text per request (system + user message)
#   SIM_ARGS=""            extra hivenet-sim flags (beside --ttft --itl --output-tokens
#                          --max-concurrency 0 --max-waiting 100000)
#   AGENT_CAPACITY=20000   the agent's --capacity: far above OPEN, the router never queues
#   NGINX_WORKER_CONNECTIONS=16384   nginx.conf.tmpl's worker_connections (8192) for this run
#   ROUTER_ARGS=""         extra router flags (lib.sh's SHARDS=2 and --queue-depth 1000 unless set)
#   SMG_BIN=/tmp/smg-venv/bin/smg  SMG_ARGS=""  (SMG: --policy round_robin, one worker)
#   BIN=target/release     the hivenet binaries (e.g. BIN=/tmp/before-target/release SKIP_BUILD=1)
#   PORT_BASE=29000        lib.sh's ports, +300 SMG, +301 SMG's metrics
#   TTFT_LIMIT_MS=50 ITL_LIMIT_MS=25 CLIENT_LIMIT_PCT=90   "falls behind" thresholds (report)
#   WARMUP=32              short streams (max_tokens 4) before each level's idle memory reading
#   OUT=perf/results/llm-<UTC timestamp>   one JSON per target and level (TARGET-OPEN.json),
#                          summary.md, all.json, run.txt, logs/ (the last level's, tails)
# Every level runs on a stack started for it (sim, and the router + agent, nginx or SMG).
# Bounded: each level lasts at most ramp + HOLD + DRAIN + SETTLE seconds (and each stream
# 60 s); each python run has a timeout; the trap stops every process on exit. Loopback only.
set -Eeuo pipefail

PORT_BASE=${PORT_BASE:-29000}
LOG_TAG=llm
BIN_OVERRIDE=${BIN:-}
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ -n $BIN_OVERRIDE ]] && BIN=$BIN_OVERRIDE

OPEN=${OPEN:-500 1000 2000}
HOLD=${HOLD:-20}
DRAIN=${DRAIN:-15}
SETTLE=${SETTLE:-2}
TARGETS=${TARGETS:-sim router nginx2 smg}
TTFT=${TTFT:-20ms}
ITL=${ITL:-25ms}
TOKENS=${TOKENS:-200}
PROMPT_BYTES=${PROMPT_BYTES:-3072}
AGENT_CAPACITY=${AGENT_CAPACITY:-20000}
NGINX_WORKER_CONNECTIONS=${NGINX_WORKER_CONNECTIONS:-16384}
ROUTER_ARGS=${ROUTER_ARGS:-}
SMG_BIN=${SMG_BIN:-/tmp/smg-venv/bin/smg}
SMG_ARGS=${SMG_ARGS:-}
OUT=${OUT:-$PERF/results/llm-$(date -u +%Y%m%dT%H%M%SZ)}
export HOLD DRAIN SETTLE
SMG_ADDR=$HOST:$((PORT_BASE + 300))
SMG_METRICS_PORT=$((PORT_BASE + 301))

ms_of() { # Go duration in ms or s -> ms
  case $1 in
    *ms) echo "${1%ms}" ;;
    *s) calc "${1%s} * 1000" 3 ;;
    *) die "durations are NNms or NNs: $1" ;;
  esac
}
TTFT_MS=$(ms_of "$TTFT")
ITL_MS=$(ms_of "$ITL")

# Every open stream is a descriptor in the client and one or two in each hop.
ulimit -n "$(ulimit -Hn)"
max_open=0
for n in $OPEN; do if ((n > max_open)); then max_open=$n; fi; done
((2 * max_open + 200 <= $(ulimit -n))) || die "OPEN up to $max_open needs more descriptors than ulimit -n ($(ulimit -n))"

ensure_stack_tools
if [[ " $TARGETS " == *" smg "* && ! -x $SMG_BIN ]]; then
  log "skipping smg: $SMG_BIN missing"
  TARGETS=${TARGETS//smg/}
fi
build_release
check_ports_free
port_free "$SMG_ADDR" || die "$SMG_ADDR already in use (set PORT_BASE)"
mkdir -p "$OUT"

SIM_ARGS="--ttft $TTFT --itl $ITL --max-concurrency 0 --max-waiting 100000 $SIM_ARGS"
OUTPUT_TOKENS=$TOKENS

stream_check() { # label base-url
  local body="$WORK/check-body.json"
  printf '{"model":"%s","messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":4}' "$MODEL" >"$body"
  curl -sN --max-time 30 -X POST -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $BENCH_API_KEY" --data-binary "@$body" \
    "$2/v1/chat/completions" >"$WORK/check.sse" || true
  grep -q '^data: \[DONE\]' "$WORK/check.sse" || { head -c 2000 "$WORK/check.sse" >&2; die "$1: no [DONE] in the check stream"; }
  log "$1: check stream $(grep -c '^data:' "$WORK/check.sse") SSE events"
}

start_router() {
  local dir="$WORK/router" args
  mkdir -p "$dir"
  args=$(router_args "$ROUTER_ARGS")
  log "starting hivenet-router ($args) and hivenet-agent (--capacity $AGENT_CAPACITY $AGENT_ARGS)"
  # shellcheck disable=SC2086 # the flags are meant to be split into words
  HIVENET_ROUTER_AUDIT_LOG_PATH="$dir/audit.jsonl" start_bg router "$WORK/router.log" \
    "$BIN/hivenet-router" --http-port "$ROUTER_HTTP" --grpc-port "$ROUTER_GRPC" \
    --metrics-port "$ROUTER_METRICS" --p2p-port "$ROUTER_P2P" --identity-path "$dir/router.key" \
    --max-client-connections $((max_open * 2 + 1000)) $args
  wait_until 30 "hivenet-router" curl -s "http://$ROUTER_HTTP/v1/models"
  # shellcheck disable=SC2086
  start_bg agent "$WORK/agent.log" "$BIN/hivenet-agent" --backend-url "http://$SIM_ADDR" \
    --router-grpc "$ROUTER_GRPC" --identity-path "$dir/agent.key" --capacity "$AGENT_CAPACITY" \
    $AGENT_ARGS
  wait_until 30 "the agent's model on the router" \
    bash -c "curl -sf -H 'Authorization: Bearer $BENCH_API_KEY' 'http://$ROUTER_HTTP/v1/models' | grep -q '\"$MODEL\"'"
}

start_smg() {
  log "starting SMG $("$SMG_BIN" --version 2>/dev/null || echo '?') (round_robin, one worker) on $SMG_ADDR"
  # shellcheck disable=SC2086
  start_bg smg "$WORK/smg.log" "$SMG_BIN" launch --host "$HOST" --port "${SMG_ADDR##*:}" \
    --worker-urls "http://$SIM_ADDR" --policy round_robin --prometheus-host "$HOST" \
    --prometheus-port "$SMG_METRICS_PORT" --disable-tokenizer-autoload \
    --max-concurrent-requests 0 --disable-worker-overload-protection $SMG_ARGS
  wait_until 60 "SMG" bash -c "curl -sf 'http://$SMG_ADDR/v1/models' | grep -q '\"$MODEL\"'"
  alive smg || die "SMG exited"
}

stop_smg() {
  # SMG ends on SIGINT; it ignores SIGTERM for 5 s
  if alive smg; then
    kill -INT "${PID[smg]}" 2>/dev/null || true
    for _ in $(seq 1 30); do alive smg || break; sleep 0.1; done
  fi
  stop_proc smg
}

pids_of() { # pid -> the pid and its children, comma-separated
  local list=$1 c
  for c in $(pgrep -P "$1" || true); do list+=",$c"; done
  echo "$list"
}

RUNS=()
# warm-up, ramp, hold, drain and settle of one level
RUN_TIMEOUT=$((2 * SETTLE + HOLD + DRAIN + 90))

# One level against one target, on a stack started for it (an allocator keeps what a smaller level
# freed: the next level's growth over its idle reading would hide it).
run_level() { # target level
  local t=$1 n=$2 addr procs label
  log "==== target $t, $n open streams"
  start_sim
  case $t in
    sim)
      addr=$SIM_ADDR label="sim direct"
      procs="sim:${PID[sim]}"
      ;;
    router)
      start_router
      addr=$ROUTER_HTTP label="router → agent → sim"
      procs="router:${PID[router]} agent:${PID[agent]} sim:${PID[sim]}"
      ;;
    nginx2)
      # lib.sh's template with room for every stream's four connections (client, hop, hop,
      # sim) on two workers: its 8192 a worker run out past ~3,500 open streams
      mkdir -p "$WORK/tmpl"
      sed "s/worker_connections 8192;/worker_connections $NGINX_WORKER_CONNECTIONS;/" \
        "$PERF/nginx.conf.tmpl" >"$WORK/tmpl/nginx.conf.tmpl"
      PERF=$WORK/tmpl start_nginx
      addr=$NGINX2_STREAM label="nginx → nginx → sim"
      procs="nginx:$(nginx_pids | paste -sd, -) sim:${PID[sim]}"
      ;;
    smg)
      start_smg
      addr=$SMG_ADDR label="SMG → sim"
      procs="smg:$(pids_of "${PID[smg]}") sim:${PID[sim]}"
      ;;
    *) die "unknown target $t" ;;
  esac
  stream_check "$label" "http://$addr"
  log "$t: processes on the path: $procs"
  timeout "$RUN_TIMEOUT" python3 "$PERF/llm_load.py" run --addr "$addr" --target "$t" \
    --label "$label" --procs "$procs" --levels "$n" --hold "$HOLD" --drain "$DRAIN" \
    --settle "$SETTLE" --ttft-ms "$TTFT_MS" --itl-ms "$ITL_MS" --tokens "$TOKENS" \
    --prompt-bytes "$PROMPT_BYTES" --out "$OUT/$t-$n.json"
  RUNS+=("$OUT/$t-$n.json")
  case $t in
    router)
      alive router || log "WARNING: the router exited"
      stop_proc agent
      stop_proc router
      wait_until 20 "the router's ports to be released" port_free "$ROUTER_HTTP"
      ;;
    nginx2) stop_proc nginx ;;
    smg) stop_smg ;;
  esac
  stop_proc sim
}

for t in $TARGETS; do
  for n in $OPEN; do run_level "$t" "$n"; done
done

header="LLM-shaped load, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); sim --ttft $TTFT --itl $ITL --output-tokens $TOKENS, prompts ~$PROMPT_BYTES B; levels $OPEN, $HOLD s measured each; router --shards $SHARDS $ROUTER_ARGS, agent --capacity $AGENT_CAPACITY; nginx $NGINX_WORKERS workers; loadavg at the end $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$PERF/llm_load.py" report --md "$OUT/summary.md" --json-out "$OUT/all.json" \
  --header "$header" --sim-ttft-ms "$TTFT_MS" --sim-itl-ms "$ITL_MS" "${RUNS[@]}"
# the plot is a convenience: without matplotlib (e.g. offline) the run still succeeds
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  log "installing matplotlib (pip)"
  python3 -m pip install --quiet --disable-pip-version-check matplotlib ||
    log "WARNING: matplotlib could not be installed; no plot.png"
fi
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$PERF/llm_load.py" plot --out "$OUT/plot.png" --sim-ttft-ms "$TTFT_MS" \
    --sim-itl-ms "$ITL_MS" "${RUNS[@]}" || log "WARNING: plot.png could not be drawn"
fi
{
  echo "$header"
  echo "binaries: $BIN"
  echo "smg: $([[ " $TARGETS " == *" smg "* ]] && "$SMG_BIN" --version 2>/dev/null || echo skipped)"
  echo "nproc: $NPROC; $(grep -m1 'model name' /proc/cpuinfo)"
} >"$OUT/run.txt"
# the last level's logs, their last 200 lines (SMG logs every request: megabytes a level)
mkdir -p "$OUT/logs"
for f in "$WORK"/*.log "$WORK"/nginx/nginx-error.log; do
  if [[ -f $f ]]; then tail -n 200 "$f" >"$OUT/logs/$(basename "$f")"; fi
done
log "results in $OUT (summary.md, all.json, plot.png, one JSON per target, run.txt, logs/)"
