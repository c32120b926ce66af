"""The main job (``fedhier demo``): Fed-mv-PPCA on the bundled Alzheimer data.

Pipeline (spec fed-mv-ppca §§11-12):

1. ``load_alzheimer()`` -- 333 subjects, 3 views (proteins 124, CSF markers 3,
   demographics 4), Impaired vs Control.
2. A stratified hold-out third is the test set; the training two-thirds are split over
   3 sites in the G/K scenario (§12.2): site 1 has both groups and all views, site 2
   only impaired subjects and no CSF view, site 3 only controls and no demographics.
3. Federated min-max scaling fitted on the training sites (§14 row 1), applied to all.
4. ``FedMVPPCA`` fit; in the test set a random third lacks CSF and a third lacks
   demographics (§12.2 [R]).
5. Summary: test and train MAE, latent-space LDA accuracy, imputation error of the
   hidden test views against mean imputation, bytes sent; report folder with figures.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from .data import (
    MinMaxScaling, MultiViewDataset, Partition, combine_ranges, load_alzheimer, mask_test_views, partition, site_ranges,
)
from .models.mvppca.dp import DPConfig
from .privacy.analyze_gauss import RecordDP
from .privacy.sampling import NOT_PRIVATE
from .models.mvppca.forecast import mvppca_forecast
from .privacy.forecast import Forecast
from .protocol.mvppca import stopping_rule
from .metrics import imputation_mae, latent_accuracy, observed_rows, reconstruction_mae
from .baselines.mean import TrainingMean
from .estimators.mvppca import FedMVPPCA
from .report.mvppca import privacy_by_round
from .utils.io import write_json
from .utils.results import result_folder

__all__ = ["run_demo", "DemoData", "demo_data", "demo_forecast", "demo_privacy", "ALZHEIMER_VIEWS", "ALZHEIMER_SUBJECTS",
           "DEFAULT_EPSILON"]

#: the bundled Alzheimer data's views and widths, and its number of subjects: public, known before it is read
ALZHEIMER_VIEWS = {"proteins": 124, "csf": 3, "demographics": 4}
ALZHEIMER_SUBJECTS = 333

#: the demo's default total epsilon per site for each unit of protection (delta 1e-5): record-level DP at
#: epsilon 10 beats the training mean on the demo; with 3 sites, site-level DP at epsilon 1 does not
DEFAULT_EPSILON = {"record": 10.0, "site": 1.0}


def _subset(views: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {v: X[rows] for v, X in views.items()}


@dataclass
class DemoData:
    """The demo's data, steps 1-3 and the test masking of step 4 (see the module docstring)."""

    data: MultiViewDataset  # the bundled Alzheimer data
    scaling: MinMaxScaling  # fitted on the training sites
    train_views: dict[str, np.ndarray]  # the training two-thirds, unscaled, (n_train, d_view) per view
    y_train: np.ndarray
    part: Partition  # the training rows over the sites
    sites: list[dict[str, np.ndarray]]  # the sites' scaled data
    test_full: dict[str, np.ndarray]  # the scaled test third
    test_masked: dict[str, np.ndarray]  # the same with the hidden views set to NaN
    y_test: np.ndarray


def demo_data(*, n_sites: int = 3, scenario: str = "GK", seed: int = 0) -> DemoData:
    """Split, partition, scale and mask the bundled Alzheimer data as :func:`run_demo` does."""
    data = load_alzheimer()
    idx = np.arange(data.n_samples)
    train_idx, test_idx = train_test_split(idx, test_size=1 / 3, stratify=data.labels, random_state=seed)
    train_views, test_views = _subset(data.views, train_idx), _subset(data.views, test_idx)
    y_train = data.labels[train_idx]
    part = partition(train_views, y_train, n_sites, scenario, random_state=seed)
    scaling = MinMaxScaling(combine_ranges([site_ranges(site) for site in part.sites]))
    test_full = scaling.transform(test_views)
    return DemoData(
        data=data, scaling=scaling, train_views=train_views, y_train=y_train, part=part,
        sites=[scaling.transform(site) for site in part.sites], test_full=test_full,
        test_masked=mask_test_views(test_full, scenario, random_state=seed), y_test=data.labels[test_idx],
    )


