#!/usr/bin/env bash
# Stop the server .ci/start_postgres.sh started in DIR; delete DIR too with --remove.
# Stopping a server that is not running is not an error.
set -euo pipefail

dir="${1:?usage: stop_postgres.sh DIR [--remove]}"
bindir="$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)"
as_owner=()
[[ "$(id -u)" -eq 0 ]] && as_owner=(runuser -u postgres --)

if [[ -n "$bindir" && -s "$dir/data/PG_VERSION" ]] \
    && "${as_owner[@]}" "$bindir/pg_ctl" status --pgdata="$dir/data" >/dev/null 2>&1; then
  "${as_owner[@]}" "$bindir/pg_ctl" stop --pgdata="$dir/data" --mode=fast --wait --timeout=60 >/dev/null
fi
if [[ "${2:-}" == "--remove" ]]; then
  rm -rf -- "$dir"
fi
