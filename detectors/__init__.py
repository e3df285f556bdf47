"""ragmon drift detectors: pure computation, fitted on a pinned reference and scored on a window.

Scheduling, storage and metrics live in `service/`; this package only turns
samples into `DriftResult`s (and, for query drift, explains what changed).
"""

from detectors.base import BatchDetector, DriftResult, Reference, StreamingMonitor, Window
from detectors.embedder import HashingEmbedder
from detectors.explain import QueryGroup, explain_query_drift, explain_query_text_drift
from detectors.hits import HitDistributionDrift
from detectors.mmd import MmdDrift
from detectors.model_change import EmbeddingModelChange, embedding_model_key
from detectors.power import PowerEstimate, estimated_power
from detectors.regeneration_band import RegenerationBand
from detectors.registry import DETECTORS, DetectorSpec, build, embedding_detector
from detectors.reservoir import Reservoir
from detectors.rff import RffMmdDrift
from detectors.scores import EmptyRetrievalDrift, ScoreDistributionDrift, TopkScoreDrift, TopScoreDrift
from detectors.text_knn import TextKnnDrift
from detectors.tfidf import TfidfEmbedder

__all__ = [
    "DETECTORS",
    "BatchDetector",
    "DetectorSpec",
    "DriftResult",
    "EmbeddingModelChange",
    "EmptyRetrievalDrift",
    "HashingEmbedder",
    "HitDistributionDrift",
    "MmdDrift",
    "PowerEstimate",
    "QueryGroup",
    "Reference",
    "RegenerationBand",
    "Reservoir",
    "RffMmdDrift",
    "ScoreDistributionDrift",
    "StreamingMonitor",
    "TextKnnDrift",
    "TfidfEmbedder",
    "TopScoreDrift",
    "TopkScoreDrift",
    "Window",
    "build",
    "embedding_detector",
    "embedding_model_key",
    "estimated_power",
    "explain_query_drift",
    "explain_query_text_drift",
]
