"""One drift check: every batch detector on a pinned reference sample against a current window sample.

Pure computation over two `Sample`s (no storage, no metrics), so the
scheduler in the service and `ragmon drift run` give the same answer.

The query test is the query-text test (`TextKnnDrift`, with the embedder
stored with the reference) where ragmon embeds the queries itself, and the
MMD test on the app's vectors where the app sends them (`embedding_detector`).

Guarantees: every detector yields exactly one `Check`, even when it cannot
run. A side with fewer than `min_window` usable observations gives outcome
`insufficient_data` (drifted False, statistic 0); a detector that refuses its
input gives `error` with the message in `details["error"]`. A drifted query
test carries an explanation: the groups of current queries that are
over-represented against the reference (`detectors.explain`), grouped in
the query-text test's fitted TF-IDF space when that test ran, else in the
app's vectors. Every query test's details carry `power`: the power the bench
measured for that test at this window's size (`detectors.power`, an
estimate, stated as one), or None where no curve was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors import (
    DriftResult,
    EmbeddingModelChange,
    EmptyRetrievalDrift,
    HitDistributionDrift,
    QueryGroup,
    Reference,
    TextKnnDrift,
    TfidfEmbedder,
    TopkScoreDrift,
    TopScoreDrift,
    Window,
    embedding_detector,
    estimated_power,
    explain_query_drift,
    explain_query_text_drift,
)
from detectors.base import BatchDetector
from service.drift.embedders import text_detector
from service.drift.sample import Sample

__all__ = [
    "Check",
    "CheckSettings",
    "TextReference",
    "check_model_change",
    "check_samples",
    "explain_queries",
    "insufficient",
    "with_power",
]


@dataclass(frozen=True, slots=True)
class CheckSettings:
    """What a check needs to know: alphas, the minimum window, and the explanation's size."""

    alpha: float = 0.05
    alphas: Mapping[str, float] | None = None
    min_window: int = 50
    explain_groups: int = 40
    explain_examples: int = 5
    explain_limit: int = 10
    seed: int = 0

    def alpha_for(self, detector: str) -> float:
        return (self.alphas or {}).get(detector, self.alpha)


@dataclass(frozen=True, slots=True)
class Check:
    """One detector's result with its outcome (ok, drift, insufficient_data, error) and explanation."""

    result: DriftResult
    outcome: str
    explanation: list[dict[str, Any]] | None = None


def insufficient(
    detector: str,
    version: str,
    reference_id: str | None,
    n_reference: int,
    n_window: int,
    window: tuple[datetime, datetime],
    alpha: float | None,
    reason: str,
) -> Check:
    """The `insufficient_data` check: nothing was tested, and nothing alarms."""
    return Check(
        DriftResult(
            detector=detector,
            version=version,
            reference_id=reference_id,
            window_start=window[0],
            window_end=window[1],
            n_reference=n_reference,
            n_window=n_window,
            statistic=0.0,
            p_value=None,
            alpha=alpha,
            drifted=False,
            details={"insufficient_data": reason},
        ),
        "insufficient_data",
    )


@dataclass(frozen=True, slots=True)
class TextReference:
    """Run the query-text test on this reference (ragmon embeds its queries), with its stored embedder."""

    embedder_state: bytes | None


def with_power(check: Check) -> Check:
    """`check` with the estimated power of its test at the window's size in `details["power"]`."""
    result = check.result
    n = int(str(result.details.get("n_window_used", result.n_window)))
    estimate = estimated_power(result.detector, n, result.alpha)
    details = {**result.details, "power": None if estimate is None else estimate.to_json()}
    return Check(result.model_copy(update={"details": details}), check.outcome, check.explanation)


def _run(
    kind: type[BatchDetector],
    fitted: Callable[[Reference], BatchDetector],
    reference: npt.NDArray[Any],
    current: npt.NDArray[Any],
    reference_id: str,
    reference_range: tuple[datetime, datetime],
    window: tuple[datetime, datetime],
    minimum: int,
    alpha: float | None,
) -> Check:
    """One detector of type `kind`, made ready for the reference by `fitted`, on one pair of samples."""
    name, version = kind.name, kind.version
    n_ref, n_win = int(reference.shape[0]), int(current.shape[0])
    if n_ref < minimum or n_win < minimum:
        return insufficient(
            name,
            version,
            reference_id,
            n_ref,
            n_win,
            window,
            alpha,
            f"needs at least {minimum} observations on each side (reference {n_ref}, window {n_win})",
        )
    try:
        detector = fitted(Reference(reference_id, reference, *reference_range))
        result = detector.score(Window(current, *window))
    except ValueError as exc:
        return Check(
            DriftResult(
                detector=name,
                version=version,
                reference_id=reference_id,
                window_start=window[0],
                window_end=window[1],
                n_reference=n_ref,
                n_window=n_win,
                statistic=0.0,
                p_value=None,
                alpha=alpha,
                drifted=False,
                details={"error": str(exc)},
            ),
            "error",
        )
    return Check(result, "drift" if result.drifted else "ok")


