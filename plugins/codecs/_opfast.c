/*
 * Native writing of Open Protocol row images: the codec's per-row hot path in C.
 *
 * image(image, columns) writes a row image that holds exactly a schema's columns
 * as the "u"/"p"/"d" object of a row's value, in UTF-8, HTML-escaped as Go's
 * json.Marshal escapes it -- the bytes that
 * escape_html(_compile_image_writer(ordered)(image)).encode("utf-8") gives in
 * cdcflow.plugins.codecs.open_protocol.
 *
 * columns is a tuple, sorted by column name, of (name, head, kind, arg, writer):
 *   name    the image's key (str);
 *   head    the bytes written before the value: '{' or '},' then the column's
 *           '"name":{"t":..,"f":..,"v":' (already HTML-escaped, UTF-8);
 *   kind    how values of the types listed are written here -- exactly those
 *           types, never a subclass; every other value by writer:
 *           K_INT      int: in decimal;
 *           K_STR      str: quoted as json.encoder.encode_basestring quotes it;
 *           K_DECIMAL  arg (decimal.Decimal): format(value, "f"), quoted;
 *           K_TEMPORAL date, datetime (naive or in datetime.UTC) and timedelta:
 *                      quoted as columns.format_date_value spells them with
 *                      arg fractional digits (-1: six when non-zero);
 *           K_DOUBLE   float: as gojson.go_float writes a float64;
 *           K_CALL     nothing: writer(value) gives the JSON text;
 *   writer  the codec's value writer of the column (a callable returning str).
 * None is written as null; "}}" closes the last column and the image.
 *
 * It returns None, for the caller to take its Python path, for anything else:
 * an image that is not a dict, holds another number of keys or lacks a
 * column, or text that is not encodable as UTF-8 (the Python path then raises
 * the error it always raised).  Errors raised by a writer propagate.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_INT = 0, K_STR = 1, K_CALL = 2, K_DECIMAL = 3, K_TEMPORAL = 4, K_DOUBLE = 5 };

static PyObject *format_f; /* "f", for format(Decimal, "f") */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char small[1024];
} Out;

static void
out_free(Out *o)
{
    if (o->data != o->small)
        PyMem_Free(o->data);
}

static int
out_room(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap;
    while (cap < o->len + more)
        cap *= 2;
    char *data = PyMem_Malloc(cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(data, o->data, o->len);
    out_free(o);
    o->data = data;
    o->cap = cap;
    return 0;
}

static int
out_put(Out *o, const char *s, Py_ssize_t n)
{
    if (out_room(o, n) < 0)
        return -1;
    memcpy(o->data + o->len, s, n);
    o->len += n;
    return 0;
}

/* Go's HTML-safe escapes: '<', '>', '&', U+2028 and U+2029 (E2 80 A8/A9 in UTF-8).
 * Returns the escape's length and sets *skip to the bytes it replaces, 0 for none. */
static int
html_escape(const unsigned char *s, Py_ssize_t i, Py_ssize_t n, const char **esc, int *skip)
{
    unsigned char c = s[i];
    if (c == '<' || c == '>' || c == '&') {
        *esc = c == '<' ? "\\u003c" : c == '>' ? "\\u003e" : "\\u0026";
        *skip = 1;
        return 6;
    }
    if (c == 0xE2 && i + 2 < n && s[i + 1] == 0x80 && (s[i + 2] == 0xA8 || s[i + 2] == 0xA9)) {
        *esc = s[i + 2] == 0xA8 ? "\\u2028" : "\\u2029";
        *skip = 3;
        return 6;
    }
    return 0;
}

/* UTF-8 text with Go's HTML escapes; with json, also '"', '\\' and control
 * characters escaped as encode_basestring escapes them (the inside of a quoted
 * string; without it, JSON text a writer gave). */
static int
put_escaped(Out *o, const unsigned char *s, Py_ssize_t n, int json)
{
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t i = 0, start = 0;
    while (i < n) {
        unsigned char c = s[i];
        char small[6];
        const char *esc = NULL;
        int len = 0, skip = 1;
        if (json && (c == '"' || c == '\\')) {
            small[0] = '\\';
            small[1] = (char)c;
            esc = small;
            len = 2;
        }
        else if (json && c < 0x20) {
            const char *shortform = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                                    : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (shortform != NULL) {
                esc = shortform;
                len = 2;
            }
            else {
                memcpy(small, "\\u00", 4);
                small[4] = hex[c >> 4];
                small[5] = hex[c & 15];
                esc = small;
                len = 6;
            }
        }
        else {
            len = html_escape(s, i, n, &esc, &skip);
        }
        if (len == 0) {
            i++;
            continue;
        }
        if (out_put(o, (const char *)s + start, i - start) < 0 || out_put(o, esc, len) < 0)
            return -1;
        i += skip;
        start = i;
    }
    return out_put(o, (const char *)s + start, n - start);
}

/* 1 written, 0 not UTF-8 encodable (error cleared: the caller returns None), -1 error. */
static int
put_text(Out *o, PyObject *text, int quoted)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (quoted && out_put(o, "\"", 1) < 0)
        return -1;
    if (put_escaped(o, (const unsigned char *)s, n, quoted) < 0)
        return -1;
    return quoted && out_put(o, "\"", 1) < 0 ? -1 : 1;
}

