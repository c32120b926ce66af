"""FedHM1Regressor() and FedHM2Regressor() pass scikit-learn's estimator checks as constructed, with their
defaults: HM1's step size is chosen from the data (raw-scale X included), HM2 scales the columns itself."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import check_estimator

from fedhier.estimators.fedlin import FedHM1Regressor, FedHM2Regressor


@pytest.mark.parametrize("estimator", [FedHM1Regressor(), FedHM2Regressor()], ids=lambda e: type(e).__name__)
def test_check_estimator_passes_with_the_defaults(estimator):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        results = check_estimator(estimator, on_fail=None)
    failed = {r["check_name"]: str(r["exception"]).splitlines()[0] for r in results if r["status"] == "failed"}
    assert not failed, failed


def test_hm1_default_step_converges_on_raw_units_where_the_old_fixed_step_diverged():
    """Columns in the thousands (X^T X ~ 1e8): the data-chosen step is stable and HM1 reaches each site's least
    squares fit (one site: no shrinkage towards others beyond the prior's), where eta = 1e-4 is refused."""
    rng = np.random.default_rng(0)
    X = rng.normal(1000.0, 300.0, size=(60, 2))
    y = X @ np.array([0.02, -0.01]) + rng.normal(0.0, 0.1, 60)
    with pytest.raises(ValueError, match="diverge"):
        FedHM1Regressor(fit_intercept=False, eta=1e-4).fit(X, y)
    model = FedHM1Regressor(fit_intercept=False, n_rounds=200, random_state=0).fit(X, y)
    top = np.linalg.eigvalsh(X.T @ X)[-1]
    assert model.eta_ == pytest.approx(0.5 / top)
    least_squares = np.linalg.lstsq(X, y, rcond=None)[0]
    np.testing.assert_allclose(model.coef_[0], least_squares, rtol=0.05)
