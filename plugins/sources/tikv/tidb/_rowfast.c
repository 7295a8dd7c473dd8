/*
 * Native decoding of TiDB's small v2 row values: the mounter's fast path in C.
 *
 * A Layout is what cdcflow.plugins.sources.tikv.tidb.mounter compiles once per
 * (table version, column-id header): for each column of the image, in the
 * image's order, where its value comes from (the key's handle, a constant, or
 * the i-th stored value) and how a stored value is decoded.  Layout.decode
 * (value, handle) returns the image dict, the same dict the Python layout
 * gives.
 *
 * Anything this code does not take the way the Python decoders do -- a value
 * out of its range, a zero date, a JSON document with opaque or temporal
 * values, unsorted keys, bytes that are not UTF-8, a malformed header --
 * raises ValueError.  The mounter then decodes that row with its Python path,
 * which gives the row, or the coded error it always gave.  So this module may
 * refuse more than Python does, never accept more, and where it accepts, its
 * values equal Python's (tests/unit/sources/tikv/test_rowfast.py compares both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum {
    K_HANDLE = 0,   /* the key's int handle */
    K_CONST = 1,    /* a constant: None for a NULL, the origin default when absent */
    K_INT = 2,      /* signed little-endian integer of 1, 2, 4 or 8 bytes */
    K_UINT = 3,     /* unsigned, the same sizes */
    K_UTF8 = 4,     /* text */
    K_BYTES = 5,    /* binary string */
    K_DOUBLE = 6,   /* memcomparable float64 */
    K_DECIMAL = 7,  /* [precision][frac][binary decimal]; obj: the Decimal type */
    K_JSON = 8,     /* TiDB binary JSON, to its text */
    K_DATE = 9,     /* packed time, to datetime.date */
    K_DATETIME = 10,
    K_TIMESTAMP = 11, /* packed time, to a datetime in UTC */
    K_CALL = 12,    /* obj(value bytes): every other type */
    K_DURATION = 13, /* signed nanoseconds, to a timedelta of whole microseconds (floored) */
};

static PyObject *
fail(const char *what)
{
    PyErr_SetString(PyExc_ValueError, what);
    return NULL;
}

/* ------------------------------------------------------------------ output buffer */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char small[512];
} Buf;

static void
buf_init(Buf *b)
{
    b->data = b->small;
    b->len = 0;
    b->cap = sizeof(b->small);
}

static void
buf_free(Buf *b)
{
    if (b->data != b->small)
        PyMem_Free(b->data);
}

static int
buf_reserve(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap;
    while (cap < b->len + more)
        cap *= 2;
    char *data = PyMem_Malloc(cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(data, b->data, b->len);
    buf_free(b);
    b->data = data;
    b->cap = cap;
    return 0;
}

static int
buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

#define BUF_LIT(b, s) buf_put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

/* A JSON string literal of UTF-8 bytes, quoted as json.dumps(s, ensure_ascii=False)
 * quotes it: only '"', '\\' and control characters are escaped.  The bytes are
 * checked to be UTF-8 when the whole text is decoded. */
static int
buf_quote(Buf *b, const unsigned char *s, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (buf_reserve(b, n + 2) < 0)
        return -1;
    b->data[b->len++] = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            if (buf_reserve(b, 2) < 0)
                return -1;
            b->data[b->len++] = (char)c;
            continue;
        }
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        Py_ssize_t k = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
            esc[4] = hex[c >> 4]; esc[5] = hex[c & 0xF];
            k = 6;
        }
        if (buf_put(b, esc, k) < 0)
            return -1;
    }
    if (buf_reserve(b, 1) < 0)
        return -1;
    b->data[b->len++] = '"';
    return 0;
}

/* ------------------------------------------------------------------ binary JSON */

#define J_OBJECT 0x01
#define J_ARRAY 0x03
#define J_LITERAL 0x04
#define J_INT64 0x09
#define J_UINT64 0x0A
#define J_FLOAT64 0x0B
#define J_STRING 0x0C
#define J_OPAQUE 0x0D
#define J_MAX_DEPTH 100

