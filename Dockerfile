# The ragmon image that the Helm chart (helm/ragmon) runs.
#
#   docker build -t ragmon:0.1.0 .
#   docker run --rm -p 4318:4318 -p 4317:4317 -v ragmon-data:/data \
#     -e RAGMON_AUTH__API_KEYS='{"<a long random key>": "default"}' ragmon:0.1.0 serve
#
# The API keys are needed: the image listens on 0.0.0.0, and without keys ragmon accepts
# loopback clients only, which behind Docker's NAT no client is (every app would get 403).
# Apps send `authorization: Bearer <key>` (README.md, "From another machine").
#
# Two stages: the first installs ragmon with the PostgreSQL and Kafka extras into
# a virtual environment; the second copies only that environment onto a clean
# python:3.11-slim, so the runtime image has no compiler and no pip cache. The
# process runs as an unprivileged user (uid 10001) and writes only to /data
# (SQLite file, reports) and /tmp, so the root filesystem can be mounted read-only.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ragmon
WORKDIR /src
# README.md is the package's long description (pyproject `readme`), so the build needs it
COPY pyproject.toml README.md ./
COPY service ./service
COPY sampler ./sampler
COPY detectors ./detectors
RUN /opt/ragmon/bin/pip install ".[postgres,kafka]"

FROM python:3.11-slim
ENV PATH=/opt/ragmon/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    RAGMON_DATA_DIR=/data \
    RAGMON_SERVER__HOST=0.0.0.0 \
    RAGMON_WORKER__HOST=0.0.0.0
RUN groupadd --system --gid 10001 ragmon \
 && useradd --system --uid 10001 --gid ragmon --home-dir /data --no-create-home --shell /usr/sbin/nologin ragmon \
 && mkdir -p /data \
 && chown ragmon:ragmon /data
COPY --from=build /opt/ragmon /opt/ragmon
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# 4318 OTLP/HTTP, JSON API, review page, /metrics; 4317 OTLP/gRPC; 9400 worker /metrics and /healthz
EXPOSE 4318 4317 9400
ENTRYPOINT ["ragmon"]
CMD ["serve"]
