"""Privacy numbers quoted in docs/privacy.md: noise multipliers, the paper's budget, total-budget noise, collapse of the variances.

Run:  python benchmarks/privacy_accounting.py [--out docs/privacy_numbers.md]

Everything is computed here, from fedhier.privacy (which delegates composition to
Google's dp-accounting); nothing is typed in by hand:

1. noise multipliers z = sigma / Delta of one release (classical / Zhao / analytic);
2. the paper's per-release semantics, (epsilon, delta) = (10, 0.01) per block per round:
   the paper's Theorem 8 figure, basic composition, and the true cumulative epsilon
   (PLD, RDP cross-check) after 1 and R rounds, for K = 3 (bundled Alzheimer data)
   and K = 4 (ADNI) views;
3. total-budget calibration: the Gaussian noise multiplier every release needs so that
   a whole fit of R rounds x 3K releases meets (epsilon, delta);
4. the bound on the per-round contraction of the global standard deviations.
"""

from __future__ import annotations

import argparse
import math

from dp_accounting import GaussianDpEvent, LaplaceDpEvent

from fedhier.privacy import (
    PerReleaseBudget,
    PrivacyLedger,
    TotalBudget,
    epsilon_of_events,
    gaussian_delta,
    gaussian_noise_multiplier,
)
from fedhier.utils.io import atomic_write_text, markdown_table


def noise_multiplier_rows(settings=((10.0, 0.01), (1.0, 0.01), (1.0, 1e-5))) -> list[dict]:
    rows = []
    for epsilon, delta in settings:
        classical = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
        rows.append(
            {
                "(epsilon, delta)": f"({epsilon:g}, {delta:g})",
                "classical z": f"{classical:.3f}" + (" (epsilon >= 1: outside Thm 4)" if epsilon >= 1 else ""),
                "delta actually achieved by classical": f"{gaussian_delta(classical, epsilon):.3g}",
                "Zhao z": f"{gaussian_noise_multiplier(epsilon, delta, 'zhao'):.3f}",
                "analytic z": f"{gaussian_noise_multiplier(epsilon, delta, 'analytic'):.3f}",
            }
        )
    return rows


def paper_semantics_ledger(n_views: int, n_rounds: int, epsilon=10.0, delta=0.01, calibration="zhao") -> PrivacyLedger:
    """Ledger of one site releasing mu, W (Gaussian) and sigma2 (Laplace) of every view every round."""
    budget = PerReleaseBudget(epsilon, delta, calibration)
    ledger = PrivacyLedger()
    for round_ in range(1, n_rounds + 1):
        for view in range(n_views):
            ledger.record(0, round_, f"view{view}.mu", GaussianDpEvent(budget.noise_multiplier("gaussian")))
            ledger.record(0, round_, f"view{view}.W", GaussianDpEvent(budget.noise_multiplier("gaussian")))
            ledger.record(0, round_, f"view{view}.sigma2", LaplaceDpEvent(budget.noise_multiplier("laplace")))
    return ledger


def paper_semantics_rows(views=(3, 4), n_rounds=100, epsilon=10.0, delta=0.01, report_delta=1e-5) -> list[dict]:
    rows = []
    for k in views:
        ledger = paper_semantics_ledger(k, n_rounds, epsilon, delta)
        for rounds in (1, n_rounds):
            pld = ledger.epsilon(0, report_delta, "pld", up_to_round=rounds)
            rdp = ledger.epsilon(0, report_delta, "rdp", up_to_round=rounds)
            rows.append(
                {
                    "views K": k,
                    "rounds": rounds,
                    "paper's Thm 8 (per round)": f"({3 * k * epsilon:g}, {2 * k * delta:g})",
                    "basic composition": f"({3 * k * rounds * epsilon:g}, {2 * k * rounds * delta:g})",
                    f"PLD epsilon at delta={report_delta:g}": f"{pld:.4g}",
                    f"RDP epsilon at delta={report_delta:g}": f"{rdp:.4g}",
                }
            )
    return rows


def total_budget_rows(targets=((1.0, 1e-5), (10.0, 1e-5)), views=(3, 4), n_rounds=100) -> list[dict]:
    rows = []
    for k in views:
        for epsilon, delta in targets:
            budget = TotalBudget(epsilon, delta, n_rounds, 3 * k)
            rows.append(
                {
                    "views K": k,
                    "rounds": n_rounds,
                    "releases": budget.n_releases,
                    "target": f"({epsilon:g}, {delta:g})",
                    "noise multiplier z": f"{budget.gaussian_multiplier:.4g}",
                    "PLD epsilon of the planned run": f"{_planned_epsilon(budget):.9f}",
                }
            )
    return rows


def _planned_epsilon(budget: TotalBudget) -> float:
    return epsilon_of_events([GaussianDpEvent(budget.gaussian_multiplier)] * budget.n_releases, budget.delta)


def dynamics_rows(dims=(3, 7, 41, 124), n_sites=3, epsilon=10.0, delta=0.01, kappa=1.0) -> list[dict]:
    """Upper bound on the per-round factor of a global prior sd (spec §8.5).

    Per coordinate, the master's variance estimate sees the noise variance (2 z g)^2 times
    the sample-variance factor (C-1)/C, plus a clipped signal of at most g^2 / d on average.
    Paper bound g = kappa sd: factor^2 = (C-1)/C (2 z kappa)^2 + kappa^2 / d.
    Dimension-aware bound g = kappa sd sqrt(d): factor^2 = kappa^2 ((C-1)/C (2 z)^2 d + 1),
    which is 1 (no collapse, no blow-up) at kappa* = 1 / sqrt((C-1)/C (2 z)^2 d + 1).
    """
    z = gaussian_noise_multiplier(epsilon, delta, "zhao")
    shrink = (n_sites - 1) / n_sites
    rows = []
    for d in dims:
        paper = math.sqrt(shrink * (2 * z * kappa) ** 2 + kappa**2 / d)
        aware = kappa * math.sqrt(shrink * (2 * z) ** 2 * d + 1)
        rows.append(
            {
                "dim d": d,
                "paper bound: sd factor per round": f"{paper:.3f}",
                "after 20 rounds": f"{paper ** 20:.2g}",
                "dimension-aware (kappa=1): factor": f"{aware:.3g}",
                "kappa* for factor 1": f"{1 / math.sqrt(shrink * (2 * z) ** 2 * d + 1):.3f}",
            }
        )
    return rows


def report(n_rounds: int = 100) -> str:
    parts = [
        "#### Noise multipliers of one Gaussian release\n",
        markdown_table(noise_multiplier_rows()),
        f"\n#### Paper semantics: (10, 0.01) per block per round, Zhao + Laplace, {n_rounds} rounds\n",
        markdown_table(paper_semantics_rows(n_rounds=n_rounds)),
        f"\n#### Total budget: calibrated Gaussian noise multiplier for {n_rounds} rounds\n",
        markdown_table(total_budget_rows(n_rounds=n_rounds)),
        "\n#### Expected dynamics of a global standard deviation, (10, 0.01) Zhao, C = 3 sites\n",
        markdown_table(dynamics_rows()),
    ]
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", help="also write the markdown tables to this file")
    args = parser.parse_args()
    text = report(args.rounds)
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
