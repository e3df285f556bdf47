"""ReaskDetector: near-identical re-asks in one session within the window become regenerations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.config import RegenerationConfig
from service.model import Feedback, RagTrace
from service.regeneration import ReaskDetector, jaccard, query_words
from tests.consumers import SinkConsumer

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def trace(
    n: int, query: str, *, session: str | None = "s1", at_s: float = 0, regen: bool = False
) -> RagTrace:
    return RagTrace(
        trace_id=f"{n:032x}",
        session_id=session,
        query=query,
        start_time=T0 + timedelta(seconds=at_s),
        is_regeneration=regen,
        regeneration_source="attribute" if regen else None,
    )


def test_near_identical_queries_match_and_different_ones_do_not() -> None:
    a = query_words("How do I reset my password?")
    assert jaccard(a, query_words("how do i reset my password")) == 1.0
    assert jaccard(a, query_words("How can I reset my password")) >= 0.8
    assert jaccard(a, query_words("How do I change my email address?")) < 0.5


async def test_reask_in_same_session_within_window_is_marked() -> None:
    sink = SinkConsumer()
    detector = ReaskDetector(RegenerationConfig(window_s=120), sink)
    await detector.consume_traces([trace(1, "How do I reset my password?", at_s=0)])
    await detector.consume_traces([trace(2, "how do I reset my password", at_s=30)])
    first, second = sink.traces
    assert first.is_regeneration is False
    assert second.is_regeneration is True and second.regeneration_source == "reask"


async def test_no_match_across_sessions_outside_window_or_without_session() -> None:
    sink = SinkConsumer()
    detector = ReaskDetector(RegenerationConfig(window_s=120), sink)
    await detector.consume_traces(
        [
            trace(1, "reset my password", at_s=0),
            trace(2, "reset my password", session="s2", at_s=10),
            trace(3, "reset my password", at_s=500),
            trace(4, "reset my password", session=None, at_s=501),
        ]
    )
    assert [t.is_regeneration for t in sink.traces] == [False, False, False, False]


async def test_explicit_flag_is_kept_with_its_source() -> None:
    sink = SinkConsumer()
    detector = ReaskDetector(RegenerationConfig(), sink)
    await detector.consume_traces([trace(1, "q one", at_s=0), trace(2, "q one", at_s=5, regen=True)])
    assert sink.traces[1].regeneration_source == "attribute"


async def test_session_memory_is_bounded() -> None:
    sink = SinkConsumer()
    detector = ReaskDetector(RegenerationConfig(max_sessions=10), sink)
    await detector.consume_traces([trace(i, "same question", session=f"s{i}", at_s=i) for i in range(1, 100)])
    assert len(detector._last) == 10


async def test_regenerate_click_then_reask_counts_once() -> None:
    sink = SinkConsumer()
    detector = ReaskDetector(RegenerationConfig(window_s=120), sink)
    await detector.consume_traces([trace(1, "How do I export my data?", at_s=0)])
    click = Feedback(event_id="e1", trace_id=f"{1:032x}", kind="regenerate", time=T0 + timedelta(seconds=5))
    await detector.consume_feedback([click])
    await detector.consume_traces([trace(2, "How do I export my data?", at_s=10)])
    assert sink.feedback == [click]  # feedback passes through unchanged
    assert sink.traces[1].is_regeneration is False  # the click already counted this regeneration
