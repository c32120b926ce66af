"""Files are untrusted input: what fedhier checks before it believes a file or a name.

* :func:`read_npz` reads an ``.npz`` archive (a model file or a checkpoint) without trusting
  any size it declares: every array's header (shape and dtype) is checked against the
  archive member's length, and that length against the bytes the file holds, *before*
  anything is allocated; arrays are then read in chunks, so memory grows only with the
  bytes actually present.  Object arrays (pickle) are refused.
* :func:`check_finite` refuses NaN or infinite model parameters, naming the array.
* :func:`check_site_name` refuses a site name that could leave an output folder or hide in it.
* :func:`check_outputs_spare_inputs` refuses to write a result that would replace an input.
"""

from __future__ import annotations

import json
import math
import os
import unicodedata
import zipfile
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

__all__ = [
    "MAX_META_BYTES", "read_npz", "read_meta_json", "check_finite", "check_site_name", "check_outputs_spare_inputs",
]

#: largest JSON metadata entry (model hyper-parameters, history) a model file or checkpoint may hold
MAX_META_BYTES = 64 * 2**20
#: deflate cannot expand data more than ~1032-fold; a member declaring more is lying about its size
_MAX_DEFLATE_RATIO = 1032
#: dtype kinds a saved array may have: bool, integers, floats, fixed-length unicode (JSON metadata)
_ARRAY_KINDS = "biufU"
_CHUNK = 2**20


def _member_array(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> np.ndarray:
    """One ``.npy`` member, its declared sizes checked against its length before reading the data."""
    name = info.filename[: -len(".npy")]
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise ValueError(f"{what}: array {name!r} declares {info.file_size} bytes but holds {info.compress_size}")
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        if info.file_size > _MAX_DEFLATE_RATIO * info.compress_size + 1024:
            raise ValueError(f"{what}: array {name!r} declares {info.file_size} bytes, more than its {info.compress_size} "
                             "compressed bytes can hold")
    else:
        raise ValueError(f"{what}: array {name!r} uses an unsupported compression")
    try:
        fh = archive.open(info)
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError, ValueError) as exc:
        raise ValueError(f"{what}: array {name!r} cannot be opened ({exc})") from None
    with fh:
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"format version {version}")
        except (ValueError, OSError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{what}: array {name!r} has a corrupt header ({exc})") from None
        if dtype.hasobject or dtype.kind not in _ARRAY_KINDS or dtype.fields is not None:
            raise ValueError(f"{what}: array {name!r} has dtype {dtype}, not a plain number or text array")
        if any(int(n) < 0 for n in shape):
            raise ValueError(f"{what}: array {name!r} declares a negative dimension")
        nbytes = math.prod(int(n) for n in shape) * dtype.itemsize
        header = fh.tell()
        if header + nbytes != info.file_size:
            raise ValueError(f"{what}: array {name!r} declares shape {tuple(shape)} ({nbytes} bytes of {dtype}) but "
                             f"holds {info.file_size - header} bytes")
        chunks, left = [], nbytes
        try:
            while left > 0:
                chunk = fh.read(min(left, _CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
            raise ValueError(f"{what}: array {name!r} is damaged ({exc})") from None
        if left:
            raise ValueError(f"{what}: array {name!r} is truncated")
    flat = np.frombuffer(b"".join(chunks), dtype=dtype)
    return (flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)).copy()


def read_npz(path: str | os.PathLike, what: str | None = None) -> dict[str, np.ndarray]:
    """All arrays of the ``.npz`` archive at ``path``, read as untrusted input.

    Raises ValueError (naming ``what``, default the path, and the array) when the file is
    not an archive of ``.npy`` arrays, an array's declared shape does not match the bytes
    it holds, or a declared size exceeds what the file can contain.  Peak memory stays
    within a small multiple of the bytes actually present in the file.
    """
    path = Path(path)
    what = str(path) if what is None else what
    try:
        size = path.stat().st_size
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{what}: not an .npz archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if sum(info.compress_size for info in infos) > size:
            raise ValueError(f"{what}: the archive declares more bytes than the file holds ({size})")
        arrays: dict[str, np.ndarray] = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise ValueError(f"{what}: unexpected member {info.filename!r}, not an array")
            arrays[info.filename[: -len(".npy")]] = _member_array(archive, info, what)
    return arrays


def read_meta_json(arrays: Mapping[str, np.ndarray], key: str, what: str) -> dict:
    """Parse the JSON metadata entry ``key`` (uint8 bytes or a 0-d text array), at most :data:`MAX_META_BYTES`."""
    raw = arrays.get(key)
    if raw is None:
        raise ValueError(f"{what}: no {key!r} entry; not a file written by fedhier")
    if raw.dtype.kind == "U" and raw.ndim == 0:
        text = str(raw)
        too_long = len(text) * 4 > MAX_META_BYTES
    elif raw.dtype == np.uint8 and raw.ndim == 1:
        too_long = raw.size > MAX_META_BYTES
        text = None if too_long else raw.tobytes().decode("utf-8", errors="strict")
    else:
        raise ValueError(f"{what}: the {key!r} entry is not JSON text")
    if too_long:
        raise ValueError(f"{what}: the {key!r} entry exceeds {MAX_META_BYTES} bytes")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"{what}: the {key!r} entry is not valid JSON") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{what}: the {key!r} entry is not a JSON object")
    return meta


def check_finite(arrays: Mapping[str, np.ndarray], what: str, *, nan_means_unknown: Iterable[str] = ()) -> None:
    """Refuse a NaN or infinite entry in any float array of ``arrays``, naming the first such array.

    Arrays named in ``nan_means_unknown`` may hold NaN (an entry this model does not know,
    e.g. another site's threshold after an MPI fit), never an infinity.
    """
    nan_ok = set(nan_means_unknown)
    for name, value in arrays.items():
        value = np.asarray(value)
        if value.dtype.kind not in "fc":
            continue
        bad = np.isinf(value) if name in nan_ok else ~np.isfinite(value)
        if bad.any():
            raise ValueError(f"{what}: parameter array {name!r} contains NaN or infinite values; the file is damaged")


def check_site_name(name: object, where: str) -> str:
    """``name`` if it can name a site's output file; else ValueError naming it.

    Refused: non-strings, the empty name, names starting with ``.`` (hidden files, ``..``),
    path separators (``/``, ``\\``), control characters and surrounding spaces.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: site name {name!r} must be a non-empty string")
    bad = (
        name.startswith(".")
        or name != name.strip()
        or any(sep in name for sep in ("/", "\\", os.sep, os.altsep or "/"))
        or any(unicodedata.category(c).startswith("C") for c in name)
    )
    if bad:
        raise ValueError(
            f"{where}: site name {name!r} is not allowed (no path separators, no leading '.', no control "
            "characters, no surrounding spaces)"
        )
    return name


def check_outputs_spare_inputs(outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike]) -> None:
    """ValueError if an output path is (resolves to, or is a link to) one of the input files; nothing is written."""
    real_inputs = [(Path(p), Path(p).resolve()) for p in inputs if p is not None]
    for out in outputs:
        out = Path(out)
        resolved = out.resolve()
        for given, real in real_inputs:
            same = resolved == real
            if not same and out.exists() and given.exists():
                try:
                    same = os.path.samefile(out, given)
                except OSError:
                    same = False
            if same:
                raise ValueError(f"the output {out} would overwrite the input file {given}; choose another output folder")
