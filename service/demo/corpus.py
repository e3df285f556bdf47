"""The knowledge of the simulated RAG app behind `ragmon demo`: topics, a generated corpus, a local embedder.

Everything here is generated from templates and vocabularies written for the
demo (no external data), and is a pure function of its seed: the same seed
gives the same documents, ids and vectors on every machine, because hashing
uses CRC-32 rather than Python's per-process salted `hash`.

The embedder is a signed feature-hashing model over content words and
their character trigrams. It is not semantic, but texts that share words score
higher than texts that do not, which is all the demo needs: on-topic
retrieval scores land well above off-topic ones, and a change of query
vocabulary moves the query vectors.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "SHIFT_TOPICS",
    "TOPICS",
    "Corpus",
    "Document",
    "Topic",
    "build_corpus",
    "embed_text",
    "topics_of",
    "word_set",
]

FloatMatrix = npt.NDArray[np.float64]

_WORD = re.compile(r"[a-z0-9]+")

# Function words carry no topic; leaving them in makes every pair of English
# sentences look alike under feature hashing.
_STOP_WORDS = (
    "a an and are as at be by can do does for from get has have how i if in is it its my me of on or "
    "our so that the their them then there this to up was we what when where which who why will with you your"
)
_STOP = frozenset(_STOP_WORDS.split())


@dataclass(frozen=True, slots=True)
class Topic:
    """One (app, intent) pair with its vocabulary, question templates and fact templates.

    Templates use `{slot}` fields; every slot they name is a key of `slots`.
    """

    app: str
    intent: str
    slots: Mapping[str, tuple[str, ...]]
    questions: tuple[str, ...]
    facts: tuple[str, ...]

    def bind(self, rng: np.random.Generator) -> dict[str, str]:
        """Draw one value for every slot."""
        return {name: values[int(rng.integers(len(values)))] for name, values in self.slots.items()}


@dataclass(frozen=True, slots=True)
class Document:
    """One chunk of the demo corpus; `content` is 300–500 characters."""

    id: str
    app: str
    intent: str
    title: str
    content: str


@dataclass(frozen=True, slots=True)
class Corpus:
    """All documents, with their unit embedding rows in the same order."""

    documents: tuple[Document, ...]
    vectors: FloatMatrix
    dim: int

    def for_app(self, app: str) -> tuple[tuple[Document, ...], FloatMatrix]:
        """The documents of one app and their vectors (a view, not a copy of every row)."""
        idx = [i for i, d in enumerate(self.documents) if d.app == app]
        return tuple(self.documents[i] for i in idx), self.vectors[idx]


def word_set(text: str) -> frozenset[str]:
    """Lower-case alphanumeric words: the unit ragmon's re-ask similarity (word-set Jaccard) counts."""
    return frozenset(_WORD.findall(text.lower()))


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    h = zlib.crc32(feature.encode("utf-8"))
    return h % dim, 1.0 if (h >> 31) & 1 else -1.0


def embed_text(text: str, dim: int) -> npt.NDArray[np.float64]:
    """A unit vector of `dim` floats for `text`; deterministic across processes and machines.

    Raises ValueError for a dimension outside 8..4096. Empty text maps to the
    zero vector (the only non-unit output).
    """
    if not 8 <= dim <= 4096:
        raise ValueError(f"dim must be in 8..4096, got {dim}")
    vec = np.zeros(dim, dtype=np.float64)
    for word in _WORD.findall(text.lower()):
        if word in _STOP:
            continue
        i, sign = _bucket("w:" + word, dim)
        vec[i] += 2.0 * sign
        padded = f"<{word}>"
        for k in range(len(padded) - 2):
            i, sign = _bucket("c:" + padded[k : k + 3], dim)
            vec[i] += 0.5 * sign
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


_ORDER = tuple(f"#{n}" for n in (40211, 40388, 41902, 42117, 43560, 44871, 45023, 46790))

