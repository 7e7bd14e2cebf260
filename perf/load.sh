#!/usr/bin/env bash
# Load test any router: perf/load.py with its tools installed when missing (oha with cargo, httpx
# with pip). Every argument goes to perf/load.py; see `perf/load.sh --help` and perf/README.md.
#
#   perf/load.sh --url http://127.0.0.1:8080 --api-key sk-... --model m --kind stream \
#     --rates '200 400 800' --duration 5 --out /tmp/load-run
#   perf/load.sh --url http://127.0.0.1:8080 --concurrency 32 --duration 10   # closed loop
set -euo pipefail
PERF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# oha: the load generator (a maintained one, not ours). cargo puts it in ~/.cargo/bin.
PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin
if ! command -v oha >/dev/null 2>&1; then
  echo "[load] installing oha (cargo install oha --locked; a few minutes)" >&2
  cargo install oha --locked --quiet
fi
if ! python3 -c 'import httpx' 2>/dev/null; then
  echo "[load] installing httpx (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check httpx
fi
exec python3 "$PERF/load.py" "$@"