typedef struct {
    const unsigned char *buf; /* the document after its type byte */
    uint64_t len;
    int64_t left;             /* bytes no value has claimed yet */
    Buf out;
} JDoc;

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* 0 when pos + n bytes lie inside a buffer of len bytes. */
static int
need(uint64_t len, uint64_t pos, uint64_t n)
{
    return (pos > len || n > len - pos) ? -1 : 0;
}

static int
uvarint(const unsigned char *buf, uint64_t len, uint64_t pos, uint64_t *value, uint64_t *end)
{
    uint64_t result = 0;
    unsigned shift = 0;
    for (;;) {
        if (pos >= len || shift > 63)
            return -1;
        unsigned char b = buf[pos++];
        result |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *value = result;
            *end = pos;
            return 0;
        }
        shift += 7;
    }
}

static int
claim(JDoc *d, uint64_t n)
{
    if (n > (uint64_t)INT64_MAX)
        return -1;
    d->left -= (int64_t)n;
    return d->left < 0 ? -1 : 0;
}

static int
put_literal(Buf *b, unsigned v)
{
    switch (v) {
    case 0x00: return BUF_LIT(b, "null");
    case 0x01: return BUF_LIT(b, "true");
    case 0x02: return BUF_LIT(b, "false");
    }
    return -1;
}

static int
put_double(Buf *b, double x)
{
    if (isnan(x))
        return BUF_LIT(b, "NaN");
    if (isinf(x))
        return x > 0 ? BUF_LIT(b, "Infinity") : BUF_LIT(b, "-Infinity");
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return -1;
    int rc = buf_put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return rc;
}

static int j_value(JDoc *d, unsigned tp, uint64_t pos, int depth);

/* 1 when key a sorts strictly before key b by their bytes (as TiDB writes an object's keys). */
static int
ascending(const unsigned char *a, uint64_t alen, const unsigned char *b, uint64_t blen)
{
    int cmp = memcmp(a, b, (size_t)(alen < blen ? alen : blen));
    return cmp < 0 || (cmp == 0 && alen < blen);
}

/* Key entry i of an object whose key entries start at keys: (uint32 offset, uint16 length). */
static void
key_entry(const unsigned char *buf, uint64_t keys, uint64_t i, uint64_t *offset, uint64_t *length)
{
    const unsigned char *entry = buf + keys + i * 6;
    *offset = le32(entry);
    *length = (uint64_t)entry[4] | (uint64_t)entry[5] << 8;
}

/* 0 when key i of the object at base equals none before it (whose bounds were checked). */
static int
repeated(const JDoc *d, uint64_t keys, uint64_t base, uint64_t i)
{
    uint64_t koff, klen, joff, jlen;
    key_entry(d->buf, keys, i, &koff, &klen);
    for (uint64_t j = 0; j < i; j++) {
        key_entry(d->buf, keys, j, &joff, &jlen);
        if (jlen == klen && memcmp(d->buf + base + joff, d->buf + base + koff, (size_t)klen) == 0)
            return 1;
    }
    return 0;
}

