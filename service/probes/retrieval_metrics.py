"""Retrieval-quality metrics of ranked ids against graded gold, computed as trec_eval computes them.

Per query: precision@k (relevant in the top k over k, even when fewer than k
were retrieved), recall@k, hit rate@k (trec_eval's success_k), reciprocal
rank, average precision (trec_eval's map per query) and nDCG@k, graded (gain
= grade, negatives as 0) and binary (gain 1 at or above the relevance level),
both with trec_eval's discount log2(rank + 1) and an ideal ranking built from
all judged gold. An id is relevant when its grade is at least the relevance
level (trec_eval's `-l`). Means are plain means over queries, so the mean of
`reciprocal_rank` is MRR and the mean of `average_precision` is MAP.

Guarantees: a ranking that lists an id twice raises `ValueError` (it is never
counted twice); so do metrics whose denominator is zero (recall, average
precision and nDCG of a query with no relevant gold) — `evaluate` keeps such
queries out of the means and reports them in their own slices instead:

    scored            expected behaviour `answer`, with relevant gold eligible for the caller
    clarify, no_answer, deny   other expected behaviours, never scored
    no_gold           `answer`, but no gold at the relevance level
    no_eligible_gold  `answer`, gold exists but none of it is eligible for the caller
    not_in_run        scoreable, but the run has no ranking for it (scored as an empty
                      ranking instead when `complete=True`, like trec_eval `-c`)
    not_in_gold       ranked in the run but not a known question; ignored, as trec_eval does

The filter false-exclusion rate is computed over scoreable questions whose
exclusions were logged: the share where every eligible relevant gold chunk is
among the excluded ids, always against the original eligible gold set.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from service.probes.golden import ExpectedBehaviour, GoldenSet
from service.probes.trec import Qrels

__all__ = [
    "SLICES",
    "CategorySummary",
    "Evaluation",
    "FalseExclusion",
    "QueryResult",
    "QueryTarget",
    "average_precision",
    "evaluate",
    "hit_rate_at",
    "metric_names",
    "ndcg_at",
    "precision_at",
    "recall_at",
    "reciprocal_rank",
    "score_query",
    "targets_from_golden",
    "targets_from_qrels",
]

SLICES: tuple[str, ...] = (
    "scored",
    "clarify",
    "no_answer",
    "deny",
    "no_gold",
    "no_eligible_gold",
    "not_in_run",
    "not_in_gold",
)


def _check_ranking(ranking: Sequence[str]) -> None:
    if isinstance(ranking, str):
        raise TypeError("ranking must be a sequence of ids, not one string")
    first_rank: dict[str, int] = {}
    for rank, doc_id in enumerate(ranking, start=1):
        earlier = first_rank.setdefault(doc_id, rank)
        if earlier != rank:
            raise ValueError(
                f"ranking lists {doc_id!r} twice (ranks {earlier} and {rank}); "
                "duplicate ids are rejected, not counted twice"
            )


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")


def _relevant_in_top(ranking: Sequence[str], relevant: Collection[str], k: int) -> int:
    return sum(1 for doc_id in ranking[:k] if doc_id in relevant)


def _require_relevant(relevant: Collection[str], metric: str) -> None:
    if not relevant:
        raise ValueError(
            f"{metric} is undefined for a query with no relevant ids; report it in its own slice"
        )


def precision_at(ranking: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Relevant ids among the first k, over k."""
    _check_ranking(ranking)
    _check_k(k)
    return _relevant_in_top(ranking, relevant, k) / k


