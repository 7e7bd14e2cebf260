#!/usr/bin/env bash
# Benchmark: hivenet-router (router -> agent -> sim) against nginx, one hop (nginx -> sim) and two
# hops (nginx -> nginx -> sim, the shape of router -> agent -> engine), same load generator, same
# concurrency, same simulated engine. See perf/README.md. The stack comes from perf/lib.sh.
#
# Environment (all optional; perf/lib.sh lists the stack's: SHARDS, SIM_THREADS, OUTPUT_TOKENS,
# NGINX_WORKERS, NGINX_ACCESS_LOG, AGENT_ARGS, PORT_BASE, SKIP_BUILD, SKIP_INSTALL, KEEP_TMP):
#   DURATION=10        seconds per measurement          WARMUP=2      seconds of warm-up per case
#   CONNECTIONS=64     concurrent connections            WRK_THREADS=2 load-generator threads
#   ROUTER_ARGS=""     extra router flags; several configurations separated by '|' are measured
#                      one after the other in the same run, e.g. ROUTER_ARGS='|--shards 1', or
#                      ROUTER_ARGS='|--auth-config-file perf/auth-bench.yaml' (auth + limits);
#                      a variant starting with '@DIR ' runs DIR/hivenet-router instead, and
#                      DIR/hivenet-agent when DIR has one (before vs after: ROUTER_ARGS='@/tmp/before|'
#                      with an older build saved in /tmp/before); flags after ' -- ' in a
#                      variant go to its agent: ROUTER_ARGS='--shards 1|--shards 1 -- --worker-threads 2'
#   CASES="json stream"  which request kinds to measure
#   NGINX_HOPS="1 2"   which nginx baselines to measure (1: nginx -> sim, 2: nginx -> nginx -> sim)
#   RESULTS=perf/results/latest.json   where the JSON goes
set -Eeuo pipefail

LOG_TAG=bench
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-64}
WRK_THREADS=${WRK_THREADS:-2}
ROUTER_ARGS=${ROUTER_ARGS:-}
CASES=${CASES:-json stream}
NGINX_HOPS=${NGINX_HOPS:-1 2}
RESULTS=${RESULTS:-$PERF/results/latest.json}

ensure_stack_tools
ensure_pkg wrk wrk
build_release
check_ports_free
start_sim
start_nginx

# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------
declare -A R=()      # "<case>.<field>" -> value
CASE_IDS=()

