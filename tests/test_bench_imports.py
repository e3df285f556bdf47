"""Every name a bench or script takes from ragmon's own packages still exists there.

The benchmarks are not run by the suite (they take minutes and need a quiet machine), so a
refactor that renames a function they import breaks them silently until someone reruns one
(`bench/ingest/round_trip.py` imported a helper of `service/ingest/pool.py` renamed long before).
This reads each script's imports without running it, since many import packages only a
benchmark installs (psutil, Phoenix), and checks each imported ragmon name resolves.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = ("service", "sampler", "detectors", "dashboards", "bench", "scripts")
SCRIPTS = sorted(p for folder in ("bench", "scripts") for p in (ROOT / folder).rglob("*.py"))


def own_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None for `import module`, line) of every import of ragmon's own code."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in OWN_PACKAGES:
                found += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] in OWN_PACKAGES]
    return found


def top_level_names(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) > 20
    assert sum(len(own_imports(p)) for p in SCRIPTS) > 50


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_script_imports_from_ragmon_exists(path: Path) -> None:
    missing = []
    for module_name, name, line in own_imports(path):
        if module_name.split(".")[0] in ("bench", "scripts"):
            # another script: read, not imported (it may need a benchmark-only package); its own
            # imports are checked by its own case
            relative = Path(*module_name.split("."))
            target = ROOT / relative.with_suffix(".py")
            package = ROOT / relative / "__init__.py"
            if not target.exists() and not package.exists():
                missing.append(f"line {line}: no module {module_name}")
            elif name is not None and target.exists() and name != "*":
                defined = top_level_names(target)
                if name not in defined and not (ROOT / relative / f"{name}.py").exists():
                    missing.append(f"line {line}: {module_name} has no {name}")
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"line {line}: {module_name}: {exc}")
            continue
        if name is not None and name != "*" and not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ImportError:
                missing.append(f"line {line}: {module_name} has no {name}")
    assert not missing, f"{path.relative_to(ROOT)}: " + "; ".join(missing)
