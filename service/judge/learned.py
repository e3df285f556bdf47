"""`LearnedJudge`: the offline judge whose decision is a small boosted model over claim features.

The model is an additive ensemble of stumps (one feature, one threshold, two leaf values) over an
answer's features (`features.py`): per claim feature its minimum and mean over the answer's
claims, then the answer-level features. Its parameters are a JSON file in this package
(`learned_judge.json`), written by `bench/judge/loso.py --ship` from all nine public sources of
its leave-one-source-out set (learned/2 came from `train_learned.py` and the dev set's tune half),
with the command, the training data's hash and the version recorded in it. At judge time it needs
numpy alone: no model hub, no network, deterministic. The last stump is set by the training
script, not learned: a claim with under half its content words in the context fails the answer,
however well the rest is supported. It is an option (`judge.offline: learned`), not the default:
on sources it never saw it did not beat the heuristic (`bench/judge/loso_summary.json`).

An answer is faithful when its score reaches the file's threshold (chosen on out-of-fold scores of
the training rows). Claims keep the judgment contract: when the answer passes, every claim is
supported; when it fails, a claim is unsupported when it fails on its own (scored as a one-claim
answer: its own features in place of the minimum and the mean, the answer-level ones kept), and
the lowest-scoring claim is unsupported when none fails alone, so "no unsupported claim" and
"judged faithful" always agree. The failure mode is the heuristic's for that claim where the
heuristic flags it (a missing name, a new number ...), else fabrication; whether the context
was sufficient is the heuristic's reading. An answer without claims
(a refusal) is `no_claims`, as with the heuristic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.judge.features import FEATURE_NAMES, AnswerFeatures, answer_features
from service.judge.heuristic import HeuristicJudge
from service.judge.judgment import FailureMode, Verdict

__all__ = ["CLAIM_FEATURES", "MODEL_FEATURES", "LearnedJudge", "LearnedModel", "aggregate", "load_model"]

# the features measured per claim (aggregated as min and mean), then those of the whole answer
CLAIM_FEATURES = FEATURE_NAMES[: FEATURE_NAMES.index("answer_content_share")]
MODEL_FEATURES: tuple[str, ...] = (
    *(f"min_{n}" for n in CLAIM_FEATURES),
    *(f"mean_{n}" for n in CLAIM_FEATURES),
    *FEATURE_NAMES[len(CLAIM_FEATURES) :],
)
MODEL_FILE = "learned_judge.json"
_FAILURE_MODES: frozenset[str] = frozenset(
    {"wrong_entity", "contradiction", "overgeneralization", "fabrication"}
)


class Stump(BaseModel):
    """One member of the ensemble: `left` when feature <= threshold, else `right` (learning rate applied)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature: int = Field(ge=0)
    threshold: float
    left: float
    right: float


class LearnedModel(BaseModel):
    """The learned judge's parameters, as `bench/judge/train_learned.py`'s `model_json` writes them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(pattern=r"^learned/\d+$")
    features: list[str]
    base: float
    stumps: list[Stump]
    threshold: float
    training: dict[str, Any] = Field(
        description="command, data hash, rows, settings and out-of-fold accuracy"
    )

    @model_validator(mode="after")
    def _matches_code(self) -> LearnedModel:
        if tuple(self.features) != MODEL_FEATURES:
            raise ValueError("the model's features are not the ones this code computes: retrain it")
        if any(s.feature >= len(self.features) for s in self.stumps):
            raise ValueError("a stump names a feature the model does not have")
        return self

    def scores(self, rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Score of each row of model features (higher: more likely faithful)."""
        out = np.full(len(rows), self.base)
        for s in self.stumps:
            out += np.where(rows[:, s.feature] <= s.threshold, s.left, s.right)
        return out


def aggregate(matrix: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """An answer's model features from its claims' feature rows (at least one row)."""
    claim = matrix[:, : len(CLAIM_FEATURES)]
    return np.concatenate([claim.min(axis=0), claim.mean(axis=0), matrix[0, len(CLAIM_FEATURES) :]])


def _own(matrix: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Each claim's model features as a one-claim answer (its own values as min and mean)."""
    claim = matrix[:, : len(CLAIM_FEATURES)]
    return np.concatenate([claim, claim, matrix[:, len(CLAIM_FEATURES) :]], axis=1)


def load_model(path: Path | None = None) -> LearnedModel:
    """The model in `path`, or the one shipped in this package."""
    text = (
        path.read_text("utf-8")
        if path is not None
        else resources.files("service.judge").joinpath(MODEL_FILE).read_text("utf-8")
    )
    return LearnedModel.model_validate(json.loads(text))


class LearnedJudge(HeuristicJudge):
    """The offline judge with the learned decision (see the module docstring); reads its trace like the
    heuristic (chunk text and titles), labelled `judge="heuristic"` (offline), version `learned/N`."""

    def __init__(self, model: LearnedModel | None = None) -> None:
        super().__init__()
        self.model = model or load_model()

    @property
    def version(self) -> str:
        return self.model.version

    def score(
        self, question: str, context: Sequence[str], answer: str, titles: Sequence[str] = ()
    ) -> float | None:
        """The answer's score (faithful at or above `model.threshold`), None for an answer without claims."""
        found = answer_features(question, context, answer, titles)
        if not found.claims:
            return None
        return float(self.model.scores(aggregate(found.matrix)[None, :])[0])

    def verdict(
        self, question: str, context: Sequence[str], answer: str, titles: Sequence[str] = ()
    ) -> Verdict:
        found = answer_features(question, context, answer, titles)
        claims = found.claims
        if not claims:
            return Verdict(
                claims=[],
                supported=[],
                unsupported=[],
                outcome="no_claims",
                failure_mode="none",
                context_sufficient=found.context_sufficient,
                rationale=f"{self.version}: no claims",
            )
        score = float(self.model.scores(aggregate(found.matrix)[None, :])[0])
        unsupported: list[int] = []
        if score < self.model.threshold:
            own = self.model.scores(_own(found.matrix))
            unsupported = [i for i, s in enumerate(own) if s < self.model.threshold] or [int(np.argmin(own))]
        failure_mode: FailureMode = "none"
        if unsupported:
            failure_mode = self._failure_mode(found, unsupported[0], context)
        return Verdict(
            claims=claims,
            supported=[i for i in range(len(claims)) if i not in unsupported],
            unsupported=unsupported,
            outcome="scored",
            failure_mode=failure_mode,
            context_sufficient=found.context_sufficient,  # the heuristic's reading of question and context
            rationale=f"{self.version}: score {score:.3f} against threshold {self.model.threshold:.3f}; "
            f"{len(claims) - len(unsupported)} of {len(claims)} claims supported",
        )

    def _failure_mode(self, found: AnswerFeatures, index: int, context: Sequence[str]) -> FailureMode:
        """The heuristic's failure mode for the claim when it flags that claim too, else fabrication."""
        if index in found.heuristic_unsupported:
            alone = HeuristicJudge().verdict("", context, found.claims[index])
            if alone.failure_mode in _FAILURE_MODES:
                return alone.failure_mode
        return "fabrication"
