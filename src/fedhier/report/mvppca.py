"""The Fed-mv-PPCA report: what the global model says, how the sites differ from it, how the fit went.

Sections (each a table or a captioned figure, see :class:`~fedhier.report.document.Report`):
variance explained per view and factor, top loadings per factor, the sites against the
global model, the latent space (all factor pairs), imputation of hidden views (when a
held-out set is given), convergence, and the privacy ledger (private fits).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..privacy.sampling import NOT_PRIVATE
from .document import Report
from .figures import class_colour, mark_stop, panel_grid, pyplot, site_colour, trace_axis, zoom_axis

__all__ = [
    "variance_explained", "top_loadings", "site_estimates", "privacy_by_round", "HeldOut", "write_mvppca_report",
    "write_result_report",
]

#: factors shown in the latent pairs grid (a q x q grid beyond this is unreadable at page width)
MAX_PAIRS = 6


def variance_explained(W: np.ndarray, noise_var: float) -> np.ndarray:
    """Fraction of a view's total variance that each latent factor explains under the model.

    With t = W x + mu + eps, x ~ N(0, I_q), eps ~ N(0, s I_d), the covariance is
    sum_j w_j w_j^T + s I_d, so the total variance tr(.) = ||W||_F^2 + d s splits exactly
    into ||w_j||^2 per factor j and d s of noise.  Returns (q,) fractions ||w_j||^2 / (||W||_F^2 + d s).
    """
    W = np.asarray(W, dtype=float)
    per_factor = np.sum(W**2, axis=0)
    return per_factor / (per_factor.sum() + W.shape[0] * float(noise_var))


def top_loadings(W_by_view: Mapping[str, np.ndarray], names: Mapping[str, Sequence[str]], n_top: int = 5) -> list[dict[str, Any]]:
    """For each factor j, the ``n_top`` features (over all views) with the largest |W_ij|.

    One row per factor: ``{"factor": j, "1": "feature (view) +0.41", ...}``.
    """
    rows = []
    q = next(iter(W_by_view.values())).shape[1]
    for j in range(q):
        entries = [(view, names[view][i], float(W[i, j])) for view, W in W_by_view.items() for i in range(W.shape[0])]
        entries.sort(key=lambda e: -abs(e[2]))
        rows.append({"factor": j + 1, **{str(r): f"{f} ({v}) {w:+.3f}" for r, (v, f, w) in enumerate(entries[:n_top], start=1)}})
    return rows


def site_estimates(model: Any, sites: Sequence[Mapping[str, np.ndarray]], seed: int = 0) -> list[dict[str, Any]]:
    """Each site's own estimate of (mu_c, W_c) for every view it measures, from its data alone.

    The estimate is the site's first-round fit (EM without the hierarchical prior,
    ``n_first_iter`` iterations).  The latent axes of a separate fit are arbitrary (any
    rotation R gives the same model with W R), so W_c of all the site's views is rotated by
    the orthogonal R minimising ||W_c R - W~||_F over those views (orthogonal Procrustes)
    before it is compared with the global W~.  Returns one ``{view: ViewParams}`` per site.
    """
    from scipy.linalg import orthogonal_procrustes

    from ..models.mvppca.local import fit_local
    from ..models.mvppca.params import ViewParams

    glob = model.global_params_
    out = []
    for c, site in enumerate(sites):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(11, c))))
        fit = fit_local(site, model.n_components_, None, n_iter=model.n_first_iter, rng=rng, sigma2_prior=model.sigma2_prior)
        views = [v for v in fit.params if v in glob]
        R, _ = orthogonal_procrustes(np.vstack([fit.params[v].W for v in views]), np.vstack([glob[v]["W"] for v in views]))
        out.append({v: ViewParams(mu=fit.params[v].mu, W=fit.params[v].W @ R, sigma2=fit.params[v].sigma2) for v in views})
    return out


@dataclass
class HeldOut:
    """Held-out subjects some of whose views were hidden, to show imputation against the truth.

    full, masked : {view: (n, d)} on the model's scale; ``masked`` has the hidden views as NaN rows.
    scaling : object with ``inverse_transform({view: array})`` back to original units, or None.
    units : how the original values are measured (for the captions).
    """

    full: Mapping[str, np.ndarray]
    masked: Mapping[str, np.ndarray]
    scaling: Any = None
    units: str = "original units"


def _feature_names(model: Any, given: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    names = {}
    for view, dim in zip(model.schema_.names, model.schema_.dims):
        if given and view in given:
            names[view] = [str(n) for n in given[view]]
        elif view in model.feature_names_in_:
            names[view] = list(model.feature_names_in_[view])
        else:
            names[view] = [f"{view}[{i + 1}]" for i in range(dim)]
    return names


def write_mvppca_report(
    out: str | Path,
    model: Any,
    *,
    title: str,
    intro: str,
    command: str | None = None,
    summary_rows: Sequence[Mapping[str, Any]] = (),
    tables: Sequence[tuple[str, Sequence[Mapping[str, Any]]]] = (),
    sites: Sequence[Mapping[str, np.ndarray]] | None = None,
    site_names: Sequence[str] | None = None,
    site_classes: Sequence[np.ndarray] | None = None,
    class_names: Sequence[str] | None = None,
    feature_names: Mapping[str, Sequence[str]] | None = None,
    held_out: HeldOut | None = None,
    scale_note: str = "",
    privacy: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Write ``report.html`` and ``report.md`` of a fitted :class:`~fedhier.estimators.mvppca.FedMVPPCA` into ``out``.

    sites : the training sites' data ({view: (n_c, d)}), for the sites-vs-global section and
        the latent space; without them those sections are left out (e.g. on a coordinator).
    site_classes : one (n_c,) integer class per subject per site, coded as ``class_names``.
    summary_rows, tables : extra tables (the caller's metrics) under the introduction.
    scale_note : how the data were scaled, for the captions (e.g. "min–max scaled to [0, 1]").
    privacy : ε per site by round (:func:`privacy_by_round`) for a private fit; computed when None.
    """
    names = _feature_names(model, feature_names)
    site_names = list(site_names) if site_names is not None else [f"site {c + 1}" for c in range(model.n_sites_)]
    report = Report(title, intro)
    if command:
        report.command(command)
    if summary_rows:
        report.table(list(summary_rows), caption="Summary")
    for caption, rows in tables:
        if rows:
            report.table(list(rows), caption=caption)
    _variance_section(report, model, scale_note)
    _loadings_section(report, model, names)
    if sites is not None:
        estimates = site_estimates(model, sites, seed=model.seed_ if hasattr(model, "seed_") else 0)
        _sites_section(report, model, estimates, site_names, scale_note)
        _latent_section(report, model, sites, site_names, site_classes, class_names)
    if held_out is not None:
        _imputation_section(report, model, held_out, names)
    _convergence_section(report, model)
    if getattr(model, "privacy", None) is not None and getattr(model, "insecure_reproducible_noise", False):
        report.heading("Privacy ledger")
        report.paragraph(f"This result is {NOT_PRIVATE}.")
    elif getattr(model, "privacy", None) is not None:
        _privacy_section(report, model, site_names, privacy)
    return report.write(out)


