"""FedLin in the user's units: raw columns in, coefficients, intervals and between-site sds out in the
same units, checked against statsmodels' MixedLM (REML) on the Grunfeld investment data it ships
(11 firms x 20 years; invest ~ value + capital, groups = firm)."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedhier.estimators.fedlin import FedHM2Regressor, FedLinWarning

sm = pytest.importorskip("statsmodels.api")
smf = pytest.importorskip("statsmodels.formula.api")

FORMULA = "invest ~ value + capital"
#: the random-intercept model MixedLM fits by default: slopes fixed, one noise variance for all firms
RANDOM_INTERCEPT = dict(random=[False, False], noise="shared")


@pytest.fixture(scope="module")
def grunfeld():
    data = sm.datasets.grunfeld.load_pandas().data
    return data, data[["value", "capital"]], data["invest"], data["firm"]


@pytest.fixture(scope="module")
def mixedlm(grunfeld):
    data = grunfeld[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return smf.mixedlm(FORMULA, data, groups=data.firm).fit(reml=True)


def _assert_slopes_within_one_se(coef, reference):
    gaps = np.abs(np.asarray(coef) - reference.fe_params.values[1:]) / reference.bse_fe.values[1:]
    assert np.all(gaps < 1.0), f"slopes {coef} vs MixedLM {reference.fe_params.values[1:]}: {gaps} standard errors"


def _between_firm_sd(reference) -> float:
    return float(np.sqrt(reference.cov_re.values[0, 0]))


def test_raw_units_random_intercept_agrees_with_mixedlm(grunfeld, mixedlm):
    """Raw dollars in: population slopes within one MixedLM standard error; the between-firm sd is an sd in
    dollars, and MixedLM's REML value lies inside its 90 % interval; no warning about the response's scale."""
    _, X, y, firm = grunfeld
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedLinWarning)
        model = FedHM2Regressor(random_state=0, **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    _assert_slopes_within_one_se(model.population_coef_, mixedlm)
    assert abs(model.population_intercept_ - mixedlm.fe_params.values[0]) < mixedlm.bse_fe.values[0]
    np.testing.assert_array_equal(model.between_site_sd_, [0.0, 0.0])  # the slopes do not vary
    # log tau has a Gaussian posterior: exp(interval / 2) is the sd's interval, in invest's units
    j = model.phi_names_.index("log_tau[(intercept)]")
    lo, hi = np.exp(model.phi_interval(0.9)[j] / 2) * model.y_scale_[0]
    assert lo < _between_firm_sd(mixedlm) < hi
    assert lo < model.between_site_intercept_sd_ < hi
    # with 11 firms the prior on log tau still counts: the default's keeps the sd within 25 % of REML's
    assert abs(model.between_site_intercept_sd_ / _between_firm_sd(mixedlm) - 1.0) < 0.25
    # the population interval of the slopes covers MixedLM's estimates at one standard error's level
    coef_ci, intercept_ci = model.population_interval(0.68)
    assert np.all(coef_ci[:, 0] < mixedlm.fe_params.values[1:] + mixedlm.bse_fe.values[1:])
    assert np.all(coef_ci[:, 1] > mixedlm.fe_params.values[1:] - mixedlm.bse_fe.values[1:])
    assert intercept_ci[0] < mixedlm.fe_params.values[0] < intercept_ci[1]


def test_default_model_agrees_with_mixedlm_random_slopes(grunfeld):
    """FedHM2Regressor() lets every coefficient vary across sites: its population slopes and between-firm
    intercept sd match MixedLM with random intercept and slopes (``re_formula="~value+capital"``)."""
    data, X, y, firm = grunfeld
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = smf.mixedlm(FORMULA, data, groups=data.firm, re_formula="~value+capital").fit(reml=True)
    model = FedHM2Regressor(random_state=0).fit(X, y, groups=firm)
    _assert_slopes_within_one_se(model.population_coef_, reference)
    sd = _between_firm_sd(reference)
    assert abs(model.between_site_intercept_sd_ - sd) < 0.25 * sd


def test_a_scaler_in_a_pipeline_gives_the_same_fit_in_the_scaled_units(grunfeld, mixedlm):
    """make_pipeline(StandardScaler(), FedHM2Regressor()): the slopes per scaled column are the raw fit's
    times the scaler's sd, so in dollars within one MixedLM standard error; the between-firm sd (in invest's
    units, which the scaler leaves alone) equals the raw fit's; population-level R^2 as MixedLM's fixed part."""
    data, X, y, firm = grunfeld
    pipe = make_pipeline(StandardScaler(), FedHM2Regressor(random_state=0, **RANDOM_INTERCEPT))
    pipe.fit(X, y, fedhm2regressor__groups=firm)
    scaler, model = pipe[0], pipe[-1]
    _assert_slopes_within_one_se(model.population_coef_ / scaler.scale_, mixedlm)
    raw = FedHM2Regressor(random_state=0, **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    assert model.between_site_intercept_sd_ == pytest.approx(raw.between_site_intercept_sd_, rel=0.02)
    fixed = mixedlm.fe_params.values[0] + X.to_numpy() @ mixedlm.fe_params.values[1:]
    r2_mixedlm = 1.0 - np.sum((y - fixed) ** 2) / np.sum((y - y.mean()) ** 2)
    assert pipe.score(X, y) == pytest.approx(r2_mixedlm, abs=0.02)


def test_warnings_name_sites_by_their_groups_values(grunfeld):
    """With the scaling turned off, the response-scale warning names the firm, not its index."""
    _, X, y, firm = grunfeld
    with pytest.warns(FedLinWarning) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # two rounds
        FedHM2Regressor(scale="none", n_rounds=2, n_posterior_draws=50, random_state=0).fit(X, y * 100, groups=firm)
    text = " ".join(str(w.message) for w in caught)
    assert "site General Motors" in text or "site US Steel" in text, text
    assert "site 5" not in text and "site 0" not in text


def test_saved_model_keeps_the_units(grunfeld, tmp_path):
    from fedhier.estimators.fedlin import load

    _, X, y, firm = grunfeld
    model = FedHM2Regressor(random_state=0, n_posterior_draws=200, **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    back = load(model.save(tmp_path / "model.npz"))
    np.testing.assert_allclose(back.coef_, model.coef_)
    np.testing.assert_allclose(back.population_coef_, model.population_coef_)
    assert back.between_site_intercept_sd_ == pytest.approx(model.between_site_intercept_sd_)
    np.testing.assert_allclose(back.predict(X, groups=firm), model.predict(X, groups=firm))


@pytest.mark.parametrize("scale", ["none", "standard"])
def test_fit_linear_on_grunfeld_agrees_with_mixedlm_in_the_files_units(grunfeld, mixedlm, scale, tmp_path, capsys):
    """`fedhier fit linear` with a fit.toml and the CSV: coefficients.csv's population rows in the files' units
    (raw: the estimator scales itself; standard: the command line scales, the rows also carry *_original_units)
    within one MixedLM standard error; the between-firm sd is an sd (not the variance tau) in dollars, the same
    either way and the same as the estimator's; the report's table shows the sd and says which units it is in."""
    import csv

    from fedhier.cli import main

    data, X, y, firm = grunfeld
    data.to_csv(tmp_path / "grunfeld.csv", index=False)
    (tmp_path / "fit.toml").write_text(
        'file = "grunfeld.csv"\nsite_column = "firm"\ntarget = "invest"\nfeatures = ["value", "capital"]\n'
        f'intercept = true\nrandom = ["(intercept)"]\nnoise = "shared"\nscale = "{scale}"\n')
    assert main(["fit", "linear", "--config", str(tmp_path / "fit.toml"), "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert "fedhier: warning" not in capsys.readouterr().err
    with open(tmp_path / "o" / "coefficients.csv", newline="") as fh:
        population = {r["feature"]: r for r in csv.DictReader(fh) if r["site"] == "(population)"}
    unit = "" if scale == "none" else "_original_units"
    _assert_slopes_within_one_se([float(population[f][f"estimate{unit}"]) for f in ("value", "capital")], mixedlm)
    intercept = float(population["(intercept)"][f"estimate{unit}"])
    assert abs(intercept - mixedlm.fe_params.values[0]) < mixedlm.bse_fe.values[0]
    sd = float(population["(intercept)"][f"between_site_sd{unit}"])
    api = FedHM2Regressor(random_state=0, **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    assert sd == pytest.approx(api.between_site_intercept_sd_, rel=0.02)
    assert abs(sd / _between_firm_sd(mixedlm) - 1.0) < 0.25
    report = (tmp_path / "o" / "report.md").read_text()
    scaled_sd = float(population["(intercept)"]["between_site_sd"])
    row = next(line for line in report.splitlines() if line.startswith("| (intercept) |"))
    assert row.rstrip(" |").endswith(f"{scaled_sd:.4g}")  # the sd, sqrt(tau), as the CSV has it
    if scale == "standard":
        assert "in the units of invest" not in report and "invest as scaled (standard) before the fit" in report
        assert "The same in the files' units" in report


def test_a_new_site_adapts_in_the_users_units(grunfeld):
    """adapt() scales the new site's rows by the fit's sds and reports back in dollars: a firm left out of the fit
    and adapted gets the intercept it gets inside the fit, within its posterior sd."""
    _, X, y, firm = grunfeld
    rows = (firm == "IBM").to_numpy()
    full = FedHM2Regressor(random_state=0, n_posterior_draws=1000, **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    left_out = FedHM2Regressor(random_state=0, n_posterior_draws=1000, **RANDOM_INTERCEPT).fit(X[~rows], y[~rows], groups=firm[~rows])
    k = left_out.adapt(X[rows].to_numpy(), y[rows].to_numpy(), label="IBM")
    inside = list(full.sites_).index("IBM")
    assert left_out.sites_[k] == "IBM"
    sd = full.intercept_draws_[inside].std()
    assert abs(left_out.intercept_[k] - full.intercept_[inside]) < sd
    np.testing.assert_allclose(left_out.coef_[k], full.coef_[inside], rtol=0.05)


def test_the_prior_on_log_tau_is_a_parameter(grunfeld, mixedlm):
    """log_tau_prior is the Gaussian prior of each log tau_j: the paper's (0, 1) pulls the between-firm sd of the
    11 firms further above REML's than the default (-1, 1) does; a non-positive sd is refused in one line."""
    _, X, y, firm = grunfeld
    default = FedHM2Regressor(random_state=0, **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    paper = FedHM2Regressor(random_state=0, log_tau_prior=(0.0, 1.0), **RANDOM_INTERCEPT).fit(X, y, groups=firm)
    assert paper.model_.log_tau_prior == (0.0, 1.0) and default.model_.log_tau_prior == (-1.0, 1.0)
    assert _between_firm_sd(mixedlm) < default.between_site_intercept_sd_ < paper.between_site_intercept_sd_
    with pytest.raises(ValueError, match="log_tau_prior must be") as caught:
        FedHM2Regressor(log_tau_prior=(0.0, 0.0)).fit(X, y, groups=firm)
    assert "\n" not in str(caught.value)
