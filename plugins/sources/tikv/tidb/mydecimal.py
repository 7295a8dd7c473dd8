"""MySQL's binary DECIMAL format, as TiDB stores DECIMAL values.

A value of precision ``p`` and scale ``f`` has ``p - f`` integer digits and
``f`` fraction digits, each side cut into words of 9 decimal digits stored as
4-byte big-endian integers; a partial word (fewer than 9 digits) takes 1–4
bytes (``_DIG2BYTES``). The integer side puts its partial word first, the
fraction side last. Negative values have every byte inverted; finally the
top bit of the first byte is flipped, so that the bytes sort like the numbers.

In a row value TiDB prefixes the binary form with one precision byte and one
scale byte (:func:`encode_row_decimal` / :func:`decode_row_decimal`).
"""

from __future__ import annotations

import decimal
import functools

__all__ = [
    "DecimalFormatError",
    "bin_size",
    "decode_bin",
    "decode_row_decimal",
    "decode_row_value",
    "encode_bin",
    "encode_row_decimal",
]

_DIGITS_PER_WORD = 9
_WORD_SIZE = 4
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
#: MySQL/TiDB limits: at most 65 digits, at most 30 after the point.
MAX_PRECISION = 65
MAX_SCALE = 30


class DecimalFormatError(ValueError):
    """Bytes that are not a binary decimal of the stated precision and scale."""


def _check(precision: int, frac: int) -> None:
    if not (1 <= precision <= MAX_PRECISION and 0 <= frac <= MAX_SCALE and frac <= precision):
        raise DecimalFormatError(f"bad decimal precision/scale ({precision},{frac})")


def _sizes(digits: int, leading_partial: bool) -> list[int]:
    """Digit counts of the words of one side, in storage order."""
    full, partial = divmod(digits, _DIGITS_PER_WORD)
    words = [_DIGITS_PER_WORD] * full
    if partial:
        if leading_partial:
            words.insert(0, partial)
        else:
            words.append(partial)
    return words


def bin_size(precision: int, frac: int) -> int:
    """Number of bytes of the binary form."""
    _check(precision, frac)
    words = _sizes(precision - frac, True) + _sizes(frac, False)
    return sum(_DIG2BYTES[n] for n in words)


def encode_bin(value: decimal.Decimal, precision: int, frac: int) -> bytes:
    """Binary form of ``value`` rounded half-up to ``frac`` places; raises if it does not fit."""
    _check(precision, frac)
    if not value.is_finite():
        raise DecimalFormatError(f"cannot store {value} as DECIMAL")
    quantum = decimal.Decimal(1).scaleb(-frac)
    with decimal.localcontext() as ctx:
        ctx.prec = MAX_PRECISION + 10
        rounded = value.quantize(quantum, rounding=decimal.ROUND_HALF_UP)
    sign, digit_tuple, _ = rounded.as_tuple()
    digits = "".join(map(str, digit_tuple)).rjust(frac + 1, "0")
    int_digits, frac_digits = digits[: len(digits) - frac], digits[len(digits) - frac :]
    int_digits = int_digits.lstrip("0")
    intg = precision - frac
    if len(int_digits) > intg:
        raise DecimalFormatError(f"{value} does not fit DECIMAL({precision},{frac})")
    int_digits = int_digits.rjust(intg, "0")
    out = bytearray()
    pos = 0
    for n in _sizes(intg, True):
        out += int(int_digits[pos : pos + n]).to_bytes(_DIG2BYTES[n], "big")
        pos += n
    pos = 0
    for n in _sizes(frac, False):
        out += int(frac_digits[pos : pos + n]).to_bytes(_DIG2BYTES[n], "big")
        pos += n
    if sign and any(c != "0" for c in digits):
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


@functools.lru_cache(maxsize=256)
def _layout(precision: int, frac: int) -> tuple[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Byte size and word digit counts (integer side, fraction side) of DECIMAL(precision, frac)."""
    return bin_size(precision, frac), (tuple(_sizes(precision - frac, True)), tuple(_sizes(frac, False)))


#: One word of a binary decimal: (shift from the right, mask, 10**digits, digits).
_Word = tuple[int, int, int, int]


@functools.lru_cache(maxsize=256)
def _words(precision: int, frac: int) -> tuple[int, tuple[_Word, ...], tuple[_Word, ...]]:
    """Byte size, and per side the words as (shift from the right, mask, 10**digits, digits), in storage order."""
    size, sides = _layout(precision, frac)
    shift = size * 8
    out: list[tuple[_Word, ...]] = []
    for words in sides:
        side = []
        for n in words:
            bits = _DIG2BYTES[n] * 8
            shift -= bits
            side.append((shift, (1 << bits) - 1, 10**n, n))
        out.append(tuple(side))
    return size, out[0], out[1]


def decode_bin(data: bytes, precision: int, frac: int, offset: int = 0) -> tuple[decimal.Decimal, int]:
    """Decode the binary form at ``data[offset:]``; returns (value, end offset).

    The form is read as one big-endian integer and split into its words by
    shifts; the value is spelled as its digits and parsed, so the Decimal is
    the one the text ``[-]int.frac`` gives (``-0.00`` included).
    """
    size, int_words, frac_words = _words(precision, frac)
    raw = data[offset : offset + size]
    if len(raw) != size:
        raise DecimalFormatError(f"DECIMAL({precision},{frac}) needs {size} bytes, have {len(raw)}")
    bits = size * 8
    number = int.from_bytes(raw, "big") ^ (1 << (bits - 1))
    negative = bool(number >> (bits - 1))  # the sign bit was clear: negative, stored inverted
    if negative:
        number ^= (1 << bits) - 1
    whole = _join_words(number, int_words, precision, frac, "int")
    text = ("-" if negative else "") + str(whole)
    if frac:
        text += f".{_join_words(number, frac_words, precision, frac, 'frac'):0{frac}d}"
    return decimal.Decimal(text), offset + size


def _join_words(number: int, words: tuple[_Word, ...], precision: int, frac: int, part: str) -> int:
    """The digits of the ``part`` words of ``number`` (see :func:`_words`) as one integer;
    DecimalFormatError for a word out of its range."""
    value = 0
    for shift, mask, limit, _ in words:
        word = (number >> shift) & mask
        if word >= limit:
            raise DecimalFormatError(f"corrupt DECIMAL({precision},{frac}) {part} word {word}")
        value = value * limit + word
    return value


def encode_row_decimal(value: decimal.Decimal, precision: int, frac: int) -> bytes:
    """``[precision][frac][binary]``: a DECIMAL inside a row value."""
    return bytes([precision, frac]) + encode_bin(value, precision, frac)


def decode_row_value(data: bytes) -> decimal.Decimal:
    """A whole DECIMAL column value of a v2 row (``[precision][frac][binary]``, nothing after).

    :func:`decode_row_decimal` at offset 0 plus the check that the value ends
    there, in one call: the same Decimal, the same errors.
    """
    if len(data) < 2:
        raise DecimalFormatError("DECIMAL value shorter than its precision and scale bytes")
    dec, end = decode_bin(data, data[0], data[1], 2)
    if end != len(data):
        raise DecimalFormatError(f"{len(data) - end} stray bytes after a DECIMAL value")
    return dec


def decode_row_decimal(data: bytes, offset: int = 0) -> tuple[decimal.Decimal, int]:
    if len(data) < offset + 2:
        raise DecimalFormatError("DECIMAL value shorter than its precision and scale bytes")
    return decode_bin(data, data[offset], data[offset + 1], offset + 2)