def write_result_report(
    folder: str | Path,
    *,
    title: str,
    intro: str,
    site_names: Sequence[str],
    feature_names: Mapping[str, Sequence[str]] | None = None,
    privacy_spent: Mapping[str, Mapping[str, Any]] | None = None,
    command: str | None = None,
) -> Path:
    """The report of a result folder holding ``model.npz`` only, as a coordinator has it (no site data):
    variance explained, loadings, convergence, and the privacy spent per site when given."""
    from ..estimators.mvppca import FedMVPPCA

    model = FedMVPPCA.load(Path(folder) / "model.npz")
    tables = []
    if privacy_spent:
        tables.append(("Privacy spent per site for the whole fit", [{"site": s, **v} for s, v in privacy_spent.items()]))
    return write_mvppca_report(folder, model, title=title, intro=intro, command=command, tables=tables,
                               site_names=site_names, feature_names=feature_names)


# ---------------------------------------------------------------------- sections
def _variance_section(report: Report, model: Any, scale_note: str) -> None:
    report.heading("Variance explained per view and factor")
    point = model.model_
    views = list(point)
    q = model.n_components_
    table = np.array([variance_explained(point[v].W, point[v].sigma2) for v in views]) * 100
    rows = [
        {"view": v, **{f"factor {j + 1} (%)": float(table[i, j]) for j in range(q)}, "all factors (%)": float(table[i].sum())}
        for i, v in enumerate(views)
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(1.2 * q + 3.2, 11.3), 0.55 * len(views) + 1.6))
    im = ax.imshow(table, cmap="Blues", vmin=0, vmax=max(float(table.max()), 1e-9), aspect="auto")
    for i in range(len(views)):
        for j in range(q):
            ax.text(j, i, f"{table[i, j]:.1f}" if table.max() >= 10 else f"{table[i, j]:.2g}", ha="center", va="center", fontsize=11,
                    color="white" if table[i, j] > 0.6 * table.max() else "black")
    ax.set_xticks(range(q), [f"factor {j + 1}" for j in range(q)])
    ax.set_yticks(range(len(views)), views)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="% of the view's variance")
    report.figure(
        fig, "variance_explained",
        "Share of each view's variance that each latent factor explains under the fitted global model, in per cent "
        "(darker = more). Each row is a view; the rest of a row's variance (100 % minus the row's sum) is noise "
        "specific to the view's features. A factor that explains much of two views links them: it is what lets the "
        "model impute one view from the other. A view with d features uses at most d − 1 factors (0 in the others)."
        + (f" Data {scale_note}." if scale_note else ""),
    )
    report.table(rows, caption="Variance explained (%) per view and factor")


