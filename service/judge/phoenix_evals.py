"""`PhoenixEvalsJudge`: faithfulness judged by Arize Phoenix evals' templates, as a ragmon `Judgment`.

Selected with `judge.backend: phoenix_evals`; it calls the same
OpenAI-compatible endpoint, model and timeouts as ragmon's own judge
(`judge.*`), so the two can be compared on the same traffic. One call per
trace, through `phoenix.evals.LLM` and one of two templates
(`judge.phoenix_template`):

* `faithfulness` (default): Phoenix's `FaithfulnessEvaluator` — query,
  retrieved context and answer in, `faithful` / `unfaithful` out (the RAG
  "is the answer grounded in the reference" template).
* `hallucination`: Phoenix's `HallucinationEvaluator`, which grounds the answer
  in a conversation; the input is the question followed by the retrieved
  chunks as the record the assistant had.

What the `Judgment` means here (Phoenix judges the answer as a whole):

* `claims` is the whole answer as ONE claim: `faithfulness` is 1.0 (faithful)
  or 0.0 (unfaithful), never a fraction, and `outcome` is always `scored`
  (no `no_claims`: an abstention is judged faithful).
* Not assessed, filled with fixed values the rationale names: `failure_mode`
  is `fabrication` for every unfaithful answer, `context_sufficient` is True,
  so `diagnosis` is `ok` or `generation_failure` and never `retrieval_failure`.
* `rationale` starts with `phoenix_evals/<template>: <label>` and carries
  Phoenix's explanation.
* `calls` has one entry per HTTP call with tokens read from the reply's
  `usage` (None when the endpoint sent none) and the USD cost.

Failures follow `LlmJudge`: timeouts, connection errors, 429 and 5xx are
retried with jittered backoff up to `judge.max_attempts`, then `judge`
raises `JudgeUnavailable` (or records a failed judgment with
`judge.when_unavailable: record`); a reply with no valid label is
`malformed`; other 4xx are `rejected`; no answer text is `no_answer`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version as package_version
from typing import Any

import httpx2
import openai
from phoenix.evals import LLM
from phoenix.evals.evaluators import ClassificationEvaluator
from phoenix.evals.metrics.faithfulness import FaithfulnessEvaluator
from phoenix.evals.metrics.hallucination import HallucinationEvaluator
from phoenix.evals.rate_limiters import RateLimitError

from service.config import JudgeConfig
from service.errors import JudgeUnavailable
from service.judge.judgment import (
    TRANSIENT_REASONS,
    CostFn,
    FailureReason,
    JudgeCall,
    JudgeName,
    Judgment,
    Verdict,
)
from service.model import RagTrace

__all__ = ["NOT_ASSESSED", "PhoenixEvalsJudge"]

NOT_ASSESSED = (
    "Not assessed by phoenix_evals: claim extraction (the whole answer is one claim), "
    "failure mode (fabrication for any unfaithful answer), context sufficiency (recorded as sufficient)."
)
_NO_KEY = "ragmon-no-key"


@dataclass(frozen=True, slots=True)
class _Seen:
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None


# The HTTP calls of the judgment being made in this task (the client is shared by concurrent judgments).
_calls: ContextVar[list[_Seen] | None] = ContextVar("phoenix_judge_calls", default=None)


async def _on_response(response: httpx2.Response) -> None:
    seen = _calls.get()
    if seen is None:
        return
    await response.aread()
    prompt = completion = None
    try:
        usage = response.json().get("usage")
    except (ValueError, AttributeError):
        usage = None
    if isinstance(usage, dict):
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(p, int) and isinstance(c, int):
            prompt, completion = p, c
    seen.append(_Seen(response.status_code, prompt, completion))


def _reason(exc: Exception) -> FailureReason:
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection_error"
    if isinstance(exc, openai.RateLimitError | RateLimitError):
        return "rate_limited"
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 408:
            return "timeout"
        return "server_error" if exc.status_code >= 500 else "rejected"
    return "malformed"


class PhoenixEvalsJudge:
    """The `Judge` backed by Phoenix evals' templates (see the module docstring). `aclose` frees the pool."""

    def __init__(
        self, config: JudgeConfig, *, cost_fn: CostFn | None = None, rng: random.Random | None = None
    ) -> None:
        if not config.endpoint_configured():
            raise ValueError(
                "judge.backend phoenix_evals needs an OpenAI-compatible endpoint "
                "(judge.base_url / judge.api_key or OPENAI_BASE_URL / OPENAI_API_KEY)"
            )
        self.config = config
        if cost_fn is None:
            from service.conventions.pricing import PriceTable

            cost_fn = PriceTable.default().cost
        self._cost_fn = cost_fn
        self._rng = rng or random.Random()
        api_key = config.api_key.get_secret_value() if config.api_key else None
        if api_key is None and not os.environ.get("OPENAI_API_KEY"):
            api_key = _NO_KEY
        timeout = httpx2.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        self._http = httpx2.AsyncClient(
            timeout=timeout,
            limits=httpx2.Limits(
                max_connections=config.max_connections, max_keepalive_connections=config.max_connections
            ),
            event_hooks={"response": [_on_response]},
        )
        client_kwargs: dict[str, Any] = {"api_key": api_key, "timeout": timeout}
        if config.base_url:
            client_kwargs["base_url"] = config.base_url
        llm = LLM(
            provider="openai",
            model=config.model,
            async_client_kwargs={**client_kwargs, "http_client": self._http},
            sync_client_kwargs=client_kwargs,
        )
        template = config.phoenix_template
        evaluator_type = FaithfulnessEvaluator if template == "faithfulness" else HallucinationEvaluator
        self._evaluator: ClassificationEvaluator = evaluator_type(
            llm=llm, temperature=0, max_completion_tokens=config.max_completion_tokens
        )
        self._template = template
        prompt = repr(evaluator_type.PROMPT.template).encode()
        fingerprint = hashlib.sha256(prompt).hexdigest()[:8]
        evals = package_version("arize-phoenix-evals")
        self._version = f"phoenix_evals/{template}/{config.model}/evals-{evals}-{fingerprint}"
        self._faithful_label = "faithful" if template == "faithfulness" else "grounded"

    @property
    def name(self) -> JudgeName:
        return "llm"

    @property
    def version(self) -> str:
        """Changes with the template, the model and the phoenix-evals release."""
        return self._version

    async def aclose(self) -> None:
        await self._http.aclose()

    def _input(self, trace: RagTrace, context: list[str]) -> dict[str, str]:
        query, answer = trace.query or "", trace.answer or ""
        if self._template == "faithfulness":
            return {"input": query, "output": answer, "context": "\n\n".join(context)}
        documents = "\n".join(f"Tool (retrieve) result {i + 1}: {c}" for i, c in enumerate(context))
        return {"input": f"User: {query}\n{documents}", "output": answer}

    def _fit(self, texts: list[str]) -> list[str]:
        kept: list[str] = []
        left = self.config.max_context_chars
        for text in texts:
            if left <= 0:
                break
            kept.append(text[:left])
            left -= len(text)
        return kept

    async def judge(self, trace: RagTrace) -> Judgment:
        """Judge one trace with one Phoenix evals call (more only for retries). See the module docstring."""
        started, judged_at = time.perf_counter(), datetime.now(UTC)
        calls: list[JudgeCall] = []

        def failed(reason: FailureReason) -> Judgment:
            return Judgment.failed(
                trace,
                reason,
                judge="llm",
                judge_version=self._version,
                judge_model=self.config.model,
                calls=tuple(calls),
                latency_s=time.perf_counter() - started,
                judged_at=judged_at,
            )

        if not trace.answer or not trace.answer.strip():
            return failed("no_answer")
        chunks = trace.retrieval.context
        texts = [c.content for c in chunks if c.content]
        if chunks and not texts:
            return failed("no_context")
        eval_input = self._input(trace, self._fit(texts))
        unavailable = 0
        waited = 0.0
        while True:
            seen: list[_Seen] = []
            token = _calls.set(seen)
            call_start = time.perf_counter()
            try:
                scores = await self._evaluator.async_evaluate(eval_input)
                error: Exception | None = None
            except Exception as exc:  # openai, phoenix and parsing errors: classified below
                scores, error = [], exc
            finally:
                _calls.reset(token)
            self._record(calls, seen, waited, time.perf_counter() - call_start, error)
            if error is None and scores and scores[0].label in (self._faithful_label, *self._unfaithful()):
                return self._judgment(
                    trace, str(scores[0].label), scores[0].explanation, calls, started, judged_at
                )
            reason = _reason(error) if error is not None else "malformed"
            if reason not in TRANSIENT_REASONS:
                return failed(reason)
            unavailable += 1
            if unavailable >= self.config.max_attempts:
                if self.config.when_unavailable == "record":
                    return failed(reason)
                raise JudgeUnavailable(
                    f"judge endpoint unavailable after {unavailable} attempt(s): {reason}",
                    reason=reason,
                    retry_after_s=self._backoff(unavailable),
                )
            waited = self._backoff(unavailable)
            await asyncio.sleep(waited)

    def _unfaithful(self) -> tuple[str, ...]:
        return ("unfaithful",) if self._template == "faithfulness" else ("hallucinated",)

    def _backoff(self, failures: int) -> float:
        cap = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (failures - 1))
        return self._rng.uniform(0, cap)

    def _record(
        self,
        calls: list[JudgeCall],
        seen: list[_Seen],
        waited: float,
        latency: float,
        error: Exception | None,
    ) -> None:
        """One `JudgeCall` per HTTP reply of this attempt (one with no status when nothing answered)."""
        if not seen:
            status: Any = "ok" if error is None else _reason(error)
            calls.append(JudgeCall(attempt=len(calls) + 1, status=status, waited_s=waited, latency_s=latency))
            return
        for i, s in enumerate(seen):
            status = "ok" if s.status < 400 else _reason_of_status(s.status)
            if i == len(seen) - 1 and status == "ok" and error is not None:
                status = _reason(error)  # answered, but not with a usable label
            cost = None
            if s.prompt_tokens is not None and s.completion_tokens is not None:
                cost = self._cost_fn(self.config.model, s.prompt_tokens, s.completion_tokens)
            calls.append(
                JudgeCall(
                    attempt=len(calls) + 1,
                    status=status,
                    http_status=s.status,
                    waited_s=waited if i == 0 else 0.0,
                    latency_s=latency / len(seen),
                    prompt_tokens=s.prompt_tokens,
                    completion_tokens=s.completion_tokens,
                    usage_reported=s.prompt_tokens is not None,
                    cost_usd=cost,
                )
            )

    def _judgment(
        self,
        trace: RagTrace,
        label: str,
        explanation: str | None,
        calls: list[JudgeCall],
        started: float,
        judged_at: datetime,
    ) -> Judgment:
        faithful = label == self._faithful_label
        verdict = Verdict(
            claims=[trace.answer or ""],
            supported=[0] if faithful else [],
            unsupported=[] if faithful else [0],
            outcome="scored",
            failure_mode="none" if faithful else "fabrication",
            context_sufficient=True,
            rationale=f"phoenix_evals/{self._template}: {label}. {explanation or ''} {NOT_ASSESSED}".strip(),
        )
        return Judgment.from_verdict(
            trace,
            verdict,
            judge="llm",
            judge_version=self._version,
            judge_model=self.config.model,
            calls=tuple(calls),
            latency_s=time.perf_counter() - started,
            judged_at=judged_at,
        )


def _reason_of_status(status: int) -> FailureReason:
    if status == 408:
        return "timeout"
    if status == 429:
        return "rate_limited"
    return "server_error" if status >= 500 else "rejected"
