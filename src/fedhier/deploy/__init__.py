"""Fits on real machines: each model family's :class:`~fedhier.runtime.flower.Deployment`.

The Flower runtime (:mod:`fedhier.runtime.flower`) knows rounds, messages, sites and
failures; this package tells it what a fit of each family is -- its ``fit.toml``, its round
protocol, how a site reads its own file, and how the final broadcast becomes the family's
fitted model.  ``model = "..."`` in ``fit.toml`` names the family:

========================  =====================================================  =====================================
``model``                 estimator                                              deployment
========================  =====================================================  =====================================
``"fed-mv-ppca"``         :class:`fedhier.estimators.mvppca.FedMVPPCA`            :class:`fedhier.deploy.mvppca.FlowerFitConfig`
``"fedlin-hm1"``          :class:`fedhier.estimators.fedlin.FedHM1Regressor`      :class:`fedhier.deploy.fedlin.FedLinFitConfig`
``"fedlin-hm2"``          :class:`fedhier.estimators.fedlin.FedHM2Regressor`      :class:`fedhier.deploy.fedlin.FedLinFitConfig`
========================  =====================================================  =====================================

A ``fit.toml`` without ``model`` is a Fed-mv-PPCA fit.  Only the module of the family in
use is imported.  The Flower apps themselves are in :mod:`fedhier.deploy.apps`.
"""

from __future__ import annotations

import json
import tomllib
from importlib import import_module
from pathlib import Path
from typing import Any

__all__ = ["MODELS", "read_fit", "fit_from_toml", "fit_from_json"]

#: ``model`` name -> (module, class) of its deployment
MODELS = {
    "fed-mv-ppca": ("fedhier.deploy.mvppca", "FlowerFitConfig"),
    "fedlin-hm1": ("fedhier.deploy.fedlin", "FedLinFitConfig"),
    "fedlin-hm2": ("fedhier.deploy.fedlin", "FedLinFitConfig"),
}
_DEFAULT = "fed-mv-ppca"


def _family(model: Any, source: str):
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"{source}: model must be one of {sorted(MODELS)}, got {model!r}")
    module, name = MODELS[model]
    return getattr(import_module(module), name)


def fit_from_toml(text: str, source: str = "fit.toml"):
    """The deployment described by the TOML text of a ``fit.toml``; ValueError naming ``source`` and the key."""
    try:
        model = tomllib.loads(text).get("model", _DEFAULT)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: invalid TOML: {exc}") from exc
    return _family(model, source).from_toml(text, source)


def read_fit(path: str | Path):
    """Read a ``fit.toml`` (any family); a relative ``out`` is resolved against the file's folder."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"fit configuration {path} does not exist")
    try:
        model = tomllib.loads(path.read_text()).get("model", _DEFAULT)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from exc
    return _family(model, str(path)).read(path)


def fit_from_json(text: str):
    """The deployment of a Flower run config (``Deployment.to_json``)."""
    fields = json.loads(text)
    return _family(fields.get("model", _DEFAULT), "run configuration").from_json(text)