def check_samples(
    reference: Sample,
    current: Sample,
    *,
    reference_id: str,
    reference_range: tuple[datetime, datetime],
    window: tuple[datetime, datetime],
    settings: CheckSettings,
    text: TextReference | None = None,
) -> list[Check]:
    """Query (text or embedding), top-1 score, top-k score, empty-retrieval and hit-distribution checks."""
    checks: list[Check] = []
    ref_vectors, _ = reference.vectors()
    win_vectors, _ = current.vectors()
    # The query-text test's detector once fitted: its embedder places the explanation's groups.
    text_test: list[TextKnnDrift] = []
    if text is not None:
        text_alpha = settings.alpha_for(TextKnnDrift.name)
        state = text.embedder_state

        def fitted_text_test(pinned: Reference) -> TextKnnDrift:
            detector = text_detector(pinned, state, alpha=text_alpha, seed=settings.seed)
            text_test.append(detector)
            return detector

        embedding = _run(
            TextKnnDrift,
            fitted_text_test,
            np.array(reference.texts(), dtype=str),
            np.array(current.texts(), dtype=str),
            reference_id,
            reference_range,
            window,
            settings.min_window,
            text_alpha,
        )
    else:
        n_window = win_vectors.shape[0]
        # The registry picks the exact test up to 2,500 vectors and the linear-time one beyond.
        embedding_name = embedding_detector(n_window).name
        embedding_alpha = settings.alpha_for(embedding_name)
        vector_test = embedding_detector(n_window, alpha=embedding_alpha, seed=settings.seed)
        embedding = _run(
            type(vector_test),
            vector_test.fit,
            ref_vectors,
            win_vectors,
            reference_id,
            reference_range,
            window,
            settings.min_window,
            embedding_alpha,
        )
    embedding = with_power(embedding)
    if embedding.result.drifted:
        found = explain_queries(
            reference,
            current,
            text_test[0].embedder if text_test else None,
            alpha=embedding.result.alpha or settings.alpha,
            groups=settings.explain_groups,
            examples=settings.explain_examples,
            seed=settings.seed,
        )
        if found is not None:
            explained = [g.to_json() for g in found[: settings.explain_limit]]
            embedding = Check(embedding.result, embedding.outcome, explained)
    checks.append(embedding)
    factories: list[tuple[Callable[[float], BatchDetector], Callable[[Sample], npt.NDArray[Any]]]] = [
        (lambda a: TopScoreDrift(alpha=a, min_size=2), lambda s: s.scores("top1")),
        (lambda a: TopkScoreDrift(alpha=a, min_size=2), lambda s: s.scores("topk")),
        (lambda a: EmptyRetrievalDrift(alpha=a), lambda s: s.empty_flags()),
        (lambda a: HitDistributionDrift(alpha=a, seed=settings.seed), lambda s: s.hits()),
    ]
    for factory, values in factories:
        probe = factory(settings.alpha)
        alpha = settings.alpha_for(type(probe).name)
        detector = factory(alpha)
        checks.append(
            _run(
                type(detector),
                detector.fit,
                values(reference),
                values(current),
                reference_id,
                reference_range,
                window,
                settings.min_window,
                alpha,
            )
        )
    return checks


def explain_queries(
    reference: Sample,
    current: Sample,
    embedder: TfidfEmbedder | None,
    *,
    alpha: float,
    groups: int = 40,
    examples: int = 5,
    seed: int = 0,
) -> list[QueryGroup] | None:
    """The groups of window queries over- or under-represented against the reference, found in the
    space the query test compared them in: `embedder`'s fitted TF-IDF when ragmon embedded the
    queries (the query-text test), else the app's own vectors. None when there is too little to group."""
    if embedder is not None:
        return explain_query_text_drift(
            embedder,
            reference.texts(),
            current.texts(),
            groups=groups,
            examples=examples,
            alpha=alpha,
            seed=seed,
        )
    ref_vectors, _ = reference.vectors()
    win_vectors, win_texts = current.vectors()
    if ref_vectors.shape[0] < 2 or win_vectors.shape[0] < 2:
        return None
    return explain_query_drift(
        ref_vectors, win_vectors, win_texts, groups=groups, examples=examples, alpha=alpha, seed=seed
    )


def _scaled_keys(counts: Mapping[str, int], limit: int) -> npt.NDArray[np.str_]:
    """Keys repeated by count, scaled to about `limit` in all; a key seen at all appears at least once."""
    total = sum(counts.values())
    scale = min(1.0, limit / total) if total else 1.0
    return np.array(
        [key for key, count in sorted(counts.items()) for _ in range(max(1, round(count * scale)))],
        dtype=str,
    )


def check_model_change(
    reference_counts: Mapping[str, int],
    window_counts: Mapping[str, int],
    *,
    reference_id: str,
    reference_range: tuple[datetime, datetime],
    window: tuple[datetime, datetime],
    limit: int = 10_000,
) -> Check:
    """Does the window carry an embedding model (name or dimension) that no reference of the app has?"""
    detector = EmbeddingModelChange()
    if not reference_counts or not window_counts:
        return insufficient(
            detector.name,
            detector.version,
            reference_id,
            sum(reference_counts.values()),
            sum(window_counts.values()),
            window,
            None,
            "no reference or no traffic in the window",
        )
    result = detector.fit(
        Reference(reference_id, _scaled_keys(reference_counts, limit), *reference_range)
    ).score(Window(_scaled_keys(window_counts, limit), *window))
    # Report true counts, not the scaled ones the rule saw.
    result = result.model_copy(
        update={"n_reference": sum(reference_counts.values()), "n_window": sum(window_counts.values())}
    )
    return Check(result, "drift" if result.drifted else "ok")