/* The decimal digits of v, at least width of them (zero padded), at p; past the last.
 * Written by hand: snprintf and its format parsing took about a sixth of a snapshot
 * delivery task's CPU (perf, shop.orders rows to Kafka). */
static char *
put_digits(char *p, unsigned long long v, int width)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n < width)
        tmp[n++] = '0';
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* v in decimal, "-" first when negative, at p; past the last. */
static char *
put_signed(char *p, long long v)
{
    if (v >= 0)
        return put_digits(p, (unsigned long long)v, 1);
    *p++ = '-';
    return put_digits(p, 0ULL - (unsigned long long)v, 1);
}

static int
put_int(Out *o, PyObject *value)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyObject *text = PyObject_Str(value);
        if (text == NULL)
            return -1;
        int rc = put_text(o, text, 0);
        Py_DECREF(text);
        return rc < 0 ? -1 : 0;
    }
    char digits[24];
    return out_put(o, digits, (Py_ssize_t)(put_signed(digits, v) - digits));
}

/* ".ffffff" cut to fsp digits (fsp < 0: six digits when non-zero, none when zero). */
static int
put_fraction(Out *o, int micro, long fsp)
{
    char text[16];
    if (fsp == 0 || (fsp < 0 && micro == 0))
        return 0;
    text[0] = '.';
    put_digits(text + 1, (unsigned long long)micro, 6);
    return out_put(o, text, fsp < 0 || fsp > 6 ? 7 : 1 + fsp);
}

/* 1 written, 0 not taken here (the writer writes it), -1 error. */
static int
put_temporal(Out *o, PyObject *value, long fsp)
{
    char text[64], *p = text;
    if (PyDateTime_CheckExact(value) || PyDate_CheckExact(value)) {
        int with_time = PyDateTime_CheckExact(value);
        if (with_time) {
            PyObject *zone = PyDateTime_DATE_GET_TZINFO(value);
            if (zone != Py_None && zone != PyDateTime_TimeZone_UTC)
                return 0; /* moved to UTC first: the writer does it */
        }
        /* "YYYY-MM-DD[ hh:mm:ss" (a year is 1..9999 in Python) */
        *p++ = '"';
        p = put_digits(p, (unsigned long long)PyDateTime_GET_YEAR(value), 4);
        *p++ = '-';
        p = put_digits(p, (unsigned long long)PyDateTime_GET_MONTH(value), 2);
        *p++ = '-';
        p = put_digits(p, (unsigned long long)PyDateTime_GET_DAY(value), 2);
        if (!with_time) {
            *p++ = '"';
            return out_put(o, text, (Py_ssize_t)(p - text)) < 0 ? -1 : 1;
        }
        *p++ = ' ';
        p = put_digits(p, (unsigned long long)PyDateTime_DATE_GET_HOUR(value), 2);
        *p++ = ':';
        p = put_digits(p, (unsigned long long)PyDateTime_DATE_GET_MINUTE(value), 2);
        *p++ = ':';
        p = put_digits(p, (unsigned long long)PyDateTime_DATE_GET_SECOND(value), 2);
        if (out_put(o, text, (Py_ssize_t)(p - text)) < 0
            || put_fraction(o, PyDateTime_DATE_GET_MICROSECOND(value), fsp) < 0)
            return -1;
        return out_put(o, "\"", 1) < 0 ? -1 : 1;
    }
    if (PyDelta_CheckExact(value)) {
        long long days = PyDateTime_DELTA_GET_DAYS(value);
        if (llabs(days) > 1000000)
            return 0;
        long long total = (days * 86400 + PyDateTime_DELTA_GET_SECONDS(value)) * 1000000LL
                          + PyDateTime_DELTA_GET_MICROSECONDS(value);
        long long micros = llabs(total), seconds = micros / 1000000, rest = seconds % 3600;
        /* "[-]hh:mm:ss", the hours as many digits as they take (two at least) */
        *p++ = '"';
        if (total < 0)
            *p++ = '-';
        p = put_digits(p, (unsigned long long)(seconds / 3600), 2);
        *p++ = ':';
        p = put_digits(p, (unsigned long long)(rest / 60), 2);
        *p++ = ':';
        p = put_digits(p, (unsigned long long)(rest % 60), 2);
        if (out_put(o, text, (Py_ssize_t)(p - text)) < 0 || put_fraction(o, (int)(micros % 1000000), fsp) < 0)
            return -1;
        return out_put(o, "\"", 1) < 0 ? -1 : 1;
    }
    return 0;
}

