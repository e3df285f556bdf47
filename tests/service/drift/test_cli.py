"""`ragmon drift pin|list|run` through the real CLI (a subprocess) against an embedded SQLite store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.cli import main as cli_main
from service.drift.sample import Observation
from service.drift.store import BucketBatch, DriftStore
from service.store.trace_store import Store

REPO = Path(__file__).resolve().parents[3]
NOW = datetime.now(UTC)
PAST = NOW - timedelta(days=3)


def _observations(n: int, *, seed: int, at: datetime, shift: float) -> list[Observation]:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).standard_normal((4, 16))
    out = []
    for i in range(n):
        new = rng.random() < shift
        topic = 3 if new else int(rng.integers(3))
        vector = centres[topic] + 0.3 * rng.standard_normal(16)
        out.append(
            Observation(
                trace_id=f"{seed:016x}{i:016x}",
                time=at + timedelta(seconds=i),
                query=("refund for my crypto wallet" if new else f"ordinary question {topic}") + f" {i}",
                vector=vector.astype(np.float32),
                top1=float(0.5 if new else 0.8) + 0.05 * float(rng.standard_normal()),
                topk=0.6,
                empty=False,
                hit=f"doc-{topic}",
            )
        )
    return out


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir whose store holds 240 reference-period and 240 shifted recent observations of app `shop`."""
    store = Store(f"sqlite:///{tmp_path / 'ragmon.db'}")
    store.create_schema()
    drift = DriftStore(store.engine)
    drift.create_schema()
    drift.add_observations(
        [
            BucketBatch(
                "default", "shop", "emb@16", PAST, 240, _observations(240, seed=1, at=PAST, shift=0.0)
            ),
            BucketBatch(
                "default",
                "shop",
                "emb@16",
                NOW - timedelta(hours=1),
                240,
                _observations(240, seed=2, at=NOW - timedelta(hours=1), shift=0.4),
            ),
        ]
    )
    store.close()
    return tmp_path


