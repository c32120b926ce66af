"""The command line prints one warning line per kind: warnings that differ only in the site (and view) they name
and in their figures are grouped under the first, listing the others (fedhier fit on grunfeld printed nine
~500-character lines, one per site and view)."""

import pytest

from fedhier.cli import main
from fedhier.cli.sitedata import group_warnings

sm = pytest.importorskip("statsmodels.api")


def test_warnings_of_one_kind_become_one_line_listing_the_places():
    texts = [f"site '{s}', view 'v': the prior keeps the noise at {x} or more" for s, x in zip("ABCDEFGH", range(8))]
    texts += ["site 'A': y has standard deviation 90.5, beyond 90", "site 'A': y has standard deviation 90.5, beyond 90",
              "EP ran all 20 rounds"]
    lines = group_warnings(texts)
    assert lines == [
        "site 'A', view 'v' (and 7 more alike: site 'B', view 'v'; site 'C', view 'v'; site 'D', view 'v'; "
        "site 'E', view 'v'; site 'F', view 'v'; and 2 more): the prior keeps the noise at 0 or more "
        "(the figures are site 'A', view 'v''s)",
        "site 'A': y has standard deviation 90.5, beyond 90",
        "EP ran all 20 rounds",
    ]


def test_fedhier_fit_on_grunfeld_prints_one_warning_line_per_kind(tmp_path, capsys):
    sm.datasets.grunfeld.load_pandas().data.to_csv(tmp_path / "grunfeld.csv", index=False)
    (tmp_path / "fit.toml").write_text('file = "grunfeld.csv"\nsite_column = "firm"\nscale = "standard"\nn_components = 1\n'
                                       '[views]\ninvest = ["invest"]\nassets = ["value", "capital"]\n')
    assert main(["fit", "--config", str(tmp_path / "fit.toml"), "--quiet", "--out", str(tmp_path / "o")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedhier: warning: ")]
    # one kind (the sigma2 prior above a view's variance) at ten site views: one line naming the first, listing others
    assert len(warned) == 1 and " more alike: site '" in warned[0], warned
