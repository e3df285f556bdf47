"""The offline judge that runs by default is the one the leave-one-source-out table chose.

`bench/judge/loso.py` trains every candidate on all but one public source and tests it on the one
left out, for each of nine sources, and writes what it measured and chose to the committed
`bench/judge/loso_summary.json` (results, no data). These tests hold the configuration, the judge
`build_judge` returns and the shipped learned model to that summary, and the summary's choice to
its own rule and figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.config import JudgeConfig
from service.judge.build import build_judge
from service.judge.heuristic import HeuristicJudge
from service.judge.learned import load_model

ROOT = Path(__file__).resolve().parents[3]
SUMMARY = ROOT / "bench" / "judge" / "loso_summary.json"
RUNNABLE = ("heuristic", "learned", "learned-noveto", "learned-worst", "learned-sources")


@pytest.fixture(scope="module")
def summary() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SUMMARY.read_text("utf-8"))
    return loaded


def test_the_table_covers_enough_sources_and_kinds(summary: dict[str, Any]) -> None:
    sources = summary["sources"]
    assert len(sources) >= 8
    assert {s["kind"] for s in sources.values()} >= {"qa", "summarization", "dialogue", "long_form", "rag"}
    for name in (*RUNNABLE, "overlap"):
        figures = summary["candidates"][name]["sources"]
        assert set(figures) == set(sources)
        for f in figures.values():
            lo, hi = f["balanced_accuracy_ci"]
            assert lo <= f["balanced_accuracy"] <= hi
            lo, hi = f["false_approval_ci"]
            assert lo <= f["false_approval"] <= hi
        worst = summary["candidates"][name]
        assert worst["worst_balanced_accuracy"] == min(f["balanced_accuracy"] for f in figures.values())


def test_the_choice_follows_the_rule_from_the_figures(summary: dict[str, Any]) -> None:
    candidates = summary["candidates"]
    learned = [c for c in RUNNABLE if c != "heuristic"]
    top = max(candidates[c]["worst_balanced_accuracy"] for c in learned)
    near = [c for c in learned if candidates[c]["worst_balanced_accuracy"] >= top - 0.005]
    best = max(near, key=lambda c: (candidates[c]["mean_balanced_accuracy"], -learned.index(c)))
    assert summary["learned_option"] == best
    beats = (
        candidates[best]["worst_balanced_accuracy"] > candidates["heuristic"]["worst_balanced_accuracy"]
        and summary["worst_source_margin_over_heuristic_ci"][best][0] > 0
    )
    assert summary["chosen"] == (best if beats else "heuristic")
    assert summary["offline_default"] == ("heuristic" if summary["chosen"] == "heuristic" else "learned")


def test_the_configured_default_is_the_chosen_judge(
    summary: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert JudgeConfig().offline == summary["offline_default"]
    judge = build_judge(JudgeConfig())
    if summary["offline_default"] == "heuristic":
        assert judge.version == HeuristicJudge().version
    else:
        assert judge.version == load_model().version


def test_the_shipped_learned_model_is_the_tables_learned_recipe_on_its_data(summary: dict[str, Any]) -> None:
    training = load_model().training
    assert training["recipe"] == summary["learned_option"]
    assert training["data_sha256"] == summary["data_sha256"]
    assert sorted(training["sources"]) == sorted(summary["sources"])
