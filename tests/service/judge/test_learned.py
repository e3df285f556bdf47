"""LearnedJudge: its model file, features and verdicts, and the training script's refusal of the test half."""

from __future__ import annotations

import importlib.util
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from pydantic import ValidationError

from service.config import JudgeConfig
from service.judge.build import build_judge
from service.judge.features import FEATURE_NAMES, answer_features
from service.judge.learned import MODEL_FEATURES, LearnedJudge, LearnedModel, load_model
from service.model import Chunk, RagTrace, Retrieval

ROOT = Path(__file__).resolve().parents[3]
MODEL_PATH = ROOT / "service" / "judge" / "learned_judge.json"
CONTEXT = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. "
    "It was the entrance arch to the 1889 World's Fair.",
    "The tower is 330 metres tall, about the same height as an 81-storey building. It was the tallest "
    "man-made structure in the world until the Chrysler Building in New York City was finished in 1930.",
]
QUESTION = "Who built the Eiffel Tower and how tall is it?"
SUPPORTED = (
    "The Eiffel Tower was built by the company of Gustave Eiffel from 1887 to 1889. It is 330 metres tall."
)
UNSUPPORTED = (
    "The Eiffel Tower was designed by Antoni Gaudi for the Barcelona Olympics of 1992 and is made of "
    "reinforced glass panels imported from Venice."
)


def train_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "train_learned", ROOT / "bench" / "judge" / "train_learned.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_model_loads_and_says_how_it_was_made() -> None:
    model = load_model()
    assert re.fullmatch(r"learned/\d+", model.version)
    assert tuple(model.features) == MODEL_FEATURES
    assert model.stumps
    assert re.fullmatch(r"[0-9a-f]{64}", model.training["data_sha256"])
    assert model.training["command"].startswith("python bench/judge/loso.py")
    assert "all nine sources" in model.training["data"]
    assert MODEL_PATH.stat().st_size < 16_000  # a small data file, not a blob
    assert LearnedJudge().version == model.version


def test_a_model_for_other_features_is_refused() -> None:
    raw = json.loads(MODEL_PATH.read_text("utf-8"))
    raw["features"] = raw["features"][:-1]
    with pytest.raises(ValidationError, match="retrain"):
        LearnedModel.model_validate(raw)


def test_features_are_deterministic_and_one_row_per_claim() -> None:
    first = answer_features(QUESTION, CONTEXT, SUPPORTED)
    second = answer_features(QUESTION, CONTEXT, SUPPORTED)
    assert first.claims == second.claims
    assert first.matrix.shape == (2, len(FEATURE_NAMES))
    assert np.array_equal(first.matrix, second.matrix)
    assert np.isfinite(first.matrix).all()


def test_features_see_what_is_new() -> None:
    names = list(FEATURE_NAMES)
    good = answer_features(QUESTION, CONTEXT, SUPPORTED).matrix
    bad = answer_features(QUESTION, CONTEXT, UNSUPPORTED).matrix
    assert good[:, names.index("new_numbers")].tolist() == [0.0, 0.0]
    assert bad[0, names.index("new_numbers")] == 1.0  # 1992
    assert bad[0, names.index("new_capitalised_share")] > 0.5  # Antoni Gaudi, Barcelona, Olympics, Venice
    assert good[:, names.index("content_share")].min() > bad[:, names.index("content_share")].max()


def test_a_supported_answer_passes_and_an_unsupported_one_fails() -> None:
    judge = LearnedJudge()
    good = judge.verdict(QUESTION, CONTEXT, SUPPORTED)
    assert good.unsupported == [] and good.supported == [0, 1] and good.failure_mode == "none"
    bad = judge.verdict(QUESTION, CONTEXT, UNSUPPORTED)
    assert bad.unsupported == [0]
    assert bad.failure_mode == "wrong_entity"  # the heuristic flags the same claim for its names


@pytest.mark.parametrize(
    "answer",
    [
        SUPPORTED,
        UNSUPPORTED,
        f"{SUPPORTED} It was later painted gold by Napoleon.",
        "It is 330 metres tall; it was the tallest structure until 1930.",
    ],
)
def test_judged_faithful_exactly_when_no_claim_is_unsupported(answer: str) -> None:
    judge = LearnedJudge()
    score = judge.score(QUESTION, CONTEXT, answer)
    verdict = judge.verdict(QUESTION, CONTEXT, answer)
    assert score is not None
    assert (verdict.unsupported == []) == (score >= judge.model.threshold)
    assert sorted(verdict.supported + verdict.unsupported) == list(range(len(verdict.claims)))


def test_a_refusal_has_no_claims() -> None:
    verdict = LearnedJudge().verdict(QUESTION, CONTEXT, "The context does not mention who painted it.")
    assert verdict.outcome == "no_claims" and verdict.claims == []


async def test_judging_a_trace_records_the_learned_version() -> None:
    trace = RagTrace(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=QUESTION,
        answer=UNSUPPORTED,
        retrieval=Retrieval(
            chunks=tuple(Chunk(id=f"c{i}", rank=i, content=c) for i, c in enumerate(CONTEXT))
        ),
    )
    judgment = await LearnedJudge().judge(trace)
    assert judgment.judge == "heuristic"
    assert judgment.judge_version == load_model().version
    assert judgment.faithfulness == 0.0


def test_training_refuses_the_test_half(tmp_path: Path) -> None:
    script = train_script()
    rows = [{"id": "a", "split": "tune"}, {"id": "b", "split": "test"}]
    assert script.training_rows(rows) == [rows[0]]
    for split in ("test", "all"):
        with pytest.raises(script.RefusedSplit):
            script.training_rows(rows, split)
    data = tmp_path / "devset.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    out = tmp_path / "model.json"
    assert script.main(["--data", str(data), "--out", str(out), "--split", "test"]) == 2
    assert not out.exists()


def test_the_training_data_hash_is_stable_and_order_free() -> None:
    script = train_script()
    rows = [{"id": "b", "split": "tune", "answer": "x"}, {"id": "a", "split": "tune", "answer": "y"}]
    assert script.data_hash(rows) == script.data_hash(list(reversed(rows)))
    assert script.data_hash(rows) != script.data_hash([rows[0]])


def test_the_offline_setting_chooses_the_learned_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert build_judge(JudgeConfig(offline="learned")).version == load_model().version
    # the default again since the leave-one-source-out table (test_default_judge.py)
    assert build_judge(JudgeConfig()).version.startswith("heuristic/")


@pytest.mark.parametrize(
    "made_up",
    [
        "It was discontinued last year and replaced by the premium option.",
        "Only administrators can visit it, from the legacy console.",
    ],
)
def test_a_made_up_sentence_among_supported_ones_fails_the_answer(made_up: str) -> None:
    """The veto stump: a claim with under half its words in the context is unsupported, however well
    the rest is supported (the learned stumps alone passed these, as they passed 4 of the demo's 53
    planted sentences)."""
    model = load_model()
    assert model.stumps[-1].left == -100.0  # the set stump, last in the file
    verdict = LearnedJudge(model).verdict(QUESTION, CONTEXT, f"{SUPPORTED} {made_up}")
    assert verdict.claims[-1] == made_up.rstrip(".") and verdict.unsupported == [2]
    without = model.model_copy(update={"stumps": model.stumps[:-1]})
    assert LearnedJudge(without).verdict(QUESTION, CONTEXT, f"{SUPPORTED} {made_up}").unsupported == []
