"""The Fed-mv-PPCA round (spec fed-mv-ppca §6, Algorithm 1; §8.2 Algorithm 2 with privacy).

Site step (§4): local EM in round 1 / MAP-EM with the broadcast prior afterwards, then
(optionally) the client-side DP release of every block (§8.2), then the per-view
sufficient statistics of the master's ML step (§5) anchored at the previous global
values.  Combine: **sum** -- the master needs only sums over the sites that replied, per
view (1/C_k), so plain summation can be replaced by secure summation.  Global step:
closed-form ML of the hierarchical prior (§5.1) and the inverse-gamma MLE (§5.2).

Messages (flat, declared; ``<view>/<field>``):

* reply: for every view of the schema, optional (without privacy, absent when the site does
  not measure it; with privacy always present, :func:`fedhier.models.mvppca.dp.complete_views`): ``count, sum_mu, sum_sq_mu, sum_W, sum_sq_W, sum_inv_sigma2, sum_log_sigma2,
  sum_sigma2, sum_sq_sigma2``, and with ``prior_update="em"`` also ``sum_post_var_mu,
  sum_post_var_W`` (the site's posterior spread, :mod:`fedhier.models.mvppca.spread`);
  with ``prior_update="em"`` and no privacy, ``latent_moment`` (q, q), the site's
  sum_n <x_n x_n^T>, and ``latent_count``, its number of subjects, from which the master
  sets the scale (and after round 2 the shape) of the loadings (:func:`fedhier.models.mvppca.master.latent_scale`), and per
  view ``sum_sq_W_columns, sum_post_var_W_columns`` (q,), the columns' terms of ``sum_sq_W`` and
  ``sum_post_var_W``, from which the master gives each column of the loadings its own variance;
  plus, in a fit without privacy only, ``expected_ll`` (the site's final Q_c, §4.2) and
  ``safeguards`` (how many [RC] safeguards triggered locally).  With privacy the
  statistics are computed from the site's DP releases alone (declared ``"release"``; the
  spread through :func:`fedhier.models.mvppca.dp.privatize_spread`), ``count`` (1 per view,
  i.e. that the site replied) is public, and the two diagnostics, computed from the raw data, are
  never sent (``docs/privacy.md``).
* broadcast: ``has_prior`` (0 before round 1's global step) and, per view,
  ``mu, W, sigma2_mu, sigma2_W, alpha, beta, noise_var, var_sigma, sigma2_W_columns`` (q,).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Mapping

import numpy as np

from ..data.schema import ViewSchema
from ..models.mvppca import local, master, predictive, spread
from ..models.mvppca.accelerate import ACCELERATIONS, Squarem
from ..models.mvppca._data import row_blocks
from ..models.mvppca.mstep import weak_ig_prior
from ..models.mvppca.params import GlobalParams, GlobalView
from .base import RoundProtocol, SiteContext
from .messages import Field, Message, MessageSpec
from ..utils.logs import OnceLog

__all__ = [
    "MVPPCAProtocol", "DataScaleWarning", "GLOBAL_FIELDS", "global_from_message", "global_to_message", "BroadcastMetrics",
    "model_settled", "stopping_rule", "reply_spec",
]

log = logging.getLogger(__name__)


def _variance_per_entry(values: np.ndarray, rows: np.ndarray | None) -> float:
    """mean_{n, i} (t_ni - t-bar_i)^2 over the given rows (all if None), in one pass by blocks of rows (no copy of
    the view): each block's own mean m_b and scatter S_b, merged exactly as
    S <- S + S_b + ||m_b - m||^2 n n_b / (n + n_b),  m <- m + (m_b - m) n_b / (n + n_b).

    S_b = sum t^2 - n_b ||m_b||^2 (two reductions, no centred copy of the block) unless that difference is below
    1e-3 of sum t^2, where it would lose more than 3 of its digits (a mean over 30 times the spread): then from
    the centred block."""
    count, mean, scatter = 0, 0.0, 0.0
    for block in row_blocks(values, rows):
        size = block.shape[0]
        block_mean = block.mean(axis=0)
        total = float(np.einsum("ij,ij->", block, block))
        block_scatter = total - size * float(block_mean @ block_mean)
        if not block_scatter > 1e-3 * total:
            centred = block - block_mean
            block_scatter = float(np.einsum("ij,ij->", centred, centred))
        shift = block_mean - mean
        scatter += block_scatter + float(shift @ shift) * count * size / (count + size)
        mean = mean + shift * (size / (count + size))
        count += size
    return scatter / (count * values.shape[1])


class DataScaleWarning(UserWarning):
    """A site's view is far from the unit scale the [RC] defaults assume: it varies less than the round-1
    prior on sigma2 lets its noise be, or far more than the cap on sigma2_W~ is made for (see
    :meth:`MVPPCAProtocol._check_scale`)."""


#: variance per entry above which a view is far above unit scale (sd 100; examples/mvppca_data_scale.py)
LARGE_VARIANCE = 1e4
#: the advice closing the warning of a view whose variance is below the sigma2 prior's floor (the command line
#: says it in the words of a configuration file)
SCALE_ADVICE = ("The defaults assume data on a unit scale: scale the data first (e.g. fedhier.data.MinMaxScaling, "
                "as the experiments do) or pass sigma2_prior=None.")


GLOBAL_FIELDS = ("mu", "W", "sigma2_mu", "sigma2_W", "alpha", "beta", "noise_var", "var_sigma", "sigma2_W_columns")


def _global_shapes(dim: int, q: int) -> dict[str, tuple[int, ...]]:
    return {"mu": (dim,), "W": (dim, q), "sigma2_mu": (), "sigma2_W": (), "alpha": (), "beta": (), "noise_var": (),
            "var_sigma": (), "sigma2_W_columns": (q,)}


def global_to_message(params: GlobalParams) -> Message:
    """Flatten GlobalParams into ``<view>/<field>`` arrays (inf var_sigma sent as -1)."""
    msg: Message = {"has_prior": np.asarray(1.0)}
    for view, g in params.items():
        for name in GLOBAL_FIELDS:
            value = np.asarray(getattr(g, name), dtype=float)
            if name == "var_sigma" and not np.isfinite(value):
                value = np.asarray(-1.0)
            msg[f"{view}/{name}"] = value
    return msg


def global_from_message(message: Mapping[str, np.ndarray], schema: ViewSchema) -> GlobalParams | None:
    """Inverse of :func:`global_to_message`; None when the broadcast carries no prior."""
    if float(message["has_prior"]) == 0.0:
        return None
    out: GlobalParams = {}
    for view in schema.names:
        if f"{view}/mu" not in message:
            continue
        values = {name: message[f"{view}/{name}"] for name in GLOBAL_FIELDS}
        var_sigma = float(values["var_sigma"])
        out[view] = GlobalView(
            mu=np.array(values["mu"]),
            W=np.array(values["W"]),
            sigma2_mu=float(values["sigma2_mu"]),
            sigma2_W=float(values["sigma2_W"]),
            alpha=float(values["alpha"]),
            beta=float(values["beta"]),
            noise_var=float(values["noise_var"]),
            var_sigma=np.inf if var_sigma < 0 else var_sigma,
            sigma2_W_columns=np.array(values["sigma2_W_columns"], dtype=float),
        )
    return out


class BroadcastMetrics:
    """Round callback ``(record, broadcast)``: add what the broadcast says about theta~ to the round's metrics.

    ``<view>/sd_mu``, ``<view>/sd_W``, ``<view>/sd_sigma2``: the global standard deviations
    (their evolution under DP is spec §8.5, paper Fig. 7); ``rel_change``: the relative
    change of theta~ since the previous broadcast (:func:`master.relative_change`, the
    quantity of the optional stopping rule of §6 [R]) and ``model_change``: the change of
    the predictive distribution of a subject (:func:`predictive.model_change`, the quantity
    the default stopping rule uses), from the first round that follows a prior.
    ``previous`` is the broadcast the run starts from (a checkpoint's when resuming), so a
    resumed fit records what an uninterrupted one does.  Every runtime
    runs it first, so that the history and checkpoints hold these metrics.
    """

    def __init__(self, schema: ViewSchema, previous: Mapping[str, np.ndarray] | None = None):
        self.schema = schema
        self.previous = None if previous is None else global_from_message(previous, schema)

    def __call__(self, record: Any, broadcast: Mapping[str, np.ndarray]) -> None:
        current = global_from_message(broadcast, self.schema)
        if current is None:
            return
        for view, g in current.items():
            record.metrics[f"{view}/sd_mu"] = float(np.sqrt(g.sigma2_mu))
            record.metrics[f"{view}/sd_W"] = float(np.sqrt(g.sigma2_W))
            if np.isfinite(g.var_sigma):
                record.metrics[f"{view}/sd_sigma2"] = float(np.sqrt(g.var_sigma))
        if self.previous is not None:
            record.metrics["rel_change"] = master.relative_change(self.previous, current)
            record.metrics["model_change"] = predictive.model_change(self.previous, current)
        self.previous = current


def model_settled(tol: float) -> Callable[[Any, Any], bool]:
    """The stopping rule [R] as a runtime's ``stop(record, broadcast)``: True when the round's
    ``model_change`` (added by :class:`BroadcastMetrics`), the change of the predictive
    distribution of a subject, is below ``tol`` (docs/mvppca.md, "Stopping early")."""
    return lambda record, broadcast=None: record.metrics.get("model_change", np.inf) < tol


def stopping_rule(tol: float | None, privacy: Any = None) -> Callable[[Any, Any], bool] | None:
    """The runtime's ``stop`` of a fit: :func:`model_settled` at ``tol``, or None (run every round).

    None when ``tol`` is None, and with a total privacy budget: the noise multiplier was
    calibrated so that all ``n_rounds`` rounds together meet the target, so the rounds after
    an early stop would be budget paid for and never spent, and with the noise fixed, every
    further round averages more releases into the model.
    """
    total_budget = getattr(getattr(privacy, "budget", None), "target", None) is not None  # DPConfig.total
    if tol is None or total_budget:
        return None
    return model_settled(float(tol))


def reply_spec(
    schema: ViewSchema, n_components: int, prior_update: str, *, private: bool, column_variances: bool = True
) -> MessageSpec:
    """A site's declared reply: per view, the sufficient statistics of the master step (``count`` public, the rest
    DP releases in a private fit); without privacy also the raw diagnostics (expected log-likelihood, safeguards)
    and, with the EM prior update, the latents' second moment that sets the loadings' scale and the columns'
    terms of the loadings' spread.  It depends on
    whether the fit is private, never on the noise's calibration."""
    # raw diagnostics: sent only without privacy (check_disclosure refuses them otherwise)
    reply: dict[str, Field] = {"expected_ll": Field((), optional=True), "safeguards": Field((), optional=True)}
    if prior_update == "em" and not private:
        reply.update({name: Field(shape, optional=True) for name, shape in master.latent_shapes(n_components).items()})
    released = "release" if private else "raw"
    columns = prior_update == "em" and not private and column_variances
    for view, dim in zip(schema.names, schema.dims):
        for stat, shape in master.statistic_shapes(dim, n_components, prior_update, columns).items():
            reply[f"{view}/{stat}"] = Field(tuple(shape), optional=True, disclosure="public" if stat == "count" else released)
    return MessageSpec("fed-mv-ppca-reply", reply)


