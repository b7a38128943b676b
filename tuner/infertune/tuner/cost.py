"""What a token costs: the `cost-per-token` objective and the report's cost figures.

cost per output token = GPUs per replica x price per GPU-hour / (output tokens/s at the SLO x 3600)

The price comes from the operator (spec.hardware.gpuHourlyPrice, else the chart's price for the GPU
product) or `infertune tune --gpu-hourly-price`. With no price known the objective is GPU-hours per
million output tokens: the same ranking as output tokens/s per GPU, said as such.

Torch-free and free of the rest of the tuner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from infertune.tuner.gpu_identity import same_product

ANY_PRODUCT = "*"
MILLION = 1_000_000
TOKENS_PER_S = "outputTokensPerSecond"  # the figure the tuner measures (trial.FIGURE_KEYS)


@dataclass(frozen=True)
class CostBasis:
    """What one replica costs per hour: `gpus` x `hourly_price` (USD per GPU-hour, None unknown)."""

    gpus: int = 1
    hourly_price: float | None = None
    product: str | None = None

    @property
    def known(self) -> bool:
        return self.hourly_price is not None

    def gpu_hours_per_million(self, tokens_per_s: float | None) -> float:
        """GPU-hours per million output tokens (inf when nothing was produced)."""
        if tokens_per_s is None or tokens_per_s <= 0:
            return math.inf
        return max(1, self.gpus) * MILLION / (tokens_per_s * 3600)

    def per_million(self, tokens_per_s: float | None) -> float | None:
        """USD per million output tokens, or None when the price is unknown."""
        if self.hourly_price is None:
            return None
        hours = self.gpu_hours_per_million(tokens_per_s)
        return None if math.isinf(hours) else hours * self.hourly_price

    def objective(self, figures: Mapping[str, float]) -> float:
        """The value the cost-per-token study minimises: USD per million output tokens, or
        GPU-hours per million output tokens when the price is unknown."""
        hours = self.gpu_hours_per_million(figures.get(TOKENS_PER_S))
        return hours if self.hourly_price is None else hours * self.hourly_price

    @property
    def unit(self) -> str:
        if self.hourly_price is None:
            return "GPU-hours per 1M output tokens (GPU price unknown: ranked by tokens/s per GPU)"
        return (
            f"USD per 1M output tokens ({max(1, self.gpus)} GPU x "
            f"${self.hourly_price:g}/GPU-hour{f' for {self.product}' if self.product else ''})"
        )


def parse_prices(items: Iterable[str]) -> dict[str, float]:
    """`PRODUCT=USD` (either spelling of the product) or a bare `USD` for any product."""
    out: dict[str, float] = {}
    for item in items:
        product, sep, price = item.rpartition("=")
        key = product.strip() if sep else ANY_PRODUCT
        try:
            value = float(price)
        except ValueError:
            raise ValueError(f"GPU price {item!r}: write PRODUCT=USD or USD") from None
        if not math.isfinite(value) or value < 0 or not key:
            raise ValueError(f"GPU price {item!r}: write PRODUCT=USD or USD (USD >= 0)")
        out[key] = value
    return out


def price_for(prices: Mapping[str, float], product: str | None) -> float | None:
    """The price of `product` (matched in either spelling), else the any-product price."""
    if product:
        for key, value in prices.items():
            if key != ANY_PRODUCT and same_product(key, product):
                return value
    return prices.get(ANY_PRODUCT)


def cost_basis(prices: Mapping[str, float], product: str | None, gpus: int) -> CostBasis:
    return CostBasis(gpus=max(1, gpus), hourly_price=price_for(prices, product), product=product)


__all__ = ["ANY_PRODUCT", "CostBasis", "cost_basis", "parse_prices", "price_for"]