static int
j_container(JDoc *d, unsigned tp, uint64_t base, int depth)
{
    const unsigned char *buf = d->buf;
    if (need(d->len, base, 8) < 0)
        return -1;
    uint64_t count = le32(buf + base), size = le32(buf + base + 4);
    if (need(d->len, base, size) < 0)
        return -1;
    uint64_t keys = base + 8;
    uint64_t vals = keys + (tp == J_OBJECT ? count * 6 : 0);
    if (need(d->len, vals, count * 5) < 0 || claim(d, vals + count * 5 - base) < 0)
        return -1;
    Buf *out = &d->out;
    if (buf_put(out, tp == J_OBJECT ? "{" : "[", 1) < 0)
        return -1;
    const unsigned char *prev_key = NULL;
    uint64_t prev_len = 0;
    for (uint64_t i = 0; i < count; i++) {
        if (i && BUF_LIT(out, ", ") < 0)
            return -1;
        if (tp == J_OBJECT) {
            uint64_t koff, klen;
            key_entry(buf, keys, i, &koff, &klen);
            if (need(d->len, base + koff, klen) < 0 || claim(d, klen) < 0)
                return -1;
            const unsigned char *key = buf + base + koff;
            if (prev_key != NULL && !ascending(prev_key, prev_len, key, klen) && repeated(d, keys, base, i) != 0)
                return -1; /* a repeated key keeps its first place and last value: Python's */
            prev_key = key;
            prev_len = klen;
            if (buf_quote(out, key, (Py_ssize_t)klen) < 0 || BUF_LIT(out, ": ") < 0)
                return -1;
        }
        unsigned vtp = buf[vals + i * 5];
        uint64_t off = le32(buf + vals + i * 5 + 1);
        if (vtp == J_LITERAL) {
            if (put_literal(out, off & 0xFF) < 0)
                return -1;
        } else {
            if (off >= size || j_value(d, vtp, base + off, depth + 1) < 0)
                return -1;
        }
    }
    return buf_put(out, tp == J_OBJECT ? "}" : "]", 1);
}

static int
j_value(JDoc *d, unsigned tp, uint64_t pos, int depth)
{
    const unsigned char *buf = d->buf;
    char text[32];
    switch (tp) {
    case J_OBJECT:
    case J_ARRAY:
        if (depth > J_MAX_DEPTH)
            return -1;
        return j_container(d, tp, pos, depth);
    case J_STRING: {
        uint64_t n, end;
        if (uvarint(buf, d->len, pos, &n, &end) < 0 || need(d->len, end, n) < 0 || claim(d, end - pos + n) < 0)
            return -1;
        return buf_quote(&d->out, buf + end, (Py_ssize_t)n);
    }
    case J_INT64:
    case J_UINT64:
        if (need(d->len, pos, 8) < 0 || claim(d, 8) < 0)
            return -1;
        if (tp == J_INT64)
            snprintf(text, sizeof(text), "%lld", (long long)(int64_t)le64(buf + pos));
        else
            snprintf(text, sizeof(text), "%llu", (unsigned long long)le64(buf + pos));
        return buf_put(&d->out, text, (Py_ssize_t)strlen(text));
    case J_LITERAL:
        if (need(d->len, pos, 1) < 0 || claim(d, 1) < 0)
            return -1;
        return put_literal(&d->out, buf[pos]);
    case J_FLOAT64: {
        if (need(d->len, pos, 8) < 0 || claim(d, 8) < 0)
            return -1;
        uint64_t bits = le64(buf + pos);
        double x;
        memcpy(&x, &bits, 8);
        return put_double(&d->out, x);
    }
    }
    return -1; /* opaque, temporal and unknown values: Python's */
}

/* The byte length a document says it has (jsonbin.json_size at offset 0), or -1. */
static int64_t
j_size(const unsigned char *data, uint64_t len)
{
    if (len < 1)
        return -1;
    unsigned tp = data[0];
    switch (tp) {
    case J_OBJECT:
    case J_ARRAY:
        if (need(len, 1, 8) < 0)
            return -1;
        return 1 + (int64_t)le32(data + 5);
    case J_LITERAL: return 2;
    case J_INT64:
    case J_UINT64:
    case J_FLOAT64: return 9;
    case J_STRING: {
        uint64_t n, end;
        if (uvarint(data, len, 1, &n, &end) < 0 || n > (uint64_t)INT64_MAX - end)
            return -1;
        return (int64_t)(end + n);
    }
    }
    return -1;
}

