"""read_npz reads every legitimate archive numpy writes, and refuses the ones whose sizes lie."""

import zipfile

import numpy as np
import pytest

from fedhier.utils.untrusted import check_outputs_spare_inputs, check_site_name, read_npz


def test_read_npz_gives_back_what_numpy_wrote(tmp_path):
    arrays = {
        "zeros": np.zeros(4 * 10**6),  # compresses about 1000-fold, near deflate's limit
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "ints": np.arange(5, dtype=np.int64),
        "flags": np.array([True, False]),
        "meta": np.array('{"x": 1}'),
        "empty": np.zeros((0, 3)),
    }
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, **arrays)
        back = read_npz(path)
        assert set(back) == set(arrays)
        for name, value in arrays.items():
            np.testing.assert_array_equal(back[name], value)
            assert back[name].dtype == value.dtype and back[name].shape == value.shape


def test_read_npz_refuses_a_deflated_member_declaring_more_than_deflate_can_hold(tmp_path):
    path = tmp_path / "m.npz"
    np.savez_compressed(path, a=np.random.default_rng(0).normal(size=1000))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.infolist()[0]
    # the central directory's uncompressed size: offset 24 of the entry that starts with PK\1\2
    central = data.rindex(b"PK\x01\x02")
    data[central + 24 : central + 28] = (2**31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert info.file_size < 2**31
    with pytest.raises(ValueError, match="'a' declares 2147483648 bytes"):
        read_npz(path)
    with pytest.raises(ValueError, match="not an .npz archive"):
        read_npz(tmp_path / "missing.npz")
    (tmp_path / "pickle.npz").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ValueError, match="not an .npz archive"):
        read_npz(tmp_path / "pickle.npz")


def test_site_names_and_output_paths(tmp_path):
    for good in ("hospital-a", "site 1", "Zürich", "a.b"):
        assert check_site_name(good, "x") == good
    for bad in ("a/b", "..", ".a", "", " a", "a\nb", None):
        with pytest.raises(ValueError, match="site name"):
            check_site_name(bad, "x")
    data = tmp_path / "data.csv"
    data.write_text("x\n1\n")
    link = tmp_path / "out" / "model.npz"
    link.parent.mkdir()
    link.symlink_to(data)
    with pytest.raises(ValueError, match="would overwrite the input file"):
        check_outputs_spare_inputs([link], [data])
    with pytest.raises(ValueError, match="would overwrite the input file"):
        check_outputs_spare_inputs([tmp_path / "out" / ".." / "data.csv"], [data])
    check_outputs_spare_inputs([tmp_path / "out" / "summary.json"], [data])