TOPICS: tuple[Topic, ...] = (
    Topic(
        app="support-bot",
        intent="billing",
        slots={
            "payment": ("credit card", "PayPal account", "bank transfer", "gift card", "store credit"),
            "charge": ("duplicate charge", "pending authorization", "late fee", "currency conversion fee"),
            "order": _ORDER,
        },
        questions=(
            "Why do I see a {charge} on my {payment} for order {order}?",
            "How can I change the {payment} used for my subscription?",
            "When will the {charge} for order {order} disappear from my statement?",
            "Can I get an invoice for order {order} paid by {payment}?",
            "Is there a {charge} when I pay with a {payment}?",
        ),
        facts=(
            "A {charge} on a {payment} is usually released within five business days.",
            "Invoices for every order, including {order}, can be downloaded from the Orders page.",
            "To change the {payment} on file, open Account, then Billing, then Payment methods.",
            "We never add a {charge} without a note on the receipt; contact billing if you see one.",
            "Refunds go back to the original {payment}; store credit is issued only on request.",
            "Billing support answers within one business day and can reverse a {charge} after review.",
            "If a {payment} is declined twice, the order is held for 48 hours before it is cancelled.",
        ),
    ),
    Topic(
        app="support-bot",
        intent="shipping",
        slots={
            "carrier": ("UPS", "DHL Express", "the postal service", "our courier partner"),
            "region": ("Canada", "the EU", "Alaska", "Australia", "Mexico"),
            "order": _ORDER,
        },
        questions=(
            "Where is my order {order}? It was shipped with {carrier}.",
            "How long does shipping to {region} take?",
            "Do you ship to {region} with {carrier}?",
            "My tracking for order {order} has not updated in three days, what should I do?",
            "Can I change the delivery address of order {order} before {carrier} picks it up?",
        ),
        facts=(
            "Standard shipping to {region} takes 5 to 9 business days with {carrier}.",
            "Tracking numbers are emailed when {carrier} scans the parcel, usually within 24 hours.",
            "Customs duties for {region} are collected by {carrier} on delivery.",
            "If tracking has not moved for 72 hours we open a trace with {carrier} at no cost.",
            "The delivery address can be changed until the label is printed for the carrier.",
            "Express shipping is available to {region} for orders placed before 2 pm local time.",
            "Parcels lost in transit are reshipped or refunded once the carrier confirms the loss.",
        ),
    ),
    Topic(
        app="support-bot",
        intent="returns",
        slots={
            "item": ("running shoes", "wireless headphones", "hiking boots", "ski goggles", "bed sheets"),
            "reason": ("are the wrong size", "arrived damaged", "stopped working", "are not as described"),
        },
        questions=(
            "How do I return {item} that {reason}?",
            "Can I exchange my {item}? They {reason}.",
            "Who pays return shipping for {item} that {reason}?",
            "How long do I have to send back my {item}?",
            "My {item} {reason}, can I get a refund instead of a replacement?",
        ),
        facts=(
            "Most items, including {item}, can be returned within 30 days of delivery.",
            "When items {reason}, we cover return shipping with a prepaid label.",
            "Exchanges for {item} are shipped as soon as the return is scanned by the carrier.",
            "Refunds are issued within 5 business days after the returned {item} is inspected.",
            "Items that {reason} after 30 days are handled under the one-year warranty.",
            "Start a return from the Orders page; print the label and drop the parcel at any carrier point.",
            "Opened {item} can be returned if all parts and the original packaging are included.",
        ),
    ),
    Topic(
        app="support-bot",
        intent="account",
        slots={
            "setting": (
                "email address",
                "password",
                "two-factor login",
                "newsletter preferences",
                "phone number",
            ),
            "problem": ("locked out", "not receiving the code", "seeing someone else's order", "logged out"),
        },
        questions=(
            "How do I change my {setting}?",
            "I am {problem}, how can I get back into my account?",
            "Why am I {problem} after changing my {setting}?",
            "Can I delete my account and all my data?",
            "Where do I turn on {setting} for my account?",
        ),
        facts=(
            "Your {setting} can be changed under Account, then Security and login.",
            "If you are {problem}, use the Forgot password link; the reset link is valid for one hour.",
            "Account deletion removes order history after 30 days, as required by our data policy.",
            "Two-factor login codes are sent by text message or generated by an authenticator app.",
            "After a change of {setting} every other device is logged out for safety.",
            "Support can unlock an account after verifying the last four digits of the card on file.",
            "Marketing emails stop within 48 hours after you change newsletter preferences.",
        ),
    ),
    Topic(
        app="docs-assistant",
        intent="install",
        slots={
            "platform": ("Ubuntu 22.04", "macOS", "Windows with WSL", "a Raspberry Pi", "Kubernetes"),
            "method": ("the apt repository", "Homebrew", "the Docker image", "the Helm chart", "pip"),
        },
        questions=(
            "How do I install LumenDB on {platform} with {method}?",
            "What are the system requirements for LumenDB on {platform}?",
            "Installing with {method} fails on {platform}, what am I missing?",
            "Is {method} the recommended way to install LumenDB on {platform}?",
            "How do I upgrade LumenDB installed with {method}?",
        ),
        facts=(
            "LumenDB supports {platform}; install it with {method} and start it with lumen serve.",
            "LumenDB needs 2 GB of RAM and a 64-bit CPU; on {platform} it also needs glibc 2.31 or newer.",
            "Upgrades with {method} keep the data directory; run lumen migrate afterwards.",
            "When {method} fails with a signature error, import the release key first.",
            "The Docker image listens on port 7700 and stores data under /var/lib/lumen.",
            "On {platform} the service runs as the lumen user, created by the installer.",
            "Check the installed version with lumen --version before opening an issue.",
        ),
    ),
    Topic(
        app="docs-assistant",
        intent="config",
        slots={
            "option": ("max_connections", "cache_size", "wal_mode", "listen_address", "log_level"),
            "file": ("lumen.toml", "environment variables", "the admin console", "command-line flags"),
        },
        questions=(
            "How do I set {option} in {file}?",
            "What is the default value of {option}?",
            "Does changing {option} require a restart?",
            "Which wins, {file} or the config file, for {option}?",
            "What happens if {option} is set too high?",
        ),
        facts=(
            "{option} is read from {file} at start; flags override the file, environment overrides flags.",
            "The default of cache_size is a quarter of physical memory; max_connections defaults to 100.",
            "Changing {option} requires a restart unless it is marked reloadable in the reference.",
            "Set log_level to debug only while troubleshooting; it writes every query to the log.",
            "Setting {option} too high can exhaust file descriptors; the server refuses to start then.",
            "wal_mode keeps readers and the writer apart and is on by default since version 3.",
            "Run lumen config show to print the effective value of {option} and where it came from.",
        ),
    ),
    Topic(
        app="docs-assistant",
        intent="api",
        slots={
            "endpoint": ("/v2/collections", "/v2/query", "/v2/ingest", "/v2/snapshots"),
            "client": ("the Python client", "the TypeScript client", "curl", "the Go client"),
        },
        questions=(
            "How do I call {endpoint} from {client}?",
            "What does {endpoint} return when the collection is missing?",
            "Is there pagination on {endpoint}?",
            "How do I authenticate requests to {endpoint} with {client}?",
            "What rate limits apply to {endpoint}?",
        ),
        facts=(
            "{endpoint} accepts JSON and returns JSON; {client} wraps it with typed methods.",
            "A missing collection returns 404 with error code collection_not_found.",
            "List endpoints page with a cursor; pass next_cursor from the previous response.",
            "Send the API key in the Authorization header as a bearer token; {client} reads LUMEN_API_KEY.",
            "The default rate limit is 50 requests per second per key; bursts of 100 are allowed.",
            "{endpoint} is idempotent when a request id header is sent with the request.",
            "Errors carry a request id that support can use to find the server log line.",
        ),
    ),
    Topic(
        app="docs-assistant",
        intent="troubleshooting",
        slots={
            "symptom": ("slow queries", "high memory use", "connection refused", "disk full errors"),
            "component": ("the query planner", "the write-ahead log", "the index builder", "replication"),
        },
        questions=(
            "Why am I getting {symptom} after an upgrade?",
            "How do I debug {symptom} caused by {component}?",
            "Can {component} cause {symptom}?",
            "What metrics should I watch for {symptom}?",
            "LumenDB shows {symptom} under load, how do I fix it?",
        ),
        facts=(
            "{symptom} after an upgrade usually means statistics are stale; run lumen analyze.",
            "{component} logs a warning when it falls behind; search the log for lag_seconds.",
            "Memory use grows with cache_size; lower it if the host also runs other services.",
            "Connection refused means the server is not listening on listen_address or a firewall blocks it.",
            "Disk full errors stop writes but keep reads working; free space and run lumen checkpoint.",
            "Watch lumen_query_duration_seconds and lumen_wal_bytes to spot {symptom} early.",
            "{component} can be paused from the admin console while you investigate.",
        ),
    ),
    Topic(
        app="hr-helper",
        intent="leave",
        slots={
            "leave": ("parental leave", "sick leave", "vacation time", "unpaid leave", "bereavement leave"),
            "period": ("this quarter", "next month", "the holidays", "my probation period"),
        },
        questions=(
            "How much {leave} do I get per year?",
            "Can I take {leave} during {period}?",
            "How do I request {leave} in the HR portal?",
            "Does unused {leave} carry over to next year?",
            "Who approves {leave} during {period}?",
        ),
        facts=(
            "Full-time staff get 25 vacation days a year; {leave} is granted on top of that.",
            "{leave} is requested in the HR portal under Time off; your manager approves it.",
            "During {period} requests need two weeks of notice unless it is an emergency.",
            "Up to five unused vacation days carry over and expire at the end of March.",
            "{leave} taken during {period} does not affect your bonus eligibility.",
            "HR confirms every approved request by email and updates the team calendar.",
            "Sick leave beyond three days needs a doctor's note uploaded to the portal.",
        ),
    ),
    Topic(
        app="hr-helper",
        intent="benefits",
        slots={
            "benefit": ("health insurance", "pension plan", "gym allowance", "learning budget"),
            "event": ("moving to part time", "having a baby", "changing teams", "working remotely"),
        },
        questions=(
            "What does my {benefit} cover?",
            "Does my {benefit} change when I am {event}?",
            "How do I enrol in the {benefit}?",
            "When can I change my {benefit} options?",
            "Is the {benefit} available while {event}?",
        ),
        facts=(
            "The {benefit} is available from the first day of employment for permanent staff.",
            "Enrolment in the {benefit} is done in the HR portal under Benefits within 30 days of joining.",
            "Life events such as {event} let you change your {benefit} outside the yearly window.",
            "The learning budget is 1,500 per year and covers courses, books and conferences.",
            "The company matches pension contributions up to five percent of base salary.",
            "Part-time staff keep their {benefit}; allowances are prorated by contracted hours.",
            "Benefit questions go to the benefits desk, which answers within two working days.",
        ),
    ),
    Topic(
        app="hr-helper",
        intent="payroll",
        slots={
            "item": (
                "overtime",
                "the annual bonus",
                "expense refunds",
                "tax withholding",
                "the travel allowance",
            ),
            "month": ("January", "April", "June", "September", "December"),
        },
        questions=(
            "When is {item} paid in {month}?",
            "Why is {item} missing from my {month} salary?",
            "How do I correct {item} on my payslip?",
            "Where can I download my payslip for {month}?",
            "How is {item} taxed?",
        ),
        facts=(
            "Salaries are paid on the 25th; {item} approved by the 10th is paid the same month.",
            "{item} missing in {month} usually means the approval arrived after the payroll cut-off.",
            "Payslips, including {month}, are in the HR portal under Pay for seven years.",
            "Corrections to {item} are made by payroll in the next run after your manager confirms.",
            "Bonuses are taxed at your marginal rate; expense refunds are not taxed.",
            "Tax withholding follows the code you submitted; update it in the portal if it changed.",
            "Payroll questions are answered by the payroll team within three working days.",
        ),
    ),
)