static PyObject *
json_text(const unsigned char *data, Py_ssize_t len)
{
    if (len < 1 || j_size(data, (uint64_t)len) != (int64_t)len)
        return fail("JSON value the native decoder leaves to Python");
    JDoc d;
    d.buf = data + 1;
    d.len = (uint64_t)len - 1;
    d.left = (int64_t)len - 1;
    buf_init(&d.out);
    PyObject *result = NULL;
    if (j_value(&d, data[0], 0, 1) == 0)
        result = PyUnicode_DecodeUTF8(d.out.data, d.out.len, NULL);
    else if (!PyErr_Occurred())
        fail("JSON value the native decoder leaves to Python");
    buf_free(&d.out);
    return result;
}

/* ------------------------------------------------------------------ DECIMAL */

static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
static const uint32_t POW10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};

/* Reads one word of `digits` digits (its bytes big-endian) into text, zero-padded. */
static int
dec_word(const unsigned char *raw, Py_ssize_t *pos, int digits, char *text, Py_ssize_t *n)
{
    uint32_t word = 0;
    for (int i = 0; i < DIG2BYTES[digits]; i++)
        word = word << 8 | raw[(*pos)++];
    if (word >= POW10[digits])
        return -1;
    for (int i = digits - 1; i >= 0; i--) {
        text[*n + i] = (char)('0' + word % 10);
        word /= 10;
    }
    *n += digits;
    return 0;
}

static PyObject *
decimal_value(const unsigned char *data, Py_ssize_t len, PyObject *decimal_type)
{
    if (len < 2)
        return fail("DECIMAL value too short");
    int precision = data[0], frac = data[1];
    if (precision < 1 || precision > 65 || frac > 30 || frac > precision)
        return fail("bad DECIMAL precision/scale");
    int intg = precision - frac;
    Py_ssize_t size = (intg / 9) * 4 + DIG2BYTES[intg % 9] + (frac / 9) * 4 + DIG2BYTES[frac % 9];
    if (len - 2 != size)
        return fail("DECIMAL value of the wrong size");
    unsigned char raw[40];
    memcpy(raw, data + 2, (size_t)size);
    raw[0] ^= 0x80;
    int negative = raw[0] & 0x80 ? 1 : 0; /* the sign bit was clear: stored inverted */
    if (negative)
        for (Py_ssize_t i = 0; i < size; i++)
            raw[i] ^= 0xFF;
    char digits[80];
    Py_ssize_t n = 0, pos = 0;
    if (intg % 9 && dec_word(raw, &pos, intg % 9, digits, &n) < 0)
        return fail("corrupt DECIMAL word");
    for (int i = 0; i < intg / 9; i++)
        if (dec_word(raw, &pos, 9, digits, &n) < 0)
            return fail("corrupt DECIMAL word");
    Py_ssize_t int_digits = n;
    for (int i = 0; i < frac / 9; i++)
        if (dec_word(raw, &pos, 9, digits, &n) < 0)
            return fail("corrupt DECIMAL word");
    if (frac % 9 && dec_word(raw, &pos, frac % 9, digits, &n) < 0)
        return fail("corrupt DECIMAL word");
    /* [-]<integer digits without leading zeros, at least "0">[.<frac digits>] */
    char text[84];
    Py_ssize_t t = 0, first = 0;
    if (negative)
        text[t++] = '-';
    while (first < int_digits - 1 && digits[first] == '0')
        first++;
    if (int_digits == 0)
        text[t++] = '0';
    else {
        memcpy(text + t, digits + first, (size_t)(int_digits - first));
        t += int_digits - first;
    }
    if (frac) {
        text[t++] = '.';
        memcpy(text + t, digits + int_digits, (size_t)frac);
        t += frac;
    }
    PyObject *str = PyUnicode_FromStringAndSize(text, t);
    if (str == NULL)
        return NULL;
    PyObject *value = PyObject_CallOneArg(decimal_type, str);
    Py_DECREF(str);
    return value;
}

/* ------------------------------------------------------------------ scalars */

static int
uint_le(const unsigned char *p, Py_ssize_t n, uint64_t *out)
{
    switch (n) {
    case 1: *out = p[0]; return 0;
    case 2: *out = (uint64_t)p[0] | (uint64_t)p[1] << 8; return 0;
    case 4: *out = le32(p); return 0;
    case 8: *out = le64(p); return 0;
    }
    return -1;
}