/* A float64 as Go's encoding/json writes it: the shortest digits that round-trip,
 * without an exponent from 1e-6 up to 1e21, else as d.ddde-7 / d.ddde+21.
 * 1 written, 0 not taken here (NaN and infinities: the writer), -1 error. */
static int
put_double(Out *o, double v)
{
    if (!isfinite(v))
        return 0;
    if (v == 0)
        return out_put(o, signbit(v) ? "-0" : "0", signbit(v) ? 2 : 1) < 0 ? -1 : 1;
    char *repr = PyOS_double_to_string(v, 'r', 0, 0, NULL);
    if (repr == NULL)
        return -1;
    /* repr: [-]digits[.digits][e(+|-)digits] -> the significant digits, and x: the
     * power of ten of the first one */
    char digits[40];
    int n = 0, before_point = 0, seen_point = 0, leading = 1, exponent = 0, skipped = 0;
    const char *s = repr + (repr[0] == '-');
    for (; *s && *s != 'e'; s++) {
        if (*s == '.') {
            seen_point = 1;
            continue;
        }
        if (!seen_point)
            before_point++;
        if (leading && *s == '0') {
            skipped++;
            continue;
        }
        leading = 0;
        if (n < (int)sizeof(digits))
            digits[n++] = *s;
    }
    if (*s == 'e')
        exponent = atoi(s + 1);
    PyMem_Free(repr);
    while (n > 1 && digits[n - 1] == '0')
        n--;
    int x = before_point - skipped - 1 + exponent;
    char text[400];
    int len = 0;
    if (v < 0)
        text[len++] = '-';
    double magnitude = fabs(v);
    if (magnitude >= 1e-6 && magnitude < 1e21) {
        if (x >= 0) {
            for (int i = 0; i <= x; i++)
                text[len++] = i < n ? digits[i] : '0';
            if (n > x + 1) {
                text[len++] = '.';
                for (int i = x + 1; i < n; i++)
                    text[len++] = digits[i];
            }
        }
        else {
            text[len++] = '0';
            text[len++] = '.';
            for (int i = 0; i < -x - 1; i++)
                text[len++] = '0';
            for (int i = 0; i < n; i++)
                text[len++] = digits[i];
        }
    }
    else {
        text[len++] = digits[0];
        if (n > 1) {
            text[len++] = '.';
            for (int i = 1; i < n; i++)
                text[len++] = digits[i];
        }
        len += snprintf(text + len, sizeof(text) - len, x < 0 ? "e-%d" : "e+%02d", abs(x));
    }
    return out_put(o, text, len) < 0 ? -1 : 1;
}

