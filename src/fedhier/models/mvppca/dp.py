"""DP-Fed-mv-PPCA: the per-round site procedure of Algorithm 2 (spec fed-mv-ppca §8.2).

After the local MAP of §4.3 has produced theta_c[r], every view k of the analysis and every
block b in {mu^(k), W^(k), sigma^(k)2} is released separately.  A view no subject at the
site measures is released too, at the anchor (:func:`complete_views`): which views a site
measures never shows in which fields it sends, so protecting the whole site also protects
the one subject who may be the only one there with a view.

1. anchor a_b: mu~^(k)[r-1], W~^(k)[r-1], and for sigma2 s-bar^(k)[r-1] ([R], default)
   or the inverse-gamma mean beta / (alpha - 1);
2. clip the difference theta_b - a_b to norm g_b = kappa * sd_b[r-1] (l2 for mu,
   Frobenius for W, absolute value for sigma2), sd_b = sqrt(sigma2_mu~),
   sqrt(sigma2_W~), sqrt(v_sigma); optionally g_b = kappa sd_b sqrt(dim) (§8.5 [R]);
3. sensitivity 2 g_b;
4. perturb: Gaussian (mu), matrix-normal (W), Laplace [P] or Gaussian [R] (sigma2);
5. release a_b + clipped difference + noise; sigma2 is floored (post-processing).

A view of d_k <= q features has q_k = d_k - 1 free columns of W (§4.4); its other
columns are 0 in every site's and every global model, whatever the data, so only the free
columns are perturbed and the rest are released as 0 (a view of one feature releases a W
of zeros and a W spread of 0).  Those releases are still counted as full releases, so the
reported epsilon stays an upper bound and the ledger can be rebuilt from who sent which views.

Every release's ``dp_accounting`` event goes into the site's
:class:`~fedhier.privacy.ledger.PrivacyLedger` entry, labelled ``"<view>.<block>"``.
This module is the only PPCA-aware part of the privacy layer.

With the EM prior update (``prior_update="em"``, :mod:`.spread`) a site also sends, per
observed view, the traces of its posterior covariances tr Cov(mu_c), tr Cov(W_c)
(:data:`SPREAD_BLOCKS`).  :func:`privatize_spread` releases each as a scalar in
[0, B] with B = d_k sigma2_mu~ resp. d_k q_k sigma2_W~ of the anchor (a posterior
variance never exceeds the prior's, so B clips nothing from round 2 on): clip to
[0, B], Gaussian mechanism with sensitivity B and the Gaussian noise multiplier, clip
to [0, B] again (post-processing).  Two more Gaussian events per view and round.

Round 1 (§8.2, §14 row 13): with ``first_round="public_prior"`` [R] the anchor is a
public data-independent theta~[0] (``master.data_independent_prior`` when none is
given), and round 1 is privatised and counted like any other.  With
``"non_private"`` -- switched on by ``unsafe_public_first_round=True``, the paper's apparent
setting, kept for reproduction only -- round 1 is released as is (with a ``UserWarning``) and
recorded as a ``NonPrivateDpEvent``: the ledger then reports epsilon = inf and says why.

Guard on the sigma2 bound [R]: the IG variance v_sigma is infinite for alpha <= 2 and
huge just above the master's floor alpha = 2 + 1e-5, which would make g (and the
noise) useless.  With ``sigma2_sd_cap = c`` (default 10) the standard deviation used
for clipping is ``min(sqrt(v_sigma), c * a_sigma2)``: the prior's coefficient of
variation is capped at c.  The cap depends only on public quantities, so DP is kept.
``sigma2_sd_cap=None`` uses sqrt(v_sigma) as is and refuses an infinite one.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from dp_accounting import dp_event

from ...privacy.budget import Mechanism, PerReleaseBudget, TotalBudget, check_budget
from ...privacy.calibration import GaussianCalibration
from ...privacy.clipping import clip_difference, clipping_bound
from ...privacy.ledger import PrivacyLedger
from ...privacy.mechanisms import release_gaussian, release_laplace
from ...privacy.sampling import NoiseSource
from .mstep import effective_columns
from .params import GlobalParams, GlobalView, LocalParams, ViewParams

__all__ = [
    "complete_views", "BLOCKS", "SPREAD_BLOCKS", "released_blocks", "privatize_spread", "DPConfig", "privatize_site_params", "round_events", "record_round", "site_ledger", "denoise_global",
    "ledger_from_history",
]

#: released blocks per observed view, in release order
BLOCKS = ("mu", "W", "sigma2")
#: the posterior-spread scalars released per observed view with the EM prior update
SPREAD_BLOCKS = ("post_var_mu", "post_var_W")


def released_blocks(spread: bool = False) -> tuple[str, ...]:
    """Blocks a site releases per observed view and round (with the spread scalars or not)."""
    return BLOCKS + SPREAD_BLOCKS if spread else BLOCKS


@dataclass(frozen=True)
class DPConfig:
    """Privacy settings of DP-Fed-mv-PPCA (the estimator's ``privacy=``).

    Parameters
    ----------
    budget : PerReleaseBudget or TotalBudget
        Paper semantics ((epsilon, delta) per block per round) or a total budget per
        site for the whole fit; see :mod:`fedhier.privacy.budget`.
    kappa : float
        Clipping constant; the paper uses 1 (§12.4).
    sigma2_mechanism : {"laplace", "gaussian"} or None
        Mechanism of the sigma2 blocks.  None: Laplace for a per-release budget [P],
        Gaussian for a total budget (required there, §8.4 [R]).
    sigma2_anchor : {"mean", "ig_mean"}
        s-bar[r-1] [R, default] or the IG mean beta / (alpha - 1).
    first_round : {"public_prior", "non_private"}
        See the module docstring.  A total budget refuses "non_private".
    unsafe_public_first_round : bool, default False
        True sends round 1 without noise (``first_round="non_private"``) to reproduce the
        paper's numbers: the differential-privacy guarantee does NOT hold for such a fit (a
        ``UserWarning`` says so and the privacy ledger marks every site's guarantee void).
    sigma2_floor : float
        Post-processing floor of released sigma2 (§8.2 step 5 [R]).
    dimension_aware : bool
        Use g = kappa sd sqrt(d_k) for mu and kappa sd sqrt(d_k q_k) for W (§8.5 [R]; q_k = q
        unless the view has d_k <= q features, see the module docstring).
    sigma2_sd_cap : float or None
        Cap on sd/anchor for the sigma2 block (module docstring).
    max_prior_sd : float or None
        Cap on the prior standard deviation used in the bounds of the mu and W blocks,
        g = kappa * min(sd, max_prior_sd) [R].  Without it the bound feeds back on
        itself: the master re-estimates sd from noisy releases, so with a large noise
        multiplier z (any meaningful total budget) sd grows by about 2 z kappa per round
        and the fit diverges (the mirror image of the collapse of §8.5).  The cap is a
        public constant, so DP is unaffected.  None (default for a per-release budget,
        paper fidelity) keeps the paper's bound; a total budget defaults to 1.0, the
        standard deviation of the public theta~[0] (unit variances, data scaled to [0, 1]).
    denoise : bool or "auto"
        Post-process the master's ML step on the releases with :func:`denoise_global`
        [R]: shrink the global means towards their anchors and, where the noise is at least
        the prior's spread, remove the known noise variance from the spreads, so that large
        noise degrades the model towards the public prior instead of a random walk, and a
        smaller noise still lets the clipping bound anneal (:func:`denoise_global`).  "auto": on for a total budget, off for a
        per-release budget (paper fidelity).
    """

    budget: PerReleaseBudget | TotalBudget
    kappa: float = 1.0
    sigma2_mechanism: Mechanism | None = None
    sigma2_anchor: Literal["mean", "ig_mean"] = "mean"
    first_round: Literal["public_prior", "non_private"] = "public_prior"
    unsafe_public_first_round: bool = False
    sigma2_floor: float = 1e-6
    dimension_aware: bool = False
    sigma2_sd_cap: float | None = 10.0
    max_prior_sd: float | None | Literal["auto"] = "auto"
    denoise: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.budget, (PerReleaseBudget, TotalBudget)):
            raise ValueError(
                f"budget must be a PerReleaseBudget or a TotalBudget, got {type(self.budget).__name__}"
            )
        if not (math.isfinite(self.kappa) and self.kappa > 0):
            raise ValueError(f"kappa must be positive and finite, got {self.kappa!r}")
        total = isinstance(self.budget, TotalBudget)
        if self.denoise == "auto":
            object.__setattr__(self, "denoise", total)
        if not isinstance(self.denoise, bool):
            raise ValueError(f"denoise must be True, False or 'auto', got {self.denoise!r}")
        if self.max_prior_sd == "auto":
            object.__setattr__(self, "max_prior_sd", 1.0 if total else None)
        if self.max_prior_sd is not None and not (math.isfinite(self.max_prior_sd) and self.max_prior_sd > 0):
            raise ValueError(f"max_prior_sd must be positive and finite or None, got {self.max_prior_sd!r}")
        if self.sigma2_mechanism is None:
            object.__setattr__(self, "sigma2_mechanism", "gaussian" if total else "laplace")
        if self.sigma2_mechanism not in ("laplace", "gaussian"):
            raise ValueError(
                f"sigma2_mechanism must be 'laplace' or 'gaussian', got {self.sigma2_mechanism!r}"
            )
        if total and self.sigma2_mechanism != "gaussian":
            raise ValueError(
                "a total budget uses the Gaussian mechanism for every block: set sigma2_mechanism='gaussian'"
            )
        if self.sigma2_anchor not in ("mean", "ig_mean"):
            raise ValueError(f"sigma2_anchor must be 'mean' or 'ig_mean', got {self.sigma2_anchor!r}")
        if self.first_round not in ("public_prior", "non_private"):
            raise ValueError(f"first_round must be 'public_prior' or 'non_private', got {self.first_round!r}")
        if not isinstance(self.unsafe_public_first_round, bool):
            raise ValueError(f"unsafe_public_first_round must be True or False, got {self.unsafe_public_first_round!r}")
        if self.unsafe_public_first_round or self.first_round == "non_private":
            object.__setattr__(self, "first_round", "non_private")
            object.__setattr__(self, "unsafe_public_first_round", True)
            warnings.warn(
                "round 1 is sent without noise (unsafe_public_first_round=True): the differential-privacy "
                "guarantee does not hold for this fit; use it only to reproduce the paper's numbers",
                UserWarning,
                stacklevel=3,
            )
        if total and self.first_round == "non_private":
            raise ValueError(
                "first_round='non_private' voids the guarantee, so no total budget can be met; "
                "use first_round='public_prior'"
            )
        if not (math.isfinite(self.sigma2_floor) and self.sigma2_floor > 0):
            raise ValueError(f"sigma2_floor must be positive and finite, got {self.sigma2_floor!r}")
        cap = self.sigma2_sd_cap
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"sigma2_sd_cap must be positive and finite or None, got {cap!r}")

    @classmethod
    def per_release(
        cls, epsilon: float, delta: float, *, calibration: GaussianCalibration = "zhao", **options
    ) -> "DPConfig":
        """Paper semantics: (epsilon, delta) per block per round (§12.4 uses (10, 0.01), kappa = 1)."""
        return cls(PerReleaseBudget(epsilon, delta, calibration), **options)

    @classmethod
    def total(
        cls, epsilon: float, delta: float, *, n_rounds: int, n_views: int, spread: bool = False, **options
    ) -> "DPConfig":
        """Total budget per site over ``n_rounds`` rounds for a site observing at most ``n_views`` views.

        Each round releases ``3 * n_views`` blocks, ``5 * n_views`` with ``spread`` (the EM
        prior update's two posterior-spread scalars per view); the Gaussian noise
        multiplier is calibrated up front (:class:`~fedhier.privacy.budget.TotalBudget`).
        """
        return cls(TotalBudget(epsilon, delta, n_rounds, len(released_blocks(spread)) * n_views), **options)

    def noise_multipliers(self) -> dict[str, tuple[Mechanism, float]]:
        """``{block: (mechanism, noise multiplier)}`` of every block (same for every view and round)."""
        return {
            "mu": ("gaussian", self.budget.noise_multiplier("gaussian")),
            "W": ("gaussian", self.budget.noise_multiplier("gaussian")),
            "sigma2": (self.sigma2_mechanism, self.budget.noise_multiplier(self.sigma2_mechanism)),
        }


def _sigma2_anchor(view: str, prior: GlobalView, config: DPConfig) -> float:
    if config.sigma2_anchor == "mean":
        anchor = float(prior.noise_var)
    else:
        if not prior.alpha > 1:
            raise ValueError(
                f"view {view!r}: sigma2_anchor='ig_mean' needs alpha > 1, got alpha={prior.alpha}"
            )
        anchor = float(prior.beta / (prior.alpha - 1.0))
    if not (math.isfinite(anchor) and anchor > 0):
        raise ValueError(f"view {view!r}: the sigma2 anchor must be positive and finite, got {anchor}")
    return anchor


def _sigma2_sd(view: str, prior: GlobalView, anchor: float, config: DPConfig) -> float:
    sd = math.sqrt(prior.var_sigma) if prior.var_sigma >= 0 else math.nan
    if config.sigma2_sd_cap is not None:
        sd = min(sd, config.sigma2_sd_cap * anchor)
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(
            f"view {view!r}: the IG prior variance v_sigma={prior.var_sigma} gives no usable clipping bound "
            "for sigma2; set sigma2_sd_cap (e.g. 10) to cap its standard deviation"
        )
    return sd


def _bounds(view: str, prior: GlobalView, config: DPConfig) -> tuple[float, float, float, float]:
    """(g_mu, g_W, sigma2 anchor, g_sigma2) of one view: public functions of theta~[r-1] (§8.2)."""
    d, q = prior.W.shape
    dims = {"mu": d, "W": d * effective_columns(d, q)} if config.dimension_aware else {"mu": None, "W": None}
    for block, variance in (("mu", prior.sigma2_mu), ("W", prior.sigma2_W)):
        if not (math.isfinite(variance) and variance > 0):
            raise ValueError(f"view {view!r}: prior variance of {block} must be positive and finite, got {variance}")
    cap = math.inf if config.max_prior_sd is None else config.max_prior_sd
    g_mu = clipping_bound(min(math.sqrt(prior.sigma2_mu), cap), config.kappa, dims["mu"])
    g_W = clipping_bound(min(math.sqrt(prior.sigma2_W), cap), config.kappa, dims["W"])
    a_sigma2 = _sigma2_anchor(view, prior, config)
    g_sigma2 = clipping_bound(_sigma2_sd(view, prior, a_sigma2, config), config.kappa)
    return g_mu, g_W, a_sigma2, g_sigma2


def _release_plan(
    params: LocalParams, anchor: GlobalParams, config: DPConfig
) -> list[tuple[str, str, np.ndarray, np.ndarray, float, str]]:
    """Validate everything and list ``(view, block, value, anchor, bound, norm)`` before any release."""
    plan = []
    for view, local in params.items():
        if view not in anchor:
            raise ValueError(f"view {view!r}: no global prior to anchor its release (views: {sorted(anchor)})")
        prior = anchor[view]
        d, q = local.W.shape
        if np.shape(local.mu) != (d,) or prior.W.shape != (d, q) or np.shape(prior.mu) != (d,):
            raise ValueError(
                f"view {view!r}: local mu {np.shape(local.mu)} / W {local.W.shape} do not match the prior's "
                f"mu {np.shape(prior.mu)} / W {prior.W.shape}"
            )
        g_mu, g_W, a_sigma2, g_sigma2 = _bounds(view, prior, config)
        plan += [
            (view, "mu", local.mu, prior.mu, g_mu, "l2"),
            (view, "W", local.W, prior.W, g_W, "fro"),
            (view, "sigma2", np.asarray(float(local.sigma2)), np.asarray(a_sigma2), g_sigma2, "abs"),
        ]
    return plan


def round_events(views, config: DPConfig, *, spread: bool = False) -> list[tuple[str, dp_event.DpEvent]]:
    """``[(block label, DpEvent)]`` a site releasing ``views`` makes in one private round.

    The events depend on the configuration only, never on the data, so whoever runs
    the rounds (e.g. a parent process when sites run in a pool) can mirror a site's
    ledger entries from the views it replied with.  Labels are ``"<view>.<block>"``
    in release order; ``spread`` appends the :data:`SPREAD_BLOCKS` of every view
    (released after the parameters, :func:`privatize_spread`).
    """
    out = []
    for view in views:
        for block, (mechanism, multiplier) in config.noise_multipliers().items():
            if mechanism == "gaussian":
                out.append((f"{view}.{block}", dp_event.GaussianDpEvent(multiplier)))
            else:
                out.append((f"{view}.{block}", dp_event.LaplaceDpEvent(multiplier)))
    if spread:
        out += _spread_events(views, config)
    return out


def _spread_events(views, config: DPConfig) -> list[tuple[str, dp_event.DpEvent]]:
    multiplier = config.budget.noise_multiplier("gaussian")
    return [(f"{view}.{block}", dp_event.GaussianDpEvent(multiplier)) for view in views for block in SPREAD_BLOCKS]


def privatize_spread(
    spread: dict[str, tuple[float, float]],
    anchor: GlobalParams,
    config: DPConfig,
    noise: NoiseSource,
    *,
    site,
    round: int,
    ledger: PrivacyLedger,
) -> dict[str, tuple[float, float]]:
    """Release a site's posterior spread (tr Cov(mu_c), tr Cov(W_c)) per view with DP (module docstring).

    ``anchor`` is theta~[r-1] (theta~[0] in round 1), as for :func:`privatize_site_params`,
    which the site calls first.  Each value is clipped to [0, B] (B = d_k sigma2_mu~ or
    d_k q_k sigma2_W~ of the anchor, sigma2 capped at ``max_prior_sd``^2), released with the
    Gaussian mechanism of sensitivity B, and clipped to [0, B] again.

    Raises
    ------
    ValueError
        On a view without anchor (nothing released or recorded).
    fedhier.privacy.PrivacyBudgetExhausted
        With a total budget, when these releases would exceed it.
    """
    if round == 1 and config.first_round == "non_private":
        for view in spread:
            for block in SPREAD_BLOCKS:
                ledger.record(site, round, f"{view}.{block}", dp_event.NonPrivateDpEvent())
        return dict(spread)
    missing = [view for view in spread if anchor is None or view not in anchor]
    if missing:
        raise ValueError(f"views {missing}: no global prior to bound their posterior spread")
    check_budget(ledger, config.budget, site, round, [event for _, event in _spread_events(spread, config)])
    cap = math.inf if config.max_prior_sd is None else config.max_prior_sd**2
    multiplier = config.budget.noise_multiplier("gaussian")
    out = {}
    for view, values in spread.items():
        prior = anchor[view]
        d, q = prior.W.shape
        bounds = (d * min(prior.sigma2_mu, cap), d * effective_columns(d, q) * min(prior.sigma2_W, cap))
        released = []
        for block, value, bound in zip(SPREAD_BLOCKS, values, bounds):
            if bound == 0.0:  # a view of one feature has no free loading: its spread is 0 whatever the data
                ledger.record(site, round, f"{view}.{block}", dp_event.GaussianDpEvent(multiplier))
                released.append(0.0)
                continue
            noised, event = release_gaussian(np.asarray(min(max(float(value), 0.0), bound)), multiplier, bound, noise)
            ledger.record(site, round, f"{view}.{block}", event)
            released.append(min(max(float(noised), 0.0), bound))
        out[view] = (released[0], released[1])
    return out


def complete_views(
    params: LocalParams, spread: dict[str, tuple[float, float]] | None, views, anchor: GlobalParams, config: DPConfig
) -> tuple[LocalParams, dict[str, tuple[float, float]] | None]:
    """A site's parameters (and posterior spread) over every view of the analysis, ``views``, in that order.

    A view the site does not measure (absent from ``params``) has no data, so its posterior
    is the prior: it is filled in at the anchor theta~[r-1] (mu~, W~ and the sigma2 anchor),
    each clipped difference is 0 and each release the anchor plus noise, as for any view;
    its spread (EM prior update) is the prior's, (d_k sigma2_mu~, d_k q_k sigma2_W~), which
    :func:`privatize_spread` clips like any other.  Nothing here reads data.
    """
    missing = [view for view in views if view not in params and view not in anchor]
    if missing:
        raise ValueError(f"views {missing}: no global prior to release them at")
    out_params: LocalParams = {}
    out_spread = None if spread is None else {}
    for view in views:
        if view in params:
            out_params[view] = params[view]
            if spread is not None:
                out_spread[view] = spread[view]
            continue
        prior = anchor[view]
        out_params[view] = ViewParams(mu=np.array(prior.mu, dtype=float), W=np.array(prior.W, dtype=float),
                                      sigma2=_sigma2_anchor(view, prior, config))
        if spread is not None:
            d, q = prior.W.shape
            out_spread[view] = (d * prior.sigma2_mu, d * effective_columns(d, q) * prior.sigma2_W)
    return out_params, out_spread


def privatize_site_params(
    params: LocalParams,
    anchor: GlobalParams | None,
    config: DPConfig,
    noise: NoiseSource,
    *,
    site,
    round: int,
    ledger: PrivacyLedger,
) -> LocalParams:
    """Release a site's local parameters of one round with DP (§8.2, Algorithm 2).

    Parameters
    ----------
    params : LocalParams
        ``{view: ViewParams(mu (d_k,), W (d_k, q), sigma2)}`` for the site's observed
        views, as produced by the local MAP (§4.3).
    anchor : GlobalParams or None
        theta~[r-1], the previous broadcast (public).  In round 1 with
        ``first_round="public_prior"``, None means ``master.data_independent_prior``.
    config : DPConfig
    noise : NoiseSource
        The site's source of secrets (:class:`fedhier.privacy.sampling.NoiseSource`, the
        operating system's CSPRNG); never a generator seeded from anything public.
    site, round : the site's identifier and the 1-based round (ledger labels).
    ledger : PrivacyLedger
        Receives one event per released block.

    Returns
    -------
    LocalParams
        ``{view: ViewParams(a_mu + noisy clipped diff, a_W + ..., max(a_s + ..., floor))}``.

    Raises
    ------
    ValueError
        On a view without prior, mismatched shapes, or an unusable prior variance
        (nothing is released or recorded then).
    fedhier.privacy.PrivacyBudgetExhausted
        With a total budget, when this round's releases would exceed it (the stop is
        recorded in the ledger; the site must not reply).
    """
    if not params:
        raise ValueError(f"site {site!r}, round {round}: no observed view to release")
    if int(round) < 1:
        raise ValueError(f"site {site!r}: rounds are 1-based, got round {round}")
    if round == 1 and config.first_round == "non_private":
        for view in params:
            for block in BLOCKS:
                ledger.record(site, round, f"{view}.{block}", dp_event.NonPrivateDpEvent())
        return dict(params)
    if anchor is None:
        if round != 1:
            raise ValueError(
                f"site {site!r}, round {round}: the previous global parameters are required as anchor"
            )
        from .master import data_independent_prior

        n_components = next(iter(params.values())).n_components
        anchor = data_independent_prior({view: p.dim for view, p in params.items()}, n_components)

    plan = _release_plan(params, anchor, config)
    mechanisms = config.noise_multipliers()
    check_budget(ledger, config.budget, site, round, [event for _, event in round_events(params, config)])

    released: dict[str, dict[str, np.ndarray]] = {view: {} for view in params}
    for view, block, value, centre, bound, norm in plan:
        difference, _ = clip_difference(value, centre, bound, norm)
        mechanism, multiplier = mechanisms[block]
        release = release_gaussian if mechanism == "gaussian" else release_laplace
        if block == "W":  # only the free columns carry data; columns q_k.. are 0 in every model
            q_k = effective_columns(*difference.shape)
            noised, event = release(difference[:, :q_k], multiplier, 2.0 * bound, noise)
            ledger.record(site, round, f"{view}.{block}", event)
            W = np.zeros_like(difference)
            W[:, :q_k] = centre[:, :q_k] + noised
            released[view][block] = W
            continue
        noised, event = release(difference, multiplier, 2.0 * bound, noise)
        ledger.record(site, round, f"{view}.{block}", event)
        released[view][block] = centre + noised
    return {
        view: ViewParams(
            mu=blocks["mu"],
            W=blocks["W"],
            sigma2=max(float(blocks["sigma2"]), config.sigma2_floor),
        )
        for view, blocks in released.items()
    }


def record_round(ledger: PrivacyLedger, site, round: int, views, config: DPConfig, *, spread: bool = False) -> None:
    """Record in ``ledger`` the events of a round in which ``site`` released ``views``.

    Mirrors :func:`privatize_site_params` (and :func:`privatize_spread` with ``spread``)
    exactly (a non-private round 1 records ``NonPrivateDpEvent`` s), from public
    information only: who replied, with which views, under which configuration.
    """
    if round == 1 and config.first_round == "non_private":
        for view in views:
            for block in BLOCKS:
                ledger.record(site, round, f"{view}.{block}", dp_event.NonPrivateDpEvent())
        if spread:
            for view in views:
                for block in SPREAD_BLOCKS:
                    ledger.record(site, round, f"{view}.{block}", dp_event.NonPrivateDpEvent())
        return
    for label, event in round_events(views, config, spread=spread):
        ledger.record(site, round, label, event)


def site_ledger(site, views, released_rounds, config: DPConfig, *, spread: bool = False) -> PrivacyLedger:
    """A site's own ledger rebuilt from the rounds in which it released (for the budget stop)."""
    ledger = PrivacyLedger()
    for r in released_rounds:
        record_round(ledger, site, int(r), views, config, spread=spread)
    return ledger


def _noise_sd(config: DPConfig, block: str, bound: float) -> float:
    """Standard deviation of the noise on one coordinate of a released block (sensitivity 2g)."""
    mechanism, multiplier = config.noise_multipliers()[block]
    scale = multiplier * 2.0 * bound
    return scale if mechanism == "gaussian" else math.sqrt(2.0) * scale


def denoise_global(new: GlobalParams, anchor: GlobalParams, counts: dict[str, int], config: DPConfig) -> GlobalParams:
    """Server-side post-processing of the ML step on DP releases ([R], ``DPConfig.denoise``).

    Each of the C_k releases of a block is a + (clipped difference, norm <= g) + noise of
    known per-coordinate variance tau^2 (public: g depends on theta~[r-1] only, tau on
    the configuration).  The plain ML step averages them, so the global means take a
    random walk of step tau / sqrt(C_k) per round.  This step, a function of the releases
    and public quantities only (so DP is kept):

    * shrinks each global mean towards its anchor by lambda = g^2 / (g^2 + D tau^2 / C_k)
      (D = number of perturbed coordinates, d_k q_k for W: the linear estimator of the clipped mean difference
      that minimises the worst-case mean squared error when its norm is at most g);
    * shrinks the noise variance s-bar towards its anchor in the same way;
    * where the noise variance is at least the anchor's spread (tau^2 >= v, v = sigma2_mu~ or
      sigma2_W~ of theta~[r-1]; with g = kappa sqrt(v) and Gaussian multiplier z, tau = 2 z g,
      so this is 2 z kappa >= 1), removes the noise's expected contribution
      tau^2 (C_k - 1) / C_k from the spreads sigma2_mu, sigma2_W (floored at 1e-20, the [RC]
      zero-spread value).

    Why only there: the spreads set the next round's bound, and the noise scales with it.
    Kept, the noise makes the spread recursion v' ~ v / C_k + (1 - 1/C_k) tau^2 (EM update;
    the paper's update lacks the first term), which shrinks from round to round exactly when
    tau^2 < v: the bound then anneals with the releases, as in the paper's per-release mode,
    and the model learns.  Removed at such a noise level, the spreads of similar sites fell
    to the 1e-20 floor within one to three rounds while the shrunk means were still far from
    the data; every later update was clipped to ~1e-10 and the model froze (with the early
    stop it caused, 1.5-1.7 times the test error on the experiments' SD data at a total
    epsilon of 7000, about what the paper's 10 per release spends:
    ``examples/mvppca_dp_total_budget.py``).  With tau^2 >= v the kept spreads would instead
    grow to the ``max_prior_sd`` cap and the means take a random walk of step g; removing the
    noise freezes the model near where the first rounds left it (close to the public prior),
    which predicts better there.
    """
    out: GlobalParams = dict(new)
    for view, g in new.items():
        count = int(counts.get(view, 0))
        if count == 0 or view not in anchor:
            continue
        prior = anchor[view]
        d, q = g.W.shape
        g_mu, g_W, a_sigma2, g_sigma2 = _bounds(view, prior, config)
        updates = {}
        for block, value, centre, spread, prior_spread, bound, n_coord in (
            ("mu", g.mu, prior.mu, g.sigma2_mu, prior.sigma2_mu, g_mu, d),
            ("W", g.W, prior.W, g.sigma2_W, prior.sigma2_W, g_W, d * effective_columns(d, q)),
        ):
            tau2 = _noise_sd(config, block, bound) ** 2
            lam = bound**2 / (bound**2 + n_coord * tau2 / count)
            updates[block] = centre + lam * (np.asarray(value) - centre)
            if tau2 >= prior_spread and count > 1:  # kept, the noise would not let the spread shrink
                updates[f"sigma2_{block}"] = max(spread - tau2 * (count - 1) / count, 1e-20)
        tau2 = _noise_sd(config, "sigma2", g_sigma2) ** 2
        lam = g_sigma2**2 / (g_sigma2**2 + tau2 / count)
        updates["noise_var"] = max(a_sigma2 + lam * (g.noise_var - a_sigma2), config.sigma2_floor)
        if "sigma2_W" in updates:  # one variance for all the columns, as the DP fit estimates it
            updates["sigma2_W_columns"] = None
        out[view] = replace(g, **updates)
    return out


def ledger_from_history(config: DPConfig, site_views, history, *, spread: bool = False) -> PrivacyLedger:
    """The accountant's ledger of a whole fit, rebuilt from public facts.

    ``site_views[s]`` lists the views site ``s`` releases; ``history`` holds the round
    records of the runtime (``sites`` that replied, ``failed`` with their messages).
    A site that stopped on its budget is recorded with the reason it gave.
    """
    ledger = PrivacyLedger()
    for record in history:
        for s in record.sites:
            record_round(ledger, s, record.round, list(site_views[s]), config, spread=spread)
        for s, message in record.failed.items():
            if message.startswith("PrivacyBudgetExhausted"):
                ledger.record_stop(s, record.round, message.splitlines()[0])
    return ledger
