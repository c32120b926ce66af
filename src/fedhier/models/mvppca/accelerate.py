"""EM acceleration across rounds: SQUAREM on the global loadings and means the coordinator broadcasts.

One round is a map theta~ -> F(theta~): the broadcast global model, the sites' (MAP-)EM from it and
the master's step on their sums.  SQUAREM (Varadhan & Roland 2008, Scand. J. Statist. 35, 335-353)
takes two plain rounds from theta_0,

    theta_1 = F(theta_0),   theta_2 = F(theta_1),   r = theta_1 - theta_0,   v = theta_2 - 2 theta_1 + theta_0,

and broadcasts the extrapolation with the step length S3,

    a = ||r|| / ||v||  (clipped to [1, a_max]),   theta' = theta_0 + 2 a r + a^2 v,

which is theta_2 for a = 1.  The extrapolated part of theta is the stacked (mu~, W~) of every view; the
variances (sigma2_mu~, sigma2_W~, the inverse-gamma prior of the noise, s-bar) are those of theta_2, with
sigma2_W~ kept under the master's cap ||W~||_F / 5: the variances near 0 have no useful
differences, and they stay positive.  The next cycle starts at theta'.

Safeguard (the residual form of SQUAREM without an objective): the replies to theta' give F(theta'); the
extrapolation is kept when F(theta') moved theta' by at most :data:`SLACK` times what F(theta_1) moved
theta_1, both measured as the change of the predictions (:func:`fedhier.models.mvppca.model_change`, the
stopping rule's quantity).  Otherwise the loop goes on from theta_2, as if (theta_1, theta_2) were a
cycle's first two rounds, and a_max is divided by :data:`STEP_FACTOR`; it is multiplied by it when a step
reaches it (SQUAREM's adaptive a_max, starting at 1).  A rejected extrapolation costs the one round that
tried it; every round is counted (a round is one broadcast and its replies).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .master import loading_variance_cap
from .params import GlobalParams
from .predictive import model_change

__all__ = ["Squarem", "ACCELERATIONS", "SLACK", "STEP_FACTOR"]

#: the accelerations a fit may ask for (None: the paper's plain rounds)
ACCELERATIONS = ("squarem", None)
#: an extrapolation is kept when the round from it changes the predictions at most this many times as much
#: as the round from theta_1
SLACK = 2.0
#: a_max grows by this factor when a step reaches it and shrinks by it after a rejected step
STEP_FACTOR = 4.0


def _means(params: GlobalParams, views: list[str]) -> np.ndarray:
    """(mu~, W~) of every view, one vector of shape (sum_k d_k (1 + q),): mu~_k, then W~_k row by row."""
    return np.concatenate([np.concatenate([np.ravel(params[v].mu), np.ravel(params[v].W)]) for v in views])


def _with_means(vector: np.ndarray, params: GlobalParams, views: list[str]) -> GlobalParams:
    """``params`` with (mu~, W~) from ``vector`` (the layout of :func:`_means`), sigma2_W~ under its cap."""
    out: GlobalParams = dict(params)
    at = 0
    for view in views:
        g = params[view]
        d, q = np.shape(g.W)
        mu, W = vector[at:at + d].copy(), vector[at + d:at + d + d * q].reshape(d, q).copy()
        at += d + d * q
        cap = loading_variance_cap(W)
        columns = np.minimum(np.asarray(g.sigma2_W_columns, dtype=float), cap)
        out[view] = replace(g, mu=mu, W=W, sigma2_W=min(float(g.sigma2_W), cap), sigma2_W_columns=columns)
    return out


class Squarem:
    """The coordinator's SQUAREM over rounds (module docstring); one instance follows one fit.

    :meth:`step` takes the round's broadcast theta~ (``previous``) and the master's step from the replies,
    F(theta~) (``mapped``), and returns what to broadcast next.  :meth:`reset` forgets the cycle (a new fit
    starts a new cycle).  :meth:`state` and :meth:`restore` carry the cycle through a checkpoint, so a
    resumed fit extrapolates as the uninterrupted one does.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start: np.ndarray | None = None  # theta_0 of the cycle under way
        self._first: GlobalParams | None = None  # theta_1 = F(theta_0)
        self._plain: GlobalParams | None = None  # theta_2 while the extrapolation from it is being tried
        self._before = np.inf  # how much F(theta_1) changed theta_1's predictions
        self.max_step = 1.0
        #: the step lengths a taken (a diagnostic); 0 for an extrapolation the safeguard dropped
        self.steps: list[float] = []

    def state(self) -> dict[str, np.ndarray | GlobalParams]:
        """The cycle under way: ``max_step``, ``before``, ``steps`` (arrays) and, when set, ``start`` (the stacked
        theta_0), ``first`` and ``plain`` (global parameters)."""
        out: dict[str, np.ndarray | GlobalParams] = {
            "max_step": np.asarray(self.max_step), "before": np.asarray(self._before),
            "steps": np.asarray(self.steps, dtype=float)}
        for name, value in (("start", self._start), ("first", self._first), ("plain", self._plain)):
            if value is not None:
                out[name] = value
        return out

    def restore(self, state: dict[str, np.ndarray | GlobalParams]) -> None:
        """Go on with the cycle of :meth:`state`; ValueError when its parts do not fit together."""
        try:
            max_step, before = float(state["max_step"]), float(state["before"])
            steps = np.asarray(state["steps"], dtype=float)
        except (KeyError, TypeError, ValueError):
            raise ValueError("the saved extrapolation state is incomplete") from None
        start, first, plain = state.get("start"), state.get("first"), state.get("plain")
        if not (max_step >= 1.0 and np.isfinite(max_step)) or np.isnan(before) or steps.ndim != 1:
            raise ValueError("the saved extrapolation state is damaged")
        if start is not None and (first is None or np.shape(start) != _means(first, list(first)).shape):
            raise ValueError("the saved extrapolation state is damaged (its theta_0 does not fit theta_1)")
        if plain is not None and (first is None or set(plain) != set(first)):
            raise ValueError("the saved extrapolation state is damaged (its theta_2 does not fit theta_1)")
        self.reset()
        self.max_step, self._before, self.steps = max_step, before, [float(a) for a in steps]
        self._start = None if start is None else np.asarray(start, dtype=float)
        self._first, self._plain = first, plain

    def step(self, previous: GlobalParams, mapped: GlobalParams) -> GlobalParams:
        views = list(mapped)
        if set(previous) != set(views):
            self.reset()  # a view came or went: no common vector to extrapolate
            return mapped
        change = model_change(previous, mapped)
        if self._plain is not None:  # previous is theta': keep it if the round moved it little enough
            plain, first = self._plain, self._first
            self._plain = None
            if not change <= SLACK * self._before:
                self.steps[-1] = 0.0
                self.max_step = max(1.0, self.max_step / STEP_FACTOR)
                self._start, self._first = _means(first, views), plain  # go on from theta_2
                return plain
            self._first = None
        theta1 = _means(previous, views)
        if self._first is None or not np.array_equal(_means(self._first, views), theta1):
            self._start, self._first = theta1, mapped  # the cycle's first round
            return mapped
        theta0, theta2 = self._start, _means(mapped, views)
        r, v = theta1 - theta0, theta2 - 2.0 * theta1 + theta0
        norm_v = float(np.linalg.norm(v))
        a = float(np.clip(np.linalg.norm(r) / norm_v, 1.0, self.max_step)) if norm_v > 0.0 else 1.0
        self.steps.append(a)
        if a == self.max_step:
            self.max_step *= STEP_FACTOR
        self._start = self._first = None
        extrapolated = theta0 + 2.0 * a * r + a**2 * v
        if a == 1.0 or not np.all(np.isfinite(extrapolated)):
            return mapped  # theta' = theta_2: the plain step, and the next cycle starts at it
        self._plain, self._first, self._before = mapped, previous, change
        return _with_means(extrapolated, mapped, views)
