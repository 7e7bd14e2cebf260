#!/usr/bin/env bash
# Prefix-cache-aware routing against least-loaded, one and two routers, and SGLang's model gateway
# (SMG, cache_aware): four simulated replicas with prefix caches (hivenet-sim), a seeded chat
# workload of long shared prefixes plus one-shot prompts (perf/prefix.py), open loop. Per variant
# and workload: requests, ok, errors, req/s, TTFT p50/p99, the replicas' prefix-cache hit rate,
# the router's CPU per request, the router's prefix-index hits/misses. See perf/README.md.
#
# Variants (VARIANTS, run in this order; every run starts on freshly started sims: cold caches):
#   A  one router, `routing_policy: {strategy: least-loaded}`, 4 agents -> 4 sims
#   B  one router, `routing_policy: {strategy: prefix-aware}`, 4 agents -> 4 sims
#   C  two routers, both prefix-aware, every agent connected to both (--routers a,b); each request
#      goes to one of them at random (a load balancer without stickiness)
#   D  SMG (`smg launch --policy cache_aware`) straight to the 4 sims, no agents
# NOSHARE_VARIANTS run again with ONE_SHOT=1.0 (nothing shared), workload "noshare".
#
# Environment (all optional; perf/lib.sh lists the stack's: SKIP_BUILD, SKIP_INSTALL, KEEP_TMP):
#   RATE=40            arrivals per second (open loop)     DURATION=30  seconds per run
#   SEED=1             the workload's seed (the same sequence for every variant)
#   CONVERSATIONS=24   conversations at once               TURNS=6      turns per conversation
#   ONE_SHOT=0.3       fraction of one-shot prompts        SYSTEM_BYTES=6144  ONE_SHOT_BYTES=2048
#   MAX_IN_FLIGHT=512  requests open at most (beyond: skipped, counted)
#   IDLE_S=3           seconds of the routers' CPU read idle before each run (idle_cpu_pct)
#   TIMEOUT_S=30       seconds a request may take
#   VARIANTS="A B C D" NOSHARE_VARIANTS="A B"
#   REPLICAS=4         sims (and agents)               AGENT_CAPACITY=32  each agent's --capacity
#   SIM_ARGS="--prefix-cache-blocks 4096 --block-tokens 16 --prefill-per-token 1ms --ttft 5ms
#            --itl 5ms --output-tokens 8"   the sims' flags (beside --listen, --models)
#   ROUTER_ARGS=""     extra flags of every hivenet-router (e.g. '--prefix-cache-threshold 0.5')
#   SHARDS=2           router --shards
#   SMG_BIN=/tmp/smg-venv/bin/smg   SMG's entry point; SKIP_SMG=1 skips D (the default when
#                      SMG_BIN is missing and SMG_INSTALL=0); SMG_INSTALL=0: 1 creates the venv
#                      (python3 -m venv, pip install "smg==$SMG_VERSION") when SMG_BIN is missing
#   SMG_VERSION=1.13.*  SMG_ARGS=""  extra smg flags
#   PORT_BASE=27000    ports: +80/+81 routers' http, +51/+52 grpc, +12/+13 metrics, +900/+901
#                      tunnels, +888.. sims, +300 SMG, +301 SMG's metrics
#   OUT=perf/results/prefix-<UTC timestamp>   rows.json, rows.csv, table.txt, run.txt, the logs
set -Eeuo pipefail

