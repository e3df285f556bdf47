"""The traffic of the demo's simulated RAG app, as data: who asks what, what comes back, how long it takes.

`plan_traffic` draws requests one by one from a seeded generator, so the same
seed gives the same sequence of `PlannedRequest`s, with no network and no
clock involved. Sessions interleave; a session's next turn is a fresh
question, a near-identical re-ask, or an explicit regeneration, more often
after a bad answer. Some requests hit a stale index (off-topic documents, low
scores), a few use an unpriced local model, and after `shift_after` requests
part of the traffic asks about topics the corpus does not cover.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.demo.corpus import (
    SHIFT_TOPICS,
    TOPICS,
    Corpus,
    Document,
    Topic,
    build_corpus,
    embed_text,
    topics_of,
    word_set,
)

__all__ = [
    "LOCAL_MODEL",
    "PlannedRequest",
    "RetrievedDocument",
    "StageTimes",
    "plan_traffic",
]

LOCAL_MODEL = "llama-3.1-8b-instruct-local"  # deliberately absent from the price table: counted as unpriced

RequestKind = Literal["new", "reask", "regenerate"]
RegenerationSignal = Literal["attribute", "feedback"]
Rating = Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class _App:
    name: str
    release: str
    shifted_release: str
    model: str
    weight: float
    rerank_p: float
    ttft_style: Literal["event", "attribute"]


_APPS: tuple[_App, ...] = (
    _App("support-bot", "2.3.0", "2.4.0", "gpt-4o-mini", 0.5, 0.0, "event"),
    _App("docs-assistant", "1.8.2", "1.9.0", "gpt-4o", 0.3, 0.7, "event"),
    _App("hr-helper", "0.9.1", "0.9.1", "gpt-4o-mini", 0.2, 0.2, "attribute"),
)

# (median TTFT s, median s per output token): hosted models answer faster than the local fallback.
_MODEL_SPEED: Mapping[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.35, 0.012),
    "gpt-4o": (0.6, 0.02),
    LOCAL_MODEL: (0.9, 0.035),
}

_HALLUCINATIONS = (
    "This is free of charge for every customer and takes effect immediately.",
    "You need to call the head office between 9 and 10 am to arrange it.",
    "The limit is 90 days, and it can be extended once by a manager.",
    "It was discontinued last year and replaced by the premium option.",
    "Only administrators can do this, from the legacy console.",
)
# a refusal, in words a judge recognizes as one ("I cannot find ..."): it makes no claim, so it is
# neither faithful nor unfaithful (the heuristic judge read "could not find" as a made-up claim)
_NOT_FOUND = "I cannot find this in the documentation I have access to."
_DOWN_REASONS = ("wrong", "incomplete", "irrelevant", "outdated")
_DOWN_TEXTS = ("That is not what the policy says.", "Did not answer my question.", None, None)
_REASK_FORMS = ("Please, {q}", "{lower}", "{q} Please.", "{q}?")


@dataclass(frozen=True, slots=True)
class RetrievedDocument:
    """A chunk as the retriever (or reranker) returned it; `score` is in 0..1, higher is better."""

    id: str
    score: float
    content: str
    title: str


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Simulated durations in nanoseconds; `rerank_ns` is 0 when the request has no reranker."""

    embedding_ns: int
    retrieval_ns: int
    rerank_ns: int
    ttft_ns: int
    generation_ns: int
    gap_ns: int

    @property
    def total_ns(self) -> int:
        return self.embedding_ns + self.retrieval_ns + self.rerank_ns + self.generation_ns + 5 * self.gap_ns


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """Everything one simulated request will send, decided before any span exists.

    `kind` says how the request relates to the previous one of its session:
    a fresh question, a near-identical re-ask (no explicit signal), or an
    explicit regeneration signalled by `regeneration_signal`. `regenerates`
    is the index of the request whose answer was rejected. `faithful` is the
    simulation's ground truth for the answer and is never sent.
    """

    index: int
    app: str
    release: str
    intent: str
    session_id: str
    user_id: str
    query: str
    kind: RequestKind
    regeneration_signal: RegenerationSignal | None
    regenerates: int | None
    shifted: bool
    bad_retrieval: bool
    query_vector: tuple[float, ...]
    documents: tuple[RetrievedDocument, ...]
    reranked: tuple[RetrievedDocument, ...]
    model: str
    prompt: str
    prompt_tokens: int
    completion_tokens: int
    answer: str
    faithful: bool
    times: StageTimes
    ttft_style: Literal["event", "attribute"]
    rating: Rating | None
    rating_reason: str | None
    rating_text: str | None


@dataclass(slots=True)
class _Session:
    id: str
    user_id: str
    app: _App
    turns_left: int
    last: PlannedRequest | None = None


