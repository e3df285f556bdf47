"""One module of ragmon as it was at an earlier git revision, loaded beside today's code for an A/B.

The old module's own source is compiled under a private name; what it imports
comes from today's tree. Revisions from before the package layout (service/
was one flat folder until the change that added service/ingest/, service/judge/
and the rest) import flat names such as `service.span_attributes`: those are
aliased to today's modules, so an old file still loads.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# flat module names before the package layout -> today's modules (only those old baselines import)
_FLAT_NAMES = {
    "attribute_values": "conventions.attribute_values",
    "call_usage": "conventions.usage",
    "consumer": "consumer",
    "errors": "errors",
    "model": "model",
    "pricing": "conventions.pricing",
    "row_insert": "store.row_insert",
    "span_attributes": "conventions.attributes",
    "span_content": "conventions.content",
    "span_stage": "conventions.stage",
    "spans": "conventions.spans",
    "tables": "store.tables",
}


def _source(rev: str, paths: tuple[str, ...]) -> tuple[str, str]:
    for path in paths:
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
        if shown.returncode == 0:
            return path, shown.stdout
    raise SystemExit(f"none of {', '.join(paths)} exists at git revision {rev}")


def load_module_at(rev: str, name: str, *paths: str) -> types.ModuleType:
    """The first of `paths` that exists at `rev`, executed as module `name` (today's path first)."""
    for flat, now in _FLAT_NAMES.items():
        sys.modules.setdefault(f"service.{flat}", importlib.import_module(f"service.{now}"))
    path, source = _source(rev, paths)
    module = types.ModuleType(name)
    module.__file__ = str(REPO / path)
    sys.modules[name] = module  # dataclasses look their module up while building
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module