/* The signed value of a little-endian integer of n bytes read as u. */
static int64_t
sign_extend(uint64_t u, Py_ssize_t n)
{
    switch (n) {
    case 1: return (int8_t)u;
    case 2: return (int16_t)u;
    case 4: return (int32_t)u;
    }
    return (int64_t)u;
}

static PyObject *
int_value(const unsigned char *p, Py_ssize_t n, int is_signed)
{
    uint64_t u;
    if (uint_le(p, n, &u) < 0)
        return fail("an integer value must be 1, 2, 4 or 8 bytes");
    return is_signed ? PyLong_FromLongLong(sign_extend(u, n)) : PyLong_FromUnsignedLongLong(u);
}

static PyObject *
double_value(const unsigned char *p, Py_ssize_t n)
{
    if (n != 8)
        return fail("a float value must be 8 bytes");
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++)
        bits = bits << 8 | p[i];
    bits = (bits & 0x8000000000000000ULL) ? bits & ~0x8000000000000000ULL : ~bits;
    double x;
    memcpy(&x, &bits, 8);
    return PyFloat_FromDouble(x);
}

static PyObject *
time_value(const unsigned char *p, Py_ssize_t n, int kind)
{
    uint64_t packed;
    if (uint_le(p, n, &packed) < 0)
        return fail("an integer value must be 1, 2, 4 or 8 bytes");
    int micro = (int)(packed & 0xFFFFFF);
    uint64_t ymdhms = packed >> 24;
    uint64_t ymd = ymdhms >> 17, hms = ymdhms & 0x1FFFF;
    int day = (int)(ymd & 0x1F);
    uint64_t ym = ymd >> 5;
    uint64_t year = ym / 13;
    int month = (int)(ym % 13);
    if (month == 0 || day == 0 || year > 9999)
        return fail("zero or out-of-range date: left to Python");
    if (kind == K_DATE)
        return PyDate_FromDate((int)year, month, day);
    PyObject *tz = kind == K_TIMESTAMP ? PyDateTime_TimeZone_UTC : Py_None;
    return PyDateTimeAPI->DateTime_FromDateAndTime((int)year, month, day, (int)(hms >> 12), (int)((hms >> 6) & 0x3F),
                                                   (int)(hms & 0x3F), micro, tz, PyDateTimeAPI->DateTimeType);
}

static int64_t
floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static PyObject *
duration_value(const unsigned char *p, Py_ssize_t n)
{
    uint64_t u;
    if (uint_le(p, n, &u) < 0)
        return fail("an integer value must be 1, 2, 4 or 8 bytes");
    int64_t ns = sign_extend(u, n);
    const int64_t day_us = 86400LL * 1000000LL;
    int64_t us = floor_div(ns, 1000);
    int64_t days = floor_div(us, day_us);
    int64_t rest = us - days * day_us;
    return PyDelta_FromDSU((int)days, (int)(rest / 1000000), (int)(rest % 1000000));
}

/* ------------------------------------------------------------------ Layout */

typedef struct {
    PyObject *name;
    int kind;
    Py_ssize_t index; /* the stored value's position, for stored kinds */
    PyObject *obj;    /* K_CONST: the value; K_DECIMAL: Decimal; K_CALL: the decoder */
} Item;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ends_at;   /* where the end offsets start */
    Py_ssize_t stored;    /* how many values are stored */
    PyObject *check_tail; /* check_tail(flags, tail) for values with a checksum */
    Py_ssize_t n_items;
    Item *items;
} Layout;

