"""The reports of every family: self-contained HTML with real tables and captioned figures, and the
quantities they show checked against independent computations."""

import csv
import gzip
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from fedhier.cli import main
from fedhier.report.document import Report
from fedhier.report.mvppca import site_estimates, variance_explained

BUNDLED = Path(__file__).resolve().parents[1] / "src" / "fedhier" / "data" / "bundled"


class _Page(HTMLParser):
    """What the checks need from a page: tags, figures and their captions, links, visible text."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.tags: dict[str, int] = {}
        self.figures: list[dict] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for name in ("src", "href"):
            if name in attrs:
                self.links.append(attrs[name])
        if tag == "figure":
            self.figures.append({"images": 0, "caption": ""})
        if tag in ("img", "svg"):
            assert "figure" in self.stack, f"<{tag}> outside a <figure>"
            self.figures[-1]["images"] += 1
        if tag not in ("img", "meta", "br", "hr", "link", "input"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass

    def handle_data(self, data):
        if self.stack and self.stack[-1] in ("style", "script"):
            return
        if "figcaption" in self.stack:
            self.figures[-1]["caption"] += data
        self.text.append(data)


def check_page(path: Path) -> _Page:
    """The checks of every report page; returns the parsed page."""
    source = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(source)
    assert page.tags.get("table", 0) >= 1 and page.tags.get("th", 0) >= 1 and page.tags.get("td", 0) >= 1
    assert "|---" not in source and "|--" not in source
    text = "".join(page.text)
    for line in text.splitlines():
        assert not line.lstrip().startswith("#"), f"markdown heading in the HTML: {line!r}"
        assert not line.lstrip().startswith("|"), f"markdown table row in the HTML: {line!r}"
    assert "![" not in text and "**" not in text and "](" not in text
    assert page.figures, "no figure"
    for figure in page.figures:
        assert figure["images"] == 1 and len(figure["caption"].split()) >= 15, figure
    assert page.tags.get("img", 0) + page.tags.get("svg", 0) == len(page.figures)
    assert page.tags.get("figcaption", 0) == len(page.figures)
    for link in page.links:  # no external assets: every image is embedded
        assert link.startswith("data:image/png;base64,"), link[:60]
    assert "<script" not in source and "@import" not in source and "url(" not in source
    assert "§" not in text  # captions and text cite no spec sections
    md = (path.parent / "report.md").read_text(encoding="utf-8")
    assert md.count("](figures/") == len(page.figures)
    assert md.count("\n|---") + md.count("\n|---:") >= page.tags["table"]
    for line in md.splitlines():
        if line.startswith("![") and "](figures/" in line:
            assert (path.parent / line.split("](")[1].rstrip(")")).is_file()
    return page


def headings(page: _Page) -> str:
    return " | ".join(page.text)


# ---------------------------------------------------------------------- Fed-mv-PPCA
def test_demo_report(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--rounds", "4", "--quiet"]) == 0
    page = check_page(out / "report.html")
    text = headings(page)
    for section in ("Variance explained per view and factor", "Top loadings per factor", "How the sites differ from the global model",
                    "Latent space", "Imputation of hidden views", "Convergence"):
        assert section in text, section
    assert "Privacy ledger" not in text
    assert len(page.figures) == 6  # variance, sites, latent pairs, imputation of csf and demographics, convergence


def test_private_demo_report_has_the_privacy_ledger(tmp_path):
    out = tmp_path / "dp"
    assert main(["demo", "--dp", "--unit", "site", "--out", str(out), "--rounds", "3", "--quiet"]) == 0
    page = check_page(out / "report.html")
    text = headings(page)
    assert "Privacy ledger" in text and "Cumulative ε per site" in text and "fedhier demo --rounds 3 --dp --unit site" in text
    # the private model beside the training mean, computed here from the demo's split by plain numpy
    from fedhier.demo import demo_data

    d = demo_data(seed=0)
    errors = []
    for view, T in d.test_masked.items():
        train = np.vstack([s[view] for s in d.sites if view in s])
        rows = ~np.isnan(T).all(axis=1)
        errors.append(np.abs(T[rows] - np.nanmean(train[~np.isnan(train).all(axis=1)], axis=0)).ravel())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training_mean_test_mae"] == pytest.approx(np.concatenate(errors).mean(), rel=1e-12)
    md = (out / "report.md").read_text()
    assert "test MAE of predicting each feature's training mean" in md and "not expected to beat the training mean" in md


def test_fit_report_on_user_files(tmp_path):
    rng = np.random.default_rng(1)
    columns = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3", "b4"]}
    W = rng.normal(size=(7, 2))
    for name, n, views in (("north", 60, ("a", "b")), ("south", 50, ("a",))):
        X = rng.normal(size=(n, 2)) @ W.T + 0.3 * rng.normal(size=(n, 7))
        cols = [c for v in views for c in columns[v]]
        with (tmp_path / f"{name}.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(cols)
            w.writerows(X[:, : len(cols)].tolist())
    (tmp_path / "fit.toml").write_text(
        'n_components = 2\nn_rounds = 4\n[views]\na = ["a1", "a2", "a3"]\nb = ["b1", "b2", "b3", "b4"]\n'
        '[[sites]]\nname = "north"\npath = "north.csv"\n[[sites]]\nname = "south"\npath = "south.csv"\n'
    )
    out = tmp_path / "fit"
    assert main(["fit", "--config", str(tmp_path / "fit.toml"), "--out", str(out), "--quiet"]) == 0
    page = check_page(out / "report.html")
    text = headings(page)
    assert "north" in text and "south" in text and "(b)" in text  # feature (view) in the top loadings
    assert "Imputation of hidden views" not in text  # no held-out truth for user data


def test_variance_explained_matches_simulated_data():
    # independent check: the empirical variance of each factor's part W_j x_j against the data's total variance
    rng = np.random.default_rng(0)
    W = rng.normal(size=(6, 3)) * np.array([2.0, 1.0, 0.3])
    noise = 0.5
    x = rng.normal(size=(200_000, 3))
    parts = x[:, None, :] * W[None, :, :]  # (n, d, q)
    data = parts.sum(axis=2) + np.sqrt(noise) * rng.normal(size=(200_000, 6))
    empirical = parts.var(axis=0).sum(axis=0) / data.var(axis=0).sum()
    np.testing.assert_allclose(variance_explained(W, noise), empirical, rtol=0.02)


def test_site_estimates_are_the_sites_own_fits_aligned_to_the_global_axes():
    # a site's own EM estimate of mu is its sample mean (closed form with complete data); its W is rotated so that
    # no other rotation or reflection of the latent axes brings it closer to the global W (checked on a fine grid)
    from fedhier import FedMVPPCA

    rng = np.random.default_rng(3)
    W = rng.normal(size=(8, 2))
    sites = [{"v": rng.normal(size=(300, 2)) @ W.T + s + 0.2 * rng.normal(size=(300, 8))} for s in (0.0, 0.5, -0.5)]
    model = FedMVPPCA(n_components=2, n_rounds=5, random_state=0).fit(sites)
    G = model.global_params_["v"]["W"]
    angles = np.linspace(0, 2 * np.pi, 3601)
    for site, est in zip(sites, site_estimates(model, sites)):
        np.testing.assert_allclose(est["v"].mu, site["v"].mean(axis=0), atol=1e-6)
        aligned = np.linalg.norm(est["v"].W - G)
        for flip in (np.eye(2), np.diag([1.0, -1.0])):
            best = min(np.linalg.norm(est["v"].W @ flip @ np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) - G)
                       for a in angles)
            assert aligned <= best + 1e-9


# ---------------------------------------------------------------------- FedLin
def _fedlin_csv(path: Path, rng) -> np.ndarray:
    beta = np.array([1.0, -2.0, 0.0])
    rows = []
    for k, name in enumerate(["A", "B", "C"]):
        theta = beta + np.array([0.3, 0.2, 0.0]) * rng.normal(size=3)
        X = rng.normal(size=(40 + 10 * k, 3))
        y = X @ theta + 0.3 * rng.normal(size=len(X))
        rows += [[name, *x, t] for x, t in zip(X, y)]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["site", "x1", "x2", "x3", "y"])
        w.writerows(rows)
    return beta


@pytest.mark.parametrize("prior", ["gaussian", "lasso"])
def test_fit_linear_report(tmp_path, prior):
    rng = np.random.default_rng(0)
    _fedlin_csv(tmp_path / "data.csv", rng)
    out = tmp_path / prior
    args = ["fit", "linear", str(tmp_path / "data.csv"), "--site", "site", "--target", "y", "--features", "x1,x2,x3",
            "--prior", prior, "--rounds", "4", "--out", str(out)]
    assert main(args) == 0
    page = check_page(out / "report.html")
    text = headings(page)
    for section in ("Coefficients: population and sites", "Predicted against observed", "Selected variables", "Convergence of EP"):
        assert section in text, section
    assert ("Population effect of each feature" in text) == (prior == "gaussian")
    assert len(page.figures) == 4


def test_fit_linear_report_rmse_is_the_sites_prediction_error(tmp_path):
    from fedhier.estimators.fedlin import load
    from fedhier.report.fedlin import fit_by_site

    rng = np.random.default_rng(5)
    _fedlin_csv(tmp_path / "data.csv", rng)
    out = tmp_path / "hm2"
    assert main(["fit", "linear", str(tmp_path / "data.csv"), "--site", "site", "--target", "y", "--features", "x1,x2,x3",
                 "--rounds", "4", "--out", str(out)]) == 0
    est = load(out / "model.npz")
    with (tmp_path / "data.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    sites = []
    for name in ["A", "B", "C"]:
        part = [r for r in rows if r["site"] == name]
        sites.append((np.array([[float(r[c]) for c in ("x1", "x2", "x3")] for r in part]), np.array([float(r["y"]) for r in part])))
    for k, row in enumerate(fit_by_site(est, sites)):
        X, y = sites[k]
        coef = est.coef_draws_[k].mean(axis=0)
        assert row["RMSE"] == pytest.approx(np.sqrt(np.mean((y - X @ coef - est.intercept_[k]) ** 2)), rel=1e-9)


def test_fit_linear_hm1_report(tmp_path):
    _fedlin_csv(tmp_path / "data.csv", np.random.default_rng(2))
    out = tmp_path / "hm1"
    assert main(["fit", "linear", str(tmp_path / "data.csv"), "--site", "site", "--target", "y", "--features", "x1,x2,x3",
                 "--model", "hm1", "--rounds", "3", "--out", str(out)]) == 0
    page = check_page(out / "report.html")
    assert "HM1 gives no intervals" in headings(page)


# ---------------------------------------------------------------------- CollabDict
def _sensor_csv(path: Path, per_site: int = 400) -> None:
    with gzip.open(BUNDLED / "anomaly" / "suthaharan_multi_hop.csv.gz", "rt") as fh:
        rows = list(csv.DictReader(fh))
    kept, count = [], {}
    for r in rows:
        count[r["mote_id"]] = count.get(r["mote_id"], 0) + 1
        if count[r["mote_id"]] <= per_site or r["label"] == "1" and count[r["mote_id"]] <= 3 * per_site:
            kept.append(r)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(kept)


def test_collab_report_with_labels(tmp_path):
    _sensor_csv(tmp_path / "sensors.csv")
    out = tmp_path / "collab"
    assert main(["collab", "fit", "--csv", str(tmp_path / "sensors.csv"), "--site-column", "mote_id", "--drop-columns",
                 "reading,indoor", "--label-column", "label", "--components", "3", "--max-iter", "5",
                 "--out", str(out / "model.npz")]) == 0
    page = check_page(out / "report.html")
    text = headings(page)
    for section in ("Anomaly scores per site", "Mixture weights per site", "Consensus over iterations",
                    "Privacy of the published patterns", "Detection of the labelled anomalies (ROC)"):
        assert section in text, section


def test_collab_report_roc_auc_matches_scikit_learn(tmp_path):
    from sklearn.metrics import roc_auc_score

    from fedhier.estimators.collab import CollabDict
    from fedhier.report.collab import write_collab_report

    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(150, 2)) @ np.array([[1.0, 0.8], [0.0, 0.6]]) for _ in range(3)]
    labels = []
    for X in sites:
        y = np.zeros(len(X), dtype=int)
        y[::15] = 1
        X[y == 1] += np.array([4.0, -4.0])
        labels.append(y)
    model = CollabDict(n_components=2, max_iter=5, random_state=0).fit(sites)
    out = write_collab_report(tmp_path, model, sites, site_names=["a", "b", "c"], variables=["u", "v"], title="t",
                              intro="i", labels=labels)
    page = check_page(out)
    text = "".join(page.text)
    for s, (X, y) in enumerate(zip(sites, labels)):
        assert f"{roc_auc_score(y, model.anomaly_score(X, site=s)):.4g}" in text


def test_collab_privacy_paragraph_says_when_epsilon_protects_nothing(tmp_path):
    """The warning appears exactly when a site's ε exceeds 10: unclipped samples on few rows give an astronomical
    ε; clipped samples with a large minimum pattern weight give a small one."""
    from fedhier.estimators.collab import CollabDict
    from fedhier.report.collab import MEANINGFUL_EPSILON, write_collab_report

    rng = np.random.default_rng(1)
    sites = [rng.normal(size=(120, 2)) for _ in range(3)]
    for name, kw in (("loose", {}), ("tight", {"clip_norm": 0.25, "n_min": 5000.0})):
        model = CollabDict(n_components=2, max_iter=3, random_state=0, **kw).fit(sites)
        out = write_collab_report(tmp_path / name, model, sites, site_names=["a", "b", "c"], variables=["u", "v"],
                                  title="t", intro="i")
        text = "".join(check_page(out).text)
        largest = max(v["epsilon"] for v in model.privacy_spent_.values())
        assert ("no meaningful protection" in text) == (largest > MEANINGFUL_EPSILON), (name, largest)
        assert (largest > MEANINGFUL_EPSILON) == (name == "loose"), (name, largest)


def test_collab_report_without_labels(tmp_path):
    _sensor_csv(tmp_path / "sensors.csv", per_site=200)
    out = tmp_path / "collab"
    assert main(["collab", "fit", "--csv", str(tmp_path / "sensors.csv"), "--site-column", "mote_id", "--drop-columns",
                 "reading,indoor,label", "--components", "3", "--max-iter", "4", "--out", str(tmp_path / "m.npz"),
                 "--report", str(out)]) == 0
    page = check_page(out / "report.html")
    assert "ROC" not in headings(page)


# ---------------------------------------------------------------------- the page itself
def test_text_is_escaped_and_markdown_mirrors_the_page(tmp_path):
    report = Report("a <b> & c", "x < y | z")
    report.table([{"name": "p|q", "value": 0.000012345}, {"name": "<r>", "value": 3}], caption="t")
    path = report.write(tmp_path)
    source = path.read_text()
    assert "&lt;b&gt; &amp; c" in source and "<td>&lt;r&gt;</td>" in source and "1.234e-05" in source
    md = (tmp_path / "report.md").read_text()
    assert "p\\|q" in md and "| name | value |" in md


def test_site_processes_do_not_import_plotting_or_reports():
    code = (
        "import sys, fedhier.estimators.mvppca, fedhier.estimators.fedlin, fedhier.estimators.collab, fedhier.protocol.mvppca, fedhier.runtime.simulate, "
        "fedhier.runtime.peer, fedhier.privacy\n"
        "bad = [m for m in sys.modules if m.startswith('matplotlib') or m.startswith('fedhier.report')]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_result_folder_report_from_the_model_file_alone(tmp_path):
    # what a Flower coordinator holds: model.npz and the privacy summary, no site data
    from fedhier import FedMVPPCA
    from fedhier.report.mvppca import write_result_report

    rng = np.random.default_rng(0)
    sites = [{"v": rng.normal(size=(40, 5)), "w": rng.normal(size=(40, 3))} for _ in range(2)]
    FedMVPPCA(n_components=2, n_rounds=3, random_state=0).fit(sites).save(tmp_path / "model.npz")
    path = write_result_report(tmp_path, title="t", intro="i", site_names=["a", "b"],
                               privacy_spent={"a": {"epsilon": 1.0, "delta": 1e-5}, "b": {"epsilon": 0.8, "delta": 1e-5}})
    page = check_page(path)
    text = headings(page)
    assert "Variance explained per view and factor" in text and "Convergence" in text and "0.8" in text
    assert "How the sites differ" not in text
