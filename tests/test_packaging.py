"""ragmon as a user installs it: the README's install lines (a clone, a git URL, a wheel), no extras.

ragmon is not on PyPI, so the README installs it from its source. The slow tests build the wheel from a
copy of the sources, install it without extras into a fresh virtual environment (uv when it is on PATH,
else venv + pip; either may fetch the dependencies from the package index) and run every command from
there, so a module that only an extra brings, or package data left out of the wheel, fails here rather
than on a user's machine; and they run the README's other install lines, a clone (with its extras) and a
git URL, with a local git repository of the sources standing in for GitHub. The fast tests keep `ragmon
--help` light (building the parser imports nothing heavy) and check that a missing extra is named in one
line.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from service.cli import main as ragmon
from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "service", "sampler", "detectors")

# what `ragmon --help` must not load: each costs tenths of a second or is an optional extra's package
HEAVY = (
    "fastapi",
    "grpc",
    "httpx",
    "httpx2",
    "kafka",
    "numpy",
    "openai",
    "opentelemetry",
    "phoenix",
    "psycopg",
    "pydantic_settings",
    "scipy",
    "sqlalchemy",
    "uvicorn",
    "yaml",
)

# what pip and uv print when the package index cannot be reached
OFFLINE_SIGNS = (
    "NewConnectionError",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Name or service not known",
    "dns error",
    "Failed to fetch",
)


def test_building_the_parser_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import service.cli\n"
        "service.cli.build_parser()\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(result.stdout.split())
    assert loaded & set(HEAVY) == set(), "import these where the command runs, not at module level"


@pytest.mark.parametrize(
    ("command", "env", "blocked", "extra"),
    [
        (["worker"], {"RAGMON_BUS__KIND": "kafka"}, "kafka", "kafka"),
        (["serve"], {"RAGMON_BUS__KIND": "kafka"}, "kafka", "kafka"),
        (["serve"], {"RAGMON_STORE__URL": "postgresql+psycopg://u@127.0.0.1:1/db"}, "psycopg", "postgres"),
        (["serve"], {"RAGMON_JUDGE__BACKEND": "phoenix_evals"}, "phoenix.evals", "phoenix"),
        (["demo", "--exit"], {"RAGMON_PHOENIX__ENDPOINT": "http://127.0.0.1:1"}, "phoenix.client", "phoenix"),
        # found missing only when the store opens, not by the check before a server starts
        (["drift", "list"], {"RAGMON_STORE__URL": "postgresql://u@127.0.0.1:1/db"}, "psycopg", "postgres"),
    ],
    ids=["worker-kafka", "serve-kafka", "serve-postgres", "serve-phoenix-evals", "demo-phoenix", "drift-pg"],
)
def test_a_missing_extra_is_named_in_one_line(
    command: list[str],
    env: dict[str, str],
    blocked: str,
    extra: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(sys.modules, blocked, None)  # imports as if it were not installed
    # only the commands that listen take the server's flags (the others refuse them)
    listens = command[0] in ("serve", "demo")
    ports = ["--port", str(free_port()), "--grpc-port", "0"] if listens else []
    code = ragmon([*command, "--data-dir", str(tmp_path), *ports])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith(f"ragmon {command[0]}: ") and err.rstrip().endswith(
        f"pip install 'ragmon[{extra}]'"
    )


# -- the wheel, installed without extras into a fresh virtual environment --------------------------------


def _run(command: list[str | Path], what: str) -> str:
    """Run a build or install step; skip the test when the package index cannot be reached."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    output: str = result.stdout + result.stderr
    if result.returncode != 0 and any(sign in output for sign in OFFLINE_SIGNS):
        pytest.skip(f"cannot {what} without the package index (offline?): {output.strip().splitlines()[-1]}")
    assert result.returncode == 0, f"{what} failed:\n{output}"
    return output


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a copy: setuptools' build/ in the work tree can hold modules deleted since
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], "build the wheel")
    (built,) = out.glob("ragmon-*.whl")
    return built