PORT_BASE=${PORT_BASE:-27000}
LOG_TAG=prefix
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RATE=${RATE:-40}
DURATION=${DURATION:-30}
SEED=${SEED:-1}
CONVERSATIONS=${CONVERSATIONS:-24}
TURNS=${TURNS:-6}
ONE_SHOT=${ONE_SHOT:-0.3}
SYSTEM_BYTES=${SYSTEM_BYTES:-6144}
ONE_SHOT_BYTES=${ONE_SHOT_BYTES:-2048}
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-512}
TIMEOUT_S=${TIMEOUT_S:-30}
IDLE_S=${IDLE_S:-3}
VARIANTS=${VARIANTS:-A B C D}
NOSHARE_VARIANTS=${NOSHARE_VARIANTS-A B}
REPLICAS=${REPLICAS:-4}
AGENT_CAPACITY=${AGENT_CAPACITY:-32}
SIM_ARGS=${SIM_ARGS:---prefix-cache-blocks 4096 --block-tokens 16 --prefill-per-token 1ms --ttft 5ms --itl 5ms --output-tokens 8}
ROUTER_ARGS=${ROUTER_ARGS:-}
SMG_BIN=${SMG_BIN:-/tmp/smg-venv/bin/smg}
SMG_INSTALL=${SMG_INSTALL:-0}
SMG_VERSION=${SMG_VERSION:-1.13.*}
SMG_ARGS=${SMG_ARGS:-}
OUT=${OUT:-$PERF/results/prefix-$(date -u +%Y%m%dT%H%M%SZ)}
export SEED CONVERSATIONS TURNS SYSTEM_BYTES ONE_SHOT_BYTES MAX_IN_FLIGHT TIMEOUT_S IDLE_S

SMG_ADDR=$HOST:$((PORT_BASE + 300))
SMG_METRICS_PORT=$((PORT_BASE + 301))
router_http() { echo "$HOST:$((PORT_BASE + 80 + $1))"; }
router_grpc() { echo "$HOST:$((PORT_BASE + 51 + $1))"; }
router_metrics() { echo "$HOST:$((PORT_BASE + 12 + $1))"; }
router_p2p() { echo $((PORT_BASE + 900 + $1)); }
sim_addr() { echo "$HOST:$((PORT_BASE + 888 + $1))"; }

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------
ensure_pkg curl curl
if ! python3 -c 'import httpx' 2>/dev/null; then
  log "installing httpx (pip)"
  python3 -m pip install --quiet --disable-pip-version-check httpx
fi
if [[ " $VARIANTS " == *" D "* && ! -x $SMG_BIN && $SMG_INSTALL == 1 ]]; then
  venv=$(dirname "$(dirname "$SMG_BIN")")
  log "installing SMG ($SMG_VERSION) into $venv"
  { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "smg==$SMG_VERSION"; } >"$WORK/smg-install.log" 2>&1 \
    || log "SMG install failed (see $WORK/smg-install.log)"
fi
if [[ -z ${SKIP_SMG:-} ]]; then
  SKIP_SMG=0
  [[ -x $SMG_BIN ]] || SKIP_SMG=1
