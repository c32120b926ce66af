"""How much the model still changes per round: the stopping rule ``FedMVPPCA(tol=...)``.

Run:  python examples/mvppca_stopping.py   (about 3 minutes)

Sites drawn from the hierarchical model of spec §3 (``make_federated_ppca``: 3 views of 15, 8
and 10 features, q = 5, 100 subjects per site), fitted by ``FedMVPPCA(n_components=5,
n_rounds=100, tol=None)`` with C = 1, 3 and 12 sites, with the EM update of the prior's variances
(the default) and the paper's.  After every round the relative change of theta~
(:func:`fedhier.models.mvppca.relative_change`, the spec's stopping quantity) is taken over
three groups of blocks: the means and loadings (mu~, W~), the spreads (sigma2_mu~, sigma2_W~)
and the noise prior (alpha, beta); and the change of the predictive distribution
(:func:`fedhier.models.mvppca.model_change`, the quantity ``tol`` is compared with).  The table
prints the median over rounds 51-100 of each, the smallest and largest global standard
deviation of the loadings (sd of W~, over the views) after round 100 -- the sites' loadings
were drawn with sd 0.2 -- and the round at which the spec's rule (relative change of theta~
below 1e-6) and ``tol`` = 0.05, 0.02 (the default) and 0.01 on the predictive change would
stop the fit (``-`` = not within 100 rounds).
"""

from __future__ import annotations

import numpy as np

from fedhier import FedMVPPCA
from fedhier.data.synthetic import make_federated_ppca
from fedhier.data.validation import check_sites
from fedhier.models.mvppca import relative_change
from fedhier.models.mvppca.master import THETA_BLOCKS
from fedhier.protocol.mvppca import global_from_message

GROUPS = {"mu~, W~": ("mu", "W"), "sigma2_mu~, sigma2_W~": ("sigma2_mu", "sigma2_W"), "alpha, beta": ("alpha", "beta")}


def make_sites(n_sites: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    data = make_federated_ppca(
        n_sites, 100, (15, 8, 10), 5, sd_mu=0.5, sd_W=0.2, sigma2_alpha=3.0, sigma2_beta=2.0, random_state=seed
    )
    return data.sites


def changes(n_sites: int, prior_update: str, n_rounds: int = 100) -> tuple[dict[str, np.ndarray], list[float]]:
    """Relative change per round (rounds 2..n_rounds) of each group of blocks and of all of theta~,
    and the sd of W~ of every view after the last round."""
    sites = make_sites(n_sites)
    _, schema = check_sites(sites, n_components=5)
    rows: dict[str, list[float]] = {name: [] for name in [*GROUPS, "theta~"]}  # and "predictions"
    previous = []

    def record(_, broadcast):
        current = global_from_message(broadcast, schema)
        if previous:
            for name, blocks in [*GROUPS.items(), ("theta~", THETA_BLOCKS)]:
                rows[name].append(relative_change(previous[0], current, blocks))
        previous[:] = [current]

    model = FedMVPPCA(n_components=5, n_rounds=n_rounds, random_state=0, tol=None, prior_update=prior_update)
    model.fit(sites, callbacks=[record])
    recorded = [h["metrics"]["rel_change"] for h in model.history_[1:]]
    assert np.array_equal(recorded, rows["theta~"]), "history_'s rel_change is the change of all of theta~"
    rows["predictions"] = [h["metrics"]["model_change"] for h in model.history_[1:]]
    sd_W = [v for k, v in model.history_[-1]["metrics"].items() if k.endswith("/sd_W")]
    return {name: np.array(values) for name, values in rows.items()}, sd_W


def stopping_round(change: np.ndarray, tol: float) -> str:
    below = np.flatnonzero(change < tol)
    return "-" if below.size == 0 else str(int(below[0]) + 2)  # change[0] is round 2's


def main() -> None:
    print("| update | sites C | " + " | ".join(f"median change of {g}, rounds 51-100" for g in [*GROUPS, "predictions"])
          + " | sd of W~ after round 100 | stop: theta~ below 1e-6 | stop at tol 0.05 | tol 0.02 (default) | tol 0.01 |")
    print("|---|---|" + "---|" * (len(GROUPS) + 6))
    for prior_update in ("em", "paper"):
        for n_sites in (1, 3, 12):
            rows, sd_W = changes(n_sites, prior_update)
            medians = " | ".join(f"{np.median(rows[g][49:]):.1e}" for g in [*GROUPS, "predictions"])
            stops = [stopping_round(rows["theta~"], 1e-6)] + [stopping_round(rows["predictions"], tol) for tol in (0.05, 0.02, 0.01)]
            print(f"| {prior_update} | {n_sites} | {medians} | {min(sd_W):.1e}-{max(sd_W):.1e} | " + " | ".join(stops) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