# run_wrk url body seconds -> sets WRK_* from the result line
run_wrk() {
  local url=$1 body=$2 secs=$3 out="$WORK/wrk.out"
  WRK_BODY_FILE=$body timeout $((secs + 30)) wrk -t "$WRK_THREADS" -c "$CONNECTIONS" \
    -d "${secs}s" --timeout 10s -s "$PERF/wrk-post.lua" "$url/v1/chat/completions" >"$out" 2>&1 &
  PID[wrk]=$!
  wait "${PID[wrk]}" || { cat "$out" >&2; unset "PID[wrk]"; die "wrk failed"; }
  unset "PID[wrk]"
  local line
  line=$(grep '^WRK_RESULT ' "$out") || { cat "$out" >&2; die "no result from wrk"; }
  local kv
  for kv in ${line#WRK_RESULT }; do
    printf -v "WRK_${kv%%=*}" '%s' "${kv#*=}"
  done
}

# shellcheck disable=SC2154 # WRK_* are set by run_wrk through printf -v
measure() { # id label target(router|nginx) kind(json|stream) url
  local id=$1 label=$2 target=$3 kind=$4 url=$5 body
  body=$JSON_BODY
  [[ $kind == stream ]] && body=$STREAM_BODY
  log "[$label] warm-up ${WARMUP}s"
  if ((WARMUP > 0)); then run_wrk "$url" "$body" "$WARMUP"; fi
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  log "[$label] measuring ${DURATION}s, $CONNECTIONS connections (loadavg $load)"

  local r0 a0 n0 s0 j0 c0 t0 r1 a1 n1 s1 j1 c1 t1 rk0 nk0 rk1 nk1
  r0=$(proc_ticks "${PID[router]:-0}"); a0=$(proc_ticks "${PID[agent]:-0}")
  n0=$(nginx_ticks); s0=$(proc_ticks "${PID[sim]}")
  rk0=$(proc_sys_ticks "${PID[router]:-0}"); nk0=$(nginx_ticks proc_sys_ticks)
  read -r j0 t0 < <(cpu_jiffies); children_cpu >"$WORK/c0"; c0=$(<"$WORK/c0")
  run_wrk "$url" "$body" "$DURATION"
  r1=$(proc_ticks "${PID[router]:-0}"); a1=$(proc_ticks "${PID[agent]:-0}")
  n1=$(nginx_ticks); s1=$(proc_ticks "${PID[sim]}")
  rk1=$(proc_sys_ticks "${PID[router]:-0}"); nk1=$(nginx_ticks proc_sys_ticks)
  read -r j1 t1 < <(cpu_jiffies); children_cpu >"$WORK/c1"; c1=$(<"$WORK/c1")
  alive sim || die "sim died during $label"

  local reqs=$WRK_requests secs
  ((reqs > 0)) || die "[$label] no request completed"
  secs=$(calc "$WRK_duration_us / 1000000" 3)
  local errs=$((WRK_err_connect + WRK_err_read + WRK_err_write + WRK_err_status + WRK_err_timeout))
  # per-request CPU in microseconds: ticks * 1e6 / CLK_TCK / requests
  local per="1000000 / $CLK_TCK / $reqs"
  R[$id.label]=$label; R[$id.target]=$target; R[$id.kind]=$kind
  R[$id.requests]=$reqs; R[$id.seconds]=$secs; R[$id.errors]=$errs
  R[$id.err_status]=$WRK_err_status; R[$id.err_timeout]=$WRK_err_timeout
  R[$id.rps]=$(calc "$reqs / $secs" 1)
  R[$id.p50_us]=$WRK_p50_us; R[$id.p90_us]=$WRK_p90_us; R[$id.p99_us]=$WRK_p99_us
  R[$id.max_us]=$WRK_max_us
  R[$id.mb_per_s]=$(calc "$WRK_bytes / $secs / 1000000" 2)
  if [[ $target == router ]]; then
    R[$id.router_us_per_req]=$(calc "($r1 - $r0) * $per" 2)
    R[$id.agent_us_per_req]=$(calc "($a1 - $a0) * $per" 2)
    R[$id.proxy_us_per_req]=$(calc "($r1 - $r0 + $a1 - $a0) * $per" 2)
    R[$id.proxy_sys_us_per_req]=$(calc "($rk1 - $rk0) * $per" 2)
    R[$id.nginx_us_per_req]=null
    R[$id.router_cores]=$(calc "($r1 - $r0) / $CLK_TCK / $secs" 2)
    R[$id.agent_cores]=$(calc "($a1 - $a0) / $CLK_TCK / $secs" 2)
  else
    R[$id.router_us_per_req]=null; R[$id.agent_us_per_req]=null
    R[$id.nginx_us_per_req]=$(calc "($n1 - $n0) * $per" 2)
    R[$id.proxy_us_per_req]=${R[$id.nginx_us_per_req]}
    R[$id.proxy_sys_us_per_req]=$(calc "($nk1 - $nk0) * $per" 2)
    R[$id.nginx_cores]=$(calc "($n1 - $n0) / $CLK_TCK / $secs" 2)
  fi
  R[$id.sim_us_per_req]=$(calc "($s1 - $s0) * $per" 2)
  R[$id.sim_cores]=$(calc "($s1 - $s0) / $CLK_TCK / $secs" 2)
  R[$id.wrk_cores]=$(calc "($c1 - $c0) / $secs" 2)
  R[$id.machine_busy_cores]=$(calc "($j1 - $j0) / ($t1 - $t0) * $NPROC" 2)
  # CPU used by processes outside this benchmark during the window (other builds etc.)
  R[$id.other_cores]=$(calc "($j1 - $j0) / ($t1 - $t0) * $NPROC - ($r1 - $r0 + $a1 - $a0 + $n1 - $n0 + $s1 - $s0) / $CLK_TCK / $secs - ($c1 - $c0) / $secs" 2)
  R[$id.loadavg]=$load
  CASE_IDS+=("$id")
  log "[$label] ${R[$id.rps]} req/s, p50 ${R[$id.p50_us]} us, p99 ${R[$id.p99_us]} us, errors $errs; sim ${R[$id.sim_cores]} cores, other load ${R[$id.other_cores]} cores"
  if awk "BEGIN{exit !(${R[$id.other_cores]} > 0.3)}"; then
    log "[$label] WARNING: other processes used ${R[$id.other_cores]} cores during the window: figures are disturbed"
  fi
  ((errs == 0)) || log "[$label] WARNING: $errs errors (status $WRK_err_status, timeout $WRK_err_timeout)"
  if awk "BEGIN{exit !(${R[$id.sim_cores]} >= 0.9 * $SIM_THREADS)}"; then
    log "[$label] WARNING: the sim used ${R[$id.sim_cores]} cores of its $SIM_THREADS thread(s): it may be the bottleneck"
  fi
}

SSE_EVENTS=0
check_endpoint nginx "http://$NGINX_JSON"
NGINX_SSE_EVENTS=$SSE_EVENTS
[[ " $NGINX_HOPS " != *" 2 "* ]] || check_endpoint "nginx 2 hops" "http://$NGINX2_JSON"

# Router configurations: ROUTER_ARGS split on '|'
IFS='|' read -r -a VARIANTS <<<"$ROUTER_ARGS"
((${#VARIANTS[@]} > 0)) || VARIANTS=("")
[[ $ROUTER_ARGS == *'|' ]] && VARIANTS+=("")

# nginx cases first (router not running: no idle noise from it); one hop, then two hops
for hops in $NGINX_HOPS; do
  for kind in $CASES; do
    case $hops/$kind in
      1/stream) url="http://$NGINX_STREAM" id="nginx-$kind" label="nginx 1 hop $kind" ;;
      1/*) url="http://$NGINX_JSON" id="nginx-$kind" label="nginx 1 hop $kind" ;;
      2/stream) url="http://$NGINX2_STREAM" id="nginx2-$kind" label="nginx 2 hops $kind" ;;
      2/*) url="http://$NGINX2_JSON" id="nginx2-$kind" label="nginx 2 hops $kind" ;;
      *) die "NGINX_HOPS: $hops is neither 1 nor 2" ;;
    esac
    measure "$id" "$label" nginx "$kind" "$url"
    R[$id.hops]=$hops
  done
done

ROUTER_SSE_EVENTS=0
declare -A MEM=()
for i in "${!VARIANTS[@]}"; do
  v=${VARIANTS[$i]}
  v=$(trim_blanks "$v")
  VARIANTS[i]=$v
  start_router_stack "$v" "$i"
  check_endpoint "router#$i" "http://$ROUTER_HTTP"
  ROUTER_SSE_EVENTS=$SSE_EVENTS
  for kind in $CASES; do
    measure "router$i-$kind" "router#$i $kind" router "$kind" "http://$ROUTER_HTTP"
  done
  # The router's memory once its cases ran: peak and current resident, and what it reserved
  # (buffers sized at start-up, the mesh's rings, show here before they are touched).
  for f in VmHWM VmRSS VmSize; do
    MEM[$i.$f]=$(awk -v f="$f:" '$1 == f {print $2}' "/proc/${PID[router]}/status" 2>/dev/null || true)
    MEM[$i.$f]=${MEM[$i.$f]:-null}
  done
  stop_router_stack
done

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
ratio() { # a b -> a/b or n/a
  if [[ $1 == null || $2 == null ]] || awk "BEGIN{exit !($2 == 0)}"; then echo "n/a"; else calc "$1 / $2" 2; fi
}

echo
echo "hivenet-router vs nginx: ${DURATION}s per case, $CONNECTIONS connections, wrk $WRK_THREADS threads,"
nginx_log="access log off"
[[ $NGINX_ACCESS_LOG == 1 ]] && nginx_log="JSON access log on"
echo "router --shards $SHARDS, nginx $NGINX_WORKERS workers ($nginx_log), sim $SIM_THREADS thread(s), $NPROC CPUs;"
echo "stream = $ROUTER_SSE_EVENTS SSE events via router, $NGINX_SSE_EVENTS via nginx"
for i in "${!VARIANTS[@]}"; do
  echo "router#$i args: $(router_args "${VARIANTS[$i]}"); agent: $(agent_args "${VARIANTS[$i]}")"
done
echo
fmt='%-20s %10s %9s %9s %7s %10s %10s %10s %8s %8s %8s %8s %7s %7s\n'
# shellcheck disable=SC2059
printf "$fmt" case req/s p50_us p99_us errors router_us agent_us nginx_us sys_us sim_us sim_cpu wrk_cpu other busy
for id in "${CASE_IDS[@]}"; do
  # shellcheck disable=SC2059
  printf "$fmt" "${R[$id.label]}" "${R[$id.rps]}" "${R[$id.p50_us]}" "${R[$id.p99_us]}" \
    "${R[$id.errors]}" "${R[$id.router_us_per_req]/null/-}" "${R[$id.agent_us_per_req]/null/-}" \
    "${R[$id.nginx_us_per_req]/null/-}" "${R[$id.proxy_sys_us_per_req]}" \
    "${R[$id.sim_us_per_req]}" "${R[$id.sim_cores]}" \
    "${R[$id.wrk_cores]}" "${R[$id.other_cores]}" "${R[$id.machine_busy_cores]}"
done
for i in "${!VARIANTS[@]}"; do
  echo "router#$i memory after its cases: peak RSS ${MEM[$i.VmHWM]} KiB, RSS ${MEM[$i.VmRSS]} KiB, reserved ${MEM[$i.VmSize]} KiB"
done
echo "(*_us = CPU microseconds per request of that process; sys_us = the kernel's part of the"
echo " proxy's (router's or nginx's) figure; sim_cpu/wrk_cpu/other = cores busy during the window:"
echo " the sim, the load generator, processes outside the benchmark; busy = all cores busy, of $NPROC:"
echo " below $NPROC, requests wait somewhere other than a CPU)"
echo
# Router / nginx ratios against one baseline (one hop: nginx -> sim, or two hops: nginx -> nginx
# -> sim). The two-hop chain has the router path's shape, so its CPU (both nginx hops) compares
# with router + agent; the one-hop CPU with the router alone as well.
j() { if [[ $1 == n/a ]]; then echo null; else echo "$1"; fi; }
print_ratios() { # nginx-case-prefix title -> appends to RATIOS_JSON
  local prefix=$1 title=$2 i kind r n rr rp ru rpu
  echo "Ratios (router / $title):"
  # shellcheck disable=SC2059
  printf "$fmt2" case rps p99 router_cpu/req router+agent/req "us: router+agent/nginx"
  RATIOS_JSON=""
  for i in "${!VARIANTS[@]}"; do
    for kind in $CASES; do
      r="router$i-$kind" n="$prefix-$kind"
      [[ -n ${R[$n.rps]:-} ]] || continue
      rr=$(ratio "${R[$r.rps]}" "${R[$n.rps]}")
      rp=$(ratio "${R[$r.p99_us]}" "${R[$n.p99_us]}")
      ru=$(ratio "${R[$r.router_us_per_req]}" "${R[$n.nginx_us_per_req]}")
      rpu=$(ratio "${R[$r.proxy_us_per_req]}" "${R[$n.nginx_us_per_req]}")
      # shellcheck disable=SC2059
      printf "$fmt2" "router#$i $kind" "$rr" "$rp" "$ru" "$rpu" \
        "${R[$r.proxy_us_per_req]}/${R[$n.nginx_us_per_req]}"
      RATIOS_JSON+="${RATIOS_JSON:+,}
    {\"variant\": $i, \"kind\": \"$kind\", \"rps\": $(j "$rr"), \"p99\": $(j "$rp"), \"router_cpu_per_req\": $(j "$ru"), \"router_plus_agent_cpu_per_req\": $(j "$rpu")}"
    done
  done
}
fmt2='%-20s %10s %10s %14s %16s %22s\n'
print_ratios nginx "nginx 1 hop"
RATIOS_1HOP_JSON=$RATIOS_JSON
echo
print_ratios nginx2 "nginx 2 hops, CPU of both hops"
RATIOS_2HOPS_JSON=$RATIOS_JSON

# JSON
json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
{
  echo "{"
  echo "  \"date\": $(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)"),"
  echo "  \"commit\": $(json_str "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"),"
  echo "  \"cpus\": $NPROC,"
  echo "  \"duration_s\": $DURATION, \"warmup_s\": $WARMUP, \"connections\": $CONNECTIONS, \"wrk_threads\": $WRK_THREADS,"
  echo "  \"shards\": $SHARDS, \"nginx_workers\": $(json_str "$NGINX_WORKERS"), \"nginx_access_log\": $([[ $NGINX_ACCESS_LOG == 1 ]] && echo true || echo false), \"sim_threads\": $SIM_THREADS,"
  echo "  \"output_tokens\": $OUTPUT_TOKENS, \"sse_events_router\": $ROUTER_SSE_EVENTS, \"sse_events_nginx\": $NGINX_SSE_EVENTS,"
  echo "  \"load_generator\": $(json_str "$(wrk -v 2>&1 | head -n1 | cut -c1-40)"),"
  printf '  "router_variants": ['
  sep=""
  for i in "${!VARIANTS[@]}"; do printf '%s%s' "$sep" "$(json_str "$(router_args "${VARIANTS[$i]}")")"; sep=", "; done
  echo "],"
  echo "  \"cases\": ["
  sep=""
  for id in "${CASE_IDS[@]}"; do
    printf '%s    {"id": %s, "target": %s, "kind": %s' "$sep" "$(json_str "$id")" \
      "$(json_str "${R[$id.target]}")" "$(json_str "${R[$id.kind]}")"
    for f in hops requests seconds rps p50_us p90_us p99_us max_us errors err_status err_timeout mb_per_s \
      router_us_per_req agent_us_per_req proxy_us_per_req proxy_sys_us_per_req nginx_us_per_req sim_us_per_req \
      sim_cores wrk_cores machine_busy_cores other_cores; do
      printf ', "%s": %s' "$f" "${R[$id.$f]:-null}"
    done
    printf ', "loadavg": %s}' "$(json_str "${R[$id.loadavg]}")"
    sep=$',\n'
  done
  echo
  echo "  ],"
  printf '  "router_memory_kib": ['
  sep=""
  for i in "${!VARIANTS[@]}"; do
    printf '%s{"variant": %s, "peak_rss": %s, "rss": %s, "reserved": %s}' "$sep" "$i" \
      "${MEM[$i.VmHWM]}" "${MEM[$i.VmRSS]}" "${MEM[$i.VmSize]}"
    sep=", "
  done
  echo "],"
  echo "  \"ratios_router_over_nginx\": [$RATIOS_1HOP_JSON"
  echo "  ],"
  echo "  \"ratios_router_over_nginx_2hops\": [$RATIOS_2HOPS_JSON"
  echo "  ]"
  echo "}"
} >"$WORK/results.json"
mkdir -p "$(dirname "$RESULTS")"
cp "$WORK/results.json" "$RESULTS"
echo
log "results written to $RESULTS"
