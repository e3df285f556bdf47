"""Token usage and cost of the model calls in one trace, one row per (model, kind).

`span_call` reads one span's call: tokens in and out (a total stands in for
a missing input count; when one count is reported, the other missing one is
0), the app's own cost when it sent one (it wins), else the price table's,
else "unpriced"; an LLM call with a model but no token counts and no cost is
"unknown_usage": its tokens are None (unknown), and it is never priced at 0.
A call one of whose token counts ingest dropped (out of range:
`RagmonAttributes.DROPPED`) is "unpriced" or "unknown_usage", never priced on
the counts that are left. `usage_rows` sums calls per model and kind; a row's
token count is None when any call's is, and the row is "unpriced" (or
"unknown_usage") when any of its calls is, so neither a count nor a cost is
ever understated. Nesting (which calls count) is the caller's rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from openinference.semconv.trace import RerankerAttributes, SpanAttributes

from service.conventions.attribute_values import first_count, first_text, number
from service.conventions.attributes import GenAIAttributes, RagmonAttributes, TraceloopAttributes
from service.conventions.pricing import PriceTable
from service.conventions.spans import Attributes, Span
from service.model import CostSource, sum_counts

__all__ = ["Call", "UsageKind", "call_cost", "span_call", "usage_rows"]

UsageKind = Literal["llm", "embedding", "reranker"]
_GENERIC_MODEL_KEYS = (
    GenAIAttributes.RESPONSE_MODEL,
    GenAIAttributes.REQUEST_MODEL,
    SpanAttributes.LLM_RESPONSE_MODEL_NAME,
    SpanAttributes.LLM_REQUEST_MODEL_NAME,
)
_MODEL_KEYS: dict[UsageKind, tuple[str, ...]] = {
    "llm": (SpanAttributes.LLM_MODEL_NAME, *_GENERIC_MODEL_KEYS),
    "embedding": (SpanAttributes.EMBEDDING_MODEL_NAME, *_GENERIC_MODEL_KEYS),
    "reranker": (RerankerAttributes.RERANKER_MODEL_NAME, *_GENERIC_MODEL_KEYS),
}
_INPUT_TOKEN_KEYS = (
    SpanAttributes.LLM_TOKEN_COUNT_PROMPT,
    GenAIAttributes.USAGE_INPUT_TOKENS,
    GenAIAttributes.USAGE_PROMPT_TOKENS,
)
_OUTPUT_TOKEN_KEYS = (
    SpanAttributes.LLM_TOKEN_COUNT_COMPLETION,
    GenAIAttributes.USAGE_OUTPUT_TOKENS,
    GenAIAttributes.USAGE_COMPLETION_TOKENS,
)
_TOTAL_TOKEN_KEYS = (SpanAttributes.LLM_TOKEN_COUNT_TOTAL, TraceloopAttributes.USAGE_TOTAL_TOKENS)
_TOKEN_KEYS = frozenset((*_INPUT_TOKEN_KEYS, *_OUTPUT_TOKEN_KEYS, *_TOTAL_TOKEN_KEYS))


@dataclass(slots=True)
class Call:
    """One model call as a span reports it."""

    model: str
    kind: UsageKind
    input_tokens: int | None  # None: the call reported no token counts at all
    output_tokens: int | None
    cost: float | None
    source: CostSource


def span_call(span: Span, kind: UsageKind, prices: PriceTable) -> Call | None:
    a = span.attributes
    input_tokens = first_count(a, *_INPUT_TOKEN_KEYS)
    output_tokens = first_count(a, *_OUTPUT_TOKEN_KEYS)
    total = first_count(a, *_TOTAL_TOKEN_KEYS)
    split_known = input_tokens is not None or kind == "embedding" or output_tokens is not None
    if _lost_a_count(a):  # ingest dropped a count out of range: pricing what is left would understate
        split_known = False
    if input_tokens is None and total is not None:
        input_tokens = max(total - (output_tokens or 0), 0)
    app_cost = number(a.get(SpanAttributes.LLM_COST_TOTAL))
    if app_cost is None:
        prompt_cost = number(a.get(SpanAttributes.LLM_COST_PROMPT))
        completion_cost = number(a.get(SpanAttributes.LLM_COST_COMPLETION))
        if prompt_cost is not None or completion_cost is not None:
            app_cost = (prompt_cost or 0.0) + (completion_cost or 0.0)
    has_usage = input_tokens is not None or output_tokens is not None or app_cost is not None
    model = first_text(a, *_MODEL_KEYS[kind])
    if not has_usage and (kind != "llm" or model is None):
        return None
    cost, source = call_cost(model, input_tokens, output_tokens, app_cost, prices, split_known=split_known)
    if input_tokens is None and output_tokens is None:
        return Call(model or "unknown", kind, None, None, cost, source)
    return Call(model or "unknown", kind, input_tokens or 0, output_tokens or 0, cost, source)


def _lost_a_count(attributes: Attributes) -> bool:
    """Whether ingest dropped one of the span's token counts (`RagmonAttributes.DROPPED`)."""
    dropped = attributes.get(RagmonAttributes.DROPPED)
    return isinstance(dropped, list) and any(key in _TOKEN_KEYS for key in dropped)


def call_cost(
    model: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
    app_cost: float | None,
    prices: PriceTable,
    *,
    split_known: bool = True,
) -> tuple[float | None, CostSource]:
    """One call's cost and where it came from, for spans and the JSON API alike.

    The app's own cost wins; else the price table's for the tokens reported (None token counts:
    not reported); a call that reported neither tokens nor a cost is "unknown_usage", never
    priced at 0; the rest (no model, no price, only a total of tokens) is "unpriced".
    """
    if app_cost is not None and app_cost >= 0:
        return float(app_cost), "app"
    tokens_known = input_tokens is not None or output_tokens is not None
    if model is not None and tokens_known and split_known:
        cost = prices.cost(model, input_tokens or 0, output_tokens or 0)
        return cost, "price_table" if cost is not None else "unpriced"
    if not tokens_known and app_cost is None:
        return None, "unknown_usage"
    return None, "unpriced"


def usage_rows(calls: Iterable[Call]) -> list[dict[str, Any]]:
    """`ModelUsage` fields per (model, kind), summed over the calls."""
    grouped: dict[tuple[str, str], list[Call]] = {}
    for call in calls:
        grouped.setdefault((call.model, call.kind), []).append(call)
    usage: list[dict[str, Any]] = []
    for (model, _), group in grouped.items():
        sources = {c.source for c in group}
        source: CostSource
        cost: float | None = None
        if "unpriced" in sources:
            source = "unpriced"
        elif "unknown_usage" in sources:
            source = "unknown_usage"
        else:
            cost = sum(c.cost or 0.0 for c in group)
            source = "app" if sources == {"app"} else "price_table"
        usage.append(
            {
                "model": model,
                "kind": group[0].kind,
                "input_tokens": sum_counts(c.input_tokens for c in group),
                "output_tokens": sum_counts(c.output_tokens for c in group),
                "cost_usd": cost,
                "cost_source": source,
            }
        )
    return usage