class MVPPCAProtocol(RoundProtocol):
    """Fed-mv-PPCA as a sum-combined round protocol.

    Parameters
    ----------
    schema : ViewSchema
        View names and dimensions shared by all sites.
    n_components : int
        Latent dimension q.
    n_local_iter, n_first_iter : int
        MAP iterations per round (I) and EM iterations in round 1 (I_1).
    init : "pca" or "random"
        Round-1 start of the local EM: the PCA of the site's views [R] or U(-2, 2) [RC].
    local_tol : float or None
        The local (MAP-)EM stops once the parameters change by less than this (relative);
        None runs every iteration [RC].
    ig_solver : "newton" or "fixed_point"
        Inverse-gamma MLE of §5.2 ([R] Newton, [RC] 10-step fixed point).
    sigma2_prior : "weak" or None
        Round-1 weak IG(2.25, 0.625) on sigma2 ([RC]) or plain EM.
    privacy : object or None
        A DP configuration understood by :mod:`fedhier.models.mvppca.dp`; noise is
        added at the site before anything is sent.
    initial_prior : GlobalParams or None
        Public, data-independent theta~[0] broadcast before round 1.  It is used as the
        DP anchor of round 1 only; round 1 itself runs EM without priors (§4.5).  With
        ``privacy`` and no ``initial_prior``, :func:`master.data_independent_prior` (§8.2).
    prior_update : "em" or "paper"
        How the master updates the prior's variances: the EM update that adds the sites'
        posterior spread [R] (two more scalars per view in the reply) or eqs. 14, 18 [P]
        (:mod:`fedhier.models.mvppca.master`).
    column_variances : bool
        With the EM update and no privacy, the columns of the loadings that carry signal share
        one between-site variance and each other column has its own (two more vectors of q per
        view in the reply; on by default).
    noise_dof : bool
        The sites' noise variances divide the residual by its degrees of freedom, less what the mean
        and the loadings took (:func:`fedhier.models.mvppca.mstep.residual_dof`) [R], instead of
        by N d_k (eq. 21 [P], the default).
    acceleration : "squarem" or None
        Without privacy, the coordinator extrapolates the global means and loadings across
        rounds (:class:`fedhier.models.mvppca.accelerate.Squarem`, an extrapolation kept only when
        the next round changes its predictions little enough); its state lives in this object, so
        one instance serves one coordinator.  None, and every fit with privacy, broadcasts the
        master's step as it is (the paper's rounds).
    loading_uncertainty : bool
        With the EM update and no privacy (on by default), each site's E-step and noise variance take
        the expectation over its loadings' posterior as well (:func:`fedhier.models.mvppca.local.fit_local`)
        [R]; False, and every fit with the paper's update or privacy, runs the paper's MAP-EM.
    """

    name = "fed-mv-ppca"
    combine = "sum"
    #: the options a fit's settings (the estimator, a deployment) hold under the constructor's names
    SETTINGS = ("n_local_iter", "n_first_iter", "init", "local_tol", "ig_solver", "sigma2_prior", "prior_update")

    @classmethod
    def from_settings(cls, schema: ViewSchema, settings: Any, privacy: Any = None) -> "MVPPCAProtocol":
        """The protocol of a fit whose ``settings`` hold ``n_components`` and the :attr:`SETTINGS` by name."""
        return cls(schema, settings.n_components, privacy=privacy, **{k: getattr(settings, k) for k in cls.SETTINGS})

    def __init__(
        self,
        schema: ViewSchema,
        n_components: int,
        *,
        n_local_iter: int = 15,
        n_first_iter: int = 30,
        init: str = "pca",
        local_tol: float | None = 1e-8,
        ig_solver: str = "newton",
        sigma2_prior: str | None = "weak",
        privacy: Any = None,
        initial_prior: GlobalParams | None = None,
        prior_update: str = "em",
        column_variances: bool = True,
        noise_dof: bool = False,
        acceleration: str | None = "squarem",
        loading_uncertainty: bool = True,
    ):
        if acceleration not in ACCELERATIONS:
            raise ValueError(f"acceleration must be one of {ACCELERATIONS}, got {acceleration!r}")
        if prior_update not in master.PRIOR_UPDATES:
            raise ValueError(f"prior_update must be one of {master.PRIOR_UPDATES}, got {prior_update!r}")
        self.prior_update = prior_update
        self.schema = schema
        self.n_components = int(n_components)
        self.n_local_iter = int(n_local_iter)
        self.n_first_iter = int(n_first_iter)
        self.init = init
        self.local_tol = local_tol
        self.noise_dof = bool(noise_dof)
        self.ig_solver = ig_solver
        self.sigma2_prior = sigma2_prior
        self.privacy = privacy
        if privacy is not None and initial_prior is None:
            initial_prior = master.data_independent_prior(dict(zip(schema.names, schema.dims)), self.n_components)
        self.initial_prior = initial_prior
        self.acceleration = acceleration
        #: the extrapolation across rounds, without privacy only (under DP the plain rounds of the paper)
        self.accelerator = Squarem() if acceleration == "squarem" and privacy is None else None
        #: the safeguards' notes repeat every round: each kind once per fit at INFO, then at DEBUG
        self._safeguard_log = OnceLog(log)
        q = self.n_components
        #: the latents' second moment sets the loadings' scale; not released under privacy
        self.latent_scale = prior_update == "em" and privacy is None
        #: each column of the loadings has its own variance (an option; not released under privacy)
        self.column_variances = self.latent_scale and bool(column_variances)
        #: the sites' E-steps count their loadings' posterior uncertainty (with the EM update, without privacy)
        self.loading_uncertainty = self.latent_scale and bool(loading_uncertainty)
        broadcast: dict[str, Field] = {"has_prior": Field(())}
        for view, dim in zip(schema.names, schema.dims):
            for name, shape in _global_shapes(dim, q).items():
                broadcast[f"{view}/{name}"] = Field(shape, optional=True)
        self._reply_spec = reply_spec(
            schema, q, prior_update, private=privacy is not None, column_variances=self.column_variances
        )
        self._broadcast_spec = MessageSpec("fed-mv-ppca-broadcast", broadcast)

    @property
    def private(self) -> bool:
        return self.privacy is not None

    def requested_views(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    @property
    def protected_unit(self) -> str | None:
        return None if self.privacy is None else "site"  # client-level DP: the whole site's data set

    def release_plan(self, n_rounds: int) -> list:
        if self.privacy is None:
            return []
        from ..models.mvppca import dp

        rounds = range(1, int(n_rounds) + 1)
        spread_released = self.prior_update == "em"
        return dp.site_ledger("site", list(self.schema.names), rounds, self.privacy, spread=spread_released).events("site")

    def subject_counts(self, data: Any) -> dict[str, int]:
        return {view: int(np.sum(~np.all(np.isnan(np.asarray(x, dtype=float)), axis=1))) for view, x in data.items()}

    @property
    def reply_spec(self) -> MessageSpec:
        return self._reply_spec

    @property
    def broadcast_spec(self) -> MessageSpec:
        return self._broadcast_spec

    def initial_broadcast(self) -> Message:
        if self.initial_prior is None:
            return {"has_prior": np.asarray(0.0)}
        msg = global_to_message(self.initial_prior)
        msg["has_prior"] = np.asarray(0.0)  # an anchor for DP, not a prior for the local fit
        return msg

    def _anchor(self, broadcast: Message) -> GlobalParams | None:
        """Previous global values: the prior from round 2 on, theta~[0] (if any) in round 1."""
        if float(broadcast["has_prior"]) != 0.0:
            return global_from_message(broadcast, self.schema)
        if self.initial_prior is not None:
            return self.initial_prior
        return None

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        prior = global_from_message(broadcast, self.schema)
        n_iter = self.n_first_iter if prior is None else self.n_local_iter
        fit = local.fit_local(
            ctx.data, self.n_components, prior, n_iter=n_iter, rng=ctx.rng, sigma2_prior=self.sigma2_prior,
            init=self.init, tol=self.local_tol, noise_dof=self.noise_dof, loading_uncertainty=self.loading_uncertainty,
        )
        for note in fit.safeguards:
            self._safeguard_log(note, "site %d, round %d: %s", ctx.site, ctx.round, note)
        params = fit.params
        anchor = self._anchor(broadcast)
        # the latents' second moments at the fitted parameters serve the spread and the latent moment
        fitted = spread.latent_second_moments(ctx.data, params, fit.covariance) if self.prior_update == "em" else None
        site_spread = None if fitted is None else spread.posterior_spread(
            ctx.data, params, prior, columns=self.column_variances, given=fitted)
        if self.privacy is not None:
            from ..models.mvppca import dp

            # every view of the analysis, measured here or not: the reply's fields never tell which
            params, site_spread = dp.complete_views(params, site_spread, self.schema.names, anchor, self.privacy)
            released = ctx.state.get("private_rounds", np.zeros(0, dtype="int64"))
            ledger = dp.site_ledger(ctx.site, list(params), released, self.privacy, spread=site_spread is not None)
            params = dp.privatize_site_params(
                params, anchor, self.privacy, ctx.noise, site=ctx.site, round=ctx.round, ledger=ledger
            )
            if site_spread is not None:
                site_spread = dp.privatize_spread(
                    site_spread, anchor, self.privacy, ctx.noise, site=ctx.site, round=ctx.round, ledger=ledger
                )
            ctx.releases.extend((r.block, r.event) for r in ledger.releases(ctx.site) if r.round == ctx.round)
            ctx.state["private_rounds"] = np.append(released, np.int64(ctx.round))
        stats = master.site_statistics(params, anchor, site_spread)
        reply: Message = {}
        if self.latent_scale:
            moment, n_subjects = spread.latent_moment(ctx.data, params, given=fitted)
            reply["latent_moment"] = np.asarray(moment)
            reply["latent_count"] = np.asarray(float(n_subjects))
        if self.privacy is None:
            reply["expected_ll"] = np.asarray(float(fit.expected_ll[-1]) if len(fit.expected_ll) else 0.0)
            reply["safeguards"] = np.asarray(float(len(fit.safeguards)))
        for view, fields in stats.items():
            for stat, value in fields.items():
                reply[f"{view}/{stat}"] = np.asarray(value, dtype=float)
        return reply

    def _statistics(self, combined: Message) -> dict[str, dict[str, np.ndarray]]:
        out: dict[str, dict[str, np.ndarray]] = {}
        for view, dim in zip(self.schema.names, self.schema.dims):
            if f"{view}/count" in combined:
                shapes = master.statistic_shapes(dim, self.n_components, self.prior_update, self.column_variances)
                out[view] = {stat: combined[f"{view}/{stat}"] for stat in shapes}
        return out

    def _latent_moment(self, combined: Message) -> np.ndarray | None:
        """The latents' pooled second moment S = sum_c sum_n <x_n x_n^T> / sum_c N_c (q, q) the sites sent, or None
        where the fit does not fold it (privacy, the paper's update) or no site had a subject."""
        subjects = float(combined.get("latent_count", 0.0))
        if not (self.latent_scale and subjects > 0):
            return None
        return np.asarray(combined["latent_moment"], dtype=float) / subjects

    def global_step(self, combined: Message, round: int, previous: Message) -> Message:
        prior = global_from_message(previous, self.schema)
        anchor = self._anchor(previous)
        stats = self._statistics(combined)
        n_sites = max((float(fields["count"]) for fields in stats.values()), default=0.0)
        subjects = float(combined.get("latent_count", 0.0))
        moment = self._latent_moment(combined)
        new, safeguards = master.global_step(
            stats,
            anchor=anchor,
            n_components=self.n_components,
            ig_solver=self.ig_solver,
            previous=prior,
            prior_update=self.prior_update,
            newton=self.privacy is None,  # with privacy the traces are noisy: the plain EM step
            n_subjects=subjects / n_sites if self.column_variances and subjects > 0 and n_sites > 0 else None,
        )
        # round 1's W~ averages loadings fitted in each site's own rotation: fold the whole second moment once
        shape = moment is not None and round == 2 and prior is not None
        if moment is not None:
            new = master.latent_scale(new, moment, shape=shape)
        for note in safeguards:
            self._safeguard_log(note, "round %d, master: %s", round, note)
        if self.accelerator is not None:
            if prior is None or shape:
                self.accelerator.reset()  # round 1: a new fit; round 2 moved the shape, a new cycle
            else:
                new = self.accelerator.step(prior, new)
        if self.privacy is not None and self.privacy.denoise and anchor is not None:
            from ..models.mvppca import dp

            counts = {view: int(fields["count"]) for view, fields in stats.items()}
            new = dp.denoise_global(new, anchor, counts, self.privacy)
        return global_to_message(new)

    def coordinator_state(self) -> dict[str, np.ndarray]:
        """The extrapolation's cycle under way (:meth:`Squarem.state`), global parameters as ``<part>/<view>/<field>``."""
        if self.accelerator is None:
            return {}
        out: dict[str, np.ndarray] = {}
        for name, value in self.accelerator.state().items():
            if isinstance(value, dict):
                out.update({f"{name}/{k}": v for k, v in global_to_message(value).items() if k != "has_prior"})
            else:
                out[name] = value
        return out

    def restore_coordinator_state(self, state: Mapping[str, np.ndarray]) -> None:
        if not state:
            return  # a checkpoint of round 0's broadcast or of a fit without extrapolation: a new cycle
        if self.accelerator is None:
            raise ValueError("the checkpoint holds an extrapolation's state, but this fit does not extrapolate")
        parts: dict[str, Any] = {}
        for name in ("first", "plain"):
            fields = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(f"{name}/")}
            if not fields:
                continue
            views = {k.rsplit("/", 1)[0] for k in fields}
            dims = dict(zip(self.schema.names, self.schema.dims))
            expected = {f"{view}/{f}": shape for view in views if view in dims
                        for f, shape in _global_shapes(dims[view], self.n_components).items()}
            if set(fields) != set(expected) or any(np.shape(fields[k]) != shape for k, shape in expected.items()):
                raise ValueError("the checkpoint's extrapolation state does not fit this fit's views")
            parts[name] = global_from_message({"has_prior": np.asarray(1.0), **fields}, self.schema)
        rest = {k: v for k, v in state.items() if "/" not in k}
        self.accelerator.restore({**rest, **parts})

    def round_metrics(self, combined: Message, round: int) -> dict[str, float]:
        stats = self._statistics(combined)
        metrics = {}
        if self.privacy is None:  # raw diagnostics: sent without privacy only
            metrics["expected_ll"] = float(combined["expected_ll"])
            metrics["local_safeguards"] = float(combined["safeguards"])
        moment = self._latent_moment(combined)
        if moment is not None:  # the shape of the latent space
            eig = np.linalg.eigvalsh(moment)
            metrics["latent_moment_min"], metrics["latent_moment_max"] = float(eig[0]), float(eig[-1])
        for view, fields in stats.items():
            metrics[f"{view}/sites"] = float(fields["count"])
        return metrics

    def validate_site_data(self, site: int, data: Any) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"site {site}: expected a mapping view -> array, got {type(data).__name__}")
        unknown = sorted(set(data) - set(self.schema.names))
        if unknown:
            raise ValueError(f"site {site}: unknown view(s) {unknown}; known views: {list(self.schema.names)}")
        for view, values in data.items():
            self._check_scale(site, view, values)

    def _check_scale(self, site: int, view: str, values: Any) -> None:
        """Warn when this view is far from unit scale, which the [RC] defaults assume (runs at the site,
        before any round; the experiments min-max scale their data).

        Far below: round 1 uses the [RC] weak IG(2.25, 0.625) (``sigma2_prior="weak"``) or the initial
        prior's IG(alpha, beta).  Eq. (21) then gives sigma2 >= 2 beta / (N d + 2 (alpha + 1)) whatever
        the data; when that exceeds the view's variance per entry, the prior sets the noise level and
        the fit may explain the view as noise.  Far above (variance per entry beyond
        :data:`LARGE_VARIANCE`): the [RC] cap sigma2_W~ <= ||W~||_F / 5 (§5.1) compares a variance with
        a norm, so it holds the sites' loadings the tighter the larger the data's scale.
        """
        X = np.asarray(values, dtype=float)
        if X.ndim != 2 or X.shape[1] == 0 or X.shape[0] == 0:
            return  # the shape is refused, with its own message, when the site's views are read
        with np.errstate(invalid="ignore", over="ignore"):  # a finite variance: every entry is finite
            variance, rows = _variance_per_entry(X, None), None
        if not np.isfinite(variance):
            finite = np.isfinite(X.sum(axis=1))
            if not finite.any() or not np.isnan(X[~finite]).all():
                return  # no observed row, or inf / partially missing rows: refused when the views are read
            rows = np.flatnonzero(finite)
            variance = _variance_per_entry(X, rows)
        size = X.shape[1] * (X.shape[0] if rows is None else rows.size)
        if variance > LARGE_VARIANCE:
            warnings.warn(DataScaleWarning(
                f"site {site}, view {view!r}: its entries have variance {variance:.3g}, far above unit scale. The reference "
                "code's cap sigma2_W~ <= ||W~||_F / 5 compares a variance with a norm, so on this scale it holds the sites' "
                "loadings far tighter than on scaled data, and the fit can degrade. Scale the data first (e.g. "
                "fedhier.data.MinMaxScaling, as the experiments do)."), stacklevel=3)
        if self.initial_prior is not None and view in self.initial_prior:
            alpha, beta = float(self.initial_prior[view].alpha), float(self.initial_prior[view].beta)
        elif self.sigma2_prior == "weak":
            alpha, beta = weak_ig_prior()
        else:
            return
        implied = 2.0 * beta / (size + 2.0 * (alpha + 1.0))
        if variance < implied:
            warnings.warn(DataScaleWarning(
                f"site {site}, view {view!r}: the round-1 IG({alpha:g}, {beta:g}) prior on sigma2 keeps this view's "
                f"noise variance at {implied:.3g} or more for its {size} entries, above their variance "
                f"({variance:.3g}): the prior, not the data, sets the noise, and the fit may explain the view as "
                f"noise. {SCALE_ADVICE}"), stacklevel=3)
