"""Every paired comparison on a docs page is what its stored CSV gives, and says only what the interval supports."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedhier.experiments.docs import write_section
from fedhier.experiments.paired import find_blocks, paired_block, read_csv, render_block
from fedhier.utils.io import write_csv

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "experiments").glob("*.md"))]
BLOCKS = [(page, spec, body) for page in PAGES if page.exists() for spec, body in find_blocks(page.read_text(encoding="utf-8"))]


def _ids():
    return [f"{page.name}:{spec['csv']}:{spec['metric']}" for page, spec, _ in BLOCKS]


def test_the_results_pages_have_paired_comparisons():
    pages = {page.name for page, _, _ in BLOCKS}
    assert {"fedlin.md", "collabdict.md"} <= pages


@pytest.mark.parametrize(("page", "spec", "body"), BLOCKS, ids=_ids())
def test_block_is_rederived_from_its_csv(page, spec, body):
    csv = page.parent / spec["csv"]
    assert csv.is_file(), f"{page.name}: the data of a claim, {spec['csv']}, is missing"
    assert body == render_block(spec, read_csv(csv)), f"{page.name}: a paired table does not match {spec['csv']}; regenerate the page"


def _pairs(rows, spec, group, method):
    """``pair key -> mean metric`` of one method (independent of the module under test)."""
    out: dict[tuple, list[float]] = {}
    for r in rows:
        if r[spec.get("method_column", "method")] == method and all(r[k] == str(v) for k, v in group.items()):
            out.setdefault(tuple(r[k] for k in spec["pair_on"]), []).append(float(r[spec["metric"]] or "nan"))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {k: np.nanmean(v) for k, v in out.items()}


@pytest.mark.parametrize(("page", "spec", "body"), BLOCKS, ids=_ids())
def test_a_difference_is_stated_only_where_the_interval_excludes_zero(page, spec, body):
    rows = read_csv(page.parent / spec["csv"])
    lines = body.splitlines()
    for group in spec.get("groups") or [{}]:
        for a, b in spec["pairs"]:
            xa, xb = _pairs(rows, spec, group, a), _pairs(rows, spec, group, b)
            if not any(k in xb and not np.isnan(xa[k]) and not np.isnan(xb[k]) for k in xa):
                continue  # no pair: the table has no row for it
            keys = [k for k in xa if k in xb and np.isfinite(xa[k]) and np.isfinite(xb[k])]
            va, vb = np.array([xa[k] for k in keys]), np.array([xb[k] for k in keys])
            if len(keys) < 2:
                expected = f"no difference detected between {a} and {b}"
            elif np.all(va - vb == va[0] - vb[0]):  # no spread: scipy gives no interval, the point is the interval
                d = va[0] - vb[0]
                expected = f"{a} lower than {b}" if d < 0 else f"{a} higher than {b}" if d > 0 else f"no difference detected between {a} and {b}"
            else:
                ci = stats.ttest_rel(va, vb).confidence_interval(spec.get("level", 0.95))
                expected = (f"{a} lower than {b}" if ci.high < 0 else f"{a} higher than {b}" if ci.low > 0
                            else f"no difference detected between {a} and {b}")
            row = [ln for ln in lines if ln.startswith("| ") and f"| {a} | {b} |" in ln
                   and all(f"| {v} |" in ln for v in group.values())]
            assert row, f"{page.name}: no row for {a} vs {b} in {group}"
            assert any(ln.rstrip().endswith(f"| {expected} |") for ln in row), (page.name, group, a, b, expected, row)


UNSUPPORTED = ("within run-to-run noise", "which is the paper's ordering", "less accurate", "most accurate federated method")


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=lambda p: p.name)
def test_no_claim_the_data_do_not_support(page):
    text = page.read_text(encoding="utf-8")
    for phrase in UNSUPPORTED:
        assert phrase not in text, f"{page.name} says {phrase!r}, which its paired comparisons do not support"


def test_write_section_copies_the_data_and_rederives_the_claims(tmp_path):
    run = tmp_path / "run"
    rows = [{"run": r, "method": m, "err": v} for r in range(6) for m, v in (("A", 1.0 + 0.01 * r), ("B", 2.0 - 0.02 * r))]
    write_csv(run / "fedlin-toy.csv", rows)
    spec = {"csv": "fedlin-toy.csv", "metric": "err", "pair_on": ["run"], "pairs": [["A", "B"]]}
    (run / "fedlin-toy.md").write_text("# Toy\n\nProduced by `x`.\n\n## Paired comparisons\n\n" + paired_block(spec, read_csv(run / "fedlin-toy.csv")))
    page = tmp_path / "docs" / "fedlin.md"
    page.parent.mkdir()
    page.write_text("# Page\n\n<!-- section fedlin-toy -->\nold text\n<!-- /section fedlin-toy -->\n\n## Next\n")
    write_section(run, page)
    text = page.read_text()
    assert "old text" not in text and "### Toy" in text and "#### Paired comparisons" in text and text.endswith("## Next\n")
    [(found, body)] = find_blocks(text)
    assert found["csv"] == "experiments/data/fedlin-toy.csv"
    assert (page.parent / found["csv"]).read_text() == (run / "fedlin-toy.csv").read_text()
    assert "| A lower than B |" in body
    with pytest.raises(ValueError, match="no section"):
        write_section(run, tmp_path / "docs" / "other.md") if (tmp_path / "docs" / "other.md").write_text("x") else None


PLAIN_PAGES = [p for p in PAGES if p.exists()]


@pytest.mark.parametrize("page", PLAIN_PAGES, ids=lambda p: p.name)
def test_user_pages_cite_no_spec_sections_or_commit_ids(page):
    import re

    text = page.read_text(encoding="utf-8")
    assert "§" not in text, f"{page.name} cites a spec section number; say what it stands for"
    assert not re.search(r"\[(P|R|RC|E)\]", text), f"{page.name} uses the spec's [P]/[R] tags"
    assert not re.search(r"\bcommit\s+[0-9a-f]{7,40}\b", text), f"{page.name} names an internal commit id"
