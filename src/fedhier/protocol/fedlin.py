"""FedLin round protocols (spec §2.3, §3.4, §3.5, §6): HM1, HM2 by federated EP, FedAvg.

* :class:`HM1Protocol` -- Algorithm 1. ``combine="gather"``: the :math:`\\Omega` update needs the Gram
  matrix :math:`\\Theta^\\top\\Theta`, i.e. every site's column, not a sum.
* :class:`EPProtocol` -- Algorithm 3. ``combine="sum"``: the server needs only
  :math:`\\sum_k\\Delta r_k` and :math:`\\sum_k\\Delta Q_k`, so secure summation can replace the plain sum.
* :class:`FedAvgProtocol` -- the FedAvg baseline (unweighted mean, as in the paper), also a sum.

Site data: ``(X (n_k, d), y (n_k,))`` for HM1 and FedAvg, a
:class:`~fedhier.models.fedlin.stats.SiteStats` for EP.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..models.fedlin.ep import damped_update, site_update
from ..models.fedlin.hm1 import check_step_size, local_steps, prior_shrinkage, shrinkage_message, update_omega
from ..models.fedlin.natural import symmetrise
from ..models.fedlin.stats import SiteStats, check_site
from .base import RoundProtocol, SiteContext
from .messages import Field, Message, MessageSpec

__all__ = ["HM1Protocol", "EPProtocol", "FedAvgProtocol", "sample_fraction", "settle_site_factor", "laplace_start"]

#: what a site keeps of its last Laplace search (``TiltedResult.diagnostics["laplace"]``) as ``laplace_<key>``
_LAPLACE_KEYS = ("point", "value", "grad", "hess")


def sample_fraction(fraction: float):
    """Participation rule of spec §9 #7: each round, :math:`\\max(1,\\mathrm{round}(fK))` sites uniformly
    without replacement. Returns a callable ``(round, n_sites, rng) -> sites`` for ``simulate``."""
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"participation fraction must be in (0, 1], got {fraction}")

    def choose(round: int, n_sites: int, rng: np.random.Generator):
        m = max(1, int(np.floor(fraction * n_sites + 0.5)))
        return rng.choice(n_sites, size=m, replace=False).tolist()

    return choose


def check_gradient_site(protocol: "HM1Protocol | FedAvgProtocol", site: int, data: Any) -> None:
    """An ``(X, y)`` pair of ``protocol.d`` features on which the protocol's local steps converge."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"site {site}: expected an (X, y) pair")
    check_site(data[0], data[1], site=site, n_features=protocol.d)
    check_step_size(np.asarray(data[0], float), eta=protocol.eta, batch_size=protocol.batch_size,
                    gradient=protocol.gradient, site=site)


