"""Project contracts: the README table is current, public names are declared, the demo command runs."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port
from tests.processes import descendants, wait_gone

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


def _demo(port: int, grpc_port: int, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
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
            str(data),
            "--seed",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_demo_command_starts_ragmon_sends_traffic_and_reports(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    result = _demo(port, grpc_port, tmp_path / "data")
    assert result.returncode == 0, result.stdout + result.stderr
    look = look_list(result.stdout)
    assert look["traces stored"].split()[0] == "40"
    assert look["regenerations by source"]  # labelled by source, not one number against the demo's
    assert f"http://127.0.0.1:{port}/metrics" in result.stdout
    assert (tmp_path / "data" / "ragmon.db").exists()
    # again in the same place: the first run's data is moved aside, said so, and not counted again;
    # on port 0 this time (4318 is often an OTel collector's): the system picks one, the demo finds it
    again = _demo(0, 0, tmp_path / "data")
    assert again.returncode == 0, again.stdout + again.stderr
    running = re.search(r"ragmon is running at http://127\.0\.0\.1:(\d+)", again.stdout)
    assert running is not None and int(running[1]) > 0, again.stdout
    assert f"the earlier demo's data was moved to {tmp_path / 'data.previous'}" in again.stderr
    assert look_list(again.stdout)["traces stored"].split()[0] == "40"
    assert (tmp_path / "data.previous" / "ragmon.db").exists()


def look_list(stdout: str) -> dict[str, str]:
    """The demo's "what to look at" list, label -> value (the label is padded to 25 columns)."""
    lines = stdout.split("what to look at (numbers from ragmon):\n", 1)[1].splitlines()
    return {
        line[2:27].strip(): line[27:].strip() for line in lines if line.startswith("  ") and line[2] != " "
    }


def _serve_or_demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    command = [sys.executable, "-m", "service.cli", *args, "--port", str(port), "--grpc-port", "0"]
    env = {**os.environ, "RAGMON_SERVER__INGEST_PROCESSES": "1"}  # worker processes even on one CPU
    command += ["--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    return process, port


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_ingest_workers_end_when_the_server_is_killed(tmp_path: Path) -> None:
    server, port = _serve_or_demo(tmp_path, "serve")
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "ragmon serve never became ready"
            time.sleep(0.2)
        workers = descendants(server.pid)
        # the forkserver, a decoder and a builder, and multiprocessing's resource tracker
        assert len(workers) >= 3, workers
    finally:
        server.kill()  # no shutdown of its own: the workers end on their call pipes' end of file
        server.communicate(timeout=30)
    assert wait_gone(workers, timeout_s=20) == set()


def _sigterm_demo(
    tmp_path: Path, args: tuple[str, ...], on_line: str, wait_s: float, signals: int, timeout_s: float
) -> tuple[int, str, set[int]]:
    """Run `ragmon demo args`, send SIGTERM `signals` times (0.3 s apart) `wait_s` after a stderr line
    containing `on_line`; its return code, the rest of its stderr, and its processes when signalled."""
    demo, _ = _serve_or_demo(tmp_path, "demo", *args)
    assert demo.stderr is not None
    watchdog = threading.Timer(180, demo.kill)  # a demo that hangs must not hang the suite
    watchdog.start()
    try:
        for line in demo.stderr:  # ends at EOF if the demo dies first
            if on_line in line:
                break
        workers = descendants(demo.pid)
        time.sleep(wait_s)
        for _ in range(signals):
            demo.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        _, rest = demo.communicate(timeout=timeout_s)
    finally:
        watchdog.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.communicate(timeout=30)
    return demo.returncode, rest, workers


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_sigterm_while_the_demo_sends_traffic_stops_ragmon_too(tmp_path: Path) -> None:
    """The interrupt used to leave the demo at once, past the server's stop: the process then hung at
    exit joining its ingest workers, which nobody had stopped."""
    args = ("--requests", "100000", "--rate", "20", "--seed", "1")
    # 2 s: well into the traffic
    code, rest, workers = _sigterm_demo(tmp_path, args, "sending demo traffic", 2.0, 1, timeout_s=90)
    assert code == 130, rest
    assert not any(sign in rest for sign in ("Traceback", "leaked", "did not stop", "ERROR")), rest
    assert wait_gone(workers, timeout_s=20) == set()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.parametrize("signals", [1, 2], ids=["once", "twice"])
def test_sigterm_stops_the_running_demo_cleanly(tmp_path: Path, signals: int) -> None:
    """Twice: `timeout make demo` signals make and the demo both; the second must not cut the stop short."""
    args = ("--requests", "3", "--seed", "1")
    code, rest, workers = _sigterm_demo(tmp_path, args, "keeps running", 0.0, signals, timeout_s=60)
    assert workers, "the demo's ragmon runs ingest worker processes"
    assert code == 0, rest
    assert not any(sign in rest for sign in ("Traceback", "leaked", "Exception ignored", "ERROR")), rest
    assert wait_gone(workers, timeout_s=20) == set()
