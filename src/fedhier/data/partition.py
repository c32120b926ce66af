"""Site partitions of one pooled table: the scenarios of spec fed-mv-ppca §12.2 (Table 1).

With C sites and m = C/3, sites 1..m are type A, m+1..2m type B and 2m+1..3m type C
(0-based in code: sites 0..m-1 are A, and so on).

========  =======================================================  ============================================
scenario  subjects (groups)                                         views
========  =======================================================  ============================================
iid       stratified random split into C equal parts              all views everywhere
G         A: both groups; B: group 1 only; C: group 2 only         all views everywhere
K         as iid                                                   A all; B lacks view 2; C lacks view 3
GK        as G                                                     as K, with the same site blocks
========  =======================================================  ============================================

[R] rules used where the paper is silent (spec §12.2, §14 rows 21–23):

* G and GK group sizes: the A sites together receive a third of each group (``round(n_g / 3)``
  subjects of group g), split evenly among them; the remaining group-1 subjects are split evenly over
  the B sites and the remaining group-2 subjects over the C sites.
* C = 6 pairs the roles by block: B = group 1 and missing view 2, C = group 2 and missing view 3.
* A missing view is deleted (absent from the mapping) for all subjects of the affected sites.
* Test sets in K and GK: random thirds with all views / no view 2 / no view 3 (:func:`mask_test_views`).

"Evenly" means sizes that differ by at most one, the larger parts first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

__all__ = [
    "SCENARIOS",
    "Partition",
    "partition",
    "split_by_column",
    "mask_test_views",
    "repeated_stratified_folds",
]

SCENARIOS = ("iid", "G", "K", "GK")


@dataclass(frozen=True)
class Partition:
    """Sites cut from one pooled table.

    Attributes
    ----------
    sites : list of dict ``view name -> ndarray (n_c, d_view)``
        The data of each site; views a site lacks are absent from its mapping.
    indices : list of int ndarray (n_c,)
        Rows of the pooled table held by each site (disjoint; together every row once).
    missing : list of tuple of str
        Views absent at each site.
    site_types : tuple of str
        ``"A"``, ``"B"`` or ``"C"`` per site (all ``"A"`` in the iid scenario).
    scenario : str
        One of ``"iid"``, ``"G"``, ``"K"``, ``"GK"``.
    """

    sites: list[dict[str, np.ndarray]]
    indices: list[np.ndarray]
    missing: list[tuple[str, ...]]
    site_types: tuple[str, ...]
    scenario: str

    @property
    def n_sites(self) -> int:
        return len(self.sites)


def partition(
    views: Mapping[str, Any],
    labels: Any,
    n_sites: int,
    scenario: str,
    *,
    random_state: Any,
    group1: Any = 1,
    missing_views: tuple[str, str] | None = None,
) -> Partition:
    """Distribute the rows of a pooled table over ``n_sites`` sites per a scenario of spec §12.2.

    Parameters
    ----------
    views : mapping ``view name -> array (n, d_view)``
        The pooled (training) table; all views have n rows.
    labels : array-like (n,)
        Group / class label of every row; used for stratification and for the G roles.
    n_sites : int
        C.  Any C >= 1 for ``"iid"``; a multiple of 3 for ``"G"``, ``"K"``, ``"GK"``.
    scenario : {"iid", "G", "K", "GK"}
        ``"G/K"`` is accepted for ``"GK"`` (case-insensitive).
    random_state : None, int or numpy Generator
        Required, so that every partition is reproducible on purpose (None = fresh entropy).
    group1 : label value, default 1
        Rows with ``labels == group1`` form group 1 (AD in the paper); all other rows form group 2.
    missing_views : (view_b, view_c), optional
        Views deleted at the B and C sites in K and GK; default the 2nd and 3rd views in
        mapping order.

    Returns
    -------
    Partition

    Raises
    ------
    ValueError
        On an unknown scenario, a C that is not a multiple of 3 where required, fewer rows than
        sites, row-count mismatches, a G/GK table where a group is empty, or unknown/too few views
        for K/GK.
    """
    scenario = _scenario(scenario)
    views, n = _pooled(views)
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise ValueError(f"labels has shape {labels.shape}; expected ({n},), one label per row of the views")
    if isinstance(n_sites, bool) or not isinstance(n_sites, (int, np.integer)) or n_sites < 1:
        raise ValueError(f"n_sites must be a positive integer, got {n_sites!r}")
    if scenario != "iid" and n_sites % 3 != 0:
        raise ValueError(
            f"scenario {scenario!r} needs a number of sites that is a multiple of 3 (types A, B, C), got {n_sites}"
        )
    if n < n_sites:
        raise ValueError(f"{n} rows cannot fill {n_sites} sites")
    drop: dict[str, tuple[str, ...]] = {"A": (), "B": (), "C": ()}
    if scenario in ("K", "GK"):
        view_b, view_c = _missing_pair(views, missing_views)
        drop = {"A": (), "B": (view_b,), "C": (view_c,)}
    rng = np.random.default_rng(random_state)
    m = n_sites // 3

    if scenario in ("iid", "K"):
        parts = _stratified_parts(labels, n_sites, rng)
    else:
        in_group1 = labels == group1
        group_rows = [np.flatnonzero(in_group1), np.flatnonzero(~in_group1)]
        for g, rows in enumerate(group_rows, start=1):
            if rows.size == 0:
                raise ValueError(f"scenario {scenario!r}: group {g} is empty (group 1 is labels == {group1!r})")
        shares_a, rest = [], []
        for rows in group_rows:
            rows = rng.permutation(rows)
            n_a = round(rows.size / 3)
            shares_a.append(rows[:n_a])
            rest.append(rows[n_a:])
        parts = [np.concatenate(pair) for pair in zip(*(np.array_split(s, m) for s in shares_a))]
        parts += np.array_split(rest[0], m) + np.array_split(rest[1], m)
    parts = [np.sort(p) for p in parts]
    if any(p.size == 0 for p in parts):
        raise ValueError(f"scenario {scenario!r} with {n_sites} sites leaves a site without rows ({n} rows)")

    site_types = ("A",) * n_sites if scenario == "iid" else ("A",) * m + ("B",) * m + ("C",) * m
    missing = [drop[t] for t in site_types]
    sites = [
        {v: X[idx] for v, X in views.items() if v not in gone} for idx, gone in zip(parts, missing)
    ]
    return Partition(sites=sites, indices=parts, missing=missing, site_types=site_types, scenario=scenario)


def split_by_column(views: Mapping[str, Any], groups: Any) -> tuple[list[dict[str, np.ndarray]], tuple]:
    """Natural sites: one site per distinct value of ``groups`` (e.g. the hospital of each row).

    Parameters
    ----------
    views : mapping ``view name -> array (n, d_view)``
    groups : array-like (n,)

    Returns
    -------
    sites : list of dict ``view name -> ndarray (n_c, d_view)``, rows in their original order
    site_names : tuple of the group values, in first-seen order
    """
    views, n = _pooled(views)
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups has shape {groups.shape}; expected ({n},), one site label per row")
    names, first = np.unique(groups, return_index=True)
    names = names[np.argsort(first)]
    sites = [{v: X[groups == name] for v, X in views.items()} for name in names]
    return sites, tuple(name.item() if isinstance(name, np.generic) else name for name in names)


def mask_test_views(
    views: Mapping[str, Any],
    scenario: str,
    *,
    random_state: Any,
    missing_views: tuple[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """Test-set missingness of spec §12.2 / §14 row 23.

    In K and GK the test rows are cut into random thirds (sizes differing by at most one): the
    first keeps all views, the second lacks view 2 and the third lacks view 3, written as NaN rows.
    In iid and G a copy of the views is returned unchanged.

    Parameters
    ----------
    views : mapping ``view name -> array (n, d_view)``
    scenario : {"iid", "G", "K", "GK"} (``"G/K"`` accepted)
    random_state : None, int or numpy Generator
    missing_views : (view_2, view_3), optional; default the 2nd and 3rd views.

    Returns
    -------
    dict ``view name -> float64 ndarray (n, d_view)``
    """
    scenario = _scenario(scenario)
    views, n = _pooled(views)
    out = {v: np.array(X, dtype=np.float64, copy=True) for v, X in views.items()}
    if scenario in ("K", "GK"):
        view_b, view_c = _missing_pair(views, missing_views)
        rng = np.random.default_rng(random_state)
        _, lack_b, lack_c = np.array_split(rng.permutation(n), 3)
        out[view_b][lack_b] = np.nan
        out[view_c][lack_c] = np.nan
    return out


def repeated_stratified_folds(
    labels: Any, n_splits: int = 3, n_repeats: int = 10, *, random_state: Any
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Repeated stratified K-fold CV of spec §12.3 (10 x 3-fold, stratified by group).

    A thin wrapper over ``sklearn.model_selection.RepeatedStratifiedKFold``.

    Parameters
    ----------
    labels : array-like (n,), the groups to stratify by
    n_splits, n_repeats : int
    random_state : None, int or numpy Generator (a Generator is turned into one integer seed)

    Yields
    ------
    repeat : int, fold : int, train_idx : int ndarray, test_idx : int ndarray
    """
    from sklearn.model_selection import RepeatedStratifiedKFold

    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if isinstance(random_state, np.random.Generator):
        random_state = int(random_state.integers(2**31 - 1))
    splitter = RepeatedStratifiedKFold(n_splits=n_splits, n_repeats=n_repeats, random_state=random_state)
    for i, (train, test) in enumerate(splitter.split(np.zeros((labels.size, 1)), labels)):
        yield i // n_splits, i % n_splits, train, test


