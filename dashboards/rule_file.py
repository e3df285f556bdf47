"""YAML as ragmon writes its generated files: key order kept, multi-line strings as literal blocks."""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["dump_yaml"]


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (PromQL) as `|` blocks, so diffs stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any, header: str = "") -> str:
    """`data` as YAML text, prefixed with `header` lines as comments."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True)
