"""One data model for every command: the raw slices of tests/cli_data through `fit`, `fit linear` and `collab fit`."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedhier.cli import main


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


#: the Flower deployment's tests need the flower extra; with only the test extra they are skipped
needs_flower = pytest.mark.skipif(not _installed("flwr"), reason="needs the flower extra (pip install -e '.[flower]')")

DATA = Path(__file__).resolve().parent / "cli_data"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _copy(tmp: Path, name: str) -> Path:
    shutil.copytree(DATA / name, tmp / name)
    return tmp / name / "fit.toml"


def _heart_minmax(tmp: Path, ranges: dict[str, tuple[float, float]], keys: str = "") -> Path:
    """The heart slices with ``scale = "minmax"``, the public bounds ``ranges`` and the extra top-level lines ``keys``."""
    toml = _copy(tmp, "heart")
    toml.write_text(toml.read_text().replace('scale = "standard"', 'scale = "minmax"' + (f"\n{keys}" if keys else ""))
                    + "\n[ranges]\n" + "".join(f"{c} = [{lo}, {hi}]\n" for c, (lo, hi) in ranges.items()))
    return toml


def _check_folder(out: Path, *files: str) -> dict:
    for name in ("model.npz", "summary.json", "summary.md", "report.html", "report.md", *files):
        assert (out / name).is_file(), name
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("name", ["heart", "radon", "motes"])
def test_every_command_runs_from_the_raw_slice_with_one_toml(name, tmp_path, capsys):
    toml = _copy(tmp_path, name)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    summary = _check_folder(tmp_path / "fit")
    sites = summary["sites"]
    id_column = summary["id"]
    for site in sites:
        latent = _rows(tmp_path / "fit" / f"latent_{site}.csv")
        assert list(latent[0])[0] == id_column and len(latent) == summary["subjects"][site]
    capsys.readouterr()
    assert main(["fit", "linear", "--config", str(toml), "--out", str(tmp_path / "linear")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {tmp_path / 'linear' / 'report.html'}"  # says where
    summary = _check_folder(tmp_path / "linear", "coefficients.csv", "phi.csv")
    assert summary["sites"] == sites and {r["site"] for r in _rows(tmp_path / "linear" / "coefficients.csv")} == {*sites, "(population)"}
    assert main(["collab", "fit", "--config", str(toml), "--out", str(tmp_path / "collab")]) == 0
    summary = _check_folder(tmp_path / "collab", *(f"scores_{s}.csv" for s in sites))
    assert summary["sites"] == sites
    first = _rows(tmp_path / "collab" / f"scores_{sites[0]}.csv")
    assert list(first[0]) == [id_column, "score"]


def test_heart_reads_booleans_partial_views_and_columns_empty_at_a_site(tmp_path, capsys):
    toml = _copy(tmp_path, "heart")
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    notes = " ".join(summary["notes"])
    assert "site 'hungary', view 'angiography': column(s) ['ca'] empty or missing at every row" in notes
    assert "site 'switzerland', view 'lab': column(s) ['chol'] empty or missing at every row" in notes  # chol = 0 marked missing
    assert "site 'switzerland', view 'clinical': 28 subject(s) observed in only part of the view" in notes
    # VA Long Beach: some patients lack a cell of every view (chol = 0 is missing there) -> no observed view
    va = _rows(tmp_path / "heart" / "va_long_beach.csv")
    latent = _rows(tmp_path / "fit" / "latent_va_long_beach.csv")
    assert [r["id"] for r in latent] == [r["id"] for r in va]
    views = {"clinical": ["age", "trestbps", "fbs"], "lab": ["chol"], "exercise": ["thalch", "oldpeak", "exang"], "angiography": ["ca"]}
    no_view = [all(any(r[c] in ("", "0", "0.0") if c == "chol" else r[c] == "" for c in cols) for cols in views.values()) for r in va]
    assert 0 < sum(no_view) < len(va)
    for row, none in zip(latent, no_view):
        assert np.isnan(float(row["x1"])) == none  # NaN exactly for the subjects with no observed view, never 0.0


def test_standard_and_minmax_scaling_equal_the_pooled_statistics(tmp_path):
    from fedhier.cli.sitedata import fit_scaling

    rng = np.random.default_rng(0)
    sites = [rng.normal(loc=100 * k, scale=1 + k, size=(20 + 5 * k, 3)) for k in range(3)]
    sites[1][::4, 2] = np.nan  # missing cells are left out
    pooled = np.vstack(sites)
    standard = fit_scaling("standard", ["a", "b", "c"], sites)
    np.testing.assert_allclose(standard.center, np.nanmean(pooled, axis=0), rtol=1e-12)
    np.testing.assert_allclose(standard.scale, np.nanstd(pooled, axis=0), rtol=1e-9)
    minmax = fit_scaling("minmax", ["a", "b", "c"], sites)
    np.testing.assert_allclose(minmax.center, np.nanmin(pooled, axis=0))
    np.testing.assert_allclose(minmax.scale, np.nanmax(pooled, axis=0) - np.nanmin(pooled, axis=0))
    secure = fit_scaling("standard", ["a", "b", "c"], sites, aggregation="secure")  # the coordinator sees only the sums
    np.testing.assert_allclose(secure.center, standard.center, rtol=1e-6)
    np.testing.assert_allclose(secure.scale, standard.scale, rtol=1e-6)
    Z = minmax.transform(["c", "a"], pooled[:, [2, 0]])
    assert np.nanmin(Z, axis=0) == pytest.approx([0, 0]) and np.nanmax(Z, axis=0) == pytest.approx([1, 1])
    np.testing.assert_allclose(minmax.inverse_transform(["c", "a"], Z), pooled[:, [2, 0]])


def test_fit_linear_coefficients_in_the_files_units_give_the_same_predictions(tmp_path, capsys):
    toml = _copy(tmp_path, "heart")
    assert main(["fit", "linear", "--config", str(toml), "--out", str(tmp_path / "lin")]) == 0
    summary = json.loads((tmp_path / "lin" / "summary.json").read_text())
    from fedhier.data.scaling import ColumnScaling
    from fedhier.estimators.fedlin import load

    scaling = ColumnScaling.from_dict(summary["scaling"])
    est = load(tmp_path / "lin" / "model.npz")
    rows = _rows(tmp_path / "lin" / "coefficients.csv")
    features = summary["features"]
    x = np.array([[50.0, 130.0, 1.0], [62.0, 150.0, 0.0]])  # raw units
    z = scaling.transform(features, x)
    intercepts = np.asarray(getattr(est, "intercept_", np.zeros(len(summary["sites"]))), dtype=float).reshape(-1)
    for k, site in enumerate(summary["sites"]):
        mine = {r["feature"]: r for r in rows if r["site"] == site}
        b = np.array([float(mine[f]["estimate"]) for f in ["(intercept)", *features]])
        scaled = b[0] + intercepts[k] + z @ b[1:]
        in_units = scaling.inverse_transform([summary["target"]], scaled[:, None])[:, 0]
        direct = float(mine["(intercept)"]["estimate_original_units"]) + x @ np.array(
            [float(mine[f]["estimate_original_units"]) for f in features])
        np.testing.assert_allclose(direct, in_units, rtol=1e-10)


def test_collab_score_by_site_name_with_the_models_columns_and_scaling(tmp_path, capsys):
    toml = _copy(tmp_path, "motes")
    assert main(["collab", "fit", "--config", str(toml), "--out", str(tmp_path / "c")]) == 0
    from fedhier.data.scaling import ColumnScaling
    from fedhier.estimators.collab import CollabDict

    model = CollabDict.load(tmp_path / "c" / "model.npz")
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    scaling = ColumnScaling.from_dict(summary["scaling"])
    rows = _rows(tmp_path / "motes" / "motes.csv")
    X = np.array([[float(r["humidity"]), float(r["temperature"])] for r in rows])
    # one site's weights for every row
    assert main(["collab", "score", "--model", str(tmp_path / "c" / "model.npz"), "--csv", str(tmp_path / "motes" / "motes.csv"),
                 "--site", "3", "--out", str(tmp_path / "s3.csv")]) == 0
    got = np.array([float(r["score"]) for r in _rows(tmp_path / "s3.csv")])
    np.testing.assert_allclose(got, model.anomaly_score(scaling.transform(["humidity", "temperature"], X), site=2))
    # each row with its own site's weights (the site column), the id carried
    assert main(["collab", "score", "--model", str(tmp_path / "c" / "model.npz"), "--csv", str(tmp_path / "motes" / "motes.csv"),
                 "--out", str(tmp_path / "all.csv")]) == 0
    scored = _rows(tmp_path / "all.csv")
    assert [r["reading"] for r in scored] == [r["reading"] for r in rows] and [r["site"] for r in scored] == [r["mote_id"] for r in rows]
    fitted = _rows(tmp_path / "c" / "scores_1.csv")
    np.testing.assert_allclose([float(r["score"]) for r in scored if r["site"] == "1"], [float(r["score"]) for r in fitted])


def test_collab_score_reads_a_cell_as_missing_where_the_fit_did(tmp_path, capsys):
    """A cell the fit's missing_values calls missing (a sensor's -1) is missing when scoring too: its row scores NaN,
    not as an extreme humidity."""
    toml = _copy(tmp_path, "motes")
    toml.write_text(toml.read_text().replace("[views]", 'missing_values = { humidity = ["-1"] }\n\n[views]'))
    data = tmp_path / "motes" / "motes.csv"
    lines = data.read_text().splitlines()
    header = lines[0].split(",")
    first = lines[1].split(",")
    first[header.index("humidity")] = "-1"
    lines[1] = ",".join(first)
    data.write_text("\n".join(lines) + "\n")
    assert main(["collab", "fit", "--config", str(toml), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert main(["collab", "score", "--model", str(tmp_path / "c" / "model.npz"), "--csv", str(data),
                 "--out", str(tmp_path / "s.csv")]) == 0
    assert "1 row(s) with an empty cell scored NaN" in capsys.readouterr().out
    scored = [r for r in _rows(tmp_path / "s.csv") if r["site"] == first[header.index("mote_id")]]
    assert np.isnan(float(scored[0]["score"]))
    fitted = _rows(tmp_path / "c" / f"scores_{scored[0]['site']}.csv")  # the fit left that row out
    np.testing.assert_allclose([float(r["score"]) for r in scored[1:]], [float(r["score"]) for r in fitted])


@needs_flower
def test_the_flower_fit_toml_is_the_same_file_plus_a_flower_table(tmp_path, capsys):
    from fedhier.deploy import fit_from_toml

    toml = _copy(tmp_path, "radon")
    text = toml.read_text() + '\n[flower]\nsites = ["ANOKA", "DAKOTA", "HENNEPIN", "RAMSEY", "ST LOUIS", "WASHINGTON"]\n'
    toml.write_text(text)
    flower = fit_from_toml(text, "fit.toml")
    assert flower.model == "fed-mv-ppca" and flower.views == {"home": ("log.radon", "basement"), "county": ("uranium",)}
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    linear = 'model = "fedlin-hm2"\n' + text
    assert fit_from_toml(linear, "fit.toml").features == ("basement", "uranium")
    toml.write_text(linear)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "lin")]) == 0  # the same file runs FedLin
    assert (tmp_path / "lin" / "phi.csv").is_file()
    marked = fit_from_toml('missing_values = { uranium = ["-9"] }\n' + text, "fit.toml")  # read at each site as on the command line
    assert marked.missing_values == {"uranium": ["-9"]} and type(marked).from_json(marked.to_json()) == marked
    with pytest.raises(ValueError, match=r"scale = 'standard' is not applied over Flower .*\[ranges\]"):
        fit_from_toml(text.replace('scale = "none"', 'scale = "standard"'), "fit.toml")


@needs_flower
def test_flower_accepts_minmax_with_public_ranges_for_every_column_and_each_site_applies_them(tmp_path):
    """A data-derived scaling stays refused over Flower; declared ranges are checked and applied at the site."""
    from fedhier.data.sitefiles import SiteDataError
    from fedhier.deploy import fit_from_toml

    toml = _copy(tmp_path, "radon")
    flower = '\n[flower]\nsites = ["ANOKA", "DAKOTA"]\n'
    text = toml.read_text().replace('scale = "none"', 'scale = "minmax"') + flower
    with pytest.raises(ValueError, match=r"scale = 'minmax' over Flower needs public bounds .*\[ranges\]"):
        fit_from_toml(text, "fit.toml")
    ranges = '[ranges]\n"log.radon" = [-3, 4]\nbasement = [0, 1]\nuranium = [-1, 1]\n'
    config = fit_from_toml(text + ranges, "fit.toml")
    assert config.ranges == {"log.radon": (-3.0, 4.0), "basement": (0.0, 1.0), "uranium": (-1.0, 1.0)}
    with pytest.raises(ValueError, match=r"needs a declared range for every column; \[ranges\] lacks \['uranium'\]"):
        fit_from_toml(text + ranges.replace("uranium = [-1, 1]\n", ""), "fit.toml")
    with pytest.raises(ValueError, match=r"not modelled: 'uranum'; did you mean 'uranium'"):
        fit_from_toml(text + ranges.replace("uranium =", "uranum ="), "fit.toml")
    with pytest.raises(ValueError, match=r"\[ranges\] sets a min-max scaling"):
        fit_from_toml(text.replace('scale = "minmax"', 'scale = "none"') + ranges, "fit.toml")
    # each site scales its own file: (x - low) / (high - low), computed here by hand from the file
    rows = [r for r in _rows(tmp_path / "radon" / "radon.csv") if r["county.name"] == "ANOKA"]
    (tmp_path / "anoka.csv").write_text("rownames,log.radon,basement,uranium\n" + "".join(
        f"{r['rownames']},{r['log.radon']},{r['basement']},{r['uranium']}\n" for r in rows))
    site = config.load_site("ANOKA", tmp_path / "anoka.csv")
    raw = np.array([[float(r["log.radon"]), float(r["basement"]), float(r["uranium"])] for r in rows])
    np.testing.assert_allclose(site["home"], (raw[:, :2] - [-3, 0]) / [7, 1], rtol=1e-12)
    np.testing.assert_allclose(site["county"], (raw[:, 2:] + 1) / 2, rtol=1e-12)
    hm1 = text.replace('random = ["(intercept)"]\n', "").replace('noise = "shared"\n', "")  # HM2's options
    linear = fit_from_toml('model = "fedlin-hm1"\n' + hm1 + ranges, "fit.toml")
    X, y = linear.load_site("ANOKA", tmp_path / "anoka.csv")
    np.testing.assert_allclose(X[:, 1:], (raw[:, 1:] - [0, -1]) / [1, 2], rtol=1e-12)  # after the intercept column
    np.testing.assert_allclose(y, (raw[:, 0] + 3) / 7, rtol=1e-12)
    tight = fit_from_toml(text + ranges.replace("[-1, 1]", "[-1, -0.9]"), "fit.toml")
    with pytest.raises(SiteDataError, match=r"site 'ANOKA': column 'uranium': \d+ value\(s\) outside its declared range in "
                                            r"\[ranges\], first at row \d+$") as caught:
        tight.load_site("ANOKA", tmp_path / "anoka.csv")
    assert rows[0]["uranium"] not in str(caught.value)


@needs_flower
@pytest.mark.parametrize("model", ["fed-mv-ppca", "fedlin-hm2"])
def test_a_flower_site_checks_the_id_column_as_the_command_line_does(model, tmp_path):
    """A deployed site refuses a file without the configured id column or with an id on two rows (a subject counted
    twice), naming how many and never an id; the id travels in the run's configuration."""
    from fedhier.data.sitefiles import SiteDataError
    from fedhier.deploy import fit_from_toml

    text = f'model = "{model}"\n' + _copy(tmp_path, "radon").read_text() + '\n[flower]\nsites = ["ANOKA", "DAKOTA"]\n'
    config = fit_from_toml(text, "fit.toml")
    assert config.id == "rownames" and type(config).from_json(config.to_json()) == config
    rows = [r for r in _rows(tmp_path / "radon" / "radon.csv") if r["county.name"] == "ANOKA"]
    columns = ["rownames", "log.radon", "basement", "uranium"]
    lines = [",".join(columns)] + [",".join(r[c] for c in columns) for r in rows]
    (tmp_path / "anoka.csv").write_text("\n".join(lines) + "\n")
    config.load_site("ANOKA", tmp_path / "anoka.csv")
    (tmp_path / "twice.csv").write_text("\n".join(lines + lines[1:3]) + "\n")
    with pytest.raises(SiteDataError, match=r"^site 'ANOKA': 2 id\(s\) in column 'rownames' appear on more than one row "
                                            r"of twice.csv; each subject needs its own id$"):
        config.load_site("ANOKA", tmp_path / "twice.csv")
    (tmp_path / "bare.csv").write_text("\n".join(line.split(",", 1)[1] for line in lines) + "\n")
    with pytest.raises(SiteDataError, match=r"^site 'ANOKA': id column 'rownames' missing in bare.csv; columns: "):
        config.load_site("ANOKA", tmp_path / "bare.csv")
    with pytest.raises(ValueError, match="id must be a string in quotes, got the integer 3"):
        fit_from_toml(text.replace('id = "rownames"', "id = 3"), "fit.toml")


