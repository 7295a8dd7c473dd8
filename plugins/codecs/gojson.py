"""Go's ``encoding/json`` and ``strconv`` conventions, for byte-compatible codecs.

TiCDC writes its JSON protocols with Go's ``json.Marshal``: compact, struct
fields in declaration order, map keys sorted, ``<``, ``>``, ``&``, U+2028 and
U+2029 escaped as ``\\u003c`` …, floats in the shortest form that round-trips
(``1`` not ``1.0``; exponent form below 1e-6 and from 1e21 up). The helpers
here reproduce those bytes from Python values; ``go_quote`` reproduces
``strconv.Quote`` (without the surrounding quotes), which the Open Protocol
uses for binary strings.
"""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any

__all__ = ["escape_html", "go_float", "go_float_plain", "go_float_value", "go_json", "go_quote", "go_unquote"]

_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class GoFloat(float):
    """A float written the way Go's encoding/json writes it (see :func:`go_float`)."""

    bits: int = 64


class GoFloat32(GoFloat):
    """A FLOAT column value: formatted with float32's shortest round-trip digits."""

    bits = 32


def _shortest_digits(value: float, bits: int) -> str:
    """``repr``-like shortest text of ``value`` as a float of ``bits`` bits."""
    if bits == 64:
        return repr(value)
    target = struct.pack("<f", value)
    for precision in range(1, 10):
        text = f"{value:.{precision}g}"
        if _pack_float32(float(text)) == target:
            return text
    return repr(value)


#: The largest float32, and the bound below which larger numbers still round to it
#: (half a unit in the last place above it, 2**103).
_FLOAT32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]
_FLOAT32_ROUNDS_TO_MAX = _FLOAT32_MAX + 2.0**103


def _pack_float32(number: float) -> bytes:
    """``number`` rounded to float32 as Go's ParseFloat(…, 32) rounds it: texts just above
    the largest float32 (``3.4028235e+38``) round to it, where ``struct`` refuses them."""
    try:
        return struct.pack("<f", number)
    except OverflowError:
        if abs(number) < _FLOAT32_ROUNDS_TO_MAX:
            return struct.pack("<f", math.copysign(_FLOAT32_MAX, number))
        return b""  # rounds to infinity: never the bytes of a finite float32


def go_float(value: float, bits: int = 64) -> str:
    """``value`` as Go's encoding/json writes a float64 (or float32) number."""
    if value == 0:
        return "0" if math.copysign(1.0, value) > 0 else "-0"
    text = _shortest_digits(value, bits)
    if 1e-6 <= abs(value) < 1e21:
        return _plain(text)
    mantissa, _, exponent = format(Decimal(text), "e").partition("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    sign = "-" if exponent.startswith("-") else "+"
    digits = exponent.lstrip("+-")
    if sign == "+" and len(digits) < 2:
        digits = digits.rjust(2, "0")
    return f"{mantissa}e{sign}{digits}"


def go_float_plain(value: float, bits: int = 64) -> str:
    """``strconv.FormatFloat(v, 'f', -1, bits)``: shortest digits, never an exponent."""
    if value == 0:
        return "0" if math.copysign(1.0, value) > 0 else "-0"
    return _plain(_shortest_digits(value, bits))


def _plain(text: str) -> str:
    plain = format(Decimal(text), "f")
    if "." in plain:
        plain = plain.rstrip("0").rstrip(".")
    return plain


def _encode(value: Any) -> str:
    """JSON text of ``value`` before HTML escaping (see :func:`go_json`)."""
    if isinstance(value, str):
        return encode_basestring(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return go_float_value(value)
    if isinstance(value, dict):
        return "{" + ",".join(encode_basestring(str(k)) + ":" + _encode(v) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return json.dumps(value)


def go_float_value(value: float) -> str:
    """A float value as Go writes it; NaN and ±Inf (which Go refuses) as 0."""
    if math.isnan(value) or math.isinf(value):
        return "0"
    return go_float(float(value), value.bits if isinstance(value, GoFloat) else 64)


def escape_html(text: str) -> str:
    """Go's HTML-safe escaping of ``<``, ``>``, ``&``, U+2028 and U+2029 (only found inside strings)."""
    for char, escaped in _HTML_ESCAPES.items():
        if char in text:
            text = text.replace(char, escaped)
    return text


def go_json(value: Any) -> bytes:
    """Compact JSON of ``value`` as Go's ``json.Marshal`` writes it.

    Dict keys are written in the dict's order: callers pass struct-like dicts
    in Go's field order and map-like dicts already sorted.
    """
    return escape_html(_encode(value)).encode("utf-8")


# -- strconv.Quote ---------------------------------------------------------------

_SHORT_ESCAPES = {0x07: "\\a", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v"}


def go_quote(data: bytes) -> str:
    """``strconv.Quote(string(data))`` without the surrounding double quotes.

    Printable characters stay as they are, ``"`` and ``\\`` are escaped, bytes
    that are not valid UTF-8 become ``\\xNN`` and other non-printable
    characters ``\\a`` … ``\\v``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``.
    """
    out: list[str] = []
    i = 0
    while i < len(data):
        char, width = _decode_rune(data, i)
        if char is None:
            out.append(f"\\x{data[i]:02x}")
            i += 1
            continue
        i += width
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif code in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[code])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def _decode_rune(data: bytes, i: int) -> tuple[str | None, int]:
    first = data[i]
    if first < 0x80:
        return chr(first), 1
    width = 2 if first >> 5 == 0b110 else 3 if first >> 4 == 0b1110 else 4 if first >> 3 == 0b11110 else 0
    if not width or i + width > len(data):
        return None, 1
    try:
        return data[i : i + width].decode("utf-8"), width
    except UnicodeDecodeError:
        return None, 1


_UNESCAPES = {"a": 0x07, "b": 0x08, "f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B, '"': 0x22, "\\": 0x5C}


def go_unquote(text: str) -> bytes:
    """The bytes :func:`go_quote` was given (inverse of ``go_quote``)."""
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        kind = text[i + 1] if i + 1 < len(text) else ""
        if kind in _UNESCAPES:
            out.append(_UNESCAPES[kind])
            i += 2
        elif kind == "x":
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        elif kind in ("u", "U"):
            width = 4 if kind == "u" else 8
            out += chr(int(text[i + 2 : i + 2 + width], 16)).encode("utf-8")
            i += 2 + width
        else:
            raise ValueError(f"bad escape {text[i : i + 2]!r} at {i} in a Go-quoted string")
    return bytes(out)
