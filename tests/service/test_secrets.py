"""Secrets never shown: `ragmon config`, the config's repr and `ragmon serve`'s start-up log mask every
secret-typed setting (ingest API keys, Kafka SASL password, the database URL's password, the review
session secret, reviewer tokens, judge and Phoenix keys, passwords inside the judge and Phoenix URLs)
with one rule (`config.MASK`), and no configuration error repeats a secret: every secret-bearing
setting is fed through every error path (`SECRET_SETTINGS` x the tests below)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from service.cli import main as cli_main
from service.config import MASK, load_config, masked_url
from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "api_key": "sk-live-ingest-0123456789",
    "sasl": "kafka-sasl-pw-4242",
    "db": "db-pw-secret-77",
    "session": "s" * 20 + "ession-secret-xyz",
    "token": "reviewer-token-abcdef0123",
    "judge": "sk-judge-key-999",
    "phoenix": "phoenix-key-555",
}


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "ragmon.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(tmp_path / "data"),
                "auth": {"api_keys": {SECRETS["api_key"]: "acme", "sk-live-second-key-00": "acme"}},
                "kafka": {
                    "sasl_mechanism": "PLAIN",
                    "sasl_username": "ragmon",
                    "sasl_password": SECRETS["sasl"],
                },
                "store": {"url": f"postgresql+psycopg://ragmon:{SECRETS['db']}@db.internal:5432/ragmon"},
                "review": {
                    "session_secret": SECRETS["session"],
                    "reviewers": {"ann": {"token": SECRETS["token"], "tenants": ["acme"]}},
                },
                "judge": {"api_key": SECRETS["judge"]},
                "phoenix": {"api_key": SECRETS["phoenix"]},
            }
        )
    )
    return path


def test_ragmon_config_masks_every_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "--config", str(_config_file(tmp_path))]) == 0
    shown = capsys.readouterr().out
    for name, secret in SECRETS.items():
        assert secret not in shown, name
    assert "sk-live-second-key-00" not in shown
    assert f'"{MASK}#1": "acme"' in shown and f'"{MASK}#2": "acme"' in shown  # both keys, counted
    assert f"postgresql+psycopg://ragmon:{MASK}@db.internal:5432/ragmon" in shown
    # what the process uses is untouched
    config = load_config(environ={}, config_file=_config_file(tmp_path))
    assert config.store_url.endswith(f":{SECRETS['db']}@db.internal:5432/ragmon")
    assert (
        config.kafka.sasl_password is not None
        and config.kafka.sasl_password.get_secret_value() == SECRETS["sasl"]
    )
    assert SECRETS["api_key"] in config.auth.api_keys
    for secret in SECRETS.values():
        assert secret not in repr(config)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:pw@h:5/d", f"postgresql+psycopg://u:{MASK}@h:5/d"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
        ("not a url with user:pw@host", MASK),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown


def test_serve_logs_the_store_without_its_password(tmp_path: Path) -> None:
    raw = os.environ.get("DATABASE_URL")
    if not raw or not raw.startswith("postgresql"):
        pytest.skip("needs DATABASE_URL of a PostgreSQL server (scripts/test.sh starts one)")
    # the test server trusts loopback, so any password is accepted: the point is where it shows up
    url = sa.make_url(raw).set(drivername="postgresql+psycopg", password=SECRETS["db"])
    port = free_port()
    env = {
        **os.environ,
        "RAGMON_STORE__URL": url.render_as_string(hide_password=False),
        "RAGMON_LOG_LEVEL": "info",
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--port",
            str(port),
            "--grpc-port",
            "0",
            "--data-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).text
    finally:
        server.send_signal(signal.SIGTERM)
        log, _ = server.communicate(timeout=60)
    assert SECRETS["db"] not in log and SECRETS["db"] not in ready
    assert f":{MASK}@" in log  # the store is still named, masked


# -- every secret-bearing setting through every error path -------------------------------------------------

MARK = "sEcReT9f3k2m8x7q1w5e4r6t0y4u8i2o6p"  # 34 characters: long enough for every secret's minimum
SHORT = "sEcReT-short"  # a secret too short for its setting


def _setting(path: str, value: object) -> dict[str, Any]:
    """`value` at the dotted `path` of a settings mapping."""
    *parents, last = path.split(".")
    node: dict[str, Any] = {last: value}
    for part in reversed(parents):
        node = {part: node}
    return node


# (dotted setting, a valid value holding a secret, invalid values, each holding a secret); the secret
# searched for in the output is MARK, or SHORT where the invalid value is too short to hold MARK
SECRET_SETTINGS: list[tuple[str, object, list[object]]] = [
    ("auth.api_keys", {MARK: "acme"}, [{MARK: 5}, {MARK: ["acme"]}, {MARK: None}]),
    ("kafka.sasl_password", MARK, [[MARK], {"p": MARK}]),
    ("kafka.ssl_password", MARK, [[MARK]]),
    (
        "store.url",
        f"postgresql+psycopg://ragmon:{MARK}@db:5432/ragmon",
        [
            f"postgresql+psycopg://ragmon:{MARK}@db:port/ragmon",
            f"no scheme ragmon:{MARK}@db",
            [MARK],
        ],
    ),
    ("store.url", f"sqlite:///ragmon.db?password={MARK}", [f"sq lite:///x.db?password={MARK}"]),
    ("review.session_secret", MARK, [SHORT, [MARK]]),
    (
        "review.reviewers",
        {"ann": {"token": MARK}},
        [
            {"ann": {"token": SHORT}},
            {"ann": {"token": MARK, "token_sha256": "0" * 64}},
            {"ann": {"token": [MARK]}},
        ],
    ),
    ("metrics.scrape_token", MARK, [[MARK]]),
    ("judge.api_key", MARK, [[MARK]]),
    ("judge.base_url", f"https://judge:{MARK}@llm.internal/v1", [f"ftp://judge:{MARK}@llm.internal", [MARK]]),
    ("judge.base_url", f"https://llm.internal/v1?api_key={MARK}", [f"llm.internal/v1?api_key={MARK}"]),
    ("phoenix.api_key", MARK, [[MARK]]),
    ("phoenix.endpoint", f"http://px:{MARK}@phoenix:6006", [f"phoenix:6006 px:{MARK}@", [MARK]]),
    ("redaction.key", MARK, [SHORT, [MARK]]),
]
SETTING_IDS = [f"{path}-{n}" for n, (path, _, _) in enumerate(SECRET_SETTINGS)]
EXPECT_MASKED = ("auth", "kafka", "review", "metrics", "judge", "phoenix", "store")


def _secret_in(value: object) -> str:
    return MARK if MARK in json.dumps(value) else SHORT


def _ragmon(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli_main(list(args))
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(("RAGMON_", "OPENAI_")):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(("path", "valid", "invalid"), SECRET_SETTINGS, ids=SETTING_IDS)
def test_no_error_path_and_no_output_shows_a_secret(
    path: str,
    valid: object,
    invalid: list[object],
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    section, name = path.split(".")
    env_name = f"RAGMON_{section.upper()}__{name.upper()}"
    as_env = lambda v: v if isinstance(v, str) else json.dumps(v)  # noqa: E731
    data_dir = ["--data-dir", str(tmp_path / "data")]

    # shown: `ragmon config` and the config's repr, with the secret set in a file and in the environment
    config_file = tmp_path / "ragmon.yaml"
    config_file.write_text(yaml.safe_dump(_setting(path, valid)))
    code, shown = _ragmon(capsys, "config", "--config", str(config_file), *data_dir)
    assert code == 0 and MARK not in shown, shown
    clean_env.setenv(env_name, as_env(valid))
    code, shown = _ragmon(capsys, "config", *data_dir)
    assert code == 0 and MARK not in shown, shown
    assert MARK not in repr(load_config()) and MARK not in str(load_config())

    # another setting is wrong while the secret is set: the error names that setting only
    clean_env.setenv("RAGMON_SERVER__PORT", "-1")
    code, shown = _ragmon(capsys, "config", *data_dir)
    assert code == 2 and "server.port" in shown and MARK not in shown, shown
    clean_env.delenv("RAGMON_SERVER__PORT")
    clean_env.delenv(env_name)

    # the secret's own value is wrong, from the environment and from a file: the error names the field
    for bad in invalid:
        secret = _secret_in(bad)
        clean_env.setenv(env_name, as_env(bad))
        code, shown = _ragmon(capsys, "config", *data_dir)
        assert code == 2 and f"at {path}" in shown and secret not in shown, shown
        clean_env.delenv(env_name)
        config_file.write_text(yaml.safe_dump(_setting(path, bad)))
        code, shown = _ragmon(capsys, "config", "--config", str(config_file), *data_dir)
        assert code == 2 and f"at {path}" in shown and secret not in shown, shown

    # files and variables that do not parse, broken on the secret's own line
    lines = yaml.safe_dump(_setting(path, valid)).splitlines()
    at = next(i for i, line in enumerate(lines) if MARK in line)
    for broken_line in (lines[at].replace(": ", ": [", 1), lines[at] + ": x", "\t" + lines[at]):
        config_file.write_text("\n".join([*lines[:at], broken_line, *lines[at + 1 :]]) + "\n")
        code, shown = _ragmon(capsys, "config", "--config", str(config_file), *data_dir)
        assert code == 2 and "not valid YAML" in shown and MARK not in shown, shown
    json_file = tmp_path / "ragmon.json"
    json_file.write_text(json.dumps(_setting(path, valid))[:-1])
    code, shown = _ragmon(capsys, "config", "--config", str(json_file), *data_dir)
    assert code == 2 and "not valid JSON" in shown and MARK not in shown, shown
    clean_env.setenv(env_name, "{" + json.dumps(valid) + ",")
    code, shown = _ragmon(capsys, "config", *data_dir)
    assert code == 2 and env_name in shown and MARK not in shown, shown


def test_an_api_key_one_level_too_high_is_not_named(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("RAGMON_AUTH", json.dumps({MARK: "acme"}))
    code, shown = _ragmon(capsys, "config")
    assert code == 2 and "auth.<unknown key>" in shown and MARK not in shown, shown
    clean_env.setenv("RAGMON_AUTH", json.dumps({"allow_loopback_without_kee": True}))
    code, shown = _ragmon(capsys, "config")
    assert code == 2 and "auth.allow_loopback_without_kee" in shown  # a misspelt setting still is


def test_every_secret_typed_setting_is_in_the_table() -> None:
    """A new secret-typed setting (SecretStr, or a URL or key map that can hold one) fails here until it
    is added to SECRET_SETTINGS, so it goes through the error paths above."""
    from pydantic import BaseModel, SecretStr

    from service.config import RagmonConfig

    found: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
            elif SecretStr in getattr(annotation, "__args__", (annotation,)):
                found.add(f"{prefix}{name}")

    walk(RagmonConfig, "")
    covered = {path for path, _, _ in SECRET_SETTINGS}
    # reviewer tokens sit in a map of ReviewerConfig, walked here by hand
    found |= {"review.reviewers"}
    # the URL settings that may carry a password, and the key map, are secret-bearing too
    found |= {"store.url", "judge.base_url", "phoenix.endpoint", "auth.api_keys"}
    assert found <= covered, found - covered


def test_serve_never_prints_a_secret_on_its_error_paths(tmp_path: Path) -> None:
    """`ragmon serve` with every secret set, ending on the errors a start-up can meet: a port taken,
    and a store that cannot be opened (its URL carrying a password in the query)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGMON_", "OPENAI_"))}
    for path, valid, _ in SECRET_SETTINGS:
        if path not in ("store.url", "kafka.ssl_password", "kafka.sasl_password"):
            section, name = path.split(".")
            env[f"RAGMON_{section.upper()}__{name.upper()}"] = (
                valid if isinstance(valid, str) else json.dumps(valid)
            )
    env["RAGMON_PHOENIX__FORWARD"] = env["RAGMON_PHOENIX__ANNOTATE"] = "false"
    env["RAGMON_SERVER__INGEST_PROCESSES"] = "0"  # no worker processes to start and stop
    command = [sys.executable, "-m", "service.cli", "serve", "--grpc-port", "0", "--data-dir", str(tmp_path)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [*command, "--port", port], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 1 and "not available" in done.stderr, done.stderr
    assert MARK not in done.stdout + done.stderr
    env["RAGMON_STORE__URL"] = f"sqlite:///{tmp_path}/missing/dir/ragmon.db?password={MARK}"
    done = subprocess.run(
        [*command, "--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "unavailable" in done.stderr, done.stderr
    assert MARK not in done.stdout + done.stderr
    assert f"password={MASK}" in done.stderr  # the store is still named, masked
