"""The `ragmon` command: serve, demo, worker, config, drift, report, review, eval, probe, golden.

Building the parser imports only argparse and the commands' flag modules (`service/*/cli.py`,
`probes/eval_cli.py`, `review/export.py`), which import nothing heavy at load; each command imports
what it runs (the app, the store, SciPy, Kafka, ...) when it runs. So `ragmon --help` costs a fraction
of a second (tests/test_packaging.py keeps it so), and an optional package that is not installed fails
only the command that needs it, with one line naming the extra that installs it (`missing_extras`).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.demo import cli as demo_cli
from service.drift import cli as drift_cli
from service.probes import cli as probe_cli
from service.probes import eval_cli
from service.report import cli as report_cli
from service.review import export as review_export
from service.review import label_plan

if TYPE_CHECKING:
    from service.config import RagmonConfig


def config_flags() -> argparse.ArgumentParser:
    """The flags of every command that reads ragmon's config and store: a parent parser."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("configuration")
    group.add_argument("--config", type=Path, help="YAML or JSON config file (RAGMON_* env vars override it)")
    group.add_argument("--data-dir", type=Path, help="directory for the SQLite file and reports")
    return parent


def server_flags() -> argparse.ArgumentParser:
    """The flags of the commands that listen (serve, demo): a parent parser."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("server")
    group.add_argument("--host", help="HTTP listen address (default 127.0.0.1)")
    group.add_argument("--port", type=int, help="HTTP port (default 4318)")
    group.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (default 4317; 0 disables)")
    group.add_argument("--dev", action="store_true", default=None, help="allow the sample API key")
    return parent


def config_from_args(args: argparse.Namespace) -> RagmonConfig:
    """Flags win over environment, which wins over the config file. A command without the server
    flags (`server_flags`) leaves the server settings to the file and the environment."""
    from service.config import load_config

    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    for flag, key in (("host", "host"), ("port", "port"), ("grpc_port", "grpc_port")):
        if getattr(args, flag, None) is not None:
            server[key] = getattr(args, flag)
    if server:
        overrides["server"] = server
    if args.data_dir is not None:
        overrides["data_dir"] = str(args.data_dir)
    if getattr(args, "dev", None):
        overrides["dev"] = True
    return load_config(config_file=args.config, overrides=overrides)


# optional packages: the module ragmon imports -> (the distribution, the pyproject extra that installs it)
_OPTIONAL = {
    "kafka": ("kafka-python", "kafka"),
    "psycopg": ("psycopg", "postgres"),
    "phoenix": ("arize-phoenix-client and arize-phoenix-evals", "phoenix"),
    "phoenix.client": ("arize-phoenix-client", "phoenix"),
    "phoenix.evals": ("arize-phoenix-evals", "phoenix"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return False


def _optional_modules(config: RagmonConfig) -> list[tuple[str, str]]:
    """(feature, module) for every optional package that `config` uses."""
    needs = []
    if config.bus.kind == "kafka":
        needs.append(("the Kafka bus (bus.kind=kafka)", "kafka"))
    if config.store_url.startswith("postgres"):
        needs.append(("a PostgreSQL store", "psycopg"))
    if config.judge.backend == "phoenix_evals":
        needs.append(("judge.backend=phoenix_evals", "phoenix.evals"))
    if config.phoenix.annotating:
        needs.append(("Phoenix annotations (phoenix.annotate)", "phoenix.client"))
    return needs


def missing_extras(config: RagmonConfig) -> str | None:
    """What `config` needs that is not installed and the `pip install` that adds it, in one line; None
    when nothing is missing. Servers check it before they start: inside a server's start-up a missing
    package ends as a traceback."""
    missing = [(feature, module) for feature, module in _optional_modules(config) if not _installed(module)]
    if not missing:
        return None
    what = "; ".join(f"{feature} needs {_OPTIONAL[module][0]}" for feature, module in missing)
    extras = ",".join(dict.fromkeys(_OPTIONAL[module][1] for _, module in missing))
    verb = "is" if len(missing) == 1 else "are"
    return f"{what}, which {verb} not installed: pip install 'ragmon[{extras}]'"


def _missing_package(exc: ModuleNotFoundError) -> str | None:
    """The one-line hint for an optional package that a command found missing only when it used it."""
    parts = (exc.name or "").split(".")
    for end in range(len(parts), 0, -1):
        known = _OPTIONAL.get(".".join(parts[:end]))
        if known is not None:
            package, extra = known
            return f"{package} is not installed: pip install 'ragmon[{extra}]'"
    return None


def _bind_exclusive(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket that this process alone holds (no SO_REUSEPORT); raises `PortTaken`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # SO_REUSEADDR only lets a restart bind past TIME_WAIT; it never shares a listening port on Linux
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortTaken(f"{what} port {host}:{port} is not available ({exc.strerror})") from exc
    return sock


class PortTaken(Exception):
    """A port ragmon should listen on is taken (or cannot be bound)."""


def check_ports(config: RagmonConfig) -> socket.socket:
    """Bind the HTTP port for this process and check that the gRPC port is free; raises `PortTaken`.

    The gRPC server binds its own port later, without SO_REUSEPORT, so a port taken in
    between still fails the start-up (service/ingest/grpc_receiver.py)."""
    server = config.server
    http = _bind_exclusive(server.host, server.port, "HTTP")
    if server.grpc_port:
        try:
            _bind_exclusive(server.host, server.grpc_port, "OTLP/gRPC").close()
        except PortTaken:
            http.close()
            raise
    return http


async def serve(config: RagmonConfig, sock: socket.socket | None = None) -> None:
    """Run ragmon until interrupted (on `sock`, when given: the bound HTTP socket)."""
    import uvicorn

    from service.api.app import create_app
    from service.api.http_server import uvicorn_config
    from service.runtime import tune_for_service

    tune_for_service()
    server = uvicorn.Server(
        uvicorn_config(
            create_app(config), config, log_level=config.log_level, access_log=False, lifespan="on"
        )
    )
    await server.serve(sockets=[sock] if sock is not None else None)


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    config = config_from_args(args)
    if (missing := missing_extras(config)) is not None:
        print(f"ragmon serve: {missing}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        sock = check_ports(config)
    except PortTaken as exc:
        print(f"ragmon serve: {exc}", file=sys.stderr)
        return 1
    grpc = (
        f"OTLP/gRPC {config.server.host}:{config.server.grpc_port}"
        if config.server.grpc_port
        else "no OTLP/gRPC"
    )
    print(
        # the bound socket's port: --port 0 lets the system choose it
        f"ragmon listening: OTLP/HTTP + API http://{config.server.host}:{sock.getsockname()[1]}, "
        f"{grpc}, store {config.store_url_masked}",
        file=sys.stderr,
    )
    asyncio.run(serve(config, sock))
    return 0


def _summary_lines(url: str, drift_runs: list[dict[str, Any]], report: str | None) -> list[str]:
    """What a newcomer should look at after the demo, read back from ragmon itself."""
    from service.demo.tour import Ragmon, look_lines

    ragmon = Ragmon(url)
    try:
        return look_lines(url, ragmon.findings(drift_runs), report)
    finally:
        ragmon.close()


def _write_demo_report(config: RagmonConfig) -> str | None:
    """Write the weekly report of the demo's data (as `ragmon report --since 7d` does); its path."""
    import contextlib
    import io

    report_args = argparse.Namespace(since="7d", until="now", out=None, app=None, tenant="default")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = report_cli.main(report_args, config)
    if code != 0:
        return None
    from service.report.latest import LATEST_HTML, latest_dir

    return str(latest_dir(config, "default", None) / LATEST_HTML)


