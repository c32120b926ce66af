"""Where a site's secrets come from, and noise sampling on a lattice (no floating-point holes).

A site's DP noise, chunk masks and secret-sharing coefficients are drawn from a
:class:`NoiseSource`.  By default it reads the operating system's cryptographically secure
generator (``os.urandom``), at the site; nobody else knows a seed of it, and no file
stores one.  Only the insecure switch (``insecure_reproducible_noise``) builds a source
from a seed, so that a run can be repeated bit for bit; such a result is not private.

Noise is sampled on an integer lattice, never as a floating-point Gaussian or Laplace
draw.  Mironov (2012, "On significance of the least significant bits for differential
privacy") shows that the textbook floating-point samplers leave holes in the set of
outputs that reveal the input.  Here a value ``x`` with l2 (l1) sensitivity ``Delta`` is
released on the grid ``g = Delta 2^-24``:

    k = rint(x / g),   released = (k + N) g,   N ~ N_Z(0, sigma_Z^2)  (or Lap_Z(b_Z)),

with the discrete Gaussian ``N_Z`` (or discrete Laplace ``Lap_Z``) of Canonne, Kamath and
Steinke (2020, "The discrete Gaussian for differential privacy", Algorithms 1-3).  Every
lattice point can be output; the float ``(k + N) g`` is a one-to-one post-processing of
the integer ``k + N``.  Rounding moves two neighbouring values apart by at most
``Delta / g + sqrt(m)`` lattice steps in l2 (``Delta / g + m`` in l1) for ``m`` entries, so
the lattice noise is scaled to that sensitivity: ``sigma_Z = z (Delta / g + sqrt(m))``
(``b_Z = z (Delta / g + m)``).  The event a release records, ``GaussianDpEvent(z)`` or
``LaplaceDpEvent(z)``, then holds on the lattice:

* discrete Laplace: ``Lap_Z(b)`` with integer l1 sensitivity ``D`` is exactly
  ``D / b``-DP, as the continuous one (CKS 2020, Section 2.2);
* discrete Gaussian: ``N_Z(0, sigma^2)`` with integer l2 sensitivity ``D`` satisfies
  ``D^2 / (2 sigma^2)``-concentrated DP, the continuous Gaussian's guarantee (CKS 2020,
  Theorem 4), and its (epsilon, delta) curve is at least as good as the continuous one's up to
  a term of order ``exp(-2 pi^2 sigma^2)`` (CKS 2020, Theorem 7 and Section 2.3, by Poisson
  summation); here ``sigma_Z >= z 2^24``, so that term is far below any delta.

Acceptance tests use float64 exponentials (relative error about 1e-16 per draw) rather
than the exact rational arithmetic of CKS; the output set has no holes either way.  The
tail of ``Lap_Z`` is cut where a 64-bit uniform cannot reach (beyond about 44 scales,
probability below 1e-19), a difference far below any delta in use.
"""

from __future__ import annotations

import math
import os

import numpy as np

__all__ = ["NoiseSource", "LATTICE_BITS", "NOT_PRIVATE", "lattice_gaussian", "lattice_laplace"]

#: what a result made under the insecure switch says in its report, summary, privacy report and model file
NOT_PRIVATE = ("not private: the noise was drawn from the seed (insecure_reproducible_noise), so anyone who knows "
               "the seed can remove it; no epsilon is claimed")

#: the release grid is the sensitivity divided by 2**LATTICE_BITS
LATTICE_BITS = 24