/* 1 written, 0 take the Python path, -1 error. */
static int
put_value(Out *o, PyObject *value, long kind, PyObject *arg, PyObject *writer)
{
    int rc = 0;
    if (value == Py_None)
        return out_put(o, "null", 4) < 0 ? -1 : 1;
    if (kind == K_INT && PyLong_CheckExact(value))
        return put_int(o, value) < 0 ? -1 : 1;
    if (kind == K_STR && PyUnicode_CheckExact(value))
        return put_text(o, value, 1);
    if (kind == K_DECIMAL && (PyObject *)Py_TYPE(value) == arg) {
        PyObject *text = PyObject_Format(value, format_f);
        if (text == NULL)
            return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(text, &n);
        rc = s == NULL || out_put(o, "\"", 1) < 0 || out_put(o, s, n) < 0 || out_put(o, "\"", 1) < 0 ? -1 : 1;
        Py_DECREF(text);
        return rc;
    }
    if (kind == K_TEMPORAL)
        rc = put_temporal(o, value, PyLong_AsLong(arg));
    else if (kind == K_DOUBLE && PyFloat_CheckExact(value))
        rc = put_double(o, PyFloat_AS_DOUBLE(value));
    if (rc != 0)
        return rc;
    PyObject *text = PyObject_CallOneArg(writer, value);
    if (text == NULL)
        return -1;
    if (!PyUnicode_Check(text)) {
        Py_DECREF(text);
        PyErr_SetString(PyExc_TypeError, "a value writer returned a non-str");
        return -1;
    }
    rc = put_text(o, text, 0);
    Py_DECREF(text);
    return rc;
}

/* Writes img with columns (see the top of this file) to o: 1 written, 0 for the Python
 * path, -1 an error. */
static int
write_image(Out *o, PyObject *img, PyObject *columns)
{
    Py_ssize_t count = PyTuple_GET_SIZE(columns);
    if (!PyDict_CheckExact(img) || count == 0 || PyDict_GET_SIZE(img) != count)
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *column = PyTuple_GET_ITEM(columns, i);
        long kind = -1;
        if (!PyTuple_Check(column) || PyTuple_GET_SIZE(column) != 5 || !PyBytes_Check(PyTuple_GET_ITEM(column, 1))
            || ((kind = PyLong_AsLong(PyTuple_GET_ITEM(column, 2))) == -1 && PyErr_Occurred())
            || (kind == K_TEMPORAL && !PyLong_Check(PyTuple_GET_ITEM(column, 3)))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a column is (name, head: bytes, kind: int, arg, writer)");
            return -1;
        }
        PyObject *value = PyDict_GetItemWithError(img, PyTuple_GET_ITEM(column, 0));
        if (value == NULL)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *head = PyTuple_GET_ITEM(column, 1);
        if (out_put(o, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head)) < 0)
            return -1;
        Py_INCREF(value); /* a writer may run any code, the dict's too */
        int rc = put_value(o, value, kind, PyTuple_GET_ITEM(column, 3), PyTuple_GET_ITEM(column, 4));
        Py_DECREF(value);
        if (rc <= 0)
            return rc;
    }
    return out_put(o, "}}", 2) < 0 ? -1 : 1;
}

static void
out_init(Out *o)
{
    o->data = o->small;
    o->len = 0;
    o->cap = sizeof(o->small);
}

static PyObject *
image(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "image(image, columns: tuple)");
        return NULL;
    }
    Out o;
    out_init(&o);
    int rc = write_image(&o, args[0], args[1]);
    PyObject *result = rc > 0 ? PyBytes_FromStringAndSize(o.data, o.len) : rc == 0 ? Py_NewRef(Py_None) : NULL;
    out_free(&o);
    return result;
}

/*
 * parts(images, columns, key, fits, table, ts, cls, fields) -> (parts, holes): the
 * Open Protocol parts of a run of inserts of one table at one ts, each value
 * b'{"u":' + image(img, columns) + b'}' for each img of images, and its key the
 * run's key.  A part is made as cls(key, value, table, 1, ts) would make it: an
 * instance of cls (a frozen dataclass with slots) whose slots are set through
 * fields, the member descriptors of key, value, table, row_count and ts.  An image
 * the writer leaves to Python, or whose value is longer than fits, gets None in
 * parts and its index in holes, for the caller to fill.
 */