static void
layout_dealloc(Layout *self)
{
    for (Py_ssize_t i = 0; i < self->n_items; i++) {
        Py_XDECREF(self->items[i].name);
        Py_XDECREF(self->items[i].obj);
    }
    PyMem_Free(self->items);
    Py_XDECREF(self->check_tail);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
layout_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t ends_at, stored;
    PyObject *check_tail, *items;
    static char *names[] = {"ends_at", "stored", "check_tail", "items", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnOO!", names, &ends_at, &stored, &check_tail, &PyTuple_Type,
                                     &items))
        return NULL;
    if (ends_at < 0 || stored < 0) {
        PyErr_SetString(PyExc_ValueError, "negative layout offsets");
        return NULL;
    }
    Layout *self = (Layout *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    self->items = PyMem_Calloc(n ? n : 1, sizeof(Item));
    if (self->items == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ends_at = ends_at;
    self->stored = stored;
    self->check_tail = Py_NewRef(check_tail);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *spec = PyTuple_GET_ITEM(items, i);
        Item *item = &self->items[i];
        PyObject *name, *obj;
        int kind;
        Py_ssize_t index;
        if (!PyArg_ParseTuple(spec, "UinO", &name, &kind, &index, &obj)) {
            Py_DECREF(self);
            return NULL;
        }
        if (kind < K_HANDLE || kind > K_DURATION || (kind > K_CONST && (index < 0 || index >= stored))) {
            Py_DECREF(self);
            PyErr_Format(PyExc_ValueError, "bad layout item %zd", i);
            return NULL;
        }
        item->name = Py_NewRef(name);
        item->kind = kind;
        item->index = index;
        item->obj = Py_NewRef(obj);
        self->n_items = i + 1;
    }
    return (PyObject *)self;
}

static PyObject *
stored_value(const Item *item, const unsigned char *p, Py_ssize_t n)
{
    switch (item->kind) {
    case K_INT: return int_value(p, n, 1);
    case K_UINT: return int_value(p, n, 0);
    case K_UTF8: return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    case K_BYTES: return PyBytes_FromStringAndSize((const char *)p, n);
    case K_DOUBLE: return double_value(p, n);
    case K_DECIMAL: return decimal_value(p, n, item->obj);
    case K_JSON: return json_text(p, n);
    case K_DATE:
    case K_DATETIME:
    case K_TIMESTAMP: return time_value(p, n, item->kind);
    case K_DURATION: return duration_value(p, n);
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)p, n);
    if (raw == NULL)
        return NULL;
    PyObject *value = PyObject_CallOneArg(item->obj, raw);
    Py_DECREF(raw);
    return value;
}

static PyObject *
layout_decode(Layout *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "decode(value: bytes, handle)");
        return NULL;
    }
    const unsigned char *v = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    PyObject *handle = args[1];
    Py_ssize_t stored = self->stored, ends_at = self->ends_at;
    Py_ssize_t base = ends_at + 2 * stored;
    if (len < 2 || base > len)
        return fail("v2 row shorter than its header");
    Py_ssize_t ends[256];
    if (stored > 256)
        return fail("more stored values than a small v2 row holds");
    for (Py_ssize_t i = 0; i < stored; i++) {
        ends[i] = (Py_ssize_t)v[ends_at + 2 * i] | (Py_ssize_t)v[ends_at + 2 * i + 1] << 8;
        if (i && ends[i] < ends[i - 1])
            return fail("v2 row offsets out of order");
    }
    Py_ssize_t end = base + (stored ? ends[stored - 1] : 0);
    if (v[1]) {
        if (end > len)
            return fail("v2 row offsets past the data");
        PyObject *tail = PyBytes_FromStringAndSize((const char *)v + end, len - end);
        if (tail == NULL)
            return NULL;
        PyObject *ok = PyObject_CallFunction(self->check_tail, "iO", (int)v[1], tail);
        Py_DECREF(tail);
        if (ok == NULL)
            return NULL;
        Py_DECREF(ok);
    } else if (end != len) {
        return fail("v2 row data length does not match its offsets");
    }
    PyObject *image = PyDict_New();
    if (image == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < self->n_items; i++) {
        const Item *item = &self->items[i];
        PyObject *value;
        if (item->kind == K_HANDLE)
            value = Py_NewRef(handle);
        else if (item->kind == K_CONST)
            value = Py_NewRef(item->obj);
        else {
            Py_ssize_t start = base + (item->index ? ends[item->index - 1] : 0);
            value = stored_value(item, v + start, base + ends[item->index] - start);
        }
        if (value == NULL || PyDict_SetItem(image, item->name, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(image);
            return NULL;
        }
        Py_DECREF(value);
    }
    return image;
}