def test_one_file_per_site_and_a_site_column_give_the_same_fit(tmp_path, capsys):
    toml = _copy(tmp_path, "motes")
    rows = _rows(tmp_path / "motes" / "motes.csv")
    header = list(rows[0])
    sites = {}
    for r in rows:
        sites.setdefault(r["mote_id"], []).append(r)
    for mote, mine in sites.items():
        with (tmp_path / "motes" / f"mote{mote}.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=header)
            w.writeheader()
            w.writerows(mine)
    text = toml.read_text().replace('file = "motes.csv"\nsite_column = "mote_id"\n', "")
    (tmp_path / "motes" / "split.toml").write_text(text + "\n[sites]\n" + "".join(f'"{m}" = "mote{m}.csv"\n' for m in sites))
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["fit", "--config", str(tmp_path / "motes" / "split.toml"), "--out", str(tmp_path / "b"), "--quiet"]) == 0
    for mote in sites:
        a = np.loadtxt(tmp_path / "a" / f"latent_{mote}.csv", delimiter=",", skiprows=1)
        b = np.loadtxt(tmp_path / "b" / f"latent_{mote}.csv", delimiter=",", skiprows=1)
        np.testing.assert_array_equal(a, b)


def test_no_command_needs_an_optional_package_on_the_core_install(tmp_path, monkeypatch, capsys):
    import sys

    optional = ("pandas", "statsmodels", "flwr", "torch", "mpi4py", "pyarrow")

    class NotInstalled:  # as on the install `make demo` creates
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.split(".")[0] in optional:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for name in list(sys.modules):
        if name.split(".")[0] in optional:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NotInstalled(), *sys.meta_path])
    toml = _copy(tmp_path, "motes")
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    assert main(["fit", "linear", "--config", str(toml), "--out", str(tmp_path / "linear")]) == 0
    assert main(["collab", "fit", "--config", str(toml), "--out", str(tmp_path / "collab")]) == 0
    assert main(["collab", "score", "--model", str(tmp_path / "collab" / "model.npz"), "--csv", str(tmp_path / "motes" / "motes.csv"),
                 "--out", str(tmp_path / "s.csv")]) == 0
    assert main(["experiment", "list"]) == 0