def _scenario(scenario: str) -> str:
    key = str(scenario).replace("/", "").upper()
    if key == "IID":
        return "iid"
    if key in ("G", "K", "GK"):
        return key
    raise ValueError(f"unknown scenario {scenario!r}; expected one of 'iid', 'G', 'K', 'GK' (or 'G/K')")


def _pooled(views: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """The pooled table as float64 arrays, checking one common row count."""
    if not isinstance(views, Mapping) or not views:
        raise ValueError("views must be a non-empty mapping 'view name -> array (n, d)'")
    arrays = {v: np.asarray(X, dtype=np.float64) for v, X in views.items()}
    for v, X in arrays.items():
        if X.ndim != 2:
            raise ValueError(f"view {v!r}: expected a 2-D array (n, d), got shape {X.shape}")
    rows = {v: X.shape[0] for v, X in arrays.items()}
    if len(set(rows.values())) != 1:
        raise ValueError(f"the views have different numbers of rows {rows}")
    return arrays, next(iter(rows.values()))


def _missing_pair(views: Mapping[str, Any], missing_views: Sequence[str] | None) -> tuple[str, str]:
    names = list(views)
    if missing_views is None:
        if len(names) < 3:
            raise ValueError(
                f"scenarios K and GK delete view 2 and view 3, but only {len(names)} views are given {names}; "
                "pass missing_views=(view_b, view_c)"
            )
        return names[1], names[2]
    if len(missing_views) != 2:
        raise ValueError(f"missing_views must be a pair (view_b, view_c), got {missing_views!r}")
    for v in missing_views:
        if v not in views:
            raise ValueError(f"missing_views names unknown view {v!r}; views are {names}")
    return missing_views[0], missing_views[1]


def _stratified_parts(labels: np.ndarray, n_parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Stratified random split of range(n) into n_parts parts of sizes differing by at most one.

    Rows are shuffled within each label and laid out label after label; position i goes to part
    ``i mod n_parts``.  Each label is then spread over the parts within one row, and so is the total.
    """
    order = np.concatenate([rng.permutation(np.flatnonzero(labels == y)) for y in np.unique(labels)])
    position = np.arange(order.size) % n_parts
    return [order[position == p] for p in range(n_parts)]
