"""An encoder of TiDB row values written for the tests, independently of the product code.

It follows the layout descriptions (rowcodec v2, MySQL binary decimal, packed
time, binary JSON) with deliberately different techniques — digit arithmetic
instead of string slicing, explicit byte loops instead of struct tables — so
that a shared misunderstanding shows up as a failing round trip.
"""

import datetime as dt
import decimal
import math
import struct

V2 = 128


def le_int(v, signed):
    for width in (1, 2, 4, 8):
        bits = width * 8
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
        if lo <= v < hi:
            return (v % (1 << bits)).to_bytes(width, "little")
    raise ValueError(v)


def cmp_float(f):
    (u,) = struct.unpack(">Q", struct.pack(">d", f))
    positive = math.copysign(1.0, f) > 0 or f == 0
    u = u | (1 << 63) if positive else (1 << 64) - 1 - u
    return u.to_bytes(8, "big")


def bin_decimal(value, precision, scale):
    """MySQL binary decimal by integer arithmetic on the scaled value."""
    sizes = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
    with decimal.localcontext() as ctx:
        ctx.prec = 100
        scaled = int(abs(value).scaleb(scale).to_integral_value(rounding=decimal.ROUND_HALF_UP))
    int_part, frac_part = divmod(scaled, 10**scale)
    intg = precision - scale
    out = b""
    # integer side: most significant partial word first
    words = []
    n = intg
    while n > 0:
        take = 9 if n >= 9 else n
        words.append(take)
        n -= take
    words.reverse()  # partial (if any) now first ... widths from least significant
    chunks = []
    rest = int_part
    for take in reversed(words):
        rest, w = divmod(rest, 10**take)
        chunks.append((w, take))
    assert rest == 0
    for w, take in reversed(chunks):
        out += w.to_bytes(sizes[take], "big")
    # fraction side: full words first, partial last
    digits_left = scale
    rest = frac_part
    while digits_left > 0:
        take = min(9, digits_left)
        digits_left -= take
        w = rest // 10**digits_left
        rest = rest % 10**digits_left
        out += w.to_bytes(sizes[take], "big")
    if value < 0 and scaled != 0:
        out = bytes(255 - b for b in out)
    return bytes([out[0] ^ 0x80]) + out[1:]


def packed_time(t):
    if isinstance(t, dt.datetime):
        if t.tzinfo is not None:
            t = t.astimezone(dt.UTC)
        hms = t.hour * 4096 + t.minute * 64 + t.second
        micro = t.microsecond
    else:
        hms = micro = 0
    ymd = (t.year * 13 + t.month) * 32 + t.day
    return (ymd * (1 << 17) + hms) * (1 << 24) + micro


def uvarint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def json_bin(v):
    """Returns (type code, body)."""
    if v is None or v is True or v is False:
        return 4, bytes([{None: 0, True: 1, False: 2}[v]])
    if isinstance(v, int):
        return (9, struct.pack("<q", v)) if v < (1 << 63) else (10, struct.pack("<Q", v))
    if isinstance(v, float):
        return 11, struct.pack("<d", v)
    if isinstance(v, str):
        raw = v.encode()
        return 12, uvarint(len(raw)) + raw
    is_obj = isinstance(v, dict)
    items = sorted((k.encode(), x) for k, x in v.items()) if is_obj else [(None, x) for x in v]
    n = len(items)
    header = 8 + (6 * n if is_obj else 0) + 5 * n
    keys_blob = b"".join(k for k, _ in items) if is_obj else b""
    key_entries = b""
    off = header
    for k, _ in items:
        if is_obj:
            key_entries += struct.pack("<IH", off, len(k))
            off += len(k)
    vals_blob = b""
    val_entries = b""
    base = header + len(keys_blob)
    for _, x in items:
        tp, body = json_bin(x)
        if tp == 4:
            val_entries += bytes([4]) + struct.pack("<I", body[0])
        else:
            val_entries += bytes([tp]) + struct.pack("<I", base + len(vals_blob))
            vals_blob += body
    size = base + len(vals_blob)
    return (1 if is_obj else 3), struct.pack("<II", n, size) + key_entries + val_entries + keys_blob + vals_blob


def row_v2(cols, *, checksum=False, force_large=False):
    """cols: {col_id: bytes or None}."""
    nn = sorted(c for c in cols if cols[c] is not None)
    nulls = sorted(c for c in cols if cols[c] is None)
    data = b"".join(cols[c] for c in nn)
    large = force_large or max(cols, default=0) > 255 or len(data) > 65535
    w_id, w_off = (4, 4) if large else (1, 2)
    out = bytes([V2, (1 if large else 0) | (2 if checksum else 0)])
    out += len(nn).to_bytes(2, "little") + len(nulls).to_bytes(2, "little")
    for c in nn + nulls:
        out += c.to_bytes(w_id, "little")
    total = 0
    for c in nn:
        total += len(cols[c])
        out += total.to_bytes(w_off, "little")
    out += data
    if checksum:
        out += bytes([1]) + (0xDEADBEEF).to_bytes(4, "little")
    return out