def test_the_reader_reads_cells_as_a_spreadsheet_user_writes_them(tmp_path):
    import gzip

    from fedhier.data.sitefiles import SiteDataError, read_site_table

    text = "\ufeffa, b ,c\nTrue,1.5,NA\nno,,N/A\nYES,2,3\n\n"
    with gzip.open(tmp_path / "s.csv.gz", "wt", encoding="utf-8") as fh:
        fh.write(text)
    notes = []
    views = read_site_table(tmp_path / "s.csv.gz", {"flags": ["a"], "pair": ["b", "c"]}, "s", notes=notes)
    np.testing.assert_array_equal(views["flags"][:, 0], [1.0, 0.0, 1.0])
    assert np.isnan(views["pair"][:2]).all() and views["pair"][2].tolist() == [2.0, 3.0]  # row 1 partly observed: missing
    assert notes == ["site 's', view 'pair': 1 subject(s) observed in only part of the view are treated as lacking it"]
    with pytest.raises(SiteDataError, match=r"site 's', view 'pair': 1 row\(s\) with some but not all .* first at row 1"):
        read_site_table(tmp_path / "s.csv.gz", {"pair": ["b", "c"]}, "s", partial="refuse")


def test_collab_scale_changes_nothing_because_collabdict_standardises_itself(tmp_path, capsys):
    toml = _copy(tmp_path, "motes")
    assert main(["collab", "fit", "--config", str(toml), "--out", str(tmp_path / "minmax")]) == 0
    toml.write_text(toml.read_text().replace('scale = "minmax"', 'scale = "none"'))
    assert main(["collab", "fit", "--config", str(toml), "--out", str(tmp_path / "none")]) == 0
    for mote in "1234":
        a = [float(r["score"]) for r in _rows(tmp_path / "minmax" / f"scores_{mote}.csv")]
        b = [float(r["score"]) for r in _rows(tmp_path / "none" / f"scores_{mote}.csv")]
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    assert "has no effect on CollabDict" in " ".join(json.loads((tmp_path / "minmax" / "summary.json").read_text())["notes"])


