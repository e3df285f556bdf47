"""Each `ragmon` command offers the flags it uses and no others (`--help` is what a user reads)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.cli import build_parser
from service.cli import main as cli_main

CONFIG = {"--config", "--data-dir"}
SERVER = {"--host", "--port", "--grpc-port", "--dev"}

# command -> (flags its --help must list, flags it must not list)
COMMANDS: dict[tuple[str, ...], tuple[set[str], set[str]]] = {
    ("serve",): (CONFIG | SERVER, set()),
    ("demo",): (CONFIG | SERVER | {"--target", "--exit"}, {"--metrics-port", "--role"}),
    ("config",): (CONFIG | {"--markdown"}, SERVER),
    ("worker",): (CONFIG | {"--role", "--metrics-port"}, SERVER),
    ("report",): (CONFIG | {"--since", "--until", "--out", "--app", "--tenant"}, SERVER),
    ("drift", "pin"): (CONFIG | {"--from", "--to", "--release", "--tenant"}, SERVER),
    ("drift", "list"): (CONFIG | {"--runs", "--limit", "--tenant"}, SERVER),
    ("drift", "run"): (CONFIG | {"--app", "--json", "--tenant"}, SERVER),
    ("review", "export"): (CONFIG | {"--out", "--since", "--golden"}, SERVER),
    ("eval", "retrieval"): ({"--qrels", "--run", "--k"}, CONFIG | SERVER),
    ("probe",): ({"--ragmon", "--golden", "--endpoint"}, CONFIG | SERVER),
    ("golden", "load"): ({"--ragmon", "--name"}, CONFIG | SERVER),
}


def _help_flags(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> set[str]:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: ragmon {' '.join(command)}")
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))


@pytest.mark.parametrize("command", list(COMMANDS), ids=" ".join)
def test_help_lists_the_flags_the_command_uses_and_no_others(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    present, absent = COMMANDS[command]
    flags = _help_flags(command, capsys)
    assert present <= flags, f"missing: {sorted(present - flags)}"
    assert not flags & absent, f"does not apply: {sorted(flags & absent)}"


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--port", "9000"],
        ["config", "--grpc-port", "0"],
        ["worker", "--host", "0.0.0.0"],
        ["drift", "list", "--dev"],
    ],
    ids=" ".join,
)
def test_a_server_flag_on_a_command_that_does_not_listen_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        # Dockerfile (CMD serve), README, helm/ templates, tests/distributed: the invocations in use
        ["serve"],
        ["serve", "--config", "ragmon.yaml"],
        ["serve", "--port", "1", "--grpc-port", "2", "--host", "127.0.0.1", "--dev", "--data-dir", "d"],
        ["worker", "--role", "judge", "--config", "/etc/ragmon/config/config.yaml"],
        ["worker", "--metrics-port", "9400", "--role", "sinks", "--role", "drift"],
        ["report", "--since", "7d", "--tenant", "t", "--app", "a", "--config", "c.yaml"],
        ["report", "--since", "7d", "--data-dir", "/var/lib/ragmon"],
        ["config", "--data-dir", "d"],
        ["config", "--markdown"],
        ["drift", "pin", "--from", "14d", "--to", "now", "--app", "shop", "--data-dir", "d"],
        ["review", "export", "--data-dir", "d", "--out", "-", "--golden"],
        ["demo", "--port", "1", "--grpc-port", "0", "--data-dir", "d", "--exit"],
    ],
    ids=" ".join,
)
def test_existing_invocations_still_parse(argv: list[str]) -> None:
    build_parser().parse_args(argv)


def test_config_still_reads_data_dir_and_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ragmon.yaml"
    config.write_text("server:\n  port: 9123\n")
    assert cli_main(["config", "--config", str(config), "--data-dir", str(tmp_path / "d")]) == 0
    printed = capsys.readouterr().out
    assert f'"data_dir": "{tmp_path / "d"}"' in printed and '"port": 9123' in printed
