"""Bundled FedLin data: the loaders reproduce the counts stated in the data READMEs."""

import numpy as np

from fedhier.models.fedlin.datasets import load_cmapss, load_heart, load_radon, load_student


def test_radon_has_85_counties_and_919_homes():
    sites, names, features = load_radon()
    assert len(sites) == len(names) == 85 and features == ["intercept", "basement", "uranium"]
    assert sum(len(y) for _, y in sites) == 919
    # uranium is a county-level covariate: constant within each county
    assert all(np.ptp(X[:, 2]) == 0 for X, _ in sites)


def test_heart_has_the_four_hospitals():
    sites, names, _ = load_heart()
    assert names == ["Cleveland", "Hungary", "Switzerland", "VA Long Beach"]
    assert len(sites[0][1]) == 304  # Cleveland has no missing values in the columns used


def test_student_has_38_predictors_and_the_school_sizes():
    for course, sizes in (("por", [423, 226]), ("mat", [349, 46])):
        sites, names, features = load_student(course)
        assert names == ["GP", "MS"] and len(features) == 38
        assert [len(y) for _, y in sites] == sizes


def test_cmapss_has_100_engines_in_time_order():
    engines = load_cmapss(2)
    assert len(engines) == 100 and sum(len(c) for c, _ in engines) == 20631
    assert all(np.all(np.diff(c) == 1) and c[0] == 1 for c, _ in engines)
    assert np.isclose(engines[0][1][0], 641.82)  # first row of the file, column 7