def test_fit_linear_scales_with_declared_ranges_without_a_scaling_round(tmp_path, monkeypatch):
    import importlib

    simulate_module = importlib.import_module("fedhier.runtime.simulate")
    names: list[str] = []
    real = simulate_module.simulate
    monkeypatch.setattr(simulate_module, "simulate", lambda protocol, *a, **k: names.append(protocol.name) or real(protocol, *a, **k))
    ranges = {"age": (18, 100), "trestbps": (0, 250), "exang": (0, 1), "thalch": (40, 250)}
    toml = _heart_minmax(tmp_path, ranges)
    assert main(["fit", "linear", "--config", str(toml), "--out", str(tmp_path / "lin")]) == 0
    scaling = json.loads((tmp_path / "lin" / "summary.json").read_text())["scaling"]
    assert scaling["columns"] == ["age", "trestbps", "exang", "thalch"]
    assert scaling["center"] == [ranges[c][0] for c in scaling["columns"]]
    assert scaling["scale"] == [ranges[c][1] - ranges[c][0] for c in scaling["columns"]]
    assert "column-scaling" not in names  # no scaling round
    toml.write_text(toml.read_text().split("\n[ranges]")[0].replace('scale = "minmax"', 'scale = "standard"'))
    assert main(["fit", "linear", "--config", str(toml), "--out", str(tmp_path / "lin2")]) == 0
    assert "column-scaling" in names  # the watch sees a scaling round when there is one


