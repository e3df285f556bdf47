"""`PriceTable`: published list prices of models, and the cost of one call.

The shipped table (`prices.json` beside this module) holds USD per million
input and output tokens at the base tier: no long-context surcharge, batch or
prompt-cache discount. Its `as_of` date says when the numbers were copied
from the providers' price pages; operators override or extend it from config
(`pricing.overrides`), and an override always wins over the shipped row.

Model names are matched the way apps report them, and never guessed:

* case and surrounding blanks are ignored;
* a provider or path prefix is dropped (`openai/gpt-4o`, `models/gemini-1.5-pro`,
  Bedrock's `us.anthropic.claude-3-5-sonnet-20241022-v2:0`, Vertex's
  `claude-3-5-sonnet-v2@20241022`);
* a dated snapshot falls back to its family when the snapshot itself has no row
  (`gpt-4o-mini-2024-07-18` -> `gpt-4o-mini`, `claude-3-5-haiku-20241022` ->
  `claude-3-5-haiku`, `gpt-4-0613` -> `gpt-4`, `gemini-1.5-pro-002` ->
  `gemini-1.5-pro`, `...-latest`).

Nothing else matches: `gpt-4o-mini-search-preview` or a fine-tuned
`ft:gpt-4o-mini:...` is unpriced, because a near name is not the same price.
`cost` returns None for an unpriced model, so callers report "unpriced"
instead of a wrong number.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelPrice", "PriceTable", "model_name_candidates"]

_TABLE_FILE = "prices.json"
_CACHE_LIMIT = 4096

# Bedrock ids put an optional inference-profile region and the vendor in front.
_BEDROCK_PREFIX = re.compile(
    r"^(?:(?:us|eu|apac|us-gov|global)\.)?(?:anthropic|meta|amazon|cohere|mistral|ai21)\."
)
_BEDROCK_VERSION = re.compile(r"-v\d+(?::\d+)?$")
_SNAPSHOT_SUFFIXES = (
    re.compile(r"-\d{4}-\d{2}-\d{2}$"),  # OpenAI: gpt-4o-2024-08-06
    re.compile(r"-\d{8}$"),  # Anthropic: claude-3-5-sonnet-20241022
    re.compile(r"-\d{4}$"),  # OpenAI legacy: gpt-4-0613, gpt-3.5-turbo-0125
    re.compile(r"-\d{3}$"),  # Google: gemini-1.5-pro-002
    re.compile(r"-latest$"),
)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """List price of one model in USD per million tokens."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def __post_init__(self) -> None:
        for value in (self.input_usd_per_mtok, self.output_usd_per_mtok):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"a price must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"a price must be finite and >= 0, got {value!r}")


def model_name_candidates(model: str) -> list[str]:
    """The names tried for `model`, most specific first (see the module docstring)."""
    name = model.strip().lower()
    names = [name]
    base = name.rsplit("/", 1)[-1].split("@", 1)[0]
    base = _BEDROCK_PREFIX.sub("", base)
    for candidate in (base, _BEDROCK_VERSION.sub("", base)):
        if candidate and candidate not in names:
            names.append(candidate)
    for candidate in list(names):
        for suffix in _SNAPSHOT_SUFFIXES:
            stripped = suffix.sub("", candidate)
            if stripped and stripped != candidate and stripped not in names:
                names.append(stripped)
    return names


def _as_price(model: str, value: ModelPrice | Sequence[float]) -> ModelPrice:
    if isinstance(value, ModelPrice):
        return value
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"price of {model!r} must be [USD per 1M input tokens, USD per 1M output tokens]")
    return ModelPrice(value[0], value[1])


class PriceTable:
    """Model name -> `ModelPrice`, with snapshot- and prefix-tolerant lookup.

    Immutable after construction; `with_overrides` returns a new table.
    Lookups are cached (bounded), so pricing every call of every trace costs a
    dict hit after the first sight of a model name.
    """

    def __init__(
        self, prices: Mapping[str, ModelPrice | Sequence[float]], *, as_of: str | None = None
    ) -> None:
        table: dict[str, ModelPrice] = {}
        for model, value in prices.items():
            if not isinstance(model, str) or not model.strip():
                raise ValueError(f"model names must be non-empty strings, got {model!r}")
            table[model.strip().lower()] = _as_price(model, value)
        self._prices = table
        self.as_of = as_of
        self._resolved: dict[str, str | None] = {}

    @classmethod
    def default(cls, overrides: Mapping[str, ModelPrice | Sequence[float]] | None = None) -> PriceTable:
        """The shipped table, with `overrides` (config's `pricing.overrides`) applied on top."""
        raw: dict[str, Any] = json.loads((Path(__file__).parent / _TABLE_FILE).read_text("utf-8"))
        table = cls(raw["models"], as_of=raw.get("as_of"))
        return table.with_overrides(overrides) if overrides else table

    def with_overrides(self, overrides: Mapping[str, ModelPrice | Sequence[float]]) -> PriceTable:
        """A new table where every row of `overrides` replaces or adds to this one."""
        merged: dict[str, ModelPrice | Sequence[float]] = dict(self._prices)
        # Rows are normalized in insertion order, so an override spelled "GPT-4o" still wins.
        merged.update(overrides)
        return PriceTable(merged, as_of=self.as_of)

    def resolve(self, model: str) -> str | None:
        """The table row `model` is priced by, or None when it has none."""
        if model in self._resolved:
            return self._resolved[model]
        found = next((name for name in model_name_candidates(model) if name in self._prices), None)
        if len(self._resolved) >= _CACHE_LIMIT:
            self._resolved.clear()
        self._resolved[model] = found
        return found

    def price(self, model: str) -> ModelPrice | None:
        """The price `model` is charged at, or None when it is unpriced."""
        row = self.resolve(model)
        return None if row is None else self._prices[row]

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """USD for one call (or a sum of calls) of `model`; None when the model is unpriced."""
        for count in (input_tokens, output_tokens):
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"token counts must be integers, got {count!r}")
            if count < 0:
                raise ValueError(f"token counts must be >= 0, got {count}")
        price = self.price(model)
        if price is None:
            return None
        return (input_tokens * price.input_usd_per_mtok + output_tokens * price.output_usd_per_mtok) / 1e6

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.resolve(model) is not None

    def __len__(self) -> int:
        return len(self._prices)

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __repr__(self) -> str:
        return f"PriceTable({len(self._prices)} models, as_of={self.as_of!r})"
