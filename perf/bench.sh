#!/usr/bin/env bash
# Benchmark: hivenet-router (router -> agent -> sim) against nginx (nginx -> sim), same load
# generator, same concurrency, same simulated engine. See perf/README.md.
#
# Environment (all optional):
#   DURATION=10        seconds per measurement          WARMUP=2      seconds of warm-up per case
#   CONNECTIONS=64     concurrent connections            WRK_THREADS=2 load-generator threads
#   SHARDS=2           router --shards                   SIM_THREADS=1 hivenet-sim --threads
#   OUTPUT_TOKENS=18   sim answer length (18 -> 21 SSE events per streamed answer)
#   NGINX_WORKERS=2    nginx worker_processes ('auto' works too)
#   NGINX_ACCESS_LOG=0 1: nginx writes a JSON access log line per request (buffered), the way the
#                      router always writes its audit log: a like-for-like baseline
#   ROUTER_ARGS=""     extra router flags; several configurations separated by '|' are measured
#                      one after the other in the same run, e.g. ROUTER_ARGS='|--shards 1', or
#                      ROUTER_ARGS='|--auth-config-file perf/auth-bench.yaml' (auth + limits);
#                      a variant starting with '@DIR ' runs DIR/hivenet-router instead, and
#                      DIR/hivenet-agent when DIR has one (before vs after: ROUTER_ARGS='@/tmp/before|'
#                      with an older build saved in /tmp/before)
#   AGENT_ARGS=""      extra agent flags
#   CASES="json stream"  which request kinds to measure
#   PORT_BASE=23000    ports used: +80 router http, +51 grpc, +12 metrics, +900 tunnel,
#                      +888 sim, +180 nginx json, +181 nginx stream
#   SKIP_BUILD=0       1: use the existing target/release binaries
#   SKIP_INSTALL=0     1: never call apt-get
#   RESULTS=perf/results/latest.json   where the JSON goes
#   KEEP_TMP=0         1: keep the temp dir (logs, nginx config) after the run
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PERF="$ROOT/perf"
BIN="$ROOT/target/release"

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-64}
WRK_THREADS=${WRK_THREADS:-2}
SHARDS=${SHARDS:-2}
SIM_THREADS=${SIM_THREADS:-1}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-18}
NGINX_WORKERS=${NGINX_WORKERS:-2}
NGINX_ACCESS_LOG=${NGINX_ACCESS_LOG:-0}
ROUTER_ARGS=${ROUTER_ARGS:-}
# Sent on every request (nginx and an open router ignore it); perf/auth-bench.yaml accepts it, so
# ROUTER_ARGS='|--auth-config-file perf/auth-bench.yaml' measures auth and limits on vs off.
export BENCH_API_KEY=${BENCH_API_KEY:-sk-hivenet-bench}
AGENT_ARGS=${AGENT_ARGS:-}
CASES=${CASES:-json stream}
PORT_BASE=${PORT_BASE:-23000}
SKIP_BUILD=${SKIP_BUILD:-0}
SKIP_INSTALL=${SKIP_INSTALL:-0}
RESULTS=${RESULTS:-$PERF/results/latest.json}
KEEP_TMP=${KEEP_TMP:-0}

HOST=127.0.0.1
ROUTER_HTTP=$HOST:$((PORT_BASE + 80))
ROUTER_GRPC=$HOST:$((PORT_BASE + 51))
ROUTER_METRICS=$HOST:$((PORT_BASE + 12))
ROUTER_P2P=$((PORT_BASE + 900))
SIM_ADDR=$HOST:$((PORT_BASE + 888))
NGINX_JSON=$HOST:$((PORT_BASE + 180))
NGINX_STREAM=$HOST:$((PORT_BASE + 181))
MODEL=sim-model
export HIVENET_ROUTER_JWT_SECRET=${HIVENET_ROUTER_JWT_SECRET:-devsecret}

