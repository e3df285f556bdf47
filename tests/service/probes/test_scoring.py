"""Tests of service/probes/scoring.py: scoring and slices, diagnosis, paired bootstrap; the live probe path.

The live test runs a real ragmon and a real app whose relevance filter
silently drops the gold chunks of one category in the second run, and drives
everything through `ragmon golden load`, the probes API, `ragmon probe`,
`ragmon probe score` and `ragmon probe pin`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from service.cli import main as ragmon
from service.judge.correctness import HeuristicCorrectness
from service.probes.golden import parse_golden
from service.probes.scoring import compare_runs, diagnose, score_run
from tests.fake_openai import FakeOpenAI, Reply
from tests.live_server import live_server
from tests.service.probes.probe_app import ProbeApp, probe_app

REPO = Path(__file__).resolve().parents[3]
PROMTOOL = shutil.which("promtool")


def _row(qid: str, question: str, **fields: Any) -> str:
    return json.dumps({"question_id": qid, "question": question, **fields})


def _record(
    qid: str,
    ranking: list[str],
    *,
    answer: str = "",
    excluded: list[str] | None = None,
    logged: bool = True,
    reranked: list[str] | None = None,
) -> dict[str, Any]:
    context: dict[str, Any] = {"filter": "f" if logged else None, "excluded_ids": excluded or []}
    if reranked is not None:
        context["reranker_output"] = [{"id": c} for c in reranked]
    return {
        "trace_id": uuid.uuid4().hex,
        "chunk_ids": ranking,
        "answer": answer,
        "flags": {"probe_question_id": qid},
        "context": context,
    }


GOLDEN = parse_golden(
    [
        _row(
            "a1",
            "refund time?",
            gold_chunks=[{"chunk_id": "g1", "relevance": 2}],
            category="billing",
            expected_facts=["refunds take 5 days"],
        ),
        _row(
            "a2",
            "card?",
            gold_chunks=[{"chunk_id": "g2"}],
            category="billing",
            expected_facts=["original card"],
        ),
        _row(
            "a3",
            "email?",
            gold_chunks=[{"chunk_id": "g3"}],
            category="account",
            expected_facts=["settings page"],
        ),
        _row("c1", "which plan?", expected_behaviour="clarify", category="account"),
        _row("t1", "secret?", gold_chunks=[{"chunk_id": "g9", "tenants": ["other"]}], category="account"),
        _row("n1", "missing?", gold_chunks=[{"chunk_id": "g7"}], category="account"),
        _row("d1", "dup?", gold_chunks=[{"chunk_id": "g8"}], category="account"),
    ]
)


async def _score(records: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    return await score_run(
        "run", "acme", GOLDEN, records, ks=(1, 3), correctness=HeuristicCorrectness(), **kwargs
    )


async def test_every_question_lands_in_one_slice_and_only_scored_ones_count() -> None:
    records = [
        _record("a1", ["x", "g1"], answer="Refunds take 5 days.", excluded=[]),
        _record("a2", ["x", "y"], answer="No idea.", excluded=["g2"]),
        _record("a3", ["g3"], answer="Use the settings page.", logged=False),
        _record("c1", ["x"]),
        _record("t1", ["g9"]),
        _record("d1", ["g8", "g8"]),
        _record("zz", ["x"]),
        {**_record("a1", ["x"]), "flags": {}},  # untagged: counted, not scored
    ]
    score = await _score(records, faithfulness={records[0]["trace_id"]: 1.0})
    slices = score["slices"]
    assert slices["scored"] == ["a1", "a2", "a3"]
    assert slices["clarify"] == ["c1"] and slices["no_eligible_gold"] == ["t1"]
    assert slices["not_in_run"] == ["n1"] and slices["duplicate_ids"] == ["d1"]
    assert slices["not_in_gold"] == ["zz"]
    every = [q for ids in slices.values() for q in ids if q != "zz"]
    assert sorted(every) == sorted(GOLDEN.questions)  # exactly one slice each
    assert score["traces"] == {"matched": 7, "untagged": 1, "superseded": 0}
    # means over the scored slice only: t1, n1 and d1 are never a zero recall
    assert score["overall"]["recall@3"] == pytest.approx((1 + 0 + 1) / 3)
    assert score["overall"]["reciprocal_rank"] == pytest.approx((0.5 + 0 + 1) / 3)
    billing = next(c for c in score["per_category"] if c["category"] == "billing")
    assert billing["scored"] == 2 and billing["mean"]["recall@3"] == pytest.approx(0.5)
    # false exclusion over questions that logged a filter (a1, a2), against their eligible gold
    assert score["filter_false_exclusion"] == {
        "rate": 0.5,
        "numerator": 1,
        "denominator": 2,
        "questions": ["a2"],
    }
    rows = score["per_question"]
    assert rows["a1"]["diagnosis"] == "success"
    assert rows["a2"]["diagnosis"] == "retrieval_failure"
    assert rows["a3"]["diagnosis"] == "undetermined"  # correct and gold hit, faithfulness not judged yet
    assert rows["t1"].get("recall@3") is None and rows["t1"]["slice"] == "no_eligible_gold"
    assert score["correctness"]["judge"] == "heuristic" and score["correctness"]["correct"] == 2


async def test_the_context_is_the_reranked_list_and_the_last_trace_wins() -> None:
    records = [
        _record("a1", ["g1", "x"]),
        _record("a1", ["x", "y", "g1"], reranked=["y", "g1"]),
    ]
    score = await _score(records)
    assert score["traces"]["superseded"] == 1
    assert score["per_question"]["a1"]["reciprocal_rank"] == 0.5


async def test_correctness_is_reused_for_the_same_trace_and_judge() -> None:
    record = _record("a1", ["g1"], answer="Refunds take 5 days.")
    first = await _score([record])
    kept = first["per_question"]["a1"]["correctness"]
    forged = {**kept, "found": [], "missing": [0]}
    again = await _score([record], reuse={record["trace_id"]: forged})
    assert again["per_question"]["a1"]["correct"] == 0.0  # the stored result was used, no new check
    other_judge = await _score([record], reuse={record["trace_id"]: {**forged, "judge_version": "other"}})
    assert other_judge["per_question"]["a1"]["correct"] == 1.0


@pytest.mark.parametrize(
    ("hit", "correct", "supported", "expected"),
    [
        (True, True, True, "success"),
        (True, True, False, "unsupported_correct"),
        (False, True, True, "unsupported_correct"),
        (False, True, None, "unsupported_correct"),
        (True, True, None, "undetermined"),
        (False, False, True, "retrieval_failure"),
        (True, False, None, "generation_failure"),
        (None, False, None, "undetermined"),
        (True, None, True, "undetermined"),
    ],
)
def test_diagnosis_table(
    hit: bool | None, correct: bool | None, supported: bool | None, expected: str
) -> None:
    assert diagnose(hit, correct, supported) == expected


def _run(values: Mapping[str, float], metric: str = "recall@5") -> dict[str, Any]:
    return {"ks": [5], "per_question": {q: {metric: v} for q, v in values.items()}}


def test_comparison_is_paired_and_lists_who_moved() -> None:
    old = _run({"q1": 1.0, "q2": 1.0, "q3": 0.5, "q4": 0.0, "gone": 1.0})
    new = _run({"q1": 1.0, "q2": 0.0, "q3": 1.0, "q4": 0.0, "new": 0.0})
    result = compare_runs(new, old, metrics=["recall@5"], resamples=500, seed=3)
    entry = result["metrics"]["recall@5"]
    assert entry["pairs"] == 4 and entry["delta"] == pytest.approx(-0.125)
    assert entry["worse"] == ["q2"] and entry["better"] == ["q3"]
    assert entry["lower"] <= entry["delta"] <= entry["upper"]
    assert result["bootstrap"]["resamples"] == 500
    assert compare_runs(new, old, metrics=["recall@5"], resamples=500, seed=3) == result  # seeded
    same = compare_runs(old, old, metrics=["recall@5"])["metrics"]["recall@5"]
    assert (same["delta"], same["lower"], same["upper"], same["significant"]) == (0.0, 0.0, 0.0, False)
    with pytest.raises(ValueError):
        compare_runs(new, old, confidence=1.0)


def test_bootstrap_interval_covers_the_true_delta_at_its_level() -> None:
    # 200 seeds, 40 paired questions, true mean delta -0.1: a 95% interval must cover it in
    # about 95% of runs (binomial 99.9% band for n=200 around 0.95 with slack for the percentile
    # bootstrap's known undercoverage at n=40: [0.86, 0.995]).
    rng = np.random.default_rng(2024)
    covered = excluded_zero = 0
    trials = 200
    for seed in range(trials):
        base = rng.uniform(0.3, 0.9, size=40)
        new = np.clip(base - 0.1 + rng.normal(0, 0.15, size=40), -1, 2)
        old_run = _run({f"q{i}": float(v) for i, v in enumerate(base)})
        new_run = _run({f"q{i}": float(v) for i, v in enumerate(new)})
        entry = compare_runs(new_run, old_run, metrics=["recall@5"], resamples=400, seed=seed)["metrics"][
            "recall@5"
        ]
        true_delta = float(np.mean(new - base))  # the sample's own mean shift is the target of the paired CI
        population = -0.1
        covered += entry["lower"] <= population <= entry["upper"]
        excluded_zero += entry["significant"]
        assert entry["delta"] == pytest.approx(true_delta)
    assert 0.86 <= covered / trials <= 0.995
    assert excluded_zero / trials >= 0.95  # a 0.1 drop over 40 questions is detected


def test_bootstrap_false_alarm_rate_under_no_change() -> None:
    rng = np.random.default_rng(7)
    alarms = 0
    trials = 200
    for seed in range(trials):
        base = rng.uniform(0, 1, size=30)
        new = base + rng.normal(0, 0.1, size=30)
        entry = compare_runs(
            _run({f"q{i}": float(v) for i, v in enumerate(new)}),
            _run({f"q{i}": float(v) for i, v in enumerate(base)}),
            metrics=["recall@5"],
            resamples=400,
            seed=seed,
        )["metrics"]["recall@5"]
        alarms += entry["significant"]
    # nominal 5%; binomial 99.9% band for n=200 plus the percentile bootstrap's slack: at most 14%
    assert alarms / trials <= 0.14


# the live path


CATEGORIES = {"billing": 6, "account": 6}


def _golden_rows() -> tuple[list[str], dict[str, tuple[str, str]]]:
    rows, corpus = [], {}
    for category, n in CATEGORIES.items():
        for i in range(n):
            qid, question = f"{category}-{i}", f"What is the {category} rule number {i}?"
            fact = f"The {category} rule {i} is {100 + i} days"
            corpus[question] = (f"{qid}-gold", fact)
            rows.append(
                _row(
                    qid,
                    question,
                    gold_chunks=[{"chunk_id": f"{qid}-gold"}],
                    category=category,
                    expected_facts=[fact],
                )
            )
    rows.append(_row("clarify-0", "Which plan?", expected_behaviour="clarify", category="account"))
    rows.append(
        _row(
            "private-0",
            "What is the private rule?",
            gold_chunks=[{"chunk_id": "p-gold"}],
            tenants=["someone-else"],
            category="account",
        )
    )
    corpus["What is the private rule?"] = ("p-gold", "The private rule is secret")
    return rows, corpus


def _metrics(text: str, prefix: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix)
    ]


def _promtool_fires(tmp_path: Path, series: list[tuple[str, dict[str, str], float]], alert: str) -> str:
    """promtool on the shipped rules with the live gauges as input: its output when `alert` fires, else ""."""
    lines = []
    for name, labels, value in series:
        rendered = ",".join(f'{k}="{v}"' for k, v in {"job": "ragmon", "instance": "a:1", **labels}.items())
        lines.append({"series": f"{name}{{{rendered}}}", "values": f"{value!r}x30"})
    case = {
        "rule_files": [str(REPO / "dashboards" / "rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": lines,
                "alert_rule_test": [{"eval_time": "20m", "alertname": alert, "exp_alerts": []}],
            }
        ],
    }
    path = tmp_path / f"{alert}.yaml"
    path.write_text(yaml.safe_dump(case))
    out = subprocess.run([str(PROMTOOL), "test", "rules", str(path)], capture_output=True, text=True)
    # expecting no alert: a failure that names the alert means it fired
    return out.stdout + out.stderr if out.returncode != 0 else ""


def test_a_filter_that_drops_one_category_is_caught_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, corpus = _golden_rows()
    golden_file = tmp_path / "support.jsonl"
    golden_file.write_text("\n".join(rows) + "\n")
    settings = {"assembler": {"grace_s": 0.05}, "judging": {"poll_s": 0.05}}
    with (
        live_server(tmp_path / "ragmon", **settings) as server,
        probe_app(ProbeApp(corpus=corpus, ragmon_url=server.url)) as app,
    ):
        base = ["--ragmon", server.url]
        assert ragmon(["golden", "load", str(golden_file), *base]) == 0
        loaded = json.loads(capsys.readouterr().out)
        assert loaded["name"] == "support" and loaded["questions"] == 14 and loaded["new"]

        def send_and_score(run_id: str) -> dict[str, Any]:
            with server.client() as client:
                client.post(
                    "/api/v1/probes/runs", json={"golden": "support", "run_id": run_id}
                ).raise_for_status()
            assert (
                ragmon(["probe", "--golden", str(golden_file), "--endpoint", app.url, "--run-id", run_id])
                == 0
            )
            server.flush()
            capsys.readouterr()
            assert ragmon(["probe", "score", run_id, *base]) == 0
            capsys.readouterr()
            with server.client() as client:
                return dict(client.get(f"/api/v1/probes/runs/{run_id}").json()["result"])

        good = send_and_score("run-good")
        assert good["denominators"]["scored"] == 12
        assert good["slices"]["clarify"] == ["clarify-0"]
        assert good["slices"]["no_eligible_gold"] == ["private-0"]  # never a zero recall
        assert good["overall"]["recall@10"] == 1.0
        assert good["filter_false_exclusion"]["rate"] == 0.0
        assert good["correctness"]["rate"] == 1.0
        assert ragmon(["probe", "pin", "run-good", *base]) == 0

        app.drop_gold_for = {q for q, (gold, _) in corpus.items() if gold.startswith("billing")}
        bad = send_and_score("run-bad")
        billing = next(c for c in bad["per_category"] if c["category"] == "billing")
        account = next(c for c in bad["per_category"] if c["category"] == "account")
        assert billing["mean"]["recall@10"] == 0.0 and account["mean"]["recall@10"] == 1.0
        assert bad["filter_false_exclusion"]["rate"] == pytest.approx(6 / 12)
        assert sorted(bad["filter_false_exclusion"]["questions"]) == sorted(f"billing-{i}" for i in range(6))
        assert bad["diagnoses"]["retrieval_failure"] == 6

        with server.client() as client:
            comparison = client.get(
                "/api/v1/probes/runs/run-bad/compare", params={"against": "baseline"}
            ).json()
            previous = client.get(
                "/api/v1/probes/runs/run-bad/compare", params={"against": "previous"}
            ).json()
            listed = client.get("/api/v1/probes/runs", params={"golden": "support"}).json()["items"]
            exposition = client.get("/metrics").text
        recall = comparison["metrics"]["recall@10"]
        assert comparison["against"] == "run-good" and previous["against"] == "run-good"
        assert sorted(recall["worse"]) == sorted(f"billing-{i}" for i in range(6)) and recall["better"] == []
        assert sorted(comparison["worse"]) == sorted(f"billing-{i}" for i in range(6))
        assert recall["delta"] == pytest.approx(-0.5) and recall["upper"] < 0 and recall["significant"]
        assert [r["run_id"] for r in listed] == ["run-bad", "run-good"]

        assert server.metric("ragmon_probe_recall_ratio", golden="support", k="10", category="billing") == 0.0
        assert server.metric("ragmon_probe_recall_ratio", golden="support", k="10", category="all") == 0.5
        assert server.metric("ragmon_probe_filter_false_exclusion_ratio", golden="support") == 0.5
        assert server.metric("ragmon_probe_questions", golden="support", slice="no_eligible_gold") == 1
        assert server.metric("ragmon_probe_recall_delta_ratio", golden="support", k="10") == pytest.approx(
            -0.5
        )
        assert server.metric("ragmon_probe_recall_delta_upper_ratio", golden="support", k="10") < 0

        if PROMTOOL is not None:
            probe_series = _metrics(exposition, "ragmon_probe_")
            for alert in ("RagmonProbeRecallDropped", "RagmonProbeFilterFalseExclusionHigh"):
                output = _promtool_fires(tmp_path, probe_series, alert)
                assert alert in output and "got:" in output, output

    # a restarted ragmon publishes the newest scored run again, deltas included
    with live_server(tmp_path / "ragmon", **settings) as again:
        assert again.metric("ragmon_probe_recall_ratio", golden="support", k="10", category="all") == 0.5
        assert again.metric("ragmon_probe_recall_delta_ratio", golden="support", k="10") == pytest.approx(
            -0.5
        )


def test_unregistered_runs_unknown_runs_and_llm_correctness(tmp_path: Path) -> None:
    rows, corpus = _golden_rows()
    fact_reply = Reply(
        content=json.dumps({"found": [0], "missing": [], "contradicted": [], "rationale": "ok"})
    )
    with FakeOpenAI() as fake:
        fake.set_default(fact_reply)
        settings = {
            "judging": {"enabled": False},
            "judge": {"base_url": fake.base_url, "model": "fake-model", "max_attempts": 1},
        }
        with (
            live_server(tmp_path, **settings) as server,
            probe_app(ProbeApp(corpus=corpus, ragmon_url=server.url)) as app,
            server.client() as client,
        ):
            loaded = client.post("/api/v1/probes/golden", json={"name": "support", "jsonl": "\n".join(rows)})
            assert loaded.status_code == 200
            bad = client.post("/api/v1/probes/golden", json={"name": "x", "jsonl": '{"question_id": 1}'})
            assert bad.status_code == 422
            assert client.post("/api/v1/probes/runs/nope/score").status_code == 404
            assert (
                client.post("/api/v1/probes/runs/nope/score", json={"golden": "support"}).status_code == 404
            )
            assert client.post("/api/v1/probes/runs", json={"golden": "unknown"}).status_code == 404
            assert client.post("/api/v1/probes/baseline", json={"run_id": "nope"}).status_code == 422
            assert (
                ragmon(["probe", "--golden", _write(tmp_path, rows), "--endpoint", app.url, "--run-id", "r1"])
                == 0
            )
            server.flush()
            scored = client.post("/api/v1/probes/runs/r1/score", json={"golden": "support"}).json()
            score = scored["score"]
            assert score["correctness"]["judge"] == "llm" and score["correctness"]["rate"] == 1.0
            assert scored["against_previous"] is None and scored["against_baseline"] is None
            calls = len(fake.requests())
            assert calls == 12  # one per answered question with facts
            client.post("/api/v1/probes/runs/r1/score").raise_for_status()  # rescoring reuses the verdicts
            assert len(fake.requests()) == calls
            assert client.get("/api/v1/probes/baseline", params={"golden": "support"}).status_code == 404


def _write(tmp_path: Path, rows: list[str]) -> str:
    path = tmp_path / "golden.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return str(path)