@pytest.fixture(scope="module")
def bin_dir(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin` of a fresh virtual environment with the wheel installed, without extras."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    uv = shutil.which("uv")
    if uv is not None:
        _run([uv, "venv", "-q", "--python", sys.executable, venv], "create the venv")
        _run([uv, "pip", "install", "-q", "--python", venv / "bin" / "python", wheel], "install the wheel")
    else:
        _run([sys.executable, "-m", "venv", venv], "create the venv")
        _run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], "install the wheel")
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import service; print(service.__file__)"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=venv,  # not the work tree, whose `service` the current directory would put first
        check=True,
    ).stdout
    assert where.startswith(str(venv)), f"the test must run the installed package, not {where}"
    return venv / "bin"


def _env(**extra: str) -> dict[str, str]:
    """The environment of an installed `ragmon`: none of this process's ragmon settings or import paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_") and k != "PYTHONPATH"}
    return {**env, **extra}


def _ragmon(bin_dir: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [bin_dir / "ragmon", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
        cwd=bin_dir.parent,
    )


@pytest.mark.slow
def test_the_wheel_holds_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "service/conventions/prices.json",
        "service/py.typed",
        "sampler/py.typed",
        "detectors/py.typed",
    ):
        assert required in names
    review = ROOT / "service" / "review"
    for folder in ("templates", "static"):
        shipped = {p.relative_to(ROOT).as_posix() for p in (review / folder).iterdir() if p.is_file()}
        assert shipped, f"service/review/{folder} is empty"
        assert shipped <= names, f"left out of the wheel: {sorted(shipped - names)}"
    assert any(n.startswith("service/review/templates/") and n.endswith(".html") for n in names)


@pytest.mark.slow
def test_help_takes_under_a_second_of_cpu(bin_dir: Path) -> None:
    assert _ragmon(bin_dir, "--help").returncode == 0  # the first run also writes the bytecode caches
    for command in (
        [],
        ["serve"],
        ["demo"],
        ["report"],
        ["drift", "list"],
        ["eval", "retrieval"],
        ["worker"],
    ):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = _ragmon(bin_dir, *command, "--help")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert result.returncode == 0, result.stderr
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 1.0, f"ragmon {' '.join(command)} --help took {cpu:.2f} s of CPU"


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [["eval", "retrieval"], ["probe"], ["probe", "score"], ["golden", "load"], ["review", "export"]],
)
def test_every_command_has_help(bin_dir: Path, command: list[str]) -> None:
    result = _ragmon(bin_dir, *command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: ragmon {' '.join(command)}")


@pytest.mark.slow
def test_config_prints_the_effective_configuration(bin_dir: Path, tmp_path: Path) -> None:
    result = _ragmon(bin_dir, "config", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["data_dir"] == str(tmp_path / "data")


def _wait_healthy(url: str, server: subprocess.Popen[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        assert server.poll() is None, f"ragmon serve exited with {server.returncode}"
        assert time.monotonic() < deadline, "ragmon serve never answered /healthz"
        time.sleep(0.2)


@pytest.mark.slow
def test_serve_then_the_offline_commands_on_its_data(bin_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    server = subprocess.Popen(
        [bin_dir / "ragmon", "serve", "--port", str(port), "--grpc-port", "0", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server)
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate(timeout=30)
    # uvicorn stops in order, then re-raises the SIGTERM it caught, so the process ends by that signal
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Application shutdown complete" in err and "Traceback" not in err, err
    assert (data / "ragmon.db").exists()

    report = _ragmon(bin_dir, "report", "--data-dir", str(data), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "report.md").exists()

    drift = _ragmon(bin_dir, "drift", "list", "--data-dir", str(data))
    assert drift.returncode == 0, drift.stderr
    assert json.loads(drift.stdout) == []

    golden = tmp_path / "golden.jsonl"
    export = _ragmon(bin_dir, "review", "export", "--data-dir", str(data), "--out", str(golden))
    assert export.returncode == 0, export.stderr
    assert golden.read_text(encoding="utf-8") == "" and "exported 0 reviewed questions" in export.stderr


@pytest.mark.slow
def test_the_demo_runs_and_exits(bin_dir: Path, tmp_path: Path) -> None:
    result = _ragmon(
        bin_dir,
        *("demo", "--exit", "--requests", "10", "--seed", "3"),
        *("--port", str(free_port()), "--grpc-port", "0", "--data-dir", str(tmp_path / "data")),
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # the list prints "<label padded to 25 columns><value>    <where to look>"
    lines = {line[:25].strip(): line[25:].split() for line in result.stdout.splitlines() if line.strip()}
    assert float(lines["traces stored"][0]) == 10


@pytest.mark.slow
def test_the_kafka_worker_names_its_extra(bin_dir: Path, tmp_path: Path) -> None:
    result = _ragmon(bin_dir, "worker", "--data-dir", str(tmp_path / "data"), RAGMON_BUS__KIND="kafka")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "kafka-python" in result.stderr and "pip install 'ragmon[kafka]'" in result.stderr


# -- the README's install lines -------------------------------------------------------------------------

GITHUB = "https://github.com/ragmon/ragmon"


def _readme_installs() -> list[list[str]]:
    """The arguments of each `pip install` in the README's install block, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- install:start -->", 1)[1].split("<!-- install:end -->", 1)[0]
    installs = []
    for line in block.splitlines():
        for command in line.split("#", 1)[0].split("&&"):
            words = shlex.split(command)
            if words and words[0].endswith("pip") and words[1:2] == ["install"]:
                installs.append(words[2:])
    return installs


def test_the_readme_installs_from_source_never_from_pypi() -> None:
    installs = _readme_installs()
    assert installs == [
        ["."],
        [".[kafka,postgres]"],
        [f"git+{GITHUB}"],
        [f"dist/ragmon-{_version()}-py3-none-any.whl"],
    ]
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"pip install '?ragmon'?(\s|$|`)", text), "ragmon is not on PyPI"
    assert f"git clone {GITHUB}" in text


