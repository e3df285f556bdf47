"""The shapes every drift detector shares: `Reference`, `Window`, `DriftResult` and the two protocols.

Batch detectors are fitted once on a pinned `Reference` and then score one
`Window` at a time (`fit(reference) -> Self`, `score(window) -> DriftResult`).
Streaming monitors take one value at a time (`update(value)`, `result()`).
Both keep their constructor arguments as attributes of the same name and can
hand their running state to a restarted worker (`to_state()` / `from_state()`).

A detector never changes its reference by itself: only re-pinning does, and a
window that alarmed must never be pinned (STYLE.md §3, "Don't learn from what
you flag").
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = [
    "BatchDetector",
    "DetectorState",
    "DriftResult",
    "FittedDetector",
    "Outcome",
    "Reference",
    "StreamingMonitor",
    "Window",
    "check_alpha",
    "check_min_size",
    "content_hash",
    "detector_params",
]

DetectorState = dict[str, Any]
"""Running state as plain Python values and NumPy arrays; what a restarted worker needs to resume."""


def content_hash(values: npt.ArrayLike) -> str:
    """A sha256 hex digest of a sample's dtype, shape and bytes: equal samples give equal hashes.

    Strings are hashed as UTF-32 (fixed width), so the hash does not depend on
    whether the caller passed a list or an object array.
    """
    array = np.asarray(values)
    if array.dtype == object:
        array = array.astype(str)
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256()
    digest.update(f"{array.dtype.str}|{array.shape}|".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _frozen_array(values: npt.ArrayLike) -> npt.NDArray[Any]:
    array = np.array(values, copy=True)
    if array.dtype == object:
        array = array.astype(str)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, slots=True, eq=False)
class Window:
    """A sample of one quantity observed over `[start, end)`: what a detector scores.

    `values` is copied and made read-only, so a window cannot change after a
    detector has seen it. Rows are observations (one per trace).
    """

    values: npt.NDArray[Any]
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"window ends ({self.end}) before it starts ({self.start})")
        object.__setattr__(self, "values", _frozen_array(self.values))

    @property
    def n(self) -> int:
        return int(self.values.shape[0]) if self.values.ndim else 0


@dataclass(frozen=True, slots=True, eq=False)
class Reference:
    """A pinned sample that windows are compared with.

    `content_hash` is computed from the values, so two references with the same
    data have the same hash whatever their ids; `id` names the pinned version
    (the service assigns it, e.g. "app/2024-06-01..2024-06-08/v3"). A reference
    never changes: re-pinning makes a new one.
    """

    id: str
    values: npt.NDArray[Any]
    start: datetime
    end: datetime
    content_hash: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a reference needs a non-empty id")
        if self.end < self.start:
            raise ValueError(f"reference ends ({self.end}) before it starts ({self.start})")
        values = _frozen_array(self.values)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "content_hash", content_hash(values))

    @property
    def n(self) -> int:
        return int(self.values.shape[0]) if self.values.ndim else 0

    def to_state(self) -> DetectorState:
        return {"id": self.id, "values": self.values, "start": self.start, "end": self.end}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Reference:
        return cls(id=state["id"], values=state["values"], start=state["start"], end=state["end"])


class DriftResult(BaseModel):
    """The outcome of one detector on one window; maps 1:1 to a stored drift run and to the drift metrics.

    `p_value` and `alpha` are None only for rule-based detectors (an embedding
    model change is an event, not a test). `drifted` is `p_value <= alpha` for
    tests; `statistic` is in the detector's own units, named in `details`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    detector: str
    version: str
    reference_id: str | None
    window_start: datetime | None
    window_end: datetime | None
    n_reference: int = Field(ge=0)
    n_window: int = Field(ge=0)
    statistic: float
    p_value: float | None = Field(default=None, ge=0.0, le=1.0)
    alpha: float | None = Field(default=None, gt=0.0, lt=1.0)
    drifted: bool
    details: dict[str, JsonValue] = Field(default_factory=dict)


def detector_params(detector: object) -> dict[str, Any]:
    """The constructor arguments of a detector, read back from its same-named attributes."""
    signature = inspect.signature(type(detector).__init__)
    return {
        name: getattr(detector, name)
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    }


