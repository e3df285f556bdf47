"""Secrets never shown: `ragmon config`, the config's repr and `ragmon serve`'s start-up log mask every
secret-typed setting (ingest API keys, Kafka SASL password, the database URL's password, the review
session secret, reviewer tokens, judge and Phoenix keys) with one rule (`config.MASK`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
