from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from detectors.base import Reference, Window
from detectors.model_change import EmbeddingModelChange, embedding_model_key, split_model_key

T = datetime(2024, 1, 1, tzinfo=UTC)
SMALL = embedding_model_key("text-embedding-3-small", 1536)


def _score(reference: list[str], window: list[str], **params: int):  # type: ignore[no-untyped-def]
    detector = EmbeddingModelChange(**params).fit(Reference("r", np.array(reference), T, T))
    return detector.score(Window(np.array(window), T, T))


def test_same_model_never_fires() -> None:
    result = _score([SMALL] * 50, [SMALL] * 80)
    assert not result.drifted
    assert result.p_value is None and result.alpha is None
    assert result.statistic == 0.0


def test_new_model_name_fires_and_is_named() -> None:
    result = _score([SMALL] * 50, [SMALL] * 70 + ["text-embedding-3-large@1536"] * 10)
    assert result.drifted
    assert result.details["new_models"] == {"text-embedding-3-large@1536": 10}
    assert result.details["dimension_changed"] is False
    assert result.statistic == pytest.approx(10 / 80)


def test_dimension_change_of_the_same_name_fires() -> None:
    result = _score([SMALL] * 50, [embedding_model_key("text-embedding-3-small", 512)] * 5)
    assert result.drifted
    assert result.details["dimension_changed"] is True
    assert result.details["vanished_models"] == [SMALL]


def test_min_count_ignores_a_stray_trace() -> None:
    assert not _score([SMALL] * 50, [SMALL] * 50 + ["other@8"], min_count=5).drifted


def test_keys_round_trip_and_reject_garbage() -> None:
    assert split_model_key(embedding_model_key(None, 384)) == ("unknown", 384)
    assert split_model_key("a@b@12") == ("a@b", 12)
    with pytest.raises(ValueError):
        split_model_key("no-dimension")
    with pytest.raises(ValueError):
        embedding_model_key("m", 0)
    with pytest.raises(ValueError):
        EmbeddingModelChange().fit(Reference("r", np.array(["not a key"]), T, T))
