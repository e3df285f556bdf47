"""HeuristicJudge: claim splitting, support rules, abstentions, determinism, and its accuracy on HaluEval."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from scipy.stats import norm

from service.judge.heuristic import HeuristicJudge, split_claims
from service.judge.judgment import Judge
from service.judge.learned import LearnedJudge
from service.model import Chunk, RagTrace, Retrieval

CONTEXT = [
    "The Hobbit is a children's fantasy novel by J. R. R. Tolkien. It was published in 1937 "
    "by George Allen & Unwin in London. Some of its readers were adults."
]
QUESTION = "Who wrote The Hobbit and when was it published?"


def shared_data() -> Path:
    env = os.environ.get("RAGMON_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".." / "shared" / "data"


def test_claims_are_sentences_and_clauses() -> None:
    answer = "Dr. J. R. R. Tolkien wrote it in 1937. It sold well; critics liked it, but some did not."
    assert split_claims(answer) == [
        "Dr. J. R. R. Tolkien wrote it in 1937",
        "It sold well",
        "critics liked it",
        "some did not",
    ]


@pytest.mark.parametrize(
    "answer",
    ["I don't know.", "The context does not mention the author.", "There is not enough information."],
)
def test_refusals_have_no_claims(answer: str) -> None:
    assert split_claims(answer) == []


@pytest.mark.parametrize(
    ("answer", "failure_mode"),
    [
        ("Tolkien wrote The Hobbit, published in 1937.", "none"),
        ("The Hobbit was published in 1938.", "contradiction"),
        ("The Hobbit is a novel by C. S. Lewis.", "wrong_entity"),
        ("All of its readers were adults.", "overgeneralization"),
        ("The novel won a major prize for its dragon illustrations.", "fabrication"),
    ],
)
def test_support_rules(answer: str, failure_mode: str) -> None:
    verdict = HeuristicJudge().verdict(QUESTION, CONTEXT, answer)
    assert verdict.failure_mode == failure_mode
    assert (verdict.unsupported == []) == (failure_mode == "none")


def test_context_sufficiency_from_question_coverage() -> None:
    judge = HeuristicJudge()
    assert judge.verdict(QUESTION, CONTEXT, "Tolkien.").context_sufficient is True
    assert (
        judge.verdict("What is the boiling point of mercury?", CONTEXT, "Tolkien.").context_sufficient
        is False
    )
    assert judge.verdict(QUESTION, [], "Tolkien.").context_sufficient is False


def test_a_hedge_sentence_is_no_claim_but_the_other_sentences_still_are() -> None:
    """A note that the passage is silent on something used to make the whole answer claim-less."""
    answer = "The Hobbit was published in 1938. Note: the passage does not mention the print run."
    assert split_claims(answer) == ["The Hobbit was published in 1938"]
    verdict = HeuristicJudge().verdict(QUESTION, CONTEXT, answer)
    assert verdict.outcome == "scored" and verdict.unsupported == [0]  # 1938 is not 1937: still caught
    assert split_claims("The context does not say. I cannot answer that.") == []


ARTICLE = [
    "The city council approved a new cycle lane on Harbour Road on Tuesday. Construction starts in May "
    "and is expected to take six weeks. Local shop owners raised concerns about parking during the works."
]


def test_a_summary_or_a_dialogue_turn_of_the_full_source_is_a_generation_failure() -> None:
    """An instruction names no topic the context must cover: unsupported claims are made up."""
    judge = HeuristicJudge()
    summary = (
        "The council approved a cycle lane on Harbour Road. Construction starts in May. "
        "The lane cost twelve million pounds."
    )
    verdict = judge.verdict("Summarize the following article in three sentences.", ARTICLE, summary)
    assert verdict.context_sufficient is True and verdict.unsupported == [2]
    turn = judge.verdict(
        "What do you think about it?", ARTICLE, "Shop owners worried about parking. It opened in 1999."
    )
    assert turn.context_sufficient is True and turn.unsupported == [1]


async def test_citations_of_a_chunk_title_or_number_are_not_claims_to_check() -> None:
    """Apps cite the way the demo does: by the chunk's title (in its metadata) or a [n] marker."""
    chunk = Chunk(
        id="refunds",
        rank=0,
        content="Refunds take 30 days after delivery.",
        metadata={"title": "Refund policy"},
    )
    cited = RagTrace(
        trace_id="ce" * 16,
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query="How long do refunds take?",
        retrieval=Retrieval(chunks=(chunk,)),
    )
    titled = cited.model_copy(
        update={
            "retrieval": Retrieval(
                chunks=(chunk.model_copy(update={"metadata": {"title": "Refunds: policy and timing"}}),)
            )
        }
    )
    for quoted in ('"Refunds: policy and timing"', "\u201cRefunds: policy and timing\u201d"):
        # a title with its own colon: the claim starts after the quoted title, not at its colon
        answer = f"According to {quoted}: Refunds take 30 days after delivery."
        judgment = await HeuristicJudge().judge(titled.model_copy(update={"answer": answer}))
        assert judgment.claims == ("Refunds take 30 days after delivery",), answer
        assert judgment.faithfulness == 1.0, (answer, judgment.claims)
    for answer in (
        "According to \u201cRefund policy\u201d: Refunds take 30 days after delivery.",
        "Refunds take 30 days after delivery [1].",
        "Refunds take 30 days after delivery [refunds].",
    ):
        judgment = await HeuristicJudge().judge(cited.model_copy(update={"answer": answer}))
        assert judgment.faithfulness == 1.0, (answer, judgment.claims)
    wrong = await HeuristicJudge().judge(
        cited.model_copy(update={"answer": "According to Refund policy: 60 days [1]."})
    )
    assert wrong.faithfulness == 0.0