def _version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert found is not None
    return found.group(1)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sources as a git repository: what `git clone` of the README gives, and a git URL to install."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed; the README's clone and git-URL lines need it")
    repo = tmp_path_factory.mktemp("clone") / "ragmon"
    repo.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, repo / name)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "sources"]):
        subprocess.run(
            [git, "-c", "user.name=t", "-c", "user.email=t@example.org", *command], cwd=repo, check=True
        )
    return repo


def _fresh_venv(where: Path) -> tuple[Path, list[str | Path]]:
    """A new virtual environment and the command that installs into it (uv pip, else its pip)."""
    uv = shutil.which("uv")
    if uv is not None:
        _run([uv, "venv", "-q", "--python", sys.executable, where], "create the venv")
        return where / "bin", [uv, "pip", "install", "-q", "--python", where / "bin" / "python"]
    _run([sys.executable, "-m", "venv", where], "create the venv")
    return where / "bin", [where / "bin" / "python", "-m", "pip", "install", "-q"]


def _install(install: list[str | Path], args: list[str], cwd: Path) -> None:
    result = subprocess.run([*install, *args], capture_output=True, text=True, timeout=900, cwd=cwd)
    output = result.stdout + result.stderr
    if result.returncode != 0 and any(sign in output for sign in OFFLINE_SIGNS):
        pytest.skip(f"cannot install without the package index (offline?): {output.strip().splitlines()[-1]}")
    assert result.returncode == 0, f"pip install {' '.join(args)} failed:\n{output}"


@pytest.mark.slow
def test_the_readme_clone_lines_install_ragmon_and_its_extras(clone: Path, tmp_path: Path) -> None:
    plain, extras = _readme_installs()[:2]
    bin_dir, install = _fresh_venv(clone / ".venv")
    _install(install, plain, clone)
    assert _ragmon(bin_dir, "config", "--data-dir", str(tmp_path / "data")).returncode == 0
    missing = _ragmon(bin_dir, "worker", "--data-dir", str(tmp_path / "data"), RAGMON_BUS__KIND="kafka")
    assert missing.returncode == 2 and "pip install 'ragmon[kafka]'" in missing.stderr
    _install(install, extras, clone)
    imports = subprocess.run(
        [bin_dir / "python", "-c", "import kafka, psycopg, crc32c"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert imports.returncode == 0, imports.stderr


@pytest.mark.slow
def test_the_readme_git_url_line_installs_ragmon(clone: Path, tmp_path: Path) -> None:
    (url,) = _readme_installs()[2]
    bin_dir, install = _fresh_venv(tmp_path / "env")
    _install(install, [url.replace(GITHUB, f"file://{clone}")], tmp_path)
    result = _ragmon(bin_dir, "config", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["data_dir"] == str(tmp_path / "data")


@pytest.mark.slow
def test_the_readme_wheel_line_names_the_wheel_the_build_makes(wheel: Path) -> None:
    # the build itself is the `wheel` fixture's `pip wheel --no-deps -w DIR .`, and `bin_dir` installs it
    (path,) = _readme_installs()[3]
    assert Path(path).name == wheel.name