def _loadings_section(report: Report, model: Any, names: Mapping[str, Sequence[str]]) -> None:
    report.heading("Top loadings per factor")
    report.paragraph(
        "The features that weigh most on each latent factor in the global model (largest absolute loading over all "
        "views). A feature's loading is how much the feature moves, in the data's units, when the factor moves by one "
        "standard deviation; the sign says in which direction. The model is the same for any rotation of its factors "
        "(turning the loadings and the latent values together changes no prediction), so the fit reports them in one "
        "canonical rotation, as PCA does: the factors are uncorrelated directions of the stacked loadings, numbered by the "
        "variance of the views they explain, each signed so that its largest loading is positive; they can be compared "
        "with PCA's components of the same rank."
    )
    W = {view: np.asarray(p.W) for view, p in model.model_.items()}
    report.table(top_loadings(W, names), caption="Five largest loadings of each factor, largest first: feature (view) loading")


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


def _sites_section(report: Report, model: Any, estimates: Sequence[Mapping[str, Any]], site_names: Sequence[str], scale_note: str) -> None:
    report.heading("How the sites differ from the global model")
    report.paragraph(
        "The hierarchical prior says each site's mean mu_c and loadings W_c scatter around the global mu and W with "
        "standard deviations sd(mu) and sd(W) learned from all sites. Below, each site's own estimate from its data "
        "alone (no prior; its latent axes rotated to best match the global model, since the axes of a separate fit are "
        "arbitrary) is compared with the global one. A ratio near 1 means the site differs from the global model as "
        "much as the fitted prior expects; far above 1, the prior pulls the site towards the global model harder than "
        "the site's own data alone would place it."
    )
    glob = model.global_params_
    views = [v for v in model.schema_.names if v in glob]
    rows = []
    for view in views:
        g = glob[view]
        sd_mu, sd_W = float(np.sqrt(g["sigma2_mu"])), float(np.sqrt(g["sigma2_W"]))
        for c, est in enumerate(estimates):
            if view not in est:
                rows.append({"view": view, "site": site_names[c], "RMS(mu_c − mu)": None, "sd(mu)": sd_mu, "ratio mu": None,
                             "RMS(W_c − W)": None, "sd(W)": sd_W, "ratio W": None})
                continue
            dm, dW = _rms(est[view].mu - g["mu"]), _rms(est[view].W - g["W"])
            rows.append({"view": view, "site": site_names[c], "RMS(mu_c − mu)": dm, "sd(mu)": sd_mu,
                         "ratio mu": dm / sd_mu if sd_mu > 0 else None, "RMS(W_c − W)": dW, "sd(W)": sd_W,
                         "ratio W": dW / sd_W if sd_W > 0 else None})
    caption = ("Root-mean-square difference between each site's and the global parameters, against the global standard "
               "deviations (empty: the site does not measure the view)")
    if any(r["sd(mu)"] <= 1.0001e-10 or r["sd(W)"] <= 1.0001e-10 for r in rows):
        caption += (". A standard deviation of 1e-10 or less means the sites' estimates in the last round coincided: "
                    "once the prior is tight it holds every site at the global values")
    report.table(rows, caption=caption)
    plt = pyplot()
    fig, axes = plt.subplots(len(views), 2, figsize=(11, 3.6 * len(views)), squeeze=False)
    for i, view in enumerate(views):
        g = glob[view]
        for ax, key, sd in ((axes[i, 0], "mu", np.sqrt(g["sigma2_mu"])), (axes[i, 1], "W", np.sqrt(g["sigma2_W"]))):
            ref = np.ravel(g[key])
            lo, hi = float(ref.min()), float(ref.max())
            grid = np.array([lo - 0.05 * (hi - lo + 1e-12), hi + 0.05 * (hi - lo + 1e-12)])
            ax.fill_between(grid, grid - 2 * sd, grid + 2 * sd, color="0.85", label="global ± 2 sd")
            ax.plot(grid, grid, color="0.4", lw=1)
            for c, est in enumerate(estimates):
                if view in est:
                    ax.scatter(ref, np.ravel(getattr(est[view], key)), s=10, alpha=0.55, color=site_colour(c),
                               marker="os^dv<>P*X"[c % 10], label=site_names[c])
            what = "means mu (one point per feature)" if key == "mu" else "loadings W (one point per entry)"
            ax.set_title(f"{view}: {what}")
            ax.set_xlabel(f"global {key}")
            ax.set_ylabel(f"site's {key}")
        axes[i, 0].legend(loc="upper left", markerscale=1.5, fontsize=9)
    fig.tight_layout()
    report.figure(
        fig, "sites_vs_global",
        "Each site's own estimate from its data alone (vertical axis) against the global model (horizontal axis), per "
        "view: means on the left, loadings on the right; one colour per site. Points on the diagonal agree with the global model; the grey "
        "band is the global value ± 2 standard deviations of the hierarchical prior, where about 95 % of a typical "
        "site's values should fall. A site whose points leave the band differs from the others more than the model "
        "expects; when the fitted standard deviations are tiny the band is too thin to see." + (f" Values on the scale of the data ({scale_note})." if scale_note else ""),
    )


