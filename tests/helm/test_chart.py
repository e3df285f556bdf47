"""The Helm chart in helm/ragmon: lint, render each mode, validate against Kubernetes schemas, check objects.

Needs the `helm` binary (`.ci/get_helm.sh .tools/bin` installs it; `.tools/bin` and PATH are
searched) and `kubernetes-validate` (test extra). Without helm every test here skips.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli import build_parser
from service.config import describe_settings, load_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ragmon"
DASHBOARDS = ROOT / "dashboards"
# the oldest Kubernetes the chart supports (Chart.yaml kubeVersion) that kubernetes-validate bundles
OLDEST_KUBE = "1.29.0"

Doc = dict[str, Any]


def _find_helm() -> str | None:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


HELM = _find_helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not found: run `.ci/get_helm.sh .tools/bin` (or put helm on PATH)"
)

# Secret material used in the scenarios; none of it may ever show up outside a Secret.
API_KEY = "ingest-key-4f1e9a7c2b"
JUDGE_KEY = "sk-judge-7d3c1b9e5f"
PG_PASSWORD = "pg-pass-0a8b6c4d2e"
SASL_PASSWORD = "sasl-pass-9f7e5d3c1b"
SESSION_SECRET = "session-secret-" + "x" * 24
REVIEWER_HASH = "ab" * 32
KEY_PASSWORD = "tls-key-pass-3b1d7f"
SCRAPE_TOKEN = "scrape-tok-5e2a8c0f7d1b"
SECRET_VALUES = (
    API_KEY,
    JUDGE_KEY,
    PG_PASSWORD,
    SASL_PASSWORD,
    SESSION_SECRET,
    REVIEWER_HASH,
    KEY_PASSWORD,
    SCRAPE_TOKEN,
)

# What the existing Secrets of the `existing_secrets` scenario hold in the cluster.
EXISTING = {
    ("ragmon-ingest-keys", "keys.json"): json.dumps({API_KEY: "team-a"}),
    ("openai", "OPENAI_API_KEY"): JUDGE_KEY,
    ("ragmon-reviewers", "reviewers.json"): json.dumps({"ann": {"token_sha256": REVIEWER_HASH}}),
    ("ragmon-session", "key"): SESSION_SECRET,
    ("pg-app", "password"): PG_PASSWORD,
    ("pg-app", "username"): "app_user",
    ("kafka-user", "password"): SASL_PASSWORD,
    ("kafka-user", "username"): "ragmon-scram",
    ("ragmon-user", "user.crt"): "-----BEGIN CERTIFICATE-----",
    ("ragmon-user", "user.key"): "-----BEGIN PRIVATE KEY-----",
    ("ragmon-user", "key-password"): KEY_PASSWORD,
    ("prometheus-scrape", "token"): SCRAPE_TOKEN,
    ("my-cluster-cluster-ca-cert", "ca.crt"): "-----BEGIN CERTIFICATE-----",
    ("kafka-ca", "ca.crt"): "-----BEGIN CERTIFICATE-----",
    ("pg-ca", "ca.pem"): "-----BEGIN CERTIFICATE-----",
}
EXISTING_CONFIG_MAPS = {("pg-ca-bundle", "bundle.pem"): "-----BEGIN CERTIFICATE-----"}

_DISTRIBUTED: dict[str, Any] = {
    "mode": "distributed",
    "postgresql": {"host": "pg.db.svc", "database": "rag mon", "sslmode": "require"},
    "kafka": {
        "bootstrapServers": ["kafka-0.kafka:9092", "kafka-1.kafka:9092"],
        "securityProtocol": "SASL_SSL",
        "saslMechanism": "SCRAM-SHA-512",
        "saslUsername": "ragmon",
        "caSecret": {"name": "kafka-ca", "key": "ca.crt"},
    },
    "judge": {"baseUrl": "https://judge.example/v1", "model": "judge-model"},
    "config": {"sampler": {"rates": {"base": 0.05}}, "budget": {"usd_per_day": 20}},
}

SCENARIOS: dict[str, Doc] = {
    "embedded": {},
    "embedded_by_value": {
        "auth": {"apiKeys": {API_KEY: "default"}},
        "judge": {"apiKey": JUDGE_KEY},
        "review": {"reviewers": {"ann": {"token_sha256": REVIEWER_HASH}}, "sessionSecret": SESSION_SECRET},
        "config": {"drift": {"interval_s": 600}},
    },
    "distributed": {
        **_DISTRIBUTED,
        "auth": {"apiKeys": {API_KEY: "team-a"}},
        "judge": {**_DISTRIBUTED["judge"], "apiKey": JUDGE_KEY},
        "review": {"reviewers": {"ann": {"token_sha256": REVIEWER_HASH}}, "sessionSecret": SESSION_SECRET},
        "postgresql": {**_DISTRIBUTED["postgresql"], "password": PG_PASSWORD},
        "kafka": {**_DISTRIBUTED["kafka"], "saslPassword": SASL_PASSWORD},
    },
    "existing_secrets": {
        **_DISTRIBUTED,
        "auth": {"existingSecret": "ragmon-ingest-keys", "existingSecretKey": "keys.json"},
        "judge": {**_DISTRIBUTED["judge"], "existingSecret": "openai", "existingSecretKey": "OPENAI_API_KEY"},
        "review": {
            "existingSecret": "ragmon-reviewers",
            "existingSecretKey": "reviewers.json",
            "sessionSecretExistingSecret": "ragmon-session",
            "sessionSecretExistingSecretKey": "key",
        },
        "postgresql": {
            **_DISTRIBUTED["postgresql"],
            "existingSecret": "pg-app",
            "existingSecretPasswordKey": "password",
            "existingSecretUserKey": "username",
        },
        "kafka": {
            **_DISTRIBUTED["kafka"],
            "existingSecret": "kafka-user",
            "existingSecretPasswordKey": "password",
        },
        "metrics": {
            "scrapeTokenExistingSecret": "prometheus-scrape",
            "scrapeTokenExistingSecretKey": "token",
        },
    },
    "operator": {
        **_DISTRIBUTED,
        "auth": {"apiKeys": {API_KEY: "team-a"}},
        "kafka": {**_DISTRIBUTED["kafka"], "saslPassword": SASL_PASSWORD, "partitions": 12},
        "ingest": {"autoscaling": {"enabled": True}, "podDisruptionBudget": {"enabled": True}},
        "workers": {"autoscaling": {"enabled": True, "maxReplicas": 12}},
        "report": {"persistence": {"enabled": True, "accessModes": ["ReadWriteMany"]}, "timeZone": "UTC"},
        "metrics": {
            "scrapeToken": SCRAPE_TOKEN,
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "prometheusRule": {"enabled": True},
            "grafanaDashboards": {"enabled": True, "namespace": "monitoring"},
        },
        "networkPolicy": {
            "enabled": True,
            "ingestFrom": [{"namespaceSelector": {"matchLabels": {"team": "rag"}}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
    },
    # Strimzi: a tls KafkaUser (mutual TLS), KEDA on the sinks group's lag, an Ingress with TLS, and
    # PostgreSQL checked against its CA
    "strimzi": {
        "mode": "distributed",
        "auth": {"apiKeys": {API_KEY: "team-a"}},
        "postgresql": {
            "host": "pg.db.svc",
            "database": "rag mon",
            "sslmode": "verify-full",
            "caSecret": {"name": "pg-ca", "key": "ca.pem"},
        },
        "kafka": {
            "bootstrapServers": ["my-cluster-kafka-bootstrap.kafka:9093"],
            "securityProtocol": "SSL",
            "caSecret": {"name": "my-cluster-cluster-ca-cert", "key": "ca.crt"},
            "clientCertSecret": {
                "name": "ragmon-user",
                "certKey": "user.crt",
                "keyKey": "user.key",
                "passwordKey": "key-password",
            },
            "partitions": 8,
        },
        "workers": {
            "autoscaling": {"enabled": True, "metric": "keda", "maxReplicas": 8, "lagPerReplica": 2000}
        },
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": ["ragmon.example.com"],
            "tls": [{"secretName": "ragmon-tls", "hosts": ["ragmon.example.com"]}],
        },
        "review": {
            "reviewers": {"ann": {"token_sha256": REVIEWER_HASH}},
            "sessionSecret": SESSION_SECRET,
            "secureCookie": True,
        },
        "config": {"kafka": {"sinks_group": "rag-sinks"}},
    },
    # SCRAM from an existing Secret (user and password), an HPA on an External lag metric, the
    # PostgreSQL CA from a ConfigMap, an Ingress for any host without TLS
    "lag_hpa": {
        **_DISTRIBUTED,
        "auth": {"apiKeys": {API_KEY: "team-a"}},
        "postgresql": {
            **_DISTRIBUTED["postgresql"],
            "sslmode": "verify-ca",
            "caConfigMap": {"name": "pg-ca-bundle", "key": "bundle.pem"},
        },
        "kafka": {
            **_DISTRIBUTED["kafka"],
            "saslUsername": "",
            "existingSecret": "kafka-user",
            "existingSecretPasswordKey": "password",
            "existingSecretUserKey": "username",
        },
        "workers": {
            "autoscaling": {"enabled": True, "metric": "lag", "maxReplicas": 6, "lagPerReplica": 5000}
        },
        "ingress": {"enabled": True},
    },
    # SCRAM given by value, KEDA reading the same credentials
    "keda_sasl": {
        **_DISTRIBUTED,
        "auth": {"apiKeys": {API_KEY: "team-a"}},
        "kafka": {**_DISTRIBUTED["kafka"], "saslPassword": SASL_PASSWORD},
        "workers": {"autoscaling": {"enabled": True, "metric": "keda", "minReplicas": 1, "maxReplicas": 6}},
    },
}
DISTRIBUTED = ("distributed", "existing_secrets", "operator", "strimzi", "lag_hpa", "keda_sasl")
# custom resources kubernetes-validate has no schema for; checked object by object below
CRD_GROUPS = ("monitoring.coreos.com/", "keda.sh/")
WITH_JUDGE_KEY = ("embedded_by_value", "distributed", "existing_secrets")


def _contains(actual: Any, expected: Any) -> bool:
    """Whether the nested mapping `expected` is a part of `actual` (same values where both have a key)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _contains(actual[k], v) for k, v in expected.items()
        )
    return bool(actual == expected)


