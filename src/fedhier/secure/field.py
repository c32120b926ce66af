"""Exact vectorised arithmetic in a prime field GF(q) (spec collabdict §4.2, "Field").

Field elements are stored as ``int64`` arrays with entries in ``[0, q)``.  Sums of two
elements fit in 64 bits, but products of two 61-bit elements need 122 bits, so
:meth:`PrimeField.mul` never forms the full product in one machine word:

* for the recommended Mersenne prime ``q = 2**61 - 1`` it splits both factors into
  32-bit halves, forms the four partial products in ``uint64`` and folds them with
  ``2**61 = 1 (mod q)``, i.e. ``x mod q = (x & q) + (x >> 61)``;
* for any other prime below ``2**62`` it runs Horner's rule over ``k``-bit limbs of the
  second factor, ``k = 64 - bit_length(q)``, so that every intermediate stays below
  ``2**64`` (for ``q < 2**32`` this is a single ``a * b mod q``).

Both paths are exact; ``tests/privacy/test_shamir.py`` checks them against Python's
arbitrary-precision integers.
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

__all__ = ["PRIME", "PrimeField", "is_prime"]

#: The Mersenne prime 2**61 - 1 recommended by spec collabdict §4.2.
PRIME = 2**61 - 1

_MAX_MODULUS = 2**62
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


@lru_cache(maxsize=64)
def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin primality test, exact for every ``n < 3.3 * 10**24`` (remembered: a field is
    made for every sharing and reconstruction, always of the same few moduli)."""
    n = int(n)
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


