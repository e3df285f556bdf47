"""The user docs (README.md and docs/*.md) stay true: the commands and flags they show exist, the files
and images they link to are there, nothing points outside a user's clone, and the pictures stay small.

The generated tables are checked by tests/test_project.py (scripts/update_readme.py --check).
"""

from __future__ import annotations

import argparse
import re
import shlex
import struct
from pathlib import Path

import pytest

from service.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IMAGES = ROOT / "docs" / "images"
IMAGES_MAX_BYTES = 400_000  # "a few hundred KB at most in total"

# a command as a user types it: at the start of a code line or span, maybe from the venv or a cron line
COMMAND = re.compile(r"^(?:(?:[0-9*]+\s+){5})?(?:\.venv/bin/)?ragmon\s+(.*)$")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"^\.?[\w-]+(?:/[\w.*-]+)+/?$")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """Every line of a fenced block and every inline code span, fences' text taken out first."""
    blocks = FENCE.findall(text)
    rest = FENCE.sub("", text)
    return [line.strip() for block in blocks for line in block.splitlines()] + SPAN.findall(rest)


def _commands(text: str) -> list[str]:
    found = []
    for code in _code(text):
        match = COMMAND.match(code)
        if match:
            found.append(match.group(1).split("#", 1)[0].strip())
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _check_command(root: argparse.ArgumentParser, command: str) -> str | None:
    """None if `ragmon <command>` parses as far as its words and flags go, else what is wrong."""
    words = shlex.split(command.replace("[", " ").replace("]", " "))
    parser, path = root, ["ragmon"]
    for word in words:
        choices = _subcommands(parser)
        if word in choices:
            parser = choices[word]
            path.append(word)
        elif word.startswith("--") and word.split("=", 1)[0] not in _flags(parser):
            return f"{' '.join(path)} has no flag {word}"
    if path == ["ragmon"]:
        return f"no such command: ragmon {command}"
    return None


def test_the_docs_show_commands() -> None:
    # the check below would pass on docs with no command at all
    assert len(_commands(_text(ROOT / "README.md"))) >= 8


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_ragmon_command_and_flag_shown_exists(doc: Path) -> None:
    parser = build_parser()
    problems = [p for c in _commands(_text(doc)) if (p := _check_command(parser, c)) is not None]
    assert problems == []


def test_a_wrong_flag_or_command_is_caught() -> None:
    parser = build_parser()
    assert _check_command(parser, "report --since 7d") is None
    assert _check_command(parser, "drift pin --from 2026-11-01 --app A") is None
    assert _check_command(parser, "report --sinse 7d") == "ragmon report has no flag --sinse"
    assert _check_command(parser, "reports --since 7d") is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_repository_paths_exist(doc: Path) -> None:
    text = _text(doc)
    missing = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        if not (doc.parent / target.split("#", 1)[0]).exists():
            missing.append(target)
    for code in _code(text):
        first = code.split("/", 1)[0]
        if REPO_PATH.match(code) and (ROOT / first).exists() and not list(ROOT.glob(code.rstrip("/"))):
            missing.append(code)
    assert missing == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_a_users_clone(doc: Path) -> None:
    # a user's clone has no shared/ folder beside it; CI's test data is named in the Development section
    assert "../shared" not in _text(doc)
    assert "/work/" not in _text(doc)


def test_make_targets_shown_exist() -> None:
    makefile = _text(ROOT / "Makefile")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    code = [line for doc in DOCS for line in _code(_text(doc))]
    shown = {m for line in code for m in re.findall(r"(?:^|[\s'])make ([a-z][\w-]*)", line)}
    assert {"demo", "test"} <= shown
    assert shown - targets == set()


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_screenshots_are_referenced_small_and_1200_px_wide() -> None:
    images = sorted(IMAGES.glob("*.png"))
    assert len(images) >= 3
    readme = _text(ROOT / "README.md")
    assert [p.name for p in images if f"docs/images/{p.name}" not in readme] == []
    assert {p.name: _png_size(p)[0] for p in images} == {p.name: 1200 for p in images}
    assert sum(p.stat().st_size for p in images) <= IMAGES_MAX_BYTES
