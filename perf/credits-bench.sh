#!/usr/bin/env bash
# Benchmark of occupancy credits (docs/several-routers.md, "Occupancy credits"): one router with
# a B2 budget on the sim's model, the budget shared through a real Valkey (--sync-store valkey)
# or not (--sync-store none), under constant arrival rates (perf/load.sh, open loop).
#
# Measures, in one run and side by side:
#   1. store commands per second at each rate (Valkey's INFO commandstats, all commands): with
#      warm wallets this should not grow with the request rate;
#   2. latency (p50, p99) with credits against without, at the same rates: what the wallets add
#      to admission (no request should wait on the store).
#
# Environment: RATES="200 1000"  DURATION=5  INTERVAL=1s  SKIP_BUILD=0  KEEP_TMP=0  PORT_BASE=25000
#              and perf/lib.sh's (SHARDS, OUTPUT_TOKENS, ...).
set -Eeuo pipefail

LOG_TAG=credits-bench
PORT_BASE=${PORT_BASE:-25000}
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RATES=${RATES:-200 1000}
DURATION=${DURATION:-5}
INTERVAL=${INTERVAL:-1s}

# Commands the store has run so far (every command of INFO commandstats).
store_calls() {
  valkey INFO commandstats | awk -F'[=,]' '/^cmdstat_/ { sum += $2 } END { print sum + 0 }'
}

ensure_stack_tools
build_release
check_ports_free
start_valkey
# A store the site has used before: no first-deployment settle window.
valkey SET 'hivenet:{default}:epoch' 1-credits-bench >/dev/null

# The model's B2 budget, far above the load: every request is admitted, through credits.
mkdir -p "$WORK/policies"
printf 'models:\n  - %s\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: 100000\nadmit_budget_tokens: 100000000\n' \
  "$MODEL" >"$WORK/policies/$MODEL.yaml"

start_sim
results="$WORK/results.txt"
: >"$results"
index=0
for variant in none valkey; do
  args="--policy-model-dir $WORK/policies --sync-store $variant"
  if [[ $variant == valkey ]]; then
    args+=" --sync-valkey-addrs 127.0.0.1:$VALKEY_PORT --sync-interval $INTERVAL --sync-min-routers 1"
  fi
  start_router_stack "$args" "$index"
  check_endpoint "router (sync-store $variant)" "http://$ROUTER_HTTP"
  for rate in $RATES; do
    before=$(store_calls)
    out="$WORK/load-$variant-$rate"
    "$PERF/load.sh" --url "http://$ROUTER_HTTP" --api-key "$BENCH_API_KEY" --model "$MODEL" \
      --kind json --rates "$rate" --duration "$DURATION" --out "$out" >"$out.log" 2>&1 \
      || { cat "$out.log" >&2; die "load.sh failed"; }
    after=$(store_calls)
    python3 - "$out/steps.json" "$variant" "$rate" "$before" "$after" "$DURATION" >>"$results" <<'PY'
import json, sys
steps, variant, rate, before, after, duration = sys.argv[1:]
step = json.load(open(steps))["steps"][0]
def get(*names):
    for name in names:
        if name in step:
            return step[name]
    return float("nan")
calls = (int(after) - int(before)) / float(duration)
print(f"{variant:7} {rate:>6} {get('achieved_rps'):>9.0f} {get('p50_ms'):>8.2f} {get('p99_ms'):>8.2f} "
      f"{calls:>10.1f}")
PY
  done
  if [[ $variant == valkey ]]; then
    curl -s "http://$ROUTER_METRICS/metrics" | grep -E '^hivenet_occupancy_credit_seconds_count|^hivenet_occupancy_credit_errors_total|^hivenet_admission_reaped_total' \
      >"$WORK/credit-metrics.txt" || true
  fi
  stop_router_stack
  index=$((index + 1))
done

echo
echo "store     rate  achieved  p50 ms   p99 ms  store cmd/s"
cat "$results"
echo
echo "credit metrics after the run (sync-store valkey):"
cat "$WORK/credit-metrics.txt"
