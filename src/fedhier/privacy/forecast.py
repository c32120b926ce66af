"""A utility forecast of a private fit, from public quantities only (before any data is read).

A private fit learns from released statistics ("blocks").  For a block of ``dim`` coordinates
whose noiseless value has norm at most ``signal`` and whose pooled estimate (averaged over the
sites and, for an iterative fit, over the rounds) carries independent noise of standard
deviation ``noise_sd`` per coordinate, the best linear shrinkage of the noisy estimate keeps the
fraction

.. math::  \\rho = \\frac{s^2}{s^2 + D\\,\\tau^2}

of the signal (s = ``signal``, D = ``dim``, τ = ``noise_sd``): ρ near 1 when the noise is
small against the signal, near 0 when the model can only fall back on its public prior.  The
forecast is the ``weight``-averaged ρ of the blocks a model's predictions rest on
(:func:`forecast`); a model adapter (e.g. :func:`fedhier.models.mvppca.forecast.mvppca_forecast`)
turns its shapes and privacy settings into blocks.  Nothing here reads data: ``signal``,
``dim`` and ``noise_sd`` follow from the widths of the views, the number of sites and subjects,
the rounds and the budget.

The private model is expected to beat the training mean when at least half of the signal is kept
(ρ >= :data:`THRESHOLD`).  The threshold was checked against measured fits (``python
benchmarks/private_utility.py``, which prints the forecast beside each cell's test MAE and the
training mean's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Block", "Forecast", "forecast", "THRESHOLD"]

#: kept fraction from which the private model is expected to beat the training mean (half the signal)
THRESHOLD = 0.5


@dataclass(frozen=True)
class Block:
    """One released statistic: ``dim`` coordinates, norm at most ``signal``, pooled noise sd ``noise_sd`` per coordinate."""

    name: str
    dim: int
    signal: float
    noise_sd: float
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.dim < 1 or not (self.signal > 0 and math.isfinite(self.signal)):
            raise ValueError(f"block {self.name!r}: dim must be at least 1 and signal positive, got {self.dim}, {self.signal}")
        if not (self.noise_sd >= 0 and math.isfinite(self.noise_sd)) or not self.weight > 0:
            raise ValueError(f"block {self.name!r}: noise_sd must be finite and at least 0 and weight positive")

    @property
    def kept(self) -> float:
        """ρ = s² / (s² + D τ²): the fraction of the signal a shrinkage estimate keeps."""
        return self.signal ** 2 / (self.signal ** 2 + self.dim * self.noise_sd ** 2)


@dataclass(frozen=True)
class Forecast:
    """The forecast: the kept fraction of every block, their weighted mean and the verdict."""

    blocks: tuple[Block, ...]
    kept: float
    threshold: float

    @property
    def beats_mean(self) -> bool:
        """Whether the private model is expected to predict better than each feature's training mean."""
        return self.kept >= self.threshold

    def line(self) -> str:
        """One line for a user: the kept fraction and what it predicts."""
        worst = min(self.blocks, key=lambda b: b.kept)
        verdict = ("expected to beat the training mean" if self.beats_mean else
                   "not expected to beat the training mean (a model that predicts each feature's mean)")
        least = f" (least in {worst.name}: {_percent(worst.kept)})" if len(self.blocks) > 1 else ""
        return (f"utility forecast: the noise leaves {_percent(self.kept)} of the signal the fit learns from{least}; "
                f"the private model is {verdict}")


def _percent(fraction: float) -> str:
    return "under 1%" if fraction < 0.005 else f"about {fraction:.0%}"


def forecast(blocks: Sequence[Block], threshold: float = THRESHOLD) -> Forecast:
    """The weighted mean of the blocks' kept fractions, against ``threshold`` (module docstring)."""
    blocks = tuple(blocks)
    if not blocks:
        raise ValueError("a forecast needs at least one released block")
    kept = sum(b.weight * b.kept for b in blocks) / sum(b.weight for b in blocks)
    return Forecast(blocks, kept, threshold)
