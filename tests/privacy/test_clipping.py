"""Difference clipping (spec fed-mv-ppca §8.2 steps 1-3)."""

import itertools

import numpy as np
import pytest

from fedhier.privacy.clipping import clip_difference, clipping_bound


@pytest.mark.parametrize("norm,shape", [("l2", (7,)), ("fro", (5, 3)), ("abs", ())])
def test_clipped_difference_matches_formula(norm, shape):
    rng = np.random.default_rng(1)
    for scale in (0.01, 1.0, 100.0):
        value = rng.normal(size=shape) * scale
        anchor = rng.normal(size=shape)
        bound = 0.8
        clipped, was_clipped = clip_difference(value, anchor, bound, norm)
        difference = np.asarray(value - anchor, dtype=float)
        size = np.sqrt(np.sum(difference**2))  # l2, Frobenius and |.| alike
        np.testing.assert_allclose(clipped, difference / max(1.0, size / bound), rtol=1e-12)
        assert was_clipped == (size > bound)
        assert np.sqrt(np.sum(clipped**2)) <= bound * (1 + 1e-12)


def test_sensitivity_is_twice_the_bound():
    """Any two datasets give clipped differences at most 2 g apart, and the worst case reaches it."""
    rng = np.random.default_rng(2)
    anchor, bound = rng.normal(size=4), 0.5
    values = [anchor + rng.normal(size=4) * s for s in (0.1, 1.0, 10.0)]
    values += [anchor + 5 * np.eye(4)[0], anchor - 5 * np.eye(4)[0]]  # the worst case: opposite sides
    clipped = [clip_difference(v, anchor, bound, "l2")[0] for v in values]
    distances = [np.linalg.norm(a - b) for a, b in itertools.combinations(clipped, 2)]
    assert max(distances) <= 2 * bound * (1 + 1e-12)
    assert max(distances) == pytest.approx(2 * bound)


def test_clipping_bound_paper_and_dimension_aware():
    assert clipping_bound(0.3, 2.0) == pytest.approx(0.6)
    assert clipping_bound(0.3, 2.0, dim=9) == pytest.approx(1.8)


@pytest.mark.parametrize(
    "call",
    [
        lambda: clip_difference(np.ones(3), np.ones(4), 1.0),
        lambda: clip_difference(np.ones((2, 2)), np.ones((2, 2)), 1.0, "l2"),
        lambda: clip_difference(np.ones(3), np.ones(3), 1.0, "fro"),
        lambda: clip_difference(np.ones(3), np.ones(3), 1.0, "abs"),
        lambda: clip_difference(np.ones(3), np.ones(3), 1.0, "linf"),
        lambda: clip_difference(np.ones(3), np.ones(3), 0.0),
        lambda: clip_difference(np.array([np.nan, 0, 0]), np.ones(3), 1.0),
        lambda: clipping_bound(0.0, 1.0),
        lambda: clipping_bound(1.0, -1.0),
        lambda: clipping_bound(1.0, 1.0, dim=0),
    ],
)
def test_invalid_inputs_raise(call):
    with pytest.raises(ValueError):
        call()