def test_a_private_fit_of_the_heart_files_with_one_feature_views_runs(tmp_path, capsys):
    """`lab` (chol) and `angiography` (ca) have one column each: nothing of their loadings is free, and the
    private fit used to fail at every site that has them."""
    toml = _copy(tmp_path, "heart")
    toml.write_text(toml.read_text().replace('scale = "standard"', 'scale = "standard"\nscaling_outside_privacy = true'))
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet", "--dp"]) == 0
    summary = _check_folder(tmp_path / "fit", "privacy-report.json")
    assert "failed" not in capsys.readouterr().err
    assert all(spent["epsilon"] <= 1.0 + 1e-9 for spent in summary["privacy_spent"].values())


#: public bounds of every modelled heart column (clinical ranges, not the data's)
HEART_RANGES = {"age": (18, 100), "trestbps": (0, 250), "fbs": (0, 1), "chol": (0, 700), "thalch": (40, 250),
                "oldpeak": (-3, 7), "exang": (0, 1), "ca": (0, 3)}


def test_a_record_level_private_fit_releases_once_per_site_and_protects_subjects(tmp_path):
    toml = _heart_minmax(tmp_path, HEART_RANGES, 'privacy_unit = "record"\nepsilon = 2.0')
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    summary = _check_folder(tmp_path / "fit", "privacy-report.json")
    assert summary["privacy_unit"] == "record" and summary["rounds_run"] == 1
    assert list(summary["privacy_spent"]) == summary["sites"]  # sites by name, as everywhere
    assert "nothing was sent" in summary["ranges"]  # no scaling round either: one release per site in all
    for spent in summary["privacy_spent"].values():
        assert spent["releases"] == 1 and spent["epsilon"] <= 2.0 + 1e-9
    assert json.loads((tmp_path / "fit" / "privacy-report.json").read_text())["unit"] == "record"
    assert "Record-level differential privacy" in (tmp_path / "fit" / "report.md").read_text()
    # the same budget at the site level runs every round and protects a site's whole data set
    toml.write_text(toml.read_text().replace('privacy_unit = "record"', 'privacy_unit = "site"'))
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "site"), "--quiet"]) == 0
    summary = _check_folder(tmp_path / "site", "privacy-report.json")
    assert summary["privacy_unit"] == "site" and summary["rounds_run"] > 1
    assert json.loads((tmp_path / "site" / "privacy-report.json").read_text())["unit"] == "site"


@needs_flower
def test_record_level_privacy_refuses_secure_summation_and_needs_public_ranges_over_flower(tmp_path):
    from fedhier.deploy.mvppca import FlowerFitConfig

    toml = _heart_minmax(tmp_path, HEART_RANGES, 'privacy_unit = "record"\nepsilon = 2.0\naggregation = "secure"')
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 2
    assert not (tmp_path / "fit").exists()
    flower = 'n_components = 1\nepsilon = 2.0\nprivacy_unit = "record"\n[views]\nclinical = ["age", "trestbps"]\n[flower]\nsites = ["cleveland", "hungary"]\n'
    with pytest.raises(ValueError, match="record-level privacy.*set scale = \"minmax\" with public bounds in a \\[ranges\\] table"):
        FlowerFitConfig.from_toml(flower)
    ranges = '[ranges]\nage = [0, 120]\ntrestbps = [0, 250]\n'
    assert FlowerFitConfig.from_toml('scale = "minmax"\n' + flower + ranges).privacy_unit == "record"
    FlowerFitConfig.from_toml(flower.replace('"record"', '"site"'))  # the default unit is accepted


