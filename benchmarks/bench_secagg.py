"""Cost of secure summation versus plain summation, and of SecAgg+ as the number of sites grows, measured in one run.

    python benchmarks/bench_secagg.py [--sites 5] [--threshold 3] [--sizes 2000 200000] [--repeats 3] [--csv out.csv]
                                      [--scale-sites 100 300 1000] [--scale-length 1000] [--drop 0.1]
    python benchmarks/bench_secagg.py --crossover [S ...] [--repeats 3]

For each vector length ``m`` (2,000 and 200,000 floats bracket a Fed-mv-PPCA reply) it
times one aggregation round, all sites and the server run sequentially in this process:

* plain  -- every site encodes its reply as a declared float64 message, the server
  decodes and adds them;
* secure -- :func:`fedhier.secure.secagg.secure_sum` with cryptographic randomness,
  without drops and with one site dropping after masking.

It prints bytes each site uploads and downloads for the aggregation (encoded message
sizes, the broadcast of the result is the same for both and not counted) and the median
wall time over ``--repeats`` rounds, with the secure/plain ratios of this run.

Then, for each ``S`` of ``--scale-sites``, one SecAgg+ round (a public random k-regular
graph, ``k = 2 * ceil(1.5 * log2 S)``, threshold ``(k + 1) // 2 + 1``) of vectors of
``--scale-length`` floats, without drops and with a fraction ``--drop`` of the sites dropping
after masking (their masks are removed with their neighbours' shares), and the complete graph
at the smallest S for comparison.  Every site and the server run their steps in this process,
one after the other; each step is timed on its own, so "site s" is the mean time a site spends
in the round and "server s" the server's.  It prints bytes and seconds per site and their
ratios to log2 S (constant ratios = O(log S) growth), and checks each total against the plain
sum of the included sites.

``--crossover`` only times the complete graph against SecAgg+ at each S (default 16, 20, 30, 40, 60, 100),
alternating which runs first, and prints the ratios sparse / complete of the round, a site's time, the
server's time and a site's bytes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from fedhier.secure.fixedpoint import FixedPoint
from fedhier.secure import keys as crypto
from fedhier.secure.secagg import SecAggParams, SecAggServer, SecAggSite, secure_sum, to_site
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


def timed_secagg_round(vectors: dict[int, np.ndarray], neighbours: int | None, threshold: int, fp: FixedPoint,
                       drop_after: set[int]) -> dict:
    """One secure-sum round driven step by step, timing every site step and every server step."""
    params = SecAggParams(tuple(vectors), threshold, fp, next(iter(vectors.values())).size, b"bench-round-1", neighbours)
    site_time = {u: 0.0 for u in params.sites}
    up = {u: 0 for u in params.sites}
    down = {u: 0 for u in params.sites}
    server_time = 0.0

    def on_sites(step, inputs):
        out = {}
        for u, args in inputs.items():
            start = time.perf_counter()
            out[u] = getattr(sites[u], step)(*args)
            site_time[u] += time.perf_counter() - start
            up[u] += len(out[u])
            down[u] += sum(len(a) for a in args if isinstance(a, bytes))
        return out

    def on_server(step, messages):
        nonlocal server_time
        start = time.perf_counter()
        out = getattr(server, step)(messages)
        server_time += time.perf_counter() - start
        return out

    signing_keys = {u: crypto.generate_signing_key() for u in params.sites}  # long-term: made before the round
    roster = {u: key.public_key() for u, key in signing_keys.items()}
    start = time.perf_counter()
    sites = {u: SecAggSite(u, params, signing_key=signing_keys[u], roster=roster) for u in params.sites}
    server = SecAggServer(params)
    keys = on_server("collect_keys", on_sites("advertise_keys", {u: () for u in sites}))
    routed = on_server("route_shares", on_sites("share_keys", {u: (to_site(keys, u),) for u in sites}))
    listing = on_server("collect_masked", on_sites("masked_input", {u: (vectors[u], routed[u]) for u in routed}))
    responders = [u for u in server.survivors if u not in drop_after]
    signed = on_server("collect_signatures", on_sites("sign_survivors", {u: (listing,) for u in responders}))
    total = on_server("unmask", on_sites("unmask", {u: (to_site(signed, u),) for u in responders}))
    wall = time.perf_counter() - start
    plain = sum(vectors[u] for u in server.survivors)
    return {"total": total, "error": float(np.abs(total - plain).max()), "wall": wall, "server": server_time,
            "site": statistics.mean(site_time[u] for u in responders),
            "bytes": statistics.mean(up[u] + down[u] for u in responders), "responders": len(responders)}


def scaling(sizes: list[int], length: int, drop: float) -> list[dict]:
    """SecAgg+ at each S in ``sizes`` (and the complete graph at the smallest), one round each."""
    fp = FixedPoint(frac_bits=24)
    rng = np.random.default_rng(1)
    rows = []
    cases = [(min(sizes), None, 0.0)] + [(n, 2 * math.ceil(1.5 * math.log2(n)), f) for n in sizes for f in (0.0, drop)]
    for n, k, frac in cases:
        vectors = {u: rng.normal(size=length) for u in range(n)}
        t = (n if k is None else k + 1) // 2 + 1
        dropped = set(rng.choice(n, int(round(frac * n)), replace=False).tolist())
        res = timed_secagg_round(vectors, k, t, fp, dropped)
        bound = n * fp.precision / 2
        if res["error"] > bound:
            raise AssertionError(f"S={n}: secure total differs from the plain sum by {res['error']:.3g} > {bound:.3g}")
        log_s = math.log2(n)
        rows.append({"S": n, "graph": "complete" if k is None else f"k={k}", "t": t, "dropped after masking": len(dropped),
                     "B/site": round(res["bytes"]), "site s": res["site"], "server s": res["server"],
                     "round s": res["wall"], "B/site / log2 S": res["bytes"] / log_s,
                     "site s / log2 S": res["site"] / log_s, "max |error|": res["error"]})
    return rows


def crossover(sizes: list[int], length: int, repeats: int) -> list[dict]:
    """Complete graph against SecAgg+ (``default_neighbours``' k) at each S, alternating, medians of ``repeats``."""
    fp = FixedPoint(frac_bits=24)
    rng = np.random.default_rng(2)
    rows = []
    for n in sizes:
        k = 2 * math.ceil(1.5 * math.log2(n))
        if k >= n - 1:
            continue  # no sparse graph: every site would neighbour every other
        runs = {None: [], k: []}
        for rep in range(repeats):
            for graph in ((None, k) if rep % 2 == 0 else (k, None)):
                vectors = {u: rng.normal(size=length) for u in range(n)}
                runs[graph].append(timed_secagg_round(vectors, graph, (n if graph is None else graph + 1) // 2 + 1,
                                                      fp, set()))
        med = {g: {key: statistics.median(r[key] for r in rs) for key in ("wall", "site", "server", "bytes")}
               for g, rs in runs.items()}
        rows.append({"S": n, "k": k, "t complete / sparse": f"{n // 2 + 1} / {(k + 1) // 2 + 1}",
                     "round s, complete": med[None]["wall"], "round s, sparse": med[k]["wall"],
                     "sparse / complete: round": med[k]["wall"] / med[None]["wall"],
                     "site": med[k]["site"] / med[None]["site"], "server": med[k]["server"] / med[None]["server"],
                     "bytes": med[k]["bytes"] / med[None]["bytes"]})
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 200000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", default=None, help="also write the table to this CSV file")
    parser.add_argument("--scale-sites", type=int, nargs="*", default=[100, 300, 1000])
    parser.add_argument("--scale-length", type=int, default=1000)
    parser.add_argument("--drop", type=float, default=0.1, help="fraction of sites dropping after masking")
    parser.add_argument("--crossover", type=int, nargs="*", default=None, metavar="S",
                        help="only compare the complete graph with SecAgg+ at these numbers of sites")
    args = parser.parse_args(argv)
    if args.crossover is not None:
        rows = crossover(args.crossover or [16, 20, 30, 40, 60, 100], args.scale_length, args.repeats)
        print(f"Complete graph against SecAgg+ (k = 2 ceil(1.5 log2 S)), vectors of {args.scale_length} floats, "
              f"median of {args.repeats} alternating rounds each; ratios below 1: SecAgg+ is cheaper")
        print(markdown_table(rows, digits=3))
        return rows

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
    if args.scale_sites:
        scale = scaling(args.scale_sites, args.scale_length, args.drop)
        print(f"\nSecAgg+ scaling: vectors of {args.scale_length} floats, one round per row, FixedPoint(frac_bits=24); "
              "bytes = sent + received by a site; totals checked against the plain sum")
        print(markdown_table(scale, digits=4))
        rows = rows + scale
    return rows


if __name__ == "__main__":
    main()
