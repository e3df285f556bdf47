"""`service/review/correction.py` and `blind_labels.py` on SQLite and PostgreSQL: which labels feed the
human-corrected estimate (blind only, judged in the window, one per trace, the tenant's own), the
numbers against the in-process estimator, the gauges (set, and removed when a group falls under the
minimum), and judge-human agreement with its test against the reference period."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from prometheus_client import generate_latest

from sampler.corrected import LabelledSample, corrected_cells
from service.config import JudgingConfig, MetricsConfig, ReviewConfig
from service.metrics import Metrics
from service.review.agreement import agreement, disagreement_p_value
from service.review.correction import HumanCorrection
from service.review.records import ReviewIn
from service.store.trace_store import Store
from tests.blind_sample import NOW, World, tid


def correction(world: World, min_labels: int = 3, metrics: Metrics | None = None) -> HumanCorrection:
    return HumanCorrection(
        JudgingConfig(estimate_window_s=86400.0),
        ReviewConfig(min_labels=min_labels, agreement_reference_s=7 * 86400.0),
        world.judgments,
        metrics or Metrics(),
    )


@pytest.fixture
def world(store: Store) -> World:
    return World(store)


def test_only_blind_labels_of_the_windows_judged_sample_count_once_each(world: World) -> None:
    faithful = [world.judged(i, 1.0) for i in range(6)]
    half = [world.judged(10 + i, 0.5, pi=1.0) for i in range(4)]
    world.judged(20, None, outcome="no_claims", claims=0)
    # blind labels: the reviewer disagrees on two of the judge's faithful answers
    for trace_id in faithful[:4]:
        world.label(trace_id, ReviewIn("faithful"))
    for trace_id in faithful[4:]:
        world.label(trace_id, ReviewIn("unfaithful", claims_supported=(True, False)))
    world.label(half[0], ReviewIn("unfaithful", claims_supported=(False, False)))
    world.label(half[1], ReviewIn("unsure"))  # no answer-level label, no claim marks: no claim label
    # not counted: a flagged label, a label of a trace never judged, another tenant's trace, an answer the
    # judge found no claims in, and a trace judged before the window
    world.label(half[2], ReviewIn("faithful"), queue="flagged")
    world.label(tid(99), ReviewIn("faithful"))
    world.judged(30, 1.0, tenant="b")
    world.label(tid(30), ReviewIn("unfaithful"), tenant="b", who="carol")
    world.label(tid(20), ReviewIn("faithful"))
    old = world.judged(40, 1.0, age=timedelta(days=3))
    world.label(old, ReviewIn("unfaithful"))

    found = correction(world).compute(NOW, "answers", tenant="a").corrected["app"][("shop",)]
    cells = world.judgments.window_cells(NOW - timedelta(days=1), NOW, tenant="a", reading="answers")
    expected = corrected_cells(
        cells,
        [LabelledSample(0.5, 1.0, 1.0)] * 4
        + [LabelledSample(0.5, 1.0, 0.0)] * 2
        + [LabelledSample(1.0, 0.0, 0.0, stratum="thumbs_down")],
        min_labels=3,
    )
    assert found == expected
    assert found.n_human == 7 and found.n_judged == 10
    claims = correction(world).compute(NOW, "claims", tenant="a").corrected["app"][("shop",)]
    assert claims.n_human == 7  # the unsure label has no marks; the faithful ones count 1.0
    assert claims.mean_difference is not None and claims.mean_difference < 0


def test_flagged_labels_alone_give_no_corrected_estimate(world: World) -> None:
    for i in range(8):
        world.label(world.judged(i, 1.0), ReviewIn("unfaithful"), queue="flagged")
    found = correction(world).compute(NOW, "answers").corrected["app"][("shop",)]
    assert found.estimate is None and found.n_human == 0
    assert found.reason == "0 blind labels, fewer than the 3 needed"


def test_a_relabel_changes_the_estimate_once_and_a_nan_score_never_gets_in(world: World) -> None:
    ids = [world.judged(i, 1.0) for i in range(4)]
    for trace_id in ids:
        world.label(trace_id, ReviewIn("faithful"))
    before = correction(world).compute(NOW, "answers").corrected["app"][("shop",)]
    item = world.reviews.find("a", "blind", ids[0])
    assert item is not None
    world.reviews.submit(item.id, "alice", ["a"], ReviewIn("unfaithful"))
    after = correction(world).compute(NOW, "answers").corrected["app"][("shop",)]
    assert before.n_human == after.n_human == 4
    assert before.mean_difference == 0.0 and after.mean_difference == pytest.approx(-0.25)


def test_gauges_are_set_and_removed_when_a_group_falls_under_the_minimum(world: World) -> None:
    for i in range(5):
        world.label(world.judged(i, 1.0), ReviewIn("faithful" if i else "unfaithful"))
    metrics = Metrics(MetricsConfig())
    fixed = correction(world, metrics=metrics)
    fixed.export()
    text = generate_latest(metrics.registry).decode()
    labels = 'app="shop",intent="all",release="all"'
    assert f"ragmon_faithful_answers_corrected_ratio{{{labels}}} 0.8" in text
    assert (
        'ragmon_faithfulness_human_labels{app="shop",intent="all",reading="answers",release="all"} 5.0'
        in text
    )
    assert 'ragmon_judge_human_agreement_ratio{app="shop"} 0.8' in text
    assert 'ragmon_judge_human_pairs{app="shop"} 5.0' in text
    # no reference pairs, so no test
    assert not any(line.startswith("ragmon_judge_human_disagreement_p_value{") for line in text.splitlines())
    fixed.review = ReviewConfig(min_labels=6)
    fixed.export()
    text = generate_latest(metrics.registry).decode()
    assert "ragmon_faithful_answers_corrected_ratio{" not in text
    assert (
        'ragmon_faithfulness_human_labels{app="shop",intent="all",reading="answers",release="all"} 5.0'
        in text
    )


def test_disagreement_above_the_reference_period_is_tested(world: World) -> None:
    # reference (2-8 days ago): 1 of 20 pairs disagree; the window: 8 of 20
    for i in range(20):
        trace_id = world.judged(i, 1.0, age=timedelta(days=3))
        world.label(trace_id, ReviewIn("unfaithful" if i == 0 else "faithful"))
    for i in range(20):
        trace_id = world.judged(100 + i, 1.0)
        world.label(trace_id, ReviewIn("unfaithful" if i < 8 else "faithful"))
    [(key, found)] = correction(world).agreement(NOW).items()
    assert key == ("shop",) and found.pairs == 20
    assert found.agreement.value == 0.6 and found.reference_disagreement.value == 0.05
    assert found.p_value == pytest.approx(disagreement_p_value(8, 20, 1, 20))
    assert found.p_value is not None and found.p_value < 0.01
    assert found.kappa == 0.0  # the judge said faithful every time: no agreement beyond chance


@pytest.mark.parametrize(
    ("pairs", "reference_pairs", "disagreement"), [(60, 240, 0.15), (30, 120, 0.1), (100, 100, 0.3)]
)
def test_the_disagreement_test_holds_its_false_alarm_rate_under_no_change(
    pairs: int, reference_pairs: int, disagreement: float
) -> None:
    """The exact false-alarm rate at alpha 0.01 when both periods disagree equally often: every
    (window, reference) count weighed by its binomial probability. Fisher's test keeps it under alpha."""
    import numpy as np
    from scipy.stats import binom

    window = binom.pmf(np.arange(pairs + 1), pairs, disagreement)
    reference = binom.pmf(np.arange(reference_pairs + 1), reference_pairs, disagreement)
    rate = 0.0
    for a in range(pairs + 1):
        for b in range(reference_pairs + 1):
            weight = window[a] * reference[b]
            if weight > 1e-12:
                p = disagreement_p_value(a, pairs, b, reference_pairs)
                rate += weight if p is not None and p < 0.01 else 0.0
    assert 0.002 < rate <= 0.01
    same = [LabelledSample(1.0, 1.0, 1.0)] * 10 + [LabelledSample(1.0, 1.0, 0.0)]
    assert agreement(same, same).p_value == pytest.approx(disagreement_p_value(1, 11, 1, 11))
    assert agreement(same, []).p_value is None