def _latent_section(report, model, sites, site_names, site_classes, class_names) -> None:
    report.heading("Latent space")
    z = [model.transform(site) for site in sites]
    Z = np.vstack(z)
    site_of = np.concatenate([np.full(len(zc), c) for c, zc in enumerate(z)])
    classes = np.concatenate([np.asarray(k) for k in site_classes]) if site_classes is not None else None
    k = min(model.n_components_, MAX_PAIRS)
    plt = pyplot()
    size = min(2.0 * k + 1.0, 11.3) if k > 1 else 5
    fig, axes = plt.subplots(k, k, figsize=(size, size), squeeze=False)
    for i in range(k):
        for j in range(k):
            ax = axes[i, j]
            if i == j:
                groups = ((classes == g, class_colour(g)) for g in np.unique(classes)) if classes is not None else (
                    (site_of == c, site_colour(c)) for c in range(len(z)))
                bins = np.histogram_bin_edges(Z[:, i], bins=20)
                for sel, colour in groups:
                    ax.hist(Z[sel, i], bins=bins, alpha=0.5, color=colour)
                ax.set_yticks([])
            elif i > j and classes is not None:  # lower triangle: by class
                for g in np.unique(classes):
                    sel = classes == g
                    ax.scatter(Z[sel, j], Z[sel, i], s=7, alpha=0.6, color=class_colour(g))
            else:  # upper triangle (or all, without classes): by site
                for c in range(len(z)):
                    sel = site_of == c
                    ax.scatter(Z[sel, j], Z[sel, i], s=7, alpha=0.6, color=site_colour(c), marker="os^dv<>P*X"[c % 10])
            if i == k - 1:
                ax.set_xlabel(f"factor {j + 1}")
            if j == 0:
                ax.set_ylabel(f"factor {i + 1}")
    handles = []
    if classes is not None:
        names = class_names if class_names is not None else [str(g) for g in np.unique(classes)]
        handles += [plt.Line2D([], [], ls="", marker="o", color=class_colour(g), label=f"class: {names[g]}") for g in np.unique(classes)]
    handles += [plt.Line2D([], [], ls="", marker="os^dv<>P*X"[c % 10], color=site_colour(c), label=site_names[c]) for c in range(len(z))]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    shown = f"the first {k} of {model.n_components_} factors" if k < model.n_components_ else f"all {k} factors"
    if classes is not None:
        how = ("Below the diagonal, points are coloured by class; above it, by site (colour and marker); on the diagonal, "
               "the distribution of each factor per class. A pair of factors that separates the classes below the "
               "diagonal carries the class signal; sites that separate above the diagonal mark a site effect the model "
               "did not absorb.")
    else:
        how = ("Points are coloured by site (colour and marker); the diagonal shows each factor's distribution per site. "
               "Sites that separate mark a site effect the model did not absorb.")
    report.figure(
        fig, "latent_pairs",
        f"Every training subject's latent position (posterior mean given the views it has), for every pair of "
        f"{shown}: panel (row i, column j) plots factor i against factor j. {how} Factors are in units of their "
        "standard deviation under the model (standard normal a priori).",
    )


