"""Regenerate the README's configuration table from the settings models (`ragmon config --markdown`).

python scripts/update_readme.py          # rewrite README.md in place
python scripts/update_readme.py --check  # exit 1 if README.md is out of date (tests run this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service.config import settings_table

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def render(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{settings_table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    updated = render(text)
    if args.check:
        if updated != text:
            print(
                "README.md configuration table is out of date: run python scripts/update_readme.py",
                file=sys.stderr,
            )
            return 1
        return 0
    README.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
