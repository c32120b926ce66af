"""Loaders of the real data sets shipped in ``fedhier/data/bundled`` (see ATTRIBUTION.md there).

The files are gzip-compressed, otherwise unmodified copies; loading reads them with the ``csv``
module and numpy only, never touches the network, and needs no pandas.

* :func:`load_alzheimer` -- Craig-Schapiro et al. (2011) CSF study, 3 views (the open analogue of
  the ADNI views of spec fed-mv-ppca §12.1).
* :func:`load_mfeat` -- UCI Multiple Features, 6 views of handwritten digits.
* :func:`load_heart_disease` -- UCI Heart Disease from 4 hospitals (natural sites).
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from fedhier.data.schema import ViewSchema

__all__ = ["MultiViewDataset", "HeartDisease", "load_alzheimer", "load_mfeat", "load_heart_disease"]

MFEAT_VIEWS = ("fou", "fac", "kar", "pix", "zer", "mor")


@dataclass(frozen=True)
class MultiViewDataset:
    """A pooled multi-view table with class labels.

    Attributes
    ----------
    views : dict ``view name -> float64 ndarray (n, d_view)``
    labels : int ndarray (n,)
        Class of every subject; ``label_names[labels[i]]`` is its name.
    label_names : tuple of str
    feature_names : dict ``view name -> tuple of str (d_view,)``
    description : str
    citation : str
    """

    views: dict[str, np.ndarray]
    labels: np.ndarray
    label_names: tuple[str, ...]
    feature_names: dict[str, tuple[str, ...]]
    description: str
    citation: str

    @property
    def n_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def schema(self) -> ViewSchema:
        return ViewSchema(tuple(self.views), tuple(X.shape[1] for X in self.views.values()))

    def subset(self, indices: Any) -> "MultiViewDataset":
        """The subjects ``indices`` (int array or boolean mask of length n), as a new data set."""
        indices = np.asarray(indices)
        if indices.dtype == bool and indices.shape != (self.n_samples,):
            raise ValueError(f"boolean mask of shape {indices.shape}; expected ({self.n_samples},)")
        if indices.dtype != bool and (indices.ndim != 1 or indices.dtype.kind not in "iu"):
            raise ValueError(
                f"indices must be a 1-D integer array or a boolean mask, got {indices.dtype} {indices.shape}"
            )
        return MultiViewDataset(
            views={v: X[indices] for v, X in self.views.items()},
            labels=self.labels[indices],
            label_names=self.label_names,
            feature_names=self.feature_names,
            description=self.description,
            citation=self.citation,
        )


@dataclass(frozen=True)
class HeartDisease:
    """UCI Heart Disease, one numeric table with the hospital of every patient.

    Attributes
    ----------
    features : float64 ndarray (920, 18); NaN marks a missing value
    feature_names : tuple of str (18,)
    target : int ndarray (920,)
        ``num``: 0 = no disease, 1–4 = increasing severity.
    site_labels : str ndarray (920,)
        Hospital (column ``dataset``): Cleveland, Hungary, Switzerland, VA Long Beach.
    site_names : tuple of str
        The hospitals in first-seen order.
    description, citation : str
    """

    features: np.ndarray
    feature_names: tuple[str, ...]
    target: np.ndarray
    site_labels: np.ndarray
    site_names: tuple[str, ...]
    description: str
    citation: str

    @property
    def n_samples(self) -> int:
        return int(self.target.shape[0])

    def site_indices(self) -> dict[str, np.ndarray]:
        """Rows of each hospital, ``site name -> int ndarray``."""
        return {name: np.flatnonzero(self.site_labels == name) for name in self.site_names}


def _read_csv(name: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a bundled gzip CSV file."""
    raw = resources.files("fedhier.data").joinpath("bundled", name).read_bytes()
    with io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(raw)), encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


_AD_CSF = ("tau", "p_tau", "Ab_42")
_AD_DEMOGRAPHICS = ("age", "male")
_AD_CITATION = (
    "Craig-Schapiro R, Kuhn M, Xiong C, Pickering EH, Liu J, Misko TP, et al. (2011) Multiplexed "
    "Immunoassay Panel Identifies Novel CSF Biomarkers for Alzheimer's Disease Diagnosis and Prognosis. "
    "PLoS ONE 6(4): e18850. Data from the R package modeldata (ad_data; Kuhn & Johnson, Applied "
    "Predictive Modeling, 2013)."
)