static PyMethodDef layout_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))layout_decode, METH_FASTCALL,
     "decode(value, handle) -> dict: the image of a small v2 row value with this layout's header."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdcflow.plugins.sources.tikv.tidb._rowfast.Layout",
    .tp_basicsize = sizeof(Layout),
    .tp_dealloc = (destructor)layout_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Layout(ends_at, stored, check_tail, items): a compiled decoder of small v2 row values.",
    .tp_methods = layout_methods,
    .tp_new = layout_new,
};

/* ------------------------------------------------------------------ module functions */

static PyObject *
py_json_text(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *text = json_text(view.buf, view.len);
    PyBuffer_Release(&view);
    return text;
}

static PyObject *
py_decimal_value(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decimal_value(data, decimal_type)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *value = decimal_value(view.buf, view.len, args[1]);
    PyBuffer_Release(&view);
    return value;
}

/*
 * images(keys, values, prefix, unsigned, layouts, make, errors) -> list[dict] | None:
 * the images of a run of puts of one table's int-handle record keys, each value a
 * small v2 row -- the dicts TiDBMounter._fast_image gives one pair at a time, with no
 * Python per pair.
 *
 *   prefix    b"t" + the table id + b"_r": every key is it and an 8-byte handle;
 *   unsigned  true when the handle column is unsigned (the handle read as a uint64);
 *   layouts   the plan's dict of decoders by header (a value's bytes from its counts
 *             to the end of its column ids), read here;
 *   make      make(header, n_not_null) -> decoder | None, called for a header not in
 *             layouts (it compiles the decoder and keeps it there);
 *   errors    the exception types that mean "not this path".
 *
 * It returns None, for the caller's row-by-row path, as soon as one pair is
 * anything else: keys and values of different lengths, a key of another table or
 * shape, an empty value, a value that is not small v2, a malformed header (make
 * gives None), or a decoder raising one of errors.  Other errors propagate.
 */
#define V2_VERSION 0x80
#define V2_FLAG_CHECKSUM 0x02