def _imputation_section(report: Report, model: Any, held: HeldOut, names: Mapping[str, Sequence[str]]) -> None:
    imputed = model.impute(held.masked)
    hidden_views = []
    for view in model.schema_.names:
        if view not in held.full or view not in imputed:
            continue
        has = ~np.isnan(held.full[view]).all(axis=1)
        masked = view not in held.masked or np.isnan(held.masked[view]).all(axis=1)
        rows = has & masked
        if rows.any():
            hidden_views.append((view, rows))
    if not hidden_views:
        return
    report.heading("Imputation of hidden views")
    for view, rows in hidden_views:
        truth, mean = held.full[view][rows], imputed[view][rows]
        sd = np.sqrt(model.impute_variance(held.masked, view)[rows])
        if held.scaling is not None:
            truth = held.scaling.inverse_transform({view: truth})[view]
            upper = held.scaling.inverse_transform({view: mean + sd})[view]
            mean = held.scaling.inverse_transform({view: mean})[view]
            sd = np.abs(upper - mean)
        d = truth.shape[1]
        shown = min(d, 12)
        fig, axes, ncol = panel_grid(shown, 4, 2.6 * min(shown, 4) + 0.8, 2.9)
        for f, ax in enumerate(axes):
            ax.errorbar(truth[:, f], mean[:, f], yerr=sd[:, f], fmt="o", ms=3, alpha=0.6, elinewidth=0.6, color="C0")
            lo = float(min(truth[:, f].min(), mean[:, f].min()))
            hi = float(max(truth[:, f].max(), mean[:, f].max()))
            ax.plot([lo, hi], [lo, hi], color="C3", lw=1)
            ax.set_title(names[view][f], fontsize=11)
            if f % ncol == 0:
                ax.set_ylabel("imputed")
            if f + ncol >= shown:
                ax.set_xlabel("real")
        fig.tight_layout()
        more = f" The first {shown} of its {d} features are shown." if shown < d else ""
        report.figure(
            fig, f"imputation_{view}",
            f"View '{view}', hidden for {int(rows.sum())} held-out subjects and imputed from their other views: each point "
            f"is one subject, real value (horizontal) against the imputed predictive mean (vertical), with ± 1 predictive "
            f"standard deviation as a bar, in {held.units}. Points on the red diagonal are imputed exactly; a cloud "
            f"flatter than the diagonal means the other views say little about this feature.{more}",
        )