static PyObject *
parts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8 || !PyTuple_Check(args[1]) || !PyBytes_Check(args[2]) || !PyType_Check(args[6])
        || !PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != 5) {
        PyErr_SetString(PyExc_TypeError, "parts(images, columns: tuple, key: bytes, fits, table, ts, cls, fields)");
        return NULL;
    }
    PyObject *columns = args[1], *key = args[2], *table = args[4], *ts = args[5], *fields = args[7];
    PyTypeObject *cls = (PyTypeObject *)args[6];
    for (Py_ssize_t f = 0; f < 5; f++) {
        if (Py_TYPE(PyTuple_GET_ITEM(fields, f))->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "parts: fields must be the class's slot descriptors");
            return NULL;
        }
    }
    Py_ssize_t fits = PyLong_AsSsize_t(args[3]);
    if (fits == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "parts: images must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n), *holes = PyList_New(0), *one = PyLong_FromLong(1);
    if (out == NULL || holes == NULL || one == NULL)
        goto fail;
    Out o;
    out_init(&o);
    for (Py_ssize_t i = 0; i < n; i++) {
        o.len = 0;
        int rc = out_put(&o, "{\"u\":", 5) < 0 ? -1 : write_image(&o, PySequence_Fast_GET_ITEM(seq, i), columns);
        if (rc > 0)
            rc = out_put(&o, "}", 1) < 0 ? -1 : o.len <= fits;
        if (rc < 0) {
            out_free(&o);
            goto fail;
        }
        if (rc == 0) {
            PyObject *index = PyLong_FromSsize_t(i);
            int failed = index == NULL || PyList_Append(holes, index) < 0;
            Py_XDECREF(index);
            if (failed) {
                out_free(&o);
                goto fail;
            }
            PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
            continue;
        }
        PyObject *value = PyBytes_FromStringAndSize(o.data, o.len);
        PyObject *part = value ? cls->tp_alloc(cls, 0) : NULL;
        PyObject *set[5] = {key, value, table, one, ts};
        for (Py_ssize_t f = 0; part != NULL && f < 5; f++) {
            PyObject *field = PyTuple_GET_ITEM(fields, f);
            if (Py_TYPE(field)->tp_descr_set(field, part, set[f]) < 0)
                Py_CLEAR(part);
        }
        Py_XDECREF(value);
        if (part == NULL) {
            out_free(&o);
            goto fail;
        }
        PyList_SET_ITEM(out, i, part);
    }
    out_free(&o);
    Py_DECREF(seq);
    Py_DECREF(one);
    return Py_BuildValue("(NN)", out, holes);
fail:
    Py_DECREF(seq);
    Py_XDECREF(out);
    Py_XDECREF(holes);
    Py_XDECREF(one);
    return NULL;
}

/*
 * pack(parts, max_rows, max_bytes, version, overhead) packs row parts (objects with
 * .key: bytes | None, .value: bytes, .ts: int) into Open Protocol messages, in order, by
 * the rule OpenProtocolCodec.assemble writes in Python: at most max_rows parts a message,
 * and no more than max_bytes counting 16 + len(key) + len(value) a part on top of
 * 8 + overhead (a part over the limit alone gets a message of its own).  A message's key
 * is version then each part's 8-byte big-endian length and key, its value each part's
 * length and value.  It returns a list of (key, value, count, ts) -- ts the largest of
 * its parts' -- or None, for the Python path, when a part is of another shape.
 */
typedef struct {
    PyObject *key, *value; /* new references; key NULL for None */
    long long ts;
} Part;

static void
put_be64(char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (char)(v & 0xFF);
        v >>= 8;
    }
}

