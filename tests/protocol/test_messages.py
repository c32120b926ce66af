import numpy as np
import pytest

from fedhier.protocol.messages import Field, MessageError, MessageSpec, decode, encode, header_fields

SPEC = MessageSpec("toy", {"a": Field((2, 3)), "n": Field((), "int64"), "opt": Field((4,), optional=True)})


def test_round_trip_is_exact_and_self_describing():
    rng = np.random.default_rng(0)
    msg = {"a": rng.normal(size=(2, 3)), "n": np.int64(7)}
    data = encode(SPEC, msg)
    back = decode(SPEC, data)
    assert set(back) == {"a", "n"}
    np.testing.assert_array_equal(back["a"], msg["a"])
    assert back["n"] == 7 and back["n"].dtype == np.int64
    assert [f[0] for f in header_fields(data)] == ["a", "n"]
    assert b"pickle" not in data and not data.startswith(b"\x80")


@pytest.mark.parametrize(
    "msg, words",
    [
        ({"a": np.zeros((3, 2)), "n": 1}, "shape"),
        ({"n": 1}, "missing"),
        ({"a": np.zeros((2, 3)), "n": 1, "zzz": np.zeros(1)}, "undeclared"),
        ({"a": np.full((2, 3), np.inf), "n": 1}, "NaN or inf"),
        ({"a": np.zeros((2, 3)), "n": 1.5}, "dtype"),
        ({"a": np.array([["x"] * 3] * 2, dtype=object), "n": 1}, "object"),
    ],
)
def test_malformed_messages_are_refused_with_the_field_named(msg, words):
    with pytest.raises(MessageError, match=words):
        SPEC.validate(msg)


def test_decode_refuses_wrong_spec_truncation_and_garbage():
    data = encode(SPEC, {"a": np.ones((2, 3)), "n": 2})
    with pytest.raises(MessageError, match="expected a 'other'"):
        decode(MessageSpec("other", SPEC.fields), data)
    with pytest.raises(MessageError, match="truncated"):
        decode(SPEC, data[:-3])
    with pytest.raises(MessageError, match="trailing"):
        decode(SPEC, data + b"\0")
    with pytest.raises(MessageError, match="not a fedhier message"):
        decode(SPEC, b"\x80\x04garbage")


def test_flatten_fills_absent_optional_fields_with_zeros_and_unflattens():
    msg = {"a": np.arange(6.0).reshape(2, 3), "n": 3}
    flat = SPEC.flatten(msg)
    assert flat.shape == (6 + 1 + 4,)
    np.testing.assert_array_equal(flat[-4:], 0.0)
    back = SPEC.unflatten(flat)
    np.testing.assert_array_equal(back["a"], msg["a"])
    assert back["n"] == 3


def test_strided_big_endian_and_widened_fields_round_trip_as_little_endian_c_order():
    """The bytes on the wire are the values in C order, little-endian, whatever the sender's layout."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 2)).T  # (2, 3), not C-contiguous
    msg = {"a": a.astype(">f8"), "n": np.int32(-3), "opt": np.arange(4)}  # big-endian; int widened; int to float
    data = encode(SPEC, msg)
    back = decode(SPEC, bytearray(data))
    np.testing.assert_array_equal(back["a"], a)
    assert back["a"].dtype == np.dtype("float64") and back["a"].flags.writeable
    assert back["n"] == -3 and back["n"].dtype == np.int64
    np.testing.assert_array_equal(back["opt"], np.arange(4.0))
    fields = {k: (dtype, shape) for k, dtype, shape in header_fields(data)}
    assert fields["a"] == ("float64", (2, 3))
    payload = data[-(6 * 8 + 8 + 4 * 8):]  # fields in sorted order: a, n, opt
    assert payload[:48] == np.ascontiguousarray(a).astype("<f8").tobytes()


def test_a_remembered_header_still_checks_each_message_against_its_own_bytes():
    """Decoding parses a header once and remembers it; every later message with the same header is still
    refused when its body is cut short, padded, holds a NaN, or declares another spec."""
    good = encode(SPEC, {"a": np.ones((2, 3)), "n": 2})
    np.testing.assert_array_equal(decode(SPEC, good)["a"], np.ones((2, 3)))  # the header is now remembered
    with pytest.raises(MessageError, match="truncated message at field 'n'"):
        decode(SPEC, good[:-1])
    with pytest.raises(MessageError, match="trailing bytes"):
        decode(SPEC, good + b"\0")
    nan = bytearray(good)
    nan[-16:-8] = np.array([np.nan]).tobytes()  # the last entry of "a" (the body is a, then n)
    with pytest.raises(MessageError, match="'a' contains NaN or inf"):
        decode(SPEC, bytes(nan))
    with pytest.raises(MessageError, match="expected a 'other'"):
        decode(MessageSpec("other", SPEC.fields), good)