def recall_at(ranking: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Relevant ids among the first k, over all relevant ids. ValueError if there are none."""
    _check_ranking(ranking)
    _check_k(k)
    _require_relevant(relevant, "recall")
    return _relevant_in_top(ranking, relevant, k) / len(relevant)


def hit_rate_at(ranking: Sequence[str], relevant: Collection[str], k: int) -> float:
    """1.0 when a relevant id is among the first k, else 0.0 (trec_eval's success_k)."""
    _check_ranking(ranking)
    _check_k(k)
    return 1.0 if _relevant_in_top(ranking, relevant, k) else 0.0


def reciprocal_rank(ranking: Sequence[str], relevant: Collection[str]) -> float:
    """1 / rank of the first relevant id (ranks from 1); 0.0 when none was retrieved."""
    _check_ranking(ranking)
    return _reciprocal_rank(ranking, relevant)


def _reciprocal_rank(ranking: Sequence[str], relevant: Collection[str]) -> float:
    for rank, doc_id in enumerate(ranking, start=1):
        if doc_id in relevant:
            return 1.0 / rank
    return 0.0


def average_precision(ranking: Sequence[str], relevant: Collection[str]) -> float:
    """Mean over all relevant ids of the precision at each one's rank (0 for those not retrieved).

    ValueError when there are no relevant ids.
    """
    _check_ranking(ranking)
    _require_relevant(relevant, "average precision")
    return _average_precision(ranking, relevant)


def _average_precision(ranking: Sequence[str], relevant: Collection[str]) -> float:
    found = 0
    total = 0.0
    for rank, doc_id in enumerate(ranking, start=1):
        if doc_id in relevant:
            found += 1
            total += found / rank
    return total / len(relevant)


def ndcg_at(ranking: Sequence[str], gains: Mapping[str, float], k: int | None = None) -> float:
    """DCG of the first k ids over the DCG of the ideal ordering of all gains (k=None: no cutoff).

    Gain of an id is `gains.get(id, 0)`; the discount at rank r (from 1) is
    log2(r + 1). ValueError for a negative or non-finite gain, or when no
    gain is positive (the ideal DCG would be zero).
    """
    _check_ranking(ranking)
    if k is not None:
        _check_k(k)
    for doc_id, gain in gains.items():
        if not math.isfinite(gain) or gain < 0:
            raise ValueError(f"gain of {doc_id!r} must be finite and >= 0, got {gain}")
    return _ndcg(ranking, gains, k)


def _ndcg(ranking: Sequence[str], gains: Mapping[str, float], k: int | None) -> float:
    ideal_gains = sorted((g for g in gains.values() if g > 0), reverse=True)
    if not ideal_gains:
        raise ValueError("nDCG is undefined when no id has a positive gain; report it in its own slice")
    top = ranking if k is None else ranking[:k]
    ideal = ideal_gains if k is None else ideal_gains[:k]
    dcg = sum(gains.get(doc_id, 0.0) / math.log2(rank + 1) for rank, doc_id in enumerate(top, start=1))
    ideal_dcg = sum(gain / math.log2(rank + 1) for rank, gain in enumerate(ideal, start=1))
    return dcg / ideal_dcg


def metric_names(ks: Sequence[int]) -> tuple[str, ...]:
    """The keys of `score_query`'s result, in the order they are reported."""
    at_k = ("precision", "recall", "hit_rate", "ndcg", "ndcg_binary")
    return (*(f"{name}@{k}" for k in ks for name in at_k), "reciprocal_rank", "average_precision")


def score_query(
    ranking: Sequence[str], grades: Mapping[str, int], ks: Sequence[int], relevance_level: int = 1
) -> dict[str, float]:
    """Every metric of one query, keyed as `metric_names(ks)`.

    `grades` maps gold ids to graded relevance; ids with a grade at least
    `relevance_level` are relevant. ValueError for duplicate ids in the
    ranking or when no id is relevant.
    """
    _check_ranking(ranking)
    _check_level(relevance_level)
    for k in ks:
        _check_k(k)
    relevant = frozenset(doc_id for doc_id, grade in grades.items() if grade >= relevance_level)
    _require_relevant(relevant, "every retrieval metric but precision")
    graded = {doc_id: float(max(grade, 0)) for doc_id, grade in grades.items()}
    binary = dict.fromkeys(relevant, 1.0)
    scores: dict[str, float] = {}
    for k in ks:
        hits = _relevant_in_top(ranking, relevant, k)
        scores[f"precision@{k}"] = hits / k
        scores[f"recall@{k}"] = hits / len(relevant)
        scores[f"hit_rate@{k}"] = 1.0 if hits else 0.0
        scores[f"ndcg@{k}"] = _ndcg(ranking, graded, k)
        scores[f"ndcg_binary@{k}"] = _ndcg(ranking, binary, k)
    scores["reciprocal_rank"] = _reciprocal_rank(ranking, relevant)
    scores["average_precision"] = _average_precision(ranking, relevant)
    return scores


def _check_level(relevance_level: int) -> None:
    if isinstance(relevance_level, bool) or not isinstance(relevance_level, int):
        raise TypeError(f"relevance_level must be an int, got {type(relevance_level).__name__}")
    if relevance_level < 1:
        raise ValueError(f"relevance_level must be at least 1, got {relevance_level}")


@dataclass(frozen=True)
class QueryTarget:
    """What one query is scored against: gold the caller may see, gold it may not, and its slice."""

    query_id: str
    grades: Mapping[str, int]
    ineligible: Mapping[str, int] = field(default_factory=dict)
    behaviour: ExpectedBehaviour = "answer"
    category: str | None = None


def targets_from_qrels(qrels: Qrels) -> list[QueryTarget]:
    """One target per judged query, every judgment eligible, expected behaviour `answer`."""
    return [QueryTarget(query_id=qid, grades=dict(judged)) for qid, judged in qrels.items()]


def targets_from_golden(golden: GoldenSet, tenant: str | None = None) -> list[QueryTarget]:
    """One target per golden question, gold split into what `tenant` may and may not see.

    tenant=None makes every gold item eligible.
    """
    targets = []
    for question in golden:
        everything = question.eligible_grades(None)
        eligible = question.eligible_grades(tenant)
        targets.append(
            QueryTarget(
                query_id=question.question_id,
                grades=eligible,
                ineligible={c: g for c, g in everything.items() if c not in eligible},
                behaviour=question.expected_behaviour,
                category=question.category,
            )
        )
    return targets


@dataclass(frozen=True)
class QueryResult:
    """The scores of one scored query, with the counts behind them."""

    query_id: str
    category: str | None
    num_rel: int
    num_ret: int
    scores: dict[str, float]


@dataclass(frozen=True)
class CategorySummary:
    """Means over the scored queries of one category."""

    category: str | None
    count: int
    mean: dict[str, float]


@dataclass(frozen=True)
class FalseExclusion:
    """Questions whose every eligible relevant gold chunk the filter excluded, over those with a log."""

    numerator: int
    denominator: int
    query_ids: tuple[str, ...]

    @property
    def rate(self) -> float | None:
        return self.numerator / self.denominator if self.denominator else None


@dataclass(frozen=True)
class Evaluation:
    """Scores of a run against targets: per query, means overall and per category, and every slice."""

    ks: tuple[int, ...]
    relevance_level: int
    complete: bool
    per_query: dict[str, QueryResult]
    mean: dict[str, float]
    per_category: tuple[CategorySummary, ...]
    slices: dict[str, tuple[str, ...]]
    false_exclusion: FalseExclusion

    def to_dict(self) -> dict[str, JsonValue]:
        """A JSON-ready form: denominators first, then means, then each query."""
        names = metric_names(self.ks)
        return {
            "ks": list(self.ks),
            "relevance_level": self.relevance_level,
            "complete": self.complete,
            "denominators": {
                "questions": sum(len(ids) for name, ids in self.slices.items() if name != "not_in_gold"),
                **{name: len(ids) for name, ids in self.slices.items()},
            },
            "slices": {name: list(ids) for name, ids in self.slices.items()},
            "overall": {name: self.mean.get(name) for name in names},
            "per_category": [
                {"category": c.category, "scored": c.count, "mean": dict(c.mean)} for c in self.per_category
            ],
            "filter_false_exclusion": {
                "rate": self.false_exclusion.rate,
                "numerator": self.false_exclusion.numerator,
                "denominator": self.false_exclusion.denominator,
                "questions": list(self.false_exclusion.query_ids),
            },
            "per_query": {
                r.query_id: {
                    "category": r.category,
                    "num_rel": r.num_rel,
                    "num_ret": r.num_ret,
                    **r.scores,
                }
                for r in self.per_query.values()
            },
        }


def _mean(results: Iterable[QueryResult], names: Sequence[str]) -> dict[str, float]:
    rows = list(results)
    if not rows:
        return {}
    return {name: math.fsum(r.scores[name] for r in rows) / len(rows) for name in names}


def evaluate(
    rankings: Mapping[str, Sequence[str]],
    targets: Sequence[QueryTarget],
    *,
    ks: Sequence[int] = (5, 10),
    relevance_level: int = 1,
    complete: bool = False,
    excluded: Mapping[str, Collection[str]] | None = None,
) -> Evaluation:
    """Score each ranking against its target and put every query in exactly one slice.

    `rankings` maps query ids to ids best first; `excluded` maps query ids to
    the ids the filter excluded, for the queries whose traces logged them.
    Means are over the `scored` slice only. ValueError for an empty or
    duplicated k, a duplicate target, or a ranking that lists an id twice
    (the message names the query).
    """
    ks = tuple(ks)
    if not ks or len(set(ks)) != len(ks):
        raise ValueError(f"ks must be non-empty and distinct, got {list(ks)}")
    for k in ks:
        _check_k(k)
    _check_level(relevance_level)
    slices: dict[str, list[str]] = {name: [] for name in SLICES}
    results: dict[str, QueryResult] = {}
    excluded_all: list[str] = []
    logged = 0
    known: set[str] = set()
    for target in targets:
        if target.query_id in known:
            raise ValueError(f"query {target.query_id!r} has two targets")
        known.add(target.query_id)
        slice_name = _slice_of(target, relevance_level)
        if slice_name != "scored":
            slices[slice_name].append(target.query_id)
            continue
        relevant = {c for c, g in target.grades.items() if g >= relevance_level}
        if excluded is not None and target.query_id in excluded:
            logged += 1
            if relevant <= set(excluded[target.query_id]):
                excluded_all.append(target.query_id)
        ranking = rankings.get(target.query_id)
        if ranking is None and not complete:
            slices["not_in_run"].append(target.query_id)
            continue
        ranking = () if ranking is None else ranking
        try:
            scores = score_query(ranking, target.grades, ks, relevance_level)
        except ValueError as exc:
            raise ValueError(f"query {target.query_id!r}: {exc}") from exc
        slices["scored"].append(target.query_id)
        results[target.query_id] = QueryResult(
            query_id=target.query_id,
            category=target.category,
            num_rel=len(relevant),
            num_ret=len(ranking),
            scores=scores,
        )
    slices["not_in_gold"] = [qid for qid in rankings if qid not in known]
    names = metric_names(ks)
    categories: dict[str | None, list[QueryResult]] = {}
    for result in results.values():
        categories.setdefault(result.category, []).append(result)
    return Evaluation(
        ks=ks,
        relevance_level=relevance_level,
        complete=complete,
        per_query=results,
        mean=_mean(results.values(), names),
        per_category=tuple(
            CategorySummary(c, len(rows), _mean(rows, names)) for c, rows in categories.items()
        ),
        slices={name: tuple(ids) for name, ids in slices.items()},
        false_exclusion=FalseExclusion(len(excluded_all), logged, tuple(excluded_all)),
    )


def _slice_of(target: QueryTarget, relevance_level: int) -> str:
    if target.behaviour != "answer":
        return target.behaviour
    if any(grade >= relevance_level for grade in target.grades.values()):
        return "scored"
    if any(grade >= relevance_level for grade in target.ineligible.values()):
        return "no_eligible_gold"
    return "no_gold"