static PyObject *
pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static PyObject *s_key, *s_value, *s_ts;
    /* Each name made until it is made: a failed first call leaves none half-set. */
    if ((s_key == NULL && (s_key = PyUnicode_InternFromString("key")) == NULL)
        || (s_value == NULL && (s_value = PyUnicode_InternFromString("value")) == NULL)
        || (s_ts == NULL && (s_ts = PyUnicode_InternFromString("ts")) == NULL))
        return NULL;
    if (nargs != 5 || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "pack(parts, max_rows, max_bytes, version: bytes, overhead)");
        return NULL;
    }
    long long max_rows = PyLong_AsLongLong(args[1]), max_bytes = PyLong_AsLongLong(args[2]);
    long long overhead = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "pack: parts must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Part *parts = PyMem_Calloc(n ? n : 1, sizeof(Part));
    PyObject *out = NULL;
    int python = 0; /* a part this code does not take: None for the caller */
    if (parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *key = PyObject_GetAttr(part, s_key);
        if (key == NULL)
            goto done;
        if (key == Py_None)
            Py_CLEAR(key);
        parts[i].key = key;
        if ((parts[i].value = PyObject_GetAttr(part, s_value)) == NULL)
            goto done;
        PyObject *ts = PyObject_GetAttr(part, s_ts);
        if (ts == NULL)
            goto done;
        int overflow = 0;
        parts[i].ts = PyLong_Check(ts) ? PyLong_AsLongLongAndOverflow(ts, &overflow) : 0;
        int exact = PyLong_CheckExact(ts) && !overflow;
        Py_DECREF(ts);
        if (PyErr_Occurred())
            goto done;
        if (!exact || !PyBytes_CheckExact(parts[i].value) || (key != NULL && !PyBytes_CheckExact(key))) {
            python = 1;
            goto done;
        }
    }
    if (max_rows < 1)
        max_rows = 1;
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    const char *version = PyBytes_AS_STRING(args[3]);
    Py_ssize_t version_len = PyBytes_GET_SIZE(args[3]);
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t first = i, key_len = version_len, value_len = 0;
        long long size = 8 + overhead, ts = parts[i].ts, count = 0;
        while (i < n && count < max_rows) {
            Py_ssize_t kl = parts[i].key ? PyBytes_GET_SIZE(parts[i].key) : 0;
            Py_ssize_t vl = PyBytes_GET_SIZE(parts[i].value);
            long long grow = 16 + (long long)kl + (long long)vl;
            if (count && size + grow > max_bytes)
                break;
            size += grow;
            key_len += 8 + kl;
            value_len += 8 + vl;
            if (parts[i].ts > ts)
                ts = parts[i].ts;
            count++;
            i++;
        }
        PyObject *key = PyBytes_FromStringAndSize(NULL, key_len);
        PyObject *value = key ? PyBytes_FromStringAndSize(NULL, value_len) : NULL;
        if (value == NULL) {
            Py_XDECREF(key);
            Py_CLEAR(out);
            goto done;
        }
        char *k = PyBytes_AS_STRING(key), *v = PyBytes_AS_STRING(value);
        memcpy(k, version, version_len);
        k += version_len;
        for (Py_ssize_t j = first; j < i; j++) {
            Py_ssize_t kl = parts[j].key ? PyBytes_GET_SIZE(parts[j].key) : 0;
            Py_ssize_t vl = PyBytes_GET_SIZE(parts[j].value);
            put_be64(k, (uint64_t)kl);
            if (kl)
                memcpy(k + 8, PyBytes_AS_STRING(parts[j].key), kl);
            k += 8 + kl;
            put_be64(v, (uint64_t)vl);
            memcpy(v + 8, PyBytes_AS_STRING(parts[j].value), vl);
            v += 8 + vl;
        }
        PyObject *message = Py_BuildValue("(NNLL)", key, value, count, ts);
        if (message == NULL || PyList_Append(out, message) < 0) {
            Py_XDECREF(message);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(message);
    }
done:
    if (parts != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_XDECREF(parts[i].key);
            Py_XDECREF(parts[i].value);
        }
        PyMem_Free(parts);
    }
    Py_DECREF(seq);
    if (python && out == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"image", (PyCFunction)(void (*)(void))image, METH_FASTCALL,
     "image(image, columns) -> bytes | None: a full row image as Open Protocol JSON, UTF-8 and HTML-escaped."},
    {"parts", (PyCFunction)(void (*)(void))parts, METH_FASTCALL,
     "parts(images, columns, key, fits, table, ts, cls, fields) -> (parts, holes): a run of inserts'"
     " Open Protocol parts (see the source)."},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(parts, max_rows, max_bytes, version, overhead) -> list[(key, value, count, ts)] | None:"
     " row parts packed into Open Protocol messages as OpenProtocolCodec.assemble packs them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_opfast", "Open Protocol row images in C (see the module's source).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__opfast(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    if (format_f == NULL && (format_f = PyUnicode_InternFromString("f")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "K_INT", K_INT) < 0 || PyModule_AddIntConstant(m, "K_STR", K_STR) < 0
        || PyModule_AddIntConstant(m, "K_CALL", K_CALL) < 0 || PyModule_AddIntConstant(m, "K_DECIMAL", K_DECIMAL) < 0
        || PyModule_AddIntConstant(m, "K_TEMPORAL", K_TEMPORAL) < 0
        || PyModule_AddIntConstant(m, "K_DOUBLE", K_DOUBLE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
