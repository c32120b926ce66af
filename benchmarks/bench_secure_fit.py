"""Cost of secure summation inside a Fed-mv-PPCA fit: bytes and time per round, secure vs plain.

Run:  python benchmarks/bench_secure_fit.py

Bundled Alzheimer data (3 views, d = 131), min-max scaled, split IID over 5 sites, q = 5,
10 rounds; the same fit with ``aggregation="plain"`` and ``aggregation="secure"``
(Bonawitz-style masking with Shamir-shared seeds, threshold 3, 30 fractional bits), in one
run.  Prints mean bytes sent per site per round and seconds per round, and their ratios.
"""

from __future__ import annotations

import time

import numpy as np

from fedhier import FedMVPPCA
from fedhier.data import MinMaxScaling, combine_ranges, load_alzheimer, partition, site_ranges


def main() -> None:
    data = load_alzheimer()
    part = partition(data.views, data.labels, 5, "iid", random_state=0)
    scaling = MinMaxScaling(combine_ranges([site_ranges(s) for s in part.sites]))
    sites = [scaling.transform(s) for s in part.sites]
    rows = {}
    for aggregation in ("plain", "secure"):
        t0 = time.perf_counter()
        m = FedMVPPCA(n_components=5, n_rounds=10, random_state=0, aggregation=aggregation).fit(sites)
        seconds = (time.perf_counter() - t0) / m.n_rounds
        per_site = np.mean([np.mean(list(h["bytes_up"].values())) for h in m.history_])
        rows[aggregation] = (per_site, seconds, m)
    plain, secure = rows["plain"], rows["secure"]
    diff = max(
        float(np.max(np.abs(np.asarray(plain[2].global_params_[v]["W"]) - np.asarray(secure[2].global_params_[v]["W"]))))
        for v in plain[2].global_params_
    )
    print("Fed-mv-PPCA, Alzheimer data, 5 IID sites, q = 5, 10 rounds")
    print(f"{'aggregation':<12}{'bytes/site/round':>18}{'s/round':>10}")
    for name, (b, s, _) in rows.items():
        print(f"{name:<12}{b:>18,.0f}{s:>10.4f}")
    print(f"ratio secure/plain: bytes {secure[0] / plain[0]:.3f}, time {secure[1] / plain[1]:.2f}")
    print(f"max |W~ secure - W~ plain| after 10 rounds: {diff:.2e}")


if __name__ == "__main__":
    main()