HELP_CENTRE = (
    Chunk(
        id="kb-112",
        rank=0,
        content="Open the sign-in page and choose Forgot password. "
        "We email a reset link that works for 24 hours.",
        metadata={"title": "Troubleshooting: can't sign in"},
    ),
    Chunk(
        id="kb-7",
        rank=1,
        content="Passwords must be at least 12 characters long.",
        metadata={"title": "Account: passwords"},
    ),
)


@pytest.mark.parametrize("judge", [HeuristicJudge(), LearnedJudge()], ids=["heuristic", "learned"])
async def test_a_cited_title_with_its_own_colon_is_matched_against_the_chunk_titles(judge: Judge) -> None:
    """A help-centre title such as "Troubleshooting: can't sign in", cited without quotes (or with
    single quotes, which the apostrophe ends early), is the cited source as a whole: cut at its
    first colon, "can't sign in" stayed in the claim and its negation made a faithful answer a
    contradiction."""
    question = "I forgot my password, what now?"
    base = RagTrace(
        trace_id="cf" * 16,
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=question,
        retrieval=Retrieval(chunks=HELP_CENTRE),
    )
    for answer in (
        "According to Troubleshooting: can't sign in: We email a reset link that works for 24 hours.",
        "According to troubleshooting: can't sign in, we email a reset link that works for 24 hours.",
        "According to 'Troubleshooting: can't sign in': We email a reset link that works for 24 hours.",
        "As described in \u201cTroubleshooting: can't sign in\u201d: We email a reset link that works "
        "for 24 hours.",
        "Open the sign-in page and choose Forgot password. "
        "Per Troubleshooting: can't sign in: we email a reset link that works for 24 hours.",
    ):
        judgment = await judge.judge(base.model_copy(update={"answer": answer}))
        assert judgment.claims[-1].casefold() == "we email a reset link that works for 24 hours", answer
        assert judgment.faithfulness == 1.0, (answer, judgment.claims)
    # the longer of two titles that share a start is the one cited
    judgment = await judge.judge(
        base.model_copy(
            update={
                "answer": "According to Account: passwords: Passwords must be at least 12 characters long."
            }
        )
    )
    assert judgment.claims == ("Passwords must be at least 12 characters long",)
    # matching the title takes nothing from the claim: a wrong number after it is still wrong
    wrong = await judge.judge(
        base.model_copy(
            update={"answer": "According to Troubleshooting: can't sign in: the link works for 48 hours."}
        )
    )
    assert wrong.claims == ("the link works for 48 hours",) and wrong.faithfulness == 0.0


