"""The scaling step of ``fedhier fit`` as an attacker sees it: what leaves a site before the model's rounds.

A coordinator that records every reply it receives reads a site's exact column maximum from a min-max
scaling fitted on the sites' data (a subject's value: the oldest patient's age).  The tests show that this
disclosure is real and stated on the opt-in path (``scaling_outside_privacy = true``), that a private fit
without the opt-in is refused before any message is sent (and nothing is written), and that with public
``[ranges]`` no scaling message is exchanged at all while the fit equals one on files scaled by hand.  With
record-level privacy (``privacy_unit = "record"``) the coordinator receives one message per site, whose moments
differ from the site's exact moments by noise of the calibrated size.
"""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import numpy as np

from fedhier.cli import main
from fedhier.protocol.messages import decode
from fedhier.runtime.observers import observe_rounds

simulate_module = importlib.import_module("fedhier.runtime.simulate")

#: column -> its public bound (what an assay's or questionnaire's range would be)
RANGES = {"age": (18.0, 100.0), "bp": (60.0, 220.0), "chol": (100.0, 500.0), "hr": (40.0, 220.0), "st": (-3.0, 7.0),
          "bmi": (12.0, 60.0)}
VIEWS = {"clinical": ["age", "bp", "chol"], "exercise": ["hr", "st", "bmi"]}


def _site_rows(rng, n):
    """``n`` subjects drawn from a two-factor model, in clinical units, inside the public bounds."""
    x = rng.normal(size=(n, 2))
    lo, hi = np.array([r[0] for r in RANGES.values()]), np.array([r[1] for r in RANGES.values()])
    W = rng.uniform(-0.12, 0.12, size=(len(RANGES), 2))
    unit = np.clip(0.5 + x @ W.T + 0.04 * rng.normal(size=(n, len(RANGES))), 0.02, 0.98)
    return np.round(lo + unit * (hi - lo), 1)


def _write(path: Path, columns, values):
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([repr(float(v)) for v in row] for row in values)


