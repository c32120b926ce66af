"""Every user mistake of the newcomer's report, run for real on the raw slices of tests/cli_data: the message it gets.

Each case runs ``fedhier`` in this process and checks that the answer is one line
``fedhier: error: ...`` (no traceback) naming the site and the column (and row) where there is
one, or, for a mistake the command line now handles, that it runs and says what it did.  The
table of docs/cli.md ("What a mistake gets you") is printed by

    python tests/test_cli_mistakes.py

and a test checks that the page holds every message as it is produced now.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

import pytest

from fedhier.cli import main

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "cli.md"


def _heart(tmp: Path, edit=None, csv_edit=None) -> Path:
    """The heart slices in ``tmp``; ``edit(toml text) -> text``; ``csv_edit(name, text) -> text``."""
    folder = tmp / "heart"
    shutil.copytree(HERE / "cli_data" / "heart", folder, dirs_exist_ok=True)
    if csv_edit is not None:
        for path in folder.glob("*.csv"):
            path.write_text(csv_edit(path.name, path.read_text()))
    toml = folder / "fit.toml"
    if edit is not None:
        toml.write_text(edit(toml.read_text()))
    return toml


def _pooled(tmp: Path, name: str) -> Path:
    folder = tmp / name
    shutil.copytree(HERE / "cli_data" / name, folder, dirs_exist_ok=True)
    return folder


def _pooled_config(tmp: Path, name: str, edit) -> Path:
    """The ``fit.toml`` of the pooled slice ``name`` (e.g. radon, motes), edited by ``edit(toml text) -> text``."""
    toml = _pooled(tmp, name) / "fit.toml"
    toml.write_text(edit(toml.read_text()))
    return toml


def _heart_pooled(tmp: Path) -> Path:
    """The four heart files as one CSV with the hospital in column ``dataset``."""
    files = sorted((HERE / "cli_data" / "heart").glob("*.csv"))
    lines = files[0].read_text().splitlines()[:1]
    for f in files:
        lines += f.read_text().splitlines()[1:]
    path = tmp / "heart.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _motes_with_text(tmp: Path) -> Path:
    """Readings of the motes slice to score, one humidity written as a word."""
    lines = (HERE / "cli_data" / "motes" / "motes.csv").read_text().splitlines()[:4]
    lines[2] = lines[2].replace(",43.79,", ",high,")
    path = tmp / "new.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _semicolons(path: Path) -> Path:
    path.write_text(path.read_text().replace(",", ";"))
    return path


def _sub(old: str, new: str):
    return lambda text: text.replace(old, new, 1)


def _minmax(*ranges: str):
    """``scale = "minmax"`` and a ``[ranges]`` table with the lines ``ranges``."""
    return lambda text: text.replace('scale = "standard"', 'scale = "minmax"', 1) + "\n[ranges]\n" + "\n".join(ranges) + "\n"


def _fitted(tmp: Path, command: Sequence[str] = ("collab", "fit")) -> Path:
    """The model.npz of ``fedhier COMMAND`` on the motes slice."""
    folder = _pooled(tmp, "motes")
    assert main([*command, "--config", str(folder / "fit.toml"), "--out", str(tmp / "fitted"), "--quiet"]) == 0
    return tmp / "fitted" / "model.npz"


#: (newcomer report point, the mistake, argv builder, expected exit status, fragments the message must hold)
CASES = [
    ("1", "`fedhier fit`: a view's only column misspelled at every site",
     lambda t: ["fit", "--config", str(_heart(t, _sub('angiography = ["ca"]', 'angiography = ["cax"]'))), "--out", str(t / "o")],
     2, ["view 'angiography'", "column 'cax'", "did you mean 'ca'"]),
    ("1", "`fedhier fit`: both columns of a two-column view misspelled",
     lambda t: ["fit", "--config", str(_heart(t, _sub('lab = ["chol"]', 'lab = ["cholesterol", "restbp"]'))), "--out", str(t / "o")],
     2, ["view 'lab'", "column 'cholesterol'", "did you mean 'chol'", "column 'restbp'", "did you mean 'trestbps'"]),
    ("1", "`fedhier fit`: a view whose columns are empty at every site it is measured",
     lambda t: ["fit", "--config", str(_heart(t, lambda s: s.replace('cleveland = "cleveland.csv"\n', "").replace(
         'va_long_beach = "va_long_beach.csv"\n', ""))), "--out", str(t / "o")],
     2, ["view(s) ['angiography'] measured at no site", "angiography: ['ca']"]),
    ("7", "`fedhier fit`: a partly observed view, with partial = \"refuse\"",
     lambda t: ["fit", "--config", str(_heart(t, _sub('partial = "missing"', 'partial = "refuse"'))), "--out", str(t / "o")],
     2, ["site 'hungary', view 'clinical'", "first at row 1", "site 'switzerland', view 'clinical'"]),
    ("7, 8", "`fedhier fit`: partly observed views and a column empty at one site (default partial = \"missing\")",
     lambda t: ["fit", "--config", str(_heart(t)), "--out", str(t / "o"), "--quiet"],
     0, ["site 'hungary', view 'angiography'", "column(s) ['ca'] empty or missing at every row"]),
    ("9, 10, 20", "`fedhier fit`: a text column in a view (several sites' problems at once)",
     lambda t: ["fit", "--config", str(_heart(t, _sub('"trestbps", "fbs"]', '"trestbps", "fbs", "sex"]'))), "--out", str(t / "o")],
     2, ["site 'cleveland', view 'clinical': non-numeric value in column 'sex', row 1", "site 'hungary'"]),
    ("19", "`fedhier fit`: a column that is not a number or a boolean in one row",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text.replace(",True,", ",maybe,", 1)
                                              if name == "cleveland.csv" else text)), "--out", str(t / "o")],
     2, ["site 'cleveland', view 'clinical': non-numeric value in column 'fbs', row 1"]),
    ("21", "`fedhier fit`: an unknown key",
     lambda t: ["fit", "--config", str(_heart(t, _sub("n_components", "n_component"))), "--out", str(t / "o")],
     2, ["unknown key(s) ['n_component']", "did you mean 'n_components'"]),
    ("—", "`fedhier fit linear`: a boolean written as a string",
     lambda t: ["fit", "linear", "--config", str(_pooled_config(t, "radon", _sub("intercept = true", 'intercept = "false"'))),
                "--out", str(t / "o")],
     2, ['intercept must be true or false, without quotes, got the string "false"']),
    ("11", "`fedhier fit`: a site's file does not exist",
     lambda t: ["fit", "--config", str(_heart(t, _sub('"hungary.csv"', '"hungry.csv"'))), "--out", str(t / "o")],
     2, ["site 'hungary': file", "hungry.csv does not exist"]),
    ("11", "any command: a wrong site column",
     lambda t: ["fit", "--config", str(_pooled_config(t, "radon", _sub('site_column = "county.name"', 'site_column = "county_name"'))),
                "--out", str(t / "o")],
     2, ["no site column 'county_name'", "did you mean 'county.name'"]),
    ("6", "any command: a misspelled id column",
     lambda t: ["fit", "--config", str(_heart(t, _sub('id = "id"', 'id = "ID_"'))), "--out", str(t / "o")],
     2, ["id column 'ID_' missing at site(s) ['cleveland', 'hungary', 'switzerland', 'va_long_beach']", "did you mean 'id'"]),
    ("5", "any command: an unknown scaling",
     lambda t: ["fit", "--config", str(_heart(t, _sub('scale = "standard"', 'scale = "zscore"'))), "--out", str(t / "o")],
     2, ["scale must be one of ['standard', 'minmax', 'none']"]),
    ("11", "any command: both a [sites] table and a site column",
     lambda t: ["fit", "--config", str(_heart(t, lambda s: 'file = "cleveland.csv"\nsite_column = "dataset"\n' + s)), "--out", str(t / "o")],
     2, ["either with a [sites] table", "or with file"]),
    ("—", "any command: a declared range whose low is not below its high",
     lambda t: ["fit", "--config", str(_heart(t, _minmax("age = [100, 18]"))), "--out", str(t / "o")],
     2, ["[ranges]: column(s) ['age']", "low < high"]),
    ("—", "any command: a declared range for a column no file has",
     lambda t: ["fit", "--config", str(_heart(t, _minmax("agee = [18, 100]"))), "--out", str(t / "o")],
     2, ["[ranges] names column(s) no site's file has: 'agee'", "did you mean 'age'"]),
    ("—", "any command: a value outside its declared range",
     lambda t: ["fit", "--config", str(_heart(t, _minmax("age = [18, 60]"))), "--out", str(t / "o")],
     2, ["site 'cleveland': column 'age'", "outside its declared range", "first at row", "site 'va_long_beach': column 'age'"]),
    ("—", "`fedhier fit --dp` with a min-max scaling fitted on the sites' data",
     lambda t: ["fit", "--config", str(_heart(t, _sub('scale = "standard"', 'scale = "minmax"'))), "--out", str(t / "o"), "--dp"],
     2, ["this fit is private", "minimum, maximum", "[ranges]", 'scale = "none"', "scaling_outside_privacy = true"]),
    ("—", "`fedhier fit --dp` with record-level privacy on data not min-max scaled",
     lambda t: ["fit", "--config", str(_heart(t, _sub("seed = 0", 'seed = 0\nprivacy_unit = "record"'))), "--out", str(t / "o"), "--dp"],
     2, ["record-level privacy (privacy_unit = 'record')", "min-max scaled to [0, 1]", "[ranges]"]),
    ("—", "`fedhier fit`: privacy_unit without a privacy budget",
     lambda t: ["fit", "--config", str(_heart(t, _sub("seed = 0", 'seed = 0\nprivacy_unit = "record"'))), "--out", str(t / "o")],
     2, ["privacy_unit = 'record' needs a privacy budget", "epsilon", "--dp"]),
    ("—", "`fedhier demo --unit` without a privacy budget",
     lambda t: ["demo", "--unit", "site", "--out", str(t / "o")],
     2, ["--unit site says what --dp protects", "add --dp or --epsilon"]),
    ("—", "`fedhier fit --dp` on a file whose model is FedLin",
     lambda t: ["fit", "--config", str(_heart(t, lambda s: 'model = "fedlin-hm2"\n' + s)), "--out", str(t / "o"), "--dp"],
     2, ["--dp / --epsilon ask for a differentially private fit", "model is FedLin", "run it without them"]),
    ("—", "`fedhier fit linear` on a file that sets a privacy budget",
     lambda t: ["fit", "linear", "--config", str(_heart(t, _sub("seed = 0", "seed = 0\nepsilon = 1.0"))), "--out", str(t / "o")],
     2, ["sets epsilon", "a FedLin fit takes no privacy budget", "remove epsilon"]),
    ("—", "`fedhier collab fit` on a file that sets a privacy budget",
     lambda t: ["collab", "fit", "--config", str(_pooled_config(t, "motes", lambda s: "epsilon = 1.0\ndelta = 1e-6\n" + s)),
                "--out", str(t / "o")],
     2, ["sets epsilon, delta", "a CollabDict fit takes no privacy budget", "privacy its published pattern means spend", "remove epsilon, delta"]),
    ("9", "`fedhier fit linear`: a text feature",
     lambda t: ["fit", "linear", str(_heart_pooled(t)), "--site", "dataset", "--target", "thalch", "--features", "age,sex",
                "--out", str(t / "o")],
     2, ["site 'Cleveland': non-numeric value in column 'sex', row 1 and 39 more row(s)", "site 'Hungary'"]),
    ("9", "`fedhier fit linear`: empty cells, with partial = \"refuse\"",
     lambda t: ["fit", "linear", "--config", str(_heart(t, _sub('partial = "missing"', 'partial = "refuse"'))), "--out", str(t / "o")],
     2, ["site 'switzerland': 1 row(s) with an empty cell, first in column 'trestbps', row 3"]),
    ("9", "`fedhier fit linear`: empty cells (default partial = \"missing\": the rows are left out)",
     lambda t: ["fit", "linear", "--config", str(_heart(t)), "--out", str(t / "o")],
     0, ["site 'switzerland': 1 row(s) with an empty cell left out (first: column 'trestbps', row 3)"]),
    ("21", "`fedhier fit linear`: a misspelled feature",
     lambda t: ["fit", "linear", str(_heart_pooled(t)), "--site", "dataset", "--target", "thalch", "--features", "age,restbp",
                "--out", str(t / "o")],
     2, ["features: column 'restbp' not found in any site's file", "did you mean 'trestbps'"]),
    ("8", "`fedhier fit linear`: a feature not measured at one site",
     lambda t: ["fit", "linear", "--config", str(_heart(t, _sub('features = ["age", "trestbps", "exang"]', 'features = ["age", "ca"]'))),
                "--out", str(t / "o")],
     2, ["site 'hungary': column(s) ['ca'] not measured there", "site 'switzerland'"]),
    ("10", "`fedhier collab fit`: a wrong site column",
     lambda t: ["collab", "fit", "--csv", str(_pooled(t, "motes") / "motes.csv"), "--site-column", "mote", "--out", str(t / "o")],
     2, ["no site column 'mote'", "did you mean 'mote_id'"]),
    ("10", "`fedhier collab fit`: a misspelled variable",
     lambda t: ["collab", "fit", "--csv", str(_pooled(t, "motes") / "motes.csv"), "--site-column", "mote_id",
                "--columns", "humidty,temperature", "--out", str(t / "o")],
     2, ["variables: column 'humidty' not found in any site's file", "did you mean 'humidity'"]),
    ("10", "`fedhier collab fit`: every column by default, one of them text",
     lambda t: ["collab", "fit", "--csv", str(_heart_pooled(t)), "--site-column", "dataset", "--out", str(t / "o")],
     2, ["column(s) ['sex', 'cp', 'restecg', 'slope', 'thal'] hold text", "site 'Cleveland': non-numeric value in column 'sex', row 1", "['ca'] not measured at site 'Hungary'",
         "list the variables"]),
    ("11", "`fedhier collab score`: a site the model does not know",
     lambda t: ["collab", "score", "--model", str(_fitted(t)), "--csv", str(t / "motes" / "motes.csv"), "--site", "7",
                "--out", str(t / "s.csv")],
     2, ["--site '7' is not a site of the model", "its sites: ['1', '2', '3', '4']"]),
    ("—", "`fedhier collab score` with the model of a Fed-mv-PPCA fit",
     lambda t: ["collab", "score", "--model", str(_fitted(t, ["fit"])), "--csv", str(t / "motes" / "motes.csv"), "--site", "1",
                "--out", str(t / "s.csv")],
     2, ["a Fed-mv-PPCA model", "collab score needs the model.npz of a `fedhier collab fit` result folder"]),
    ("—", "`fedhier collab score`: a text cell in the file to score",
     lambda t: ["collab", "score", "--model", str(_fitted(t)), "--csv", str(_motes_with_text(t)), "--site", "1",
                "--out", str(t / "s.csv")],
     2, ["fedhier: error: new.csv: non-numeric value in column 'humidity', row 2"]),
    ("file", "`fedhier collab fit`: a file of all sites saved with ';' as separator",
     lambda t: ["collab", "fit", "--csv", str(_semicolons(_heart_pooled(t))), "--site-column", "dataset", "--out", str(t / "o")],
     2, ["fedhier: error: heart.csv seems to use ';' as separator"]),
    ("file", "any command: a row with a field missing",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text.replace(",Male,", ",", 1)
                                              if name == "hungary.csv" else text)), "--out", str(t / "o")],
     2, ["site 'hungary': hungary.csv, line 2: 15 fields, the header has 16"]),
    ("file", "any command: a file without its header line",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text.split("\n", 1)[1]
                                              if name == "cleveland.csv" else text)), "--out", str(t / "o")],
     2, ["site 'cleveland': the first line of cleveland.csv looks like data, not a header naming the columns"]),
    ("file", "any command: a file saved with ';' as separator (European Excel)",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text.replace(",", ";")
                                              if name == "switzerland.csv" else text)), "--out", str(t / "o")],
     2, ["site 'switzerland': switzerland.csv seems to use ';' as separator", "save as CSV UTF-8 with commas"]),
    ("file", "any command: a file with a header but no rows",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text.split("\n", 1)[0] + "\n"
                                              if name == "va_long_beach.csv" else text)), "--out", str(t / "o")],
     2, ["site 'va_long_beach': va_long_beach.csv has a header but no data rows"]),
    ("file", "any command: a subject's row twice in a site's file",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text + text.splitlines()[1] + "\n"
                                              if name == "cleveland.csv" else text)), "--out", str(t / "o")],
     2, ["site 'cleveland': 1 id(s) in column 'id' appear on more than one row of cleveland.csv"]),
    ("file", "any command: the id column in another case at one site",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: "ID" + text[2:]
                                              if name == "hungary.csv" else text)), "--out", str(t / "o")],
     2, ["id column 'id' missing at site(s) ['hungary']; did you mean 'ID'?"]),
    ("file", "`fedhier fit`: a view's column in another case at one site",
     lambda t: ["fit", "--config", str(_heart(t, csv_edit=lambda name, text: text.replace(",chol,", ",Chol,", 1)
                                              if name == "hungary.csv" else text)), "--out", str(t / "o")],
     2, ["view 'lab': column 'chol' not found at site 'hungary'; did you mean 'Chol'?"]),
    ("file", "`fedhier fit linear`: a feature in another case at one site",
     lambda t: ["fit", "linear", "--config", str(_heart(t, csv_edit=lambda name, text: text.replace(",age,", ",Age,", 1)
                                                         if name == "hungary.csv" else text)), "--out", str(t / "o")],
     2, ["features: column 'age' not found at site 'hungary'; did you mean 'Age'?"]),
    ("file", "any command: missing_values for a column no file has",
     lambda t: ["fit", "--config", str(_heart(t, _sub("missing_values = { chol", "missing_values = { chool"))), "--out", str(t / "o")],
     2, ["missing_values names column(s) no site's file has: 'chool'", "did you mean 'chol'"]),
    ("3", "`fedhier experiment fedlin-radon` without statsmodels",
     lambda t: ["experiment", "fedlin-radon", "--quick", "--out", str(t / "o")],
     2, ["`fedhier experiment fedlin-radon` needs the optional package statsmodels", 'pip install -e ".[stats]"']),
]


def run_case(case, tmp: Path) -> tuple[int, str]:
    """Exit status and the one line the command printed (the error, or the first note of an accepted mistake)."""
    _, _, argv, _, _ = case
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()):  # a case may fit a model first
        args = argv(tmp)
    blocked = ["statsmodels", "statsmodels.api"] if args[:2] == ["experiment", "fedlin-radon"] else []
    saved = {name: sys.modules.pop(name) for name in blocked if name in sys.modules}
    sys.modules.update(dict.fromkeys(blocked))  # as if not installed
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            status = main(args)
    finally:
        for name in blocked:
            del sys.modules[name]
        sys.modules.update(saved)
    text = err.getvalue().strip()
    if status == 0:  # accepted: the warning, or the line of the summary's notes, that says what was done
        warned = [line for line in text.splitlines() if line.startswith("fedhier: warning: ")]
        notes = warned + json.loads((tmp / "o" / "summary.json").read_text())["notes"]
        fragments = case[4]
        text = next((n for n in notes if all(f in n for f in fragments)), "\n".join(notes))
    return status, text.replace(str(tmp), "<folder>")


@pytest.mark.parametrize("case", CASES, ids=[c[1] for c in CASES])
def test_each_mistake_gets_one_line_naming_site_and_column(case, tmp_path):
    status, text = run_case(case, tmp_path)
    assert status == case[3], text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    if status:
        assert text.startswith("fedhier: error: ")
    for fragment in case[4]:
        assert fragment in text, (fragment, text)
    assert _escape(text) in DOCS.read_text(), "docs/cli.md is out of date: run python tests/test_cli_mistakes.py"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def table(tmp: Path) -> str:
    rows = ["| report point | mistake | what you get now |", "|---|---|---|"]
    for i, case in enumerate(CASES):
        folder = tmp / f"case{i}"
        folder.mkdir()
        status, text = run_case(case, folder)
        shown = _escape(text) if status else f"runs (exit 0); {'it warns' if text.startswith('fedhier: warning: ') else 'the summary notes'}: {_escape(text)}"
        rows.append(f"| {case[0]} | {case[1]} | {shown} |")
    return "\n".join(rows)


if __name__ == "__main__":  # print the table of docs/cli.md
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(table(Path(tmp)))