def _wait_until_settled(url: str, timeout_s: float) -> bool:
    """Wait until everything sent is stored and counted: no open trace, no build backlog, nothing
    in the bus, and the stored-trace count unchanged over two polls in a row.

    Under load a trace can sit between two of those gauges for a moment (built, on its way to
    the bus), so one quiet poll is not enough; a count that stopped moving is."""
    import time

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    settle_gauges = ("ragmon_open_traces", "ragmon_build_backlog_traces", "ragmon_bus_queue_depth")
    asked = {"name[]": [*settle_gauges, "ragmon_traces_total"]}
    deadline = time.monotonic() + timeout_s
    previous_stored: float | None = None
    with httpx.Client(base_url=url, timeout=10) as client:
        while time.monotonic() < deadline:
            samples = [
                s
                for family in text_string_to_metric_families(client.get("/metrics", params=asked).text)
                for s in family.samples
            ]
            gauges = {s.name: s.value for s in samples if s.name in settle_gauges}
            quiet = len(gauges) == len(settle_gauges) and not any(gauges.values())
            stored = sum(s.value for s in samples if s.name == "ragmon_traces_total")
            if quiet and stored == previous_stored:
                return True
            previous_stored = stored if quiet else None
            time.sleep(0.3)
    return False


SHUTDOWN_WAIT_S = 30.0
"""How long `ragmon demo` waits for its server's orderly stop (flushing traces, ending workers)."""