def test_with_a_tenant_label_each_tenant_gets_its_own_series(world: World) -> None:
    for n, tenant in ((0, "a"), (100, "b")):
        for i in range(4):
            trace_id = world.judged(n + i, 1.0, tenant=tenant)
            world.label(trace_id, ReviewIn("faithful" if tenant == "a" else "unfaithful"), tenant=tenant)
    metrics = Metrics(MetricsConfig(tenant_label=True))
    correction(world, metrics=metrics).export()
    text = generate_latest(metrics.registry).decode()
    labels = 'app="shop",intent="all",release="all"'
    assert f'ragmon_faithful_answers_corrected_ratio{{{labels},tenant="a"}} 1.0' in text
    assert f'ragmon_faithful_answers_corrected_ratio{{{labels},tenant="b"}} 0.0' in text
    assert 'ragmon_judge_human_pairs{app="shop",tenant="b"} 4.0' in text


def test_an_export_sums_the_window_once_whatever_the_tenants_and_readings(world: World, store: Store) -> None:
    """The window is linear to sum (a day of samples: a million at 600 traces/s); an export read it
    once a reading and tenant."""
    for n, tenant in ((0, "a"), (100, "b")):
        for i in range(4):
            world.label(world.judged(n + i, 1.0, tenant=tenant), ReviewIn("faithful"), tenant=tenant)
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    metrics = Metrics(MetricsConfig(tenant_label=True))
    correction(world, metrics=metrics).export()
    assert len([s for s in statements if "judge_queue LEFT OUTER JOIN judgments" in s]) == 1
    text = generate_latest(metrics.registry).decode()
    assert all(f'ragmon_judge_human_pairs{{app="shop",tenant="{t}"}} 4.0' in text for t in "ab")