def demo_forecast(privacy: DPConfig | RecordDP | None, *, n_components: int = 5, n_sites: int = 3,
                  n_rounds: int = 100) -> Forecast | None:
    """The utility forecast of the demo's private fit (:mod:`fedhier.models.mvppca.forecast`), None without privacy.

    From the bundled data's public shapes only (:data:`ALZHEIMER_VIEWS`, two thirds of
    :data:`ALZHEIMER_SUBJECTS` for training): nothing is read.
    """
    if privacy is None:
        return None
    return mvppca_forecast(ALZHEIMER_VIEWS, n_components, n_sites, privacy, n_rounds=n_rounds,
                           n_subjects=ALZHEIMER_SUBJECTS - round(ALZHEIMER_SUBJECTS / 3))


def demo_privacy(total_budget: tuple[float, float] | None, per_release: tuple[float, float] | None,
                 n_rounds: int = 100, unit: str = "record") -> DPConfig | RecordDP | None:
    """The demo's privacy settings, or None: a total budget per site protecting one subject (``unit="record"``,
    one release of noisy moments per site) or the whole site over ``n_rounds`` rounds (``unit="site"``),
    or the paper's per-release budget."""
    if total_budget is not None and per_release is not None:
        raise ValueError("choose either a total budget or a per-release budget, not both")
    if unit not in ("record", "site"):
        raise ValueError(f"the unit of privacy must be 'record' or 'site', got {unit!r}")
    if total_budget is not None and unit == "record":
        return RecordDP(*total_budget)
    if total_budget is not None:
        # the default EM prior update also releases two posterior-spread scalars per view and round
        return DPConfig.total(*total_budget, n_rounds=n_rounds, n_views=len(ALZHEIMER_VIEWS), spread=True)
    if per_release is not None:
        return DPConfig.per_release(*per_release)
    return None


def run_demo(
    out_dir: str | Path = "fedhier-report",
    *,
    n_components: int = 5,
    n_rounds: int = 100,
    n_sites: int = 3,
    scenario: str = "GK",
    seed: int = 0,
    total_budget: tuple[float, float] | None = None,
    per_release: tuple[float, float] | None = None,
    unit: str = "record",
    progress: bool = True,
    site_timeout: float | None = None,
    insecure_reproducible_noise: bool = False,
) -> dict[str, Any]:
    """Run the demo, write the report folder and return the summary metrics.

    ``site_timeout``: seconds a site's step may take before the site is left out of that round
    (``FedMVPPCA(site_timeout=...)``); None waits for every site.

    ``total_budget=(epsilon, delta)`` fits DP-Fed-mv-PPCA with that total budget per
    site for the whole fit, protecting one subject (``unit="record"``: each site releases its
    noisy moments once) or a whole site (``unit="site"``: client-level DP, spec §8;
    ``docs/privacy.md``);
    ``per_release=(epsilon, delta)`` uses the paper's semantics, (epsilon, delta) per
    block per round (§12.4), and reports the true cumulative epsilon at delta = 1e-5.
    The privacy noise comes from each site's operating system, so two runs differ;
    ``insecure_reproducible_noise=True`` derives it from ``seed`` instead, and the result then
    says it is not private and claims no epsilon.

    A private run first forecasts its utility from public shapes only (:func:`demo_forecast`)
    and warns, before any data is read, when the private model is not expected to beat the
    training mean.
    """
    demo_privacy(total_budget, per_release, unit=unit)  # refuses bad settings before the output folder is touched
    with result_folder(out_dir) as staging:  # checked now; appears with all its files or not at all
        return _run_demo(staging, n_components=n_components, n_rounds=n_rounds, n_sites=n_sites, scenario=scenario,
                         seed=seed, total_budget=total_budget, per_release=per_release, unit=unit, progress=progress,
                         site_timeout=site_timeout, insecure_reproducible_noise=insecure_reproducible_noise)


def demo_metrics(model: FedMVPPCA, prepared: DemoData) -> dict[str, Any]:
    """The demo's summary of a fitted model: test and train MAE, the training mean's test MAE, the latent LDA
    accuracy, and per hidden test view the imputation MAE against mean imputation (the mean of the sites' rows)."""
    sites, test_full, test_masked = prepared.sites, prepared.test_full, prepared.test_masked
    train_mae = [reconstruction_mae(site, model.reconstruct(site)) for site in sites]
    z_train = np.vstack([model.transform(site) for site in sites])
    y_train_sites = np.concatenate([prepared.y_train[i] for i in prepared.part.indices])
    imputed = model.impute(test_masked)
    imputation_rows = []
    for view in prepared.data.schema.names:
        hidden = observed_rows(test_full[view]) & ~observed_rows(test_masked[view])
        if not hidden.any():
            continue
        observed = [s[view][observed_rows(s[view])] for s in sites if view in s]
        mean = np.vstack(observed).mean(0)
        imputation_rows.append(
            {
                "view": view,
                "hidden subjects": int(hidden.sum()),
                "Fed-mv-PPCA MAE": imputation_mae(test_full[view], imputed[view], hidden),
                "mean-imputation MAE": imputation_mae(test_full[view], np.broadcast_to(mean, test_full[view].shape), hidden),
            }
        )
    return {
        "test_mae": reconstruction_mae(test_masked, model.reconstruct(test_masked)),
        "training_mean_test_mae": reconstruction_mae(test_masked, TrainingMean().fit(sites).reconstruct(test_masked)),
        "train_mae_mean": float(np.mean(train_mae)),
        "train_mae_std": float(np.std(train_mae)),
        "latent_lda_accuracy": latent_accuracy(z_train, y_train_sites, model.transform(test_masked), prepared.y_test),
        "imputation": imputation_rows,
    }


