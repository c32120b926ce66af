"""Declared messages: what may cross a site boundary (ARCHITECTURE "Messages").

A message is a flat mapping ``name -> numpy array`` (scalars are 0-d arrays).  Every
protocol declares the fields it may send with their shape and dtype in a
:class:`MessageSpec`; runtimes validate each message against its spec, serialise it
with :func:`encode` (a JSON header plus raw little-endian buffers -- never pickle) and
count its bytes.  A malformed message is refused with a :class:`MessageError` that
names the field and the problem.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

__all__ = ["Field", "MessageSpec", "Message", "MessageError", "encode", "decode", "header_fields", "payload_nbytes"]

Message = dict[str, np.ndarray]

#: dtypes allowed on the wire (fixed-size, no objects).
WIRE_DTYPES = frozenset({"float64", "int64", "uint64", "bool"})
#: the numpy dtype of each wire dtype, native and little-endian (the byte order on the wire)
_NATIVE = {name: np.dtype(name) for name in WIRE_DTYPES}
_LITTLE = {name: np.dtype(name).newbyteorder("<") for name in WIRE_DTYPES}
_MAGIC = b"FHM1"
#: what a reply field may reveal (see :class:`Field`)
DISCLOSURES = ("raw", "public", "release")


class MessageError(ValueError):
    """A message does not match its declared specification (its text names fields, shapes and dtypes, never values)."""

    #: safe to send across a site boundary (see :class:`fedhier.protocol.base.SiteError`)
    public_message = True


@dataclass(frozen=True)
class Field:
    """Declaration of one message field.

    Parameters
    ----------
    shape : tuple of int
        Exact shape; ``()`` for a scalar.
    dtype : str
        One of ``float64``, ``int64``, ``uint64``, ``bool``.
    optional : bool
        The field may be absent (e.g. a view the site does not measure).
    disclosure : {"raw", "public", "release"}
        What the field reveals when it leaves a site (reply fields; docs/privacy.md):
        ``"raw"`` -- computed from the site's data (the default: assume the worst);
        ``"public"`` -- public by declaration (which views a site has, participation);
        ``"release"`` -- computed only from the differentially private releases the site
        made in the same step (post-processing) and public values.  A private protocol may
        send only public and release fields (:func:`fedhier.protocol.base.check_disclosure`).
    """

    shape: tuple[int, ...] = ()
    dtype: str = "float64"
    optional: bool = False
    disclosure: str = field(default="raw", compare=False)  # not part of the wire format

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))  # compared with ndarray.shape
        if self.dtype not in WIRE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not a wire dtype {sorted(WIRE_DTYPES)}")
        if self.disclosure not in DISCLOSURES:
            raise ValueError(f"disclosure {self.disclosure!r} is not one of {list(DISCLOSURES)}")
        if any(int(s) < 0 for s in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class MessageSpec:
    """Named set of declared fields; validates, flattens and measures messages."""

    name: str
    fields: Mapping[str, Field] = field(default_factory=dict)

    def validate(self, message: Mapping[str, np.ndarray]) -> Message:
        """Return ``message`` with arrays of the declared dtype; raise :class:`MessageError`.

        Unknown fields, missing required fields, wrong shapes, wrong dtypes (other than
        a lossless integer/float widening) and non-finite floats are refused.
        """
        if not isinstance(message, Mapping):
            raise MessageError(f"{self.name}: a message must be a mapping, got {type(message).__name__}")
        fields = self.fields
        if not fields.keys() >= message.keys():
            raise MessageError(f"{self.name}: undeclared field(s) {sorted(set(message) - set(fields))}")
        out: Message = {}
        for key, decl in fields.items():
            if key not in message:
                if not decl.optional:
                    raise MessageError(f"{self.name}: required field {key!r} is missing")
                continue
            arr = message[key]
            if type(arr) is not np.ndarray:
                arr = np.asarray(arr)
            if arr.dtype.hasobject:
                raise MessageError(f"{self.name}: field {key!r} has object dtype")
            if arr.shape != decl.shape:
                raise MessageError(f"{self.name}: field {key!r} has shape {arr.shape}, declared {decl.shape}")
            wire = _NATIVE[decl.dtype]
            if arr.dtype != wire:
                if not np.can_cast(arr.dtype, wire, casting="same_kind"):
                    raise MessageError(
                        f"{self.name}: field {key!r} has dtype {arr.dtype.name}, declared {decl.dtype}"
                    )
                arr = arr.astype(wire)
            if wire.kind == "f" and not np.isfinite(arr).all():
                raise MessageError(f"{self.name}: field {key!r} contains NaN or inf")
            out[key] = arr
        return out

    def flatten(self, message: Mapping[str, np.ndarray], dtype: str = "float64") -> np.ndarray:
        """Concatenate all declared fields in declaration order, zeros for absent optional ones.

        Used by secure summation, which needs one fixed-length vector per site.
        """
        msg = self.validate(message)
        parts = [
            np.asarray(msg[k], dtype=dtype).ravel() if k in msg else np.zeros(f.size, dtype=dtype)
            for k, f in self.fields.items()
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    def unflatten(self, vector: np.ndarray) -> Message:
        """Inverse of :meth:`flatten` (every field present)."""
        vector = np.asarray(vector)
        total = sum(f.size for f in self.fields.values())
        if vector.shape != (total,):
            raise MessageError(f"{self.name}: flat vector has shape {vector.shape}, expected ({total},)")
        out: Message = {}
        pos = 0
        for key, f in self.fields.items():
            out[key] = vector[pos : pos + f.size].reshape(f.shape).astype(f.dtype)
            pos += f.size
        return out

    def subset(self, keys: Iterable[str], name: str | None = None) -> "MessageSpec":
        keys = list(keys)
        return MessageSpec(name or self.name, {k: self.fields[k] for k in keys})


def payload_nbytes(message: Mapping[str, np.ndarray]) -> int:
    """Bytes of the array payload of a message (what the spec's size tables count)."""
    return int(sum(np.asarray(v).nbytes for v in message.values()))


def encode(spec: MessageSpec, message: Mapping[str, np.ndarray]) -> bytes:
    """Serialise a validated message: magic, header length, JSON header, raw buffers."""
    msg = spec.validate(message)
    keys = sorted(msg)
    # after validation every field has its declared dtype (native byte order)
    head = _encoded_header(spec.name, tuple((k, spec.fields[k].dtype, msg[k].shape) for k in keys))
    body = b"".join(msg[k].astype(_LITTLE[spec.fields[k].dtype], copy=False).tobytes() for k in keys)
    return head + body


@functools.lru_cache(maxsize=256)
def _encoded_header(spec_name: str, fields_: tuple[tuple[str, str, tuple[int, ...]], ...]) -> bytes:
    """Magic, header length and JSON header of a message with ``fields_`` (name, dtype, shape); the same
    bytes for every message of one spec and shapes, so built once."""
    head = json.dumps({"spec": spec_name, "fields": [[k, d, list(s)] for k, d, s in fields_]}, separators=(",", ":")).encode()
    return _MAGIC + struct.pack("<I", len(head)) + head


#: largest JSON header of an encoded message; a header declares names, dtypes and shapes only
MAX_HEADER_BYTES = 2**20


def _header(data: bytes, what: str) -> tuple[dict, int]:
    """Parsed header of an encoded message; every declared size is checked against ``len(data)``.

    The bytes are untrusted: the header length, each field's dtype and shape (no negative
    dimension, sizes computed exactly) and the total payload must fit the bytes received
    before any array is built.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageError(f"{what}: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if data[:4] != _MAGIC or len(data) < 8:
        raise MessageError(f"{what}: not a fedhier message")
    (hlen,) = struct.unpack("<I", data[4:8])
    if hlen > min(MAX_HEADER_BYTES, len(data) - 8):
        raise MessageError(f"{what}: header of {hlen} bytes declared, the message has {len(data) - 8} (limit {MAX_HEADER_BYTES})")
    head = data[8 : 8 + hlen]
    parse = _parsed_header_cached if hlen <= _CACHED_HEADER_BYTES else _parsed_header
    spec_name, fields_, ends = parse(head, what)
    if ends and 8 + hlen + ends[-1] > len(data):
        key = next(k for (k, _, _), end in zip(fields_, ends) if 8 + hlen + end > len(data))
        raise MessageError(f"{what}: truncated message at field {key!r} (declared sizes exceed the {len(data)} bytes received)")
    return {"spec": spec_name, "fields": list(fields_)}, 8 + hlen


#: headers up to this length are parsed once and remembered (a message's header names its fields, dtypes and
#: shapes, so the few a protocol sends fit; longer ones, which only a sender outside the protocols makes, are not kept)
_CACHED_HEADER_BYTES = 4096


def _parsed_header(head: bytes, what: str) -> tuple[str | None, tuple[tuple[str, str, tuple[int, ...]], ...], tuple[int, ...]]:
    """Spec name, fields (name, dtype, shape) and the cumulative payload bytes after each field of a JSON
    header; refuses a corrupt header, a non-wire dtype and a negative dimension.  Messages of one spec and
    shapes share their header bytes, so each distinct header is parsed once."""
    try:
        header = json.loads(head)
        fields_ = tuple((str(k), str(d), tuple(int(n) for n in s)) for k, d, s in header["fields"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise MessageError(f"{what}: corrupt header") from exc
    payload, ends = 0, []
    for key, dtype, shape in fields_:
        if dtype not in WIRE_DTYPES:
            raise MessageError(f"{what}: field {key!r} has non-wire dtype {dtype!r}")
        if any(n < 0 for n in shape):
            raise MessageError(f"{what}: field {key!r} declares a negative dimension")
        payload += math.prod(shape) * _NATIVE[dtype].itemsize
        ends.append(payload)
    return header.get("spec") if isinstance(header, dict) else None, fields_, tuple(ends)


_parsed_header_cached = functools.lru_cache(maxsize=256)(_parsed_header)


def header_fields(data: bytes) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of each field of an encoded message, without validating it."""
    return _header(data, "message")[0]["fields"]


def decode(spec: MessageSpec, data: bytes) -> Message:
    """Parse bytes produced by :func:`encode` and validate them against ``spec``."""
    data = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    header, pos = _header(data, spec.name)
    if header["spec"] != spec.name:
        raise MessageError(f"expected a {spec.name!r} message, got {header['spec']!r}")
    msg: Message = {}
    for key, dtype, shape in header["fields"]:  # sizes already checked against len(data) by _header
        dt = _LITTLE[dtype]
        count = math.prod(shape)
        msg[key] = np.frombuffer(data, dtype=dt, count=count, offset=pos).reshape(shape).astype(_NATIVE[dtype])
        pos += count * dt.itemsize
    if pos != len(data):
        raise MessageError(f"{spec.name}: {len(data) - pos} trailing bytes")
    return spec.validate(msg)
