"""Tests of service/probes/eval_cli.py: `ragmon eval retrieval` on trec_eval's files and on a golden set."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.probes.eval_cli import add_arguments, main
from service.probes.golden import load_golden
from tests.service.probes.trec_eval_oracle import TOLERANCE, our_key, parse_trec_eval_output, trec_eval_dir

REPO = Path(__file__).resolve().parents[3]


def _invoke(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="ragmon eval")
    add_arguments(parser)
    status = main(parser.parse_args(["retrieval", *argv]))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _assert_means_match(overall: dict[str, float], expected: dict[str, float]) -> int:
    compared = 0
    for measure, value in expected.items():
        key = our_key(measure)
        if key is None:
            continue
        name = key[0] if key[1] is None else f"{key[0]}@{key[1]}"
        if name in overall:
            assert overall[name] == pytest.approx(value, abs=TOLERANCE), measure
            compared += 1
    return compared


def test_ragmon_command_prints_trec_eval_means() -> None:
    directory = trec_eval_dir()
    spec = json.loads((directory / "expected_metrics.json").read_text(encoding="utf-8"))["binary"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "eval",
            "retrieval",
            "--qrels",
            str(directory / "qrels.test"),
            "--run",
            str(directory / "results.test"),
            "--k",
            "20,5,10,100",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ks"] == [5, 10, 20, 100]
    assert report["denominators"]["scored"] == 3
    assert set(report["per_query"]) == {"301", "302", "303"}
    # P and ndcg_cut at 5/10/20/100, recall at 5/10/20/100, success at 5/10, map and recip_rank.
    assert _assert_means_match(report["overall"], spec["mean"]) == 4 + 4 + 4 + 2 + 2
    for qid, values in spec["per_query"].items():
        assert _assert_means_match(report["per_query"][qid], values) == 16
        assert report["per_query"][qid]["num_rel"] == values["num_rel"]


def test_graded_judgments_at_relevance_level_two(capsys: pytest.CaptureFixture[str]) -> None:
    directory = trec_eval_dir()
    spec = json.loads((directory / "expected_metrics.json").read_text(encoding="utf-8"))["graded"]
    status, out, _ = _invoke(
        [
            "--qrels",
            str(directory / "qrels.rel_level"),
            "--run",
            str(directory / "results.test"),
            "--k",
            "5,10,20,100,1000",
            "--relevance-level",
            "2",
        ],
        capsys,
    )
    assert status == 0
    report = json.loads(out)
    assert report["relevance_level"] == 2
    assert _assert_means_match(report["overall"], spec["mean"]) == 4 + 5 + 4 + 2 + 2


def test_complete_matches_trec_eval_dash_c(capsys: pytest.CaptureFixture[str]) -> None:
    directory = trec_eval_dir()
    expected = parse_trec_eval_output(directory / "out.test.aqc")
    status, out, _ = _invoke(
        [
            "--qrels",
            str(directory / "qrels.test"),
            "--run",
            str(directory / "results.trunc"),
            "--k",
            "5,10,15,20,30,100",
            "--complete",
        ],
        capsys,
    )
    assert status == 0
    report = json.loads(out)
    assert report["per_query"]["302"]["num_ret"] == 0
    assert _assert_means_match(report["overall"], expected["all"]) >= 6 * 3 + 2
    # Without -c the query the run lacks is reported in its own slice, not scored.
    status, out, _ = _invoke(
        ["--qrels", str(directory / "qrels.test"), "--run", str(directory / "results.trunc")], capsys
    )
    report = json.loads(out)
    assert report["slices"]["not_in_run"] == ["302"]
    assert report["denominators"]["scored"] == 2


def _golden_files(tmp_path: Path) -> tuple[Path, Path]:
    rows: list[dict[str, Any]] = [
        {"question_id": "g1", "question": "?", "category": "billing", "gold_chunks": [{"chunk_id": "c1"}]},
        {
            "question_id": "g2",
            "question": "?",
            "category": "billing",
            "gold_chunks": [{"chunk_id": "c2", "tenants": ["globex"]}],
        },
        {"question_id": "g3", "question": "?", "expected_behaviour": "clarify"},
    ]
    golden = tmp_path / "golden.jsonl"
    golden.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = tmp_path / "run.txt"
    run.write_text(
        "g1 Q0 c9 1 2.0 sys\ng1 Q0 c1 2 1.0 sys\ng2 Q0 c2 1 1.0 sys\ng3 Q0 c1 1 1.0 sys\n", encoding="utf-8"
    )
    return golden, run


def test_golden_set_with_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = _golden_files(tmp_path)
    status, out, _ = _invoke(
        ["--golden", str(golden), "--run", str(run), "--tenant", "acme", "--k", "1,2"], capsys
    )
    assert status == 0
    report = json.loads(out)
    assert report["golden_version"] == load_golden(golden).version
    assert report["tenant"] == "acme"
    assert report["slices"]["scored"] == ["g1"]
    assert report["slices"]["no_eligible_gold"] == ["g2"]
    assert report["slices"]["clarify"] == ["g3"]
    assert report["overall"]["recall@1"] == 0.0
    assert report["overall"]["recall@2"] == 1.0
    assert report["overall"]["reciprocal_rank"] == 0.5
    assert report["per_category"] == [{"category": "billing", "scored": 1, "mean": report["overall"]}]
    # Every gold item is eligible when no tenant is named.
    status, out, _ = _invoke(["--golden", str(golden), "--run", str(run)], capsys)
    assert json.loads(out)["slices"]["scored"] == ["g1", "g2"]


def test_bad_input_exits_2_naming_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = _golden_files(tmp_path)
    duplicated = tmp_path / "dup.txt"
    duplicated.write_text("g1 Q0 c1 1 2.0 s\ng1 Q0 c1 2 1.0 s\n", encoding="utf-8")
    status, out, err = _invoke(["--golden", str(golden), "--run", str(duplicated)], capsys)
    assert status == 2
    assert out == ""
    assert f"{duplicated}:2: duplicate docno 'c1'" in err
    status, _, err = _invoke(["--qrels", str(tmp_path / "missing"), "--run", str(run)], capsys)
    assert status == 2
    assert "missing" in err
    bad_golden = tmp_path / "bad.jsonl"
    bad_golden.write_text('{"question_id": "x"}\n', encoding="utf-8")
    status, _, err = _invoke(["--golden", str(bad_golden), "--run", str(run)], capsys)
    assert status == 2
    assert f"{bad_golden}:1: question: Field required" in err


def test_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = _golden_files(tmp_path)
    status, _, err = _invoke(["--qrels", str(golden), "--run", str(run), "--tenant", "acme"], capsys)
    assert status == 2
    assert "--tenant needs --golden" in err
    for argv in (
        ["--run", str(run)],
        ["--qrels", "q", "--golden", "g", "--run", str(run)],
        ["--golden", str(golden), "--run", str(run), "--k", "0"],
        ["--golden", str(golden), "--run", str(run), "--k", "five"],
        ["--golden", str(golden), "--run", str(run), "--relevance-level", "0"],
    ):
        with pytest.raises(SystemExit) as caught:
            _invoke(argv, capsys)
        assert caught.value.code == 2, argv
    parser = argparse.ArgumentParser(prog="ragmon eval")
    add_arguments(parser)
    with pytest.raises(SystemExit) as caught:
        parser.parse_args([])  # the subcommand is required
    assert caught.value.code == 2