static PyObject *
images(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7 || !PyBytes_Check(args[2]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "images(keys, values, prefix: bytes, unsigned, layouts: dict, make, errors)");
        return NULL;
    }
    int is_unsigned = PyObject_IsTrue(args[3]);
    if (is_unsigned < 0)
        return NULL;
    PyObject *layouts = args[4], *make = args[5], *errors = args[6];
    const char *prefix = PyBytes_AS_STRING(args[2]);
    Py_ssize_t prefix_len = PyBytes_GET_SIZE(args[2]);
    PyObject *keys = PySequence_Fast(args[0], "images: keys must be a sequence");
    if (keys == NULL)
        return NULL;
    PyObject *values = PySequence_Fast(args[1], "images: values must be a sequence");
    if (values == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject *out = NULL, *header = NULL, *layout = NULL; /* header, layout: the last pair's */
    int decline = n != PySequence_Fast_GET_SIZE(values);
    if (decline || (out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i), *value = PySequence_Fast_GET_ITEM(values, i);
        if (!PyBytes_Check(key) || !PyBytes_Check(value) || PyBytes_GET_SIZE(key) != prefix_len + 8
            || memcmp(PyBytes_AS_STRING(key), prefix, prefix_len) != 0) {
            decline = 1;
            goto done;
        }
        const unsigned char *v = (const unsigned char *)PyBytes_AS_STRING(value);
        Py_ssize_t len = PyBytes_GET_SIZE(value);
        if (len < 6 || v[0] != V2_VERSION || (v[1] & ~V2_FLAG_CHECKSUM)) {
            decline = 1;
            goto done;
        }
        Py_ssize_t end = 6 + (Py_ssize_t)(v[2] | v[3] << 8) + (Py_ssize_t)(v[4] | v[5] << 8);
        if (end > len)
            end = len; /* as a slice past the end gives: the layout finds it malformed */
        if (header == NULL || PyBytes_GET_SIZE(header) != end - 2
            || memcmp(PyBytes_AS_STRING(header), v + 2, end - 2) != 0) {
            Py_CLEAR(header);
            Py_CLEAR(layout);
            if ((header = PyBytes_FromStringAndSize((const char *)v + 2, end - 2)) == NULL)
                goto done;
            layout = Py_XNewRef(PyDict_GetItemWithError(layouts, header));
            if (layout == NULL) {
                if (PyErr_Occurred())
                    goto done;
                layout = PyObject_CallFunction(make, "On", header, (Py_ssize_t)(v[2] | v[3] << 8));
                if (layout == NULL) {
                    if (PyErr_ExceptionMatches(errors)) {
                        PyErr_Clear();
                        decline = 1;
                    }
                    goto done;
                }
            }
        }
        if (layout == Py_None) {
            decline = 1;
            goto done;
        }
        const unsigned char *h = (const unsigned char *)PyBytes_AS_STRING(key) + prefix_len;
        uint64_t raw = 0;
        for (int b = 0; b < 8; b++)
            raw = raw << 8 | h[b];
        raw ^= (uint64_t)1 << 63; /* the key's sign-flipped big-endian int64 */
        PyObject *handle = is_unsigned ? PyLong_FromUnsignedLongLong(raw) : PyLong_FromLongLong((int64_t)raw);
        if (handle == NULL)
            goto done;
        PyObject *call[2] = {value, handle};
        PyObject *image = PyObject_Vectorcall(layout, call, 2, NULL);
        Py_DECREF(handle);
        if (image == NULL) {
            if (PyErr_ExceptionMatches(errors)) {
                PyErr_Clear();
                decline = 1;
            }
            goto done;
        }
        PyList_SET_ITEM(out, i, image);
    }
done:
    Py_XDECREF(header);
    Py_XDECREF(layout);
    Py_DECREF(keys);
    Py_DECREF(values);
    if (decline || PyErr_Occurred()) {
        Py_XDECREF(out);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"json_text", py_json_text, METH_O, "json_text(data) -> str: the text of a TiDB binary JSON value."},
    {"decimal_value", (PyCFunction)(void (*)(void))py_decimal_value, METH_FASTCALL,
     "decimal_value(data, Decimal) -> Decimal: a DECIMAL row value ([precision][frac][binary])."},
    {"images", (PyCFunction)(void (*)(void))images, METH_FASTCALL,
     "images(keys, values, prefix, unsigned, layouts, make, errors) -> list[dict] | None:"
     " the images of a run of one table's int-handle record puts (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cdcflow.plugins.sources.tikv.tidb._rowfast",
    .m_doc = "Native decoding of TiDB's small v2 row values (the mounter's fast path).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__rowfast(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    if (PyType_Ready(&LayoutType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Layout", (PyObject *)&LayoutType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    static const struct { const char *name; int value; } kinds[] = {
        {"HANDLE", K_HANDLE}, {"CONST", K_CONST}, {"INT", K_INT}, {"UINT", K_UINT}, {"UTF8", K_UTF8},
        {"BYTES", K_BYTES}, {"DOUBLE", K_DOUBLE}, {"DECIMAL", K_DECIMAL}, {"JSON", K_JSON}, {"DATE", K_DATE},
        {"DATETIME", K_DATETIME}, {"TIMESTAMP", K_TIMESTAMP}, {"CALL", K_CALL},
        {"DURATION", K_DURATION},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (PyModule_AddIntConstant(m, kinds[i].name, kinds[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
