"""TiDB keys against hand-built bytes and an independent encoder."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.plugins.sources.tikv.tidb import keys

I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def ref_encode_int(v):
    # Independent: map the signed range onto the unsigned one by adding 2^63.
    return struct.pack(">Q", v + (1 << 63))


def ref_encode_bytes(data):
    out = b""
    i = 0
    while True:
        chunk = data[i : i + 8]
        i += 8
        if len(chunk) == 8:
            out += chunk + b"\xff"
            if i == len(data):
                return out + b"\x00" * 8 + b"\xf7"
        else:
            return out + chunk.ljust(8, b"\x00") + bytes([0xFF - (8 - len(chunk))])


def test_encode_int_hand_built():
    assert keys.encode_int(0) == bytes.fromhex("8000000000000000")
    assert keys.encode_int(1) == bytes.fromhex("8000000000000001")
    assert keys.encode_int(-1) == bytes.fromhex("7fffffffffffffff")
    assert keys.encode_int(-(1 << 63)) == bytes(8)
    assert keys.decode_int(bytes.fromhex("7ffffffffffffffe")) == -2


def test_record_key_hand_built():
    key = keys.record_key(100, 7)
    assert key == b"t\x80\x00\x00\x00\x00\x00\x00\x64_r\x80\x00\x00\x00\x00\x00\x00\x07"
    assert len(key) == keys.RECORD_ROW_KEY_LEN
    rk = keys.decode_record_key(key)
    assert rk == keys.RecordKey(100, 7)
    assert rk.is_int_handle
    assert keys.is_record_key(key)
    assert not keys.is_index_key(key)
    assert keys.decode_table_id(key) == 100


def test_common_handle_key_is_kept_encoded():
    handle = b"\x01" + keys.encode_bytes(b"abc")
    key = keys.record_key(5, handle)
    rk = keys.decode_record_key(key)
    assert rk.table_id == 5
    assert rk.handle == handle
    assert not rk.is_int_handle


def test_index_key_detection():
    key = keys.index_prefix(100, 1) + b"\x03" + keys.encode_int(5)
    assert keys.is_index_key(key)
    assert not keys.is_record_key(key)
    with pytest.raises(keys.KeyFormatError):
        keys.decode_record_key(key)
    assert not keys.is_record_key(b"m\x00\x01")


def test_table_record_span():
    start, end = keys.table_record_span(100)
    assert start == b"t\x80\x00\x00\x00\x00\x00\x00\x64_r"
    assert end == b"t\x80\x00\x00\x00\x00\x00\x00\x64_s"
    assert start <= keys.record_key(100, -(1 << 63)) < keys.record_key(100, (1 << 63) - 1) < end
    assert not start <= keys.index_prefix(100, 1) < end


def test_encode_bytes_hand_built():
    assert keys.encode_bytes(b"") == bytes(8) + b"\xf7"
    assert keys.encode_bytes(b"\x01\x02\x03") == b"\x01\x02\x03" + bytes(5) + b"\xfa"
    assert keys.encode_bytes(b"12345678") == b"12345678\xff" + bytes(8) + b"\xf7"
    assert keys.encode_bytes(b"123456789") == b"12345678\xff9" + bytes(7) + b"\xf8"


@pytest.mark.parametrize(
    "bad",
    [b"", b"\x00" * 8, b"abc\x01\x00\x00\x00\x00\xfa", b"\x00" * 8 + b"\xf0"],
)
def test_decode_bytes_rejects_malformed(bad):
    with pytest.raises(keys.KeyFormatError):
        keys.decode_bytes(bad)


@given(I64)
def test_int_round_trip_against_reference(v):
    assert keys.encode_int(v) == ref_encode_int(v)
    assert keys.decode_int(ref_encode_int(v)) == v


@given(I64, I64)
def test_int_order_is_byte_order(a, b):
    assert (a < b) == (keys.encode_int(a) < keys.encode_int(b))


@given(st.binary(max_size=40))
def test_bytes_round_trip_against_reference(data):
    enc = ref_encode_bytes(data)
    assert keys.encode_bytes(data) == enc
    assert keys.decode_bytes(enc + b"tail") == (data, len(enc))


@given(st.binary(max_size=24), st.binary(max_size=24))
def test_memcomparable_order(a, b):
    assert (a < b) == (keys.encode_bytes(a) < keys.encode_bytes(b))


@given(st.integers(min_value=1, max_value=(1 << 48)), I64)
def test_record_key_round_trip(table_id, handle):
    key = b"t" + ref_encode_int(table_id) + b"_r" + ref_encode_int(handle)
    assert keys.record_key(table_id, handle) == key
    assert keys.decode_record_key(key) == keys.RecordKey(table_id, handle)