def _run_demo(out: Path, *, n_components: int, n_rounds: int, n_sites: int, scenario: str, seed: int,
              total_budget: tuple[float, float] | None, per_release: tuple[float, float] | None, unit: str,
              progress: bool, insecure_reproducible_noise: bool, site_timeout: float | None = None) -> dict[str, Any]:
    """:func:`run_demo`, writing the report folder's files into ``out`` (its staging folder)."""
    t0 = time.perf_counter()
    privacy = demo_privacy(total_budget, per_release, n_rounds, unit)
    outlook = demo_forecast(privacy, n_components=n_components, n_sites=n_sites, n_rounds=n_rounds)
    if outlook is not None and not outlook.beats_mean:
        warnings.warn(outlook.line(), UserWarning, stacklevel=3)
    prepared = demo_data(n_sites=n_sites, scenario=scenario, seed=seed)
    part, sites = prepared.part, prepared.sites

    model = FedMVPPCA(n_components=n_components, n_rounds=n_rounds, random_state=seed, privacy=privacy, progress=progress,
                      site_timeout=site_timeout, insecure_reproducible_noise=insecure_reproducible_noise)
    model.fit(sites)

    metrics = demo_metrics(model, prepared)
    bytes_sent = int(sum(h["bytes_sent"] for h in model.history_))
    seconds = time.perf_counter() - t0

    summary = {
        "data": "Alzheimer CSF study (Craig-Schapiro et al. 2011), 3 views",
        "scenario": scenario,
        "n_sites": n_sites,
        "site_sizes": [int(len(i)) for i in part.indices],
        "missing_views": [list(m) for m in part.missing],
        "n_components": n_components,
        "n_rounds": n_rounds,
        "rounds_run": model.n_rounds_,
        "tol": model.tol if stopping_rule(model.tol, privacy) is not None else None,  # None: every round runs
        "seed": seed,
        **metrics,
        "bytes_sent": bytes_sent,
        "seconds": seconds,
    }
    if total_budget is not None:
        summary["privacy_unit"] = unit
        summary["epsilon"], summary["delta"] = (float(x) for x in total_budget)
    if outlook is not None:
        summary["forecast"] = {"kept": outlook.kept, "beats_mean": outlook.beats_mean, "line": outlook.line()}
    summary["command"] = _command(summary, total_budget, per_release, unit, insecure_reproducible_noise)
    report_tables = [("Imputation of the hidden test views: mean absolute error on min–max-scaled data", metrics["imputation"])]
    privacy_rows = None
    if privacy is not None and insecure_reproducible_noise:
        summary["not_private"] = NOT_PRIVATE
        write_json(out / "privacy-report.json", model.privacy_report())
        report_tables.append(("Privacy", [{"statement": NOT_PRIVATE}]))
    elif privacy is not None:
        summary["scaling_outside_privacy"] = SCALING_OUTSIDE_PRIVACY
        summary["privacy_spent"] = model.privacy_spent_
        write_json(out / "privacy-report.json", model.privacy_report())
        summary["privacy_by_round"] = privacy_rows = privacy_by_round(model)
        report_tables.append(
            ("Privacy spent per site for the whole fit", [{"site": f"site {s + 1}", **v} for s, v in model.privacy_spent_.items()])
        )
    model.save(out / "model.npz")
    write_json(out / "summary.json", summary)
    _write_report(out, summary, model, prepared, report_tables, privacy_rows)
    return summary


#: what a private demo says of its scaling (its ranges are the training sites' own minima and maxima)
SCALING_OUTSIDE_PRIVACY = ("The min–max scaling ranges came from the training sites' data, outside the privacy guarantee "
                           "(a simulation; a deployment declares public ranges).")


