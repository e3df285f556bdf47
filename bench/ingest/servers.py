"""The two servers the ingest benchmark compares: ragmon and Arize Phoenix, each as its own process.

Each `Server` starts its command with a fresh data directory on loopback,
waits until its health URL answers, samples the resident memory and CPU time of its
whole process tree (`RssSampler`), counts what it has persisted by reading its
SQLite file read-only, and stops its process group on exit (SIGTERM, then
SIGKILL after 15 s). Nothing here is shared between the two servers.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RssSampler:
    """Samples the summed RSS of a process and its children every `interval_s` in a daemon thread."""

    pid: int
    interval_s: float = 0.1
    peak_bytes: int = 0
    samples: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def current(self) -> int:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by the process tree (live children included)."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self.current()
            self.samples.append((time.monotonic(), rss))
            self.peak_bytes = max(self.peak_bytes, rss)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def peak_since(self, t: float) -> int:
        return max((rss for at, rss in self.samples if at >= t), default=0)


class Server:
    """A server process under test. Subclasses say how to start it and how to count what it stored."""

    name = "server"
    health_path = "/healthz"
    start_timeout_s = 60.0

    def __init__(self, workdir: Path, log_dir: Path) -> None:
        self.workdir = workdir
        self.log_path = log_dir / f"{self.name}.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.rss: RssSampler | None = None
        self.startup_s = 0.0
        self.cwd = REPO

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def persisted(self) -> int:
        """Traces whose every span is stored and queryable."""
        raise NotImplementedError

    def _count(self, db: Path, sql: str) -> int:
        if not db.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
                return int(conn.execute(sql).fetchone()[0])
        except sqlite3.OperationalError:
            return 0  # table not created yet, or a writer holds an exclusive lock for a moment

    def __enter__(self) -> Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv, env = self.command()
        log = self.log_path.open("wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.cwd,
        )
        log.close()
        deadline = t0 + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n" + "\n".join(tail))
            try:
                if httpx.get(self.url + self.health_path, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        else:
            self.__exit__(None, None, None)
            raise RuntimeError(
                f"{self.name} did not answer {self.health_path} in {self.start_timeout_s:.0f} s"
            )
        self.startup_s = time.monotonic() - t0
        self.rss = RssSampler(self.proc.pid)
        self.rss.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.rss is not None:
            self.rss.stop()
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class Ragmon(Server):
    """`ragmon serve` from `source` (a checkout or an exported commit; default: this working tree)."""

    name = "ragmon"

    def __init__(
        self, workdir: Path, log_dir: Path, source: Path | None = None, settings: dict[str, str] | None = None
    ) -> None:
        super().__init__(workdir, log_dir)
        self.source = source
        self.settings = settings or {}  # RAGMON_* variables, e.g. {"RAGMON_WAL__ACK": "received"}

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--grpc-port", "0", "--data-dir", str(self.workdir)]
        env = {"RAGMON_LOG_LEVEL": "warning", **self.settings}
        if self.source is not None:
            # the source tree comes first on sys.path, ahead of the editable install
            self.cwd = self.source
            env["PYTHONPATH"] = str(self.source)
        return argv, env

    def persisted(self) -> int:
        return self._count(self.workdir / "ragmon.db", "SELECT count(*) FROM traces")


class Phoenix(Server):
    name = "phoenix"
    start_timeout_s = 240.0  # its first start runs every database migration

    def __init__(self, workdir: Path, log_dir: Path, executable: Path) -> None:
        super().__init__(workdir, log_dir)
        self.executable = executable
        self.grpc_port = free_port()

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = {
            "PHOENIX_WORKING_DIR": str(self.workdir),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        return [str(self.executable), "serve"], env

    def persisted(self) -> int:
        # Phoenix writes spans in its own batches; a trace counts once all four of its spans are queryable
        return self._count(self.workdir / "phoenix.db", "SELECT count(*) FROM spans") // 4
