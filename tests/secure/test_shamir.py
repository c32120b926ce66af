"""Shamir sharing over GF(q) and the exact field arithmetic it runs on (spec collabdict §4.2)."""

from itertools import combinations

import numpy as np
import pytest
from scipy import stats

from fedhier.secure.field import PRIME, PrimeField, is_prime
from fedhier.secure.fixedpoint import FixedPoint
from fedhier.secure.shamir import (
    evaluate_shares, lagrange_weights, reconstruct, reconstruct_vector, share, share_vector,
)

PRIMES = [101, 2**31 - 1, 1125899906842597, PRIME, 4611686018427387847]  # 7, 31, 50, 61, 62 bits


def _python_interpolate(points, values, at, q):
    """Lagrange interpolation with Python big ints, independent of the library."""
    total = 0
    for j, (zj, yj) in enumerate(zip(points, values)):
        num = den = 1
        for l, zl in enumerate(points):
            if l != j:
                num = num * (at - zl) % q
                den = den * (zj - zl) % q
        total = (total + yj * num * pow(den, -1, q)) % q
    return total


# ----------------------------------------------------------------- field arithmetic
@pytest.mark.parametrize("q", PRIMES)
def test_field_operations_match_python_big_ints(q):
    field = PrimeField(q)
    rng = np.random.default_rng(q % 1000)
    a = rng.integers(0, q, size=3000, dtype=np.int64)
    b = rng.integers(0, q, size=3000, dtype=np.int64)
    edges = [0, 1, 2, q - 1, q - 2, (q - 1) // 2, min(2**32, q - 1), min(2**32 - 1, q - 1)]
    a = np.concatenate([a, np.repeat(edges, len(edges))])
    b = np.concatenate([b, np.tile(edges, len(edges))])
    pa, pb = [int(v) for v in a], [int(v) for v in b]
    assert field.mul(a, b).tolist() == [x * y % q for x, y in zip(pa, pb)]
    assert field.add(a, b).tolist() == [(x + y) % q for x, y in zip(pa, pb)]
    assert field.sub(a, b).tolist() == [(x - y) % q for x, y in zip(pa, pb)]
    rows = a[: 3000].reshape(6, 500)
    assert field.sum(rows).tolist() == [sum(int(v) for v in col) % q for col in rows.T]
    w = int(b[0]) or 1
    assert field.mul(a, w).tolist() == [x * w % q for x in pa]
    assert field.inverse(w) * w % q == 1


def test_is_prime_against_trial_division_and_known_cases():
    def trial(n):
        return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))

    assert [n for n in range(3000) if is_prime(n)] == [n for n in range(3000) if trial(n)]
    assert is_prime(2**61 - 1) and is_prime(2**31 - 1)
    for composite in (561, 41041, 3215031751, 2**59 - 1, (2**31 - 1) * (2**29 - 3)):
        assert not is_prime(composite)


def test_field_refuses_composite_or_out_of_range_modulus():
    with pytest.raises(ValueError, match="not prime"):
        PrimeField(100)
    with pytest.raises(ValueError, match="2\\*\\*62"):
        PrimeField(2**127 - 1)
    with pytest.raises(ValueError, match="lie in"):
        PrimeField().check(np.array([PRIME]), "x")


def test_cryptographic_random_elements_are_in_range_and_vary():
    field = PrimeField(101)
    draw = field.random(20000)
    assert draw.min() >= 0 and draw.max() < 101
    counts = np.bincount(draw, minlength=101)
    assert stats.chisquare(counts).pvalue > 1e-4
    big = PrimeField().random((3, 4))
    assert big.shape == (3, 4) and len(set(big.ravel().tolist())) == 12


# ----------------------------------------------------------------- Shamir sharing
@pytest.mark.parametrize("q", [101, PRIME])
def test_any_t_of_n_shares_reconstruct_exhaustively(q):
    n, t, m = 6, 3, 40
    rng = np.random.default_rng(3)
    secret = rng.integers(0, q, size=m, dtype=np.int64)
    shares = share(secret, n, t, rng, modulus=q)
    assert shares.shape == (n, m)
    for k in range(t, n + 1):
        for subset in combinations(range(n), k):
            xs = np.array(subset) + 1
            np.testing.assert_array_equal(reconstruct(shares[list(subset)], xs, modulus=q), secret)


def test_shares_lie_on_a_polynomial_of_degree_t_minus_1():
    n, t = 7, 4
    rng = np.random.default_rng(4)
    secret = rng.integers(0, PRIME, size=5, dtype=np.int64)
    shares = share(secret, n, t, rng)
    points = list(range(1, t + 1))
    for i in range(5):
        values = [int(v) for v in shares[:t, i]]
        assert _python_interpolate(points, values, 0, PRIME) == int(secret[i])
        for k in range(t + 1, n + 1):
            assert _python_interpolate(points, values, k, PRIME) == int(shares[k - 1, i])


