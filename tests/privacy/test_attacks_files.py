"""Attacks through files and error text: what a malicious file, name or cell can make fedhier do.

Each test is written as the attacker would try it, and fails on the code before the
"files as untrusted input" change: traversal site names, outputs that replace inputs,
size-bomb model and checkpoint files, NaN model files, a checkpoint resumed on other data
or settings, a bad cell's text or a secure-mode overflow leaking a private value into an
error message.  Memory of the "bomb" files is measured with tracemalloc (peak allocation),
never with wall times.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedhier import FedMVPPCA
from fedhier.cli import main
from fedhier.protocol.messages import Field, MessageError, MessageSpec, decode, encode, header_fields

SECRET = "Jane Doe 1961-04-02"
SMALL = 64 * 2**20  # peak bytes a refused bomb may cost (the bombs declare 1 GiB)


# --------------------------------------------------------------------------- helpers
def _write_csv(path, columns, rows):
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        w.writerows(rows)


def _user_files(folder: Path, site_names=("a", "b"), paths=("a.csv", "b.csv")) -> Path:
    rng = np.random.default_rng(0)
    cols = ["tau", "p_tau", "ab42", "age"]
    for path in paths:
        _write_csv(folder / path, cols, rng.normal(size=(30, 4)).round(4).tolist())
    sites = "".join(f"[[sites]]\nname = {json.dumps(n)}\npath = {json.dumps(p)}\n" for n, p in zip(site_names, paths))
    toml = folder / "fit.toml"
    toml.write_text(f"n_components = 1\nn_rounds = 2\nn_local_iter = 2\nn_first_iter = 3\n[views]\ncsf = {json.dumps(cols)}\n{sites}")
    return toml


def npy_bytes(array=None, *, header_shape=None, dtype="<f8", payload=b"") -> bytes:
    """An .npy member: a real array, or a header declaring ``header_shape`` followed by ``payload``."""
    buf = io.BytesIO()
    if array is not None:
        np.lib.format.write_array(buf, np.asarray(array), allow_pickle=False)
    else:
        np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": header_shape})
        buf.write(payload)
    return buf.getvalue()


def replace_members(path: Path, members: dict[str, bytes]) -> None:
    """Rewrite the .npz at ``path`` with some members (``name`` without .npy) replaced by raw bytes."""
    with zipfile.ZipFile(path) as zf:
        content = {i.filename: zf.read(i) for i in zf.infolist()}
    content.update({f"{k}.npy": v for k, v in members.items()})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in content.items():
            zf.writestr(name, data)


def _peak_while_refused(load, match: str) -> int:
    """Peak traced allocation of ``load()``, which must raise ValueError matching ``match``."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=match):
            load()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def mvppca_sites():
    rng = np.random.default_rng(3)
    W = rng.normal(size=(6, 2))
    return [{"v0": rng.normal(size=(40, 2)) @ W.T + 0.3 * rng.normal(size=(40, 6))} for _ in range(3)]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, mvppca_sites):
    path = tmp_path_factory.mktemp("model") / "model.npz"
    FedMVPPCA(n_components=2, n_rounds=2, n_local_iter=2, n_first_iter=3, random_state=0).fit(mvppca_sites).save(path)
    return path