def load_alzheimer() -> MultiViewDataset:
    """Alzheimer's disease CSF study (333 subjects: 242 Control, 91 Impaired) as three views.

    Views
    -----
    ``"proteins"`` (333, 124)
        The 124 exploratory plasma/CSF protein measurements, in file order.
    ``"csf"`` (333, 3)
        ``tau``, ``p_tau``, ``Ab_42``.
    ``"demographics"`` (333, 4)
        ``age`` and ``male`` (1 = male) as shipped by modeldata (``age`` is on the transformed scale
        of that package), then the APOE genotype encoded as two allele counts: ``n_apoe_e4`` (number of
        E4 alleles, 0–2; E4 is the risk allele) and ``n_apoe_e2`` (number of E2 alleles, 0–2); e.g.
        E3E4 -> (1, 0), E2E4 -> (1, 1), E3E3 -> (0, 0).

    Labels: ``Class`` Impaired = 1, Control = 0.  No value is missing.
    """
    header, rows = _read_csv("ad_data.csv.gz")
    col = {name: j for j, name in enumerate(header)}
    special = {"rownames", "Genotype", "Class", *_AD_CSF, *_AD_DEMOGRAPHICS}
    proteins = tuple(name for name in header if name not in special)
    genotype = [r[col["Genotype"]] for r in rows]
    for g in set(genotype):
        if len(g) != 4 or g[0] != "E" or g[2] != "E" or not {g[1], g[3]} <= {"2", "3", "4"}:
            raise ValueError(f"ad_data: unexpected APOE genotype {g!r}")
    alleles = np.array([[g.count("4"), g.count("2")] for g in genotype], dtype=np.float64)
    classes = {"Control": 0, "Impaired": 1}
    labels = np.array([classes[r[col["Class"]]] for r in rows], dtype=int)

    def numeric(names: tuple[str, ...]) -> np.ndarray:
        return np.array([[float(r[col[n]]) for n in names] for r in rows], dtype=np.float64)

    views = {
        "proteins": numeric(proteins),
        "csf": numeric(_AD_CSF),
        "demographics": np.hstack([numeric(_AD_DEMOGRAPHICS), alleles]),
    }
    return MultiViewDataset(
        views=views,
        labels=labels,
        label_names=("Control", "Impaired"),
        feature_names={
            "proteins": proteins,
            "csf": _AD_CSF,
            "demographics": (*_AD_DEMOGRAPHICS, "n_apoe_e4", "n_apoe_e2"),
        },
        description=(
            "Alzheimer's disease CSF study (modeldata::ad_data): 333 subjects, 91 with mild cognitive "
            "impairment (label 1) and 242 healthy controls (label 0). Views: 124 plasma/CSF proteins; "
            "CSF tau, p_tau, Ab_42; demographics (age, male) and APOE allele counts (E4, E2)."
        ),
        citation=_AD_CITATION,
    )


def load_mfeat() -> MultiViewDataset:
    """UCI Multiple Features: 2000 handwritten digits (200 per digit 0–9) in six views.

    Views (file ``mfeat-<view>``): ``fou`` 76 Fourier coefficients, ``fac`` 216 profile
    correlations, ``kar`` 64 Karhunen–Loève coefficients, ``pix`` 240 pixel averages, ``zer`` 47
    Zernike moments, ``mor`` 6 morphological features.  Labels: the digit.
    """
    views, feature_names, labels = {}, {}, None
    for view in MFEAT_VIEWS:
        header, rows = _read_csv(f"mfeat-{view}.csv.gz")
        table = np.array(rows, dtype=np.float64)
        digit = table[:, -1].astype(int)
        if labels is None:
            labels = digit
        elif not np.array_equal(labels, digit):
            raise ValueError(f"mfeat: the digit labels of view {view!r} differ from those of view {MFEAT_VIEWS[0]!r}")
        views[view] = np.ascontiguousarray(table[:, :-1])
        feature_names[view] = tuple(f"{view}_{j}" for j in header[:-1])
    return MultiViewDataset(
        views=views,
        labels=labels,
        label_names=tuple(str(d) for d in range(10)),
        feature_names=feature_names,
        description=(
            "UCI Multiple Features (mfeat): 2000 handwritten digits, 200 per class, described by six "
            "views: fou (76), fac (216), kar (64), pix (240), zer (47), mor (6)."
        ),
        citation=(
            "Duin, R. Multiple Features [Dataset]. UCI Machine Learning Repository. Licence CC BY 4.0."
        ),
    )