def test_a_site_that_fails_in_every_round_stops_the_command_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from fedhier.protocol.mvppca import MVPPCAProtocol

    real_step = MVPPCAProtocol.site_step

    def site_step(self, ctx, broadcast):
        if ctx.site == 1:
            raise ValueError("a broken site")
        return real_step(self, ctx, broadcast)

    monkeypatch.setattr(MVPPCAProtocol, "site_step", site_step)
    toml = _copy(tmp_path, "heart")
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "fedhier: error: site(s) ['hungary'] failed in every round" in err
    assert not (tmp_path / "fit").exists() or not any((tmp_path / "fit").iterdir())


def test_the_sigma2_prior_warning_advises_what_the_configuration_lacks(tmp_path, capsys):
    """A view that hardly varies at one site: on standardised data the advice is to check that site's columns, not
    to set the scaling the file already sets; on min-max scaled data it is to standardise."""
    assert main(["fit", "--config", str(_copy(tmp_path, "heart")), "--out", str(tmp_path / "standard"), "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "prior on sigma2" in line]
    assert warned and all("already standardised across the sites" in line and 'set scale = "standard"' not in line
                          for line in warned), warned
    toml = _heart_minmax(tmp_path / "minmax", HEART_RANGES)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "minmax-fit"), "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "prior on sigma2" in line]
    assert warned and all('set scale = "standard" in the configuration' in line for line in warned), warned


_SMALL_TOML = """id = "pid"
n_components = 2
n_rounds = 3
target = "y"
features = ["g1", "age", "bmi"]
variables = ["g1", "g2", "age", "bmi"]
max_iter = 3

[views]
genes = ["g1", "g2", "g3", "g4"]
clin = ["age", "bmi", "crp"]

[sites]
a = "site_a.csv"
b = "site_b.csv"
c = "site_c.csv"
"""


def _small(tmp: Path, edit=None, toml_edit=None) -> Path:
    """Three sites' files of 12 subjects (id pid, views genes and clin, target y); ``edit(name, text) -> text``."""
    rng = np.random.default_rng(0)
    header = ["pid", "g1", "g2", "g3", "g4", "age", "bmi", "crp", "y"]
    for site in "abc":
        lines = [",".join(header)] + [",".join([f"{site.upper()}{i:03d}", *(f"{v:.4f}" for v in rng.normal(size=8))])
                                      for i in range(12)]
        text = "\n".join(lines) + "\n"
        name = f"site_{site}.csv"
        (tmp / name).write_text(edit(name, text) if edit else text)
    toml = tmp / "fit.toml"
    toml.write_text(toml_edit(_SMALL_TOML) if toml_edit else _SMALL_TOML)
    return toml


def _error(capsys, toml: Path, *command: str) -> str:
    """The one line a refused command prints (exit status 2, no traceback)."""
    capsys.readouterr()
    assert main([*command, "--config", str(toml), "--out", str(toml.parent / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedhier: error: ") and "Traceback" not in err, err
    assert not (toml.parent / "out").exists()
    return err


def _line(text: str, k: int, new) -> str:
    lines = text.splitlines()
    lines[k] = new(lines[k])
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", [["fit"], ["fit", "linear"], ["collab", "fit"]])
def test_a_row_with_a_field_missing_or_extra_is_refused_by_line_without_values(command, tmp_path, capsys):
    def drop_second_field(line: str) -> str:
        fields = line.split(",")
        return ",".join(fields[:1] + fields[2:])

    drop = _small(tmp_path, lambda n, t: _line(t, 4, drop_second_field) if n == "site_a.csv" else t)
    err = _error(capsys, drop, *command)
    assert "site 'a': site_a.csv, line 5: 8 fields, the header has 9" in err
    assert "A003" not in err and "." not in err.split("line 5")[1], err
    extra = _small(tmp_path, lambda n, t: _line(t, 2, lambda s: s + ",7.5") if n == "site_b.csv" else t)
    assert "site 'b': site_b.csv, line 3: 10 fields, the header has 9" in _error(capsys, extra, *command)


def test_trailing_empty_fields_and_lines_of_commas_are_still_read(tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: "".join(line + ",\n" for line in t.splitlines()) + ",,,,,,,,,\n")
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "o1"), "--quiet"]) == 0
    toml = _small(tmp_path, lambda n, t: _line(t, 0, lambda s: s + ",,") + ",,,,\n")  # empty header fields, short rows
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "o2"), "--quiet"]) == 0
    assert len(_rows(tmp_path / "o2" / "latent_a.csv")) == 12


@pytest.mark.parametrize("command", [["fit"], ["fit", "linear"], ["collab", "fit"]])
def test_a_file_without_header_is_named_without_printing_its_first_row(command, tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: t.split("\n", 1)[1] if n == "site_a.csv" else t)
    err = _error(capsys, toml, *command)
    assert "site 'a': the first line of site_a.csv looks like data, not a header naming the columns" in err
    assert "A000" not in err and "columns:" not in err and not any(ch.isdigit() for ch in err.split("site_a.csv")[1]), err


