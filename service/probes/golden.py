"""The golden set: questions with known gold retrieval, as a versioned JSONL file.

One JSON object per line (blank lines are skipped), fields:

    question_id         str, unique in the file
    question            str, the text sent to the app
    gold_chunks         [{chunk_id, relevance=1, tenants=null}]     -- either this,
    evidence            [{evidence_id, chunk_ids, relevance=1, tenants=null}]  -- or this
    expected_facts      [str], facts a correct answer states (judged later, not here)
    expected_behaviour  "answer" | "clarify" | "no_answer" | "deny"   (default "answer")
    category            str or null, the slice the question is reported in
    tenants             [str] or null: tenants for whom the gold is eligible (null: all)

`relevance` is a graded judgment (1 = relevant, higher = more useful). Gold
given as evidence is resolved to chunks through each evidence's `chunk_ids`
(the evidence-to-chunk mapping of the index being scored); a chunk carrying
several evidences takes the highest grade. A gold item's own `tenants`
replaces the question's for that item.

Guarantees: unknown fields, duplicate ids and a row with both `gold_chunks`
and `evidence` are refused; `load_golden` reports every bad line with its
number in one `InvalidInput`. `GoldenSet.version` is a hash of the parsed
content (not the bytes), so reformatting or reordering lines keeps it and
any change to a question changes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from service.probes.line_problems import LineProblems

__all__ = [
    "Evidence",
    "ExpectedBehaviour",
    "GoldChunk",
    "GoldenQuestion",
    "GoldenSet",
    "GoldenText",
    "load_golden",
    "parse_golden",
]

ExpectedBehaviour = Literal["answer", "clarify", "no_answer", "deny"]


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GoldChunk(_Row):
    """A chunk that answers the question, with its grade and who may see it."""

    chunk_id: str = Field(min_length=1)
    relevance: int = Field(default=1, ge=1)
    tenants: tuple[str, ...] | None = None


class Evidence(_Row):
    """A piece of evidence that answers the question, and the chunks that carry it."""

    evidence_id: str = Field(min_length=1)
    chunk_ids: tuple[str, ...] = Field(min_length=1)
    relevance: int = Field(default=1, ge=1)
    tenants: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _unique_chunks(self) -> Evidence:
        _refuse_duplicates(self.chunk_ids, "chunk id")
        return self


class GoldenQuestion(_Row):
    """One golden-set question and what a correct retrieval and answer look like."""

    question_id: str = Field(min_length=1)
    question: str = Field(pattern=r"\S", description="not blank")
    gold_chunks: tuple[GoldChunk, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    expected_facts: tuple[str, ...] = ()
    expected_behaviour: ExpectedBehaviour = "answer"
    category: str | None = None
    tenants: tuple[str, ...] | None = None
    reference_answer: str | None = Field(default=None, description="a reviewer's model answer")
    source_trace_id: str | None = Field(default=None, description="the production trace this row came from")
    reviewer: str | None = Field(default=None, description="who labelled it (review queue export)")

    @model_validator(mode="after")
    def _one_kind_of_gold(self) -> GoldenQuestion:
        if self.gold_chunks and self.evidence:
            raise ValueError("give gold as either gold_chunks or evidence, not both")
        _refuse_duplicates([g.chunk_id for g in self.gold_chunks], "gold chunk id")
        _refuse_duplicates([e.evidence_id for e in self.evidence], "evidence id")
        return self

    @property
    def has_gold(self) -> bool:
        return bool(self.gold_chunks or self.evidence)

    def eligible_grades(self, tenant: str | None) -> dict[str, int]:
        """Gold chunk id → grade, keeping only gold the tenant may see (None: every item).

        Evidence is resolved to its chunks; a chunk reached through several
        eligible evidences keeps the highest grade.
        """
        items: list[tuple[tuple[str, ...], GoldChunk | Evidence]] = [
            *(((g.chunk_id,), g) for g in self.gold_chunks),
            *((e.chunk_ids, e) for e in self.evidence),
        ]
        grades: dict[str, int] = {}
        for chunk_ids, item in items:
            if not self._eligible(item.tenants, tenant):
                continue
            for chunk_id in chunk_ids:
                grades[chunk_id] = max(grades.get(chunk_id, item.relevance), item.relevance)
        return grades

    def _eligible(self, item_tenants: tuple[str, ...] | None, tenant: str | None) -> bool:
        allowed = item_tenants if item_tenants is not None else self.tenants
        return tenant is None or allowed is None or tenant in allowed


class GoldenSet:
    """A parsed golden set: questions by id in file order, and its content version."""

    def __init__(self, questions: Sequence[GoldenQuestion], source: str = "<golden>") -> None:
        by_id: dict[str, GoldenQuestion] = {}
        for question in questions:
            if question.question_id in by_id:
                raise ValueError(f"duplicate question_id {question.question_id!r}")
            by_id[question.question_id] = question
        self.questions: dict[str, GoldenQuestion] = by_id
        self.source = source
        self.version = _content_version(by_id.values())

    def __len__(self) -> int:
        return len(self.questions)

    def __iter__(self) -> Iterator[GoldenQuestion]:
        return iter(self.questions.values())

    def to_jsonl(self) -> str:
        """The set as JSONL in the documented format; `parse_golden` reads it back unchanged."""
        return "".join(q.model_dump_json(exclude_defaults=True) + "\n" for q in self)

    def as_text(self) -> GoldenText:
        """The set as it is stored: plain strings, cheap to hand from a worker process to the server."""
        return GoldenText(self.source, self.version, len(self), self.to_jsonl())


@dataclass(frozen=True, slots=True)
class GoldenText:
    """A parsed golden set as the store keeps it: its version, question count and JSONL (`to_jsonl`)."""

    source: str
    version: str
    questions: int
    jsonl: str


def _refuse_duplicates(ids: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            raise ValueError(f"duplicate {what} {item!r}")
        seen.add(item)


def _content_version(questions: Iterable[GoldenQuestion]) -> str:
    # Hash the canonical form of each row, in question-id order: whitespace, key order and
    # line order do not change what the set says, so they do not change its version.
    canonical = sorted(
        (q.question_id, json.dumps(q.model_dump(mode="json"), sort_keys=True, separators=(",", ":")))
        for q in questions
    )
    digest = hashlib.sha256()
    for _, row in canonical:
        digest.update(row.encode("utf-8"))
        digest.update(b"\n")
    return f"sha256:{digest.hexdigest()}"


def parse_golden(lines: Iterable[str], source: str = "<golden>") -> GoldenSet:
    """A golden set from JSONL lines.

    Raises `InvalidInput` naming every bad line (`source:line: field: problem`):
    invalid JSON, a row that breaks the format, or a question id already used
    on an earlier line.
    """
    questions: list[GoldenQuestion] = []
    first_line: dict[str, int] = {}
    problems = LineProblems(source, "golden set", "bad_golden_set")
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            question = GoldenQuestion.model_validate_json(text)
        except ValidationError as exc:
            for error in exc.errors():
                problems.add(number, _describe(error))
            continue
        earlier = first_line.setdefault(question.question_id, number)
        if earlier != number:
            problems.add(number, f"question_id {question.question_id!r} already used on line {earlier}")
            continue
        questions.append(question)
    problems.raise_if_any()
    return GoldenSet(questions, source=source)


def _describe(error: ErrorDetails) -> str:
    if error["type"] == "json_invalid":
        return f"not valid JSON ({error.get('ctx', {}).get('error', error['msg'])})"
    location = ".".join(str(part) for part in error["loc"])
    return f"{location}: {error['msg']}" if location else error["msg"]


def load_golden(path: str | Path) -> GoldenSet:
    """A golden set from a JSONL file (UTF-8). See `parse_golden` for what is rejected."""
    with Path(path).open(encoding="utf-8") as lines:
        return parse_golden(lines, source=str(path))