class HM1Protocol(RoundProtocol):
    """Algorithm 1 (spec §2.3).

    Broadcast: ``theta`` :math:`\\Theta^{(c)}` (d, K), ``shrink`` :math:`S=\\Theta^{(c)}\\Omega^{-1}` (d, K),
    ``omega`` (K, K), kept by the server. Site :math:`k` receives only column :math:`k` of ``theta``
    and of ``shrink`` (:meth:`site_broadcast`, the paper's :math:`2d` floats), never another site's
    parameters. ``omega`` is in the broadcast so that the global step is a function of the previous
    broadcast (checkpoint/resume). Reply: ``theta`` :math:`\\theta_k^{(c+1)}` (d,).

    Parameters
    ----------
    n_sites, n_features : int
        :math:`K`, :math:`d`.
    eta : float
        Step size :math:`\\eta` (paper's :math:`\\eta_2`), used in the local and shrinkage steps.
    n_local_steps : int
        :math:`T`.
    alpha : float
        :math:`\\Omega` damping (0.1 default); see :func:`update_omega` for ``omega_rule``.
    omega_rule : {"paper", "rcode"}
    batch_size : int or None
        Mini-batch size (None = full-batch GD).
    gradient : {"sum", "mean"}
        Paper mode is "sum" (spec §2.4 (i)).
    shrink_scale : float
        Multiplies the shrinkage step (spec §2.4 (ii); ``n_local_steps`` matches :math:`L`).
    init : {"zeros", "random"}
        :math:`\\Theta^{(0)}`: zeros (R code) or :math:`\\mathcal N(0,0.01)` entries (spec §9 #1).
    oracle_omega : ndarray (K, K), optional
        Use this fixed :math:`\\Omega` in the shrinkage (the R code's ``omega.r``; diagnostics only).
    jitter : bool
        Spec §9 #6 jitter in the Cholesky factorisation (off by default).
    random_state : int, optional
        Seed of the random :math:`\\Theta^{(0)}`.
    """

    name = "fedlin-hm1"
    combine = "gather"

    def __init__(
        self,
        n_sites: int,
        n_features: int,
        *,
        eta: float = 1e-4,
        n_local_steps: int = 20,
        alpha: float = 0.1,
        omega_rule: str = "paper",
        batch_size: int | None = None,
        gradient: str = "sum",
        shrink_scale: float = 1.0,
        init: str = "zeros",
        oracle_omega: np.ndarray | None = None,
        jitter: bool = False,
        random_state: int | None = None,
    ):
        self.K, self.d = int(n_sites), int(n_features)
        if self.K < 1 or self.d < 1:
            raise ValueError(f"need n_sites >= 1 and n_features >= 1, got {n_sites}, {n_features}")
        if not eta > 0:
            raise ValueError(f"eta must be positive, got {eta}")
        if int(n_local_steps) < 1:
            raise ValueError(f"n_local_steps must be >= 1, got {n_local_steps}")
        if init not in ("zeros", "random"):
            raise ValueError(f"init must be 'zeros' or 'random', got {init!r}")
        if gradient not in ("sum", "mean"):
            raise ValueError(f"gradient must be 'sum' or 'mean', got {gradient!r}")
        if omega_rule not in ("paper", "rcode"):
            raise ValueError(f"omega_rule must be 'paper' or 'rcode', got {omega_rule!r}")
        self.eta, self.T, self.alpha, self.omega_rule = float(eta), int(n_local_steps), float(alpha), omega_rule
        self.batch_size, self.gradient, self.shrink_scale = batch_size, gradient, float(shrink_scale)
        self.init, self.jitter, self.random_state = init, bool(jitter), random_state
        if oracle_omega is not None:
            oracle_omega = np.asarray(oracle_omega, dtype=float)
            if oracle_omega.shape != (self.K, self.K):
                raise ValueError(f"oracle_omega must be {self.K}x{self.K}, got {oracle_omega.shape}")
        self.oracle_omega = oracle_omega

    @property
    def reply_spec(self) -> MessageSpec:
        return MessageSpec("fedlin-hm1-reply", {"theta": Field((self.d,))})

    @property
    def broadcast_spec(self) -> MessageSpec:
        return MessageSpec(
            "fedlin-hm1-broadcast",
            {"theta": Field((self.d, self.K)), "shrink": Field((self.d, self.K)), "omega": Field((self.K, self.K))},
        )

    @property
    def site_broadcast_spec(self) -> MessageSpec:
        return MessageSpec("fedlin-hm1-site-broadcast", {"theta": Field((self.d,)), "shrink": Field((self.d,))})

    def site_broadcast(self, broadcast: Message, site: int) -> Message:
        """Column ``site`` of ``theta`` and ``shrink``: theta_k and (Theta Omega^{-1})_k."""
        return {"theta": broadcast["theta"][:, site], "shrink": broadcast["shrink"][:, site]}

    def validate_site_data(self, site: int, data: Any) -> None:
        check_gradient_site(self, site, data)

    def initial_broadcast(self) -> Message:
        if self.init == "zeros":
            theta = np.zeros((self.d, self.K))
        else:
            theta = 0.1 * np.random.default_rng(self.random_state).standard_normal((self.d, self.K))
        omega = np.eye(self.K) if self.oracle_omega is None else self.oracle_omega
        return {"theta": theta, "shrink": shrinkage_message(theta, omega, jitter=self.jitter), "omega": omega}

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        X, y = ctx.data
        u = local_steps(
            np.asarray(X, float), np.asarray(y, float), broadcast["theta"], eta=self.eta, n_steps=self.T,
            batch_size=self.batch_size, gradient=self.gradient, rng=ctx.rng,
        )
        return {"theta": prior_shrinkage(u, broadcast["shrink"], eta=self.eta, shrink_scale=self.shrink_scale)}

    def global_step(self, combined: Mapping[int, Message], round: int, previous: Message) -> Message:
        theta = previous["theta"].copy()
        for k, reply in combined.items():
            theta[:, k] = reply["theta"]
        if self.oracle_omega is None:
            omega = update_omega(previous["omega"], theta, alpha=self.alpha, rule=self.omega_rule)
        else:
            omega = self.oracle_omega
        return {"theta": theta, "shrink": shrinkage_message(theta, omega, jitter=self.jitter), "omega": omega}


