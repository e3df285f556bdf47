"""What an answer claims: its sentences and clauses, or, for a yes/no or very short answer, the
proposition it asserts about its question. The offline judges (heuristic and learned) read answers
through `answer_claims`, so both judge the same claims.

* `split_claims`: the answer cut into sentences, and sentences into clauses at semicolons and
  contrastive conjunctions. A clause that only hedges or refuses ("I don't know", "the passage does
  not mention ...") is no claim, the other clauses of its sentence still are ("I don't know him,
  but he is a great athlete" claims the second half). Citation markers (`[1]`, `[doc-3]`) and an
  opening "According to <source>:" are cut (a source that is one of the chunks' titles as a whole,
  colons in it included), and so is conversation about the speaker ("yes ,", "i love it").
* `answer_claims`: what `split_claims` finds, except where the answer is a bare yes or no to a
  yes/no question ("Are X and Y both American?" / "yes"): then the claim is the question's
  proposition ("X and Y are both American"), or its denial for a no ("X and Y are not both
  American", marked `denied`, since the context is to be read for that proposition, not for a
  negation in it). "Yes" answers "Is X true?" with X, so it is judged, not dropped. A very short
  answer that is a name or a number ("My Own Worst Enemy", "1995") is its own claim even where it
  looks like talk about the speaker. A yes/no about the people talking ("Do you like dogs?" /
  "yes"), a reply to no yes/no question, and a refusal or non-answer ("I'm not sure") stay without
  claims.

Deterministic and pure: the same (question, answer, titles) always gives the same claims.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from service.judge.text import STOPWORDS, content, sentences, words

__all__ = ["AnswerClaims", "answer_claims", "split_claims"]

_REFUSAL = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|cannot|can't)\s+(?:know|answer|say|find)"
    r"|(?:cannot|can't|unable\s+to)\s+(?:answer|determine|find|tell)"
    r"|not\s+(?:enough|sufficient)\s+(?:information|context)"
    r"|no\s+(?:relevant\s+)?information"
    r"|(?:i\s*['’]?\s*m|i\s+am)\s+not\s+(?:sure|certain)|(?:i\s+have\s+)?no\s+idea"
    r"|(?:context|passages?|documents?)\s+(?:does|do)\s+not\s+(?:say|mention|contain|provide))",
    re.IGNORECASE,
)
_CITATION = re.compile(r"\s*\[(?:\d+(?:\s*[,-]\s*\d+)*|[A-Za-z][\w.-]{0,40})\]")
_CITING = r"^\s*(?:according\s+to|as\s+(?:stated|described)\s+in|per)\s+"
# A source not among the chunk titles: it may be quoted, and a quoted title may hold its own colon
# ("Account: two-factor login"); unquoted, it ends at the first colon or comma.
_ACCORDING_TO = re.compile(
    _CITING + r"(?:\"[^\"]{1,120}\"|\u201c[^\u201d]{1,120}\u201d|'[^']{1,120}'|[^:,]{1,120})\s*[:,]\s*",
    re.IGNORECASE,
)
# where a hedge ends and a claim begins inside one clause: "i'm not sure but they were founded in
# 1971", "i don't know how heavy they are. i was reading that ..." (lower-case text runs on)
_AFTER_HEDGE = re.compile(r"[.!?]\s+|,?\s+(?:but|though|although|however)\s+", re.IGNORECASE)
_TITLE_CHARS = 200  # longer metadata values (a path, a URL) are no title an answer cites in a sentence
_CLAUSE_SPLIT = re.compile(r";\s+|,\s+(?:but|while|whereas|although)\s+", re.IGNORECASE)
_WORD = re.compile(r"\w+(?:['’]\w+)*")

# Conversation, not content: an opening interjection ("yes ,", "that's great !"), a lead-in that
# only frames what follows ("i do know that ..."), and a clause about the speaker ("i love it",
# "i've never heard of it"): none of them is a claim about the context.
_INTERJECTION = re.compile(
    r"^\s*(?:(?:yes|yeah|yep|yup|no|nope|well|oh|wow|sure|ok|okay|hmm|haha|lol|right|true|indeed|"
    r"that\s*['’]?\s*s\s+(?:great|awesome|cool|interesting|amazing|true|right|good|nice|sad|funny|"
    r"wonderful|fascinating|neat)|you\s*['’]?\s*re\s+(?:welcome|right)|thanks|thank\s+you)\b[\s,.!?]*)+",
    re.IGNORECASE,
)
_LEAD_IN = re.compile(
    r"^\s*i\s+(?:do\s+|also\s+)?(?:know|think|believe|heard|read|remember|guess|learned)\s+(?:that\s+)?",
    re.IGNORECASE,
)
_SPEAKER_CLAUSE_WORDS = 6
_ABOUT_THE_SPEAKER = re.compile(r"^\s*(?:i|me|my|we|i\s*['’]\s*(?:m|ve|d|ll))\b", re.IGNORECASE)

# Yes/no questions and their answers.
_AUXILIARIES = frozenset(
    "is are was were am do does did can could will would should shall has have had may might must".split()  # noqa: SIM905
)
_BE = frozenset(("is", "are", "was", "were", "am"))
_YES = frozenset("yes yeah yep yup correct true right indeed absolutely definitely certainly sure".split())  # noqa: SIM905
_NO = frozenset(("no", "nope", "incorrect", "false", "not"))
# A question to the people talking is about them ("Do you like dogs?", "Have you seen it?", "Are you
# a fan?"), not about the context; "Do you ship to Canada?" asks about the business and is judged.
_SPEAKERS = frozenset(("you", "i", "we"))
_PERSONAL_VERBS = frozenset(
    "like love enjoy prefer hate know think remember believe feel want agree mind watch play listen read "  # noqa: SIM905
    "seen heard been watched played read tried visited ever really also still".split()
)
_PRONOUNS = frozenset(
    ("it", "he", "she", "they", "this", "that", "there", "these", "those", "you", "i", "we")
)
# words a name may hold between its capitalised words ("University of Minnesota", "Gin and tonic")
_NAME_JOINERS = frozenset(("and", "of", "the", "a", "an", "&", "de", "la", "van", "von", "der", "du", "da"))
# "Is it true that S?" and the like: S is the proposition
_EMBEDDED = re.compile(
    r"^(?:is\s+it\s+(?:true|the\s+case|correct)\s+that|(?:do|does)\s+(?:you|anyone)\s+know\s+(?:if|whether)"
    r"|(?:can|could)\s+you\s+(?:tell|confirm)\s+(?:me\s+)?(?:if|whether|that)|tell\s+me\s+(?:if|whether))\s+",
    re.IGNORECASE,
)
_OPENER = re.compile(r"^(?:(?:so|and|but|well|then|also|ok|okay|hmm|oh)\b[\s,]*)+", re.IGNORECASE)
_SHORT_ANSWER_WORDS = 8


@dataclass(frozen=True, slots=True)
class AnswerClaims:
    """An answer's claims, and which of them deny the question's proposition (a bare "no")."""

    claims: list[str]
    denied: frozenset[int] = frozenset()


def _conversational(clause: str) -> str:
    """The clause without its interjections and lead-ins; empty when it is a short one about the
    speaker ("i love indian food"; a longer one, "i visited manhattan, the largest borough of
    manhattan", still says something about the world)."""
    clause = _LEAD_IN.sub("", _INTERJECTION.sub("", clause))
    short = len(_WORD.findall(clause)) <= _SPEAKER_CLAUSE_WORDS
    return "" if short and _ABOUT_THE_SPEAKER.match(clause) else clause


@functools.lru_cache(maxsize=256)
def _citing_a_title(titles: tuple[str, ...]) -> re.Pattern[str] | None:
    """The pattern of an opening "According to <one of the titles>:", the title quoted or not, any
    case, the longest title first: a cited title is the source as a whole, colons and commas in it
    included ("Troubleshooting: can't sign in")."""
    names = sorted({" ".join(t.split()) for t in titles if 0 < len(t) <= _TITLE_CHARS}, key=len, reverse=True)
    if not names:
        return None
    name = "(?:" + "|".join(r"\s+".join(map(re.escape, n.split())) for n in names) + ")"
    return re.compile(
        _CITING + rf"(?:\"{name}\"|\u201c{name}\u201d|['\u2018]{name}['\u2019]|{name})\s*[:,]\s*",
        re.IGNORECASE,
    )


def _without_source(sentence: str, citing_a_title: re.Pattern[str] | None) -> str:
    if citing_a_title is not None:
        cut, n = citing_a_title.subn("", sentence, count=1)
        if n:
            return cut
    return _ACCORDING_TO.sub("", sentence)


def split_claims(answer: str, titles: Sequence[str] = ()) -> list[str]:
    """The answer's claims: sentences, split further into clauses, without the clauses that only
    hedge or refuse, citation markers, an opening "According to <source>:" (a source among `titles`,
    the chunks' titles, as a whole) or conversation about the speaker ("i love it"); empty for a
    refusal."""
    citing = _citing_a_title(tuple(titles))
    parts = [
        piece
        for s in sentences(_CITATION.sub("", answer))
        for part in _CLAUSE_SPLIT.split(_without_source(s, citing))
        for piece in (_AFTER_HEDGE.split(part) if _REFUSAL.search(part) else [part])
        if not _REFUSAL.search(piece)
    ]
    claims = [_conversational(part).strip(" ,.:!?") for part in parts]
    return [c for c in claims if _WORD.search(c)]


def answer_claims(question: str, answer: str, titles: Sequence[str] = ()) -> AnswerClaims:
    """The claims the offline judges check (see the module docstring)."""
    found = split_claims(answer, titles)
    bare = _CITATION.sub("", answer).strip()
    tokens = _WORD.findall(bare)
    if not tokens or len(tokens) > _SHORT_ANSWER_WORDS or _REFUSAL.search(bare):
        return AnswerClaims(found)
    first = tokens[0].casefold()
    if (first in _YES or first in _NO) and not content(words(" ".join(tokens[1:]))):
        # "yes", "no, they are not": a polarity and nothing of its own
        denied = first in _NO
        said = _proposition(question, denied)
        if said is None:
            return AnswerClaims([])
        return AnswerClaims([said], frozenset({0}) if denied else frozenset())
    if not found and all(t[:1].isupper() or t[:1].isdigit() for t in tokens):
        return AnswerClaims([bare.strip(" ,.:!?")])  # a title or a number, not talk about the speaker
    return AnswerClaims(found)


def _proposition(question: str, denied: bool) -> str | None:
    """The statement a yes (or, `denied`, a no) to the question's last yes/no question makes, or None
    when there is none or it is about the speakers."""
    asked = [s for s in sentences(question) if s.rstrip().endswith("?")]
    if not asked:
        return None
    text = _OPENER.sub("", " ".join(asked[-1].split()).rstrip(" ?")).strip(" ,")
    embedded = _EMBEDDED.match(text)
    if embedded:
        statement = text[embedded.end() :]
        if not statement:
            return None
        return f"it is not the case that {statement}" if denied else statement
    tokens = text.split()
    if len(tokens) < 2 or tokens[0].casefold() not in _AUXILIARIES:
        return None  # a wh-question, a negative question ("isn't it ...?") or no question at all
    aux, rest = tokens[0].casefold(), tokens[1:]
    if rest[0].casefold() in _SPEAKERS and (
        aux in _BE or len(rest) < 2 or rest[1].casefold() in _PERSONAL_VERBS
    ):
        return None
    end = _subject_end(rest)
    verb = ("cannot" if aux == "can" else f"{aux} not") if denied else aux
    if end == 0 or end >= len(rest):
        # no subject found with confidence: the question and its answer, as asked
        return f"{' '.join([aux, *rest])}: {'no' if denied else 'yes'}"
    return " ".join([*rest[:end], verb, *rest[end:]])


def _subject_end(tokens: Sequence[str]) -> int:
    """How many of `tokens` (a question after its auxiliary) form its subject: a pronoun, or a run of
    capitalised names and the words joining them ("both University of Patras and Manhattan
    College"); 0 when neither opens it or where the run ends is a guess: a name that breaks off
    after a joining word ("Gin and tonic"), or one after an article that runs on into a common noun
    ("the Pro plan")."""
    if tokens[0].casefold() in _PRONOUNS:
        return 1
    end = 0
    start = 1 if tokens[0].casefold() in ("both", "either", "neither") else 0
    for i in range(start, len(tokens)):
        t = tokens[i]
        if t[:1].isupper() or t[:1].isdigit():
            end = i + 1
        elif t.casefold() not in _NAME_JOINERS:
            before = tokens[i - 1].casefold() if i > start else ""
            if before in ("and", "of", "&"):
                return 0
            if tokens[start].casefold() in ("the", "a", "an") and end == i and t.casefold() not in STOPWORDS:
                return 0
            return end
    return end
