#!/usr/bin/env bash
# Builds what each conformance client runs in: one virtualenv per Python client under
# .venvs/conformance/<client>, and node_modules (`npm ci`, git-ignored) in each Node client's folder.
#
# Each Python client gets its own venv because the instrumentation libraries pin conflicting versions
# of openai, opentelemetry-* and each other; each Node client is its own npm project with a
# package-lock.json. Either is rebuilt only when its requirements.txt (package-lock.json) changed:
# the hash of the file it was built from is kept inside it, so a cached run is a few stat calls.
#
# Usage: tests/conformance/build_venvs.sh [client ...]    (default: every client)
# Env:   UV (default: ragmon's .venv/bin/uv, else uv on PATH), CONFORMANCE_PYTHON (default: python3.11),
#        NPM (default: npm on PATH; Node clients are skipped with a message when there is none)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venvs="$root/.venvs/conformance"
uv="${UV:-}"
if [[ -z "$uv" ]]; then
  if [[ -x "$root/.venv/bin/uv" ]]; then uv="$root/.venv/bin/uv"; else uv="$(command -v uv || true)"; fi
fi
python="${CONFORMANCE_PYTHON:-python3.11}"
npm="${NPM:-$(command -v npm || true)}"

if [[ $# -gt 0 ]]; then clients=("$@"); else
  clients=()
  for dir in "$here"/clients/*/; do
    [[ -f "$dir/requirements.txt" || -f "$dir/package-lock.json" ]] && clients+=("$(basename "$dir")")
  done
fi

# A Node client: `npm ci` into its folder's node_modules, exactly as package-lock.json pins it.
build_node() {
  local client="$1" dir="$here/clients/$1"
  local lock="$dir/package-lock.json" marker="$dir/node_modules/.package-lock.sha256"
  if [[ -z "$npm" ]]; then echo "$client: npm not found (Debian: apt-get install nodejs npm); skipped"; return 0; fi
  local want
  want="$(sha256sum "$lock" | cut -d' ' -f1)"
  if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then echo "$client: up to date"; return 0; fi
  local start=$SECONDS log
  log="$(mktemp)"
  # --ignore-scripts: no package here needs an install script, and none runs unasked
  if (cd "$dir" && "$npm" ci --no-audit --no-fund --ignore-scripts) >"$log" 2>&1; then
    echo "$want" >"$marker"
    echo "$client: built in $((SECONDS - start))s"
  else
    echo "$client: FAILED (log follows)"
    sed 's/^/    /' "$log"
    status=1
  fi
  rm -f "$log"
}

status=0
for client in "${clients[@]}"; do
  if [[ -f "$here/clients/$client/package-lock.json" ]]; then build_node "$client"; continue; fi
  reqs="$here/clients/$client/requirements.txt"
  venv="$venvs/$client"
  if [[ ! -f "$reqs" ]]; then echo "$client: no such client ($reqs)"; status=1; continue; fi
  if [[ -z "$uv" ]]; then
    echo "build_venvs: uv not found; run: $root/.venv/bin/pip install uv" >&2
    exit 1
  fi
  mkdir -p "$venvs"
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
