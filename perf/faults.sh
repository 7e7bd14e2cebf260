#!/usr/bin/env bash
# Faults under steady load: SIGKILL/SIGSTOP an agent and an engine, drop every tunnel, SIGTERM
# the router; checks every request's outcome, the gauges, the reaper and the logs after each.
# Builds the release binaries, then runs perf/faults.py (Python standard library only). See
# perf/README.md for what it checks and its settings.
#
#   perf/faults.sh                          # every phase, a few minutes
#   PHASES='baseline tunnel_drop' perf/faults.sh
#   SKIP_BUILD=1 KEEP_TMP=1 perf/faults.sh  # reuse target/release; keep the logs
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  echo "[faults] cargo build --release --bins" >&2
  (cd "$ROOT" && cargo build --release --bins --quiet)
fi
# Everything it starts inherits the lower priority: the machine is shared.
exec nice -n "${NICE:-10}" python3 "$ROOT/perf/faults.py" "$@"