# Nominal columns: dummy coding against a reference level (levels in the UCI code order).
_HEART_CATEGORIES = {
    "cp": ("typical angina", "atypical angina", "non-anginal", "asymptomatic"),
    "restecg": ("normal", "st-t abnormality", "lv hypertrophy"),
    "slope": ("upsloping", "flat", "downsloping"),
    "thal": ("normal", "fixed defect", "reversable defect"),
}
_HEART_REFERENCE = {"cp": "asymptomatic", "restecg": "normal", "slope": "upsloping", "thal": "normal"}
_HEART_ZERO_IS_MISSING = ("trestbps", "chol")


def load_heart_disease() -> HeartDisease:
    """UCI Heart Disease, 920 patients from 4 hospitals, as numeric features + severity + hospital.

    Encoding of the 18 features (column order):

    * ``age`` (years); ``sex`` 1 = male, 0 = female;
    * ``cp``: indicators ``cp_typical_angina``, ``cp_atypical_angina``, ``cp_non_anginal``
      (reference: asymptomatic);
    * ``trestbps`` (resting blood pressure, mm Hg), ``chol`` (serum cholesterol, mg/dl): a value of 0
      is impossible and means missing -> NaN (chol: all of Switzerland, 49 of VA Long Beach;
      trestbps: 1 patient);
    * ``fbs`` (fasting blood sugar > 120 mg/dl) 1 = True, 0 = False;
    * ``restecg``: indicators ``restecg_st_t_abnormality``, ``restecg_lv_hypertrophy`` (reference: normal);
    * ``thalch`` (maximum heart rate), ``exang`` (exercise-induced angina) 1 = True, ``oldpeak``
      (ST depression);
    * ``slope``: indicators ``slope_flat``, ``slope_downsloping`` (reference: upsloping);
    * ``ca`` (number of major vessels, 0–3);
    * ``thal``: indicators ``thal_fixed_defect``, ``thal_reversable_defect`` (reference: normal).

    An empty cell is missing -> NaN; for a categorical column, all its indicators are NaN.  The
    target is ``num`` (0–4); the site label is the hospital (column ``dataset``).
    """
    header, rows = _read_csv("heart_disease_uci.csv.gz")
    col = {name: j for j, name in enumerate(header)}
    names: list[str] = []
    columns: list[np.ndarray] = []

    def values(name: str) -> list[str]:
        return [r[col[name]] for r in rows]

    def add_number(name: str) -> None:
        x = np.array([float(v) if v != "" else np.nan for v in values(name)])
        if name in _HEART_ZERO_IS_MISSING:
            x[x == 0] = np.nan
        names.append(name)
        columns.append(x)

    def add_binary(name: str, true: str, false: str) -> None:
        coding = {true: 1.0, false: 0.0, "": np.nan}
        unknown = set(values(name)) - set(coding)
        if unknown:
            raise ValueError(f"heart disease: unexpected values {sorted(unknown)} in column {name!r}")
        names.append(name)
        columns.append(np.array([coding[v] for v in values(name)]))

    def add_dummies(name: str) -> None:
        levels = _HEART_CATEGORIES[name]
        unknown = set(values(name)) - set(levels) - {""}
        if unknown:
            raise ValueError(f"heart disease: unexpected values {sorted(unknown)} in column {name!r}")
        for level in levels:
            if level == _HEART_REFERENCE[name]:
                continue
            names.append(f"{name}_{level.replace(' ', '_').replace('-', '_')}")
            columns.append(np.array([np.nan if v == "" else float(v == level) for v in values(name)]))

    add_number("age")
    add_binary("sex", "Male", "Female")
    add_dummies("cp")
    add_number("trestbps")
    add_number("chol")
    add_binary("fbs", "True", "False")
    add_dummies("restecg")
    add_number("thalch")
    add_binary("exang", "True", "False")
    add_number("oldpeak")
    add_dummies("slope")
    add_number("ca")
    add_dummies("thal")

    site_labels = np.array(values("dataset"))
    _, first = np.unique(site_labels, return_index=True)
    site_names = tuple(str(site_labels[i]) for i in np.sort(first))
    return HeartDisease(
        features=np.column_stack(columns),
        feature_names=tuple(names),
        target=np.array([int(v) for v in values("num")], dtype=int),
        site_labels=site_labels,
        site_names=site_names,
        description=(
            "UCI Heart Disease: 920 patients from 4 hospitals (Cleveland 304, Hungary 293, VA Long Beach "
            "200, Switzerland 123); 18 numeric features (categoricals dummy-coded, missing = NaN, "
            "chol == 0 and trestbps == 0 treated as missing); target num = disease severity 0-4."
        ),
        citation=(
            "Janosi, A., Steinbrunn, W., Pfisterer, M., Detrano, R. Heart Disease [Dataset]. "
            "UCI Machine Learning Repository. Licence CC BY 4.0."
        ),
    )