fi
if [[ $SKIP_SMG == 1 && " $VARIANTS " == *" D "* ]]; then
  log "skipping D: SMG_BIN=$SMG_BIN missing or SKIP_SMG=1 (SMG_INSTALL=1 installs it)"
  VARIANTS=${VARIANTS//D/}
fi
build_release

for i in $(seq 0 $((REPLICAS - 1))); do
  port_free "$(sim_addr "$i")" || die "$(sim_addr "$i") already in use (set PORT_BASE)"
done
for i in 0 1; do
  for addr in "$(router_http "$i")" "$(router_grpc "$i")" "$(router_metrics "$i")" \
    "$HOST:$(router_p2p "$i")"; do
    port_free "$addr" || die "$addr already in use (set PORT_BASE)"
  done
done
port_free "$SMG_ADDR" || die "$SMG_ADDR already in use (set PORT_BASE)"

mkdir -p "$OUT"
for s in least-loaded prefix-aware; do
  mkdir -p "$WORK/policy-$s"
  printf 'routing_policy: {strategy: %s}\n' "$s" >"$WORK/policy-$s/_default.yaml"
done

# ---------------------------------------------------------------------------------------------
# The stack
# ---------------------------------------------------------------------------------------------
start_sims() { # run
  local i
  for i in $(seq 0 $((REPLICAS - 1))); do
    # shellcheck disable=SC2086 # the flags are meant to be split into words
    start_bg "sim$i" "$WORK/$1-sim$i.log" "$BIN/hivenet-sim" --listen "$(sim_addr "$i")" \
      --models "$MODEL" --threads "$SIM_THREADS" $SIM_ARGS
  done
  for i in $(seq 0 $((REPLICAS - 1))); do
    wait_until 20 "hivenet-sim $i" curl -sf "http://$(sim_addr "$i")/v1/models"
  done
}

router_agents() { # index -> the number of agents the router lists
  curl -sf "http://$(router_metrics "$1")/metrics" | grep -c '^hivenet_routing_agent_info{' || true
}

all_agents_on() { # index
  [[ $(router_agents "$1") -ge $REPLICAS ]]
}

start_routers() { # run strategy count
  local run=$1 strategy=$2 n=$3 i dir routers=""
  for i in $(seq 0 $((n - 1))); do
    dir="$WORK/$run-router$i"
    mkdir -p "$dir"
    log "[$run] starting hivenet-router $i ($strategy, --shards $SHARDS $ROUTER_ARGS)"
    # shellcheck disable=SC2086 # the flags are meant to be split into words
    HIVENET_ROUTER_AUDIT_LOG_PATH="$dir/audit.jsonl" start_bg "router$i" "$WORK/$run-router$i.log" \
      "$BIN/hivenet-router" --http-port "$(router_http "$i")" --grpc-port "$(router_grpc "$i")" \
      --metrics-port "$(router_metrics "$i")" --p2p-port "$(router_p2p "$i")" \
      --identity-path "$dir/router.key" --shards "$SHARDS" --queue-depth 1000 \
      --policy-model-dir "$WORK/policy-$strategy" $ROUTER_ARGS
    routers+="${routers:+,}$(router_grpc "$i")"
  done
  for i in $(seq 0 $((n - 1))); do
    wait_until 30 "hivenet-router $i" curl -s "http://$(router_http "$i")/v1/models"
  done
  for i in $(seq 0 $((REPLICAS - 1))); do
    # shellcheck disable=SC2086
    start_bg "agent$i" "$WORK/$run-agent$i.log" "$BIN/hivenet-agent" \
      --backend-url "http://$(sim_addr "$i")" --routers "$routers" \
      --identity-path "$WORK/$run-router0/agent$i.key" --capacity "$AGENT_CAPACITY" $AGENT_ARGS
  done
  for i in $(seq 0 $((n - 1))); do
    wait_until 45 "$REPLICAS agents on router $i" all_agents_on "$i"
    curl -sf "http://$(router_http "$i")/v1/models" | grep -q "\"$MODEL\"" \
      || die "router $i does not list $MODEL"
  done
}

start_smg() { # run
  local run=$1 workers=() i
  for i in $(seq 0 $((REPLICAS - 1))); do workers+=("http://$(sim_addr "$i")"); done
  log "[$run] starting SMG $("$SMG_BIN" --version 2>/dev/null || echo "$SMG_VERSION") (cache_aware) on $SMG_ADDR"
  # shellcheck disable=SC2086
  start_bg smg "$WORK/$run-smg.log" "$SMG_BIN" launch --host "$HOST" --port "${SMG_ADDR##*:}" \
    --worker-urls "${workers[@]}" --policy cache_aware --cache-threshold 0.3 \
    --balance-abs-threshold 64 --balance-rel-threshold 1.5 --prometheus-host "$HOST" \
    --prometheus-port "$SMG_METRICS_PORT" --disable-tokenizer-autoload $SMG_ARGS
  wait_until 60 "SMG" bash -c "curl -sf 'http://$SMG_ADDR/v1/models' | grep -q '\"$MODEL\"'"
  alive smg || die "SMG exited"
}

stop_run() {
  local name
  # SMG ends on SIGINT (Ctrl-C); it ignores SIGTERM for 5 s
  if alive smg; then
    kill -INT "${PID[smg]}" 2>/dev/null || true
    for _ in $(seq 1 30); do alive smg || break; sleep 0.1; done
  fi
  for name in smg agent0 agent1 agent2 agent3 router0 router1; do stop_proc "$name"; done
  for name in "${!PID[@]}"; do [[ $name == agent* ]] && stop_proc "$name"; done
  for name in "${!PID[@]}"; do [[ $name == sim* ]] && stop_proc "$name"; done
}

# One stream through the front, read whole: the stack answers before the measured run.
check_stream() { # label base-url
  local body="$WORK/check-body.json"
  printf '{"model":"%s","messages":[{"role":"user","content":"hello"}],"stream":true}' "$MODEL" >"$body"
  curl -sN --max-time 20 -X POST -H 'Content-Type: application/json' --data-binary "@$body" \
    "$2/v1/chat/completions" >"$WORK/check.sse" || true
  grep -q '^data: \[DONE\]' "$WORK/check.sse" || { cat "$WORK/check.sse" >&2; die "$1: no [DONE] in the check stream"; }
}

ROWS=()
RUN_TIMEOUT=$((DURATION + TIMEOUT_S + 60))

# variant workload one-shot
run_variant() {
  local variant=$1 workload=$2 one_shot=$3 run="$1-$2" urls="" metrics="" pids="" i n=1 sims=""
  log "==== variant $variant, workload $workload (ONE_SHOT=$one_shot)"
  start_sims "$run"
  for i in $(seq 0 $((REPLICAS - 1))); do sims+="${sims:+,}http://$(sim_addr "$i")/metrics"; done
  case $variant in
    A) start_routers "$run" least-loaded 1 ;;
    B) start_routers "$run" prefix-aware 1 ;;
    C) n=2; start_routers "$run" prefix-aware 2 ;;
    D) start_smg "$run" ;;
    *) die "unknown variant $variant" ;;
  esac
  if [[ $variant == D ]]; then
    urls="http://$SMG_ADDR"
    pids=${PID[smg]}
    check_stream SMG "$urls"
  else
    for i in $(seq 0 $((n - 1))); do
      urls+="${urls:+,}http://$(router_http "$i")"
      metrics+="${metrics:+,}http://$(router_metrics "$i")/metrics"
      pids+="${pids:+,}${PID[router$i]}"
      check_stream "router $i" "http://$(router_http "$i")"
    done
  fi
  timeout "$RUN_TIMEOUT" python3 "$PERF/prefix.py" run --urls "$urls" --variant "$variant" \
    --workload "$workload" --rate "$RATE" --duration "$DURATION" --one-shot "$one_shot" \
    --sim-metrics "$sims" --router-metrics "$metrics" --pids "$pids" \
    --row-out "$OUT/row-$run.json"
  ROWS+=("$OUT/row-$run.json")
  if [[ -n $metrics ]]; then
    for i in $(seq 0 $((n - 1))); do
      curl -sf "http://$(router_metrics "$i")/metrics" \
        | grep -E '^hivenet_prefix_|^hivenet_routing_requests_failed_total' \
        | sed "s/^/[$run router$i] /" >>"$OUT/router-metrics.txt" || true
    done
  fi
  for i in $(seq 0 $((REPLICAS - 1))); do
    curl -sf "http://$(sim_addr "$i")/metrics" | grep -E '^vllm:(prefix_cache|num_requests)' \
      | sed "s/^/[$run sim$i] /" >>"$OUT/sim-metrics.txt" || true
  done
  for i in $(seq 0 $((n - 1))); do
    alive "router$i" || [[ $variant == D ]] || log "WARNING: router $i exited during $run"
  done
  stop_run
}

for v in $VARIANTS; do run_variant "$v" mixed "$ONE_SHOT"; done
for v in $NOSHARE_VARIANTS; do run_variant "$v" noshare 1.0; done

python3 "$PERF/prefix.py" table --out "$OUT" "${ROWS[@]}" | tee "$OUT/table.txt"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "smg: $([[ $SKIP_SMG == 1 ]] && echo skipped || "$SMG_BIN" --version 2>/dev/null || echo unknown)"
  echo "rate $RATE/s for ${DURATION}s, seed $SEED, $CONVERSATIONS conversations x $TURNS turns, one-shot $ONE_SHOT"
  echo "sim: $SIM_ARGS; agents: --capacity $AGENT_CAPACITY $AGENT_ARGS; router: --shards $SHARDS $ROUTER_ARGS"
  echo "loadavg at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/run.txt"
mkdir -p "$OUT/logs"
cp "$WORK"/*.log "$OUT/logs/" 2>/dev/null || true
log "results in $OUT (table.txt, rows.json, rows.csv, run.txt, router-metrics.txt, sim-metrics.txt, logs/)"
