"""Readers for TREC relevance judgments (qrels) and TREC run files.

A qrels line is `QID ITER DOCNO REL` (ITER is ignored, REL an integer grade;
negative grades are allowed and count as not relevant). A run line is
`QID Q0 DOCNO RANK SCORE TAG`; anything after the sixth field is ignored, as
trec_eval ignores it. The rank column is ignored too: a run is ranked the way
trec_eval ranks it, by score descending with ties broken by docno descending
(string order), so the same file gives the same ranking here and there.

Both readers reject, with the file and line number, malformed lines, a
docno judged twice for one query, and a docno listed twice in one query's
ranking (trec_eval refuses those as well; counting them twice would inflate
precision). Errors are `InvalidInput`, listing every bad line up to a cap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.probes.line_problems import LineProblems

__all__ = ["Qrels", "Run", "parse_qrels", "parse_run", "read_qrels", "read_run"]

Qrels = dict[str, dict[str, int]]
"""Graded judgments: query id → docno → grade. Docnos not listed are unjudged."""

Run = dict[str, tuple[str, ...]]
"""Rankings: query id → docnos, best first, in trec_eval's order."""


@dataclass(frozen=True, slots=True)
class _Scored:
    docno: str
    score: float


def parse_qrels(lines: Iterable[str], source: str = "<qrels>") -> Qrels:
    """Judgments from qrels lines. Blank lines are skipped.

    Raises `InvalidInput` listing each line that does not have exactly four
    fields, whose grade is not an integer, or that judges a docno already
    judged for the same query.
    """
    qrels: Qrels = {}
    first_seen: dict[tuple[str, str], int] = {}
    problems = LineProblems(source, "qrels", "bad_qrels")
    for number, text in enumerate(lines, start=1):
        fields = text.split()
        if not fields:
            continue
        if len(fields) != 4:
            problems.add(number, f"expected 4 fields 'QID ITER DOCNO REL', got {len(fields)}")
            continue
        qid, _iteration, docno, grade_text = fields
        try:
            grade = int(grade_text)
        except ValueError:
            problems.add(number, f"relevance {grade_text!r} is not an integer")
            continue
        earlier = first_seen.setdefault((qid, docno), number)
        if earlier != number:
            problems.add(number, f"docno {docno!r} of query {qid!r} is already judged on line {earlier}")
            continue
        qrels.setdefault(qid, {})[docno] = grade
    problems.raise_if_any()
    return qrels


def parse_run(lines: Iterable[str], source: str = "<run>") -> Run:
    """Rankings from run lines, ordered by score descending, then docno descending.

    Blank lines are skipped. Raises `InvalidInput` listing each line with
    fewer than six fields, a score that is not a finite number, or a docno
    already listed for the same query.
    """
    scored: dict[str, list[_Scored]] = {}
    first_seen: dict[tuple[str, str], int] = {}
    problems = LineProblems(source, "run", "bad_run")
    for number, text in enumerate(lines, start=1):
        fields = text.split()
        if not fields:
            continue
        if len(fields) < 6:
            problems.add(number, f"expected 6 fields 'QID Q0 DOCNO RANK SCORE TAG', got {len(fields)}")
            continue
        qid, _q0, docno, _rank, score_text = fields[:5]
        try:
            score = float(score_text)
        except ValueError:
            problems.add(number, f"score {score_text!r} is not a number")
            continue
        if not math.isfinite(score):
            problems.add(number, f"score {score_text!r} is not finite")
            continue
        earlier = first_seen.setdefault((qid, docno), number)
        if earlier != number:
            problems.add(
                number,
                f"duplicate docno {docno!r} for query {qid!r} (first on line {earlier}); "
                "a ranking may list an id once",
            )
            continue
        scored.setdefault(qid, []).append(_Scored(docno, score))
    problems.raise_if_any()
    return {qid: _trec_order(entries) for qid, entries in scored.items()}


def _trec_order(entries: list[_Scored]) -> tuple[str, ...]:
    # trec_eval sorts on (score desc, docno desc); docnos are unique per query, so the order is total.
    ordered = sorted(entries, key=lambda e: (e.score, e.docno), reverse=True)
    return tuple(e.docno for e in ordered)


def read_qrels(path: str | Path) -> Qrels:
    """Judgments from a qrels file (UTF-8). See `parse_qrels` for what is rejected."""
    with Path(path).open(encoding="utf-8") as lines:
        return parse_qrels(lines, source=str(path))


def read_run(path: str | Path) -> Run:
    """Rankings from a run file (UTF-8). See `parse_run` for the order and what is rejected."""
    with Path(path).open(encoding="utf-8") as lines:
        return parse_run(lines, source=str(path))
