"""Regenerate the docs' generated sections: the README's configuration table and metrics list, and
docs/security.md's list of redacted fields.

The configuration table comes from the settings models (`ragmon config --markdown`); the metrics list is the
table of `dashboards/METRICS.md` (itself generated from the registry by `python -m dashboards.build`); the
field list is `service.redaction_fields.FIELDS`.

python scripts/update_readme.py          # rewrite README.md and docs/security.md in place
python scripts/update_readme.py --check  # exit 1 if either is out of date (tests run this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service.config import settings_table
from service.redaction_fields import fields_table

README = Path(__file__).resolve().parents[1] / "README.md"
METRICS = README.parent / "dashboards" / "METRICS.md"
SECURITY = README.parent / "docs" / "security.md"


def metrics_table() -> str:
    lines = METRICS.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def _replace(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def render(text: str) -> str:
    text = _replace(text, "config-table", settings_table())
    return _replace(text, "metrics-table", metrics_table())


def render_security(text: str) -> str:
    return _replace(text, "redaction-fields", fields_table())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for path, update in ((README, render), (SECURITY, render_security)):
        text = path.read_text(encoding="utf-8")
        updated = update(text)
        if updated == text:
            continue
        if args.check:
            stale.append(path.name)
        else:
            path.write_text(updated, encoding="utf-8")
    if stale:
        print(
            f"generated tables out of date in {', '.join(stale)}: run python scripts/update_readme.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
