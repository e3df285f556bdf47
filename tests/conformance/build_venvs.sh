#!/usr/bin/env bash
# Builds one virtualenv per conformance client under .venvs/conformance/<client>.
#
# Each client gets its own venv because the instrumentation libraries pin conflicting versions of
# openai, opentelemetry-* and each other. A venv is rebuilt only when its requirements.txt changed:
# the hash of the file it was built from is kept inside it, so a cached run is a few stat calls.
#
# Usage: tests/conformance/build_venvs.sh [client ...]    (default: every client)
# Env:   UV (default: ragmon's .venv/bin/uv, else uv on PATH), CONFORMANCE_PYTHON (default: python3.11)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venvs="$root/.venvs/conformance"
uv="${UV:-}"
if [[ -z "$uv" ]]; then
  if [[ -x "$root/.venv/bin/uv" ]]; then uv="$root/.venv/bin/uv"; else uv="$(command -v uv || true)"; fi
fi
if [[ -z "$uv" ]]; then
  echo "build_venvs: uv not found; run: $root/.venv/bin/pip install uv" >&2
  exit 1
fi
python="${CONFORMANCE_PYTHON:-python3.11}"

if [[ $# -gt 0 ]]; then clients=("$@"); else
  clients=()
  for dir in "$here"/clients/*/; do [[ -f "$dir/requirements.txt" ]] && clients+=("$(basename "$dir")"); done
fi

mkdir -p "$venvs"
status=0
for client in "${clients[@]}"; do
  reqs="$here/clients/$client/requirements.txt"
  venv="$venvs/$client"
  if [[ ! -f "$reqs" ]]; then echo "$client: no such client ($reqs)"; status=1; continue; fi
  want="$(sha256sum "$reqs" | cut -d' ' -f1)"
  if [[ -x "$venv/bin/python" && -f "$venv/.requirements.sha256" && "$(cat "$venv/.requirements.sha256")" == "$want" ]]; then
    echo "$client: up to date"
    continue
  fi
  start=$SECONDS
  log="$(mktemp)"
  # The hash is written last, so a build that failed half-way is retried on the next run.
  if "$uv" venv -q --clear --python "$python" "$venv" >"$log" 2>&1 &&
    "$uv" pip sync -q --python "$venv/bin/python" "$reqs" >>"$log" 2>&1; then
    echo "$want" >"$venv/.requirements.sha256"
    echo "$client: built in $((SECONDS - start))s"
  else
    echo "$client: FAILED (log follows)"
    sed 's/^/    /' "$log"
    rm -f "$venv/.requirements.sha256"
    status=1
  fi
  rm -f "$log"
done
exit $status
