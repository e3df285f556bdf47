"""Tests for `service/conventions/pricing.py`: the shipped table, name matching, overrides, cost."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from service.conventions.pricing import ModelPrice, PriceTable, model_name_candidates

REQUIRED_MODELS = [
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "o1",
    "o3",
    "o3-mini",
    "o4-mini",
    "text-embedding-3-small",
    "text-embedding-3-large",
    "claude-3-5-sonnet",
    "claude-3-7-sonnet",
    "claude-sonnet-4",
    "claude-3-5-haiku",
    "claude-haiku-4-5",
]


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.default()


def test_shipped_table_is_dated_and_covers_common_models(table: PriceTable) -> None:
    raw = json.loads(resources.files("service.conventions").joinpath("prices.json").read_text("utf-8"))
    assert table.as_of == raw["as_of"]
    assert len(table) == len(raw["models"])
    for model in REQUIRED_MODELS:
        price = table.price(model)
        assert price is not None, model
        assert price.input_usd_per_mtok > 0, model
    # Chat models charge more per output token than per input token; embeddings charge no output.
    for model in ("gpt-4o", "gpt-4.1-mini", "claude-sonnet-4", "o4-mini"):
        price = table.price(model)
        assert price is not None and price.output_usd_per_mtok > price.input_usd_per_mtok
    embedding = table.price("text-embedding-3-small")
    assert embedding is not None and embedding.output_usd_per_mtok == 0


@pytest.mark.parametrize(
    ("sent", "row"),
    [
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("GPT-4o-Mini", "gpt-4o-mini"),
        ("  gpt-4o  ", "gpt-4o"),
        ("openai/gpt-4o", "gpt-4o"),
        ("gpt-4-0613", "gpt-4"),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("anthropic/claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("us.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet"),
        ("anthropic.claude-3-haiku-20240307-v1:0", "claude-3-haiku"),
        ("claude-3-5-sonnet-v2@20241022", "claude-3-5-sonnet"),
        ("models/gemini-1.5-pro-002", "gemini-1.5-pro"),
    ],
)
def test_snapshots_and_prefixes_resolve_to_their_family(table: PriceTable, sent: str, row: str) -> None:
    assert table.resolve(sent) == row
    assert sent in table


def test_a_snapshot_with_its_own_row_keeps_its_own_price(table: PriceTable) -> None:
    assert table.resolve("gpt-4o-2024-05-13") == "gpt-4o-2024-05-13"
    assert table.price("gpt-4o-2024-05-13") != table.price("gpt-4o")


@pytest.mark.parametrize(
    "sent", ["gpt-4o-mini-search-preview", "ft:gpt-4o-mini-2024-07-18:acme::abc", "my-local-llama", "", "gpt"]
)
def test_near_names_are_not_guessed(table: PriceTable, sent: str) -> None:
    assert table.resolve(sent) is None
    assert table.cost(sent, 1000, 1000) is None
    assert sent not in table


def test_candidates_go_from_specific_to_general() -> None:
    names = model_name_candidates("us.anthropic.claude-3-5-sonnet-20241022-v2:0")
    assert names[0] == "us.anthropic.claude-3-5-sonnet-20241022-v2:0"
    assert names.index("claude-3-5-sonnet-20241022") < names.index("claude-3-5-sonnet")


def test_cost_is_linear_in_tokens_and_uses_both_prices(table: PriceTable) -> None:
    price = table.price("gpt-4o-mini")
    assert price is not None
    one_m_in = table.cost("gpt-4o-mini", 1_000_000, 0)
    one_m_out = table.cost("gpt-4o-mini", 0, 1_000_000)
    assert one_m_in is not None and one_m_out is not None
    assert one_m_in == pytest.approx(price.input_usd_per_mtok)
    assert one_m_out == pytest.approx(price.output_usd_per_mtok)
    both = table.cost("gpt-4o-mini-2024-07-18", 1234, 567)
    assert both == pytest.approx((1234 * one_m_in + 567 * one_m_out) / 1e6)
    assert table.cost("gpt-4o-mini", 0, 0) == 0


def test_overrides_win_and_extend(table: PriceTable) -> None:
    custom = table.with_overrides({"GPT-4o": (1.0, 2.0), "acme-llm": [0.5, 0.5]})
    assert custom.price("gpt-4o-2024-08-06") == ModelPrice(1.0, 2.0)
    assert custom.cost("acme-llm", 2_000_000, 0) == pytest.approx(1.0)
    assert table.price("gpt-4o") != ModelPrice(1.0, 2.0), "the original table is unchanged"
    assert len(custom) == len(table) + 1
    via_default = PriceTable.default({"acme-llm": (3.0, 4.0)})
    assert via_default.price("acme-llm") == ModelPrice(3.0, 4.0)


@pytest.mark.parametrize(
    ("prices", "error"),
    [
        ({"m": (-1.0, 1.0)}, ValueError),
        ({"m": (float("nan"), 1.0)}, ValueError),
        ({"m": (1.0,)}, ValueError),
        ({"m": "1,2"}, ValueError),
        ({"m": ("1", 2.0)}, TypeError),
        ({"": (1.0, 1.0)}, ValueError),
    ],
)
def test_bad_prices_are_refused(prices: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        PriceTable(prices)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tokens", "error"), [((-1, 0), ValueError), ((1.5, 0), TypeError), ((True, 0), TypeError)]
)
def test_bad_token_counts_are_refused(
    table: PriceTable, tokens: tuple[object, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        table.cost("gpt-4o", *tokens)  # type: ignore[arg-type]


def test_lookups_stay_correct_past_the_cache_bound() -> None:
    table = PriceTable({"base": (1.0, 1.0)})
    for i in range(5000):
        assert table.resolve(f"unknown-{i}") is None
    assert table.resolve("base-latest") == "base"