class FedAvgProtocol(RoundProtocol):
    """FedAvg baseline (spec §6): sites start from :math:`\\bar\\theta`, take :math:`T` local steps; the
    server averages (unweighted, as in the paper). Reply ``theta_sum`` (d,) and ``count`` (), summed."""

    name = "fedlin-fedavg"
    combine = "sum"

    def __init__(self, n_features: int, *, eta: float, n_local_steps: int = 20, batch_size: int | None = None, gradient: str = "sum"):
        self.d, self.eta, self.T = int(n_features), float(eta), int(n_local_steps)
        self.batch_size, self.gradient = batch_size, gradient

    @property
    def reply_spec(self) -> MessageSpec:
        return MessageSpec("fedlin-fedavg-reply", {"theta_sum": Field((self.d,)), "count": Field(())})

    @property
    def broadcast_spec(self) -> MessageSpec:
        return MessageSpec("fedlin-fedavg-broadcast", {"theta": Field((self.d,))})

    def validate_site_data(self, site: int, data: Any) -> None:
        check_gradient_site(self, site, data)

    def initial_broadcast(self) -> Message:
        return {"theta": np.zeros(self.d)}

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        X, y = ctx.data
        theta = local_steps(
            np.asarray(X, float), np.asarray(y, float), broadcast["theta"], eta=self.eta, n_steps=self.T,
            batch_size=self.batch_size, gradient=self.gradient, rng=ctx.rng,
        )
        return {"theta_sum": theta, "count": np.array(1.0)}

    def global_step(self, combined: Message, round: int, previous: Message) -> Message:
        return {"theta": combined["theta_sum"] / combined["count"]}


