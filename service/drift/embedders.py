"""The query embedder fitted on a pinned reference: fitted when the reference is pinned, stored with it, and
used to embed every window compared with it.

Only the query-text test (`detectors.TextKnnDrift`) has one: its TF-IDF
weights are learned from a seeded fifth of the reference's queries. Fitting
once at pin time and storing the result (rather than refitting per run)
keeps the embedding of a reference fixed for its whole life, even if a later
ragmon changes the embedder's defaults: the stored state carries every
fitted number and the embedder's version, and its name (`ragmon-tfidf-v1-…`
with a digest of the fitted state) is listed with the reference and in every
run's details.

The state is stored as an `.npz` archive of plain arrays (read back with
`allow_pickle=False`: a database row can never make us unpickle code).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from detectors import HashingEmbedder, Reference, TextKnnDrift, embedding_model_key
from detectors.base import detector_params
from detectors.tfidf import TfidfEmbedder

__all__ = ["builtin_model_key", "fit_reference_embedder", "reference_text_embedder", "text_detector"]


def builtin_model_key(dim: int) -> str:
    """The model key of queries ragmon embedded itself (the built-in hashing embedder at `dim`): a
    reference under this key is compared by the query-text test, in its own fitted space."""
    return embedding_model_key(HashingEmbedder(dim=dim).model_name, dim)


def _encode(detector: TextKnnDrift) -> bytes:
    embedder, fit_rows = detector.embedder, detector.fit_rows
    if embedder is None or fit_rows is None:
        raise RuntimeError("the query-text detector is not fitted")
    state = embedder.to_state()
    meta = {"version": state["version"], "params": state["params"], "n_fit": state["n_fit"]}
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        meta=np.array(json.dumps(meta)),
        slots=np.asarray(state["slots"], dtype="<i4"),
        df=np.asarray(state["df"], dtype="<i4"),
        fit_rows=np.asarray(fit_rows, dtype="<i8"),
    )
    return buffer.getvalue()


def _decode(blob: bytes) -> dict[str, object]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
        meta = json.loads(str(archive["meta"]))
        embedder = {**meta, "slots": archive["slots"], "df": archive["df"]}
        return {"embedder": embedder, "fit_rows": archive["fit_rows"]}


def fit_reference_embedder(texts: Sequence[str], *, seed: int) -> tuple[str, bytes] | None:
    """Fit the query-text test's embedder on a reference's query texts: its (name, stored state).

    None when the reference has fewer than 3 texts (nothing to split).
    """
    if len(texts) < 3:
        return None
    # Fitting reads only the texts; the reference's id and times are not part of the fitted state.
    epoch = datetime.fromtimestamp(0, UTC)
    detector = TextKnnDrift(seed=seed).fit(Reference("pin", np.array(list(texts), dtype=str), epoch, epoch))
    embedder = detector.embedder
    if embedder is None:
        raise RuntimeError("fitting the query-text detector left no embedder")
    return embedder.model_name, _encode(detector)


def text_detector(reference: Reference, state: bytes | None, *, alpha: float, seed: int) -> TextKnnDrift:
    """The query-text test on `reference` with the embedder stored for it, or fitted now when none was
    stored (references pinned before ragmon stored embedders).

    ValueError when the state is of another embedder version or does not match the reference.
    """
    if state is None:
        return TextKnnDrift(alpha=alpha, seed=seed).fit(reference)
    fitted = _decode(state)
    detector = TextKnnDrift.from_state(
        {
            "params": detector_params(TextKnnDrift(alpha=alpha, seed=seed)),
            "reference": reference.to_state(),
            "fitted": fitted,
        }
    )
    return detector


def reference_text_embedder(texts: Sequence[str], state: bytes | None, *, seed: int) -> TfidfEmbedder | None:
    """The query-text test's fitted embedder for a reference with these `texts`: the stored `state`,
    or fitted now when none was stored. None for fewer than 3 texts (nothing was fitted at pin time)."""
    if len(texts) < 3:
        return None
    epoch = datetime.fromtimestamp(0, UTC)
    reference = Reference("pin", np.array(list(texts), dtype=str), epoch, epoch)
    return text_detector(reference, state, alpha=0.05, seed=seed).embedder
