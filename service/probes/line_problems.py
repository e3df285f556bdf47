"""Per-line problems of a line-oriented input file, raised together as one `InvalidInput`.

Readers of qrels, runs and golden sets collect every bad line before failing,
so a user fixes a file in one pass. The message opens with a count, then one
`source:line: problem` per line, up to a cap, then how many more were found.
"""

from __future__ import annotations

from service.errors import InvalidInput

__all__ = ["MAX_LISTED", "LineProblems"]

MAX_LISTED = 20


class LineProblems:
    """Problems found so far in one file, named by its `source` (a path or a label)."""

    def __init__(self, source: str, what: str, reason: str) -> None:
        self.source = source
        self.what = what
        self.reason = reason
        self.items: list[str] = []

    def add(self, line: int, message: str) -> None:
        self.items.append(f"{self.source}:{line}: {message}")

    def raise_if_any(self) -> None:
        """Raises `InvalidInput` (reason as given) listing the problems; returns when there are none."""
        if not self.items:
            return
        shown = self.items[:MAX_LISTED]
        more = len(self.items) - len(shown)
        tail = [f"... and {more} more"] if more else []
        raise InvalidInput(
            "\n".join([f"{len(self.items)} problem(s) in {self.what} {self.source}", *shown, *tail]),
            reason=self.reason,
        )