def test_a_file_of_text_without_header_is_refused_and_a_header_of_words_is_read(tmp_path):
    """The first subject of a file of categories has no numbers to give it away, but its cells recur in their
    columns; a header of words does not, and a column named like a category elsewhere in the file is still read."""
    from fedhier.data.sitefiles import SiteDataError, read_table

    text = ["sex,dataset,cp,restecg,slope,thal", "Male,Cleveland,typical angina,lv hypertrophy,downsloping,fixed defect",
            "Male,Cleveland,asymptomatic,lv hypertrophy,flat,normal", "Female,Cleveland,asymptomatic,normal,flat,normal"]
    (tmp_path / "bare.csv").write_text("\n".join(text[1:] * 3) + "\n")
    with pytest.raises(SiteDataError, match="the first line of bare.csv looks like data") as refused:
        read_table(tmp_path / "bare.csv", "a")
    assert "Male" not in str(refused.value) and "Cleveland" not in str(refused.value)
    (tmp_path / "named.csv").write_text("\n".join(text) + "\n")
    assert read_table(tmp_path / "named.csv", "a").header == text[0].split(",")
    (tmp_path / "normal.csv").write_text("\n".join(["normal,flat", "fixed,flat", "reversible,up"]) + "\n")  # one name recurs
    assert read_table(tmp_path / "normal.csv", "a").header == ["normal", "flat"]


@pytest.mark.parametrize("separator, named", [(";", "';'"), ("\t", "a tab")])
def test_a_file_with_another_separator_is_named_with_the_fix(separator, named, tmp_path, capsys):
    european = (lambda t: t.replace(",", ";").replace(".", ",")) if separator == ";" else (lambda t: t.replace(",", "\t"))
    toml = _small(tmp_path, lambda n, t: european(t) if n == "site_b.csv" else t)
    err = _error(capsys, toml, "fit")
    assert (f"site 'b': site_b.csv seems to use {named} as separator; fedhier reads comma-separated files "
            "(save as CSV UTF-8 with commas)") in err
    assert "columns:" not in err and "did you mean" not in err, err


def test_a_file_with_only_a_header_is_named_as_such(tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: t.split("\n", 1)[0] + "\n" if n == "site_c.csv" else t)
    err = _error(capsys, toml, "fit")
    assert "site 'c': site_c.csv has a header but no data rows" in err and "measures none" not in err, err


def test_an_id_column_missing_at_one_site_is_suggested_from_that_sites_header(tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: t.replace("pid,", "PID,", 1) if n == "site_b.csv" else t)
    err = _error(capsys, toml, "fit")
    assert "id column 'pid' missing at site(s) ['b']; did you mean 'PID'?" in err
    assert "['PID', 'g1'" in err and "'pid'," not in err, err


def test_lists_of_columns_in_a_message_are_bounded(tmp_path, capsys):
    many = [f"gene{j}" for j in range(3000)]
    toml = _small(tmp_path, lambda n, t: "\n".join(f"{line},{','.join(many if k == 0 else ['1.5'] * len(many))}"
                                                     for k, line in enumerate(t.splitlines())) + "\n",
                  lambda t: t.replace('"g4"]', '"g4", "gene_12"]'))
    err = _error(capsys, toml, "fit")
    assert "view 'genes': column 'gene_12' not found in any site's file; did you mean" in err
    assert "… and 2988 more)" in err and len(err) < 1000, (len(err), err[:300])


@pytest.mark.parametrize("command", [["fit"], ["fit", "linear"], ["collab", "fit"]])
def test_ids_repeated_within_a_site_are_counted_without_showing_them(command, tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: t.replace("A002,", "A000,").replace("A005,", "A004,").replace("A006,", "A004,")
                  if n == "site_a.csv" else t)
    err = _error(capsys, toml, *command)
    assert "site 'a': 2 id(s) in column 'pid' appear on more than one row of site_a.csv; each subject needs its own id" in err
    assert "A00" not in err, err


@pytest.mark.parametrize("command", [["fit"], ["fit", "linear"], ["collab", "fit"]])
def test_a_column_named_in_another_case_at_one_site_is_an_error_with_the_fix(command, tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: t.replace(",age,", ",Age,", 1) if n == "site_b.csv" else t)
    err = _error(capsys, toml, *command)
    assert "column 'age' not found at site 'b'; did you mean 'Age'?" in err and "rename it in site_b.csv" in err, err
    spaced = _small(tmp_path, lambda n, t: t.replace(",bmi,", ", B MI ,", 1) if n == "site_c.csv" else t)
    assert "column 'bmi' not found at site 'c'; did you mean 'B MI'?" in _error(capsys, spaced, *command)


def test_a_site_lacking_a_whole_view_is_noted_in_the_summary(tmp_path, capsys):
    def without_clin(name: str, text: str) -> str:
        if name != "site_c.csv":
            return text
        return "".join(",".join(f for j, f in enumerate(line.split(",")) if j not in (5, 6, 7)) + "\n"
                       for line in text.splitlines())

    toml = _small(tmp_path, without_clin)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    note = "site 'c', view 'clin': column(s) ['age', 'bmi', 'crp'] not in site_c.csv, so the view is not measured there"
    assert note in json.loads((tmp_path / "o" / "summary.json").read_text())["notes"]
    assert note in (tmp_path / "o" / "summary.md").read_text()


