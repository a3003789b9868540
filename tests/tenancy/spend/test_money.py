"""The cost arithmetic (tenancy/spend/money.py): exact integers in micro-units, one rounding,
up, on a request's total; the worst case admission reserves is never below the cost settled."""

from __future__ import annotations

import random
from decimal import ROUND_CEILING, Decimal

import pytest

from tenancy.spend.money import (
    Price,
    cost_micros,
    from_micros,
    to_micros,
    worst_case_micros,
)
from tenancy.spend.schemas import PriceSpec


def _reference(price: Price, prompt: int, cached: int, completion: int) -> int:
    """The same cost by Decimal arithmetic in the currency, rounded up to the micro-unit."""
    per_token = {
        "p": Decimal(price.prompt_micros_per_mtok) / 10**12,
        "k": Decimal(price.cached_micros_per_mtok) / 10**12,
        "c": Decimal(price.completion_micros_per_mtok) / 10**12,
    }
    amount = (
        (prompt - cached) * per_token["p"] + cached * per_token["k"] + completion * per_token["c"]
    )
    return int((amount * 10**6).to_integral_value(rounding=ROUND_CEILING))


def test_a_request_costs_its_tokens_times_the_prices_rounded_up_once() -> None:
    # $0.15 / $0.075 / $0.60 per 1M tokens
    price = PriceSpec(
        prompt=Decimal("0.15"), cached=Decimal("0.075"), completion=Decimal("0.6")
    ).to_price()
    assert price == Price(150_000, 75_000, 600_000)
    # 1000 prompt (400 cached) + 500 completion = 600*0.15 + 400*0.075 + 500*0.6 per 1M
    # = 90,000,000 + 30,000,000 + 300,000,000 (1e-12) = 420 micro-units exactly
    assert cost_micros(price, prompt_tokens=1000, cached_tokens=400, completion_tokens=500) == 420
    # one token: 0.15 micro-units, rounded up to 1 (a request that costs anything is never free)
    assert cost_micros(price, prompt_tokens=1, cached_tokens=0, completion_tokens=0) == 1
    # rounded once on the total, not per kind: 5 x 0.15 + 1 x 0.075 = 0.825 -> 1, where rounding
    # each kind up would give 1 + 1 = 2
    assert cost_micros(price, prompt_tokens=6, cached_tokens=1, completion_tokens=0) == 1
    assert cost_micros(Price(), prompt_tokens=10**6, cached_tokens=0, completion_tokens=10**6) == 0


def test_against_decimal_arithmetic_and_the_worst_case_bound() -> None:
    rng = random.Random(45)
    for _ in range(2000):
        price = Price(rng.randrange(0, 10**10), rng.randrange(0, 10**10), rng.randrange(0, 10**10))
        prompt = rng.randrange(0, 200_000)
        cached = rng.randrange(0, prompt + 1)
        max_completion = rng.randrange(0, 50_000)
        completion = rng.randrange(0, max_completion + 1)
        cost = cost_micros(
            price, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion
        )
        assert cost == _reference(price, prompt, cached, completion)
        worst = worst_case_micros(price, prompt_tokens=prompt, max_completion_tokens=max_completion)
        assert cost <= worst  # what settlement charges never exceeds what admission reserved


def test_amounts_are_exact_or_refused_naming_the_field() -> None:
    assert to_micros("0.000001", field="prompt") == 1
    assert to_micros(Decimal("1234.567891"), field="prompt") == 1_234_567_891
    assert to_micros(12, field="budget") == 12_000_000
    assert from_micros(1_500) == Decimal("0.001500") and str(from_micros(1_500)) == "0.001500"
    for bad, reason in (("0.0000001", "6 decimal places"), ("-1", "negative"), ("NaN", "finite"),
                        ("abc", "not a decimal")):  # fmt: skip
        with pytest.raises(ValueError, match=reason) as info:
            to_micros(bad, field="completion")
        assert str(info.value).startswith("completion:")
    with pytest.raises(ValueError, match="cached_tokens"):
        cost_micros(Price(1, 1, 1), prompt_tokens=1, cached_tokens=2, completion_tokens=0)
    with pytest.raises(ValueError, match="prompt_micros_per_mtok"):
        Price(-1, 0, 0)