def _convergence_section(report: Report, model: Any) -> None:
    report.heading("Convergence")
    history = model.history_
    rounds = np.array([h["round"] for h in history])
    ell = np.array([h["expected_ll"] for h in history], dtype=float)
    change = np.array([h["metrics"].get("model_change", np.nan) for h in history], dtype=float)
    private = not np.isfinite(ell).any()  # with privacy the sites do not send their log-likelihood
    plt = pyplot()
    if private:
        fig, ax = plt.subplots(1, 1, figsize=(5.6, 3.9))
        axes = [ax]
    else:
        fig, axes = plt.subplots(1, 3, figsize=(11.3, 3.9))
        axes[0].plot(rounds, ell, marker=".", lw=1)
        scale = trace_axis(axes[0], ell)
        axes[0].set_title("all rounds" + (" (symmetric-log axis)" if scale != "linear" else ""))
        off = zoom_axis(axes[1], rounds, ell, marker=".", lw=1)
        axes[1].set_title("typical range" + (f" ({off} rounds off the scale)" if off else ""))
        for ax in axes[:2]:
            ax.set_xlabel("round")
            ax.set_ylabel("expected log-likelihood")
            mark_stop(ax, int(rounds[-1]), model.n_rounds)
    last = axes[-1]
    if np.isfinite(change).any():
        last.semilogy(rounds, change, marker=".", lw=1)
        from ..protocol.mvppca import stopping_rule

        stops = stopping_rule(model.tol, model.privacy) is not None  # a total privacy budget runs every round
        if stops and model.tol <= 1e3 * np.nanmax(change):  # a threshold far above every change is not drawn
            last.axhline(model.tol, color="C3", lw=1, label=f"stopping threshold {model.tol:g}")
    last.set_title("change of the model's predictions")
    last.set_xlabel("round")
    last.set_ylabel("change (log axis)")
    mark_stop(last, int(rounds[-1]), model.n_rounds)
    for ax in axes:
        ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    change_text = (
        "how much the model's predictive distribution of a subject (at a new site) changed from one round to the next, "
        "on a log axis: the square root of the symmetrised Kullback-Leibler divergence, i.e. a move of the predicted "
        "mean by that many standard deviations. It is the quantity the stopping threshold (tol) is compared with. The "
        "sites re-draw their start from the prior every round, so it need not fall towards 0. The dashed line marks "
        "the last round run."
    )
    if private:
        report.figure(
            fig, "convergence",
            "With privacy, the sites do not send their log-likelihood (computed from their raw data, it would be a "
            "release outside the privacy ledger), so convergence is followed on the global model alone: " + change_text,
        )
        return
    report.figure(
        fig, "convergence",
        "Left and middle: the expected complete-data log-likelihood summed over the sites after each round. It settles "
        "when the fit converges; it need not rise, because from the second round each site fits under the prior "
        "rather than maximising this likelihood alone. The left panel shows every round"
        + (", on a symmetric-log axis because some rounds lie orders of magnitude away from the others"
           if scale != "linear" else "")
        + "; the middle panel zooms on the typical range, with rounds outside it drawn as red triangles on the edge they pass. "
        "Right: " + change_text,
    )


