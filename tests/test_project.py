"""Project contracts: the README table is current, public names are declared, the demo command runs."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_readme_configuration_table_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/update_readme.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("package", ["service", "sampler", "detectors"])
def test_all_declares_exactly_the_public_names(package: str) -> None:
    module = importlib.import_module(package)
    declared = set(module.__all__)
    assert declared, f"{package} declares no public names"
    missing = [name for name in declared if not hasattr(module, name)]
    assert missing == []
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, type(os)) and name != "annotations"
    }
    assert public <= declared, f"{package} exposes undeclared names: {sorted(public - declared)}"


def test_demo_command_starts_ragmon_sends_traffic_and_reports(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "demo",
            "--requests",
            "40",
            "--exit",
            "--port",
            str(port),
            "--grpc-port",
            str(grpc_port),
            "--data-dir",
            str(tmp_path / "data"),
            "--seed",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # the summary prints "<label padded to 25 columns><value>"
    lines = {line[:25].strip(): line[25:].strip() for line in result.stdout.splitlines() if line.strip()}
    assert float(lines["traces stored"]) == 40
    assert float(lines["spend (USD)"]) > 0
    assert f"http://127.0.0.1:{port}/metrics" in result.stdout
    assert (tmp_path / "data" / "ragmon.db").exists()
