#!/usr/bin/env bash
# Start a disposable PostgreSQL server for the store tests and print its DATABASE_URL.
#
#   export DATABASE_URL="$(.ci/start_postgres.sh /tmp/ragmon-pg)"
#   pytest tests/service/store/test_trace_store.py
#   .ci/stop_postgres.sh /tmp/ragmon-pg
#
# Env: PGPORT (default 25432), PG_OPTIONS (more server options, e.g. "-c shared_preload_libraries=
# pg_stat_statements" for bench/scale/run.py --pg-statements). Listens on 127.0.0.1 only, trust auth,
# user postgres.
# Durability is switched off (fsync, synchronous_commit, full_page_writes): this
# server exists for tests and throws its data away; never reuse these settings.
# Running it again on a live directory only prints the URL.
set -euo pipefail

dir="${1:?usage: start_postgres.sh DIR}"
port="${PGPORT:-25432}"
bindir="$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)"
if [[ -z "$bindir" || ! -x "$bindir/pg_ctl" ]]; then
  echo "start_postgres.sh: no PostgreSQL server binaries; apt-get install -y --no-install-recommends postgresql" >&2
  exit 1
fi

# initdb and postgres refuse to run as root, so root hands the work to the
# `postgres` account the Debian package creates.
as_owner=()
if [[ "$(id -u)" -eq 0 ]]; then
  id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  as_owner=(runuser -u postgres --)
fi

mkdir -p "$dir"
[[ ${#as_owner[@]} -gt 0 ]] && chown postgres: "$dir"
data="$dir/data"

if [[ ! -s "$data/PG_VERSION" ]]; then
  if ! "${as_owner[@]}" "$bindir/initdb" --pgdata="$data" --username=postgres --auth=trust \
      --encoding=UTF8 --no-locale >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2
    exit 1
  fi
fi

if ! "${as_owner[@]}" "$bindir/pg_ctl" status --pgdata="$data" >/dev/null 2>&1; then
  # The socket goes into $dir so nothing needs write access to /var/run/postgresql.
  "${as_owner[@]}" "$bindir/pg_ctl" start --pgdata="$data" --log="$dir/server.log" --wait --timeout=60 \
    --options="-p $port -c listen_addresses=127.0.0.1 -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off ${PG_OPTIONS:-}" \
    >/dev/null || { tail -n 20 "$dir/server.log" >&2; exit 1; }
fi
"$bindir/pg_isready" --host=127.0.0.1 --port="$port" --timeout=30 >/dev/null

echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
