"""A site's file that is not UTF-8 CSV text -- a Latin-1 CSV as older Excel saves it, an Excel workbook -- is
refused in one line that names the site and says how to save a UTF-8 CSV, never quoting the file's bytes."""

import zipfile

import pytest

from fedhier.cli import main

CONFIG = 'target = "y"\nfeatures = ["x"]\n[sites]\nzurich = "zurich.csv"\nlyon = "{lyon}"\n'


def _fit(tmp_path, capsys, lyon: str) -> str:
    (tmp_path / "zurich.csv").write_text("x,y\n1,2\n2,3\n3,5\n")
    (tmp_path / "fit.toml").write_text(CONFIG.format(lyon=lyon))
    status = main(["fit", "linear", "--config", str(tmp_path / "fit.toml"), "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()
    return err


def test_a_latin1_csv_names_the_site_the_line_and_how_to_save_utf8(tmp_path, capsys):
    (tmp_path / "lyon.csv").write_bytes("x,y,ville\n1,2,Lyon\n2,3,Orléans\n".encode("latin-1"))
    err = _fit(tmp_path, capsys, "lyon.csv")
    assert err.startswith("fedhier: error: site 'lyon': lyon.csv is not UTF-8 text (first at line 3;"), err
    assert 'save it with File > Save As > "CSV UTF-8 (Comma delimited) (*.csv)"' in err
    assert "Orl" not in err and "\\xe9" not in err  # no cell content


@pytest.mark.parametrize("name", ["lyon.xlsx", "lyon.csv"])  # a workbook, also when renamed .csv
def test_a_spreadsheet_workbook_names_the_site_and_how_to_save_a_csv(tmp_path, capsys, name):
    with zipfile.ZipFile(tmp_path / name, "w") as book:  # an .xlsx file is a zip archive of XML parts
        book.writestr("[Content_Types].xml", "<Types/>")
        book.writestr("xl/worksheets/sheet1.xml", "<worksheet>\u00e9</worksheet>")
    err = _fit(tmp_path, capsys, name)
    assert err.startswith(f"fedhier: error: site 'lyon': {name} is a spreadsheet workbook, not a CSV file; "), err
    assert "CSV UTF-8 (Comma delimited)" in err