def _study(folder: Path, *, extra: str = "", ranges: bool = False, scale: str = "minmax", prescaled: bool = False) -> Path:
    """Three sites' files and a private ``fit.toml`` (epsilon = 1) in ``folder``; ``prescaled``: the files scaled by hand."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for k, site in enumerate(("north", "south", "east")):
        values = _site_rows(rng, 40 + 10 * k)
        if prescaled:  # by hand, independently of fedhier: (x - low) / (high - low)
            lo = np.array([RANGES[c][0] for c in RANGES])
            hi = np.array([RANGES[c][1] for c in RANGES])
            values = (values - lo) / (hi - lo)
        _write(folder / f"{site}.csv", list(RANGES), values)
    text = (f'n_components = 1\nn_rounds = 3\nn_local_iter = 5\nn_first_iter = 5\nseed = 0\nepsilon = 1.0\nscale = "{scale}"\n{extra}'
            f'[views]\n' + "".join(f"{v} = {json.dumps(c)}\n" for v, c in VIEWS.items())
            + '[sites]\nnorth = "north.csv"\nsouth = "south.csv"\neast = "east.csv"\n')
    if ranges:
        text += "[ranges]\n" + "".join(f"{c} = [{lo}, {hi}]\n" for c, (lo, hi) in RANGES.items())
    toml = folder / "fit.toml"
    toml.write_text(text)
    return toml


class Coordinator:
    """Records every reply a site sends to the coordinator in a ``simulate()`` run (protocol name, decoded message)."""

    def __init__(self, monkeypatch):
        self.replies: list[tuple[str, int, dict]] = []
        real = simulate_module.run_site_step

        def recorded(protocol, data, site, round, site_seed, broadcast_bytes, state, guard=None, noise_seed=None):
            status, payload, new_state = real(protocol, data, site, round, site_seed, broadcast_bytes, state, guard, noise_seed)
            if status == "ok":
                self.replies.append((protocol.name, site, decode(protocol.reply_spec, payload)))
            return status, payload, new_state

        monkeypatch.setattr(simulate_module, "run_site_step", recorded)

    def protocols(self) -> set[str]:
        return {name for name, _, _ in self.replies}


def _column(folder: Path, site: str, column: str) -> np.ndarray:
    with (folder / f"{site}.csv").open() as fh:
        return np.array([float(r[column]) for r in csv.DictReader(fh)])


def test_the_coordinator_reads_a_sites_exact_maximum_from_a_data_derived_minmax_scaling(tmp_path, monkeypatch, capsys):
    """Opt-in path: the attack works, and the summary and report say that these statistics left the sites."""
    toml = _study(tmp_path / "study", extra="scaling_outside_privacy = true\n")
    coordinator = Coordinator(monkeypatch)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    scaling = [(site, reply) for name, site, reply in coordinator.replies if name == "column-scaling"]
    assert len(scaling) == 3
    columns = [c for cols in VIEWS.values() for c in cols]
    reply = next(r for site, r in scaling if site == 1)  # the second site's reply: its oldest patient's age, exactly
    assert reply["max"][columns.index("age")] == _column(tmp_path / "study", "south", "age").max()
    assert reply["min"][columns.index("chol")] == _column(tmp_path / "study", "south", "chol").min()
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    said = summary["scaling_outside_privacy"]
    assert "minimum, maximum" in said and "outside the privacy guarantee" in said.lower() and "'age'" in said
    assert said in (tmp_path / "fit" / "summary.md").read_text()
    for report in ("report.md", "report.html"):
        assert "exact minimum, maximum and count" in (tmp_path / "fit" / report).read_text()


def test_a_securely_summed_standard_scaling_is_stated_as_exact_totals_outside_the_guarantee(tmp_path, capsys):
    toml = _study(tmp_path / "study", scale="standard", extra='scaling_outside_privacy = true\naggregation = "secure"\n')
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    said = json.loads((tmp_path / "fit" / "summary.json").read_text())["scaling_outside_privacy"]
    assert "sums of squares" in said and "securely summed" in said and "without noise" in said
    assert said in (tmp_path / "fit" / "report.md").read_text()


def test_a_private_fit_with_a_data_derived_scaling_is_refused_before_anything_leaves_a_site(tmp_path, monkeypatch, capsys):
    for scale in ("minmax", "standard"):
        toml = _study(tmp_path / scale, scale=scale)
        coordinator = Coordinator(monkeypatch)
        out = tmp_path / f"fit-{scale}"
        assert main(["fit", "--config", str(toml), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fedhier: error: ") and len(err.splitlines()) == 1
        for fix in ("[ranges]", 'scale = "none"', "scaling_outside_privacy = true", "outside the privacy guarantee"):
            assert fix in err
        assert coordinator.replies == []  # no site sent anything
        assert not out.exists() or not any(out.iterdir())
    # the same refusal for --dp on the command line with a file that sets no epsilon
    toml = _study(tmp_path / "cli", scale="minmax")
    toml.write_text(toml.read_text().replace("epsilon = 1.0\n", ""))
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit-cli"), "--dp", "--quiet"]) == 2
    assert "scaling_outside_privacy" in capsys.readouterr().err
    # a fit without privacy is unchanged: the sites' ranges are fitted, no statement is added
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "plain"), "--quiet"]) == 0
    assert "scaling_outside_privacy" not in json.loads((tmp_path / "plain" / "summary.json").read_text())


def test_public_ranges_send_no_scaling_message_and_equal_a_fit_on_files_scaled_by_hand(tmp_path, monkeypatch, capsys):
    toml = _study(tmp_path / "declared", ranges=True)
    coordinator = Coordinator(monkeypatch)
    rounds: list[int] = []
    with observe_rounds(lambda record, broadcast: rounds.append(record.round)):
        # the same noise in both fits, so that they compare bit for bit: not private, for this comparison only
        assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet", "--insecure-reproducible-noise"]) == 0
    assert coordinator.protocols() == {"fed-mv-ppca"}  # the model's replies only
    assert rounds == [1, 2, 3]  # the fit's three rounds, no scaling round before them
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert "scaling_outside_privacy" not in summary and "nothing was sent" in summary["ranges"]

    by_hand = _study(tmp_path / "by-hand", scale="none", prescaled=True)
    assert main(["fit", "--config", str(by_hand), "--out", str(tmp_path / "fit-by-hand"), "--quiet",
                 "--insecure-reproducible-noise"]) == 0
    from fedhier import FedMVPPCA

    a, b = FedMVPPCA.load(tmp_path / "fit" / "model.npz"), FedMVPPCA.load(tmp_path / "fit-by-hand" / "model.npz")
    assert np.isfinite(a.model_["clinical"].W).all()
    for view in VIEWS:  # loadings, means and noise variances of the two fits
        for name in ("W", "mu", "sigma2"):
            np.testing.assert_allclose(getattr(a.model_[view], name), getattr(b.model_[view], name), rtol=1e-9, atol=1e-12)
    for site in ("north", "south", "east"):
        la = np.loadtxt(tmp_path / "fit" / f"latent_{site}.csv", delimiter=",", skiprows=1)
        lb = np.loadtxt(tmp_path / "fit-by-hand" / f"latent_{site}.csv", delimiter=",", skiprows=1)
        np.testing.assert_allclose(la, lb, rtol=1e-9, atol=1e-12)


def test_record_level_privacy_sends_each_site_one_noisy_release_of_its_moments(tmp_path, monkeypatch, capsys):
    """What a coordinator recording every reply gets from ``privacy_unit = "record"``: one release per site, and in it
    the site's exact second moments (computed here from its file scaled by hand) plus noise of sd z 2C^2."""
    from fedhier.privacy import gaussian_noise_multiplier

    toml = _study(tmp_path / "study", ranges=True, extra='privacy_unit = "record"\n')
    coordinator = Coordinator(monkeypatch)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    assert coordinator.protocols() == {"fed-mv-ppca-record-dp"}
    assert sorted(site for _, site, _ in coordinator.replies) == [0, 1, 2]  # one message per site, nothing else
    columns = [c for cols in VIEWS.values() for c in cols]
    lo, hi = np.array([RANGES[c][0] for c in columns]), np.array([RANGES[c][1] for c in columns])
    clip = 0.5 * np.sqrt(len(columns))  # the default bound: no record of data in [0, 1] is clipped around 0.5
    sd = gaussian_noise_multiplier(1.0, 1e-5, "analytic") * 2 * clip**2  # epsilon = 1 of _study, one release
    for site, name in enumerate(("north", "south", "east")):
        x = (np.column_stack([_column(tmp_path / "study", name, c) for c in columns]) - lo) / (hi - lo) - 0.5
        records = np.hstack([x, np.full((len(x), len(VIEWS)), clip / np.sqrt(len(VIEWS)))])
        released = next(reply["moments"] for _, s, reply in coordinator.replies if s == site)
        noise = (released - records.T @ records)[np.triu_indices(records.shape[1])]
        assert 0.6 * sd < noise.std() < 1.4 * sd, (name, noise.std(), sd)  # 45 draws: outside only if the noise is wrong