class _Planner:
    """Draws requests one by one from a seeded generator; holds the open sessions."""

    max_open_sessions = 6

    def __init__(self, corpus: Corpus, seed: int, shift_after: int | None) -> None:
        self.corpus = corpus
        self.rng = np.random.default_rng([seed, 0xDE40])
        self.shift_after = shift_after
        self.sessions: list[_Session] = []
        self.session_count = 0
        self.index = {app.name: corpus.for_app(app.name) for app in _APPS}

    def _lognormal(self, median: float, sigma: float) -> float:
        return float(self.rng.lognormal(np.log(median), sigma))

    def _session(self) -> _Session:
        rng = self.rng
        if self.sessions and rng.random() < 0.45:
            return self.sessions[int(rng.integers(len(self.sessions)))]
        weights = np.array([a.weight for a in _APPS])
        app = _APPS[int(rng.choice(len(_APPS), p=weights / weights.sum()))]
        self.session_count += 1
        session = _Session(
            id=f"sess-{self.session_count:06d}-{int(rng.integers(16**6)):06x}",
            user_id=f"user-{int(rng.integers(400)):04d}",
            app=app,
            turns_left=int(rng.geometric(0.4)),
        )
        self.sessions.append(session)
        if len(self.sessions) > self.max_open_sessions:
            self.sessions.pop(0)
        return session

    def _question(self, app: str, shifted: bool, avoid: str | None) -> tuple[Topic, str, bool]:
        rng = self.rng
        pool = topics_of(app, SHIFT_TOPICS) if shifted else ()
        use_shift = bool(pool) and rng.random() < 0.6
        topics = pool if use_shift else topics_of(app, TOPICS)
        for _ in range(20):
            topic = topics[int(rng.integers(len(topics)))]
            template = topic.questions[int(rng.integers(len(topic.questions)))]
            query = template.format(**topic.bind(rng))
            # a new question must not look like a re-ask of the previous one
            if avoid is None or _jaccard(query, avoid) < 0.5:
                break
        return topic, query, use_shift

    def _retrieve(
        self, app: str, intent: str, vector: np.ndarray, bad: bool
    ) -> tuple[RetrievedDocument, ...]:
        docs, matrix = self.index[app]
        sims = matrix @ vector
        if bad:
            # a stale or mis-filtered index: the right documents are not candidates at all
            candidates = np.array([i for i, d in enumerate(docs) if d.intent != intent])
            picked = self.rng.choice(candidates, size=min(25, len(candidates)), replace=False)
            order = picked[np.argsort(-sims[picked])][:5]
        else:
            order = np.argsort(-sims, kind="stable")[:5]
        return tuple(_retrieved(docs[int(i)], float(sims[int(i)])) for i in order)

    def _rerank(self, query: str, documents: Sequence[RetrievedDocument]) -> tuple[RetrievedDocument, ...]:
        scored = []
        for d in documents:
            # a cross-encoder stand-in: word overlap with the query, on top of the retriever's score
            logit = 8.0 * (d.score - 0.62) + 6.0 * _jaccard(query, d.content) + float(self.rng.normal(0, 0.3))
            scored.append((float(1.0 / (1.0 + np.exp(-logit))), d))
        scored.sort(key=lambda p: -p[0])
        return tuple(
            RetrievedDocument(id=d.id, score=round(s, 4), content=d.content, title=d.title)
            for s, d in scored[:3]
        )

    def _answer(self, context: Sequence[RetrievedDocument], bad: bool) -> tuple[str, bool]:
        rng = self.rng
        if bad and rng.random() < 0.4:
            return _NOT_FOUND, True
        sentences = [s.strip() for s in context[0].content.split(". ") if s.strip()]
        parts = [f"According to \u201c{context[0].title}\u201d: {sentences[0].rstrip('.')}."]
        if len(context) > 1 and rng.random() < 0.6:
            more = [s.strip() for s in context[1].content.split(". ") if s.strip()]
            if more[0].rstrip(".") != sentences[0].rstrip("."):
                parts.append(more[0].rstrip(".") + ".")
        hallucinate = rng.random() < (0.6 if bad else 0.08)
        if hallucinate:
            parts.append(_HALLUCINATIONS[int(rng.integers(len(_HALLUCINATIONS)))])
        return " ".join(parts), not hallucinate

    def _times(self, model: str, completion_tokens: int, rerank: bool) -> StageTimes:
        rng = self.rng
        ttft_median, per_token = _MODEL_SPEED[model]
        retrieval = self._lognormal(0.08, 0.5)
        if rng.random() < 0.02:
            retrieval *= 6.0  # a cold cache: the slow tail a p95 alert should see
        ttft = self._lognormal(ttft_median, 0.4)
        generation = ttft + completion_tokens * self._lognormal(per_token, 0.2)
        return StageTimes(
            embedding_ns=_ns(self._lognormal(0.03, 0.35)),
            retrieval_ns=_ns(retrieval),
            rerank_ns=_ns(self._lognormal(0.15, 0.3)) if rerank else 0,
            ttft_ns=_ns(ttft),
            generation_ns=_ns(generation),
            gap_ns=_ns(float(rng.uniform(0.001, 0.004))),
        )

    def next(self, index: int) -> PlannedRequest:
        rng = self.rng
        session = self._session()
        app = session.app
        shifted_phase = self.shift_after is not None and index >= self.shift_after
        last = session.last
        kind: RequestKind = "new"
        signal: RegenerationSignal | None = None
        if last is not None:
            unhappy = last.bad_retrieval or not last.faithful
            draw = rng.random()
            if draw < (0.25 if unhappy else 0.03):
                kind = "regenerate"
                signal = "attribute" if rng.random() < 0.5 else "feedback"
            elif draw < (0.5 if unhappy else 0.07):
                kind = "reask"
        if last is not None and kind != "new":
            intent, shifted = last.intent, last.shifted
            query = last.query if kind == "regenerate" else _reask(last.query, rng)
        else:
            topic, query, shifted = self._question(app.name, shifted_phase, last.query if last else None)
            intent = topic.intent
        vector = embed_text(query, self.corpus.dim)
        bad = shifted or rng.random() < 0.07
        documents = self._retrieve(app.name, intent, vector, bad=bad and not shifted)
        reranked = self._rerank(query, documents) if rng.random() < app.rerank_p else ()
        context = reranked or documents
        answer, faithful = self._answer(context, bad)
        model = LOCAL_MODEL if rng.random() < 0.08 else app.model
        prompt = _prompt(query, context)
        prompt_tokens = len(prompt) // 4
        completion_tokens = max(8, int(len(answer) / 4 * rng.uniform(0.9, 1.3)))
        times = self._times(model, completion_tokens, bool(reranked))
        rating, reason, text = self._rating(bad or not faithful)
        request = PlannedRequest(
            index=index,
            app=app.name,
            release=app.shifted_release if shifted_phase else app.release,
            intent=intent,
            session_id=session.id,
            user_id=session.user_id,
            query=query,
            kind=kind,
            regeneration_signal=signal,
            regenerates=last.index if kind == "regenerate" and last is not None else None,
            shifted=shifted,
            bad_retrieval=bad,
            query_vector=tuple(np.round(vector, 6).tolist()),
            documents=documents,
            reranked=reranked,
            model=model,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            answer=answer,
            faithful=faithful,
            times=times,
            ttft_style=app.ttft_style,
            rating=rating,
            rating_reason=reason,
            rating_text=text,
        )
        session.last = request
        session.turns_left -= 1
        if session.turns_left <= 0 and session in self.sessions:
            self.sessions.remove(session)
        return request

    def _rating(self, unhappy: bool) -> tuple[Rating | None, str | None, str | None]:
        rng = self.rng
        draw = rng.random()
        if draw < (0.35 if unhappy else 0.03):
            i = int(rng.integers(len(_DOWN_REASONS)))
            return "down", _DOWN_REASONS[i], _DOWN_TEXTS[i]
        if draw < (0.37 if unhappy else 0.11):
            return "up", None, None
        return None, None, None


