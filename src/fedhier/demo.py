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

import base64
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from .data import (
    MinMaxScaling, MultiViewDataset, Partition, combine_ranges, load_alzheimer, mask_test_views, partition, site_ranges,
)
from .models.mvppca.dp import DPConfig
from .metrics import imputation_mae, latent_accuracy, observed_rows, reconstruction_mae
from .mvppca import FedMVPPCA
from .plots import plot_convergence, plot_global_sd, plot_imputation, plot_latent
from .utils.io import atomic_write_text, markdown_table, write_json

__all__ = ["run_demo", "DemoData", "demo_data"]


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
    progress: bool = True,
) -> dict[str, Any]:
    """Run the demo, write the report folder and return the summary metrics.

    ``total_budget=(epsilon, delta)`` fits DP-Fed-mv-PPCA with that total budget per
    site for the whole fit (client-level DP, spec §8; ``docs/privacy.md``);
    ``per_release=(epsilon, delta)`` uses the paper's semantics, (epsilon, delta) per
    block per round (§12.4), and reports the true cumulative epsilon at delta = 1e-5.
    """
    if total_budget is not None and per_release is not None:
        raise ValueError("choose either a total budget or a per-release budget, not both")
    out = Path(out_dir)
    t0 = time.perf_counter()
    prepared = demo_data(n_sites=n_sites, scenario=scenario, seed=seed)
    data, part, sites, y_train, y_test = prepared.data, prepared.part, prepared.sites, prepared.y_train, prepared.y_test
    test_full, test_masked = prepared.test_full, prepared.test_masked

    privacy = None
    if total_budget is not None:
        privacy = DPConfig.total(*total_budget, n_rounds=n_rounds, n_views=max(len(s) for s in sites))
    elif per_release is not None:
        privacy = DPConfig.per_release(*per_release)
    model = FedMVPPCA(n_components=n_components, n_rounds=n_rounds, random_state=seed, privacy=privacy, progress=progress)
    model.fit(sites)

    # §11 metrics
    train_mae = [reconstruction_mae(site, model.reconstruct(site)) for site in sites]
    test_mae = reconstruction_mae(test_masked, model.reconstruct(test_masked))
    z_train = np.vstack([model.transform(site) for site in sites])
    y_train_sites = np.concatenate([y_train[i] for i in part.indices])
    z_test = model.transform(test_masked)
    accuracy = latent_accuracy(z_train, y_train_sites, z_test, y_test)

    # imputation of hidden test views vs mean imputation (federated mean of training sites)
    imputed = model.impute(test_masked)
    imputation_rows = []
    for view in data.schema.names:
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
        "seed": seed,
        "test_mae": test_mae,
        "train_mae_mean": float(np.mean(train_mae)),
        "train_mae_std": float(np.std(train_mae)),
        "latent_lda_accuracy": accuracy,
        "imputation": imputation_rows,
        "bytes_sent": bytes_sent,
        "seconds": seconds,
    }
    if privacy is not None:
        summary["privacy_spent"] = model.privacy_spent_
        write_json(out / "privacy-report.json", model.privacy_report())
        delta = model.privacy_spent_[0]["delta"]
        checkpoints = sorted({1, *range(10, n_rounds + 1, 10), n_rounds})
        summary["privacy_by_round"] = [
            {"round": r, **{f"epsilon site {s}": model.privacy_ledger_.epsilon(s, delta, up_to_round=r) for s in range(n_sites)}}
            for r in checkpoints
        ]

    # report
    figures = {
        "convergence.png": plot_convergence(model.history_, out / "convergence.png", "Fed-mv-PPCA convergence"),
        "latent.png": plot_latent(
            z_test, y_test, data.label_names, out / "latent.png", title="Test subjects in the latent space (LDA-ready)"
        ),
    }
    if privacy is not None:
        figures["global_sd.png"] = plot_global_sd(
            model.history_, out / "global_sd.png", "Global standard deviations per round (spec §8.5, paper Fig. 7)"
        )
    if imputation_rows:
        view = imputation_rows[0]["view"]
        hidden = observed_rows(test_full[view]) & ~observed_rows(test_masked[view])
        variance = model.impute_variance(test_masked, view)
        figures["imputation.png"] = plot_imputation(
            test_full[view][hidden],
            imputed[view][hidden],
            variance[hidden],
            data.feature_names[view],
            out / "imputation.png",
            title=f"Hidden view '{view}': real values vs predictive distribution",
        )
    model.save(out / "model.npz")
    write_json(out / "summary.json", summary)
    _write_report(out, summary, figures)
    return summary


def _metrics_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"metric": "test MAE (observed views)", "value": summary["test_mae"]},
        {"metric": "train MAE (mean over sites)", "value": summary["train_mae_mean"]},
        {"metric": "latent-space LDA accuracy", "value": summary["latent_lda_accuracy"]},
        {"metric": "bytes sent by all sites", "value": summary["bytes_sent"]},
        {"metric": "wall time (s)", "value": summary["seconds"]},
    ]


def _write_report(out: Path, summary: dict[str, Any], figures: dict[str, Path]) -> None:
    intro = (
        f"# Fed-mv-PPCA demo\n\nCommand: `fedhier demo` (seed {summary['seed']}). {summary['data']}, "
        f"{summary['n_sites']} sites in scenario {summary['scenario']} (sizes {summary['site_sizes']}, "
        f"absent views {summary['missing_views']}), q = {summary['n_components']}, {summary['n_rounds']} rounds.\n\n"
    )
    tables = "## Summary\n\n" + markdown_table(_metrics_rows(summary))
    if summary["imputation"]:
        tables += "\n## Imputation of hidden test views\n\n" + markdown_table(summary["imputation"])
    if "privacy_spent" in summary:
        spent = [{"site": s, **v} for s, v in summary["privacy_spent"].items()]
        tables += "\n## Privacy spent per site (client-level DP, PLD accountant)\n\n" + markdown_table(spent)
        tables += "\n## Cumulative epsilon by round\n\n" + markdown_table(summary["privacy_by_round"])
    md = intro + "".join(f"![{name}]({name})\n\n" for name in figures) + tables
    atomic_write_text(out / "report.md", md)
    imgs = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(Path(p).read_bytes()).decode()}" alt="{n}"></figure>'
        for n, p in figures.items()
    )
    html_tables = "<pre>" + tables.replace("<", "&lt;") + "</pre>"
    html = (
        "<!doctype html><html><head><meta charset='utf-8'><title>fedhier demo</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}figure{display:inline-block;margin:6px}"
        "img{max-width:520px}</style></head><body>"
        f"<h1>Fed-mv-PPCA demo</h1><p>{intro.splitlines()[2]}</p>{imgs}{html_tables}</body></html>"
    )
    atomic_write_text(out / "report.html", html)