class NoiseSource:
    """A site's source of secret randomness: the operating system's CSPRNG, or a seeded stand-in.

    ``NoiseSource()`` reads ``os.urandom``.  ``NoiseSource.seeded(seed)`` draws the same bits
    from a PCG64 generator seeded by ``seed`` (an int, a :class:`numpy.random.SeedSequence` or
    a :class:`numpy.random.Generator`): reproducible, hence not private -- only for the
    insecure switch and for tests of the samplers.
    """

    def __init__(self) -> None:
        self._generator: np.random.Generator | None = None

    @classmethod
    def seeded(cls, seed) -> "NoiseSource":
        source = cls()
        source._generator = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        return source

    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words, shape (n,), dtype uint64."""
        if self._generator is None:
            return np.frombuffer(os.urandom(8 * int(n)), dtype=np.uint64).copy()
        return self._generator.integers(0, 2**64, size=int(n), dtype=np.uint64, endpoint=False)

    def uniform(self, n: int) -> np.ndarray:
        """``n`` uniforms in (0, 1]: ``(w + 1) 2^-64`` for a 64-bit word ``w``, shape (n,)."""
        return (self.words(n).astype(np.float64) + 1.0) * 2.0**-64

    def discrete_laplace(self, scale: float, shape) -> np.ndarray:
        """Draws of ``Lap_Z(b)``: ``P(k) ∝ exp(-|k| / b)`` on the integers, int64 of ``shape``.

        The difference of two independent geometric variables with success probability
        ``1 - exp(-1/b)`` (CKS 2020, Algorithm 2), each drawn by inversion.
        """
        scale, size = float(scale), int(np.prod(shape, dtype=np.int64))  # P(G >= k) = exp(-k / b): G = floor(-b log U)
        g1 = np.floor(-scale * np.log(self.uniform(size)))
        g2 = np.floor(-scale * np.log(self.uniform(size)))
        return (g1 - g2).astype(np.int64).reshape(shape)

    def discrete_gaussian(self, sigma: float, shape) -> np.ndarray:
        """Draws of ``N_Z(0, sigma^2)``: ``P(k) ∝ exp(-k^2 / (2 sigma^2))`` on the integers, int64 of ``shape``.

        Rejection from ``Lap_Z(t)``, ``t = floor(sigma) + 1``: accept ``Y`` with probability
        ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))`` (CKS 2020, Algorithm 3), vectorised.
        """
        sigma = float(sigma)
        t = math.floor(sigma) + 1
        size = int(np.prod(shape, dtype=np.int64))
        out = np.empty(size, dtype=np.int64)
        todo = np.arange(size)
        while todo.size:
            y = self.discrete_laplace(t, todo.size)
            accept = self.uniform(todo.size) <= np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2.0 * sigma**2))
            out[todo[accept]] = y[accept]
            todo = todo[~accept]
        return out.reshape(shape)

    def standard_normal(self, size=None) -> np.ndarray | float:
        """Draws of N(0, 1) on the grid ``2^-LATTICE_BITS`` (for chunk masks and mitigation noise)."""
        draws = self.discrete_gaussian(2.0**LATTICE_BITS, () if size is None else size) * 2.0**-LATTICE_BITS
        return float(draws) if size is None else draws


def _as_source(source) -> NoiseSource:
    if isinstance(source, NoiseSource):
        return source
    if isinstance(source, np.random.Generator):  # a seeded generator: reproducible, for tests only
        return NoiseSource.seeded(source)
    raise TypeError(f"noise must come from a NoiseSource, got {type(source).__name__}")


def lattice_gaussian(value: np.ndarray, noise_multiplier: float, sensitivity: float, source) -> np.ndarray:
    """``value`` plus discrete Gaussian noise on the grid ``sensitivity 2^-24`` (module docstring); same shape.

    ``sigma_Z = z (2^24 + sqrt(m))`` lattice steps for ``m = value.size``, so that the
    release is ``GaussianDpEvent(z)`` for l2 sensitivity ``sensitivity`` after rounding.
    """
    value = np.asarray(value, dtype=float)
    grid = float(sensitivity) * 2.0**-LATTICE_BITS
    sigma = float(noise_multiplier) * (2.0**LATTICE_BITS + math.sqrt(max(value.size, 1)))
    k = np.rint(value / grid)
    return (k + _as_source(source).discrete_gaussian(sigma, value.shape)) * grid


def lattice_laplace(value: np.ndarray, noise_multiplier: float, sensitivity: float, source) -> np.ndarray:
    """``value`` plus discrete Laplace noise on the grid ``sensitivity 2^-24`` (module docstring); same shape.

    ``b_Z = z (2^24 + m)`` lattice steps for ``m = value.size`` (l1 sensitivity after rounding).
    """
    value = np.asarray(value, dtype=float)
    grid = float(sensitivity) * 2.0**-LATTICE_BITS
    scale = float(noise_multiplier) * (2.0**LATTICE_BITS + max(value.size, 1))
    k = np.rint(value / grid)
    return (k + _as_source(source).discrete_laplace(scale, value.shape)) * grid