def test_missing_values_for_a_column_no_file_has_is_refused_with_the_closest_name(tmp_path, capsys):
    toml = _small(tmp_path, toml_edit=lambda t: 'missing_values = { agee = ["?"] }\n' + t)
    err = _error(capsys, toml, "fit")
    assert "missing_values names column(s) no site's file has: 'agee'; did you mean 'age'?" in err, err


def test_a_text_cell_suggests_missing_values_without_showing_it_and_missing_values_then_reads_it(tmp_path, capsys):
    toml = _small(tmp_path, lambda n, t: _line(t, 3, lambda s: ",".join(f if j != 5 else "?" for j, f in enumerate(s.split(",")))) if n == "site_a.csv" else t)
    err = _error(capsys, toml, "fit")
    assert ("site 'a', view 'clin': non-numeric value in column 'age', row 3 (if it marks a missing value, add it to "
            "the configuration: missing_values = { age = [...] })") in err and "?" not in err.replace("[...] })", ""), err
    toml.write_text('missing_values = { age = ["?"] }\n' + toml.read_text())
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "o"), "--quiet"]) == 0


def test_numbers_as_column_names_are_a_header_when_the_configuration_names_them(tmp_path, capsys):
    """Gene ids as column names look like a row of data; a configuration that names them makes them a header."""
    ids = {"g1": "7157", "g2": "672", "g3": "675", "g4": "1956", "crp": "1401"}  # 5 of the 9 columns

    def numbered(name: str, text: str) -> str:
        header, rest = text.split("\n", 1)
        return ",".join(ids.get(c, c) for c in header.split(",")) + "\n" + rest

    toml = _small(tmp_path, numbered, lambda t: t.replace('genes = ["g1", "g2", "g3", "g4"]', 'genes = ["7157", "672", "675", "1956"]')
                  .replace('"g1", "age"', '"7157", "age"').replace('"g1", "g2", "age"', '"7157", "672", "age"')
                  .replace('"crp"]', '"1401"]'))
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    columns = json.loads((tmp_path / "o" / "summary.json").read_text())["columns"]
    assert columns["genes"] == list(ids.values())[:4] and columns["clin"] == ["age", "bmi", "1401"]


@needs_flower
@pytest.mark.parametrize("model", ["fed-mv-ppca", "fedlin-hm2"])
def test_a_deployed_site_reads_numbers_as_column_names_it_is_configured_with_and_refuses_a_headerless_file(model, tmp_path):
    """Over Flower each site reads its own file: numeric column names it is configured with are a header; a file
    without a header is refused without quoting its first row."""
    from fedhier.data.sitefiles import SiteDataError
    from fedhier.deploy import fit_from_toml

    rng = np.random.default_rng(0)
    header = ["7157", "672", "675", "1956", "y"]
    rows = [",".join(f"{v:.4f}" for v in row) for row in rng.normal(size=(12, 5))]
    (tmp_path / "a.csv").write_text(",".join(header) + "\n" + "\n".join(rows) + "\n")
    (tmp_path / "bare.csv").write_text("\n".join(rows) + "\n")
    names = '["7157", "672", "675", "1956"]'
    text = (f'model = "{model}"\n' + ('n_components = 2\n[views]\ngenes = ' + names + "\n" if model == "fed-mv-ppca"
                                      else f'target = "y"\nfeatures = {names}\n') + '[flower]\nsites = ["a", "b"]\n')
    config = fit_from_toml(text)
    loaded = config.load_site("a", tmp_path / "a.csv")  # refused as a headerless file before
    if model == "fed-mv-ppca":
        assert loaded["genes"].shape == (12, 4)
    with pytest.raises(SiteDataError, match="the first line of bare.csv looks like data") as refused:
        config.load_site("a", tmp_path / "bare.csv")
    assert rows[0].split(",")[0] not in str(refused.value)


def test_a_data_path_may_start_at_home_and_a_folder_is_named_as_one(tmp_path, monkeypatch, capsys):
    toml = _small(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    toml.write_text(toml.read_text().replace('a = "site_a.csv"', 'a = "~/site_a.csv"'))
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    (tmp_path / "folder").mkdir()
    toml.write_text(toml.read_text().replace('b = "site_b.csv"', 'b = "folder"'))
    assert f"site 'b': {tmp_path / 'folder'} is a folder, not a data file" in _error(capsys, toml, "fit")


def test_a_column_is_read_cell_by_cell_rules_whether_or_not_every_cell_is_a_number(tmp_path):
    from fedhier.data.sitefiles import parse_column, read_table

    path = tmp_path / "site.csv"
    path.write_text("plain,marked,mixed,infinite\n1.5,-9,yes,1\n-2e3,4,NA,inf\n 7 ,-9,,2\n0.25,8,3.5,3\n")
    table = read_table(path, "hospital-a", missing={"marked": ["-9"]})
    problems: list[str] = []
    columns = {c: parse_column(table, c, problems) for c in ("plain", "marked", "mixed", "infinite")}
    np.testing.assert_array_equal(columns["plain"], [1.5, -2000.0, 7.0, 0.25])
    np.testing.assert_array_equal(columns["marked"], [np.nan, 4.0, np.nan, 8.0])  # its own marker, though numeric
    np.testing.assert_array_equal(columns["mixed"], [1.0, np.nan, np.nan, 3.5])
    np.testing.assert_array_equal(columns["infinite"], [1.0, np.nan, 2.0, 3.0])
    assert len(problems) == 1 and "infinite value in column 'infinite', row 2" in problems[0]