# Traffic the corpus was not written for: used after `--shift-after` so the
# query distribution and retrieval scores move together, as they do when a
# product launches something the knowledge base does not cover yet.
SHIFT_TOPICS: tuple[Topic, ...] = (
    Topic(
        app="support-bot",
        intent="account",
        slots={
            "tier": ("Gold membership", "Platinum tier", "annual pass", "family plan"),
            "perk": ("loyalty points", "free express delivery", "early access drops", "partner discounts"),
        },
        questions=(
            "How do I upgrade to the {tier} to unlock {perk}?",
            "Why did my {perk} vanish when the {tier} renewed?",
            "Does the {tier} include {perk} abroad?",
            "Can I share {perk} from my {tier} with a friend?",
        ),
        facts=(),
    ),
    Topic(
        app="docs-assistant",
        intent="api",
        slots={
            "feature": ("vector search", "hybrid ranking", "embedding quantization", "semantic cache"),
            "param": ("ef_search", "nprobe", "rerank_depth", "similarity_cutoff"),
        },
        questions=(
            "How do I tune {param} for {feature}?",
            "Why does {feature} ignore {param} on small collections?",
            "Which {param} gives the best recall with {feature}?",
            "Can I combine {feature} with filters and {param}?",
        ),
        facts=(),
    ),
)


