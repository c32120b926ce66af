"""Paired comparisons: the basis of every "A is better than B" on a results page.

Two methods run on the same folds / seeds / splits give paired results
:math:`(a_i, b_i)`, :math:`i = 1..n`.  With :math:`d_i = a_i - b_i`, the mean difference
:math:`\\bar d` has the Student-t confidence interval

.. math::  \\bar d \\pm t_{1-(1-\\ell)/2,\\,n-1}\\; s_d / \\sqrt n ,

(:math:`s_d` the sample standard deviation of the :math:`d_i`, ddof 1, :math:`\\ell` the level),
the interval of ``scipy.stats.ttest_rel(a, b).confidence_interval(ℓ)``.  The sentence a page
may state follows from it alone: "A lower than B" only when the whole interval is below 0,
"A higher than B" only when it is above 0, otherwise "no difference detected".  The count of
pairs where A is lower is reported beside it.

Rows that share a pair key and a group are averaged first (e.g. the three folds of one
repetition of 3-fold CV, whose training sets overlap, become one pair; or the sites of one
split), so the pairs entering the interval are the independent units of the design.  Undefined
values (NaN: an AUC at a site without anomalies, a method that does not apply) are left out of
these averages, and a key with no defined value on either side is no pair; a pair with an
infinite value (a diverged fit) is left out and counted.  A table lists only comparisons with at
least one pair.

A page states a comparison through :func:`paired_block`: an HTML comment holding the
specification (CSV file, metric, pair key, groups, methods) followed by the table and the
sentences.  ``tests/experiments/test_page_claims.py`` finds every such block on the docs pages,
re-derives it from the CSV stored beside the page and checks the page says exactly that.
"""

from __future__ import annotations

import csv
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

__all__ = [
    "PairedComparison",
    "paired",
    "compare",
    "paired_table",
    "paired_block",
    "read_csv",
    "find_blocks",
    "render_block",
    "BLOCK",
]

#: default level of the intervals on the pages
LEVEL = 0.95


@dataclass(frozen=True)
class PairedComparison:
    """Method ``a`` against method ``b`` on one metric over ``n`` pairs.

    Attributes
    ----------
    a, b : str
        Method names.
    metric : str
    group : dict
        The group this comparison belongs to (e.g. ``{"case": "III"}``); empty for none.
    n : int
        Pairs used (both values finite).
    dropped : int
        Pairs left out because a value was not finite.
    mean_a, mean_b, mean_diff : float
        Means over the used pairs; ``mean_diff = mean(a - b)``.
    ci_low, ci_high : float
        Student-t interval of the mean difference at ``level`` (NaN with fewer than 2 pairs).
    a_lower, a_higher : int
        Pairs where ``a < b``, ``a > b``.
    level : float
    """

    a: str
    b: str
    metric: str
    group: Mapping[str, Any]
    n: int
    dropped: int
    mean_a: float
    mean_b: float
    mean_diff: float
    ci_low: float
    ci_high: float
    a_lower: int
    a_higher: int
    level: float = LEVEL

    @property
    def verdict(self) -> str:
        """``"lower"``, ``"higher"`` (A against B, the interval excludes 0) or ``"none"``."""
        if not (np.isfinite(self.ci_low) and np.isfinite(self.ci_high)):
            return "none"
        if self.ci_high < 0:
            return "lower"
        if self.ci_low > 0:
            return "higher"
        return "none"

    def sentence(self) -> str:
        """The claim the comparison supports, in words."""
        if self.verdict == "lower":
            return f"{self.a} lower than {self.b}"
        if self.verdict == "higher":
            return f"{self.a} higher than {self.b}"
        return f"no difference detected between {self.a} and {self.b}"