def _helm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if HELM is None:
        raise RuntimeError("helm is not installed")
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _values_file(values: Doc, directory: Path) -> Path:
    path = directory / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def template(values: Doc, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _helm("template", "demo", str(CHART), "-n", "prod", "-f", str(_values_file(values, tmp)), *extra)


@cache
def rendered(scenario: str) -> tuple[Doc, ...]:
    """The objects `helm template` renders for a scenario (rendered once per test session)."""
    directory = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    try:
        result = template(SCENARIOS[scenario], directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed for {scenario}:\n{result.stderr}")
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} {name}, found {len(found)}")
    return found[0]


def pod_specs(docs: tuple[Doc, ...]) -> Iterator[tuple[str, Doc]]:
    """(object name, pod spec) of every Deployment and CronJob."""
    for d in docs:
        if d["kind"] == "Deployment":
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield d["metadata"]["name"], d["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def pod_labels(docs: tuple[Doc, ...]) -> list[dict[str, str]]:
    labels = []
    for d in docs:
        if d["kind"] == "Deployment":
            labels.append(d["spec"]["template"]["metadata"]["labels"])
        elif d["kind"] == "CronJob":
            labels.append(d["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"])
    return labels


def secret_data(docs: tuple[Doc, ...]) -> dict[tuple[str, str], str]:
    """(secret name, key) -> decoded value, for the chart's Secrets plus the scenario's existing ones."""
    data = dict(EXISTING)
    for secret in of_kind(docs, "Secret"):
        for key, value in (secret.get("data") or {}).items():
            data[(secret["metadata"]["name"], key)] = base64.b64decode(value).decode()
    return data


def _scrape_token_set(values: Doc) -> bool:
    return bool(values.get("metrics", {}).keys() & {"scrapeToken", "scrapeTokenExistingSecret"})


def container_environ(docs: tuple[Doc, ...], container: Doc) -> dict[str, str]:
    """The environment Kubernetes gives a container: envFrom ConfigMaps, then env (secrets resolved)."""
    environ: dict[str, str] = {}
    for source in container.get("envFrom", []):
        environ.update(named(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    secrets = secret_data(docs)
    for var in container.get("env", []):
        if "value" in var:
            environ[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            environ[var["name"]] = secrets[(ref["name"], ref["key"])]
    return environ


def load_container_config(docs: tuple[Doc, ...], container: Doc, pod: Doc, tmp: Path) -> Any:
    """Load the ragmon configuration the container would run with, through ragmon's own loader."""
    args = container["args"]
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if config_path.is_relative_to(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = named(docs, "ConfigMap", volume["configMap"]["name"])
    local = tmp / config_path.name
    local.write_text(config_map["data"][config_path.name], encoding="utf-8")
    return load_config(config_file=local, environ=container_environ(docs, container))


SETTING_NAMES = {row[0] for row in describe_settings()}
# environment read by libraries, not by ragmon's settings: libpq's connection variables
LIBRARY_ENV = {"PGPASSWORD", "PGUSER", "PGSSLMODE", "PGSSLROOTCERT"}


# -- helm itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_lint_strict(scenario: str, tmp_path: Path) -> None:
    result = _helm("lint", "--strict", str(CHART), "-f", str(_values_file(SCENARIOS[scenario], tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "sidecar"}, "/mode"),
        ({"ingest": {"replicas": "two"}}, "/ingest/replicas"),
        ({"workers": {"replicaz": 2}}, "replicaz"),
        ({"judge": {"baseUrl": "judge.example"}}, "/judge/baseUrl"),
        ({"mode": "distributed"}, "/postgresql/host"),
        ({"mode": "distributed", "postgresql": {"host": "pg"}}, "/kafka/bootstrapServers"),
        ({"kafka": {"bootstrapServers": ["no-port"]}}, "/kafka/bootstrapServers/0"),
        ({"persistence": {"accessModes": ["ReadWriteSometimes"]}}, "/persistence/accessModes/0"),
    ],
)
def test_wrong_values_fail_at_install_time(values: Doc, message: str, tmp_path: Path) -> None:
    result = template(values, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"judge": {"api_key": "sk-oops"}}}, "config.judge.api_key"),
        ({"config": {"auth": {"api_keys": {"k": "t"}}}}, "config.auth.api_keys"),
        ({"config": {"metrics": {"scrape_token": "sk-oops-0123456789"}}}, "config.metrics.scrape_token"),
        ({"config": {"store": {"url": "postgresql+psycopg://u:p@h/d"}}}, "config.store.url"),
        ({**SCENARIOS["distributed"], "workers": {"replicas": 7}}, "kafka.partitions is 6"),
        (
            {**SCENARIOS["distributed"], "kafka": {**_DISTRIBUTED["kafka"], "saslMechanism": ""}},
            "set kafka.saslMechanism",
        ),
        (
            {**SCENARIOS["distributed"], "ingest": {"terminationGracePeriodSeconds": 25}},
            "must exceed kafka.shutdownGraceSeconds (20)",
        ),
    ],
)
def test_unsafe_or_unworkable_values_are_refused(values: Doc, message: str, tmp_path: Path) -> None:
    result = template(values, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr
    assert "sk-oops" not in result.stdout


def test_package_carries_the_dashboards_files_not_links(tmp_path: Path) -> None:
    """files/rules.yml and files/grafana are symlinks into dashboards/; `helm package` must follow them."""
    assert (CHART / "files" / "rules.yml").is_symlink()
    assert (CHART / "files" / "rules.yml").samefile(DASHBOARDS / "rules.yml")
    assert (CHART / "files" / "grafana").samefile(DASHBOARDS / "grafana")
    result = _helm("package", str(CHART), "-d", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("ragmon-*.tgz")
    with tarfile.open(archive) as tar:
        rules = tar.getmember("ragmon/files/rules.yml")
        assert rules.isfile()
        packed = tar.extractfile(rules)
        assert packed is not None
        assert packed.read() == (DASHBOARDS / "rules.yml").read_bytes()
        packed_dashboards = {
            Path(m.name).name for m in tar.getmembers() if m.name.startswith("ragmon/files/grafana/")
        }
    assert packed_dashboards == {p.name for p in (DASHBOARDS / "grafana").glob("*.json")}


# -- schemas ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_manifests_validate_against_kubernetes_schemas(scenario: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = rendered(scenario)
    assert docs
    for version in (OLDEST_KUBE, kubernetes_validate.latest_version()):
        for doc in docs:
            if doc["apiVersion"].startswith(CRD_GROUPS):
                continue  # CRDs: no bundled schema; checked by the operator and KEDA tests below
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(
                    f"{doc['kind']} {doc['metadata']['name']} invalid for Kubernetes {version}: {exc}"
                ) from exc


def test_kubernetes_validate_command_line_accepts_the_rendering(tmp_path: Path) -> None:
    """The CI-facing form: `kubernetes-validate --strict` on the rendered file of the core objects."""
    if shutil.which("kubernetes-validate") is None:
        pytest.skip("kubernetes-validate is not installed (test extra)")
    docs = [d for d in rendered("strimzi") if not d["apiVersion"].startswith(CRD_GROUPS)]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    result = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", "-k", OLDEST_KUBE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yaml"
    deployment = json.loads(json.dumps(of_kind(rendered("distributed"), "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    broken.write_text(yaml.safe_dump(deployment), encoding="utf-8")
    result = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", "-k", OLDEST_KUBE, str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0  # the validator does catch a misspelt field


# -- the objects ------------------------------------------------------------------------------------


def test_embedded_is_one_pod_on_a_claim() -> None:
    docs = rendered("embedded")
    (deployment,) = of_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "serve"
    data = next(m for m in container["volumeMounts"] if m["mountPath"] == "/data")
    volume = next(v for v in pod["volumes"] if v["name"] == data["name"])
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert named(docs, "PersistentVolumeClaim", claim)["spec"]["resources"]["requests"]["storage"] == "10Gi"
    (cronjob,) = of_kind(docs, "CronJob")
    job_pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim for v in job_pod["volumes"])
    # the ReadWriteOnce claim is shared on one node only: the report runs beside the ragmon pod
    (term,) = job_pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod_labels(docs)[0].items()
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


def test_embedded_without_persistence_has_no_report_job(tmp_path: Path) -> None:
    result = template({"persistence": {"enabled": False}}, tmp_path)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert not of_kind(tuple(docs), "CronJob")
    assert not of_kind(tuple(docs), "PersistentVolumeClaim")


@pytest.mark.parametrize("scenario", DISTRIBUTED)
def test_distributed_runs_ingest_and_three_worker_roles(scenario: str) -> None:
    docs = rendered(scenario)
    roles = {}
    for deployment in of_kind(docs, "Deployment"):
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        role = args[0] if args[0] == "serve" else args[args.index("--role") + 1]
        roles[role] = deployment
    assert set(roles) == {"serve", "sinks", "judge", "drift"}
    drift = roles["drift"]["spec"]
    assert drift["replicas"] == 1
    assert drift["strategy"]["type"] == "Recreate"
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in of_kind(docs, "HorizontalPodAutoscaler")}
    assert roles["drift"]["metadata"]["name"] not in targets
    if scenario == "operator":
        assert targets == {roles["serve"]["metadata"]["name"], roles["sinks"]["metadata"]["name"]}
        assert "replicas" not in roles["sinks"]["spec"]  # the HPA owns it


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_probes(scenario: str) -> None:
    for name, pod in pod_specs(rendered(scenario)):
        for container in pod["containers"]:
            if "report" in name:
                continue  # a job, not a server
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            assert container["startupProbe"]["httpGet"]["path"] == "/healthz", name
            # ingest: store reachable, bus below capacity; workers: consuming, store reachable
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
            ports = {p["name"] for p in container["ports"]}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                assert container[probe]["httpGet"]["port"] in ports


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_security_defaults(scenario: str) -> None:
    docs = rendered(scenario)
    pods = list(pod_specs(docs))
    assert pods
    for name, pod in pods:
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert context["runAsUser"] != 0
        assert context["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), (name, bound)
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            # the root filesystem is read-only: /tmp and /data must be volumes
            assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
            assert "/data" in mounts and not mounts["/data"].get("readOnly", False)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_env_names_are_settings_ragmon_reads(scenario: str) -> None:
    docs = rendered(scenario)
    names: set[str] = set()
    for config_map in of_kind(docs, "ConfigMap"):
        if config_map["metadata"]["name"].endswith("-env"):
            names |= set(config_map["data"])
    for _, pod in pod_specs(docs):
        for container in pod["containers"]:
            names |= {var["name"] for var in container.get("env", [])}
    assert names
    unknown = {n for n in names if n.startswith("RAGMON_")} - SETTING_NAMES
    assert not unknown, f"not ragmon settings (see `ragmon config --markdown`): {sorted(unknown)}"
    assert {n for n in names if not n.startswith("RAGMON_")} <= LIBRARY_ENV


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_secrets_never_in_configmaps_or_plain_env(scenario: str) -> None:
    docs = rendered(scenario)
    for config_map in of_kind(docs, "ConfigMap"):
        text = json.dumps(config_map)
        for value in SECRET_VALUES:
            assert value not in text, (config_map["metadata"]["name"], value)
    for name, pod in pod_specs(docs):
        for container in pod["containers"]:
            for var in container.get("env", []):
                assert "value" not in var or not any(s in var["value"] for s in SECRET_VALUES), name
    values = SCENARIOS[scenario]
    secrets = secret_data(docs)
    chart_secret = {k: v for (n, k), v in secrets.items() if n == "demo-ragmon"}
    if scenario == "existing_secrets":
        # nothing is copied from the existing Secrets into the chart's own
        assert chart_secret == {}
    elif values.get("judge", {}).get("apiKey"):
        assert json.loads(chart_secret["judge-api-key"]) == JUDGE_KEY


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_container_loads_a_valid_ragmon_config(scenario: str, tmp_path: Path) -> None:
    """Each container's env + config file, resolved as Kubernetes would, through ragmon's own loader."""
    docs = rendered(scenario)
    values = SCENARIOS[scenario]
    distributed = scenario in DISTRIBUTED
    parser = build_parser()
    checked = 0
    for _, pod in pod_specs(docs):
        for container in pod["containers"]:
            parser.parse_args(container["args"])  # every flag the chart passes exists
            config = load_container_config(docs, container, pod, tmp_path)
            checked += 1
            assert config.server.host == "0.0.0.0" and config.worker.host == "0.0.0.0"
            assert str(config.data_dir) == "/data"
            assert config.bus.kind == ("kafka" if distributed else "memory")
            assert _contains(config.model_dump(mode="json"), values.get("config", {}))
            role = container["args"][0] if container["args"][0] != "worker" else container["args"][2]
            if distributed:
                assert config.store_url.startswith("postgresql+psycopg://")
                assert config.store_url.endswith("@pg.db.svc:5432/rag+mon") or config.store_url.endswith(
                    "://pg.db.svc:5432/rag+mon"
                )
                kafka = values["kafka"]
                assert config.kafka.bootstrap_servers == kafka["bootstrapServers"]
                assert config.kafka.security_protocol == kafka["securityProtocol"]
                assert config.kafka.ssl_cafile == "/etc/ragmon/kafka-ca/ca.crt"
                if "judge" in values:
                    assert config.judge.base_url == "https://judge.example/v1"
                environ = container_environ(docs, container)
                assert environ["PGSSLMODE"] == values["postgresql"]["sslmode"]
                with_password = scenario in ("distributed", "existing_secrets")
                assert environ.get("PGPASSWORD") == (PG_PASSWORD if with_password else None)
                if scenario == "existing_secrets":
                    assert environ["PGUSER"] == "app_user"
                if role in ("serve", "sinks") and kafka["securityProtocol"].startswith("SASL_"):
                    assert config.kafka.sasl_password is not None
                    assert config.kafka.sasl_password.get_secret_value() == SASL_PASSWORD
                    assert config.kafka.sasl_username == (
                        "ragmon-scram" if scenario == "lag_hpa" else "ragmon"
                    )
                if role in ("serve", "sinks") and "clientCertSecret" in kafka:
                    assert config.kafka.ssl_certfile == "/etc/ragmon/kafka-client/tls.crt"
                    assert config.kafka.ssl_keyfile == "/etc/ragmon/kafka-client/tls.key"
                    assert config.kafka.ssl_password is not None
                    assert config.kafka.ssl_password.get_secret_value() == KEY_PASSWORD
                else:
                    assert config.kafka.ssl_certfile is None and config.kafka.ssl_password is None
            else:
                assert config.store_url == "sqlite:////data/ragmon.db"
            if role == "serve" and distributed:
                # the pod outlives ingest's wait for the broker's acknowledgements on shutdown
                grace = pod["terminationGracePeriodSeconds"]
                assert grace > config.kafka.shutdown_grace_s + config.kafka.publish_timeout_s + 5
            if role == "serve":
                keys = config.auth.api_keys
                assert len(keys) == 1
                if values.get("auth"):
                    assert API_KEY in keys
                secret = config.review.session_secret
                assert secret is not None and len(secret.get_secret_value()) >= 32
                if values.get("review"):
                    assert set(config.review.reviewers) == {"ann"}
                    assert secret.get_secret_value() == SESSION_SECRET
            if role in ("serve", "judge") and scenario in WITH_JUDGE_KEY:
                assert config.judge.api_key is not None
                assert config.judge.api_key.get_secret_value() == JUDGE_KEY
            if role in ("sinks", "drift", "report"):
                assert config.judge.api_key is None  # only the processes that judge get the key
            if role != "report" and _scrape_token_set(values):
                # stored as is, read back by ragmon's loader as the same string
                token = config.metrics.scrape_token
                assert token is not None and token.get_secret_value() == SCRAPE_TOKEN
    assert checked >= (5 if distributed else 2)


def test_generated_api_key_is_a_working_key() -> None:
    """With no key given, ingest still gets one key (for tenant default), never an open endpoint."""
    docs = rendered("embedded")
    (deployment,) = of_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    keys = json.loads(container_environ(docs, container)["RAGMON_AUTH__API_KEYS"])
    ((key, tenant),) = keys.items()
    assert tenant == "default" and len(key) >= 32


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_selectors_and_named_ports_resolve(scenario: str) -> None:
    docs = rendered(scenario)
    labels = pod_labels(docs)
    for service in of_kind(docs, "Service"):
        selected = [pl for pl in labels if service["spec"]["selector"].items() <= pl.items()]
        assert selected, service["metadata"]["name"]
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    for service in of_kind(docs, "Service"):
        for deployment in deployments.values():
            pod = deployment["spec"]["template"]
            if service["spec"]["selector"].items() <= pod["metadata"]["labels"].items():
                container_ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
                assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    for policy in of_kind(docs, "NetworkPolicy"):
        match = policy["spec"]["podSelector"]["matchLabels"]
        assert any(match.items() <= pl.items() for pl in labels), policy["metadata"]["name"]


def test_ingest_service_carries_otlp_ports() -> None:
    service = named(rendered("embedded"), "Service", "demo-ragmon")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 4318, "grpc": 4317}


# -- Prometheus Operator and Grafana -----------------------------------------------------------------


def test_prometheus_rule_equals_the_dashboards_rule_file() -> None:
    (rule,) = of_kind(rendered("operator"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load((DASHBOARDS / "rules.yml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"], "the rule file has groups"


def test_grafana_dashboards_are_the_dashboards_files() -> None:
    docs = rendered("operator")
    dashboards = [
        c for c in of_kind(docs, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    files = {
        p.name: json.loads(p.read_text(encoding="utf-8")) for p in (DASHBOARDS / "grafana").glob("*.json")
    }
    assert files
    shipped = {}
    for config_map in dashboards:
        assert config_map["metadata"]["namespace"] == "monitoring"
        ((file_name, text),) = config_map["data"].items()
        shipped[file_name] = json.loads(text)
    assert shipped == files


def test_service_monitor_scrapes_every_metrics_port_as_the_rules_job() -> None:
    docs = rendered("operator")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    thresholds = yaml.safe_load((DASHBOARDS / "thresholds.yaml").read_text(encoding="utf-8"))
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoint_ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    scraped = set()
    for service in of_kind(docs, "Service"):
        if selector.items() <= service["metadata"]["labels"].items():
            ports = {p["name"] for p in service["spec"]["ports"]}
            scraped |= ports & endpoint_ports
            assert ports & endpoint_ports, f"{service['metadata']['name']} has no scraped port"
    assert scraped == {"http", "metrics"}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        job = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
        assert [r["replacement"] for r in job] == [thresholds["job"]]


@pytest.mark.parametrize("scenario", ["operator", "existing_secrets", "distributed"])
def test_every_process_serving_metrics_asks_for_the_scrape_token_the_monitor_sends(scenario: str) -> None:
    """Ingest and every worker serve /metrics: each gets the same token, from the Secret the
    ServiceMonitor reads it from; stored as is (Prometheus sends what it reads)."""
    docs = rendered(scenario)
    expected = SCRAPE_TOKEN if _scrape_token_set(SCENARIOS[scenario]) else None
    tokens = {}
    for name, pod in pod_specs(docs):
        for container in pod["containers"]:
            if container["args"][0] in ("serve", "worker"):
                tokens[name] = container_environ(docs, container).get("RAGMON_METRICS__SCRAPE_TOKEN")
    assert len(tokens) >= 4 and set(tokens.values()) == {expected}, tokens
    for monitor in of_kind(docs, "ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            ref = endpoint["authorization"]["credentials"]
            assert endpoint["authorization"]["type"] == "Bearer"
            assert secret_data(docs)[(ref["name"], ref["key"])] == SCRAPE_TOKEN


def test_a_scrape_token_of_other_characters_is_refused(tmp_path: Path) -> None:
    result = template({"metrics": {"scrapeToken": '"quoted-token-0123456789"'}}, tmp_path)
    assert result.returncode != 0 and "/metrics/scrapeToken" in result.stderr


def test_operator_objects_are_off_by_default() -> None:
    for scenario in ("embedded", "distributed"):
        kinds = {d["kind"] for d in rendered(scenario)}
        assert not kinds & {"ServiceMonitor", "PrometheusRule", "NetworkPolicy"}
        labels = [c["metadata"]["labels"] for c in of_kind(rendered(scenario), "ConfigMap")]
        assert not [label for label in labels if "grafana_dashboard" in label]


def test_reports_claim_is_served_by_ingest_only_when_shared() -> None:
    docs = rendered("operator")
    claim = named(docs, "PersistentVolumeClaim", "demo-ragmon-reports")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    ingest = named(docs, "Deployment", "demo-ragmon-ingest")["spec"]["template"]["spec"]
    mount = next(m for m in ingest["containers"][0]["volumeMounts"] if m["mountPath"] == "/data/reports")
    assert mount["readOnly"] is True
    (cronjob,) = of_kind(docs, "CronJob")
    assert cronjob["spec"]["timeZone"] == "UTC"
    job_mounts = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == "/data/reports" and not m.get("readOnly") for m in job_mounts)
    plain = named(rendered("distributed"), "Deployment", "demo-ragmon-ingest")["spec"]["template"]["spec"]
    assert all(m["mountPath"] != "/data/reports" for m in plain["containers"][0]["volumeMounts"])


# -- the image the chart runs -------------------------------------------------------------------------


def test_chart_matches_the_image_and_the_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == pyproject["project"]["version"]
    # the pod runs as the image's user, and the image installs extras that exist
    assert f"USER {values['podSecurityContext']['runAsUser']}:" in dockerfile
    extras = dockerfile.split('pip install ".[', 1)[1].split("]", 1)[0].split(",")
    assert set(extras) <= set(pyproject["project"]["optional-dependencies"])
    assert {"postgres", "kafka"} <= set(extras)
    assert 'ENTRYPOINT ["ragmon"]' in dockerfile and "ragmon" in pyproject["project"]["scripts"]
    with io.StringIO(dockerfile) as lines:
        froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms and all(image == "python:3.11-slim" for image in froms)


# -- disruption budgets, lag autoscaling, Ingress, TLS material ---------------------------------------


def mounted_file(pod: Doc, container: Doc, path: str) -> tuple[str, str, str]:
    """(volume kind, object name, key) of the Secret or ConfigMap item a container sees at `path`."""
    mount = next(m for m in container["volumeMounts"] if Path(path).is_relative_to(m["mountPath"]))
    assert mount.get("readOnly") is True, (path, "TLS material is mounted read-only")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    relative = str(Path(path).relative_to(mount["mountPath"]))
    if "secret" in volume:
        kind, name, source = "Secret", volume["secret"]["secretName"], volume["secret"]
    else:
        kind, name, source = "ConfigMap", volume["configMap"]["name"], volume["configMap"]
    (item,) = [i for i in source["items"] if i["path"] == relative]
    return kind, name, item["key"]


def containers(docs: tuple[Doc, ...]) -> Iterator[tuple[str, Doc, Doc]]:
    """(role, pod spec, container) of every ragmon container; role is serve, sinks, judge, drift or report."""
    for _, pod in pod_specs(docs):
        for container in pod["containers"]:
            args = container["args"]
            yield (args[2] if args[0] == "worker" else args[0]), pod, container


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_deployment_has_a_disruption_budget_that_lets_a_drain_proceed(scenario: str) -> None:
    docs = rendered(scenario)
    budgets = of_kind(docs, "PodDisruptionBudget")
    deployments = of_kind(docs, "Deployment")
    assert len(budgets) == len(deployments)
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, deployment["metadata"]["name"]
        # one pod at a time may go: never a budget that blocks a drain of a one-replica Deployment
        assert covering[0]["spec"] == {"maxUnavailable": 1, "selector": covering[0]["spec"]["selector"]}


def test_a_disruption_budget_may_keep_a_number_available_but_not_both(tmp_path: Path) -> None:
    values = {
        **SCENARIOS["distributed"],
        "workers": {"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": None}},
    }
    result = template(values, tmp_path)
    assert result.returncode == 0, result.stderr
    docs = tuple(d for d in yaml.safe_load_all(result.stdout) if d)
    sinks = named(docs, "PodDisruptionBudget", "demo-ragmon-sinks")
    assert sinks["spec"]["minAvailable"] == 1 and "maxUnavailable" not in sinks["spec"]
    both = {
        **SCENARIOS["distributed"],
        "workers": {"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}},
    }
    result = template(both, tmp_path)
    assert result.returncode != 0
    assert "workers.podDisruptionBudget: set one of minAvailable and maxUnavailable" in result.stderr


@pytest.mark.parametrize("metric", ["cpu", "keda", "lag"])
def test_more_sinks_workers_than_partitions_are_refused_for_every_metric(metric: str, tmp_path: Path) -> None:
    values = {
        **SCENARIOS["keda_sasl"],
        "kafka": {**SCENARIOS["keda_sasl"]["kafka"], "partitions": 6, "createTopics": False},
        "workers": {"autoscaling": {"enabled": True, "metric": metric, "maxReplicas": 7}},
    }
    result = template(values, tmp_path)
    assert result.returncode != 0
    assert "up to 7 sinks workers (workers.autoscaling.maxReplicas" in result.stderr
    assert "kafka.partitions is 6" in result.stderr
    values["workers"]["autoscaling"]["maxReplicas"] = 6
    assert template(values, tmp_path).returncode == 0


@pytest.mark.parametrize("scenario", ["strimzi", "keda_sasl"])
def test_keda_scales_the_sinks_workers_on_their_groups_lag_with_their_credentials(scenario: str) -> None:
    docs = rendered(scenario)
    values = SCENARIOS[scenario]
    kafka = values["kafka"]
    scaling = values["workers"]["autoscaling"]
    (scaled,) = of_kind(docs, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    sinks = named(docs, "Deployment", "demo-ragmon-sinks")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "demo-ragmon-sinks",
    }
    assert "replicas" not in sinks["spec"], "KEDA owns the replica count"
    assert not [
        h
        for h in of_kind(docs, "HorizontalPodAutoscaler")
        if h["spec"]["scaleTargetRef"]["name"] == "demo-ragmon-sinks"
    ]
    assert scaled["spec"]["maxReplicaCount"] == scaling["maxReplicas"] <= kafka.get("partitions", 6)
    assert scaled["spec"]["minReplicaCount"] == scaling.get("minReplicas", 2) >= 1
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert meta["bootstrapServers"].split(",") == kafka["bootstrapServers"]
    # the group the workers actually join (their loaded config), not a guess
    _, pod, container = next(c for c in containers(docs) if c[0] == "sinks")
    with_config = load_container_config(
        docs, container, pod, Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    )
    assert meta["consumerGroup"] == with_config.kafka.sinks_group
    assert meta["lagThreshold"] == str(scaling.get("lagPerReplica", 10000))
    assert meta["offsetResetPolicy"] == "earliest" and meta["allowIdleConsumers"] == "false"
    assert meta.get("tls") == ("enable" if kafka["securityProtocol"] in ("SSL", "SASL_SSL") else None)
    sasl = {"SCRAM-SHA-512": "scram_sha512"}.get(kafka.get("saslMechanism", ""))
    assert meta.get("sasl") == sasl
    # KEDA gets, from Secrets, exactly what the workers get
    (auth,) = of_kind(docs, "TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    secrets = secret_data(docs)
    given = {ref["parameter"]: secrets[(ref["name"], ref["key"])] for ref in auth["spec"]["secretTargetRef"]}
    environ = container_environ(docs, container)
    if sasl:
        assert given["username"] == with_config.kafka.sasl_username
        assert with_config.kafka.sasl_password is not None
        assert given["password"] == with_config.kafka.sasl_password.get_secret_value() == SASL_PASSWORD
    if "clientCertSecret" in kafka:
        assert (
            given["cert"] == secrets[mounted_file(pod, container, environ["RAGMON_KAFKA__SSL_CERTFILE"])[1:]]
        )
        assert given["key"] == secrets[mounted_file(pod, container, environ["RAGMON_KAFKA__SSL_KEYFILE"])[1:]]
        assert given["keyPassword"] == KEY_PASSWORD
    assert given["ca"] == secrets[mounted_file(pod, container, "/etc/ragmon/kafka-ca/ca.crt")[1:]]


def test_an_hpa_on_an_external_metric_scales_the_sinks_workers_on_their_backlog() -> None:
    docs = rendered("lag_hpa")
    (hpa,) = [
        h
        for h in of_kind(docs, "HorizontalPodAutoscaler")
        if h["spec"]["scaleTargetRef"]["name"] == "demo-ragmon-sinks"
    ]
    assert hpa["spec"]["maxReplicas"] == 6
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"] == {
        "name": "ragmon_kafka_backlog_records",
        "selector": {"matchLabels": {"group": "ragmon-sinks"}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "5000"}
    assert not of_kind(docs, "ScaledObject")


def test_keda_with_sasl_needs_a_password_for_keda_too(tmp_path: Path) -> None:
    values = {**SCENARIOS["keda_sasl"], "kafka": {**SCENARIOS["keda_sasl"]["kafka"], "saslPassword": ""}}
    result = template(values, tmp_path)
    assert result.returncode != 0
    assert "KEDA needs the SASL password" in result.stderr


def _ingress_paths(ingress: Doc) -> set[str]:
    return {p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}


def _routed(path: str, prefixes: set[str]) -> bool:
    """Kubernetes `Prefix` matching: whole path elements."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


@pytest.mark.parametrize("scenario", ["strimzi", "lag_hpa"])
def test_ingress_routes_otlp_api_review_and_reports_to_the_http_port_and_nothing_else(scenario: str) -> None:
    from service.api.app import create_app

    docs = rendered(scenario)
    (ingress,) = of_kind(docs, "Ingress")
    service = named(docs, "Service", "demo-ragmon")
    http_ports = {p["name"] for p in service["spec"]["ports"] if p.get("appProtocol") == "http"}
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            assert path["pathType"] == "Prefix"
            assert path["backend"]["service"]["name"] == service["metadata"]["name"]
            assert path["backend"]["service"]["port"]["name"] in http_ports
    # every route of the real app is routed, except the ones that stay inside the cluster
    app = create_app(load_config(environ={}))
    routes = {r.path for r in app.routes if hasattr(r, "methods")}  # type: ignore[attr-defined]
    internal = {"/metrics", "/healthz", "/readyz"}
    assert internal <= routes
    prefixes = _ingress_paths(ingress)
    assert {r for r in routes if not _routed(r, prefixes)} == internal
    for needed in ("/v1/traces", "/v1/logs", "/api/v1/feedback", "/review", "/reports/latest"):
        assert _routed(needed, prefixes), needed
    values = SCENARIOS[scenario]["ingress"]
    hosts = [rule.get("host") for rule in ingress["spec"]["rules"]]
    assert hosts == (values.get("hosts") or [None])
    assert ingress["spec"].get("tls", []) == values.get("tls", [])


def test_ingress_tls_for_a_host_it_does_not_serve_is_refused(tmp_path: Path) -> None:
    values = {
        "ingress": {
            "enabled": True,
            "hosts": ["a.example.com"],
            "tls": [{"secretName": "t", "hosts": ["b.example.com"]}],
        }
    }
    result = template(values, tmp_path)
    assert result.returncode != 0
    assert "ingress.tls names host b.example.com, which is not in ingress.hosts" in result.stderr


def test_kafka_client_certificate_reaches_only_the_processes_that_talk_to_kafka() -> None:
    docs = rendered("strimzi")
    cert = SCENARIOS["strimzi"]["kafka"]["clientCertSecret"]
    seen = set()
    for role, pod, container in containers(docs):
        environ = container_environ(docs, container)
        if role in ("serve", "sinks"):
            seen.add(role)
            for var, key in (
                ("RAGMON_KAFKA__SSL_CERTFILE", "certKey"),
                ("RAGMON_KAFKA__SSL_KEYFILE", "keyKey"),
            ):
                assert mounted_file(pod, container, environ[var]) == ("Secret", cert["name"], cert[key])
            volume = next(v for v in pod["volumes"] if v["name"] == "kafka-client")
            assert volume["secret"]["defaultMode"] == 0o400
        else:
            assert "RAGMON_KAFKA__SSL_CERTFILE" not in environ, role
            assert all(v.get("secret", {}).get("secretName") != cert["name"] for v in pod["volumes"]), role
    assert seen == {"serve", "sinks"}


def test_a_client_certificate_needs_a_tls_protocol(tmp_path: Path) -> None:
    kafka = {**SCENARIOS["strimzi"]["kafka"], "securityProtocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN"}
    result = template({**SCENARIOS["strimzi"], "kafka": kafka}, tmp_path)
    assert result.returncode != 0
    assert "kafka.securityProtocol must be SSL or SASL_SSL, not SASL_PLAINTEXT" in result.stderr


@pytest.mark.parametrize(
    ("scenario", "source"),
    [("strimzi", ("Secret", "pg-ca", "ca.pem")), ("lag_hpa", ("ConfigMap", "pg-ca-bundle", "bundle.pem"))],
)
def test_every_process_checks_postgresql_against_the_mounted_ca(
    scenario: str, source: tuple[str, str, str]
) -> None:
    docs = rendered(scenario)
    roles = set()
    for role, pod, container in containers(docs):
        environ = container_environ(docs, container)
        assert environ["PGSSLMODE"].startswith("verify-")
        assert mounted_file(pod, container, environ["PGSSLROOTCERT"]) == source, role
        roles.add(role)
    assert roles == {"serve", "sinks", "judge", "drift", "report"}
    data = {**EXISTING, **EXISTING_CONFIG_MAPS}
    assert data[source[1:]].startswith("-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize(
    ("postgresql", "message"),
    [
        ({"sslmode": "verify-full"}, "postgresql.sslmode verify-full checks the server's certificate"),
        (
            {"sslmode": "require", "caSecret": {"name": "a"}, "caConfigMap": {"name": "b"}},
            "set caSecret or caConfigMap, not both",
        ),
    ],
)
def test_postgresql_tls_settings_that_cannot_work_are_refused(
    postgresql: Doc, message: str, tmp_path: Path
) -> None:
    values = {
        **SCENARIOS["distributed"],
        "postgresql": {**SCENARIOS["distributed"]["postgresql"], **postgresql},
    }
    result = template(values, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr
