"""Loaders for the FedLin data (spec §8.4–8.5 and the two grouped sets), from the bundled copies.

Every loader returns sites as ``(X (n_k, d), y (n_k,))`` pairs plus names; sources and licences
are in ``fedhier/data/bundled/fedlin/ATTRIBUTION.md``.
"""

from __future__ import annotations

import csv
import gzip
import io
from importlib import resources

import numpy as np

__all__ = ["load_radon", "load_heart", "load_student", "load_cmapss", "STUDENT_NUMERIC", "STUDENT_BINARY", "STUDENT_NOMINAL"]


def _open_text(name: str) -> str:
    """A gzipped file of ``fedhier/data/bundled/fedlin/`` (or of ``bundled/`` when shared with other loaders)."""
    folder = resources.files("fedhier.data").joinpath("bundled")
    path = folder.joinpath("fedlin", name) if folder.joinpath("fedlin", name).is_file() else folder.joinpath(name)
    with path.open("rb") as fh:
        return gzip.decompress(fh.read()).decode("utf-8")


def _rows(name: str, delimiter: str = ",") -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_open_text(name)), delimiter=delimiter))


def load_radon():
    """Minnesota radon, one site per county (85).

    Returns
    -------
    sites : list of (X (n_k, 3), y (n_k,))
        Columns of X: intercept, ``basement`` (0 basement, 1 first floor), county ``uranium``;
        y = ``log.radon``.
    names : list of str
        County names, in order of first appearance.
    features : list of str
    """
    rows = _rows("radon.csv.gz")
    groups: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault(r["county.name"], []).append(r)
    sites = []
    for part in groups.values():
        X = np.array([[1.0, float(r["basement"]), float(r["uranium"])] for r in part])
        sites.append((X, np.array([float(r["log.radon"]) for r in part])))
    return sites, list(groups), ["intercept", "basement", "uranium"]


HEART_FEATURES = ["intercept", "age", "male", "trestbps", "exang", "disease"]


def load_heart():
    """UCI Heart Disease, one site per hospital (Cleveland, Hungary, Switzerland, VA Long Beach).

    Regression of the maximum heart rate ``thalch`` on an intercept, ``age`` (years, centred at 50),
    sex (1 = male), resting blood pressure ``trestbps`` (centred at 130, in units of 10 mmHg),
    exercise-induced angina ``exang`` (0/1) and disease (``num`` > 0). Rows missing any of these
    are dropped (``trestbps`` = 0 counts as missing).

    Returns
    -------
    sites, names, features
    """
    rows = _rows("heart_disease_uci.csv.gz")
    groups: dict[str, list[list[float]]] = {}
    for r in rows:
        need = [r["age"], r["sex"], r["trestbps"], r["exang"], r["num"], r["thalch"]]
        if any(v == "" for v in need) or float(r["trestbps"]) == 0:
            continue
        x = [1.0, (float(r["age"]) - 50) / 10, float(r["sex"] == "Male"), (float(r["trestbps"]) - 130) / 10, float(r["exang"] == "True"), float(int(r["num"]) > 0)]
        groups.setdefault(r["dataset"], []).append(x + [float(r["thalch"])])
    names = sorted(groups)
    sites = []
    for n in names:
        a = np.array(groups[n])
        sites.append((a[:, :-1], a[:, -1]))
    return sites, names, HEART_FEATURES


STUDENT_NUMERIC = ["age", "Medu", "Fedu", "traveltime", "studytime", "failures", "famrel", "freetime", "goout", "Dalc", "Walc", "health", "absences"]
STUDENT_BINARY = ["sex", "address", "famsize", "Pstatus", "schoolsup", "famsup", "paid", "activities", "nursery", "higher", "internet", "romantic"]
STUDENT_NOMINAL = ["Mjob", "Fjob", "reason", "guardian"]


def load_student(course: str = "por"):
    """UCI Student Performance (spec §8.4), one site per school (GP, MS), raw coding.

    The 38 predictors of the paper: 13 numeric columns (unstandardised here; the experiment
    standardises with training statistics), 12 binary columns as one 0/1 dummy each (1 = the
    level sorted last, e.g. ``sex`` M, ``schoolsup`` yes) and 4 nominal columns with k-1 dummies
    (first sorted level dropped). Target: final grade G3 (G1, G2 and school dropped).

    Returns
    -------
    sites : list of (X (n_k, 38), y (n_k,))
    names : ["GP", "MS"]
    features : list of 38 str
    """
    if course not in ("por", "mat"):
        raise ValueError(f"course must be 'por' or 'mat', got {course!r}")
    rows = _rows(f"student-{course}.csv.gz", delimiter=";")
    levels = {c: sorted({r[c] for r in rows}) for c in STUDENT_BINARY + STUDENT_NOMINAL}
    features = list(STUDENT_NUMERIC)
    features += [f"{c}={levels[c][-1]}" for c in STUDENT_BINARY]
    features += [f"{c}={lv}" for c in STUDENT_NOMINAL for lv in levels[c][1:]]

    def encode(r):
        x = [float(r[c]) for c in STUDENT_NUMERIC]
        x += [float(r[c] == levels[c][-1]) for c in STUDENT_BINARY]
        x += [float(r[c] == lv) for c in STUDENT_NOMINAL for lv in levels[c][1:]]
        return x

    names = ["GP", "MS"]
    sites = []
    for school in names:
        part = [r for r in rows if r["school"] == school]
        sites.append((np.array([encode(r) for r in part]), np.array([float(r["G3"]) for r in part])))
    return sites, names, features


CMAPSS_SENSOR_COLUMNS = {2: 7, 3: 8, 7: 12, 8: 13}


def load_cmapss(sensor: int = 2):
    """C-MAPSS FD001 training trajectories (spec §8.5): one site per engine (100).

    Parameters
    ----------
    sensor : {2, 3, 7, 8}
        The paper's sensor number (file column ``5 + sensor``).

    Returns
    -------
    engines : list of (cycle (n_k,), value (n_k,))
        Raw cycles and sensor values, in time order.
    """
    if sensor not in CMAPSS_SENSOR_COLUMNS:
        raise ValueError(f"sensor must be one of {sorted(CMAPSS_SENSOR_COLUMNS)}, got {sensor!r}")
    data = np.loadtxt(io.StringIO(_open_text("train_FD001.txt.gz")))
    col = CMAPSS_SENSOR_COLUMNS[sensor] - 1
    engines = []
    for unit in np.unique(data[:, 0]):
        part = data[data[:, 0] == unit]
        order = np.argsort(part[:, 1])
        engines.append((part[order, 1], part[order, col]))
    return engines