def laplace_start(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Where a site's last Laplace search ended, with its log likelihood's derivatives there (the
    ``start`` of :func:`~fedhier.models.fedlin.tilted.tilted_moments`), or None before its first."""
    if "laplace_point" not in state:
        return None
    return {k: state[f"laplace_{k}"] for k in _LAPLACE_KEYS}


def settle_site_factor(state: Mapping[str, np.ndarray], broadcast: Message) -> tuple[np.ndarray, np.ndarray]:
    """The site's factor :math:`(r_k,Q_k)` after applying its pending delta with the damping the
    server recorded for that round (``broadcast["damping_log"]``). Runs on the site."""
    r_k, Q_k = state["r_k"].copy(), state["Q_k"].copy()
    pending = int(state["pending_round"])
    if pending > 0:
        delta = float(broadcast["damping_log"][pending - 1])
        r_k = r_k + delta * state["pending_dr"]
        Q_k = symmetrise(Q_k + delta * state["pending_dQ"])
    return r_k, Q_k


class EPProtocol(RoundProtocol):
    """Algorithm 3, federated Gaussian EP in natural parameters (spec §3.4).

    Broadcast: ``r`` (p,), ``Q`` (p, p) of :math:`q(\\phi)` and ``damping_log`` (max_rounds,), the
    damping :math:`\\delta` the server applied in each round (0 for rounds not yet run).
    Reply (summed): the **undamped** ``dr`` (p,), ``dQ`` (p, p), and the counts ``n_updated`` and
    ``n_unconverged`` (sites whose MCMC split-:math:`\\hat R` exceeded ``rhat_max``).
    Site state: its factor ``r_k``, ``Q_k``, the pending delta and the round it was sent in (and where
    its last Laplace search ended, with the derivatives of its log likelihood there: the next search
    starts from them; and its last importance draws with their log weights without the cavity's term,
    which its posterior after the fit reweights, and their standard normal offsets, which its next
    round's draws use again); a site
    applies :math:`\\delta` to it when it next takes part (or in :func:`settle_site_factor`), so
    that :math:`Q=Q_0+\\sum_kQ_k` on both sides. Sites start flat (spec §9 #13).

    Parameters
    ----------
    model : GaussianHierarchy, BayesianRidge or BayesianLasso
    max_rounds : int
        Length of ``damping_log`` (the largest ``n_rounds`` this protocol can run).
    damping : float
        Initial :math:`\\delta` of every round (spec §9 #12), 1 for a step within one posterior sd
        (:func:`~fedhier.models.fedlin.ep.damped_update`); backed off by 0.8 while the new
        global precision is not positive definite.
    tilted_options : dict, optional
        Passed to :func:`~fedhier.models.fedlin.tilted.tilted_moments` (``method``, ``n_draws``,
        ``mcmc`` ...).
    rhat_max : float
        MCMC convergence threshold reported in ``n_unconverged``.
    """

    name = "fedlin-ep"
    combine = "sum"

    def __init__(self, model, *, max_rounds: int, damping: float = 0.5, tilted_options: dict | None = None, rhat_max: float = 1.1):
        if not 0.0 < damping <= 1.0:
            raise ValueError(f"damping must be in (0, 1], got {damping}")
        if int(max_rounds) < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.model, self.max_rounds, self.damping = model, int(max_rounds), float(damping)
        self.tilted_options = dict(tilted_options or {})
        self.rhat_max = float(rhat_max)
        self.p = p = model.p
        self._reply_spec = MessageSpec(
            "fedlin-ep-reply",
            {"dr": Field((p,)), "dQ": Field((p, p)), "n_updated": Field(()), "n_unconverged": Field(())},
        )
        self._broadcast_spec = MessageSpec(
            "fedlin-ep-broadcast", {"r": Field((p,)), "Q": Field((p, p)), "damping_log": Field((self.max_rounds,))}
        )

    @property
    def reply_spec(self) -> MessageSpec:
        return self._reply_spec

    @property
    def broadcast_spec(self) -> MessageSpec:
        return self._broadcast_spec

    def validate_site_data(self, site: int, data: Any) -> None:
        if not isinstance(data, SiteStats):
            raise ValueError(f"site {site}: EP sites hold SiteStats, got {type(data).__name__}")
        if data.d != self.model.d:
            raise ValueError(f"site {site}: {data.d} features, the model has {self.model.d}")

    def initial_broadcast(self) -> Message:
        m0, S0 = self.model.prior()
        Q0 = symmetrise(np.linalg.inv(S0))
        return {"r": Q0 @ m0, "Q": Q0, "damping_log": np.zeros(self.max_rounds)}

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        p = self.p
        state = ctx.state
        if "r_k" in state:
            r_k, Q_k = settle_site_factor(state, broadcast)
        else:
            r_k, Q_k = np.zeros(p), np.zeros((p, p))
        init = {"phi": state["chain_phi"], "theta": state["chain_theta"]} if "chain_phi" in state else None
        options = dict(self.tilted_options)
        if not self.model.closed_form:
            options["init"] = init
        else:  # the Laplace search starts where the site's previous one ended, with its normal offsets
            options["start"] = laplace_start(state)
            options["offsets"] = state.get("normal_offsets")
            if ctx.round == 1 and options.get("n_pilot") is not None:
                # every cavity is the prior, under which a tilted law is rarely near a Gaussian: no pilot.  Round 1
                # is EP's start, whose deltas the later rounds estimate again, and the pilot's count of draws
                # serves (a site whose ESS falls short sits the round out)
                options["n_draws"] = options.pop("n_pilot")
        upd = site_update(self.model, ctx.data, broadcast["r"], broadcast["Q"], r_k, Q_k, ctx.rng, **options)
        ok = upd.tilted is not None
        state.update(r_k=r_k, Q_k=Q_k, pending_dr=upd.dr, pending_dQ=upd.dQ, pending_round=np.array(ctx.round if ok else 0, dtype=np.int64))
        if ok and "laplace" in upd.tilted.diagnostics:
            state.update({f"laplace_{k}": np.asarray(upd.tilted.diagnostics["laplace"][k], dtype=float) for k in _LAPLACE_KEYS})
        if ok and "log_ratio" in upd.tilted.diagnostics:  # the importance draws, reweighted for the site's posterior
            state.update(tilted_points=np.column_stack([upd.tilted.phi, upd.tilted.local]),
                         tilted_log_ratio=upd.tilted.diagnostics["log_ratio"], normal_offsets=upd.tilted.diagnostics["offsets"])
        unconverged = 0.0
        if ok and "rhat" in upd.tilted.diagnostics:
            state.update(chain_phi=upd.tilted.diagnostics["last_phi"], chain_theta=upd.tilted.diagnostics["last_theta"])
            unconverged = float(upd.tilted.diagnostics["rhat"] > self.rhat_max)
        return {"dr": upd.dr, "dQ": upd.dQ, "n_updated": np.array(float(ok)), "n_unconverged": np.array(unconverged)}

    def global_step(self, combined: Message, round: int, previous: Message) -> Message:
        if round > self.max_rounds:
            raise ValueError(f"round {round} exceeds max_rounds={self.max_rounds}")
        r, Q, delta = damped_update(previous["r"], previous["Q"], combined["dr"], symmetrise(combined["dQ"]), self.damping)
        log = previous["damping_log"].copy()
        log[round - 1] = delta
        return {"r": r, "Q": Q, "damping_log": log}

    def round_metrics(self, combined: Message, round: int) -> dict[str, float]:
        return {"sites_updated": float(combined["n_updated"]), "sites_unconverged": float(combined["n_unconverged"])}
