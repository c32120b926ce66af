"""The CollabDict report: anomaly scores per site with the alarm threshold (and the known anomalies),
ROC curves when labels exist, the sites' mixture weights, consensus error over iterations and ε."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .document import Report
from .figures import mark_stop, panel_grid, pyplot, site_colour

__all__ = ["write_collab_report"]

#: sites drawn in the score figure (every site is in the tables)
MAX_SITES_SHOWN = 12
MEANINGFUL_EPSILON = 10.0  # above this an ε bounds nothing useful: odds may grow by e^10 ≈ 22 000


def write_collab_report(
    out: str | Path,
    model: Any,
    sites: Sequence[np.ndarray],
    *,
    site_names: Sequence[str],
    variables: Sequence[str],
    title: str,
    intro: str,
    command: str | None = None,
    labels: Sequence[np.ndarray] | None = None,
) -> Path:
    """Write ``report.html`` and ``report.md`` of a fitted :class:`~fedhier.estimators.collab.CollabDict` into ``out``.

    sites : each site's samples (N_s, M) in their recorded order (the score figure's horizontal axis).
    labels : optional (N_s,) 0/1 per site, 1 = known anomaly; adds the ROC curves and detection rates.
    """
    scores = [model.anomaly_score(X, site=s) for s, X in enumerate(sites)]
    report = Report(title, intro)
    if command:
        report.command(command)
    rows = []
    for s, (name, sc) in enumerate(zip(site_names, scores)):
        alarm = sc > model.thresholds_[s]
        row = {"site": name, "samples": int(len(sc)), "threshold": float(model.thresholds_[s]), "alarms": int(alarm.sum())}
        if labels is not None:
            y = np.asarray(labels[s]).astype(bool)
            row["known anomalies"] = int(y.sum())
            row["detected"] = int((alarm & y).sum())
            row["false alarms"] = int((alarm & ~y).sum())
            row["ROC AUC"] = _auc(y, sc)
        rows.append(row)
    report.table(rows, caption="Alarms per site: samples whose anomaly score exceeds the site's threshold "
                               f"(the {100 * (1 - model.contamination):g}th percentile of its training scores)")
    _score_section(report, model, scores, site_names, labels)
    if labels is not None:
        _roc_section(report, scores, site_names, labels)
    _weights_section(report, model, site_names)
    _consensus_section(report, model)
    _privacy_section(report, model, site_names)
    return report.write(out)


def _auc(y: np.ndarray, score: np.ndarray) -> float | None:
    if y.all() or not y.any():
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def _score_section(report, model, scores, site_names, labels) -> None:
    report.heading("Anomaly scores per site")
    shown = list(range(min(len(scores), MAX_SITES_SHOWN)))
    fig, axes, _ = panel_grid(len(shown), 2, 11.3, 3.0)
    for i, ax in enumerate(axes):
        sc = scores[i]
        idx = np.arange(1, len(sc) + 1)
        ax.plot(idx, sc, lw=0.8, color=site_colour(i))
        ax.axhline(model.thresholds_[i], color="C3", lw=1.2, ls="--", label="threshold")
        if labels is not None:
            y = np.asarray(labels[i]).astype(bool)
            ax.plot(idx[y], sc[y], "o", ms=4, mfc="none", color="k", label="known anomaly")
        ax.set_title(site_names[i])
        ax.set_xlabel("sample (in recorded order)")
        ax.set_ylabel("anomaly score")
        if np.ptp(sc) > 0 and sc.max() - np.median(sc) > 50 * (np.median(sc) - sc.min() + 1e-12):
            ax.set_yscale("symlog", linthresh=max(abs(float(np.median(sc))), 1e-6))
        if i == 0:
            ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    more = f" The first {len(shown)} of {len(scores)} sites are drawn." if len(shown) < len(scores) else ""
    report.figure(
        fig, "scores",
        "Each site's anomaly score of every sample, in the order the samples were recorded (higher = less like the "
        "patterns the sites learned together, weighted by the site's own mixture). The red dashed line is the site's "
        "alarm threshold; samples above it raise an alarm."
        + (" Black circles mark the samples labelled as anomalies: a good detector puts them above the line and "
           "little else." if labels is not None else "")
        + " The score is a negative log-density of the standardised sample, so it has no unit; only its ranking and "
        "its position against the threshold matter." + more,
    )


def _roc_section(report, scores, site_names, labels) -> None:
    from sklearn.metrics import roc_curve

    report.heading("Detection of the labelled anomalies (ROC)")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    for s, (sc, y) in enumerate(zip(scores, labels)):
        y = np.asarray(y).astype(bool)
        if y.all() or not y.any():
            continue
        fpr, tpr, _ = roc_curve(y, sc)
        ax.plot(fpr, tpr, color=site_colour(s), lw=1.5, label=f"{site_names[s]} (AUC {_auc(y, sc):.2f})")
    ax.plot([0, 1], [0, 1], color="0.5", ls=":", lw=1, label="chance")
    ax.set_xlabel("false alarm rate (share of normal samples flagged)")
    ax.set_ylabel("detection rate (share of anomalies flagged)")
    ax.set_aspect("equal")
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    report.figure(
        fig, "roc",
        "For every possible threshold, the share of labelled anomalies flagged (vertical) against the share of normal "
        "samples flagged (horizontal), one curve per site that has both kinds. A curve hugging the top-left corner "
        "separates them well; the dotted diagonal is guessing. AUC is the area under the curve (1 perfect, 0.5 chance).",
    )


def _weights_section(report, model, site_names) -> None:
    report.heading("Mixture weights per site")
    active = np.flatnonzero(model.active_)
    W = np.asarray(model.weights_)[:, active]
    report.paragraph(
        f"The sites share a dictionary of {len(active)} patterns (sparse Gaussian models of the variables); each site "
        "keeps its own weights saying how often each pattern occurs at the site. The weights never leave the site."
    )
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(site_names) + 1.4))
    left = np.zeros(len(site_names))
    ypos = np.arange(len(site_names))[::-1]
    cmap = plt.get_cmap("tab20")
    for j, k in enumerate(active):
        ax.barh(ypos, W[:, j], left=left, color=cmap(j % 20), label=f"pattern {k + 1}", edgecolor="white", lw=0.5)
        left += np.nan_to_num(W[:, j])
    ax.set_yticks(ypos, site_names)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the site's samples")
    ax.grid(axis="y", alpha=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    report.figure(
        fig, "weights",
        "One bar per site, split into the shares of its samples that each shared pattern explains (its private mixture "
        "weights; each bar sums to 1). Sites with similar bars behave alike; a pattern used by one site only is "
        "that site's own regime.",
    )


def _consensus_section(report, model) -> None:
    report.heading("Consensus over iterations")
    history = model.history_
    if not history:
        report.paragraph("The fit's round history is not available (a model loaded from a file).")
        return
    rounds = np.array([h["round"] for h in history])
    disagreement = np.array([h.get("disagreement", np.nan) for h in history], dtype=float)
    retained = np.array([h.get("metrics", {}).get("n_retained", np.nan) for h in history], dtype=float)
    exchanges = [h.get("exchanges") for h in history if h.get("exchanges") is not None]
    if model.runtime == "star":
        report.paragraph("This fit summed the statistics exactly through one coordinator (the star runtime, the "
                         "centralised reference), so there is no consensus error.")
    else:
        report.table(
            [{"aggregation": model.aggregation, "iterations": len(history),
              "neighbour exchanges per iteration": int(np.median(exchanges)) if exchanges else None,
              "consensus tolerance (relative)": None if model.aggregation == "shamir" else float(model.rel_tol),
              "largest disagreement between sites": float(np.nanmax(disagreement)) if np.isfinite(disagreement).any() else None}],
            caption="How the sites computed their sums without a centre",
        )
    positive = disagreement > 0
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2 if positive.any() else 1, figsize=(11.3 if positive.any() else 6.5, 3.8), squeeze=False)
    ax = axes[0, 0]
    ax.step(rounds, retained, where="mid")
    ax.set_ylim(0, np.nanmax(retained) + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("patterns kept")
    ax.set_title("size of the shared dictionary")
    if positive.any():
        axes[0, 1].semilogy(rounds[positive], disagreement[positive], marker=".", lw=1)
        axes[0, 1].set_xlabel("iteration")
        axes[0, 1].set_ylabel("largest disagreement (log axis)")
        axes[0, 1].set_title("consensus error between the sites")
    for ax in axes[0]:
        mark_stop(ax, int(rounds[-1]), int(model.max_iter))
        ax.legend(fontsize=9, loc="lower right")
    fig.tight_layout()
    if positive.any():
        what = (" Right: after each iteration, the largest absolute difference between two sites' copies of the summed "
                "statistics (log axis); 0 would be exact agreement.")
    elif model.runtime == "star":
        what = ""
    else:
        what = " The sites' copies of every sum agreed exactly in every iteration (the table's last column)" + (
            ": the consensus runs enough exchanges to reach the relative tolerance and ends with an agreement step."
            if model.aggregation != "shamir" else ".")
    report.figure(
        fig, "consensus",
        "How many patterns the shared dictionary keeps after each iteration (rarely used patterns are pruned). The "
        "dashed line marks the last iteration; the fit stops early when the patterns stop changing." + what,
    )


def _privacy_section(report, model, site_names) -> None:
    report.heading("Privacy of the published patterns")
    spent = model.privacy_spent_
    any_site = next(iter(spent.values()))
    largest = max(v["epsilon"] for v in spent.values())
    report.paragraph(
        "The shared pattern means are published as random draws from their posterior, a differentially private "
        f"release: ε at δ = {any_site['delta']:g} bounds what the published patterns reveal about any one sample "
        "(smaller is more private)."
        + ("" if any_site["diameter_enforced"] else " The bound assumes no standardised sample is farther from the "
           "others than the largest one seen in training (samples are not clipped).")
        + ("" if largest <= MEANINGFUL_EPSILON else
           f" An ε above {MEANINGFUL_EPSILON:g} gives no meaningful protection (it allows an observer's odds about a "
           f"sample to grow by a factor e^ε); this fit's largest ε is {largest:.3g}, so treat the published patterns "
           "as revealing the training samples. Clipping the samples (clip_norm) and a larger minimum pattern weight "
           "(n_min) lower ε.")
    )
    report.table(
        [{"site": site_names[s], "ε": v["epsilon"], "δ": v["delta"], "Rényi ε (tight)": v["epsilon_rdp_tight"],
          "Rényi order": v["alpha"]} for s, v in sorted(spent.items())],
        caption="Privacy spent per site by the published pattern means",
    )
