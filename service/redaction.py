"""`Redactor`: personal data and secrets taken out of traces before anything keeps or shows them.

Optional (`redaction.enabled`). When on, every trace and feedback text passes
here right after assembly (and the JSON API's records before they go on), so
what is stored, judged, shown to reviewers and reported never holds the
redacted text. Each match becomes `[REDACTED:<kind>]` and is counted in
`ragmon_redactions_total{kind}`.

Built-in kinds (all on by default when enabled; `redaction.builtin` picks):

  ========  ====================================================================
  email     an e-mail address
  phone     a phone number: 8 to 15 digits written as one (a leading +, groups
            split by spaces or parentheses, or 10+ digits with dashes or dots);
            dates are left alone
  card      13 to 19 digits (spaces or dashes between groups) that pass the
            Luhn check, so order numbers and timestamps are left alone
  api_key   key-like tokens: `sk-...`, `sk_live_...`, `AKIA...`, `ghp_...`,
            `xox[abpr]-...`, and what follows `Bearer ` in a text
  ========  ====================================================================

`redaction.patterns` adds named regexes of your own. What is *not* covered:
the write-ahead log and the Kafka spans topic hold requests as received until
they are stored (both transient), the span archive (`trace_spans`) the spans of
flushed traces as received for `assembler.late_window_s`, and the Phoenix tee forwards the raw OTLP
request, so the configuration refuses redaction together with the tee.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from service.config import RedactionConfig
from service.consumer import TraceConsumer
from service.metrics import Metrics
from service.model import Chunk, Feedback, RagTrace

__all__ = ["BUILTIN", "RedactingFilter", "Redactor"]


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        n = int(char)
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _card(match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group(0))
    return 13 <= len(digits) <= 19 and _luhn(digits)


def _phone(match: re.Match[str]) -> bool:
    text = match.group(0)
    digits = len(re.sub(r"\D", "", text))
    if not 8 <= digits <= 15 or _DATE.fullmatch(text.strip()):
        return False
    # a number written as one: international (+), in groups with spaces or parentheses, or 10+ digits
    return text.startswith("+") or " " in text or "(" in text or digits >= 10


_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4}")


# kind -> (pattern, a check a match must pass as well); order matters: cards before phones
BUILTIN: dict[str, tuple[re.Pattern[str], Callable[[re.Match[str]], bool] | None]] = {
    "email": (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), None),
    "api_key": (
        re.compile(
            r"(?:\bsk[-_](?:live_|test_|proj-)?[A-Za-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b|\bghp_[A-Za-z0-9]{30,}"
            r"|\bxox[abpr]-[A-Za-z0-9-]{10,}|(?<=Bearer )[A-Za-z0-9._~+/-]{16,}=*)"
        ),
        None,
    ),
    "card": (re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)"), _card),
    "phone": (re.compile(r"(?<![\w+])\+?\(?\d[\d .()-]{6,18}\d(?!\w)"), _phone),
}


def _replace(
    text: str, pattern: re.Pattern[str], check: Callable[[re.Match[str]], bool] | None, mark: str
) -> tuple[str, int]:
    """`text` with the matches that pass `check` replaced by `mark`, and how many there were."""
    parts: list[str] = []
    end = count = 0
    for match in pattern.finditer(text):
        if check is None or check(match):
            parts += (text[end : match.start()], mark)
            end = match.end()
            count += 1
    return ("".join(parts) + text[end:], count) if count else (text, 0)


class Redactor:
    """Replaces every match of the configured kinds in a text, counting each by kind."""

    def __init__(self, config: RedactionConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._rules: list[tuple[str, re.Pattern[str], Callable[[re.Match[str]], bool] | None]] = [
            (kind, *BUILTIN[kind]) for kind in BUILTIN if kind in config.builtin
        ]
        self._rules += [(name, re.compile(pattern), None) for name, pattern in config.patterns.items()]

    def text(self, value: str | None) -> str | None:
        """`value` with every match replaced by `[REDACTED:<kind>]`; None stays None."""
        if not value:
            return value
        for kind, pattern, check in self._rules:
            value, count = _replace(value, pattern, check, f"[REDACTED:{kind}]")
            if count:
                self.metrics.redactions.labels(kind=kind).inc(count)
        return value

    def _chunks(self, chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
        return tuple(
            c.model_copy(update={"content": self.text(c.content)}) if c.content else c for c in chunks
        )

    def trace(self, trace: RagTrace) -> RagTrace:
        """The trace with its question, answer and every chunk's content redacted."""
        retrieval = trace.retrieval
        return trace.model_copy(
            update={
                "query": self.text(trace.query),
                "answer": self.text(trace.answer),
                "retrieval": retrieval.model_copy(
                    update={
                        "chunks": self._chunks(retrieval.chunks),
                        "reranker_input": self._chunks(retrieval.reranker_input),
                        "reranker_output": self._chunks(retrieval.reranker_output),
                    }
                ),
            }
        )

    def traces(self, batch: Iterable[RagTrace]) -> list[RagTrace]:
        return [self.trace(t) for t in batch]

    def feedback(self, batch: Iterable[Feedback]) -> list[Feedback]:
        """Feedback with its free text redacted."""
        return [f.model_copy(update={"text": self.text(f.text)}) if f.text else f for f in batch]


class RedactingFilter:
    """Processor: traces in, the same traces redacted out to `next` (after the request filter)."""

    def __init__(self, redactor: Redactor, next: TraceConsumer) -> None:
        self.redactor = redactor
        self.next = next

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        await self.next.consume_traces(self.redactor.traces(batch))
