"""Write the small raw slices of this folder from fedhier's bundled data (run from the repository root).

    python tests/cli_data/make_slices.py

Rows are copied unchanged (text, units, booleans, empty cells as in the bundled files); only the
number of rows is cut, so the command-line tests stay fast.
"""

import csv
import gzip
from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[2] / "src" / "fedhier" / "data" / "bundled"
HERE = Path(__file__).resolve().parent


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with gzip.open(path, "rt", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def _write(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    # heart disease: one file per hospital, its first 40 patients
    header, rows = _rows(BUNDLED / "heart_disease_uci.csv.gz")
    for hospital in ("Cleveland", "Hungary", "Switzerland", "VA Long Beach"):
        mine = [r for r in rows if r["dataset"] == hospital][:40]
        _write(HERE / "heart" / f"{hospital.lower().replace(' ', '_')}.csv", header, mine)
    # radon: one file, the first 12 homes of six counties, site column county.name
    header, rows = _rows(BUNDLED / "fedlin" / "radon.csv.gz")
    counties = ("ANOKA", "DAKOTA", "HENNEPIN", "RAMSEY", "ST LOUIS", "WASHINGTON")
    _write(HERE / "radon" / "radon.csv", header,
           [r for c in counties for r in [r for r in rows if r["county.name"] == c][:12]])
    # sensor motes: one file, per mote its first 30 readings and first 10 labelled anomalies, site column mote_id
    header, rows = _rows(BUNDLED / "anomaly" / "suthaharan_multi_hop.csv.gz")
    kept = []
    for mote in ("1", "2", "3", "4"):
        mine = [r for r in rows if r["mote_id"] == mote]
        kept += mine[:30] + [r for r in mine[30:] if r["label"] == "1"][:10]
    _write(HERE / "motes" / "motes.csv", header, kept)


if __name__ == "__main__":
    main()
