"""The embedded demo's settings and its pause plan."""

from __future__ import annotations

import pytest

from service.config import load_config
from service.demo.settings import DEMO_REVIEWER, WINDOW_REQUESTS, DemoPlan, demo_config, new_token


def test_the_demo_reviewer_is_added_to_the_configured_ones_and_only_schedules_change() -> None:
    base = load_config(
        environ={},
        overrides={
            "review": {"reviewers": {"ann": {"token": "ann-token-0123456789"}}},
            "drift": {"alpha": 0.01},
        },
    )
    token = new_token()
    config = demo_config(base, token)
    assert set(config.review.reviewers) == {"ann", DEMO_REVIEWER}
    secret = config.review.reviewers[DEMO_REVIEWER].token
    assert secret is not None and secret.get_secret_value() == token
    assert token not in config.model_dump_json()  # never shown where the config is printed or logged
    assert config.sampler.rates.base == 1.0
    assert config.drift.alpha == 0.01 and config.drift.regeneration_alpha == base.drift.regeneration_alpha
    assert config.drift.interval_s < base.drift.interval_s
    assert config.budget.calls_per_minute > base.budget.calls_per_minute  # the offline judge is free


def test_a_configured_llm_judge_keeps_its_budget() -> None:
    base = load_config(environ={}, overrides={"judge": {"base_url": "http://127.0.0.1:9/v1"}})
    assert demo_config(base, new_token()).budget == base.budget


def test_the_demo_pauses_at_every_window_and_at_the_shift() -> None:
    plan = DemoPlan.of(300, None)
    assert plan.shift_after == 150
    assert sorted(plan.pauses) == list(range(WINDOW_REQUESTS, 300, WINDOW_REQUESTS))
    assert sorted(DemoPlan.of(120, 70).pauses) == [50, 70, 100]
    assert DemoPlan.of(1, None).pauses == frozenset()
    for requests, shift in ((0, None), (10, 10), (10, 0)):
        with pytest.raises(ValueError):
            DemoPlan.of(requests, shift)
