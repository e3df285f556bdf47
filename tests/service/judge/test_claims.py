"""Claim extraction for the offline judges: yes/no and very short answers are judged as the proposition
they assert about their question; refusals and talk between the speakers stay without claims.

The rows are shaped like the labelled sources the judges are measured on (HaluEval QA's comparison
questions, a support bot's policy answers, knowledge-grounded dialogue replies).
"""

from __future__ import annotations

import pytest

from service.judge.claims import answer_claims, split_claims
from service.judge.heuristic import HeuristicJudge
from service.judge.learned import LearnedJudge

VEASEY = (
    "Pamela Renea Veasey (born May 25, 1962) is an American television writer, producer and director. "
    "Jon Jost (born 16 May 1943 in Chicago) is an American independent filmmaker."
)
HOBB = (
    "Robin Hobb is the pen name of Margaret Astrid Lindholm Ogden (born March 5, 1952), an American writer. "
    "Sir Winston Leonard Spencer-Churchill (30 November 1874 - 24 January 1965) was a British statesman, "
    "army officer, and writer."
)
GENERA = (
    "Bunchosia is a genus in the Malpighiaceae, a family of about 75 genera of flowering plants in the order "
    "Malpighiales. Onoclea is a genus of plants in the Onocleaceae family, native to moist habitats in "
    "eastern Asia and eastern North America."
)
REFUNDS = "Refunds are possible within 30 days of delivery. Returned items must be unused."


@pytest.mark.parametrize(
    ("question", "answer", "claim", "denied"),
    [
        (
            "Are Pam Veasey and Jon Jost both American?",
            "yes",
            "Pam Veasey and Jon Jost are both American",
            False,
        ),
        (
            "Are Pam Veasey and Jon Jost both American?",
            "Yes, they are.",
            "Pam Veasey and Jon Jost are both American",
            False,
        ),
        (
            "Are Robin Hobb and Winston Churchill both American writers?",
            "no",
            "Robin Hobb and Winston Churchill are not both American writers",
            True,
        ),
        (
            "Is it true that refunds are possible within 30 days?",
            "Yes.",
            "refunds are possible within 30 days",
            False,
        ),
        ("Can I return an item after 60 days?", "No [1]", "I cannot return an item after 60 days", True),
        ("Do you ship to Canada?", "yep", "you do ship to Canada", False),
        # no subject found with confidence: the question and its answer, as asked
        ("Is the refund window 60 days?", "No.", "is the refund window 60 days: no", True),
        (
            "Does the Pro plan include phone support?",
            "yes",
            "does the Pro plan include phone support: yes",
            False,
        ),
    ],
)
def test_a_bare_yes_or_no_claims_the_questions_proposition(
    question: str, answer: str, claim: str, denied: bool
) -> None:
    found = answer_claims(question, answer)
    assert found.claims == [claim]
    assert found.denied == (frozenset({0}) if denied else frozenset())


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("Is the product waterproof?", "I don't know."),
        ("Is the product waterproof?", "I'm not sure."),
        ("Is the product waterproof?", "The context does not say."),
        ("Do you like Tom Brady?", "yes"),  # about the speakers, not the context
        ("Have you seen any of the films by Chris Renaud ?", "no"),
        ("Are you a fan of the Penguins?", "yeah"),
        ("What is the refund window?", "yes"),  # a yes to no yes/no question answers nothing
        ("Tell me about the plan.", "No."),
    ],
)
def test_refusals_and_non_answers_keep_no_claims(question: str, answer: str) -> None:
    assert answer_claims(question, answer).claims == []


def test_a_short_title_answer_is_its_own_claim() -> None:
    # "My ..." looked like talk about the speaker and was dropped
    question = (
        "Californian rock band Lit recorded A Place in the Sun in 1995, but what's their best known song?"
    )
    assert split_claims("My Own Worst Enemy") == []
    assert answer_claims(question, "My Own Worst Enemy").claims == ["My Own Worst Enemy"]
    assert answer_claims("When was it released?", "1995.").claims == ["1995"]


def test_a_hedge_does_not_drop_the_claim_beside_it() -> None:
    # Q² / BEGIN dialogue replies, tokenized as the sources ship them
    assert split_claims("i ' m not sure but they were founded in munich , bavaria .") == [
        "they were founded in munich , bavaria"
    ]
    assert split_claims("i don't know how heavy those flags are. i was reading that 14 of them are silk") == [
        "i was reading that 14 of them are silk"
    ]
    assert split_claims("i am not sure.") == []
    answer = (
        "I don't know anything about him, but I know that he's a great athlete and a great philanthropist"
    )
    assert split_claims(answer) == ["he's a great athlete and a great philanthropist"]
    assert split_claims("The passage does not mention the price; the plan has 3 tiers.") == [
        "the plan has 3 tiers"
    ]


def test_the_heuristic_judges_a_yes_against_the_context() -> None:
    judge = HeuristicJudge()
    faithful = judge.verdict("Are both Bunchosia and Onoclea genus of plants?", [GENERA], "yes")
    assert faithful.claims == ["both Bunchosia and Onoclea are genus of plants"]
    assert faithful.outcome == "scored" and faithful.unsupported == []
    # a lexical judge reads names as written: "Pam" is not in "Pamela Renea Veasey"
    assert judge.verdict("Are Pam Veasey and Jon Jost both American?", [VEASEY], "yes").unsupported == [0]
    # "yes" to a proposition whose numbers the context does not hold
    made_up = judge.verdict("Is it true that refunds are possible within 60 days?", [REFUNDS], "Yes.")
    assert made_up.outcome == "scored" and made_up.unsupported == [0]
    assert made_up.failure_mode == "contradiction"
    # "yes" about a name the context does not have
    wrong = judge.verdict("Is Jon Jost from Canada?", [VEASEY], "yes")
    assert wrong.unsupported == [0] and wrong.failure_mode == "wrong_entity"


def test_the_heuristic_judges_a_no_as_a_denial() -> None:
    judge = HeuristicJudge()
    # the context says 30 days: "no" to 60 days is what it supports
    denial = judge.verdict("Is the refund window 60 days?", [REFUNDS], "No.")
    assert denial.claims == ["is the refund window 60 days: no"]
    assert denial.outcome == "scored" and denial.unsupported == []
    # the context states the proposition: "no" contradicts it
    stated = judge.verdict("Are refunds possible within 30 days of delivery?", [REFUNDS], "no")
    assert stated.unsupported == [0] and stated.failure_mode == "contradiction"
    # the context is about something else: a "no" it cannot back
    elsewhere = judge.verdict("Is the warranty valid in Norway?", [REFUNDS], "no")
    assert elsewhere.unsupported == [0]


def test_the_learned_judge_scores_yes_no_answers_too() -> None:
    judge = LearnedJudge()
    assert (
        judge.verdict("Are both Bunchosia and Onoclea genus of plants?", [GENERA], "yes").outcome == "scored"
    )
    assert judge.verdict("Is the product waterproof?", [REFUNDS], "I'm not sure.").outcome == "no_claims"
    # judged, not dropped; whether it catches the new number is the model's call (learned/3 does not
    # weigh a new number as the rules do)
    made_up = judge.verdict("Is it true that refunds are possible within 60 days?", [REFUNDS], "Yes.")
    assert made_up.outcome == "scored" and made_up.claims == ["refunds are possible within 60 days"]
