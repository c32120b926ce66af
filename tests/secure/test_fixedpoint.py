"""Fixed-point encoding (spec collabdict §4.2): round-trip bound, homomorphic sums, overflow refusal."""

from fractions import Fraction

import numpy as np
import pytest

from fedhier.secure.fixedpoint import PRIME, FixedPoint


def test_prime_is_mersenne_61():
    assert PRIME == 2**61 - 1


@pytest.mark.parametrize("frac_bits,max_abs", [(24, 2.0**26), (10, 1e3), (40, 1.0)])
def test_round_trip_within_half_precision(frac_bits, max_abs):
    fp = FixedPoint(frac_bits=frac_bits, max_abs=max_abs)
    rng = np.random.default_rng(0)
    x = rng.uniform(-max_abs, max_abs, size=5000)
    x[:4] = [max_abs, -max_abs, 0.0, fp.precision / 2]
    a = fp.encode(x)
    assert a.dtype == np.int64 and a.min() >= 0 and a.max() < PRIME
    err = np.abs(fp.decode(a) - x)
    assert err.max() <= fp.precision / 2
    assert fp.precision == 2.0**-frac_bits


def test_encoding_matches_spec_formula_with_python_ints():
    fp = FixedPoint(frac_bits=24)
    x = np.array([-1.0, 1.0, -3.25, 1234.5678, -0.0000001])
    expected = [round(Fraction(v) * 2**24) % PRIME for v in x]
    assert fp.encode(x).tolist() == expected
    assert fp.encode(np.array([-1.0]))[0] == PRIME - 2**24


def test_sum_of_encodings_decodes_to_exact_grid_sum():
    fp = FixedPoint(frac_bits=20, max_abs=1e4)
    rng = np.random.default_rng(1)
    xs = rng.uniform(-1e4, 1e4, size=(7, 50))
    total = np.zeros(50, dtype=np.int64)
    for x in xs:
        total = (total + fp.encode(x)) % PRIME
    exact = [float(sum(Fraction(round(Fraction(v) * 2**20), 2**20) for v in col)) for col in xs.T]
    np.testing.assert_array_equal(fp.decode(total, n_summands=7), exact)
    assert np.abs(fp.decode(total, n_summands=7) - xs.sum(axis=0)).max() <= 7 * fp.precision / 2


def test_max_summands_is_the_largest_count_that_cannot_wrap():
    fp = FixedPoint(frac_bits=3, modulus=1009, max_abs=10.0)
    assert fp.bound == 80
    assert fp.max_summands * fp.bound <= (1009 - 1) // 2 < (fp.max_summands + 1) * fp.bound
    # max_summands extreme values still decode exactly, in both directions
    for sign in (1.0, -1.0):
        enc = fp.encode(np.full(1, sign * 10.0))
        total = (enc * fp.max_summands) % 1009
        assert fp.decode(total, n_summands=fp.max_summands)[0] == sign * 10.0 * fp.max_summands
    # one more would wrap: the decoder refuses to decode it
    with pytest.raises(OverflowError, match="may wrap"):
        fp.decode(np.zeros(1, dtype=np.int64), n_summands=fp.max_summands + 1)


def test_default_parameters_allow_spec_example():
    fp = FixedPoint()
    assert (fp.frac_bits, fp.max_abs) == (24, 2.0**26)
    assert fp.max_summands == 1023  # S < 2^10 sites with |x| < 2^26 (spec §4.2)


def test_encode_refuses_values_beyond_max_abs():
    fp = FixedPoint(frac_bits=10, max_abs=5.0)
    fp.encode(np.array([5.0, -5.0]))
    with pytest.raises(OverflowError, match="max_abs"):
        fp.encode(np.array([1.0, -5.001]))


def test_decode_refuses_values_no_sum_can_produce():
    fp = FixedPoint(frac_bits=10, max_abs=5.0)
    masked = np.random.default_rng(2).integers(0, PRIME, size=100, dtype=np.int64)
    with pytest.raises(OverflowError, match="not a sum"):
        fp.decode(masked, n_summands=3)


def test_bad_input_is_refused():
    fp = FixedPoint()
    with pytest.raises(ValueError, match="non-finite"):
        fp.encode(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="entries in"):
        fp.decode(np.array([PRIME]))
    with pytest.raises(ValueError, match="integer"):
        fp.decode(np.array([1.5]))
    with pytest.raises(ValueError, match="exceeds"):
        FixedPoint(frac_bits=40, max_abs=2.0**30)
    with pytest.raises(ValueError, match="frac_bits"):
        FixedPoint(frac_bits=-1)
    with pytest.raises(ValueError, match="max_abs"):
        FixedPoint(max_abs=np.inf)