class PrimeField:
    """The prime field GF(q) acting element-wise on ``int64`` arrays.

    Parameters
    ----------
    modulus : int
        A prime ``q`` with ``2 < q < 2**62`` (default :data:`PRIME`).

    Raises
    ------
    ValueError
        If ``modulus`` is not a prime in that range.
    """

    def __init__(self, modulus: int = PRIME) -> None:
        if isinstance(modulus, bool) or not isinstance(modulus, (int, np.integer)):
            raise ValueError(f"field modulus must be an integer, got {type(modulus).__name__}")
        modulus = int(modulus)
        if not 2 < modulus < _MAX_MODULUS:
            raise ValueError(f"field modulus must lie in (2, 2**62), got {modulus}")
        if not is_prime(modulus):
            raise ValueError(f"field modulus {modulus} is not prime")
        self.modulus = modulus
        self.bits = modulus.bit_length()
        self._limb_bits = 64 - self.bits

    def __repr__(self) -> str:
        return f"PrimeField({self.modulus})"

    # ------------------------------------------------------------------ checks
    def check(self, a, name: str = "value") -> np.ndarray:
        """Return ``a`` as an ``int64`` array after checking every entry lies in ``[0, q)``.

        Raises
        ------
        ValueError
            Naming ``name`` if ``a`` is not integer-valued or has an entry outside ``[0, q)``.
        """
        arr = np.asarray(a)
        if arr.dtype == object or arr.dtype.kind not in "iu":
            raise ValueError(f"{name}: field elements must be an integer array, got dtype {arr.dtype}")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.modulus):
            raise ValueError(f"{name}: field elements must lie in [0, {self.modulus}), got range "
                             f"[{int(arr.min())}, {int(arr.max())}]")
        return arr.astype(np.int64, copy=False)

    # -------------------------------------------------------------- arithmetic
    def add(self, a, b) -> np.ndarray:
        """``(a + b) mod q`` element-wise (broadcasting); inputs in ``[0, q)``."""
        s = np.add(a, b, dtype=np.int64)
        return np.where(s >= self.modulus, s - self.modulus, s)

    def sub(self, a, b) -> np.ndarray:
        """``(a - b) mod q`` element-wise (broadcasting); inputs in ``[0, q)``."""
        d = np.subtract(a, b, dtype=np.int64)
        return np.where(d < 0, d + self.modulus, d)

    def sum(self, a, axis: int = 0) -> np.ndarray:
        """``(sum of a along axis) mod q``, reducing after every addition so nothing overflows."""
        a = np.moveaxis(np.asarray(a, dtype=np.int64), axis, 0)
        out = np.zeros(a.shape[1:], dtype=np.int64)
        for row in a:
            out = self.add(out, row)
        return out

    def mul(self, a, b) -> np.ndarray:
        """``(a * b) mod q`` element-wise (broadcasting), exact; inputs in ``[0, q)``."""
        a64, b64 = np.broadcast_arrays(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))
        if self.modulus == PRIME:
            return self._mul_mersenne61(a64, b64).astype(np.int64)
        return self._mul_limbs(a64, b64).astype(np.int64)

    @staticmethod
    def _mul_mersenne61(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # a = ah 2^32 + al, b = bh 2^32 + bl with ah, bh < 2^29, al, bl < 2^32:
        # a b = hh 2^64 + mid 2^32 + ll, and 2^61 = 1 (mod q) so 2^64 = 8.
        low32 = np.uint64(0xFFFFFFFF)
        ah, al = a >> np.uint64(32), a & low32
        bh, bl = b >> np.uint64(32), b & low32
        ll = al * bl                      # < 2^64
        mid = ah * bl + al * bh           # < 2^62
        hh = ah * bh                      # < 2^58
        q = np.uint64(PRIME)
        r = (ll & q) + (ll >> np.uint64(61))
        # mid 2^32 = (mid >> 29) 2^61 + (mid mod 2^29) 2^32 = (mid >> 29) + (mid mod 2^29) 2^32
        r += (mid >> np.uint64(29)) + ((mid & np.uint64(2**29 - 1)) << np.uint64(32))
        r += hh << np.uint64(3)           # r < 2^63
        r = (r & q) + (r >> np.uint64(61))  # <= q + 3
        return np.where(r >= q, r - q, r)

    def _mul_limbs(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # Horner over k-bit limbs of b: r <- (r 2^k + a limb) mod q, with q 2^k <= 2^64.
        q = np.uint64(self.modulus)
        k = self._limb_bits
        mask = np.uint64((1 << k) - 1)
        r = np.zeros(a.shape, dtype=np.uint64)
        for i in reversed(range(-(-self.bits // k))):
            limb = (b >> np.uint64(i * k)) & mask
            r = (r << np.uint64(k)) % q
            r = (r + (a * limb) % q) % q
        return r

    def inverse(self, a: int) -> int:
        """Multiplicative inverse of the non-zero element ``a`` (Python int, exact)."""
        a = int(a) % self.modulus
        if a == 0:
            raise ValueError("0 has no inverse in a field")
        return pow(a, -1, self.modulus)

    # -------------------------------------------------------------- randomness
    def random(self, shape, rng: np.random.Generator | None = None) -> np.ndarray:
        """Independent uniform elements of GF(q), ``int64`` array of ``shape``.

        ``rng=None`` uses the operating system's cryptographic generator
        (:func:`os.urandom`, rejection sampling so the draw is exactly uniform).  A
        :class:`numpy.random.Generator` gives reproducible draws for tests and
        simulations; it is **not** cryptographically secure.
        """
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
        if rng is not None:
            if not isinstance(rng, np.random.Generator):
                raise ValueError(f"rng must be None or a numpy.random.Generator, got {type(rng).__name__}")
            return rng.integers(0, self.modulus, size=shape, dtype=np.int64)
        n = int(np.prod(shape, dtype=np.int64))
        out = np.empty(n, dtype=np.uint64)
        top = np.uint64((1 << self.bits) - 1)
        filled = 0
        while filled < n:
            need = n - filled
            words = np.frombuffer(os.urandom(8 * need), dtype="<u8") & top
            words = words[words < np.uint64(self.modulus)]
            out[filled : filled + words.size] = words
            filled += words.size
        return out.astype(np.int64).reshape(shape)
