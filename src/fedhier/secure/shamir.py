"""Shamir secret sharing of integer and real vectors over GF(q) (spec collabdict §4.2).

A secret vector ``s`` in GF(q)^m is hidden in ``m`` independent random polynomials of
degree ``t - 1``,

    f_i(z) = s_i + a_{i,1} z + ... + a_{i,t-1} z^{t-1},   a_{i,u} ~ Uniform(GF(q)),

and share ``j`` (``j = 1..n``) is the vector ``(f_1(j), ..., f_m(j))``.  Any ``t`` shares at
distinct points ``z_j`` give back ``s`` by Lagrange interpolation at 0,

    s = sum_{j in J} sigma_j prod_{l in J, l != j} z_l / (z_l - z_j)   (mod q),

while any ``t - 1`` shares are uniform on GF(q)^{t-1} whatever ``s`` is: for every secret
and every ``t - 1`` share values there is exactly one polynomial of degree ``t - 1``
through them.  Sharing is linear, so the element-wise sum of shares from several sites
is a share of the sum of their secrets (the committee secure sum of §4.2; add shares with
:meth:`fedhier.secure.field.PrimeField.sum`).

Randomness: ``rng=None`` draws the coefficients from the operating system's
cryptographic generator; a :class:`numpy.random.Generator` makes the shares
reproducible for tests and simulations but is **not** cryptographically secure.
"""

from __future__ import annotations

import numpy as np

from .field import PRIME, PrimeField
from .fixedpoint import FixedPoint

__all__ = ["share", "reconstruct", "evaluate_shares", "lagrange_weights", "share_vector", "reconstruct_vector"]


def _check_points(xs, field: PrimeField) -> list[int]:
    xs = np.asarray(xs)
    if xs.ndim != 1 or xs.size == 0:
        raise ValueError(f"share points xs must be a non-empty 1-d array, got shape {xs.shape}")
    if xs.dtype == object or xs.dtype.kind not in "iu":
        raise ValueError(f"share points xs must be integers, got dtype {xs.dtype}")
    points = [int(x) for x in xs]
    if any(not 0 < x < field.modulus for x in points):
        raise ValueError(f"share points must lie in [1, {field.modulus - 1}], got {points}")
    if len(set(points)) != len(points):
        raise ValueError(f"share points must be distinct, got {points}")
    return points


def evaluate_shares(secret, coefficients, xs, *, modulus: int = PRIME) -> np.ndarray:
    """Evaluate the sharing polynomials ``f_i(z) = s_i + sum_u a_{u,i} z^u`` at the points ``xs``.

    Parameters
    ----------
    secret : int ndarray, shape (m,)
        Constant terms ``s``, entries in ``[0, modulus)``.
    coefficients : int ndarray, shape (t-1, m)
        Row ``u - 1`` holds the coefficients ``a_{u,i}`` of ``z^u``.
    xs : int ndarray, shape (k,)
        Distinct non-zero evaluation points.
    modulus : int
        Prime field modulus.

    Returns
    -------
    ndarray of int64, shape (k, m)
        ``out[j, i] = f_i(xs[j]) mod q`` (Horner's rule, exact field arithmetic).
    """
    field = PrimeField(modulus)
    secret = field.check(secret, "secret")
    if secret.ndim != 1:
        raise ValueError(f"secret must be a 1-d array (m,), got shape {secret.shape}")
    coefficients = field.check(coefficients, "coefficients")
    if coefficients.ndim != 2 or coefficients.shape[1] != secret.shape[0]:
        raise ValueError(f"coefficients must have shape (t-1, {secret.shape[0]}), got {coefficients.shape}")
    z = np.asarray(_check_points(xs, field), dtype=np.int64)[:, None]
    acc = np.zeros((z.shape[0], secret.shape[0]), dtype=np.int64)
    for a in coefficients[::-1]:
        acc = field.add(field.mul(acc, z), a)
    return field.add(field.mul(acc, z), secret)