# --------------------------------------------------------------------------- site names
@pytest.mark.parametrize("name", ["x/../../../escaped", "..", "", ".hidden", "a\\b", "tab\there", "bell\u0007"])
def test_a_site_name_that_would_leave_or_hide_in_the_output_folder_is_refused(tmp_path, capsys, name):
    data = tmp_path / "a" / "b"
    data.mkdir(parents=True)
    toml = _user_files(data, site_names=("a", name))
    out = data / "out"
    assert main(["fit", "--config", str(toml), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"site name {name!r} is not allowed" in err or f"site name {name!r} must be" in err
    assert len(err.splitlines()) == 1
    assert not out.exists()
    assert not [p for p in tmp_path.rglob("*escaped*")]


def test_flower_configuration_and_supernode_refuse_traversal_site_names(tmp_path):
    pytest.importorskip("flwr", reason="needs the flower extra")
    from fedhier.cli.flower import supernode_command
    from fedhier.deploy.mvppca import FlowerFitConfig

    text = '[views]\ncsf = ["a", "b", "c"]\n[flower]\nsites = ["hospital-a", "../../etc"]\n'
    with pytest.raises(ValueError, match=r"site name '\.\./\.\./etc' is not allowed"):
        FlowerFitConfig.from_toml("n_components = 1\n" + text)
    data = tmp_path / "site.csv"
    data.write_text("a,b,c\n1,2,3\n")
    for bad in ("..", ".hidden"):
        with pytest.raises(ValueError, match="is not allowed"):
            supernode_command(superlink="127.0.0.1:9092", site=bad, data=data, insecure=True)


# --------------------------------------------------------------------------- outputs never replace inputs
def test_fit_refuses_an_output_that_is_an_input_and_writes_nothing(tmp_path, capsys):
    # site a's data lives in a file named like an output of the fit, in the output folder: an earlier result folder
    # (any other folder that is not empty is refused as not a fedhier result, tests/test_cli_outputs.py)
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "summary.json").write_text("{}\n")
    toml = _user_files(tmp_path, paths=("res/latent_a.csv", "b.csv"))
    before = (tmp_path / "res" / "latent_a.csv").read_bytes()
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "res"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "would overwrite the input file" in err and "latent_a.csv" in err
    assert (tmp_path / "res" / "latent_a.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["b.csv", "fit.toml", "latent_a.csv", "res", "summary.json"]


def test_fit_linear_and_collab_score_refuse_to_overwrite_their_input(tmp_path, capsys):
    from fedhier.estimators.collab import CollabDict

    rng = np.random.default_rng(1)
    res = tmp_path / "res"  # an earlier result folder (any other non-empty folder is refused as not a result)
    res.mkdir()
    (res / "summary.json").write_text("{}\n")
    table = res / "coefficients.csv"  # the data file has the name of an output of `fit linear`
    _write_csv(table, ["site", "x", "y"], [[s, *rng.normal(size=2).round(3)] for s in "ab" for _ in range(10)])
    before = table.read_bytes()
    assert main(["fit", "linear", str(table), "--site", "site", "--target", "y", "--features", "x", "--model", "hm1",
                 "--rounds", "2", "--out", str(res)]) == 2
    assert "would overwrite the input file" in capsys.readouterr().err
    assert table.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["res"]
    assert sorted(p.name for p in res.iterdir()) == ["coefficients.csv", "summary.json"]

    sites = [rng.normal(size=(60, 3)) for _ in range(3)]
    model = tmp_path / "collab.npz"
    CollabDict(2, max_iter=2, random_state=0).fit(sites).save(model)
    scores = tmp_path / "scores.csv"
    _write_csv(scores, ["u", "v", "w"], sites[0].round(3).tolist())
    before = scores.read_bytes()
    for out in (scores, model):
        assert main(["collab", "score", "--model", str(model), "--csv", str(scores), "--site", "0", "--columns", "u,v,w",
                     "--out", str(out)]) == 2
        assert "would overwrite the input file" in capsys.readouterr().err
    assert scores.read_bytes() == before and CollabDict.load(model).n_sites_ == 3


# --------------------------------------------------------------------------- size bombs
def test_a_model_file_declaring_a_gigabyte_array_is_refused_without_allocating_it(tmp_path, model_file):
    bomb = tmp_path / "bomb.npz"
    bomb.write_bytes(model_file.read_bytes())
    # 1 MiB of data behind a header that declares 2**27 doubles (1 GiB)
    replace_members(bomb, {"v0/W": npy_bytes(header_shape=(2**27,), payload=bytes(2**20))})
    assert bomb.stat().st_size < 2 * 2**20
    peak = _peak_while_refused(lambda: FedMVPPCA.load(bomb), r"v0/W")
    assert peak < SMALL, peak


def test_a_checkpoint_declaring_millions_of_sites_or_a_huge_array_is_refused_small(tmp_path, mvppca_sites):
    from fedhier.runtime.checkpoint import read_checkpoint

    path = tmp_path / "fit.ckpt.npz"
    FedMVPPCA(n_components=2, n_rounds=1, n_local_iter=2, n_first_iter=3, random_state=0).fit(mvppca_sites, checkpoint=path)
    with zipfile.ZipFile(path) as zf:
        meta = json.loads(np.load(io.BytesIO(zf.read("__meta__.npy"))).tobytes())
    meta["n_sites"] = 2_000_000  # a few hundred bytes that ask for two million per-site structures
    sites_bomb = tmp_path / "sites.npz"
    sites_bomb.write_bytes(path.read_bytes())
    replace_members(sites_bomb, {"__meta__": npy_bytes(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))})
    peak = _peak_while_refused(lambda: read_checkpoint(sites_bomb), "damaged checkpoint")
    assert peak < 16 * 2**20, peak
    with pytest.raises(ValueError, match="is for 2000000 sites, not 3"):
        FedMVPPCA(n_components=2, n_rounds=2, n_local_iter=2, n_first_iter=3, random_state=0).fit(mvppca_sites, checkpoint=sites_bomb)

    array_bomb = tmp_path / "array.npz"
    array_bomb.write_bytes(path.read_bytes())
    replace_members(array_bomb, {"broadcast/v0/W": npy_bytes(header_shape=(2**27,), payload=bytes(1000))})
    peak = _peak_while_refused(lambda: read_checkpoint(array_bomb), r"broadcast/v0/W")
    assert peak < SMALL, peak


def test_a_message_whose_header_lies_about_sizes_is_refused_before_any_array_is_built():
    spec = MessageSpec("m", {"x": Field((2,))})
    good = encode(spec, {"x": np.zeros(2)})
    hlen = int.from_bytes(good[4:8], "little")

    def with_header(header: dict, body: bytes = bytes(16)) -> bytes:
        head = json.dumps(header).encode()
        return good[:4] + len(head).to_bytes(4, "little") + head + body

    overflow = with_header({"spec": "m", "fields": [["x", "float64", [2**62, 4]]]})  # int64 product wraps to 0
    with pytest.raises(MessageError, match="'x'"):
        decode(spec, overflow)
    with pytest.raises(MessageError, match="'x'"):
        header_fields(overflow)
    with pytest.raises(MessageError, match="negative"):
        header_fields(with_header({"spec": "m", "fields": [["x", "float64", [-1, 2]]]}))
    huge = with_header({"spec": "m", "fields": [["x" * (2 * 2**20), "float64", [2]]]})  # a 2 MiB header
    with pytest.raises(MessageError, match="header"):
        decode(spec, huge)
    assert hlen < 200 and decode(spec, good)["x"].shape == (2,)


# --------------------------------------------------------------------------- NaN model files
def test_model_files_with_nan_parameters_are_refused_naming_the_array(tmp_path, model_file):
    from fedhier.estimators.collab import CollabDict
    from fedhier.estimators.fedlin import FedHM1Regressor, load

    bad = tmp_path / "nan.npz"
    bad.write_bytes(model_file.read_bytes())
    W = np.full((6, 2), np.nan)
    replace_members(bad, {"v0/W": npy_bytes(W)})
    with pytest.raises(ValueError, match="'v0/W' contains NaN or infinite"):
        FedMVPPCA.load(bad)

    rng = np.random.default_rng(2)
    sites = [(rng.normal(size=(20, 2)), rng.normal(size=20)) for _ in range(3)]
    path = FedHM1Regressor(fit_intercept=False, n_rounds=2, eta=0.01, random_state=0).fit(sites).save(tmp_path / "hm1.npz")
    coef = np.zeros((3, 2))
    coef[1, 1] = np.inf
    replace_members(path, {"coef_": npy_bytes(coef)})
    with pytest.raises(ValueError, match="'coef_' contains NaN or infinite"):
        load(path)

    model = CollabDict(2, max_iter=2, random_state=0).fit([rng.normal(size=(60, 3)) for _ in range(3)])
    path = model.save(tmp_path / "collab.npz")
    mu = np.array(model.mu_, dtype=float)
    mu.flat[0] = np.nan
    replace_members(path, {"mu_": npy_bytes(mu)})
    with pytest.raises(ValueError, match="'mu_' contains NaN or infinite"):
        CollabDict.load(path)


# --------------------------------------------------------------------------- checkpoint fingerprints
def test_a_checkpoint_is_not_resumed_on_other_data_or_other_settings(tmp_path, mvppca_sites):
    kw = dict(n_components=2, n_first_iter=3, random_state=0)
    path = tmp_path / "fit.ckpt.npz"
    FedMVPPCA(n_rounds=2, n_local_iter=2, **kw).fit(mvppca_sites, checkpoint=path)
    other = [dict(s) for s in mvppca_sites]
    other[1] = {"v0": other[1]["v0"] + 1e-9}  # same shapes, other values at site 1 only
    with pytest.raises(ValueError, match=r"belongs to other data: the data of site\(s\) \[1\] differ"):
        FedMVPPCA(n_rounds=3, n_local_iter=2, **kw).fit(other, checkpoint=path)
    with pytest.raises(ValueError, match="differently configured 'fed-mv-ppca' fit: setting n_local_iter differ"):
        FedMVPPCA(n_rounds=3, n_local_iter=3, **kw).fit(mvppca_sites, checkpoint=path)
    FedMVPPCA(n_rounds=3, n_local_iter=2, **kw).fit(mvppca_sites, checkpoint=path)  # the same data and settings resume


def test_checkpoint_data_digests_are_salted_so_files_cannot_be_linked_or_looked_up(tmp_path, mvppca_sites):
    from fedhier.protocol.base import data_digest
    from fedhier.runtime.checkpoint import read_checkpoint

    kw = dict(n_components=2, n_rounds=1, n_local_iter=2, n_first_iter=3, random_state=0)
    first, second = tmp_path / "1.npz", tmp_path / "2.npz"
    FedMVPPCA(**kw).fit(mvppca_sites, checkpoint=first)
    FedMVPPCA(**kw).fit(mvppca_sites, checkpoint=second)
    a, b = read_checkpoint(first).fingerprint, read_checkpoint(second).fingerprint
    assert a.salt != b.salt and not set(a.sites) & set(b.sites)  # same data, unlinkable digests
    plain = {hashlib.sha256(data_digest(s)).hexdigest() for s in mvppca_sites} | {data_digest(s).hex() for s in mvppca_sites}
    assert not set(a.sites) & plain


# --------------------------------------------------------------------------- error text carries no data
def _secret_in_b(tmp_path) -> Path:
    toml = _user_files(tmp_path)
    lines = (tmp_path / "b.csv").read_text().splitlines()
    lines[3] = f'"{SECRET}",' + lines[3].split(",", 1)[1]  # data row 3, column tau
    (tmp_path / "b.csv").write_text("\n".join(lines) + "\n")
    return toml


def test_a_bad_cell_s_text_is_never_in_the_error_of_fedhier_fit(tmp_path, capsys):
    toml = _secret_in_b(tmp_path)
    assert main(["fit", "--config", str(toml), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "site 'b', view 'csf': non-numeric value in column 'tau', row 3" in err
    assert "Jane" not in err and "1961" not in err


def test_a_flower_site_tells_the_coordinator_where_its_bad_cell_is_not_what_it_holds(tmp_path):
    pytest.importorskip("flwr", reason="needs the flower extra")
    from fedhier.deploy.mvppca import FlowerFitConfig
    from fedhier.runtime.flower import site_round

    _secret_in_b(tmp_path)
    config = FlowerFitConfig.from_toml('n_components = 1\n[views]\ncsf = ["tau", "p_tau", "ab42", "age"]\n[flower]\nsites = ["a", "b"]\n')
    reply, _ = site_round(config, "b", tmp_path / "b.csv", {"round": 1, "seed": 0, "broadcast": b""}, {})
    assert reply["status"] == "error"
    assert "column 'tau', row 3" in reply["error"] and "Jane" not in reply["error"] and "1961" not in reply["error"]


def test_other_readers_name_column_and_row_never_the_value(tmp_path, capsys):
    from fedhier.data.validation import check_sites

    table = tmp_path / "t.csv"
    _write_csv(table, ["site", "x", "y"], [["a", 1.0, 2.0], ["a", SECRET, 1.0], ["b", 0.5, 0.1], ["b", 0.2, 0.3], ["c", 0.1, 0.4]])
    assert main(["fit", "linear", str(table), "--site", "site", "--target", "y", "--features", "x",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "column 'x', row 2" in err and "Jane" not in err
    assert main(["collab", "fit", "--csv", str(table), "--site-column", "site", "--out", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err
    assert "column 'x', row 2" in err and "Jane" not in err
    view = np.array([[1.0, 2.0], [SECRET, 3.0]], dtype=object)
    with pytest.raises(ValueError) as info:
        check_sites([{"v": view}])
    assert "Jane" not in str(info.value) and "row 1, column 0" in str(info.value)


def test_a_secure_mode_overflow_names_the_site_and_bound_never_the_value():
    from fedhier.secure.secure_round import SecureAggregator

    spec = MessageSpec("r", {"s": Field((3,))})
    aggregator = SecureAggregator(3)
    bound = aggregator.fixed_point.max_abs
    secret = 3.3e12  # a site's private statistic, far above the bound
    replies = {0: {"s": np.ones(3)}, 1: {"s": np.array([1.0, secret, 2.0])}, 2: {"s": np.zeros(3)}}
    with pytest.raises(OverflowError) as info:
        aggregator.sum(spec, replies, 1, np.random.default_rng(0))
    text = str(info.value)
    assert "site 1" in text and f"{bound:.6g}" in text and "frac_bits" in text
    assert not any(s in text for s in ("3.3e+12", "3.3e12", "3300000000000"))