def privacy_by_round(model: Any, n_points: int = 20) -> list[dict[str, Any]]:
    """Cumulative ε of every site after round 1, about ``n_points`` evenly spaced rounds and the last one,
    at the δ the fit reports (``privacy_spent_``); rows ``{"round", "epsilon site s", ...}``."""
    last = model.n_rounds_
    step = max(1, int(np.ceil(last / n_points)))
    checkpoints = sorted({1, *range(step, last + 1, step), last})
    delta = model.privacy_spent_[0]["delta"]
    ledger = model.privacy_ledger_
    return [
        {"round": r, **{f"epsilon site {s}": ledger.epsilon(s, delta, up_to_round=r) for s in range(model.n_sites_)}}
        for r in checkpoints
    ]


def _privacy_section(report: Report, model: Any, site_names: Sequence[str], table: Sequence[Mapping[str, Any]] | None) -> None:
    report.heading("Privacy ledger")
    table = list(privacy_by_round(model) if table is None else table)
    delta = model.privacy_spent_[0]["delta"]
    report.paragraph(
        "Each site adds calibrated noise to everything it sends ("
        + ("record-level differential privacy: it protects each subject" if getattr(model.privacy, "unit", "site") == "record"
           else "client-level differential privacy")
        + "); the ledger "
        f"counts what each site has spent. ε is the privacy loss at δ = {delta:g} accumulated up to each round "
        "(smaller is more private). Every site releases every view, measured there or not, so that its replies do not "
        "tell which views it measures."
    )
    rounds = [row["round"] for row in table]
    keys = [k for k in table[0] if k != "round"]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11.3, 4))
    for i, key in enumerate(keys):
        axes[0].plot(rounds, [row[key] for row in table], lw=2, ls=("-", "--", ":", "-.")[i % 4], color=site_colour(i),
                     label=site_names[i] if i < len(site_names) else key)
    axes[0].set_xlabel("round")
    axes[0].set_ylabel(f"cumulative ε (δ = {delta:g})")
    axes[0].set_title("privacy spent per site")
    axes[0].legend()
    history = model.history_
    hr = [h["round"] for h in history]
    for i, view in enumerate(model.schema_.names):
        for block, ls in (("sd_mu", "-"), ("sd_W", "--")):
            values = [h["metrics"].get(f"{view}/{block}", np.nan) for h in history]
            axes[1].semilogy(hr, values, ls=ls, color=f"C{i}", lw=1.2, label=f"{view}: sd({block[3:]})")
    axes[1].set_xlabel("round")
    axes[1].set_ylabel("global standard deviation (log axis)")
    axes[1].set_title("spread of the sites around the global model")
    axes[1].legend(fontsize=9, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.tight_layout()
    report.figure(
        fig, "privacy",
        "Left: cumulative privacy loss ε of each site after each round (one line per site; sites that release the same "
        "blocks spend the same and their lines coincide); the last value is the site's total. Right: the global standard deviations of the sites' means (solid) and loadings (dashed) per "
        "view and round, on a log axis: how far the sites' (noisy) estimates spread around the global model. The "
        "lowest value, 1e-10, is the floor the fit sets when the sites' estimates coincide.",
    )
    every = max(1, len(table) // 10)
    shown = [row for i, row in enumerate(table) if i % every == 0 or i == len(table) - 1]
    rename = {k: f"ε {site_names[i]}" if i < len(site_names) else k for i, k in enumerate(keys)}
    report.table([{"round": row["round"], **{rename[k]: row[k] for k in keys}} for row in shown],
                 caption=f"Cumulative ε per site (δ = {delta:g})")
