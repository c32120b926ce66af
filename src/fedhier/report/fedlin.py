"""The FedLin report: coefficients with credible intervals (population and per site), predicted
against observed per site, selected variables and the convergence of EP (HM2); HM1 gives point
estimates only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .document import Report
from .figures import mark_stop, panel_grid, pyplot, site_colour

__all__ = ["write_fedlin_report", "fit_by_site", "ep_changes"]

#: sites drawn individually in the figures (the largest ones); every site is in the tables and CSV files
MAX_SITES_SHOWN = 30
#: panels of the predicted-vs-observed figure
MAX_SCATTER_SITES = 12


def fit_by_site(est: Any, sites: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[dict[str, float]]:
    """In-sample RMSE and R^2 = 1 - SS_res / SS_tot of every site's posterior-mean prediction."""
    rows = []
    for k, (X, y) in enumerate(sites):
        resid = y - est.predict(X, k)
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        rows.append({"n": int(len(y)), "RMSE": float(np.sqrt(np.mean(resid**2))),
                     "R²": 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")})
    return rows


def ep_changes(history: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rounds c >= 2 and the two quantities of EP's stopping rule between rounds c-1 and c:
    max_j |m_j(c) - m_j(c-1)| / sqrt(S_jj(c)) and max_j |log S_jj(c) - log S_jj(c-1)|."""
    rounds = np.array([h["round"] for h in history])
    m = np.array([h["phi_mean"] for h in history], dtype=float)
    v = np.array([h["phi_var"] for h in history], dtype=float)
    dm = np.max(np.abs(np.diff(m, axis=0)) / np.sqrt(v[1:]), axis=1)
    dv = np.max(np.abs(np.diff(np.log(v), axis=0)), axis=1)
    return rounds[1:], dm, dv


def _shown_sites(sites, limit: int) -> list[int]:
    """Indices of the ``limit`` largest sites, in their original order."""
    sizes = np.array([len(y) for _, y in sites])
    keep = np.sort(np.argsort(-sizes, kind="stable")[:limit])
    return [int(k) for k in keep]


def write_fedlin_report(
    out: str | Path,
    est: Any,
    sites: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    site_names: Sequence[str],
    features: Sequence[str],
    target: str,
    title: str,
    intro: str,
    command: str | None = None,
    level: float = 0.9,
    scaling: str = "none",
    original: Sequence[dict[str, Any]] = (),
) -> Path:
    """Write ``report.html`` and ``report.md`` of a fitted FedHM1Regressor / FedHM2Regressor into ``out``.

    ``sites``, ``est``: the data and fit in the units the estimator was given; ``scaling``: how the command line
    scaled the columns before the fit ("standard", "minmax" or "none": the files' own units), so that no caption
    claims the files' units for scaled numbers; ``original``: rows (feature, estimate, lower, upper, between-site
    sd, each ``*_original_units``) of the population coefficients in the files' units, shown when scaled.
    """
    hm2 = hasattr(est, "coef_draws_")
    units = f"the units of {target}" if scaling == "none" else f"{target} as scaled ({scaling}) before the fit"
    report = Report(title, intro)
    if command:
        report.command(command)
    _coefficient_section(report, est, sites, site_names, features, level, hm2, scaling, original)
    _prediction_section(report, est, sites, site_names, target, units)
    if hm2:
        _selection_section(report, est, sites, site_names, features, level)
        _convergence_section(report, est, features)
    report.heading("Fit per site")
    report.table(
        [{"site": name, **row} for name, row in zip(site_names, fit_by_site(est, sites))],
        caption=f"Posterior-mean prediction of {target} on each site's own rows (RMSE in {units}; "
                "R² = 1 − residual / total sum of squares, undefined for a single row)",
    )
    return report.write(out)


def _population(est: Any, features: Sequence[str], level: float):
    """(mean, lower, upper, between-site sd) per feature of the Gaussian hierarchy in the units the estimator was
    given, or None: the sd is :math:`\\sqrt{\\tau_j}`, not the prior variance :math:`\\tau_j` itself."""
    if est.prior != "gaussian" or est._standardizes():
        return None
    ci, _ = est.population_interval(level)
    return {j: (float(est.population_coef_[j]), float(ci[j, 0]), float(ci[j, 1]), float(est.between_site_sd_[j]))
            for j, _ in enumerate(features)}


def _coefficient_section(report, est, sites, site_names, features, level, hm2, scaling, original) -> None:
    report.heading("Coefficients: population and sites")
    pct = f"{100 * level:g} %"
    population = _population(est, features, level) if hm2 else None
    per_unit = ("in units of the response per unit of the feature" if scaling == "none" else
                f"per unit of the columns as scaled ({scaling}) before the fit")
    if population:
        report.table(
            [{"feature": f, "population mean": m, f"lower {pct}": lo, f"upper {pct}": hi, "between-site sd": sd}
             for j, f in enumerate(features) for m, lo, hi, sd in [population[j]]],
            caption=f"Population effect of each feature (posterior mean and {pct} interval) and how much the sites' "
                    "coefficients spread around it (between-site standard deviation, the square root of the "
                    f"hierarchy's variance τ; 0 for a feature shared by all sites), {per_unit}",
        )
    if original:
        report.table(
            [{"feature": r["feature"], "population mean": r.get("estimate_original_units", ""),
              f"lower {pct}": r.get("lower_original_units", ""), f"upper {pct}": r.get("upper_original_units", ""),
              "between-site sd": r.get("between_site_sd_original_units", "")} for r in original],
            caption="The same in the files' units: slope × sd of the response / sd of the feature (for min-max scaling, "
                    "the ranges); the intercept also undoes the centring, so its interval is left out. Every site's "
                    "coefficients in the files' units are in coefficients.csv",
        )
    shown = _shown_sites(sites, MAX_SITES_SHOWN)
    ci = est.coef_interval(level) if hm2 else None
    d = len(features)
    height = 0.27 * (len(shown) + (2 if population else 0)) + 1.2
    fig, axes, ncol = panel_grid(d, 3, 3.2 * min(d, 3) + 1.6, height)
    labels = (["population"] if population else []) + [site_names[k] for k in shown]
    ypos = np.arange(len(labels))[::-1]
    for j, ax in enumerate(axes):
        row = 0
        if population:
            m, lo, hi, _ = population[j]
            ax.errorbar([m], [ypos[0]], xerr=[[m - lo], [hi - m]], fmt="D", color="k", ms=6, capsize=3)
            ax.axvspan(lo, hi, color="0.9", zorder=0)
            row = 1
        for r, k in enumerate(shown):
            y = ypos[row + r]
            if hm2:
                lo, hi = ci[k, j]
                ax.errorbar([est.coef_[k, j]], [y], xerr=[[est.coef_[k, j] - lo], [hi - est.coef_[k, j]]], fmt="o",
                            ms=4, color=site_colour(k), elinewidth=1.2)
            else:
                ax.plot([est.coef_[k, j]], [y], "o", ms=5, color=site_colour(k))
        ax.axvline(0, color="0.4", lw=0.8, ls=":")
        ax.set_title(features[j])
        ax.set_yticks(ypos, labels if j % ncol == 0 else [""] * len(labels))
        ax.set_xlabel("coefficient")
        ax.grid(axis="y", alpha=0.15)
    fig.tight_layout()
    subset = (f" The {len(shown)} largest of the {len(sites)} sites are drawn; every site is in coefficients.csv."
              if len(shown) < len(sites) else "")
    if hm2:
        caption = (f"Forest plot: one panel per feature, one row per site, with the site's posterior mean (dot) and "
                   f"{pct} credible interval (bar)." + (" The top row (black diamond, grey band) is the population mean "
                   "of the hierarchy with its interval: sites whose bars overlap the band agree with the population; the "
                   "spread of the dots is the between-site variation." if population else "")
                   + " The dotted line is 0: a bar that crosses it means the data do not settle the coefficient's sign. "
                   f"Coefficients are {per_unit}." + subset)
    else:
        caption = ("One panel per feature, one row per site: each site's point estimate (HM1 gives no intervals). The "
                   f"dotted line is 0. Coefficients are {per_unit}." + subset)
    report.figure(fig, "coefficients", caption)


def _prediction_section(report, est, sites, site_names, target, units) -> None:
    report.heading("Predicted against observed")
    shown = _shown_sites(sites, MAX_SCATTER_SITES)
    fig, axes, ncol = panel_grid(len(shown), 4, 2.7 * min(len(shown), 4) + 0.5, 2.9)
    for i, ax in enumerate(axes):
        k = shown[i]
        X, y = sites[k]
        pred = est.predict(X, k)
        ax.scatter(y, pred, s=10, alpha=0.6, color=site_colour(k))
        lo, hi = float(min(y.min(), pred.min())), float(max(y.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], color="0.3", lw=1)
        ax.set_title(site_names[k])
        if i % ncol == 0:
            ax.set_ylabel(f"predicted {target}")
        if i + ncol >= len(shown):
            ax.set_xlabel(f"observed {target}")
    fig.tight_layout()
    subset = f" The {len(shown)} largest of the {len(sites)} sites are shown." if len(shown) < len(sites) else ""
    report.figure(
        fig, "predicted_vs_observed",
        f"Each row of a site's data: observed {target} (horizontal) against the model's posterior-mean prediction "
        f"(vertical), in {units}. Points on the grey diagonal are predicted exactly; the vertical scatter "
        f"around it is the error the table at the end (fit per site) summarises as RMSE.{subset}",
    )


def _selection_section(report, est, sites, site_names, features, level) -> None:
    report.heading("Selected variables")
    pct = f"{100 * level:g} %"
    report.paragraph(
        f"A feature is selected at a site when its {pct} credible interval excludes 0. With the lasso prior this is "
        "the model's variable selection; with the other priors it is the same rule applied to their posteriors. The "
        "inclusion score max(P(coefficient > 0), P(coefficient < 0)) grades the evidence: 0.5 is none, 1 is certain."
    )
    selected = np.asarray(est.selected_features_)
    score = np.asarray(est.inclusion_score_)
    report.table(
        [{"feature": f, "sites selecting it": int(selected[:, j].sum()), "of sites": len(sites),
          "mean inclusion score": float(score[:, j].mean())} for j, f in enumerate(features)],
        caption="How many sites select each feature",
    )
    shown = _shown_sites(sites, MAX_SITES_SHOWN)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(1.1 * len(features) + 3.4, 11.3), 0.3 * len(shown) + 1.6))
    im = ax.imshow(score[shown], cmap="Greens", vmin=0.5, vmax=1.0, aspect="auto")
    for r, k in enumerate(shown):
        for j in range(len(features)):
            if selected[k, j]:
                ax.text(j, r, "✓", ha="center", va="center", fontsize=12, color="white" if score[k, j] > 0.85 else "black")
    ax.set_xticks(range(len(features)), features, rotation=30, ha="right")
    ax.set_yticks(range(len(shown)), [site_names[k] for k in shown])
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="inclusion score")
    subset = f" The {len(shown)} largest of the {len(sites)} sites are drawn." if len(shown) < len(sites) else ""
    report.figure(
        fig, "selection",
        f"Inclusion score of each feature (column) at each site (row): darker green is stronger evidence that the "
        f"coefficient is not 0; a tick marks a feature selected at that site ({pct} interval excludes 0).{subset}",
    )


def _phi_label(name: str, features: Sequence[str]) -> str:
    """``mu[j]`` -> "population mean: <feature j>", ``log_tau[j]`` -> "log between-site variance: <feature j>"."""
    for prefix, label in (("mu[", "population mean"), ("log_tau[", "log between-site variance")):
        if name.startswith(prefix):
            return f"{label}: {features[int(name[len(prefix):-1])]}"
    return name


def _convergence_section(report, est, features) -> None:
    report.heading("Convergence of EP")
    history = est.history_
    if len(history) < 2:
        report.paragraph(f"EP ran {len(history)} round; there is no change between rounds to show.")
        return
    rounds, dm, dv = ep_changes(history)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11.3, 3.8))
    hr = [h["round"] for h in history]
    means = np.array([h["phi_mean"] for h in history])
    for i, name in enumerate(est.phi_names_[:10]):
        axes[0].plot(hr, means[:, i], marker=".", lw=1, label=_phi_label(name, features))
    axes[0].set_xlabel("EP round")
    axes[0].set_ylabel("posterior mean")
    axes[0].set_title("global parameters of the hierarchy")
    axes[0].legend(fontsize=9, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    axes[1].semilogy(rounds, dm, marker=".", label="change of the means (in posterior sds)")
    axes[1].semilogy(rounds, dv, marker=".", label="change of the log variances")
    if est.tol is not None:
        axes[1].axhline(est.tol, color="C3", lw=1, label=f"stopping threshold {est.tol:g}")
    axes[1].set_xlabel("EP round")
    axes[1].set_ylabel("largest change (log axis)")
    axes[1].set_title("change from the previous round")
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        mark_stop(ax, int(hr[-1]), int(est.n_rounds))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, ncol=2)
    fig.tight_layout()
    shown = "" if len(est.phi_names_) <= 10 else f" The first 10 of {len(est.phi_names_)} parameters are drawn."
    works_in = ("every column divided by its sd across the sites" if getattr(est, "scale_", "none") == "standard"
                else "the columns as the estimator was given them")
    report.figure(
        fig, "ep_convergence",
        "Left: posterior mean of each global parameter of the hierarchy after each EP round, in the units the fit "
        f"works in ({works_in}): population means of the coefficients, logs of their between-site variances τ (the sd is exp(log τ / 2)); "
        "log_sigma2 and log_lambda: log noise variance and log shrinkage. Flat lines mean EP has settled. Right: the largest change of those means (in posterior standard "
        "deviations) and of their log variances from one round to the next, on a log axis; EP stops early when both "
        "stay below the threshold for three rounds. The dashed line marks the last round run." + shown,
    )
