"""The detector registry: every detector ragmon runs, by the name used in results, metrics and the CLI.

The names form the closed set of the `detector` metric label. Each entry says
whether the detector is a batch test or a streaming monitor and what one
observation is, so the service knows which trace feature to collect for it
(`detectors.features`) and the conformance suite knows what data to plant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from detectors.base import BatchDetector, StreamingMonitor
from detectors.hits import HitDistributionDrift
from detectors.mmd import MmdDrift
from detectors.model_change import EmbeddingModelChange
from detectors.regeneration_band import RegenerationBand
from detectors.rff import RffMmdDrift
from detectors.scores import EmptyRetrievalDrift, TopkScoreDrift, TopScoreDrift
from detectors.text_knn import TextKnnDrift

__all__ = ["DETECTORS", "DetectorSpec", "InputKind", "build", "embedding_detector"]

InputKind = Literal["embedding", "text", "score", "flag", "category", "model_key", "regeneration"]
"""One observation: a vector, a query text, a float, a bool, a category string, a model key, or a
regeneration flag."""


@dataclass(frozen=True, slots=True)
class DetectorSpec:
    """One registered detector: its name, shape, input and how to build it."""

    name: str
    kind: Literal["batch", "streaming"]
    input: InputKind
    factory: Callable[..., BatchDetector | StreamingMonitor]
    summary: str


def _spec(
    factory: type[Any], kind: Literal["batch", "streaming"], input_kind: InputKind, summary: str
) -> DetectorSpec:
    return DetectorSpec(name=factory.name, kind=kind, input=input_kind, factory=factory, summary=summary)


DETECTORS: Mapping[str, DetectorSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            _spec(MmdDrift, "batch", "embedding", "query embeddings: MMD permutation test (quadratic)"),
            _spec(RffMmdDrift, "batch", "embedding", "query embeddings: random-Fourier-feature MMD (linear)"),
            _spec(TextKnnDrift, "batch", "text", "query texts: k-NN mixing + novelty, min-p, fitted TF-IDF"),
            _spec(TopScoreDrift, "batch", "score", "top-1 retrieval score: KS / Cramér–von Mises"),
            _spec(TopkScoreDrift, "batch", "score", "mean top-k retrieval score: KS / Cramér–von Mises"),
            _spec(EmptyRetrievalDrift, "batch", "flag", "share of empty retrievals: Fisher exact"),
            _spec(
                HitDistributionDrift, "batch", "category", "top hit over documents/collections: chi-square"
            ),
            _spec(EmbeddingModelChange, "batch", "model_key", "new embedding model name or dimension"),
            _spec(
                RegenerationBand, "streaming", "regeneration", "regeneration rate against its control band"
            ),
        )
    }
)


def build(name: str, **params: Any) -> BatchDetector | StreamingMonitor:
    """A new detector of the registered `name`; raises KeyError naming the known detectors otherwise."""
    try:
        spec = DETECTORS[name]
    except KeyError:
        raise KeyError(f"unknown detector {name!r}; known: {', '.join(sorted(DETECTORS))}") from None
    return spec.factory(**params)


def embedding_detector(n_window: int, *, alpha: float = 0.05, seed: int = 0) -> MmdDrift | RffMmdDrift:
    """The query-embedding test for a window of `n_window` vectors: exact MMD up to 2,500, RFF beyond."""
    if n_window <= 2500:
        return MmdDrift(alpha=alpha, seed=seed)
    return RffMmdDrift(alpha=alpha, seed=seed)
