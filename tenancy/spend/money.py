"""Money as integers: micro-units (1e-6 of the currency), never floats.

A price is a number of micro-units per 1M tokens, for uncached prompt tokens, cached prompt
tokens and completion tokens. A request's cost is

    ceil((uncached * prompt + cached * cached_price + completion * completion_price) / 1e6)

micro-units: the three products are summed exactly (in 1e-12 of the currency) and rounded
once, up, on the request's total. Rounding up means a budget never under-counts and a request
that costs anything never costs 0; it adds under one micro-unit a request, far below a cent.
Cached tokens are part of the prompt tokens (OpenAI's `prompt_tokens_details.cached_tokens`).

The worst case that admission reserves prices every prompt token at the dearer of the prompt and
the cached price and every token the request may generate at the completion price, so the cost
settled is never above the cost reserved (the cost is monotone in each count).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

MICROS_PER_UNIT = 1_000_000
TOKENS_PER_PRICE = 1_000_000  # prices are per 1M tokens


@dataclass(frozen=True)
class Price:
    """Micro-units per 1M tokens. The zero price (nothing set) makes every request cost 0."""

    prompt_micros_per_mtok: int = 0
    cached_micros_per_mtok: int = 0
    completion_micros_per_mtok: int = 0

    def __post_init__(self) -> None:
        for name in (
            "prompt_micros_per_mtok",
            "cached_micros_per_mtok",
            "completion_micros_per_mtok",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @property
    def is_free(self) -> bool:
        return self == Price()


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def cost_micros(
    price: Price, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int
) -> int:
    """What one request costs, in micro-units (rounded up once; see the module docstring)."""
    if not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError("cached_tokens must be between 0 and prompt_tokens")
    if completion_tokens < 0:
        raise ValueError("completion_tokens must not be negative")
    exact = (
        (prompt_tokens - cached_tokens) * price.prompt_micros_per_mtok
        + cached_tokens * price.cached_micros_per_mtok
        + completion_tokens * price.completion_micros_per_mtok
    )
    return _ceil_div(exact, TOKENS_PER_PRICE)


def worst_case_micros(price: Price, *, prompt_tokens: int, max_completion_tokens: int) -> int:
    """The most a request can cost: what admission reserves against a currency budget."""
    dearest_prompt = max(price.prompt_micros_per_mtok, price.cached_micros_per_mtok)
    exact = (
        prompt_tokens * dearest_prompt + max_completion_tokens * price.completion_micros_per_mtok
    )
    return _ceil_div(exact, TOKENS_PER_PRICE)


def to_micros(amount: Decimal | int | str, *, field: str) -> int:
    """A decimal amount of the currency (`"0.15"`) as micro-units, exactly; more than six
    decimals, a negative, NaN or infinity is a ValueError naming the field."""
    try:
        value = Decimal(str(amount))
    except InvalidOperation as exc:
        raise ValueError(f"{field}: not a decimal number") from exc
    if not value.is_finite():
        raise ValueError(f"{field}: must be a finite number")
    if value < 0:
        raise ValueError(f"{field}: must not be negative")
    micros = value * MICROS_PER_UNIT
    if micros != micros.to_integral_value():
        raise ValueError(f"{field}: at most 6 decimal places (micro-units of the currency)")
    return int(micros)


def from_micros(micros: int) -> Decimal:
    """Micro-units as an exact decimal amount of the currency, six places: 1500 -> 0.001500."""
    return (Decimal(micros) / MICROS_PER_UNIT).quantize(Decimal("0.000001"))
