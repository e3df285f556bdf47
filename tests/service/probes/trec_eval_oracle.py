"""trec_eval's own test files as an oracle: where they live, and its printed outputs as numbers.

The files are read in place from ../shared/data (or $RAGMON_SHARED_DATA);
tests that need them skip with a clear message when they are absent.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

__all__ = ["TOLERANCE", "our_key", "parse_trec_eval_output", "trec_eval_dir"]

# trec_eval prints 4 decimals, so a correct value may differ from the printed one by half a unit.
TOLERANCE = 5e-5 + 1e-12


def trec_eval_dir() -> Path:
    """The trec_eval test directory, or a pytest skip naming where it was looked for."""
    configured = os.environ.get("RAGMON_SHARED_DATA")
    root = Path(configured) if configured else Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
    directory = root / "retrieval" / "trec_eval_test"
    if not (directory / "qrels.test").is_file():
        pytest.skip(
            f"trec_eval test data not found at {directory} (set RAGMON_SHARED_DATA to ../shared/data)"
        )
    return directory


def parse_trec_eval_output(path: Path) -> dict[str, dict[str, float]]:
    """`trec_eval -q` output as query id (or "all") → measure → value; non-numeric rows dropped."""
    values: dict[str, dict[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) != 3:
            continue
        measure, qid, text = fields
        try:
            values.setdefault(qid, {})[measure] = float(text)
        except ValueError:
            continue
    return values


_AT_K = {"P": "precision", "recall": "recall", "success": "hit_rate", "ndcg_cut": "ndcg"}
_WHOLE = {"map": "average_precision", "recip_rank": "reciprocal_rank"}


def our_key(measure: str) -> tuple[str, int | None] | None:
    """Our metric name and cutoff for a trec_eval measure name, or None when we do not compute it.

    `ndcg` (no cutoff) maps to ("ndcg", None).
    """
    if measure in _WHOLE:
        return _WHOLE[measure], None
    if measure == "ndcg":
        return "ndcg", None
    match = re.fullmatch(r"(P|recall|success|ndcg_cut)_(\d+)", measure)
    if match is None:
        return None
    return _AT_K[match.group(1)], int(match.group(2))