#: how a record-level demo is fitted, in place of its rounds
RECORD_LEVEL_FIT = ("one round: each site released its noisy moments once, and the model was fitted from them "
                    "(no further data were read)")


def _metrics_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    forecast = ([{"metric": "utility forecast, before the data were read (public quantities only)",
                  "value": summary["forecast"]["line"].removeprefix("utility forecast: ")}] if "forecast" in summary else [])
    return forecast + [
        {"metric": "test MAE (observed views, min–max-scaled data)", "value": summary["test_mae"]},
        {"metric": "test MAE of predicting each feature's training mean", "value": summary["training_mean_test_mae"]},
        {"metric": "train MAE (mean over sites, min–max-scaled data)", "value": summary["train_mae_mean"]},
        {"metric": "latent-space LDA accuracy (test subjects)", "value": summary["latent_lda_accuracy"]},
        {"metric": "bytes sent by all sites", "value": summary["bytes_sent"]},
        {"metric": "wall time of the fit and its metrics (s)", "value": summary["seconds"]},
    ]


def _command(summary: dict[str, Any], total_budget, per_release, unit: str, insecure_reproducible_noise: bool) -> str:
    """The ``fedhier demo`` command line of this run (the library call's equivalent)."""
    parts = ["fedhier demo"]
    if summary["seed"] != 0:
        parts.append(f"--seed {summary['seed']}")
    if summary["n_rounds"] != 100:
        parts.append(f"--rounds {summary['n_rounds']}")
    if summary["n_components"] != 5:
        parts.append(f"--components {summary['n_components']}")
    if total_budget is not None:
        parts.append("--dp" if tuple(total_budget) == (DEFAULT_EPSILON[unit], 1e-5)
                     else f"--epsilon {total_budget[0]:g} --delta {total_budget[1]:g}")
        if unit != "record":
            parts.append(f"--unit {unit}")
    if per_release is not None:
        parts.append("--paper-dp" if tuple(per_release) == (10.0, 0.01) else f"(per-release budget ε = {per_release[0]:g}, δ = {per_release[1]:g})")
    if insecure_reproducible_noise:
        parts.append("--insecure-reproducible-noise")
    return " ".join(parts)


def _write_report(out: Path, summary: dict[str, Any], model: FedMVPPCA, prepared: DemoData, tables, privacy_rows) -> None:
    absent = "; ".join(
        f"site {c + 1} lacks {', '.join(m)}" for c, m in enumerate(summary["missing_views"]) if m
    )
    intro = (
        f"{summary['data']}: {sum(summary['site_sizes'])} training subjects split over {summary['n_sites']} sites "
        f"(sizes {', '.join(map(str, summary['site_sizes']))}; {absent or 'every site has every view'}), and "
        f"{len(prepared.y_test)} held-out test subjects, of whom a random third lack one view each. Federated "
        f"Fed-mv-PPCA with {summary['n_components']} latent factors, "
        + (f"{RECORD_LEVEL_FIT} (record-level differential privacy, total ε = {summary['epsilon']:g} at "
           f"δ = {summary['delta']:g} per site)" if summary.get("privacy_unit") == "record" else
           f"{summary['rounds_run']} rounds ("
           + (f"at most {summary['n_rounds']}: the fit stops once a round changes the model's predictions by less than {summary['tol']:g}"
              if summary["tol"] is not None else "all of them: the noise of the total privacy budget is calibrated for every round")
           + ")"
           + (f" with site-level differential privacy, total ε = {summary['epsilon']:g} at δ = {summary['delta']:g} per site"
              if summary.get("privacy_unit") == "site" else ""))
        + ". All data are "
        "min–max scaled to [0, 1] with the training sites' ranges; errors are on that scale."
        + (f" {SCALING_OUTSIDE_PRIVACY}" if "scaling_outside_privacy" in summary else "")
        + (f" This result is {summary['not_private']}." if "not_private" in summary else "")
    )
    from .report.mvppca import HeldOut, write_mvppca_report

    write_mvppca_report(
        out, model, title="Fed-mv-PPCA demo", intro=intro, command=summary["command"],
        summary_rows=_metrics_rows(summary), tables=tables, sites=prepared.sites,
        site_classes=[prepared.y_train[i] for i in prepared.part.indices], class_names=prepared.data.label_names,
        feature_names=prepared.data.feature_names,
        held_out=HeldOut(prepared.test_full, prepared.test_masked, prepared.scaling, units="the data's original units"),
        scale_note="min–max scaled to [0, 1]", privacy=privacy_rows,
    )
