"""`LlmJudge`: faithfulness judging through any OpenAI-compatible endpoint.

One chat-completions call per judged trace, temperature 0, structured output
parsed into `Verdict` by the `openai` SDK. Guarantees of `LlmJudge.judge`:

* 429, 408, 500, 502, 503, 504, timeouts and connection errors are retried
  with full-jitter exponential backoff, never earlier than the server's
  `Retry-After` (or `retry-after-ms`), up to `max_attempts` calls. When they
  persist the endpoint is unavailable, which says nothing about the trace: by
  default (`when_unavailable="raise"`) `judge` raises `JudgeUnavailable` with
  the reason (`rate_limited`, `server_error`, `timeout`, `connection_error`)
  and a `retry_after_s`, so the caller keeps the item queued and the sample
  stays unbiased; with `when_unavailable="record"` it returns a failed
  `Judgment` with that reason instead.
* A server that ignores `response_format` (an older local server, a model
  without structured output) may still write the schema's JSON inside its
  prose or a ```json fence: that object is read and validated like any reply.
  Prose without one is a malformed reply.
* A reply that is not the schema's JSON, or breaks the claim partition, is
  retried at once up to `max_invalid_replies` replies, then returned as a failed
  `Judgment` (`malformed`, `partition_violation`, `inconsistent_verdict`).
  Refusals, truncated replies and other 4xx are returned as failed at once.
* It raises nothing else for a judge problem. Every call it made is in
  `Judgment.calls` with tokens (None when the provider omits usage), latency
  and USD cost (None when the model has no price).

openai exceptions are caught here and nowhere else (STYLE.md §2).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import httpx2
import openai
from pydantic import ValidationError

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
from service.judge.prompt import PROMPT_VERSION, build_messages, prompt_fingerprint
from service.judge.retry_after import retry_after_seconds
from service.model import RagTrace

__all__ = ["LlmJudge"]

_NO_KEY = "ragmon-no-key"  # local endpoints (vLLM, Ollama) ignore the key, but the SDK wants one
_INVALID_REPLY: frozenset[FailureReason] = frozenset(
    {"malformed", "partition_violation", "inconsistent_verdict"}
)
_RETRY_STATUS: Mapping[int, FailureReason] = {
    408: "timeout",
    429: "rate_limited",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


@dataclass(frozen=True, slots=True)
class _Reply:
    status: Literal["ok"] | FailureReason
    http_status: int | None = None
    verdict: Verdict | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_reported: bool = False
    retry_after_s: float | None = None


def _retry_after(headers: httpx2.Headers) -> float | None:
    """The delay the server asked for, in seconds: `retry-after-ms`, else `Retry-After` (seconds or date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    return retry_after_seconds(headers.get("retry-after"))


def _usage(body: object) -> tuple[int | None, int | None, bool]:
    """(prompt tokens, completion tokens, reported) from a raw reply body, tolerant of anything."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None, None, False
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None, None, False
    return prompt, completion, True


_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL | re.IGNORECASE)


def _json_in_prose(body: object) -> str | None:
    """The JSON object a reply's text holds inside prose (a ```json fence, else the span from the
    first `{` to the last `}`), when the text is not JSON itself; None when there is none."""
    try:
        content = body["choices"][0]["message"]["content"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(content, str):
        return None
    try:
        json.loads(content)
        return None  # JSON already: what is wrong with it is not the prose around it
    except ValueError:
        pass
    fenced = _FENCED.search(content)
    if fenced:
        return fenced.group(1)
    start, end = content.find("{"), content.rfind("}")
    return content[start : end + 1] if 0 <= start < end else None


def _invalid_reason(exc: ValidationError) -> FailureReason:
    types = {err["type"] for err in exc.errors()}
    if "partition_violation" in types:
        return "partition_violation"
    if "inconsistent_verdict" in types:
        return "inconsistent_verdict"
    return "malformed"


def _fit_context(chunks: list[str], max_chars: int) -> list[str]:
    # Retrievers rank best first, so the tail is what we can best afford to lose.
    kept: list[str] = []
    left = max_chars
    for chunk in chunks:
        if left <= 0:
            break
        kept.append(chunk[:left])
        left -= len(chunk)
    return kept


class LlmJudge:
    """The faithfulness judge that asks an OpenAI-compatible model (see the module docstring).

    Safe to share between concurrent tasks; `aclose` releases the HTTP pool.
    """

    def __init__(
        self,
        config: JudgeConfig | None = None,
        *,
        cost_fn: CostFn | None = None,
        rng: random.Random | None = None,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        """`client` replaces the SDK client built from `config` (a custom transport or proxy); its own
        retries should be off, since the judge counts and paces its retries itself."""
        self.config = config or JudgeConfig()
        if cost_fn is None:
            from service.conventions.pricing import PriceTable

            cost_fn = PriceTable.default().cost
        self._cost_fn = cost_fn
        self._rng = rng or random.Random()
        self._version = f"llm/{self.config.model}/p{PROMPT_VERSION}-{prompt_fingerprint()}"
        if client is not None:
            self._client = client
            return
        api_key = self.config.api_key.get_secret_value() if self.config.api_key else None
        if api_key is None and not os.environ.get("OPENAI_API_KEY") and self.config.endpoint_configured():
            api_key = _NO_KEY
        timeout = httpx2.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
        try:
            self._client = openai.AsyncOpenAI(
                api_key=api_key,
                base_url=self.config.base_url,
                timeout=timeout,
                max_retries=0,  # retries are ours: they must be counted and reasoned about
                http_client=httpx2.AsyncClient(
                    timeout=timeout,
                    limits=httpx2.Limits(
                        max_connections=self.config.max_connections,
                        max_keepalive_connections=self.config.max_connections,
                    ),
                ),
            )
        except openai.OpenAIError as exc:
            raise ValueError(f"judge endpoint is not configured: {exc}") from exc

    @property
    def name(self) -> JudgeName:
        return "llm"

    @property
    def version(self) -> str:
        """Changes with the model and the prompt, so results are keyed per (trace, version)."""
        return self._version

    async def aclose(self) -> None:
        await self._client.close()

    async def judge(self, trace: RagTrace) -> Judgment:
        """Judge one trace in one model call (more only for retries). See the module docstring."""
        started, judged_at = time.perf_counter(), datetime.now(UTC)

        def failed(reason: FailureReason, calls: tuple[JudgeCall, ...]) -> Judgment:
            return Judgment.failed(
                trace,
                reason,
                judge="llm",
                judge_version=self._version,
                judge_model=self.config.model,
                calls=calls,
                latency_s=time.perf_counter() - started,
                judged_at=judged_at,
            )

        if not trace.answer or not trace.answer.strip():
            return failed("no_answer", ())
        chunks = trace.retrieval.context
        texts = [c.content for c in chunks if c.content]
        if chunks and not texts:
            return failed("no_context", ())
        messages = build_messages(
            trace.query or "", _fit_context(texts, self.config.max_context_chars), trace.answer
        )

        calls: list[JudgeCall] = []
        unavailable = invalid = 0
        waited = 0.0
        while True:
            call_start = time.perf_counter()
            reply = await self._call(messages)
            calls.append(self._record(len(calls) + 1, reply, waited, time.perf_counter() - call_start))
            if reply.verdict is not None:
                # in a thread: the diagnosis evidence reads the whole context
                return await asyncio.to_thread(
                    Judgment.from_verdict,
                    trace,
                    reply.verdict,
                    judge="llm",
                    judge_version=self._version,
                    judge_model=self.config.model,
                    calls=tuple(calls),
                    latency_s=time.perf_counter() - started,
                    judged_at=judged_at,
                )
            reason: FailureReason = reply.status if reply.status != "ok" else "malformed"
            if reason in _INVALID_REPLY:
                invalid += 1
                if invalid >= self.config.max_invalid_replies:
                    return failed(reason, tuple(calls))
                waited = 0.0  # the endpoint answered; a bad reply needs no pause
            elif reason in TRANSIENT_REASONS:
                unavailable += 1
                too_long = (
                    reply.retry_after_s is not None and reply.retry_after_s > self.config.max_retry_after_s
                )
                if unavailable >= self.config.max_attempts or too_long:
                    return self._unavailable(reason, reply.retry_after_s, unavailable, failed, tuple(calls))
                waited = self._backoff(unavailable, reply.retry_after_s)
            else:
                return failed(reason, tuple(calls))
            await asyncio.sleep(waited)

    def _unavailable(
        self,
        reason: FailureReason,
        retry_after_s: float | None,
        attempts: int,
        failed: Callable[[FailureReason, tuple[JudgeCall, ...]], Judgment],
        calls: tuple[JudgeCall, ...],
    ) -> Judgment:
        if self.config.when_unavailable == "record":
            return failed(reason, calls)
        retry_after = retry_after_s if retry_after_s is not None else self._backoff(attempts, None)
        raise JudgeUnavailable(
            f"judge endpoint unavailable after {attempts} attempt(s): {reason}",
            reason=reason,
            retry_after_s=retry_after,
        )

    def _backoff(self, failures: int, retry_after_s: float | None) -> float:
        """Full-jitter exponential delay; never earlier than the server asked, with a little spread."""
        cap = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (failures - 1))
        delay = self._rng.uniform(0, cap)
        if retry_after_s is not None:
            # Everyone told "retry after N s" must not come back at the same instant.
            delay = max(delay, retry_after_s * (1 + self._rng.uniform(0, 0.2)))
        return delay

    def _record(self, attempt: int, reply: _Reply, waited: float, latency: float) -> JudgeCall:
        cost = None
        if reply.prompt_tokens is not None and reply.completion_tokens is not None:
            cost = self._cost_fn(self.config.model, reply.prompt_tokens, reply.completion_tokens)
        return JudgeCall(
            attempt=attempt,
            status=reply.status,
            http_status=reply.http_status,
            waited_s=waited,
            latency_s=latency,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            usage_reported=reply.usage_reported,
            cost_usd=cost,
        )

    async def _call(self, messages: list[Any]) -> _Reply:
        """One request; every way it can end becomes a `_Reply`, never an exception."""
        try:
            raw = await self._client.chat.completions.with_raw_response.parse(
                model=self.config.model,
                messages=messages,
                response_format=Verdict,
                temperature=0,
                max_completion_tokens=self.config.max_completion_tokens,
            )
        except openai.APITimeoutError:
            return _Reply("timeout")
        except openai.APIConnectionError:
            return _Reply("connection_error")
        except openai.APIStatusError as exc:
            code = exc.status_code
            return _Reply(
                _RETRY_STATUS.get(code, "rejected"),
                http_status=code,
                retry_after_s=_retry_after(exc.response.headers),
            )
        http_status = raw.http_response.status_code
        try:
            completion = raw.parse()
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            usage = exc.completion.usage if exc.completion is not None else None
            return _Reply(
                "truncated" if isinstance(exc, openai.LengthFinishReasonError) else "refused",
                http_status=http_status,
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
                usage_reported=usage is not None,
            )
        except ValidationError as exc:
            body = self._body(raw.http_response)
            reason = _invalid_reason(exc)
            inside = _json_in_prose(body)
            if inside is not None:
                try:
                    return _Reply("ok", http_status, Verdict.model_validate_json(inside), *_usage(body))
                except ValidationError as again:
                    reason = _invalid_reason(again)
            return _Reply(reason, http_status, None, *_usage(body))
        except (ValueError, TypeError, AttributeError, KeyError, IndexError):
            # A 200 whose body is not a chat completion at all.
            return _Reply("malformed", http_status, None, *_usage(self._body(raw.http_response)))
        usage = completion.usage
        tokens = (usage.prompt_tokens, usage.completion_tokens, True) if usage else (None, None, False)
        if not completion.choices:
            return _Reply("malformed", http_status, None, *tokens)
        message = completion.choices[0].message
        if message.refusal:
            return _Reply("refused", http_status, None, *tokens)
        if message.parsed is None:
            return _Reply("malformed", http_status, None, *tokens)
        return _Reply("ok", http_status, message.parsed, *tokens)

    @staticmethod
    def _body(response: httpx2.Response) -> object:
        try:
            return response.json()
        except ValueError:
            return None