def _ns(seconds: float) -> int:
    return max(1, round(seconds * 1e9))


def _retrieved(doc: Document, cosine: float) -> RetrievedDocument:
    # the (1 + cos) / 2 relevance score many vector stores report for cosine indexes
    return RetrievedDocument(
        id=doc.id, score=round((1.0 + cosine) / 2.0, 4), content=doc.content, title=doc.title
    )


def _jaccard(a: str, b: str) -> float:
    wa, wb = word_set(a), word_set(b)
    return len(wa & wb) / len(wa | wb) if wa | wb else 1.0


def _reask(query: str, rng: np.random.Generator) -> str:
    """A near-identical rewording: only punctuation, case or courtesy words change."""
    form = _REASK_FORMS[int(rng.integers(len(_REASK_FORMS)))]
    lower = query[0].lower() + query[1:]
    return form.format(q=query if form != "Please, {q}" else lower, lower=lower.rstrip("?"))


def _prompt(query: str, context: Sequence[RetrievedDocument]) -> str:
    blocks = "\n\n".join(f"[{i + 1}] {d.title}\n{d.content}" for i, d in enumerate(context))
    return (
        "You are a helpful assistant. Answer only from the context below and cite what you use.\n\n"
        f"Context:\n{blocks}\n\nQuestion: {query}\nAnswer:"
    )


def plan_traffic(
    requests: int, *, seed: int, shift_after: int | None = None, dim: int = 256
) -> Iterator[PlannedRequest]:
    """The demo's traffic as data, request by request; the same arguments give the same sequence.

    Raises ValueError at once (not on first iteration) for `requests` < 1, a
    negative `shift_after` or a `dim` outside 8..4096.
    """
    if requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")
    if shift_after is not None and shift_after < 0:
        raise ValueError(f"shift_after must be >= 0, got {shift_after}")
    planner = _Planner(build_corpus(dim=dim), seed, shift_after)
    return (planner.next(index) for index in range(requests))
