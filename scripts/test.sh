#!/usr/bin/env bash
# Run the whole test suite with the real components this machine has.
#
# Starts what is installed (PostgreSQL, ...) on loopback, exports where it
# listens, runs pytest, and stops everything on exit. A component that is not
# installed is not started, and the tests that need it skip with a message
# naming it (CI installs all of them: .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
export PATH="$PWD/$BIN:$PATH"
# helm and kubectl from .ci/get_helm.sh, for tests/helm
if [[ -d .tools/bin ]]; then export PATH="$PWD/.tools/bin:$PATH"; fi

# Everything the run writes to a temporary folder (pytest's tmp_path folders, the test servers'
# data and logs, the throwaway PostgreSQL below) goes under one folder of this run, removed on exit:
# a run leaves nothing in /tmp. 0755: the PostgreSQL servers run as the postgres user when root runs this.
RUN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ragmon-test.XXXXXX")
chmod 755 "$RUN_TMP"
export TMPDIR="$RUN_TMP"
PG_BASE=""
distributed_pid=""
cleanup() {
  if [[ -n "$distributed_pid" ]]; then kill "$distributed_pid" 2>/dev/null || true; wait "$distributed_pid" 2>/dev/null || true; fi
  if [[ -n "$PG_BASE" ]]; then .ci/stop_postgres.sh "$PG_BASE" --remove >/dev/null 2>&1 || true; fi
  rm -rf -- "$RUN_TMP"
}
trap cleanup EXIT

if [[ -z "${DATABASE_URL:-}" ]] && find /usr/lib/postgresql -maxdepth 3 -name pg_ctl 2>/dev/null | grep -q .; then
  PG_BASE=$(mktemp -d "$RUN_TMP/pg.XXXXXX")
  chmod 755 "$PG_BASE"
  # a free port unless PGPORT says otherwise: another server may hold the usual one
  port=${PGPORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  DATABASE_URL=$(PGPORT=$port .ci/start_postgres.sh "$PG_BASE")
  export DATABASE_URL
  echo "PostgreSQL for tests: $DATABASE_URL"
fi

# -rs: every skipped test is listed with its reason (the component or data it lacks);
# --durations: the slowest tests, so a run that grows shows where
PYTEST=(python -m pytest -q -rs -p no:cacheprovider --durations=15)
status() {   # pytest's exit status, with "no tests collected" (5) not a failure
  local rc=$1
  [[ $rc -eq 5 ]] && rc=0
  echo "$rc"
}

set +e
if [[ $# -gt 0 ]]; then
  "${PYTEST[@]}" "$@"
  rc=$(status $?)
else
  # The whole suite: tests/distributed beside the rest, in a pytest of its own. Its tests spend most
  # of their time waiting on real processes (a broker stopped for two minutes, workers killed and
  # replaced), so on two cores the pair takes about the time of the longer one, not the sum.
  # Nothing is shared between the two but the machine: the distributed tests start their own
  # PostgreSQL, broker and S3 server on free ports, and every folder is the run's own.
  "${PYTEST[@]}" tests/distributed >"$RUN_TMP/distributed.log" 2>&1 &
  distributed_pid=$!
  "${PYTEST[@]}" --ignore=tests/distributed
  rest_rc=$(status $?)
  wait "$distributed_pid"
  distributed_rc=$(status $?)
  distributed_pid=""
  echo "==> tests/distributed (run beside the tests above):"
  cat "$RUN_TMP/distributed.log"
  rc=$((rest_rc != 0 ? rest_rc : distributed_rc))
fi
set -e
exit "$rc"
