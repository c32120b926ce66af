"""Real anomaly-detection data split across sites (bundled copies, see ``data/bundled/anomaly``).

* :func:`load_sensor_networks` -- Suthaharan et al. (2010) wireless-sensor networks: every mote
  is a site (4 per network), variables humidity and temperature, label 1 = injected hot-air event.
* :func:`load_ctg` -- UCI Cardiotocography as the ODDS ``cardio`` benchmark (1831 x 21, 176
  anomalies = pathological ``NSP = 3``); it has no natural sites, :func:`split_sites` makes them.
* The four-hospital UCI Heart Disease table is loaded by :func:`fedhier.data.datasets.load_heart_disease`.

Files are read with the ``csv`` module and numpy only; nothing touches the network.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from importlib import resources

import numpy as np

__all__ = ["AnomalySite", "load_sensor_networks", "load_ctg", "split_sites", "CTG_COLUMNS"]

#: The 21 ODDS ``cardio`` variables (the second, rate-valued occurrences of AC..DP).
CTG_COLUMNS = ("LB", "AC.1", "FM.1", "UC.1", "DL.1", "DS.1", "DP.1", "ASTV", "MSTV", "ALTV", "MLTV", "Width", "Min",
               "Max", "Nmax", "Nzeros", "Mode", "Mean", "Median", "Variance", "Tendency")


@dataclass(frozen=True)
class AnomalySite:
    """One site's labelled samples.

    Attributes
    ----------
    name : str
    X : float64 ndarray (n, M)
    y : int ndarray (n,)      1 = anomaly, 0 = normal (used only for evaluation)
    feature_names : tuple of str (M,)
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...]


def _read(name: str) -> tuple[list[str], list[list[str]]]:
    raw = resources.files("fedhier.data").joinpath("bundled", "anomaly", name).read_bytes()
    reader = csv.reader(io.StringIO(gzip.decompress(raw).decode("utf-8")))
    header = next(reader)
    return header, [row for row in reader if row]


def load_sensor_networks(network: str = "both") -> list[AnomalySite]:
    """Suthaharan wireless-sensor data, one site per mote (time order kept).

    Parameters
    ----------
    network : {"multi_hop", "single_hop", "both"}
        ``"both"`` gives 8 sites (the multi-hop motes first).

    Returns
    -------
    list of AnomalySite with ``X = (humidity, temperature)``; site names ``"<network>-mote<k>"``.
    """
    networks = {"multi_hop": ["multi_hop"], "single_hop": ["single_hop"], "both": ["multi_hop", "single_hop"]}
    if network not in networks:
        raise ValueError(f"network must be one of {sorted(networks)}, got {network!r}")
    out = []
    for net in networks[network]:
        header, rows = _read(f"suthaharan_{net}.csv.gz")
        col = {c: j for j, c in enumerate(header)}
        table = np.array([[float(r[col[c]]) for c in ("mote_id", "humidity", "temperature", "label")] for r in rows])
        for mote in np.unique(table[:, 0]).astype(int):
            rows_m = table[table[:, 0] == mote]
            out.append(AnomalySite(f"{net}-mote{mote}", rows_m[:, 1:3], rows_m[:, 3].astype(np.int64),
                                   ("humidity", "temperature")))
    return out


def load_ctg() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """UCI Cardiotocography restricted to ``NSP`` in {1, 3}: the ODDS ``cardio`` table.

    Returns
    -------
    X : float64 ndarray (1831, 21)
    y : int ndarray (1831,)   1 = pathological (``NSP = 3``)
    feature_names : tuple of str (21,)
    """
    header, rows = _read("uci_ctg.csv.gz")
    # the raw header repeats AC..DP (counts, then rates); pandas names the second ones "AC.1" etc.
    seen: dict[str, int] = {}
    names = []
    for c in header:
        names.append(c if c not in seen else f"{c}.{seen[c]}")
        seen[c] = seen.get(c, 0) + 1
    idx = [names.index(c) for c in CTG_COLUMNS]
    nsp = names.index("NSP")
    keep = [r for r in rows if r[nsp] in ("1", "3")]
    X = np.array([[float(r[j]) for j in idx] for r in keep])
    y = np.array([int(r[nsp] == "3") for r in keep], dtype=np.int64)
    return X, y, CTG_COLUMNS


def split_sites(X: np.ndarray, y: np.ndarray, n_sites: int, *, seed: int, concentration: float | None = None,
                names: tuple[str, ...] | None = None) -> list[AnomalySite]:
    """Split a pooled labelled table into sites.

    ``concentration=None``: a uniformly random partition into equal parts (IID sites).
    Otherwise the samples are binned into ``n_sites`` equal-size groups along the first
    principal component of the standardised data, each group is spread over the sites with
    proportions drawn from ``Dirichlet(concentration)`` (small = more heterogeneous sites),
    and the anomalies are spread uniformly.
    """
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    names = names or tuple(f"x{j}" for j in range(X.shape[1]))
    if concentration is None:
        site = rng.permutation(np.arange(n) % n_sites)
    else:
        Z = (X - X.mean(axis=0)) / np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0)
        pc1 = Z @ np.linalg.svd(Z, full_matrices=False)[2][0]
        cluster = np.zeros(n, dtype=np.int64)
        cluster[np.argsort(pc1)] = np.arange(n) * n_sites // n
        shares = rng.dirichlet(np.full(n_sites, concentration), size=n_sites)  # row: cluster -> sites
        site = np.array([rng.choice(n_sites, p=shares[c]) for c in cluster])
        anomalous = y == 1
        site[anomalous] = rng.integers(0, n_sites, size=int(anomalous.sum()))
    return [AnomalySite(f"site{s}", X[site == s], y[site == s], names) for s in range(n_sites)]