@runtime_checkable
class BatchDetector(Protocol):
    """Fitted once on a pinned reference, then scores windows; scoring never changes the fit."""

    name: ClassVar[str]
    version: ClassVar[str]

    def fit(self, reference: Reference) -> Self: ...

    def score(self, window: Window) -> DriftResult: ...

    def to_state(self) -> DetectorState: ...

    @classmethod
    def from_state(cls, state: DetectorState) -> Self: ...


@runtime_checkable
class StreamingMonitor(Protocol):
    """Takes one observation at a time and says at any moment whether the stream is out of bounds."""

    name: ClassVar[str]
    version: ClassVar[str]

    def update(self, value: Any) -> None: ...

    def result(self) -> DriftResult: ...

    def to_state(self) -> DetectorState: ...

    @classmethod
    def from_state(cls, state: DetectorState) -> Self: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a concrete detector computes for one window, before it is wrapped in a `DriftResult`."""

    statistic: float
    p_value: float | None
    details: dict[str, JsonValue] = field(default_factory=dict)
    drifted: bool | None = None
    """Set only by rule-based detectors; tests leave it None and alarm when `p_value <= alpha`."""


class FittedDetector:
    """The shared body of batch detectors: keeps the reference, wraps outcomes, saves and restores state.

    Subclasses set `name` and `version`, keep their constructor arguments as
    same-named attributes, and implement `_check`, `_fit`, `_score` and, when
    fitting is costly or random, `_fitted_state` / `_load_fitted`.
    """

    name: ClassVar[str]
    version: ClassVar[str]
    alpha: float | None = None

    _reference: Reference | None = None

    @property
    def reference(self) -> Reference | None:
        return self._reference

    def fit(self, reference: Reference) -> Self:
        """Pin `reference`; raises ValueError when its values do not suit this detector."""
        self._check(reference.values, "reference")
        self._fit(reference.values)
        self._reference = reference
        return self

    def score(self, window: Window) -> DriftResult:
        """Compare `window` with the reference; RuntimeError before `fit`, ValueError on bad input."""
        if self._reference is None:
            raise RuntimeError(f"{self.name}: fit(reference) must be called before score(window)")
        self._check(window.values, "window")
        outcome = self._score(window.values)
        drifted = outcome.drifted
        if drifted is None:
            if outcome.p_value is None or self.alpha is None:
                raise RuntimeError(f"{self.name}: a test must give a p-value and have an alpha")
            drifted = outcome.p_value <= self.alpha
        return DriftResult(
            detector=self.name,
            version=self.version,
            reference_id=self._reference.id,
            window_start=window.start,
            window_end=window.end,
            n_reference=self._reference.n,
            n_window=window.n,
            statistic=outcome.statistic,
            p_value=outcome.p_value,
            alpha=self.alpha,
            drifted=drifted,
            details=outcome.details,
        )

    def to_state(self) -> DetectorState:
        """Constructor arguments, the pinned reference and whatever fitting drew at random."""
        reference = self._reference
        return {
            "params": detector_params(self),
            "reference": None if reference is None else reference.to_state(),
            "fitted": None if reference is None else self._fitted_state(),
        }

    @classmethod
    def from_state(cls, state: DetectorState) -> Self:
        """Rebuild a detector from `to_state()`; it scores every window exactly as the original did."""
        detector = cls(**state["params"])
        if state.get("reference") is not None:
            reference = Reference.from_state(state["reference"])
            detector._check(reference.values, "reference")
            detector._load_fitted(reference.values, state.get("fitted") or {})
            detector._reference = reference
        return detector

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        raise NotImplementedError

    def _fit(self, values: npt.NDArray[Any]) -> None:
        raise NotImplementedError

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        raise NotImplementedError

    def _fitted_state(self) -> DetectorState:
        return {}

    def _load_fitted(self, values: npt.NDArray[Any], fitted: Mapping[str, Any]) -> None:
        self._fit(values)


def check_alpha(alpha: float) -> None:
    """Raise ValueError unless 0 < alpha < 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")


def check_min_size(values: npt.NDArray[Any], role: str, minimum: int, detector: str) -> None:
    """Raise ValueError when a sample has fewer than `minimum` rows."""
    n = int(values.shape[0]) if values.ndim else 0
    if n < minimum:
        raise ValueError(f"{detector}: the {role} needs at least {minimum} observations, got {n}")
