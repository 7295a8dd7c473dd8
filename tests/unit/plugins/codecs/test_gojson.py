import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.plugins.codecs.gojson import GoFloat32, go_float, go_float_plain, go_json, go_quote, go_unquote


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (1.5, "1.5"),
        (-0.25, "-0.25"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-10, "1.5e-10"),
        (1.5e300, "1.5e+300"),
        (123456789.125, "123456789.125"),
    ],
)
def test_float_like_go_encoding_json(value, text):
    assert go_float(value) == text


def test_float32_uses_float32_shortest_digits():
    # 0.1 stored in a FLOAT column comes back as 0.10000000149011612 in float64.
    assert go_json(GoFloat32(0.10000000149011612)) == b"0.1"
    assert go_json(0.10000000149011612) == b"0.10000000149011612"


def test_the_largest_float32_is_written_as_go_writes_it():
    # strconv.FormatFloat(math.MaxFloat32, 'e', -1, 32): its shortest text is above the
    # value itself, and still parses back to it as a float32.
    largest = 3.4028234663852886e38
    assert go_json([GoFloat32(largest), GoFloat32(-largest)]) == b"[3.4028235e+38,-3.4028235e+38]"
    assert go_json(GoFloat32(3.4e38)) == b"3.4e+38"


def test_nan_and_inf_are_zero():
    assert go_json([math.nan, math.inf, -math.inf]) == b"[0,0,0]"


def test_plain_float_never_uses_exponent():
    assert go_float_plain(1e21) == "1000000000000000000000"
    assert go_float_plain(1e-7) == "0.0000001"


def test_json_escapes_html_like_go():
    assert go_json({"q": "a<b>&c\u2028"}) == b'{"q":"a\\u003cb\\u003e\\u0026c\\u2028"}'
    assert go_json("é\n\x01") == '"é\\n\\u0001"'.encode()


@pytest.mark.parametrize(
    ("data", "quoted"),
    [
        (b"\x89PNG\r\n\x1a\n", "\\x89PNG\\r\\n\\x1a\\n"),
        (b'a"b\\c', 'a\\"b\\\\c'),
        ("héllo".encode(), "héllo"),
        (b"\x00\x7f\x07\x0b", "\\x00\\x7f\\a\\v"),
        ("\u00a0\u200b".encode(), "\\u00a0\\u200b"),
        ("\U000e0001".encode(), "\\U000e0001"),
        (b"\xe2\x82", "\\xe2\\x82"),
    ],
)
def test_quote_like_go_strconv(data, quoted):
    assert go_quote(data) == quoted
    assert go_unquote(quoted) == data


@settings(deadline=None)  # timing varies on a shared machine; correctness does not
@given(st.binary(max_size=64))
def test_quote_round_trips(data):
    assert go_unquote(go_quote(data)) == data