def share(secret, n_shares: int, threshold: int, rng: np.random.Generator | None = None, *,
          modulus: int = PRIME) -> np.ndarray:
    """Split ``secret`` into ``n_shares`` Shamir shares, any ``threshold`` of which reconstruct it.

    Parameters
    ----------
    secret : int ndarray, shape (m,)
        Field elements in ``[0, modulus)``.
    n_shares : int
        Number ``n`` of shares; share ``j`` (row ``j - 1``) is the evaluation at ``z = j``.
    threshold : int
        ``t``, with ``1 <= t <= n``; the polynomials have degree ``t - 1``.
    rng : numpy.random.Generator or None
        Source of the random coefficients; ``None`` = cryptographic (see module docstring).
    modulus : int
        Prime field modulus, default ``2**61 - 1``.

    Returns
    -------
    ndarray of int64, shape (n_shares, m)

    Raises
    ------
    ValueError
        On a secret outside the field, ``threshold`` outside ``[1, n_shares]`` or
        ``n_shares >= modulus`` (not enough distinct non-zero points).
    """
    field = PrimeField(modulus)
    secret = field.check(secret, "secret")
    if secret.ndim != 1:
        raise ValueError(f"secret must be a 1-d array (m,), got shape {secret.shape}")
    n_shares, threshold = int(n_shares), int(threshold)
    if not 1 <= n_shares < field.modulus:
        raise ValueError(f"n_shares must lie in [1, {field.modulus - 1}], got {n_shares}")
    if not 1 <= threshold <= n_shares:
        raise ValueError(f"threshold must lie in [1, n_shares = {n_shares}], got {threshold}")
    coefficients = field.random((threshold - 1, secret.shape[0]), rng)
    return evaluate_shares(secret, coefficients, np.arange(1, n_shares + 1), modulus=field.modulus)


def lagrange_weights(xs, *, modulus: int = PRIME) -> list[int]:
    """Lagrange weights at 0, ``w_j = prod_{l != j} z_l / (z_l - z_j) mod q`` (exact Python ints)."""
    field = PrimeField(modulus)
    points = _check_points(xs, field)
    q = field.modulus
    weights = []
    for j, zj in enumerate(points):
        num, den = 1, 1
        for l, zl in enumerate(points):
            if l != j:
                num = num * zl % q
                den = den * (zl - zj) % q
        weights.append(num * field.inverse(den) % q)
    return weights


def reconstruct(shares, xs, *, modulus: int = PRIME) -> np.ndarray:
    """Recover the secret from shares by Lagrange interpolation at 0.

    Parameters
    ----------
    shares : int ndarray, shape (k, m)
        Row ``j`` is the share held at point ``xs[j]``.
    xs : int ndarray, shape (k,)
        Distinct non-zero share points.  With ``k >= t`` shares of a degree ``t - 1``
        sharing the result is the secret; with fewer it is an unrelated field vector.
    modulus : int
        Prime field modulus.

    Returns
    -------
    ndarray of int64, shape (m,)
    """
    field = PrimeField(modulus)
    shares = field.check(shares, "shares")
    weights = lagrange_weights(xs, modulus=field.modulus)
    if shares.ndim != 2 or shares.shape[0] != len(weights):
        raise ValueError(f"shares must have shape ({len(weights)}, m) to match xs, got {shares.shape}")
    out = np.zeros(shares.shape[1], dtype=np.int64)
    for row, w in zip(shares, weights):
        out = field.add(out, field.mul(row, w))
    return out


def share_vector(x, n_shares: int, threshold: int, fixed_point: FixedPoint,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """Fixed-point encode the real vector ``x`` (shape (m,)) and Shamir-share it.

    The field is GF(``fixed_point.modulus``), which must be prime.  Returns the
    ``(n_shares, m)`` shares of :func:`share`; raises ``OverflowError`` if ``|x| > max_abs``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"x must be a 1-d array (m,), got shape {x.shape}")
    return share(fixed_point.encode(x), n_shares, threshold, rng, modulus=fixed_point.modulus)


def reconstruct_vector(shares, xs, fixed_point: FixedPoint, n_summands: int = 1) -> np.ndarray:
    """Reconstruct and decode a real vector (shape (m,)) shared by :func:`share_vector`.

    ``shares`` may be element-wise sums of shares of ``n_summands`` vectors, in which case
    the result is the sum of those vectors (to ``n_summands * precision / 2``).
    """
    return fixed_point.decode(reconstruct(shares, xs, modulus=fixed_point.modulus), n_summands=n_summands)