class _StopRequest:
    """SIGTERM and Ctrl-C for the demo: an interrupt while traffic is sent, else a flag it waits on.

    A KeyboardInterrupt raised by a handler lands at whatever line the main thread is on; under load
    that was once between the "keeps running" line and the try block meant to catch it, and the
    demo exited with its server and ingest workers still running (the interpreter then hung joining
    them). So it is raised only while the traffic runs, inside the block that stops the server, and
    after that a signal only sets `requested`. A second Ctrl-C still raises, to cut a stop that
    takes too long; a second SIGTERM (`timeout make demo` signals make and the demo both) is
    ignored.
    """

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.interrupting = False

    def __call__(self, signum: int, frame: object) -> None:
        again = self.requested.is_set()
        self.requested.set()
        if signum == signal.SIGTERM:
            # ignored, not handled, from now on: at interpreter exit Python resets its handlers to
            # the default action, and a second SIGTERM during the exit would kill the demo (-15)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.interrupting or (again and signum == signal.SIGINT):
            raise KeyboardInterrupt

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)


def _cmd_demo(args: argparse.Namespace) -> int:
    """Start an embedded ragmon (unless --target names one), send demo traffic, show what ragmon saw."""
    import time

    import uvicorn

    from service.api.app import create_app
    from service.api.http_server import uvicorn_config
    from service.demo import run as demo
    from service.demo.data_dir import NotDemoData, fresh_data_dir
    from service.demo.settings import demo_config, new_token
    from service.runtime import tune_for_service

    if args.target is not None:
        return demo.main(args)
    token = new_token()
    config = demo_config(config_from_args(args), token)
    if (missing := missing_extras(config)) is not None:
        print(f"ragmon demo: {missing}", file=sys.stderr)
        return 2
    try:  # a second demo on the first one's data would mix their totals and pin nothing
        print(f"ragmon demo: {fresh_data_dir(config)}", file=sys.stderr)
    except NotDemoData as exc:
        print(f"ragmon demo: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_for_service()
    server = uvicorn.Server(
        uvicorn_config(create_app(config), config, log_level="warning", access_log=False, lifespan="on")
    )
    stopped = threading.Event()

    def run_server() -> None:
        try:
            server.run()
        finally:
            stopped.set()

    threading.Thread(target=run_server, name="ragmon-demo-server", daemon=True).start()
    while not server.started:
        if stopped.is_set():
            print("ragmon demo: the server did not start (is the port taken? try --port 0)", file=sys.stderr)
            return 2
        time.sleep(0.05)
    # the port it listens on: --port 0 lets the system choose one (4318 is often an OTel collector's)
    port = server.servers[0].sockets[0].getsockname()[1]
    # uvicorn runs in a thread here and cannot take signals: SIGTERM (`kill`, `timeout`, a
    # container stop) and Ctrl-C ask for the same orderly stop, ingest workers and all, from here on
    stop = _StopRequest()
    stop.install()
    try:
        return _demo_until_stopped(args, config, f"http://{config.server.host}:{port}", stop, token)
    finally:
        server.should_exit = True
        if not stopped.wait(SHUTDOWN_WAIT_S):
            print(f"ragmon demo: ragmon did not stop within {SHUTDOWN_WAIT_S:g} s", file=sys.stderr)


def _demo_until_stopped(
    args: argparse.Namespace, config: RagmonConfig, url: str, stop: _StopRequest, token: str
) -> int:
    """Send the demo traffic to ragmon at `url` in windows (pinning a drift reference at the topic
    shift), run drift, write the report, print what ragmon saw, and (without --exit) wait for a
    stop request."""
    from datetime import UTC, datetime

    from service.demo import run as demo
    from service.demo.settings import WINDOW_S, DemoPlan
    from service.demo.tour import Ragmon, url_lines

    try:
        plan = DemoPlan.of(args.requests, args.shift_after)
    except ValueError as exc:
        print(f"ragmon demo: {exc}", file=sys.stderr)
        return 2
    print("\n".join(url_lines(url, token)))
    print("sending demo traffic...", file=sys.stderr)
    ragmon = Ragmon(url)
    started = datetime.now(UTC)
    # generous: on a loaded machine the ingest processes can take many seconds to start building
    settle_s = config.assembler.idle_s + 90

    def between_windows(index: int) -> None:
        if not _wait_until_settled(url, timeout_s=settle_s):
            print("ragmon demo: ragmon is still busy; going on", file=sys.stderr)
        if index == plan.shift_after:
            pinned = ragmon.pin(started, datetime.now(UTC))
            apps = ", ".join(f"{r['app']} ({r['n']} queries)" for r in pinned["pinned"]) or "none"
            print(f"drift reference pinned from the first {index} requests: {apps}", file=sys.stderr)
            print("now shifting part of the traffic to topics the corpus does not cover", file=sys.stderr)
        # the scheduler's next run closes this window of the regeneration bands
        if not ragmon.wait_for_scheduled_run(datetime.now(UTC), timeout_s=WINDOW_S * 5):
            print("ragmon demo: no scheduled drift run came; going on", file=sys.stderr)

    stop.interrupting = True
    try:
        summary = demo.run_demo(
            url,
            requests=plan.requests,
            rate=args.rate,
            seed=args.seed,
            shift_after=plan.shift_after,
            dim=args.dim,
            fixed_ids=args.fixed_ids,
            pauses=plan.pauses,
            on_pause=between_windows,
        )
        print("\n".join(["", *demo.sent_lines(summary)]))
        between_windows(plan.requests)  # the last window closes too
        drift_runs = ragmon.run_drift()
        if not ragmon.wait_judged(timeout_s=settle_s):
            print(
                "ragmon demo: the judge is still busy; the numbers below may be incomplete", file=sys.stderr
            )
        report = _write_demo_report(config)
    finally:
        ragmon.close()
    stop.interrupting = False
    code = 0 if summary.spans_failed == 0 and summary.feedback_failed == 0 else 1
    print("\n".join(_summary_lines(url, drift_runs, report)))
    if args.exit or stop.requested.is_set():
        return code
    print("\nragmon keeps running; press Ctrl-C to stop.", file=sys.stderr)
    while not stop.requested.wait(0.5):  # a timeout keeps the wait short of any lock a handler takes
        pass
    return code


def _cmd_config(args: argparse.Namespace) -> int:
    if args.markdown:
        from service.config import settings_table

        print(settings_table())
        return 0
    config = config_from_args(args)
    print(config.model_dump_json(indent=2))
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if (missing := missing_extras(config)) is not None:
        print(f"ragmon worker: {missing}", file=sys.stderr)
        return 2
    from service import worker

    return worker.main(args, config)


def _add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    # here rather than in service/worker.py, which imports the whole pipeline; a worker listens
    # only for /metrics and /healthz, so it has --metrics-port instead of the server flags
    parser.add_argument(
        "--role",
        action="append",
        choices=["sinks", "judge", "drift"],
        help="what to run (repeatable; default: worker.roles, i.e. all three)",
    )
    parser.add_argument("--metrics-port", type=int, help="port of /metrics and /healthz (default 9400)")


def _cmd_drift(args: argparse.Namespace) -> int:
    return drift_cli.main(args, config_from_args(args))


def _cmd_report(args: argparse.Namespace) -> int:
    return report_cli.main(args, config_from_args(args))


def _cmd_review_export(args: argparse.Namespace) -> int:
    return review_export.main(args, config_from_args(args).store_url)


def _cmd_review_labels(args: argparse.Namespace) -> int:
    return label_plan.main(args, config_from_args(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragmon", description="Monitor RAG applications from their live traces."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    # each command gets the flag groups it uses, and only those (tests/service/test_cli_flags.py)
    configured = [config_flags()]
    serving = [config_flags(), server_flags()]

    serve_parser = commands.add_parser("serve", parents=serving, help="run the service on embedded defaults")
    serve_parser.set_defaults(run=_cmd_serve)

    config_parser = commands.add_parser(
        "config", parents=configured, help="print the effective configuration (file, environment, --data-dir)"
    )
    config_parser.add_argument(
        "--markdown", action="store_true", help="print the settings table for the README"
    )
    config_parser.set_defaults(run=_cmd_config)

    demo_parser = commands.add_parser(
        "demo", parents=serving, help="start ragmon and send simulated RAG traffic to it (or to --target)"
    )
    demo_cli.add_arguments(demo_parser)
    demo_parser.add_argument(
        "--exit", action="store_true", help="stop ragmon when the traffic is sent (default: keep serving)"
    )
    demo_parser.set_defaults(run=_cmd_demo, target=None, requests=300, rate=0.0)

    eval_parser = commands.add_parser(
        "eval", help="offline retrieval evaluation (TREC qrels/run, golden set)"
    )
    eval_cli.add_arguments(eval_parser)
    eval_parser.set_defaults(run=eval_cli.main)

    worker_parser = commands.add_parser(
        "worker",
        parents=configured,
        help="distributed mode: consume from Kafka and run sinks, judge workers, drift",
    )
    _add_worker_arguments(worker_parser)
    worker_parser.set_defaults(run=_cmd_worker)

    drift_parser = commands.add_parser("drift", help="drift references and runs: pin, list, run")
    drift_cli.add_arguments(drift_parser, configured)
    drift_parser.set_defaults(run=_cmd_drift)
    report_parser = commands.add_parser(
        "report", parents=configured, help="write the drift and quality report (HTML + Markdown)"
    )
    report_cli.add_arguments(report_parser)
    report_parser.set_defaults(run=_cmd_report)

    review_parser = commands.add_parser(
        "review", help="the human review queue: export reviewed items, plan blind labels"
    )
    review_commands = review_parser.add_subparsers(dest="review_command", required=True)
    export_parser = review_commands.add_parser(
        "export", parents=configured, help="reviewed items as golden-set JSONL"
    )
    review_export.add_arguments(export_parser)
    export_parser.set_defaults(run=_cmd_review_export)
    labels_parser = review_commands.add_parser(
        "labels",
        parents=configured,
        help="blind labels a week per app for a human-corrected interval of a chosen width, and the rate",
    )
    label_plan.add_arguments(labels_parser)
    labels_parser.set_defaults(run=_cmd_review_labels)

    probe_parser = commands.add_parser(
        "probe", help="send golden-set probes to an app (on a schedule); score runs, pin a baseline"
    )
    probe_cli.add_probe_arguments(probe_parser)
    probe_parser.set_defaults(run=probe_cli.probe_main)
    golden_parser = commands.add_parser("golden", help="golden sets: load a JSONL file into ragmon")
    probe_cli.add_golden_arguments(golden_parser)
    golden_parser.set_defaults(run=probe_cli.golden_main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from service.config import ConfigError  # after parsing: `--help` has exited by then

    try:
        code: int = args.run(args)
    except ConfigError as exc:
        print(f"ragmon: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        hint = _missing_package(exc)
        if hint is None:
            raise
        print(f"ragmon {args.command}: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
