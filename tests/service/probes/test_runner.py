"""Tests of service/probes/runner.py and the `ragmon probe` command's sending side, against a real app."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main as ragmon
from service.probes.cli import parse_every
from service.probes.golden import parse_golden
from service.probes.runner import ProbeRunner, new_run_id
from tests.service.probes.probe_app import ProbeApp, probe_app

ROWS = [
    '{"question_id": "q1", "question": "How long do refunds take?", "gold_chunks": [{"chunk_id": "c1"}]}',
    '{"question_id": "q2", "question": "Can I change my email?", "gold_chunks": [{"chunk_id": "c2"}]}',
    '{"question_id": "q3", "question": "Is there a phone line?", "expected_behaviour": "no_answer"}',
]


async def test_every_question_is_sent_once_in_the_documented_shape() -> None:
    golden = parse_golden(ROWS)
    with probe_app(ProbeApp(corpus={}, fail_for={"Can I change my email?"})) as app:
        runner = ProbeRunner(golden, app.url, headers={"Authorization": "Bearer app-key"}, concurrency=2)
        sends = await runner.send("run-7")
    assert [s.question_id for s in sends] == ["q1", "q2", "q3"]
    assert [s.ok for s in sends] == [True, False, True]
    assert sends[1].status == 500 and sends[1].error == "HTTP 500"
    assert len(app.requests) == 3  # a failed question is not retried inside the run
    by_question = {r["headers"]["x-ragmon-probe-question"]: r for r in app.requests}
    assert set(by_question) == {"q1", "q2", "q3"}
    request = by_question["q1"]
    assert request["body"] == {
        "question": "How long do refunds take?",
        "probe": {"run_id": "run-7", "question_id": "q1"},
    }
    assert request["headers"]["x-ragmon-probe-run"] == "run-7"
    assert request["headers"]["authorization"] == "Bearer app-key"


async def test_an_unreachable_app_is_reported_per_question() -> None:
    sends = await ProbeRunner(parse_golden(ROWS[:1]), "http://127.0.0.1:9/ask", timeout_s=2).send("r")
    assert not sends[0].ok and sends[0].status is None and sends[0].error


def test_arguments_are_checked() -> None:
    golden = parse_golden(ROWS)
    for bad in (
        {"endpoint": "ftp://x"},
        {"endpoint": "http://x", "timeout_s": 0},
        {"endpoint": "http://x", "concurrency": 0},
    ):
        with pytest.raises(ValueError):
            ProbeRunner(golden, **bad)  # type: ignore[arg-type]
    assert parse_every("90s") == 90 and parse_every("1h") == 3600 and parse_every("1.5d") == 129600
    for bad_every in ("", "1x", "0m", "h"):
        with pytest.raises(ValueError):
            parse_every(bad_every)
    first, second = new_run_id(), new_run_id()
    assert first != second and first.startswith("probe-")


def test_the_command_sends_on_a_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "support.jsonl"
    path.write_text("\n".join(ROWS) + "\n")
    with probe_app(ProbeApp(corpus={})) as app:
        code = ragmon(
            [
                "probe",
                "--golden",
                str(path),
                "--endpoint",
                app.url,
                "--every",
                "1s",
                "--runs",
                "2",
                "--header",
                "x-app-key: secret",
            ]
        )
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 2
    run_ids = {r["headers"]["x-ragmon-probe-run"] for r in app.requests}
    assert len(run_ids) == 2 and len(app.requests) == 6
    assert all(r["headers"]["x-app-key"] == "secret" for r in app.requests)


def test_the_command_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "q1"}\n')
    assert ragmon(["probe", "--golden", str(bad), "--endpoint", "http://127.0.0.1:9/"]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert ragmon(["probe", "--endpoint", "http://127.0.0.1:9/"]) == 2
    good = tmp_path / "good.jsonl"
    good.write_text(ROWS[0] + "\n")
    assert (
        ragmon(["probe", "--golden", str(good), "--endpoint", "http://x/", "--every", "1h", "--run-id", "a"])
        == 2
    )
    assert ragmon(["probe", "--golden", str(good), "--endpoint", "http://127.0.0.1:9/"]) == 1
