"""Every key of a fit.toml has one TOML type, checked in one place (fedhier.deploy._toml.KEY_TYPES) by the
command line and the Flower deployment alike: a wrongly typed key is refused in one line naming the key and
the type it takes, before any data is read (``intercept = "false"`` used to fit an intercept)."""

import pytest

from fedhier.cli import main
from fedhier.deploy._toml import CONFIG_KEYS, KEY_TYPES, check_key_types

BASE = 'file = "d.csv"\nsite_column = "site"\ntarget = "y"\nfeatures = ["x"]\n'

#: one wrong value per kind of type, each with what the error must say
WRONG = [
    ('intercept = "false"', 'intercept must be true or false, without quotes, got the string "false"'),
    ('standardize = "yes"', 'standardize must be true or false, without quotes, got the string "yes"'),
    ('n_rounds = "20"', 'n_rounds must be a whole number without quotes, e.g. 20, got the string "20"'),
    ("n_rounds = 2.5", "n_rounds must be a whole number without quotes, e.g. 20, got the number 2.5"),
    ("seed = true", "seed must be a whole number without quotes, e.g. 20, got the boolean true"),
    ('mu_scale = "10"', 'mu_scale must be a number without quotes, e.g. 0.5, got the string "10"'),
    ('features = "x,z"', 'features must be a list of strings, e.g. ["age", "bmi"], got the string "x,z"'),
    ("features = [1, 2]", 'features must be a list of strings, e.g. ["age", "bmi"], got a list'),
    ("scale = 1", "scale must be a string in quotes, got the integer 1"),
    ("ranges = [0, 1]", "ranges must be a table, got a list"),
    ("noise = true", 'noise must be a string in quotes or a number without quotes, e.g. 0.5, got the boolean true'),
    ('tau = ["0.5"]', "tau must be a number without quotes, e.g. 0.5 or a list of numbers, e.g. [0.5, 1.0], got a list"),
]


def test_every_configuration_key_has_a_type():
    assert set(KEY_TYPES) == CONFIG_KEYS


@pytest.mark.parametrize("line, message", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrongly_typed_key_is_refused_in_one_line_by_the_command_line(line, message, tmp_path, capsys):
    (tmp_path / "d.csv").write_text("site,x,y\na,1,2\na,2,3\nb,1,1\nb,3,2\n")
    key = line.split(" = ")[0]
    text = BASE.replace(f"{key} = ", f"# {key} = ") + line + "\n"  # the wrong line replaces a right one
    (tmp_path / "fit.toml").write_text(text)
    status = main(["fit", "linear", "--config", str(tmp_path / "fit.toml"), "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("fedhier: error: ") and message in err, err
    assert not (tmp_path / "o").exists()


def test_every_wrong_key_is_listed_at_once_and_right_types_pass():
    with pytest.raises(ValueError) as caught:
        check_key_types({"intercept": "false", "n_rounds": "5", "target": "y"}, "fit.toml")
    assert str(caught.value).startswith("fit.toml: intercept must be true or false")
    assert "; n_rounds must be a whole number" in str(caught.value) and "target" not in str(caught.value)
    check_key_types({"intercept": False, "n_rounds": 5, "mu_scale": 10, "noise": 0.5, "tau": [1, 2.0], "random": "x",
                     "features": ["x"], "ranges": {"x": [0, 1]}}, "fit.toml")


def test_the_flower_deployment_refuses_the_same_line():
    pytest.importorskip("flwr")  # the deployment's module needs the flower extra
    from fedhier.deploy.fedlin import FedLinFitConfig

    text = 'model = "fedlin-hm2"\ntarget = "y"\nfeatures = ["x"]\nintercept = "false"\n[flower]\nsites = ["a", "b"]\n'
    with pytest.raises(ValueError, match='fit.toml: intercept must be true or false, without quotes, got the string "false"'):
        FedLinFitConfig.from_toml(text, "fit.toml")
