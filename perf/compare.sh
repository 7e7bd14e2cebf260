#!/usr/bin/env bash
# Latency-throughput comparison on this machine: open-loop rate steps (perf/load.sh, oha) against
# nginx one hop (nginx -> sim), nginx two hops (nginx -> nginx -> sim) and the router (router ->
# agent -> sim), JSON and stream, then one PNG of p50 and p99 against the offered rate
# (perf/plot.py). The stack is perf/bench.sh's (perf/lib.sh). See perf/README.md.
#
# Environment (all optional; perf/lib.sh lists the stack's: SHARDS, SIM_THREADS, OUTPUT_TOKENS,
# NGINX_WORKERS, AGENT_ARGS, PORT_BASE, SKIP_BUILD, SKIP_INSTALL, KEEP_TMP):
#   RATES="2500 5000 7500 10000 15000 20000"  offered requests/s, one step each (JSON)
#   STREAM_RATES=$RATES            the same for streams
#   DURATION=5         seconds per step                 CASES="json stream"
#   CONNECTIONS=128    oha connections (most requests in flight; few, so that opening them
#                      does not weigh on p99: about rate x latency are needed)
#   PROBE_RATE=20      requests/s of the reading probe (error codes, TTFT, ITL)
#   ROUTER_ARGS=""     extra router flags (one configuration)
#   OUT=perf/results/compare-latest   where steps.json/csv of each target and plot.png go
set -Eeuo pipefail

LOG_TAG=compare
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RATES=${RATES:-2500 5000 7500 10000 15000 20000}
STREAM_RATES=${STREAM_RATES:-$RATES}
DURATION=${DURATION:-5}
CASES=${CASES:-json stream}
CONNECTIONS=${CONNECTIONS:-128}
PROBE_RATE=${PROBE_RATE:-20}
ROUTER_ARGS=${ROUTER_ARGS:-}
OUT=${OUT:-$PERF/results/compare-latest}
TIMEOUT_S=10
PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin

ensure_stack_tools
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  log "installing matplotlib (pip)"
  python3 -m pip install --quiet --disable-pip-version-check matplotlib
fi
# perf/load.sh installs oha and httpx when missing; --help runs nothing else.
"$PERF/load.sh" --help >/dev/null
build_release
check_ports_free
start_sim
start_nginx
check_endpoint nginx "http://$NGINX_JSON"
check_endpoint "nginx 2 hops" "http://$NGINX2_JSON"

rm -rf "$OUT"
mkdir -p "$OUT"
STEPS_FILES=()

load_steps() { # label base-url kind
  local label=$1 url=$2 kind=$3 rates=$RATES n
  [[ $kind == stream ]] && rates=$STREAM_RATES
  n=$(wc -w <<<"$rates")
  log "[$label $kind] rate steps: $rates req/s, ${DURATION}s each"
  # Bounded: each step lasts DURATION plus at most TIMEOUT_S for answers in flight.
  timeout $((n * (DURATION + TIMEOUT_S + 40) + 60)) "$PERF/load.sh" --url "$url" \
    --api-key "$BENCH_API_KEY" --model "$MODEL" --kind "$kind" --rates "$rates" \
    --duration "$DURATION" --connections "$CONNECTIONS" --probe-rate "$PROBE_RATE" \
    --timeout "$TIMEOUT_S" --label "$label" --out "$OUT/$label-$kind" \
    | tee -a "$OUT/summary.txt"
  STEPS_FILES+=("$OUT/$label-$kind/steps.json")
}

# The router stack runs from the start (idle while nginx is measured: its idle CPU is a few %),
# so that the three targets of one kind are measured back to back: on a shared machine the load
# of other work drifts over minutes.
start_router_stack "$ROUTER_ARGS" 0
check_endpoint router "http://$ROUTER_HTTP"
for kind in $CASES; do
  url1="http://$NGINX_JSON" url2="http://$NGINX2_JSON"
  [[ $kind == stream ]] && url1="http://$NGINX_STREAM" url2="http://$NGINX2_STREAM"
  load_steps nginx-1hop "$url1" "$kind"
  load_steps nginx-2hops "$url2" "$kind"
  load_steps router "http://$ROUTER_HTTP" "$kind"
done
stop_router_stack

python3 "$PERF/plot.py" --out "$OUT/plot.png" \
  --title "hivenet-router vs nginx, open loop, ${DURATION}s per step, $NPROC CPUs, router $(router_args "$ROUTER_ARGS")" \
  "${STEPS_FILES[@]}"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "oha: $(oha --version 2>/dev/null || echo unknown)"
  echo "router args: $(router_args "$ROUTER_ARGS")"
  echo "rates: json $RATES; stream $STREAM_RATES; ${DURATION}s per step; $CONNECTIONS connections; probe $PROBE_RATE req/s"
  echo "loadavg at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/run.txt"
log "results in $OUT (plot.png, */steps.json, */steps.csv, summary.txt, run.txt)"