CLK_TCK=$(getconf CLK_TCK)
NPROC=$(nproc)
WORK=$(mktemp -d /tmp/hivenet-bench.XXXXXX)
chmod 755 "$WORK"

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# Process bookkeeping and cleanup
# ---------------------------------------------------------------------------------------------
declare -A PID=()   # name -> pid of every long-running process this script started

stop_proc() { # name
  local name=$1 pid=${PID[$1]:-} i
  [[ -n $pid ]] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name ($pid) ignored SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  unset "PID[$name]"
}

show_logs() {
  local f
  for f in "$WORK"/*.log; do
    [[ -s $f ]] || continue
    log "---- tail of $(basename "$f") ----"
    tail -n 20 "$f" >&2 || true
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  local name
  for name in wrk agent router nginx sim; do stop_proc "$name"; done
  for name in "${!PID[@]}"; do stop_proc "$name"; done
  if [[ $rc -ne 0 ]]; then
    show_logs
    log "failed (exit $rc); temp dir kept: $WORK"
  elif [[ $KEEP_TMP == 1 ]]; then
    log "temp dir kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------
APT_UPDATED=0
ensure_pkg() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  [[ $SKIP_INSTALL == 1 ]] && die "$1 missing and SKIP_INSTALL=1"
  log "installing $2 (apt)"
  if [[ $APT_UPDATED == 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
}

ensure_pkg curl curl
ensure_pkg wrk wrk
# Debian puts nginx in /usr/sbin, which a non-login PATH may lack.
PATH=$PATH:/usr/sbin
ensure_pkg nginx nginx

if [[ $SKIP_BUILD != 1 ]]; then
  log "cargo build --release --bins"
  (cd "$ROOT" && cargo build --release --bins) >"$WORK/build.log" 2>&1 \
    || { tail -n 40 "$WORK/build.log" >&2; die "cargo build failed"; }
fi
for b in hivenet-router hivenet-agent hivenet-sim; do
  [[ -x $BIN/$b ]] || die "$BIN/$b missing (build first or unset SKIP_BUILD)"
done

# ---------------------------------------------------------------------------------------------
# Helpers: ports, readiness, /proc accounting
# ---------------------------------------------------------------------------------------------
port_free() { # host:port -> 0 when nothing listens there
  ! (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null
}

wait_until() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out waiting for $what"
    sleep 0.2
  done
}

alive() { # name
  local pid=${PID[$1]:-}
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

start_bg() { # name logfile command...
  local name=$1 logf=$2
  shift 2
  "$@" >"$logf" 2>&1 &
  PID[$name]=$!
}

# utime+stime of one pid, in clock ticks (0 if gone). Fields after the ")" of comm.
proc_ticks() {
  local stat rest f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  rest=${stat##*) }
  # rest: state(3) ppid(4) ... utime(14) stime(15) -> indexes 11 and 12 of rest (0-based)
  read -r -a f <<<"$rest"
  echo $((f[11] + f[12]))
}

# stime alone: the kernel's share of proc_ticks.
proc_sys_ticks() {
  local stat rest f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  rest=${stat##*) }
  read -r -a f <<<"$rest"
  echo $((f[12]))
}

nginx_pids() { # master and workers
  local master=${PID[nginx]:-}
  [[ -n $master ]] || return 0
  echo "$master"
  pgrep -P "$master" || true
}

nginx_ticks() { # [proc_ticks|proc_sys_ticks]
  local total=0 p
  for p in $(nginx_pids); do total=$((total + $(${1:-proc_ticks} "$p"))); done
  echo "$total"
}

# machine-wide busy and total jiffies from the first line of /proc/stat
cpu_jiffies() {
  awk '/^cpu /{busy=$2+$3+$4+$7+$8+$9; tot=busy+$5+$6; print busy, tot; exit}' /proc/stat
}

# CPU seconds of reaped children of this shell (bash `times`, second line: user sys). `times`
# must run in this shell, not in a $(...) subshell, whose children are its own.
children_cpu() {
  times >"$WORK/times.out"
  awk 'NR==2{
    n=split($0,a," ");
    s=0; for(i=1;i<=n;i++){ v=a[i]; sub(/s$/,"",v); split(v,mp,"m"); s+=mp[1]*60+mp[2] }
    print s }' "$WORK/times.out"
}

calc() { awk "BEGIN{ printf \"%.${2:-1}f\", $1 }"; }

# ---------------------------------------------------------------------------------------------
# Stack: sim, nginx, router + agent
# ---------------------------------------------------------------------------------------------
for addr in "$ROUTER_HTTP" "$ROUTER_GRPC" "$ROUTER_METRICS" "$HOST:$ROUTER_P2P" "$SIM_ADDR" \
  "$NGINX_JSON" "$NGINX_STREAM"; do
  port_free "$addr" || die "$addr already in use (set PORT_BASE to move every port)"
done

JSON_BODY="$WORK/body-json.json"
STREAM_BODY="$WORK/body-stream.json"
printf '{"model":"%s","messages":[{"role":"user","content":"hi"}]}' "$MODEL" >"$JSON_BODY"
printf '{"model":"%s","messages":[{"role":"user","content":"hi"}],"stream":true}' "$MODEL" >"$STREAM_BODY"

log "starting hivenet-sim on $SIM_ADDR (output tokens $OUTPUT_TOKENS, threads $SIM_THREADS)"
start_bg sim "$WORK/sim.log" "$BIN/hivenet-sim" --listen "$SIM_ADDR" --models "$MODEL" \
  --output-tokens "$OUTPUT_TOKENS" --threads "$SIM_THREADS"
wait_until 20 "hivenet-sim" curl -sf "http://$SIM_ADDR/v1/models"

log "starting nginx on $NGINX_JSON (json) and $NGINX_STREAM (stream), workers $NGINX_WORKERS"
mkdir -p "$WORK/nginx"
user_line=""
[[ $EUID -eq 0 ]] && user_line="user root;"
access_log="access_log off;"
if [[ $NGINX_ACCESS_LOG == 1 ]]; then
  # About the router audit record's fields, one JSON line per request, written in 64 KiB batches.
  access_log="log_format audit escape=json '{\"ts\":\"\$time_iso8601\",\"request_id\":\"\$request_id\",\"source_ip\":\"\$remote_addr\",\"status_code\":\$status,\"latency_ms\":\$request_time,\"bytes\":\$body_bytes_sent,\"upstream\":\"\$upstream_addr\"}'; access_log $WORK/nginx/access.jsonl audit buffer=64k flush=1s;"
fi
sed -e "s|@DIR@|$WORK/nginx|g" -e "s|@SIM_ADDR@|$SIM_ADDR|g" \
  -e "s|@NGINX_JSON_ADDR@|$NGINX_JSON|g" -e "s|@NGINX_STREAM_ADDR@|$NGINX_STREAM|g" \
  -e "s|@NGINX_WORKERS@|$NGINX_WORKERS|g" -e "s|@USER_LINE@|$user_line|g" \
  -e "s|@ACCESS_LOG@|$access_log|g" \
  "$PERF/nginx.conf.tmpl" >"$WORK/nginx/nginx.conf"
nginx -t -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx-test.log" 2>&1 \
  || { cat "$WORK/nginx-test.log" >&2; die "nginx config test failed"; }
start_bg nginx "$WORK/nginx.log" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf"
wait_until 20 "nginx" curl -sf "http://$NGINX_JSON/v1/models"

# The tuning flags of one router configuration: defaults, unless the variant sets them itself.
router_args() { # variant
  local a=""
  [[ " $1" == *" --shards"* ]] || a+="--shards $SHARDS "
  [[ " $1" == *" --queue-depth"* ]] || a+="--queue-depth 1000 "
  echo "$a$1"
}

start_router_stack() { # variant-args index
  local dir="$WORK/router-$2" args bin=$BIN agent_bin=$BIN variant=$1
  if [[ $variant == @* ]]; then
    bin=${variant%% *}
    variant=${variant#"$bin"}
    bin=${bin#@}
    [[ -x $bin/hivenet-agent ]] && agent_bin=$bin
  fi
  mkdir -p "$dir"
  args=$(router_args "$variant")
  log "starting $bin/hivenet-router ($args) and hivenet-agent"
  export HIVENET_ROUTER_AUDIT_LOG_PATH="$dir/audit.jsonl"
  # shellcheck disable=SC2086 # the flags are meant to be split into words
  start_bg router "$WORK/router-$2.log" "$bin/hivenet-router" --http-port "$ROUTER_HTTP" \
    --grpc-port "$ROUTER_GRPC" --metrics-port "$ROUTER_METRICS" --p2p-port "$ROUTER_P2P" \
    --identity-path "$dir/router.key" $args
  wait_until 30 "hivenet-router" curl -s "http://$ROUTER_HTTP/v1/models"
  # shellcheck disable=SC2086
  start_bg agent "$WORK/agent-$2.log" "$agent_bin/hivenet-agent" --backend-url "http://$SIM_ADDR" \
    --router-grpc "$ROUTER_GRPC" --identity-path "$dir/agent.key" --capacity 1000 $AGENT_ARGS
  wait_until 30 "the agent's model on the router" \
    bash -c "curl -sf -H 'Authorization: Bearer $BENCH_API_KEY' 'http://$ROUTER_HTTP/v1/models' | grep -q '\"$MODEL\"'"
  alive router || die "router exited"
  alive agent || die "agent exited"
}

stop_router_stack() {
  stop_proc agent
  stop_proc router
  wait_until 20 "router ports to be released" port_free "$ROUTER_HTTP"
}

# Sanity check one endpoint: a 200 JSON answer and the number of SSE events when streamed.
check_endpoint() { # label base-url
  local label=$1 url=$2 code events
  code=$(curl -s -o "$WORK/check.json" -w '%{http_code}' -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $BENCH_API_KEY" \
    --data-binary "@$JSON_BODY" "$url/v1/chat/completions")
  [[ $code == 200 ]] || { cat "$WORK/check.json" >&2; die "$label: non-stream answer HTTP $code"; }
  grep -q '"choices"' "$WORK/check.json" || die "$label: non-stream answer has no choices"
  curl -sN -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $BENCH_API_KEY" --data-binary "@$STREAM_BODY" \
    "$url/v1/chat/completions" >"$WORK/check.sse"
  events=$(grep -c '^data:' "$WORK/check.sse" || true)
  grep -q '^data: \[DONE\]' "$WORK/check.sse" || die "$label: stream has no [DONE]"
  log "$label: JSON answer $(wc -c <"$WORK/check.json") bytes; stream $events SSE events, $(wc -c <"$WORK/check.sse") bytes"
  SSE_EVENTS=$events
}

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

# Router configurations: ROUTER_ARGS split on '|'
IFS='|' read -r -a VARIANTS <<<"$ROUTER_ARGS"
((${#VARIANTS[@]} > 0)) || VARIANTS=("")
[[ $ROUTER_ARGS == *'|' ]] && VARIANTS+=("")

# nginx cases first (router not running: no idle noise from it)
for kind in $CASES; do
  url="http://$NGINX_JSON"
  [[ $kind == stream ]] && url="http://$NGINX_STREAM"
  measure "nginx-$kind" "nginx $kind" nginx "$kind" "$url"
done

ROUTER_SSE_EVENTS=0
for i in "${!VARIANTS[@]}"; do
  v=${VARIANTS[$i]}
  # trim blanks
  v="${v#"${v%%[![:space:]]*}"}"; v="${v%"${v##*[![:space:]]}"}"
  VARIANTS[i]=$v
  start_router_stack "$v" "$i"
  check_endpoint "router#$i" "http://$ROUTER_HTTP"
  ROUTER_SSE_EVENTS=$SSE_EVENTS
  for kind in $CASES; do
    measure "router$i-$kind" "router#$i $kind" router "$kind" "http://$ROUTER_HTTP"
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
  echo "router#$i args: $(router_args "${VARIANTS[$i]}")"
done
echo
fmt='%-20s %10s %9s %9s %7s %10s %10s %10s %8s %8s %8s %8s %7s\n'
# shellcheck disable=SC2059
printf "$fmt" case req/s p50_us p99_us errors router_us agent_us nginx_us sys_us sim_us sim_cpu wrk_cpu other
for id in "${CASE_IDS[@]}"; do
  # shellcheck disable=SC2059
  printf "$fmt" "${R[$id.label]}" "${R[$id.rps]}" "${R[$id.p50_us]}" "${R[$id.p99_us]}" \
    "${R[$id.errors]}" "${R[$id.router_us_per_req]/null/-}" "${R[$id.agent_us_per_req]/null/-}" \
    "${R[$id.nginx_us_per_req]/null/-}" "${R[$id.proxy_sys_us_per_req]}" \
    "${R[$id.sim_us_per_req]}" "${R[$id.sim_cores]}" \
    "${R[$id.wrk_cores]}" "${R[$id.other_cores]}"
done
echo "(*_us = CPU microseconds per request of that process; sys_us = the kernel's part of the"
echo " proxy's (router's or nginx's) figure; sim_cpu/wrk_cpu/other = cores busy during the window:"
echo " the sim, the load generator, processes outside the benchmark)"
echo
echo "Ratios (router / nginx):"
fmt2='%-20s %10s %10s %14s %14s %16s\n'
# shellcheck disable=SC2059
printf "$fmt2" case rps p99 router_cpu/req router+agent/req "us: router/nginx"
RATIOS_JSON=""
j() { if [[ $1 == n/a ]]; then echo null; else echo "$1"; fi; }
for i in "${!VARIANTS[@]}"; do
  for kind in $CASES; do
    r="router$i-$kind" n="nginx-$kind"
    rr=$(ratio "${R[$r.rps]}" "${R[$n.rps]}")
    rp=$(ratio "${R[$r.p99_us]}" "${R[$n.p99_us]}")
    ru=$(ratio "${R[$r.router_us_per_req]}" "${R[$n.nginx_us_per_req]}")
    rpu=$(ratio "${R[$r.proxy_us_per_req]}" "${R[$n.nginx_us_per_req]}")
    # shellcheck disable=SC2059
    printf "$fmt2" "router#$i $kind" "$rr" "$rp" "$ru" "$rpu" \
      "${R[$r.router_us_per_req]}/${R[$n.nginx_us_per_req]}"
    RATIOS_JSON+="${RATIOS_JSON:+,}
    {\"variant\": $i, \"kind\": \"$kind\", \"rps\": $(j "$rr"), \"p99\": $(j "$rp"), \"router_cpu_per_req\": $(j "$ru"), \"router_plus_agent_cpu_per_req\": $(j "$rpu")}"
  done
done

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
    for f in requests seconds rps p50_us p90_us p99_us max_us errors err_status err_timeout mb_per_s \
      router_us_per_req agent_us_per_req proxy_us_per_req proxy_sys_us_per_req nginx_us_per_req sim_us_per_req \
      sim_cores wrk_cores machine_busy_cores other_cores; do
      printf ', "%s": %s' "$f" "${R[$id.$f]:-null}"
    done
    printf ', "loadavg": %s}' "$(json_str "${R[$id.loadavg]}")"
    sep=$',\n'
  done
  echo
  echo "  ],"
  echo "  \"ratios_router_over_nginx\": [$RATIOS_JSON"
  echo "  ]"
  echo "}"
} >"$WORK/results.json"
mkdir -p "$(dirname "$RESULTS")"
cp "$WORK/results.json" "$RESULTS"
echo
log "results written to $RESULTS"
