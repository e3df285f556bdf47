"""Imports run one way: a unit of `service` (a subpackage, or a top-level module) imports only units
below it in `LAYERS`, and no module import cycle exists anywhere in the tree.

Units on one layer may not import each other either: if one needs another, one of them belongs a
layer lower. Every import counts, also one inside a function: an import deferred for start-up time
still runs upward when it runs. `TYPE_CHECKING`-only imports count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "sampler", "detectors")

# Top first. A unit is `service.<name>` (a subpackage or a top-level module), or `sampler` / `detectors`.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("api", "worker"),
    ("scrape",),
    ("pipeline",),
    ("pipeline_intake",),
    ("phoenix", "report", "demo"),
    ("review", "drift"),
    ("probes", "outbox", "span_expiry", "stages"),
    ("judge", "ingest", "non_requests"),
    ("store", "bus", "assemble", "regeneration", "redaction"),
    ("redaction_fields",),
    ("corrections",),
    ("metrics", "consumer"),
    ("metric_areas",),
    ("metric_judge",),
    ("metric_base",),
    ("metric_labels", "metric_tally"),
    ("conventions", "config"),
    ("config_transport", "config_quality"),
    ("config_base",),
    ("sampler", "detectors"),
    ("model", "errors", "labels", "lifecycle", "processes", "runtime", "throttled_log"),
)
RANK = {unit: len(LAYERS) - i for i, layer in enumerate(LAYERS) for unit in layer}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ("sampler", "detectors"):
        return parts[0]
    if parts[0] != "service":
        return None
    return parts[1] if len(parts) > 1 else None  # `service` itself re-exports the model only


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of one of our packages in a file, wherever it stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                # `from service.judge import llm` imports the module service.judge.llm
                candidate = f"{node.module}.{alias.name}"
                yield node.lineno, candidate if _is_module(candidate) else node.module


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_every_unit_has_a_layer() -> None:
    units = {_unit(_module_name(p)) for p in _files()} - {None}
    assert units - RANK.keys() == set(), "add the new unit to LAYERS"
    assert RANK.keys() - units == set(), "LAYERS names a unit that no longer exists"


def test_imports_run_downward_only() -> None:
    upward = []
    for path in _files():
        here = _unit(_module_name(path))
        if here is None:
            continue
        for line, target in _imports(path):
            there = _unit(target)
            if there is None or there == here:
                continue
            if RANK[there] >= RANK[here]:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {target} ({there})")
    assert upward == [], "imports that do not run downward:\n" + "\n".join(upward)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _files():
        name = _module_name(path)
        graph[name] = {t for _, t in _imports(path) if t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among modules, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in graph:
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_module_import_cycle() -> None:
    assert _cycle(_graph()) is None


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_the_cycle_search_finds_cycles(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert _cycle(graph) == expected


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The walk sees imports inside functions, and `from package import module` as the module."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from service.judge import llm\n    import service.api.app\n")
    assert list(_imports(source)) == [(2, "service.judge.llm"), (3, "service.api.app")]
    assert RANK[_unit("service.api.app") or ""] > RANK[_unit("service.judge.llm") or ""]