def _document(topic: Topic, index: int, rng: np.random.Generator) -> Document:
    binding = topic.bind(rng)
    order = rng.permutation(len(topic.facts))
    sentences: list[str] = []
    length = 0
    for i in order:
        sentence = topic.facts[int(i)].format(**binding)
        sentence = sentence[0].upper() + sentence[1:]
        if length + len(sentence) + 1 > 500:
            continue
        sentences.append(sentence)
        length += len(sentence) + 1
        if length >= 300 and rng.random() < 0.5:
            break
    content = " ".join(sentences)
    first_value = next(iter(binding.values()))
    return Document(
        id=f"{topic.app}/{topic.intent}/{index:03d}",
        app=topic.app,
        intent=topic.intent,
        title=f"{topic.intent.capitalize()}: {first_value}",
        content=content,
    )


def build_corpus(*, docs_per_topic: int = 12, dim: int = 128, seed: int = 0) -> Corpus:
    """The demo's knowledge base: `docs_per_topic` chunks for each topic in `TOPICS`, embedded.

    Raises ValueError for `docs_per_topic` < 5 (every retrieval returns five chunks).
    """
    if docs_per_topic < 5:
        raise ValueError(f"docs_per_topic must be at least 5, got {docs_per_topic}")
    rng = np.random.default_rng([seed, 0xC0FFEE])
    documents = tuple(_document(t, j, rng) for t in TOPICS for j in range(docs_per_topic))
    vectors = np.stack([embed_text(d.content, dim) for d in documents])
    return Corpus(documents=documents, vectors=vectors, dim=dim)


def topics_of(app: str, topics: Sequence[Topic] = TOPICS) -> tuple[Topic, ...]:
    """The topics of one app, in declaration order."""
    return tuple(t for t in topics if t.app == app)