def test_fewer_than_t_shares_do_not_reconstruct():
    rng = np.random.default_rng(5)
    secret = rng.integers(0, PRIME, size=50, dtype=np.int64)
    shares = share(secret, 5, 3, rng)
    guess = reconstruct(shares[:2], np.array([1, 2]))
    assert np.count_nonzero(guess == secret) == 0


@pytest.mark.parametrize("t,points", [(2, (7,)), (3, (2, 5)), (3, (1, 100))])
def test_t_minus_1_shares_determine_a_unique_polynomial_for_every_secret(t, points):
    """Brute force over GF(101): for each secret, the map (a_1..a_{t-1}) -> the t-1 shares is a
    bijection, so under uniform coefficients the t-1 shares are uniform whatever the secret."""
    q = 101
    grids = np.meshgrid(*[np.arange(q)] * (t - 1), indexing="ij")
    coefficients = np.stack([g.ravel() for g in grids]).astype(np.int64)  # all q^(t-1) polynomials
    cells = set()
    for s in range(q):
        shares = evaluate_shares(np.full(coefficients.shape[1], s), coefficients, np.array(points), modulus=q)
        codes = np.ravel_multi_index(tuple(shares), (q,) * (t - 1))
        assert np.unique(codes).size == q ** (t - 1)  # every share tuple from exactly one polynomial
        cells.add(tuple(np.bincount(codes, minlength=q ** (t - 1))))
    assert cells == {(1,) * q ** (t - 1)}  # same (uniform) distribution for all 101 secrets


def test_single_share_distribution_does_not_depend_on_secret():
    q, m = 101, 101 * 300
    rng = np.random.default_rng(6)
    first = share(np.zeros(m, dtype=np.int64), 3, 2, rng, modulus=q)[0]
    second = share(np.full(m, 77, dtype=np.int64), 3, 2, rng, modulus=q)[0]
    table = np.stack([np.bincount(first, minlength=q), np.bincount(second, minlength=q)])
    assert stats.chi2_contingency(table).pvalue > 1e-3
    assert stats.chisquare(table[0]).pvalue > 1e-3


def test_lagrange_weights_sum_to_one():
    # interpolating the constant polynomial 1 at 0 gives 1
    for xs in ([1, 2, 3], [4, 9, 11, 30]):
        assert sum(lagrange_weights(np.array(xs))) % PRIME == 1


def test_cryptographic_sharing_of_a_large_vector():
    secret = PrimeField().random(100_000)
    shares = share(secret, 5, 3)
    np.testing.assert_array_equal(reconstruct(shares[[4, 0, 2]], np.array([5, 1, 3])), secret)
    assert not np.array_equal(shares, share(secret, 5, 3))


def test_real_vectors_and_sums_of_shares():
    fp = FixedPoint(frac_bits=24)
    rng = np.random.default_rng(7)
    xs = rng.normal(scale=100, size=(4, 300))
    shared = [share_vector(x, 5, 3, fp, rng) for x in xs]
    one = reconstruct_vector(shared[0][[1, 3, 4]], np.array([2, 4, 5]), fp)
    assert np.abs(one - xs[0]).max() <= fp.precision / 2
    summed = PrimeField().sum(np.stack(shared))  # each holder adds what it received
    total = reconstruct_vector(summed[:3], np.array([1, 2, 3]), fp, n_summands=4)
    assert np.abs(total - xs.sum(axis=0)).max() <= 4 * fp.precision / 2 + 1e-9


def test_bad_arguments_are_refused():
    secret = np.arange(3)
    with pytest.raises(ValueError, match="threshold"):
        share(secret, 3, 4)
    with pytest.raises(ValueError, match="n_shares"):
        share(secret, 101, 2, modulus=101)
    with pytest.raises(ValueError, match="secret"):
        share(np.array([PRIME]), 3, 2)
    with pytest.raises(ValueError, match="distinct"):
        reconstruct(np.zeros((2, 3), dtype=np.int64), np.array([1, 1]))
    with pytest.raises(ValueError, match="share points"):
        reconstruct(np.zeros((2, 3), dtype=np.int64), np.array([0, 1]))
    with pytest.raises(ValueError, match="shape"):
        reconstruct(np.zeros((3, 3), dtype=np.int64), np.array([1, 2]))
    with pytest.raises(ValueError, match="not prime"):
        share_vector(np.ones(3), 3, 2, FixedPoint(frac_bits=2, modulus=1000, max_abs=10))
