"""Fixed-point encoding of real arrays into modular integers (spec collabdict §4.2, "Encoding reals").

With ``f`` fractional bits and modulus ``q``:

    enc(x) = round(x 2^f) mod q            (negatives map to q - |round(x 2^f)|)
    dec(y) = (y if y <= (q-1)/2 else y - q) / 2^f

Encoding is additively homomorphic: ``dec(sum_s enc(x_s) mod q) = sum_s round(x_s 2^f) / 2^f``
as long as the integer sum does not wrap, i.e. ``|sum_s round(x_s 2^f)| <= (q-1)/2``.
With every admissible input bounded by ``|x| <= max_abs``, each encoding is bounded by
``bound = round(max_abs 2^f)`` in magnitude, so

    max_summands = floor(((q-1)/2) / bound)

values can always be summed without wrap-around.  With the defaults (``q = 2**61 - 1``,
``f = 24``, ``max_abs = 2**26``) that is 1023 summands, the example of spec §4.2.

Precision: one encode/decode round trip errs by at most ``precision / 2 = 2**-(f+1)`` per
entry, a sum of ``n`` encodings by at most ``n * precision / 2`` (plus the float64
rounding of the decoded value, relative ``2**-53``, once the integer exceeds ``2**53``).
"""

from __future__ import annotations

import numpy as np

from .field import PRIME

__all__ = ["PRIME", "FixedPoint"]


class FixedPoint:
    """Fixed-point codec between float arrays and integers modulo ``modulus``.

    Parameters
    ----------
    frac_bits : int
        Number ``f`` of fractional bits; the grid spacing is ``precision = 2**-f``.
    modulus : int
        Modulus ``q`` of the integer ring (need not be prime for masking; Shamir
        sharing of encodings needs a prime).  Between 3 and ``2**62``.
    max_abs : float
        Largest admissible ``|x|`` of one encoded value.

    Attributes
    ----------
    precision : float
        ``2**-frac_bits``; the round-trip error bound is ``precision / 2`` per entry.
    bound : int
        ``round(max_abs 2^f)``, the largest magnitude of one encoding.
    max_summands : int
        How many encodings can be added modulo ``q`` without wrap-around.

    Raises
    ------
    ValueError
        If the parameters are out of range, or ``max_abs 2^f`` exceeds ``(q-1)/2``
        (not even one value would fit).
    """

    def __init__(self, frac_bits: int = 24, modulus: int = PRIME, max_abs: float = 2.0**26) -> None:
        if isinstance(frac_bits, bool) or not isinstance(frac_bits, (int, np.integer)) or not 0 <= frac_bits <= 52:
            raise ValueError(f"frac_bits must be an integer in [0, 52], got {frac_bits!r}")
        if isinstance(modulus, bool) or not isinstance(modulus, (int, np.integer)) or not 3 <= modulus <= 2**62:
            raise ValueError(f"modulus must be an integer in [3, 2**62], got {modulus!r}")
        max_abs = float(max_abs)
        if not np.isfinite(max_abs) or max_abs <= 0:
            raise ValueError(f"max_abs must be a positive finite number, got {max_abs!r}")
        self.frac_bits = int(frac_bits)
        self.modulus = int(modulus)
        self.max_abs = max_abs
        self.scale = float(2**self.frac_bits)
        self.half = (self.modulus - 1) // 2
        self.bound = int(np.rint(max_abs * self.scale))
        if self.bound > self.half:
            raise ValueError(
                f"max_abs * 2**frac_bits = {max_abs * self.scale:.6g} exceeds (modulus - 1) / 2 = {self.half}: "
                "lower max_abs or frac_bits, or use a larger modulus"
            )
        self.max_summands = self.half // max(self.bound, 1)

    def __repr__(self) -> str:
        return f"FixedPoint(frac_bits={self.frac_bits}, modulus={self.modulus}, max_abs={self.max_abs!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedPoint) and (other.frac_bits, other.modulus, other.max_abs) == (
            self.frac_bits, self.modulus, self.max_abs)

    def __hash__(self) -> int:
        return hash(("FixedPoint", self.frac_bits, self.modulus, self.max_abs))

    @property
    def precision(self) -> float:
        """Grid spacing ``2**-frac_bits``."""
        return 2.0**-self.frac_bits

    def encode(self, x) -> np.ndarray:
        """``enc(x) = round(x 2^f) mod q``, element-wise.

        Parameters
        ----------
        x : array_like of float, any shape

        Returns
        -------
        ndarray of int64, same shape, entries in ``[0, modulus)``.

        Raises
        ------
        ValueError
            If ``x`` has NaN or infinite entries.
        OverflowError
            If some ``|x| > max_abs``.
        """
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError(f"cannot encode non-finite values ({int(np.sum(~np.isfinite(x)))} NaN/inf entries)")
        too_big = np.abs(x) > self.max_abs
        if np.any(too_big):
            raise OverflowError(  # the values themselves are not quoted: this text may reach the coordinator
                f"{int(too_big.sum())} of {x.size} value(s) exceed the fixed-point bound max_abs = {self.max_abs:.6g}; "
                "rescale the data (e.g. standardise each column), or use fewer fractional bits (frac_bits), "
                "which raises the bound"
            )
        return np.mod(np.rint(x * self.scale).astype(np.int64), self.modulus)

    def decode(self, a, n_summands: int = 1) -> np.ndarray:
        """``dec(a)``: map ``a`` in ``[0, q)`` back to floats (values above ``(q-1)/2`` are negative).

        Parameters
        ----------
        a : array_like of int, any shape
            An encoding, or the modular sum of ``n_summands`` encodings.
        n_summands : int
            How many encodings were added into ``a``.

        Returns
        -------
        ndarray of float64, same shape.

        Raises
        ------
        ValueError
            If ``a`` is not an integer array with entries in ``[0, modulus)``.
        OverflowError
            If ``n_summands > max_summands`` (the sum could have wrapped), or if a decoded
            magnitude exceeds ``n_summands * bound``, which no sum of ``n_summands``
            admissible encodings can produce (a wrapped sum or a vector that is still masked).
        """
        a = np.asarray(a)
        if a.dtype == object or a.dtype.kind not in "iu":
            raise ValueError(f"decode expects an integer array, got dtype {a.dtype}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= self.modulus):
            raise ValueError(f"decode expects entries in [0, {self.modulus}), got range [{int(a.min())}, {int(a.max())}]")
        n_summands = int(n_summands)
        if n_summands < 1:
            raise ValueError(f"n_summands must be >= 1, got {n_summands}")
        if n_summands > self.max_summands:
            raise OverflowError(
                f"a sum of {n_summands} values may wrap around: at most max_summands = {self.max_summands} "
                f"values with |x| <= {self.max_abs:.6g} fit modulus {self.modulus} at {self.frac_bits} fractional bits"
            )
        a = a.astype(np.int64)
        signed = np.where(a > self.half, a - self.modulus, a)
        limit = n_summands * self.bound
        if signed.size and int(np.abs(signed).max()) > limit:
            raise OverflowError(
                f"decoded magnitude {int(np.abs(signed).max())} exceeds {n_summands} x bound = {limit}: "
                "the value is not a sum of that many admissible encodings (wrapped or still masked)"
            )
        return signed.astype(np.float64) / self.scale