def ragmon(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--data-dir", str(data_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pin_and_run_from_the_command_line(data_dir: Path) -> None:
    start, end = (PAST - timedelta(hours=1)).isoformat(), (PAST + timedelta(hours=2)).isoformat()
    pinned = _json(ragmon(data_dir, "drift", "pin", "--from", start, "--to", end, "--app", "shop"))
    assert [(r["id"], r["n"]) for r in pinned["pinned"]] == [("shop/emb@16/v1", 240)]

    report = _json(ragmon(data_dir, "drift", "run", "--app", "shop", "--json"))
    by_detector = {r["detector"]: r for r in report["results"]}
    assert {
        "query_embedding_mmd",
        "retrieval_top1_score",
        "retrieval_topk_score",
        "retrieval_empty_share",
        "retrieval_hits",
        "embedding_model_change",
    } <= set(by_detector)
    mmd = by_detector["query_embedding_mmd"]
    assert mmd["drifted"] and mmd["alarm"] and mmd["n_window"] == 240
    assert any("crypto" in " ".join(g["examples"]) for g in mmd["explanation"] if g["significant"])
    assert by_detector["retrieval_top1_score"]["drifted"]
    assert not by_detector["embedding_model_change"]["drifted"]
    assert report["without_reference"] == []
    # the plain output says what drifted too: the group that grew, its shares now and before, examples
    plain = ragmon(data_dir, "drift", "run", "--app", "shop")
    assert plain.returncode == 0, plain.stderr
    mmd_line = next(i for i, line in enumerate(plain.stdout.splitlines()) if "query_embedding_mmd" in line)
    below = "\n".join(plain.stdout.splitlines()[mmd_line + 1 : mmd_line + 8])
    assert "% of queries now" in below and "% before" in below and "e.g." in below and "crypto" in below


def in_process(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> tuple[int, str, str]:
    """The same CLI entry point without a new interpreter (each subprocess pays seconds of imports)."""
    code = cli_main([*args, "--data-dir", str(data_dir)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_and_repin_keep_every_version(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start, end = (PAST - timedelta(hours=1)).isoformat(), (PAST + timedelta(hours=2)).isoformat()
    code, _, err = in_process(capsys, data_dir, "drift", "list")
    assert code == 0 and "no references pinned yet" in err
    for _ in range(2):
        assert in_process(capsys, data_dir, "drift", "pin", "--from", start, "--to", end)[0] == 0
    code, out, _ = in_process(capsys, data_dir, "drift", "list")
    assert [r["version"] for r in json.loads(out)] == [2, 1]
    assert in_process(capsys, data_dir, "drift", "run")[0] == 0
    code, out, _ = in_process(capsys, data_dir, "drift", "list", "--runs", "--limit", "100")
    runs = json.loads(out)
    assert {r["detector"] for r in runs} >= {"query_embedding_mmd"}
    assert {r["reference_id"] for r in runs if r["detector"] == "query_embedding_mmd"} == {"shop/emb@16/v2"}


def test_pin_without_a_range_or_release_fails_with_a_message(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = in_process(capsys, data_dir, "drift", "pin", "--from", "7d")
    assert code == 2 and "--from and --to, or --release" in err
    code, _, err = in_process(capsys, data_dir, "drift", "pin", "--from", "yesterday", "--to", "now")
    assert code == 2 and "not a time" in err


@pytest.mark.parametrize(
    ("since", "until"),
    [("0001-01-01", "2026-01-01"), ("99999999d", "now"), ("2026-01-01", "9999-12-31T23:00:00-05:00")],
)
def test_a_time_outside_the_kept_range_is_refused_with_a_message(
    since: str, until: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = in_process(capsys, data_dir, "drift", "pin", "--from", since, "--to", until)
    assert code == 2 and "is outside the range ragmon keeps, 1970-01-01 to 2262-04-11" in err, err
    assert "Traceback" not in err


def test_pinning_an_empty_range_says_when_observations_are_written(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = in_process(capsys, data_dir, "drift", "pin", "--from", "2099-01-01", "--to", "2099-01-02")
    assert code == 1 and "nothing pinned" in err
    assert "drift.flush_s (60 s)" in err and "POST /api/v1/drift/references" in err


def test_run_without_references_says_so(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = in_process(capsys, data_dir, "drift", "run")
    assert code == 0
    assert "no references pinned" in out
    assert "no reference for embedding model emb@16" in out


def test_plain_run_states_the_estimated_power_at_the_windows_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from detectors import HashingEmbedder, embedding_model_key

    embedder = HashingEmbedder()
    builtin = embedding_model_key(embedder.model_name, embedder.dim)
    store = Store(f"sqlite:///{tmp_path / 'ragmon.db'}")
    store.create_schema()
    drift = DriftStore(store.engine)
    drift.create_schema()
    rng = np.random.default_rng(0)
    words = ["card", "transfer", "login", "refund", "limit", "pin", "iban", "fee"]

    def batch(at: datetime, n: int, seed: int) -> BucketBatch:
        texts = [" ".join(rng.choice(words, 3)) + f" {i % 30}" for i in range(n)]
        vectors = embedder.embed(texts)
        return BucketBatch(
            "default",
            "bank",
            builtin,
            at,
            n,
            [
                Observation(
                    trace_id=f"{seed:016x}{i:016x}", time=at + timedelta(seconds=i), query=t, vector=v
                )
                for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
            ],
        )

    drift.add_observations([batch(PAST, 200, 1), batch(NOW - timedelta(hours=2), 120, 2)])
    store.close()
    start, end = (PAST - timedelta(hours=1)).isoformat(), (PAST + timedelta(hours=1)).isoformat()
    code, out, err = in_process(capsys, tmp_path, "drift", "pin", "--from", start, "--to", end)
    assert code == 0, err
    assert json.loads(out)["pinned"][0]["embedder"].startswith("ragmon-tfidf-v1-")
    code, out, err = in_process(capsys, tmp_path, "drift", "run", "--app", "bank")
    assert code == 0, err
    lines = out.splitlines()
    query = next(i for i, line in enumerate(lines) if "query_text_knn" in line)
    assert "n=200/120" in lines[query]
    power = next(line for line in lines[query + 1 : query + 4] if "power" in line)
    assert "at n=120" in power and "estimated" in power and "absent from the reference" in power
