"""Scoring a golden-set probe run from its stored traces, and comparing two scored runs question by question.

`score_run` maps each trace of the run to its golden question by
`probe_question_id` (the last trace wins when the app sent several; traces
with no question id or an unknown one are counted, not scored) and scores:

* retrieval, with `service.probes.retrieval_metrics.evaluate` against the gold the
  run's tenant may see: recall, precision, hit rate and nDCG (graded and
  binary) at each k, reciprocal rank and average precision, overall and per
  category. The ranking is the context the LLM saw: the reranker's output
  when the trace has one, else the retrieval list. Every question lands in
  exactly one slice (`retrieval_metrics.SLICES`, plus `duplicate_ids` for a
  trace whose ranking lists an id twice: rejected, never counted twice);
  only the `scored` slice enters the means, so a question whose expected
  behaviour is not `answer`, whose gold the tenant may not see, or that got
  no trace is never a zero recall.
* the filter false-exclusion rate over scored questions whose trace logged a
  filter predicate or excluded ids, against the original eligible gold.
* the answer of each `answer` question against its expected facts, by a
  `CorrectnessJudge` (a judgment apart from faithfulness; results of the
  same trace and judge version are reused from the previous score).
* the diagnosis of each such question, from gold hit (a relevant eligible
  gold chunk in the context) × correct × supported (faithfulness at or over
  the threshold, from the faithfulness judge):

      correct, gold hit, supported          success
      correct, gold missed or unsupported   unsupported_correct
      wrong,   gold missed                  retrieval_failure
      wrong,   gold hit                     generation_failure
      anything not known yet                undetermined

`compare_runs` pairs two scored runs by question id (questions scored in
both) and reports, per metric, the mean delta (new - old) with a percentile
bootstrap confidence interval (`scipy.stats.bootstrap`, resampling the paired
deltas; seeded, `resamples` documented in the result), and the questions that
got better and worse.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from scipy import stats

from service.judge.correctness import Correctness, CorrectnessJudge
from service.probes.golden import GoldenSet
from service.probes.retrieval_metrics import evaluate, metric_names, targets_from_golden

__all__ = [
    "DIAGNOSES",
    "PAIRED_METRICS",
    "Diagnosis",
    "compare_runs",
    "diagnose",
    "paired_metrics",
    "score_run",
]

Diagnosis = Literal[
    "success", "retrieval_failure", "generation_failure", "unsupported_correct", "undetermined"
]
DIAGNOSES: tuple[Diagnosis, ...] = (
    "success",
    "retrieval_failure",
    "generation_failure",
    "unsupported_correct",
    "undetermined",
)
PAIRED_METRICS = ("recall", "ndcg", "reciprocal_rank", "correct")
"""Metric families compared between runs (recall and nDCG at every k)."""


def diagnose(gold_hit: bool | None, correct: bool | None, supported: bool | None) -> Diagnosis:
    """The four-way diagnosis of one probe answer (see the module docstring)."""
    if correct is None:
        return "undetermined"
    if not correct:
        if gold_hit is None:
            return "undetermined"
        return "generation_failure" if gold_hit else "retrieval_failure"
    if gold_hit is False or supported is False:
        return "unsupported_correct"
    if gold_hit is None or supported is None:
        return "undetermined"
    return "success"


def _ranking(record: Mapping[str, Any]) -> list[str]:
    context = record.get("context") or {}
    reranked = context.get("reranker_output") or []
    if reranked:
        return [str(c["id"]) for c in reranked]
    return [str(c) for c in record.get("chunk_ids") or []]


def _has_duplicates(ranking: Sequence[str]) -> bool:
    return len(set(ranking)) != len(ranking)


async def _correctness_all(
    judge: CorrectnessJudge,
    jobs: Mapping[str, tuple[str, str | None, Sequence[str]]],
    concurrency: int,
) -> dict[str, Correctness]:
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str, answer: str | None, facts: Sequence[str]) -> Correctness:
        async with gate:
            return await judge.check(question, answer, facts)

    keys = list(jobs)
    results = await asyncio.gather(*(one(*jobs[k]) for k in keys))
    return dict(zip(keys, results, strict=True))


async def score_run(
    run_id: str,
    tenant: str,
    golden: GoldenSet,
    records: Sequence[Mapping[str, Any]],
    *,
    ks: Sequence[int] = (5, 10),
    relevance_level: int = 1,
    correctness: CorrectnessJudge,
    faithfulness: Mapping[str, float | None] | None = None,
    supported_threshold: float = 0.75,
    reuse: Mapping[str, Mapping[str, Any]] | None = None,
    concurrency: int = 8,
) -> dict[str, Any]:
    """The JSON-ready score of one probe run (see the module docstring).

    `records` are the run's stored traces (`GoldenStore.run_traces`),
    `faithfulness` maps trace ids to their judged faithfulness (absent or
    None: not judged), `reuse` maps trace ids to correctness results of an
    earlier score (kept when the judge version matches).
    """
    faithfulness = faithfulness or {}
    reuse = reuse or {}
    by_question: dict[str, Mapping[str, Any]] = {}
    untagged = extra = 0
    for record in records:
        question_id = (record.get("flags") or {}).get("probe_question_id")
        if not question_id:
            untagged += 1
            continue
        if question_id in by_question:
            extra += 1
        by_question[question_id] = record  # records come oldest first: the last one wins
    rankings: dict[str, list[str]] = {}
    excluded: dict[str, list[str]] = {}
    duplicate_ids: list[str] = []
    for question_id, record in by_question.items():
        ranking = _ranking(record)
        if _has_duplicates(ranking):
            duplicate_ids.append(question_id)  # rejected: out of the means and the false-exclusion rate
            continue
        rankings[question_id] = ranking
        context = record.get("context") or {}
        if context.get("filter") is not None or context.get("excluded_ids"):
            excluded[question_id] = list(context.get("excluded_ids") or [])
    targets = targets_from_golden(golden, tenant)
    evaluation = evaluate(rankings, targets, ks=ks, relevance_level=relevance_level, excluded=excluded)
    slices = {name: list(ids) for name, ids in evaluation.slices.items()}
    slices["not_in_run"] = [q for q in slices["not_in_run"] if q not in duplicate_ids]
    slices["duplicate_ids"] = [q for q in duplicate_ids if q in golden.questions]
    false_excluded = set(evaluation.false_exclusion.query_ids)
    slice_of = {q: name for name, ids in slices.items() for q in ids}

    jobs: dict[str, tuple[str, str | None, Sequence[str]]] = {}
    answers: dict[str, Correctness] = {}
    for question in golden:
        sent = by_question.get(question.question_id)
        if sent is None or question.expected_behaviour != "answer":
            continue
        earlier = reuse.get(str(sent["trace_id"]))
        if earlier is not None and earlier.get("judge_version") == correctness.version:
            answers[question.question_id] = Correctness.model_validate(earlier)
            continue
        jobs[question.question_id] = (question.question, sent.get("answer"), question.expected_facts)
    answers.update(await _correctness_all(correctness, jobs, concurrency))

    names = metric_names(tuple(ks))
    per_question: dict[str, dict[str, Any]] = {}
    diagnoses = dict.fromkeys(DIAGNOSES, 0)
    for target in targets:
        question_id = target.query_id
        traced = by_question.get(question_id)
        relevant = {c for c, g in target.grades.items() if g >= relevance_level}
        result = evaluation.per_query.get(question_id)
        row: dict[str, Any] = {
            "category": target.category,
            "slice": slice_of.get(question_id),
            "trace_id": None if traced is None else traced["trace_id"],
        }
        if result is not None:
            row.update(result.scores)
        gold_hit = None
        if traced is not None and relevant and question_id not in duplicate_ids:
            gold_hit = any(c in relevant for c in _ranking(traced))
        row["gold_hit"] = gold_hit
        row["false_excluded"] = question_id in false_excluded if question_id in excluded else None
        answer = answers.get(question_id)
        if answer is not None:
            score = None if traced is None else faithfulness.get(str(traced["trace_id"]))
            supported = None if score is None else score >= supported_threshold
            row["correctness"] = answer.model_dump(mode="json")
            row["correct"] = None if answer.correct is None else float(answer.correct)
            row["faithfulness"] = score
            row["diagnosis"] = diagnose(gold_hit, answer.correct, supported)
            diagnoses[row["diagnosis"]] += 1
        per_question[question_id] = row

    judged = [a for a in answers.values() if a.correct is not None]
    return {
        "run_id": run_id,
        "tenant": tenant,
        "golden_version": golden.version,
        "ks": list(ks),
        "relevance_level": relevance_level,
        "traces": {"matched": len(by_question), "untagged": untagged, "superseded": extra},
        "denominators": {name: len(ids) for name, ids in slices.items()},
        "slices": slices,
        "overall": {name: evaluation.mean.get(name) for name in names},
        "per_category": [
            {"category": c.category, "scored": c.count, "mean": dict(c.mean)} for c in evaluation.per_category
        ],
        "filter_false_exclusion": {
            "rate": evaluation.false_exclusion.rate,
            "numerator": evaluation.false_exclusion.numerator,
            "denominator": evaluation.false_exclusion.denominator,
            "questions": list(evaluation.false_exclusion.query_ids),
        },
        "correctness": {
            "judge": correctness.name,
            "judge_version": correctness.version,
            "questions": len(answers),
            "scored": len(judged),
            "correct": sum(1 for a in judged if a.correct),
            "no_facts": sum(1 for a in answers.values() if a.outcome == "no_facts"),
            "failed": sum(1 for a in answers.values() if a.outcome == "failed"),
            "rate": (sum(1 for a in judged if a.correct) / len(judged)) if judged else None,
        },
        "diagnoses": diagnoses,
        "per_question": per_question,
    }


def paired_metrics(ks: Sequence[int]) -> tuple[str, ...]:
    """The per-question keys `compare_runs` compares, for these cutoffs."""
    return (
        *(f"recall@{k}" for k in ks),
        *(f"ndcg@{k}" for k in ks),
        "reciprocal_rank",
        "correct",
    )


def _interval(
    deltas: np.ndarray[Any, np.dtype[np.float64]], resamples: int, confidence: float, seed: int
) -> tuple[float, float]:
    if np.all(deltas == deltas[0]):
        # every resample has the same mean: the interval is that point (scipy would warn)
        return float(deltas[0]), float(deltas[0])
    result = stats.bootstrap(
        (deltas,),
        np.mean,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def compare_runs(
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    *,
    metrics: Sequence[str] | None = None,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired comparison of two run scores (`score_run` results): per metric, delta new - old with its CI.

    A metric is compared over the questions where both runs have a value;
    fewer than two pairs give no interval (None). `significant` is True when
    the interval excludes 0. `better` and `worse` at the top list questions
    where some metric moved one way and none the other; `mixed`, both ways.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if metrics is None:
        ks = [k for k in new.get("ks", []) if k in set(old.get("ks", []))]
        metrics = paired_metrics(ks)
    new_rows: Mapping[str, Mapping[str, Any]] = new.get("per_question", {})
    old_rows: Mapping[str, Mapping[str, Any]] = old.get("per_question", {})
    up: dict[str, set[str]] = {}
    down: dict[str, set[str]] = {}
    by_metric: dict[str, Any] = {}
    for metric in metrics:
        pairs = [
            (q, float(new_rows[q][metric]), float(old_rows[q][metric]))
            for q in sorted(new_rows)
            if q in old_rows and new_rows[q].get(metric) is not None and old_rows[q].get(metric) is not None
        ]
        better = [q for q, a, b in pairs if a > b]
        worse = [q for q, a, b in pairs if a < b]
        for q in better:
            up.setdefault(q, set()).add(metric)
        for q in worse:
            down.setdefault(q, set()).add(metric)
        entry: dict[str, Any] = {
            "pairs": len(pairs),
            "old_mean": None,
            "new_mean": None,
            "delta": None,
            "lower": None,
            "upper": None,
            "significant": False,
            "better": better,
            "worse": worse,
        }
        if pairs:
            deltas = np.array([a - b for _, a, b in pairs], dtype=np.float64)
            entry["old_mean"] = math.fsum(b for _, _, b in pairs) / len(pairs)
            entry["new_mean"] = math.fsum(a for _, a, _ in pairs) / len(pairs)
            entry["delta"] = float(deltas.mean())
            if len(pairs) >= 2:
                lower, upper = _interval(deltas, resamples, confidence, seed)
                entry["lower"], entry["upper"] = lower, upper
                entry["significant"] = lower > 0 or upper < 0
        by_metric[metric] = entry
    return {
        "run_id": new.get("run_id"),
        "against": old.get("run_id"),
        "bootstrap": {
            "method": "percentile, paired (resampling per-question deltas)",
            "resamples": resamples,
            "confidence": confidence,
            "seed": seed,
        },
        "metrics": by_metric,
        "better": sorted(q for q in up if q not in down),
        "worse": sorted(q for q in down if q not in up),
        "mixed": sorted(set(up) & set(down)),
    }
