"""Cost of secure summation versus plain summation, measured in one run.

    python benchmarks/bench_secagg.py [--sites 5] [--threshold 3] [--sizes 2000 200000] [--repeats 3] [--csv out.csv]

For each vector length ``m`` (2,000 and 200,000 floats bracket a Fed-mv-PPCA reply) it
times one aggregation round, all sites and the server run sequentially in this process:

* plain  -- every site encodes its reply as a declared float64 message, the server
  decodes and adds them;
* secure -- :func:`fedhier.privacy.secagg.secure_sum` with cryptographic randomness,
  without drops and with one site dropping after masking.

It prints bytes each site uploads and downloads for the aggregation (encoded message
sizes, the broadcast of the result is the same for both and not counted) and the median
wall time over ``--repeats`` rounds, with the secure/plain ratios of this run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedhier.privacy.fixedpoint import FixedPoint
from fedhier.privacy.secagg import secure_sum
from fedhier.protocol.messages import Field, MessageSpec, decode, encode
from fedhier.utils.io import markdown_table, write_csv


def plain_round(vectors: dict[int, np.ndarray]) -> tuple[np.ndarray, dict[int, int]]:
    spec = MessageSpec("reply", {"x": Field(next(iter(vectors.values())).shape, "float64")})
    wire = {u: encode(spec, {"x": x}) for u, x in vectors.items()}
    total = sum(decode(spec, data)["x"] for data in wire.values())
    return total, {u: len(data) for u, data in wire.items()}


def median_time(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 200000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", default=None, help="also write the table to this CSV file")
    args = parser.parse_args(argv)

    fp = FixedPoint(frac_bits=24)
    rng = np.random.default_rng(0)
    rows = []
    for m in args.sizes:
        vectors = {u: rng.normal(size=m) for u in range(args.sites)}
        t_plain, (plain_total, plain_bytes) = median_time(lambda: plain_round(vectors), args.repeats)
        up_plain = statistics.mean(plain_bytes.values())
        cases = [("secure, no drop", {}), ("secure, 1 drop after masking", {"drop_after_masking": [0]})]
        rows.append({"m": m, "method": "plain", "upload B/site": round(up_plain), "download B/site": 0,
                     "time s": t_plain, "bytes ratio": 1.0, "time ratio": 1.0, "max |error|": 0.0})
        for label, drops in cases:
            t_sec, res = median_time(lambda: secure_sum(vectors, threshold=args.threshold, fixed_point=fp, **drops),
                                     args.repeats)
            up = statistics.mean(res.bytes_sent[u] for u in res.unmasked_by)
            down = statistics.mean(res.bytes_received[u] for u in res.unmasked_by)
            rows.append({"m": m, "method": label, "upload B/site": round(up), "download B/site": round(down),
                         "time s": t_sec, "bytes ratio": (up + down) / up_plain, "time ratio": t_sec / t_plain,
                         "max |error|": float(np.abs(res.total - plain_total).max())})
    print(f"{args.sites} sites, threshold {args.threshold}, FixedPoint(frac_bits=24), "
          f"median of {args.repeats} rounds; bytes per site of the responding sites")
    print(markdown_table(rows, digits=4))
    if args.csv:
        write_csv(args.csv, rows)
    return rows


if __name__ == "__main__":
    main()
