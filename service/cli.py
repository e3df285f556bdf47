"""The `ragmon` command: serve, demo, eval, config."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from service.config import ConfigError, RagmonConfig, describe_settings, load_config


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML or JSON config file (RAGMON_* env vars override it)")
    parser.add_argument("--host", help="HTTP listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port (default 4318)")
    parser.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (default 4317; 0 disables)")
    parser.add_argument("--data-dir", type=Path, help="directory for the SQLite file and reports")
    parser.add_argument("--dev", action="store_true", default=None, help="allow the sample API key")


def config_from_args(args: argparse.Namespace) -> RagmonConfig:
    """Flags win over environment, which wins over the config file."""
    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.grpc_port is not None:
        server["grpc_port"] = args.grpc_port
    if server:
        overrides["server"] = server
    if args.data_dir is not None:
        overrides["data_dir"] = str(args.data_dir)
    if args.dev:
        overrides["dev"] = True
    return load_config(config_file=args.config, overrides=overrides)


async def serve(config: RagmonConfig) -> None:
    """Run ragmon until interrupted."""
    import uvicorn

    from service.api import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config), host=config.server.host, port=config.server.port, log_level=config.log_level,
            access_log=False, lifespan="on",
        )
    )
    await server.serve()


def _cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(
        f"ragmon listening: OTLP/HTTP + API http://{config.server.host}:{config.server.port}, "
        f"OTLP/gRPC {config.server.host}:{config.server.grpc_port}, store {config.store_url}",
        file=sys.stderr,
    )
    asyncio.run(serve(config))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    if args.markdown:
        print("| environment variable | type | default | meaning |")
        print("|---|---|---|---|")
        for name, type_name, default, description in describe_settings():
            print(f"| `{name}` | {type_name} | `{default}` | {description} |")
        return 0
    config = config_from_args(args)
    print(config.model_dump_json(indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragmon", description="Monitor RAG applications from their live traces.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve_parser = commands.add_parser("serve", help="run the service on embedded defaults")
    _add_config_flags(serve_parser)
    serve_parser.set_defaults(run=_cmd_serve)

    config_parser = commands.add_parser("config", help="print the effective configuration")
    _add_config_flags(config_parser)
    config_parser.add_argument("--markdown", action="store_true", help="print the settings table for the README")
    config_parser.set_defaults(run=_cmd_config)

    try:
        from service import demo
    except ImportError:  # pragma: no cover - demo is part of the package; guard for partial installs
        demo = None  # type: ignore[assignment]
    if demo is not None:
        demo_parser = commands.add_parser("demo", help="start ragmon and send simulated RAG traffic to it")
        _add_config_flags(demo_parser)
        demo.add_arguments(demo_parser)
        demo_parser.set_defaults(run=demo.main)

    try:
        from service import eval_cli
    except ImportError:  # pragma: no cover
        eval_cli = None  # type: ignore[assignment]
    if eval_cli is not None:
        eval_parser = commands.add_parser("eval", help="offline retrieval evaluation (TREC qrels/run, golden set)")
        eval_cli.add_arguments(eval_parser)
        eval_parser.set_defaults(run=eval_cli.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except ConfigError as exc:
        print(f"ragmon: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
