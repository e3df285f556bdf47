"""The report's faithfulness section (`service/report/faithfulness.py`) and `ragmon review labels`: the
human-corrected reading leads where the blind labels allow it, the judge's is beside it, named, the
no-claims count is beside both, agreement has its n and interval, and the plan names labels a week."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main as ragmon
from service.config import JudgingConfig, ReviewConfig
from service.metrics import Metrics
from service.report.faithfulness import faithfulness_lines, faithfulness_section
from service.review.correction import HumanCorrection
from service.review.records import ReviewIn
from service.store.trace_store import Store
from tests.blind_sample import NOW, World


def fill(world: World, labels: int) -> None:
    """40 answers the judge calls faithful, 10 of them wrongly; `labels` of them labelled blind."""
    for i in range(40):
        trace_id = world.judged(i, 1.0)
        if i < labels:
            world.label(trace_id, ReviewIn("unfaithful" if i % 4 == 0 else "faithful"))
    world.judged(100, None, outcome="no_claims", claims=0)


def section_lines(world: World, min_labels: int) -> list[str]:
    correction = HumanCorrection(
        JudgingConfig(estimate_window_s=86400.0),
        ReviewConfig(min_labels=min_labels),
        world.judgments,
        Metrics(),
    )
    section = faithfulness_section(correction, NOW, "shop", half_width=0.05, blind_rate=0.05)
    return faithfulness_lines(section)


def test_the_corrected_reading_leads_with_the_judges_beside_it(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        world = World(store)
        fill(world, labels=32)
        claims, answers, agreement, *plans = section_lines(world, min_labels=30)
    finally:
        store.close()
    assert answers.startswith("faithful answers (share with no unsupported claim): human-corrected 0.75")
    assert "n = 32 blind labels of 40 judged" in answers and "difference -0.250" in answers
    assert "judge-only 1 (95 % CI" in answers and "n = 40 judged" in answers
    assert "1 answers without claims" in answers and "1 answers without claims" in claims
    assert agreement.startswith("judge-human agreement (blind sample): 0.75 (95 % CI ")
    assert "n = 32 pairs" in agreement and "no reference pairs before the period" in agreement
    [answer_plan] = [p for p in plans if "answers reading" in p]
    assert "blind labels a week" in answer_plan or "not reachable" in answer_plan
    assert "from the disagreement on 32 labels" in answer_plan


def test_too_few_labels_say_so_and_plan_from_an_assumption(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        world = World(store)
        fill(world, labels=5)
        _claims, answers, *_rest, plan = section_lines(world, min_labels=30)
    finally:
        store.close()
    assert "human-corrected: none (5 blind labels, fewer than the 30 needed)" in answers
    assert "assuming a residual variance of 0.25" in plan


def test_ragmon_review_labels_prints_the_plan_and_the_rate_to_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    store = Store(f"sqlite:///{data / 'ragmon.db'}")
    try:
        world = World(store)
        fill(world, labels=32)
    finally:
        store.close()
    assert ragmon(["review", "labels", "--data-dir", str(data), "--width", "0.2", "--tenant", "a"]) == 0
    out = capsys.readouterr().out
    assert "tenant a, window 1 days" in out and "human-corrected interval ± 0.2 at 95 %" in out
    assert "shop (blind rate now 0.05):" in out
    assert "answers  40 judged, 32 blind labels; corrected now 0.75 [" in out
    assert 'RAGMON_REVIEW__BLIND_RATES=\'{"shop": ' in out
    assert ragmon(["review", "labels", "--data-dir", str(data), "--width", "0.7"]) == 2
    assert ragmon(["review", "labels", "--data-dir", str(data), "--window", "soon"]) == 2