def paired(a: Sequence[float], b: Sequence[float], *, level: float = LEVEL) -> tuple[float, float, float]:
    """Mean of ``a - b`` and its Student-t interval ``(mean, low, high)``; finite pairs only.

    Zero spread gives the point interval ``(d, d)``; fewer than two pairs give NaN bounds.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d and of equal length, got shapes {a.shape} and {b.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    if d.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(d.mean())
    if d.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return mean, mean - half, mean + half


def _number(value: Any) -> float:
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _key(row: Mapping[str, Any], columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(row[c]) for c in columns)


def compare(
    rows: Iterable[Mapping[str, Any]],
    a: str,
    b: str,
    metric: str,
    *,
    pair_on: Sequence[str],
    group: Mapping[str, Any] | None = None,
    method_column: str = "method",
    level: float = LEVEL,
) -> PairedComparison:
    """Compare methods ``a`` and ``b`` on ``metric`` over the rows of ``group``.

    Parameters
    ----------
    rows : iterable of dict
        One row per (pair key, method), e.g. a ``results.csv`` read by :func:`read_csv`.
    pair_on : sequence of str
        Columns identifying a pair (e.g. ``("run",)``, ``("repeat",)``). Rows of one method
        sharing a pair key are averaged first.
    group : dict, optional
        Only rows whose columns equal these values (compared as text).
    """
    group = dict(group or {})
    values: dict[str, dict[tuple, list[float]]] = {a: {}, b: {}}
    for row in rows:
        method = row.get(method_column)
        if method not in values or any(str(row.get(k)) != str(v) for k, v in group.items()):
            continue
        values[method].setdefault(_key(row, pair_on), []).append(_number(row.get(metric)))
    keys = [k for k in values[a] if k in values[b]]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a key whose values are all undefined stays NaN
        xa = np.array([np.nanmean(values[a][k]) for k in keys])
        xb = np.array([np.nanmean(values[b][k]) for k in keys])
    defined = ~np.isnan(xa) & ~np.isnan(xb)
    xa, xb = xa[defined], xb[defined]
    ok = np.isfinite(xa) & np.isfinite(xb)
    mean, low, high = paired(xa, xb, level=level)
    return PairedComparison(
        a=a, b=b, metric=metric, group=group, n=int(ok.sum()), dropped=int((~ok).sum()),
        mean_a=float(xa[ok].mean()) if ok.any() else math.nan, mean_b=float(xb[ok].mean()) if ok.any() else math.nan,
        mean_diff=mean, ci_low=low, ci_high=high, a_lower=int((xa[ok] < xb[ok]).sum()), a_higher=int((xa[ok] > xb[ok]).sum()),
        level=level,
    )


def _g(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.4g}"


def _signed(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:+.3g}"


def paired_table(comparisons: Sequence[PairedComparison], *, lower_is_better: bool = True) -> str:
    """Markdown table: group columns, A, B, pairs, means, A − B with its interval, A better in, reading."""
    if not comparisons:
        return ""
    group_cols = list(dict.fromkeys(k for c in comparisons for k in c.group))
    level = comparisons[0].level
    wins = "A lower (better) in" if lower_is_better else "A higher (better) in"
    head = group_cols + ["A", "B", "pairs", "mean A", "mean B", "mean A − B", f"{level:.0%} t-interval of A − B", wins, "reading"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in comparisons:
        pairs = f"{c.n}" + (f" ({c.dropped} not finite, left out)" if c.dropped else "")
        cells = [str(c.group.get(k, "")) for k in group_cols] + [
            c.a, c.b, pairs, _g(c.mean_a), _g(c.mean_b), _signed(c.mean_diff),
            f"[{_signed(c.ci_low)}, {_signed(c.ci_high)}]", f"{c.a_lower if lower_is_better else c.a_higher} of {c.n}", c.sentence(),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- blocks on pages
#: a paired block on a page: the specification (JSON) and the body
BLOCK = re.compile(r"<!-- paired (\{.*?\}) -->\n(.*?)<!-- /paired -->", re.S)


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV file as text (values are parsed where they are compared)."""
    with Path(path).open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _comparisons(rows: Sequence[Mapping[str, Any]], spec: Mapping[str, Any]) -> list[PairedComparison]:
    """The comparisons of ``spec`` that have at least one pair (used or left out)."""
    groups = spec.get("groups") or [{}]
    comps = (
        compare(rows, a, b, spec["metric"], pair_on=spec["pair_on"], group=g, method_column=spec.get("method_column", "method"),
                level=spec.get("level", LEVEL))
        for g in groups for a, b in spec["pairs"]
    )
    return [c for c in comps if c.n + c.dropped > 0]


def render_block(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """The text between the opening comment and ``<!-- /paired -->`` for ``spec`` on ``rows``."""
    comps = _comparisons(rows, spec)
    what = spec.get("what", spec["metric"])
    better = "lower" if spec.get("lower_is_better", True) else "higher"
    unit = spec.get("unit", "run")
    level = spec.get("level", LEVEL)
    intro = (
        f"Paired comparison of {what} ({better} is better) over the same {unit}s: mean of A − B and its "
        f"{level:.0%} Student-t interval over the paired differences; a difference is stated only where the "
        f"interval excludes 0. Data: [`{spec['csv']}`]({spec['csv']}).\n\n"
    )
    return intro + paired_table(comps, lower_is_better=spec.get("lower_is_better", True))


def paired_block(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """A page block: the specification as an HTML comment, the table, and a closing comment.

    ``spec`` keys: ``csv`` (path of the stored CSV relative to the page), ``metric``,
    ``pair_on`` (list), ``pairs`` (list of ``[A, B]``), optional ``groups`` (list of dicts),
    ``what`` (the metric in words), ``lower_is_better`` (default True), ``unit`` (what a pair
    is, default "run"), ``method_column`` and ``level``.  ``rows`` must be the stored CSV
    read back (:func:`read_csv`) so that the page and the file agree to the digit.
    """
    spec = json.loads(json.dumps(spec))
    return f"<!-- paired {json.dumps(spec, ensure_ascii=False)} -->\n{render_block(spec, rows)}<!-- /paired -->\n"


def find_blocks(text: str) -> list[tuple[dict[str, Any], str]]:
    """Every ``(spec, body)`` of the paired blocks in a page's text."""
    return [(json.loads(m.group(1)), m.group(2)) for m in BLOCK.finditer(text)]