def trace(answer: str | None, chunks: tuple[str | None, ...], query: str = QUESTION) -> RagTrace:
    return RagTrace(
        trace_id="cd" * 16,
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=query,
        retrieval=Retrieval(chunks=tuple(Chunk(id=str(i), rank=i, content=c) for i, c in enumerate(chunks))),
        answer=answer,
    )


async def test_judgments_are_labelled_heuristic_and_deterministic() -> None:
    judge: Judge = HeuristicJudge()
    first = await judge.judge(
        trace("The novel by Tolkien was published in 1937. It was published in Paris.", tuple(CONTEXT))
    )
    second = await judge.judge(
        trace("The novel by Tolkien was published in 1937. It was published in Paris.", tuple(CONTEXT))
    )
    assert first.judge == "heuristic" and first.judge_model is None and first.calls == ()
    assert first.judge_version == judge.version
    assert first.faithfulness == 0.5 and first.diagnosis == "generation_failure"
    assert first.model_dump(exclude={"latency_s", "judged_at"}) == second.model_dump(
        exclude={"latency_s", "judged_at"}
    )


async def test_abstentions_and_missing_inputs() -> None:
    judge = HeuristicJudge()
    assert (await judge.judge(trace("I don't know.", tuple(CONTEXT)))).diagnosis == "unnecessary_abstention"
    off_topic = trace("I don't know.", tuple(CONTEXT), query="What is the boiling point of mercury?")
    assert (await judge.judge(off_topic)).diagnosis == "correct_abstention"
    assert (await judge.judge(trace(None, tuple(CONTEXT)))).failure_reason == "no_answer"
    assert (await judge.judge(trace("Tolkien.", (None,)))).failure_reason == "no_context"


def wilson_lower(k: int, n: int) -> float:
    z = float(norm.ppf(0.975))
    p = k / n
    return float((p + z * z / (2 * n) - z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n))


def test_accuracy_on_halueval_is_well_above_chance() -> None:
    path = shared_data() / "faithfulness" / "halueval_qa_dev.jsonl"
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (set RAGMON_SHARED_DATA)")
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    judge = HeuristicJudge()
    hits = {True: 0, False: 0}
    totals = {True: 0, False: 0}
    for row in rows:
        verdict = judge.verdict(row["question"], row["contexts"], row["answer"])
        label = bool(row["label_faithful"])
        totals[label] += 1
        hits[label] += (not verdict.unsupported) == label
    # Per-class 95 % Wilson lower bounds: both classes clearly better than a coin.
    assert wilson_lower(hits[True], totals[True]) > 0.9
    assert wilson_lower(hits[False], totals[False]) > 0.6


def test_dialogue_chit_chat_is_no_claim_and_tokenized_turns_split_into_sentences() -> None:
    """Wizard-of-Wikipedia style responses (Q² in the dev set): lower-case, " . " between sentences."""
    assert split_claims("yes , she is a great singer . she sang in church as a child .") == [
        "she is a great singer",
        "she sang in church as a child",
    ]
    assert split_claims("i love indian cuisine ! it has a wide variety of regional dishes .") == [
        "it has a wide variety of regional dishes"
    ]
    assert split_claims("i do know that blue is an important color in art .") == [
        "blue is an important color in art"
    ]
    # a longer clause about the speaker still says something about the world
    assert split_claims("i visited manhattan which is the largest borough of manhattan .") == [
        "i visited manhattan which is the largest borough of manhattan"
    ]


def test_word_forms_count_and_a_negated_claim_needs_a_negation_in_its_place() -> None:
    judge = HeuristicJudge()
    context = ["Telenovelas are mostly produced in Latin America. The first one aired in 1951."]
    assert (
        judge.verdict("Where?", context, "telenovelas are produced in latin american countries").unsupported
        == []
    )
    negated = judge.verdict("When?", context, "Telenovelas are not produced in Latin America.")
    assert negated.unsupported == [0] and negated.failure_mode == "contradiction"
