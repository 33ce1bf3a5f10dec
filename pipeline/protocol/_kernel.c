/* pipeline.protocol._kernel: the columnar RecordBatch v2 kernel.
 *
 * Sans-I/O, no Python object per record: every function walks flat column
 * buffers (Arrow layout: offsets + data + validity bitmap) and writes bytes.
 * pipeline/protocol/_kernel_py.py is the pure-Python twin of every function
 * here; tests run both and require identical results (bytes, sizes, errors).
 *
 * Column specs are built once per Columns object by pipeline/protocol/columnar.py:
 *
 *   binary  = (offsets, wide, data, validity | None, validity_bit_offset, n)
 *             offsets: n + 1 little-endian int32 (wide = 0) or int64 (wide = 1)
 *   headers = (row_offsets, wide, row_validity | None, row_validity_bit_offset, n,
 *              header_keys: binary, header_values: binary)
 *   columns = (n, values: binary, keys: binary | None, headers | None,
 *              timestamps: int64 buffer | None, default_timestamp)
 *
 * Nothing in a spec is trusted: every offset is bounds-checked against its
 * buffer before it is read, so hostile buffers raise ValueError, never crash.
 *
 * Three functions go the other way (at the end): decode_rows, a fetched batch's
 * records to row tuples, one Python object per record and no intermediate one;
 * decode_columns, the same records to flat column buffers, no Python object per
 * record; binary_list, a binary column's cells as a list of bytes.
 * The loops run without the GIL (the buffers stay exported, hence pinned).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BATCH_HEADER_SIZE 61
#define MAX_RECORD_OVERHEAD 21

/* ------------------------------------------------------------------ varints */

static inline uint64_t zigzag(int64_t n) {
    return ((uint64_t)n << 1) ^ (0 - ((uint64_t)n >> 63));
}

static inline int64_t vz_size(int64_t n) {
    uint64_t z = zigzag(n);
    int64_t s = 1;
    while (z > 0x7F) {
        z >>= 7;
        s++;
    }
    return s;
}

static inline uint8_t *put_vz(uint8_t *p, int64_t n) {
    uint64_t z = zigzag(n);
    while (z > 0x7F) {
        *p++ = (uint8_t)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

/* ------------------------------------------------------------------ errors */

enum {
    E_OK = 0,
    E_ROW_RANGE,      /* a row index outside the columns */
    E_OFFSETS,        /* offsets not monotone or past the data buffer */
    E_HEADER_OFFSETS, /* header row offsets not monotone or past the entries */
    E_HEADER_KEY_NULL,
    E_TOO_LARGE,      /* a batch beyond what a Py_ssize_t / Kafka can hold */
};

typedef struct {
    int code;
    const char *column;
    int64_t row;
} kerr;

static void raise_kerr(const kerr *e) {
    switch (e->code) {
    case E_ROW_RANGE:
        PyErr_Format(PyExc_ValueError, "row index %lld is outside the columns", (long long)e->row);
        break;
    case E_OFFSETS:
        PyErr_Format(PyExc_ValueError,
                     "%s: row %lld: offsets are not ascending or run past the data buffer",
                     e->column, (long long)e->row);
        break;
    case E_HEADER_OFFSETS:
        PyErr_Format(PyExc_ValueError,
                     "headers: row %lld: list offsets are not ascending or run past the entries",
                     (long long)e->row);
        break;
    case E_HEADER_KEY_NULL:
        PyErr_Format(PyExc_ValueError, "headers: row %lld: a header key is null",
                     (long long)e->row);
        break;
    case E_TOO_LARGE:
        PyErr_Format(PyExc_ValueError, "record batch too large (at row %lld)", (long long)e->row);
        break;
    default:
        PyErr_SetString(PyExc_SystemError, "unknown kernel error");
    }
}

/* ------------------------------------------------------------------ columns */

typedef struct {
    Py_buffer off, data, valid;
    int have_off, have_data, have_valid;
    int wide;
    Py_ssize_t voff;
    Py_ssize_t n;
    const char *name;
} bincol;

typedef struct {
    Py_buffer off, valid;
    int have_off, have_valid;
    int wide;
    Py_ssize_t voff;
    Py_ssize_t n;
    bincol keys, values;
} hdrcol;

typedef struct {
    Py_ssize_t n;
    bincol values, keys;
    int have_keys;
    hdrcol headers;
    int have_headers;
    Py_buffer ts;
    int have_ts;
    int64_t default_ts;
} cols;

static void bincol_release(bincol *c) {
    if (c->have_off) PyBuffer_Release(&c->off);
    if (c->have_data) PyBuffer_Release(&c->data);
    if (c->have_valid) PyBuffer_Release(&c->valid);
    c->have_off = c->have_data = c->have_valid = 0;
}

static void hdrcol_release(hdrcol *h) {
    if (h->have_off) PyBuffer_Release(&h->off);
    if (h->have_valid) PyBuffer_Release(&h->valid);
    h->have_off = h->have_valid = 0;
    bincol_release(&h->keys);
    bincol_release(&h->values);
}

static void cols_release(cols *c) {
    bincol_release(&c->values);
    bincol_release(&c->keys);
    hdrcol_release(&c->headers);
    if (c->have_ts) PyBuffer_Release(&c->ts);
    c->have_ts = 0;
}

static int get_buf(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a %sbuffer, got %.100s", what,
                     writable ? "writable " : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

/* Validity bitmap bytes needed for n rows starting at bit voff. */
static Py_ssize_t bitmap_bytes(Py_ssize_t voff, Py_ssize_t n) { return (voff + n + 7) / 8; }

static int parse_bincol(PyObject *spec, bincol *c, const char *name) {
    PyObject *off, *data, *valid;
    int wide;
    Py_ssize_t voff, n;
    memset(c, 0, sizeof(*c));
    c->name = name;
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "OpOOnn", &off, &wide, &data, &valid, &voff, &n)) {
        PyErr_Format(PyExc_TypeError, "%s: malformed binary column spec", name);
        return -1;
    }
    if (n < 0 || voff < 0) {
        PyErr_Format(PyExc_ValueError, "%s: negative length or bit offset", name);
        return -1;
    }
    c->wide = wide;
    c->voff = voff;
    c->n = n;
    if (get_buf(off, &c->off, 0, name) < 0) return -1;
    c->have_off = 1;
    if (c->off.len < (n + 1) * (wide ? 8 : 4)) {
        PyErr_Format(PyExc_ValueError, "%s: offsets buffer holds fewer than %zd entries", name,
                     n + 1);
        return -1;
    }
    if (get_buf(data, &c->data, 0, name) < 0) return -1;
    c->have_data = 1;
    if (valid != Py_None) {
        if (get_buf(valid, &c->valid, 0, name) < 0) return -1;
        c->have_valid = 1;
        if (c->valid.len < bitmap_bytes(voff, n)) {
            PyErr_Format(PyExc_ValueError, "%s: validity bitmap too short for %zd rows", name, n);
            return -1;
        }
    }
    return 0;
}

static int parse_hdrcol(PyObject *spec, hdrcol *h) {
    PyObject *off, *valid, *kspec, *vspec;
    int wide;
    Py_ssize_t voff, n;
    memset(h, 0, sizeof(*h));
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "OpOnnOO", &off, &wide, &valid, &voff, &n, &kspec, &vspec)) {
        PyErr_SetString(PyExc_TypeError, "headers: malformed header column spec");
        return -1;
    }
    if (n < 0 || voff < 0) {
        PyErr_SetString(PyExc_ValueError, "headers: negative length or bit offset");
        return -1;
    }
    h->wide = wide;
    h->voff = voff;
    h->n = n;
    if (get_buf(off, &h->off, 0, "headers") < 0) return -1;
    h->have_off = 1;
    if (h->off.len < (n + 1) * (wide ? 8 : 4)) {
        PyErr_SetString(PyExc_ValueError, "headers: offsets buffer too short");
        return -1;
    }
    if (valid != Py_None) {
        if (get_buf(valid, &h->valid, 0, "headers") < 0) return -1;
        h->have_valid = 1;
        if (h->valid.len < bitmap_bytes(voff, n)) {
            PyErr_SetString(PyExc_ValueError, "headers: validity bitmap too short");
            return -1;
        }
    }
    if (parse_bincol(kspec, &h->keys, "header keys") < 0) return -1;
    if (parse_bincol(vspec, &h->values, "header values") < 0) return -1;
    if (h->keys.n != h->values.n) {
        PyErr_SetString(PyExc_ValueError, "headers: key and value entry counts differ");
        return -1;
    }
    return 0;
}

static int parse_cols(PyObject *spec, cols *c) {
    PyObject *vspec, *kspec, *hspec, *ts;
    long long dts;
    Py_ssize_t n;
    memset(c, 0, sizeof(*c));
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "nOOOOL", &n, &vspec, &kspec, &hspec, &ts, &dts)) {
        PyErr_SetString(PyExc_TypeError, "malformed columns spec");
        return -1;
    }
    c->n = n;
    c->default_ts = dts;
    if (parse_bincol(vspec, &c->values, "values") < 0) goto fail;
    if (c->values.n != n) goto badlen;
    if (kspec != Py_None) {
        if (parse_bincol(kspec, &c->keys, "keys") < 0) goto fail;
        c->have_keys = 1;
        if (c->keys.n != n) goto badlen;
    }
    if (hspec != Py_None) {
        if (parse_hdrcol(hspec, &c->headers) < 0) goto fail;
        c->have_headers = 1;
        if (c->headers.n != n) goto badlen;
    }
    if (ts != Py_None) {
        if (get_buf(ts, &c->ts, 0, "timestamps") < 0) goto fail;
        c->have_ts = 1;
        if (c->ts.len < n * 8) {
            PyErr_SetString(PyExc_ValueError, "timestamps: buffer holds fewer than n int64s");
            goto fail;
        }
    }
    return 0;
badlen:
    PyErr_SetString(PyExc_ValueError, "columns spec: column lengths differ");
fail:
    cols_release(c);
    return -1;
}

static inline int64_t load_off(const Py_buffer *b, int wide, Py_ssize_t i) {
    const char *p = (const char *)b->buf;
    if (wide) {
        int64_t v;
        memcpy(&v, p + i * 8, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, p + i * 4, 4);
    return v;
}

static inline int bit_set(const Py_buffer *b, Py_ssize_t voff, Py_ssize_t i) {
    Py_ssize_t k = voff + i;
    return (((const uint8_t *)b->buf)[k >> 3] >> (k & 7)) & 1;
}

/* One cell of a binary column: 0 ok (len -1 = null), -1 bad offsets. */
static inline int cell(const bincol *c, Py_ssize_t row, const uint8_t **ptr, int64_t *len) {
    if (c->have_valid && !bit_set(&c->valid, c->voff, row)) {
        *ptr = NULL;
        *len = -1;
        return 0;
    }
    int64_t a = load_off(&c->off, c->wide, row);
    int64_t b = load_off(&c->off, c->wide, row + 1);
    if (a < 0 || b < a || b > (int64_t)c->data.len) return -1;
    *ptr = (const uint8_t *)c->data.buf + a;
    *len = b - a;
    return 0;
}

/* The header entries [*start, *stop) of a row; -1 on bad offsets. */
static inline int header_range(const hdrcol *h, Py_ssize_t row, int64_t *start, int64_t *stop) {
    if (h->have_valid && !bit_set(&h->valid, h->voff, row)) {
        *start = *stop = 0;
        return 0;
    }
    int64_t a = load_off(&h->off, h->wide, row);
    int64_t b = load_off(&h->off, h->wide, row + 1);
    if (a < 0 || b < a || b > (int64_t)h->keys.n) return -1;
    *start = a;
    *stop = b;
    return 0;
}

static inline int64_t get_ts(const cols *c, Py_ssize_t row) {
    if (!c->have_ts) return c->default_ts;
    int64_t v;
    memcpy(&v, (const char *)c->ts.buf + row * 8, 8);
    return v;
}

/* Size of a record's key, value and headers sections (everything after the
 * offset delta). Returns -1 and fills *e on bad input. */
static int64_t payload_size(const cols *c, Py_ssize_t row, kerr *e) {
    const uint8_t *p = NULL;
    int64_t len = -1, size = 0;
    if (c->have_keys) {
        if (cell(&c->keys, row, &p, &len) < 0) goto bad_keys;
        size += len < 0 ? 1 : vz_size(len) + len;
    } else {
        size += 1;
    }
    if (cell(&c->values, row, &p, &len) < 0) goto bad_values;
    size += len < 0 ? 1 : vz_size(len) + len;
    if (c->have_headers) {
        int64_t hs, he;
        const hdrcol *h = &c->headers;
        if (header_range(h, row, &hs, &he) < 0) {
            e->code = E_HEADER_OFFSETS;
            e->row = row;
            return -1;
        }
        size += vz_size(he - hs);
        for (int64_t j = hs; j < he; j++) {
            if (cell(&h->keys, j, &p, &len) < 0) goto bad_hdr;
            if (len < 0) {
                e->code = E_HEADER_KEY_NULL;
                e->row = row;
                return -1;
            }
            size += vz_size(len) + len;
            if (cell(&h->values, j, &p, &len) < 0) goto bad_hdr;
            size += len < 0 ? 1 : vz_size(len) + len;
        }
    } else {
        size += 1;
    }
    return size;
bad_keys:
    e->column = "keys";
    goto bad;
bad_values:
    e->column = "values";
    goto bad;
bad_hdr:
    e->column = "headers";
bad:
    e->code = E_OFFSETS;
    e->row = row;
    return -1;
}

/* Write one nullable bytes field, or return NULL when it does not fit in [out, end). */
static inline uint8_t *put_field(uint8_t *out, const uint8_t *end, const uint8_t *p,
                                 int64_t len) {
    if (len < 0) {
        if (end - out < 1) return NULL;
        *out++ = 1;
        return out;
    }
    if (end - out < vz_size(len) + len) return NULL;
    out = put_vz(out, len);
    memcpy(out, p, (size_t)len);
    return out + len;
}

/* Write a record's key, value and headers. Every cell is re-validated and every
 * write bounded by `end`: if a (mutable) buffer changed since payload_size
 * measured it, this returns NULL instead of reading or writing out of bounds. */
static uint8_t *put_payload(const cols *c, Py_ssize_t row, uint8_t *out, const uint8_t *end) {
    const uint8_t *p = NULL;
    int64_t len = -1;
    if (c->have_keys && cell(&c->keys, row, &p, &len) < 0) return NULL;
    if (!(out = put_field(out, end, p, c->have_keys ? len : -1))) return NULL;
    if (cell(&c->values, row, &p, &len) < 0) return NULL;
    if (!(out = put_field(out, end, p, len))) return NULL;
    if (!c->have_headers) {
        if (end - out < 1) return NULL;
        *out++ = 0;
        return out;
    }
    int64_t hs = 0, he = 0;
    const hdrcol *h = &c->headers;
    if (header_range(h, row, &hs, &he) < 0) return NULL;
    if (end - out < vz_size(he - hs)) return NULL;
    out = put_vz(out, he - hs);
    for (int64_t j = hs; j < he; j++) {
        if (cell(&h->keys, j, &p, &len) < 0 || len < 0) return NULL;
        if (!(out = put_field(out, end, p, len))) return NULL;
        if (cell(&h->values, j, &p, &len) < 0) return NULL;
        if (!(out = put_field(out, end, p, len))) return NULL;
    }
    return out;
}

/* ------------------------------------------------------------------ row selections */

typedef struct {
    Py_buffer buf;
    int have;
    Py_ssize_t start, stop;
} rowsel;

static int parse_rows(PyObject *rows, Py_ssize_t start, Py_ssize_t stop, rowsel *r) {
    memset(r, 0, sizeof(*r));
    if (start < 0 || stop < start) {
        PyErr_Format(PyExc_ValueError, "bad row range [%zd, %zd)", start, stop);
        return -1;
    }
    r->start = start;
    r->stop = stop;
    if (rows != Py_None) {
        if (get_buf(rows, &r->buf, 0, "rows") < 0) return -1;
        r->have = 1;
        if (r->buf.len < stop * 8) {
            PyBuffer_Release(&r->buf);
            r->have = 0;
            PyErr_Format(PyExc_ValueError, "rows: buffer holds fewer than %zd int64s", stop);
            return -1;
        }
    }
    return 0;
}

static inline int64_t row_at(const rowsel *r, Py_ssize_t pos) {
    if (!r->have) return pos;
    int64_t v;
    memcpy(&v, (const char *)r->buf.buf + pos * 8, 8);
    return v;
}

static void rowsel_release(rowsel *r) {
    if (r->have) PyBuffer_Release(&r->buf);
    r->have = 0;
}

/* ------------------------------------------------------------------ encode_records */

typedef struct {
    const cols *c;
    const rowsel *r;
    int64_t *bodies; /* body size per position */
    int64_t total, base_ts, max_ts;
    uint8_t *out;
    kerr e;
} encode_job;

static int encode_measure(encode_job *j) {
    const cols *c = j->c;
    const rowsel *r = j->r;
    int64_t total = 0, base = 0, max_ts = 0;
    for (Py_ssize_t pos = r->start; pos < r->stop; pos++) {
        int64_t row = row_at(r, pos);
        if (row < 0 || row >= c->n) {
            j->e.code = E_ROW_RANGE;
            j->e.row = row;
            return -1;
        }
        int64_t ts = get_ts(c, (Py_ssize_t)row);
        if (pos == r->start) base = max_ts = ts;
        else if (ts > max_ts) max_ts = ts;
        int64_t pay = payload_size(c, (Py_ssize_t)row, &j->e);
        if (pay < 0) return -1;
        int64_t body = 1 + vz_size(ts - base) + vz_size(pos - r->start) + pay;
        j->bodies[pos - r->start] = body;
        total += vz_size(body) + body;
        if (total > (int64_t)(PY_SSIZE_T_MAX / 2)) {
            j->e.code = E_TOO_LARGE;
            j->e.row = row;
            return -1;
        }
    }
    j->total = total;
    j->base_ts = base;
    j->max_ts = max_ts;
    return 0;
}

/* Second pass: 0, or -1 if the columns changed since encode_measure. */
static int encode_write(encode_job *j) {
    const cols *c = j->c;
    const rowsel *r = j->r;
    uint8_t *out = j->out;
    const uint8_t *end = j->out + j->total;
    for (Py_ssize_t pos = r->start; pos < r->stop; pos++) {
        int64_t row = row_at(r, pos);
        if (row < 0 || row >= c->n) return -1;
        int64_t body = j->bodies[pos - r->start];
        int64_t tsd = get_ts(c, (Py_ssize_t)row) - j->base_ts;
        int64_t od = pos - r->start;
        uint8_t *rec_end = out + vz_size(body) + body;
        if (rec_end > end || end - out < vz_size(body) + 1 + vz_size(tsd) + vz_size(od))
            return -1;
        out = put_vz(out, body);
        *out++ = 0; /* attributes */
        out = put_vz(out, tsd);
        out = put_vz(out, od);
        out = put_payload(c, (Py_ssize_t)row, out, rec_end);
        if (out != rec_end) return -1;
    }
    return out == end ? 0 : -1;
}

static PyObject *k_encode_records(PyObject *self, PyObject *args) {
    PyObject *spec, *rows;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OOnn", &spec, &rows, &start, &stop)) return NULL;
    cols c;
    rowsel r;
    if (parse_cols(spec, &c) < 0) return NULL;
    if (parse_rows(rows, start, stop, &r) < 0) {
        cols_release(&c);
        return NULL;
    }
    PyObject *result = NULL, *out = NULL;
    encode_job j;
    memset(&j, 0, sizeof(j));
    j.c = &c;
    j.r = &r;
    Py_ssize_t count = stop - start;
    j.bodies = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(int64_t));
    if (!j.bodies) {
        PyErr_NoMemory();
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = encode_measure(&j);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        raise_kerr(&j.e);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)j.total);
    if (!out) goto done;
    j.out = (uint8_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    rc = encode_write(&j);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "the columns changed while being encoded");
        goto done;
    }
    result = Py_BuildValue("(OLL)", out, (long long)j.base_ts, (long long)j.max_ts);
done:
    Py_XDECREF(out);
    PyMem_RawFree(j.bodies);
    rowsel_release(&r);
    cols_release(&c);
    return result;
}

/* ------------------------------------------------------------------ size_bounds */

static PyObject *k_size_bounds(PyObject *self, PyObject *args) {
    PyObject *spec, *outobj;
    if (!PyArg_ParseTuple(args, "OO", &spec, &outobj)) return NULL;
    cols c;
    if (parse_cols(spec, &c) < 0) return NULL;
    Py_buffer out;
    if (get_buf(outobj, &out, 1, "out") < 0) {
        cols_release(&c);
        return NULL;
    }
    if (out.len < c.n * 8) {
        PyErr_SetString(PyExc_ValueError, "out: buffer holds fewer than n int64s");
        PyBuffer_Release(&out);
        cols_release(&c);
        return NULL;
    }
    kerr e = {0};
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t row = 0; row < c.n; row++) {
        int64_t pay = payload_size(&c, row, &e);
        if (pay < 0) {
            rc = -1;
            break;
        }
        int64_t bound = BATCH_HEADER_SIZE + MAX_RECORD_OVERHEAD + pay;
        memcpy((char *)out.buf + row * 8, &bound, 8);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    cols_release(&c);
    if (rc < 0) {
        raise_kerr(&e);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ cut_batches */

typedef struct {
    int64_t pos, bytes;
} cut;

static PyObject *k_cut_batches(PyObject *self, PyObject *args) {
    PyObject *spec, *rows;
    Py_ssize_t start, stop;
    long long max_bytes, max_records;
    if (!PyArg_ParseTuple(args, "OOnnLL", &spec, &rows, &start, &stop, &max_bytes, &max_records))
        return NULL;
    if (max_records < 1) {
        PyErr_SetString(PyExc_ValueError, "max_records must be >= 1");
        return NULL;
    }
    cols c;
    rowsel r;
    if (parse_cols(spec, &c) < 0) return NULL;
    if (parse_rows(rows, start, stop, &r) < 0) {
        cols_release(&c);
        return NULL;
    }
    Py_ssize_t count = stop - start;
    cut *cuts = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(cut));
    PyObject *result = NULL;
    if (!cuts) {
        PyErr_NoMemory();
        goto done;
    }
    kerr e = {0};
    int rc = 0;
    Py_ssize_t ncuts = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t base = 0, size = 0, in_batch = 0;
    for (Py_ssize_t pos = start; pos < stop; pos++) {
        int64_t row = row_at(&r, pos);
        if (row < 0 || row >= c.n) {
            e.code = E_ROW_RANGE;
            e.row = row;
            rc = -1;
            break;
        }
        int64_t pay = payload_size(&c, (Py_ssize_t)row, &e);
        if (pay < 0) {
            rc = -1;
            break;
        }
        int64_t ts = get_ts(&c, (Py_ssize_t)row);
        int64_t rec = 0;
        if (in_batch) {
            int64_t body = 1 + vz_size(ts - base) + vz_size(in_batch) + pay;
            rec = vz_size(body) + body;
            if (in_batch >= max_records || size + rec > max_bytes) {
                cuts[ncuts].pos = pos;
                cuts[ncuts].bytes = size;
                ncuts++;
                in_batch = 0;
            }
        }
        if (!in_batch) {
            base = ts;
            size = BATCH_HEADER_SIZE;
            int64_t body = 1 + 1 + 1 + pay; /* attributes, delta 0, offset 0 */
            rec = vz_size(body) + body;
        }
        size += rec;
        in_batch++;
    }
    if (rc == 0 && in_batch) {
        cuts[ncuts].pos = stop;
        cuts[ncuts].bytes = size;
        ncuts++;
    }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        raise_kerr(&e);
        goto done;
    }
    result = PyList_New(ncuts);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < ncuts; i++) {
        PyObject *t = Py_BuildValue("(LL)", (long long)cuts[i].pos, (long long)cuts[i].bytes);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }
done:
    PyMem_RawFree(cuts);
    rowsel_release(&r);
    cols_release(&c);
    return result;
}

/* ------------------------------------------------------------------ pack_binary */

/* A list/tuple of bytes | bytearray | memoryview | str | None -> Arrow-layout
 * buffers (int64 offsets, data, validity bitmap or None, null count). */
static PyObject *k_pack_binary(PyObject *self, PyObject *args) {
    PyObject *seq, *what;
    if (!PyArg_ParseTuple(args, "OU", &seq, &what)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "pack_binary needs a list or tuple");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *offsets = NULL, *data = NULL, *valid = NULL, *result = NULL;
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 8);
    if (!offsets) goto done;
    int64_t *off = (int64_t *)PyBytes_AS_STRING(offsets);
    int64_t total = 0;
    Py_ssize_t nulls = 0;
    off[0] = 0;
    /* pass 1: sizes and types */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i];
        Py_ssize_t len;
        if (it == Py_None) {
            len = 0;
            nulls++;
        } else if (PyBytes_CheckExact(it)) {
            len = PyBytes_GET_SIZE(it);
        } else if (PyUnicode_Check(it)) {
            if (!PyUnicode_AsUTF8AndSize(it, &len)) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                PyErr_Format(PyExc_ValueError, "%U: row %zd: str is not encodable as UTF-8 (%S)",
                             what, i, value ? value : Py_None);
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
                goto done;
            }
        } else if (PyObject_CheckBuffer(it) && !PyUnicode_Check(it)) {
            Py_buffer v;
            if (PyObject_GetBuffer(it, &v, PyBUF_C_CONTIGUOUS) < 0) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%U: row %zd: %.100s is not a contiguous buffer",
                             what, i, Py_TYPE(it)->tp_name);
                goto done;
            }
            len = v.len;
            PyBuffer_Release(&v);
        } else {
            PyErr_Format(PyExc_TypeError,
                         "%U: row %zd: expected bytes, bytearray, memoryview, str (sent as "
                         "UTF-8) or None, not %.100s: serialize it first",
                         what, i, Py_TYPE(it)->tp_name);
            goto done;
        }
        total += len;
        off[i + 1] = total;
    }
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!data) goto done;
    char *dst = PyBytes_AS_STRING(data);
    uint8_t *bits = NULL;
    if (nulls) {
        valid = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!valid) goto done;
        bits = (uint8_t *)PyBytes_AS_STRING(valid);
        memset(bits, 0, (size_t)((n + 7) / 8));
    }
    /* pass 2: copy (the items cannot change size: the list holds them and
     * bytes/str are immutable; a resized bytearray is caught by the length check) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i];
        Py_ssize_t want = (Py_ssize_t)(off[i + 1] - off[i]);
        if (it == Py_None) continue;
        if (bits) bits[i >> 3] |= (uint8_t)(1 << (i & 7));
        if (PyBytes_CheckExact(it)) {
            memcpy(dst + off[i], PyBytes_AS_STRING(it), (size_t)want);
        } else if (PyUnicode_Check(it)) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(it, &len);
            if (!s) goto done;
            memcpy(dst + off[i], s, (size_t)want);
        } else {
            Py_buffer v;
            if (PyObject_GetBuffer(it, &v, PyBUF_C_CONTIGUOUS) < 0) goto done;
            if (v.len != want) {
                PyBuffer_Release(&v);
                PyErr_Format(PyExc_ValueError, "%U: row %zd changed size while being packed",
                             what, i);
                goto done;
            }
            memcpy(dst + off[i], v.buf, (size_t)want);
            PyBuffer_Release(&v);
        }
    }
    result = Py_BuildValue("(OOOn)", offsets, data, valid ? valid : Py_None, nulls);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(valid);
    Py_DECREF(fast);
    return result;
}

/* ------------------------------------------------------------------ pack_ints */

/* pack_ints(seq, wide) -> bytes | None: a list/tuple of ints in 0..INT64_MAX (wide)
 * or 0..INT32_MAX as native int64/int32 items; None when an item is anything else
 * (not an exact int, negative, too big): the caller's slow path then names the
 * row. array(code, seq) does the same per item through PyArg_Parse, ~25 ns an
 * item for a millisecond timestamp (two digits: PyLong_AsLongLong's byte-array
 * path); here an item equal to the one before (a send() burst's timestamps share
 * the int of their millisecond) costs a pointer compare. */
static PyObject *k_pack_ints(PyObject *self, PyObject *args) {
    PyObject *seq;
    int wide;
    if (!PyArg_ParseTuple(args, "Op", &seq, &wide)) return NULL;
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) {
        PyErr_SetString(PyExc_TypeError, "pack_ints needs a list or tuple");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t width = wide ? 8 : 4;
    long long top = wide ? INT64_MAX : INT32_MAX;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)width);
    if (out == NULL) return NULL;
    char *dst = PyBytes_AS_STRING(out);
    PyObject *prev = NULL;
    long long v = 0;
    /* (items re-read each round: nothing here runs Python code, so the list cannot
     * change under the loop; its size is read once for that reason) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (it != prev) {
            if (!PyLong_CheckExact(it)) goto other;
            int overflow;
            v = PyLong_AsLongLongAndOverflow(it, &overflow);
            if (v == -1 && PyErr_Occurred()) goto fail; /* (an exact int: never, but checked first) */
            if (overflow || v < 0 || v > top) goto other;
            prev = it;
        }
        if (wide) {
            int64_t w = (int64_t)v;
            memcpy(dst + 8 * i, &w, 8);
        } else {
            int32_t w = (int32_t)v;
            memcpy(dst + 4 * i, &w, 4);
        }
    }
    return out;
other:
    Py_DECREF(out);
    Py_RETURN_NONE;
fail:
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ find_outside */

/* First index i with buf[i] outside [lo, hi] (int32 or int64 items), or -1. */
static PyObject *k_find_outside(PyObject *self, PyObject *args) {
    PyObject *obj;
    int wide;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "OpLL", &obj, &wide, &lo, &hi)) return NULL;
    Py_buffer b;
    if (get_buf(obj, &b, 0, "buffer") < 0) return NULL;
    Py_ssize_t n = b.len / (wide ? 8 : 4), found = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = load_off(&b, wide, i);
        if (v < lo || v > hi) {
            found = i;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(found);
}

/* ------------------------------------------------------------------ murmur2 */

/* Java's org.apache.kafka.common.utils.Utils.murmur2 (seed 0x9747b28c), as uint32. */
static inline uint32_t murmur2(const uint8_t *data, int64_t length) {
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    int64_t words = length / 4;
    for (int64_t i = 0; i < words; i++) {
        uint32_t k = (uint32_t)data[4 * i] | ((uint32_t)data[4 * i + 1] << 8) |
                     ((uint32_t)data[4 * i + 2] << 16) | ((uint32_t)data[4 * i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    int64_t tail = length & ~(int64_t)3;
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)data[tail + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[tail + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* mode 0: out[i] = signed murmur2 of key i (0 for a null key);
 * mode 1: out[i] = toPositive(murmur2) % num_partitions where out[i] == -1 and
 *         the key is not null (pinned rows and null keys are left alone). */
static PyObject *murmur2_common(PyObject *args, int mode) {
    PyObject *spec, *outobj;
    long long num_partitions = 0;
    if (mode == 0) {
        if (!PyArg_ParseTuple(args, "OO", &spec, &outobj)) return NULL;
    } else {
        if (!PyArg_ParseTuple(args, "OLO", &spec, &num_partitions, &outobj)) return NULL;
        if (num_partitions < 1 || num_partitions > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "num_partitions must be 1..2**31-1, got %lld",
                         num_partitions);
            return NULL;
        }
    }
    bincol k;
    if (parse_bincol(spec, &k, "keys") < 0) {
        bincol_release(&k);
        return NULL;
    }
    Py_buffer out;
    if (get_buf(outobj, &out, 1, "out") < 0) {
        bincol_release(&k);
        return NULL;
    }
    if (out.len < k.n * 4) {
        PyErr_SetString(PyExc_ValueError, "out: buffer holds fewer than n int32s");
        PyBuffer_Release(&out);
        bincol_release(&k);
        return NULL;
    }
    int64_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    int32_t *o = (int32_t *)out.buf;
    for (Py_ssize_t i = 0; i < k.n; i++) {
        const uint8_t *p;
        int64_t len;
        if (mode == 1 && o[i] != -1) continue;
        if (cell(&k, i, &p, &len) < 0) {
            bad = i;
            break;
        }
        if (len < 0) {
            if (mode == 0) o[i] = 0;
            continue;
        }
        uint32_t h = murmur2(p, len);
        if (mode == 0) o[i] = (int32_t)h;
        else o[i] = (int32_t)((h & 0x7fffffffu) % (uint32_t)num_partitions);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    bincol_release(&k);
    if (bad >= 0) {
        kerr e = {E_OFFSETS, "keys", bad};
        raise_kerr(&e);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *k_murmur2_hashes(PyObject *self, PyObject *args) { return murmur2_common(args, 0); }
static PyObject *k_murmur2_partitions(PyObject *self, PyObject *args) {
    return murmur2_common(args, 1);
}

/* ------------------------------------------------------------------ group_rows */

/* Stable counting sort of rows by partition. partitions: n int32; out: n int64
 * (written). Returns the list of num_partitions + 2 bucket starts: bucket p
 * holds rows of partition p, bucket num_partitions those >= num_partitions. */
static PyObject *k_group_rows(PyObject *self, PyObject *args) {
    PyObject *pobj, *oobj;
    long long np;
    if (!PyArg_ParseTuple(args, "OLO", &pobj, &np, &oobj)) return NULL;
    if (np < 1 || np > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "num_partitions must be 1..%d, got %lld", 1 << 24, np);
        return NULL;
    }
    Py_buffer pb, ob;
    if (get_buf(pobj, &pb, 0, "partitions") < 0) return NULL;
    if (get_buf(oobj, &ob, 1, "out") < 0) {
        PyBuffer_Release(&pb);
        return NULL;
    }
    Py_ssize_t n = pb.len / 4;
    PyObject *result = NULL;
    int64_t *starts = NULL;
    if (ob.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "out: buffer holds fewer than n int64s");
        goto done;
    }
    starts = PyMem_RawCalloc((size_t)np + 2, sizeof(int64_t));
    if (!starts) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    const int32_t *p = (const int32_t *)pb.buf;
    int64_t *o = (int64_t *)ob.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v = p[i];
        if (v < 0) {
            bad = i;
            break;
        }
        starts[(v >= np ? np : v) + 1]++;
    }
    if (bad < 0) {
        for (long long b = 0; b <= np; b++) starts[b + 1] += starts[b];
        int64_t *next = starts; /* reuse: fill, then shift back */
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t v = p[i];
            o[next[v >= np ? np : v]++] = i;
        }
        for (long long b = np + 1; b > 0; b--) starts[b] = starts[b - 1];
        starts[0] = 0;
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "partitions: row %lld has no partition (%d): assign null-key rows first",
                     (long long)bad, ((const int32_t *)pb.buf)[bad]);
        goto done;
    }
    result = PyList_New(np + 2);
    if (!result) goto done;
    for (long long b = 0; b < np + 2; b++) {
        PyObject *v = PyLong_FromLongLong(starts[b]);
        if (!v) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, b, v);
    }
done:
    PyMem_RawFree(starts);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&ob);
    return result;
}

/* ------------------------------------------------------------------ rows (decoding) */

/* decode_rows(buf, start, end, count, row_type, topic, partition, base_offset,
 *             min_offset, base_ts, stamp_ts, epoch, out) -> None
 *
 * The records of one (uncompressed) RecordBatch v2 region buf[start:end] holding
 * `count` records, appended to the list `out` as `row_type` instances (a tuple
 * subclass of 8 fields):
 *   (topic, partition, base_offset + offset_delta, timestamp, key, value, headers, epoch)
 * skipping those whose offset is below `min_offset`. timestamp is base_ts + the
 * record's delta, or `stamp_ts` for every record when stamp_ts >= 0 (LogAppendTime).
 * headers is a tuple of (str, bytes | None). The records must fill the region
 * exactly; anything malformed raises ValueError naming what.
 */

typedef struct {
    const uint8_t *p, *end;
} rd;

/* zigzag varint of up to 10 bytes; -1 on truncation or overlength */
static inline int rd_vz(rd *r, int64_t *out) {
    uint64_t z = 0;
    int shift = 0;
    while (r->p < r->end) {
        uint8_t b = *r->p++;
        z |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)((z >> 1) ^ (0 - (z & 1)));
            return 0;
        }
        shift += 7;
        if (shift > 63) return -1;
    }
    return -1;
}

/* One record's fields before its headers, as both decoders read them. */
typedef struct {
    rd rec;                /* the record's bytes; rec.p at its first header entry */
    int64_t tsd, od;       /* timestamp and offset deltas */
    int64_t klen, vlen;    /* -1: null */
    const uint8_t *kp, *vp;
    int64_t nh;            /* header entries */
} rec_head;

/* The next record of r into h (r moves past it): NULL, or what is malformed. */
static inline const char *rd_record(rd *r, rec_head *h) {
    int64_t length;
    if (r->p >= r->end) return "batch holds fewer records than its count";
    if (rd_vz(r, &length) < 0) return "truncated record length";
    if (length < 6 || length > r->end - r->p) return "bad record length";
    rd *rec = &h->rec;
    rec->p = r->p + 1; /* past the attributes */
    rec->end = r->p + length;
    r->p += length;
    if (rd_vz(rec, &h->tsd) < 0 || rd_vz(rec, &h->od) < 0) return "truncated record";
    if (rd_vz(rec, &h->klen) < 0 || h->klen < -1 || h->klen > rec->end - rec->p)
        return "bad key length";
    h->kp = rec->p;
    if (h->klen > 0) rec->p += h->klen;
    if (rd_vz(rec, &h->vlen) < 0 || h->vlen < -1 || h->vlen > rec->end - rec->p)
        return "bad value length";
    h->vp = rec->p;
    if (h->vlen > 0) rec->p += h->vlen;
    if (rd_vz(rec, &h->nh) < 0 || h->nh < 0 || h->nh > rec->end - rec->p)
        return "bad header count";
    return NULL;
}

/* The next header entry of rec (rec moves past it): its key and value (vlen -1:
 * null); NULL, or what is malformed. The key's UTF-8 is the caller's to check. */
static inline const char *rd_header(rd *rec, const uint8_t **kp, int64_t *klen,
                                    const uint8_t **vp, int64_t *vlen) {
    if (rd_vz(rec, klen) < 0 || *klen < 0 || *klen > rec->end - rec->p)
        return "bad header key length";
    *kp = rec->p;
    rec->p += *klen;
    if (rd_vz(rec, vlen) < 0 || *vlen < -1 || *vlen > rec->end - rec->p)
        return "bad header value length";
    *vp = rec->p;
    if (*vlen > 0) rec->p += *vlen;
    return NULL;
}

static PyObject *k_decode_rows(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end, count;
    PyTypeObject *row_type;
    PyObject *topic, *partition, *epoch, *out;
    long long base_offset, min_offset, base_ts, stamp_ts;
    if (!PyArg_ParseTuple(args, "y*nnnO!OOLLLLOO!", &view, &start, &end, &count,
                          &PyType_Type, &row_type, &topic, &partition, &base_offset,
                          &min_offset, &base_ts, &stamp_ts, &epoch, &PyList_Type, &out))
        return NULL;
    PyObject *result = NULL;
    PyObject *no_headers = NULL;
    const char *what = NULL;
    if (!PyType_IsSubtype(row_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "row_type must be a tuple subclass");
        goto done;
    }
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "record region outside the buffer");
        goto done;
    }
    no_headers = PyTuple_New(0);
    if (!no_headers) goto done;
    rd r = {(const uint8_t *)view.buf + start, (const uint8_t *)view.buf + end};
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_head h;
        if ((what = rd_record(&r, &h)) != NULL) goto bad;
        rd *rec = &h.rec;
        int64_t nh = h.nh, klen = h.klen, vlen = h.vlen;
        int64_t offset = (int64_t)base_offset + h.od;
        if (offset < min_offset) {
            /* still walk the headers: the record must be well formed to be skipped */
            for (int64_t e = 0; e < nh; e++) {
                const uint8_t *hkp, *hvp;
                int64_t hk, hv;
                if ((what = rd_header(rec, &hkp, &hk, &hvp, &hv)) != NULL) goto bad;
            }
            if (rec->p != rec->end) { what = "record length disagrees with its fields"; goto bad; }
            continue;
        }
        PyObject *headers;
        if (nh == 0) {
            Py_INCREF(no_headers);
            headers = no_headers;
        } else {
            headers = PyTuple_New((Py_ssize_t)nh);
            if (!headers) goto done;
            for (int64_t e = 0; e < nh; e++) {
                const uint8_t *hkp, *hvp;
                int64_t hk, hv;
                if ((what = rd_header(rec, &hkp, &hk, &hvp, &hv)) != NULL) {
                    Py_DECREF(headers); goto bad;
                }
                PyObject *key = PyUnicode_DecodeUTF8((const char *)hkp, (Py_ssize_t)hk, NULL);
                if (!key) {
                    Py_DECREF(headers);
                    PyErr_Clear();
                    what = "header key is not valid UTF-8";
                    goto bad;
                }
                PyObject *val;
                if (hv < 0) {
                    Py_INCREF(Py_None);
                    val = Py_None;
                } else {
                    val = PyBytes_FromStringAndSize((const char *)hvp, (Py_ssize_t)hv);
                    if (!val) { Py_DECREF(key); Py_DECREF(headers); goto done; }
                }
                PyObject *pair = PyTuple_Pack(2, key, val);
                Py_DECREF(key);
                Py_DECREF(val);
                if (!pair) { Py_DECREF(headers); goto done; }
                PyObject_GC_UnTrack(pair); /* str and bytes: no cycle possible */
                PyTuple_SET_ITEM(headers, (Py_ssize_t)e, pair);
            }
            PyObject_GC_UnTrack(headers);
        }
        if (rec->p != rec->end) {
            Py_DECREF(headers);
            what = "record length disagrees with its fields";
            goto bad;
        }
        const uint8_t *kp = h.kp, *vp = h.vp;
        int64_t tsd = h.tsd;
        PyObject *row = row_type->tp_alloc(row_type, 8);
        if (!row) { Py_DECREF(headers); goto done; }
        PyObject *o = PyLong_FromLongLong(offset);
        PyObject *ts = PyLong_FromLongLong(stamp_ts >= 0 ? stamp_ts : base_ts + tsd);
        PyObject *k = klen < 0 ? (Py_INCREF(Py_None), Py_None)
                               : PyBytes_FromStringAndSize((const char *)kp, (Py_ssize_t)klen);
        PyObject *v = vlen < 0 ? (Py_INCREF(Py_None), Py_None)
                               : PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
        Py_INCREF(topic);
        Py_INCREF(partition);
        Py_INCREF(epoch);
        PyTuple_SET_ITEM(row, 0, topic);
        PyTuple_SET_ITEM(row, 1, partition);
        PyTuple_SET_ITEM(row, 2, o);
        PyTuple_SET_ITEM(row, 3, ts);
        PyTuple_SET_ITEM(row, 4, k);
        PyTuple_SET_ITEM(row, 5, v);
        PyTuple_SET_ITEM(row, 6, headers);
        PyTuple_SET_ITEM(row, 7, epoch);
        if (!o || !ts || !k || !v) { Py_DECREF(row); goto done; }
        /* A row holds only str, int, bytes, None and untracked tuples: it can be in no
         * reference cycle, so the cyclic GC need not scan it. Untracking matters: a
         * consumer buffers hundreds of thousands of rows, and every full collection
         * would walk them all (a 3x slowdown measured without it). Not for a row type
         * with an instance dict, where anything could be attached later. */
        if (row_type->tp_dictoffset == 0) PyObject_GC_UnTrack(row);
        int rc = PyList_Append(out, row);
        Py_DECREF(row);
        if (rc < 0) goto done;
    }
    if (r.p != r.end) {
        what = "unexpected bytes after the last record";
        goto bad;
    }
    Py_INCREF(Py_None);
    result = Py_None;
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, what);
done:
    Py_XDECREF(no_headers);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ columns (decoding) */

/* decode_columns(buf, start, end, count, base_offset, min_offset, base_ts, stamp_ts,
 *                epoch, out, lens) -> None
 *
 * decode_rows' twin for the columnar form: the same records, the same skips and the
 * same errors, appended to flat buffers instead of row tuples (no Python object per
 * record). `out` is a list of DC_COUNT bytearrays, in the order of the enum below;
 * integers are native int64 (the epochs int32), binary columns are Arrow's layout
 * (offsets with a leading 0, data, a validity bitmap LSB first, 1 = not null):
 *
 *   offsets, timestamps, leader_epochs          one entry per row
 *   key_offsets, key_data, key_validity         the keys
 *   value_offsets, value_data, value_validity   the values
 *   header_offsets                              per row, its first header entry
 *   header_key_offsets, header_key_data         the header entries' keys (UTF-8)
 *   header_value_offsets, header_value_data, header_value_validity
 *
 * `lens` (a writable buffer of DC_COUNT native int64) holds each buffer's length in
 * use: a bytearray may be longer (room reserved for the next batch, so a chunk of many
 * batches grows each buffer O(log n) times instead of reallocating it per batch); the
 * caller cuts each to its length at the end. The rows held before the call are
 * lens[offsets] / 8; the offset buffers already hold their leading 0 and the bitmaps
 * (rows + 7) / 8 bytes. On return `lens` is the exact length of every buffer for the
 * rows now held (so both kernels give identical bytes once cut).
 */

enum {
    DC_OFFSETS, DC_TIMESTAMPS, DC_EPOCHS,
    DC_KEY_OFFSETS, DC_KEY_DATA, DC_KEY_VALID,
    DC_VALUE_OFFSETS, DC_VALUE_DATA, DC_VALUE_VALID,
    DC_HEADER_OFFSETS, DC_HKEY_OFFSETS, DC_HKEY_DATA,
    DC_HVALUE_OFFSETS, DC_HVALUE_DATA, DC_HVALUE_VALID,
    DC_COUNT
};

typedef struct {
    PyObject *ba;
    Py_ssize_t len; /* bytes in use; the bytearray may be longer while decoding */
} growbuf;

static int grow_reserve(growbuf *g, Py_ssize_t extra) {
    Py_ssize_t need = g->len + extra;
    Py_ssize_t size = PyByteArray_GET_SIZE(g->ba);
    if (need <= size) return 0;
    return PyByteArray_Resize(g->ba, size * 2 > need ? size * 2 : need);
}

static inline uint8_t *grow_at(growbuf *g) {
    return (uint8_t *)PyByteArray_AS_STRING(g->ba) + g->len;
}

/* Callers reserved the room. */
static inline void grow_i64(growbuf *g, int64_t v) {
    memcpy(grow_at(g), &v, 8);
    g->len += 8;
}

static inline void grow_bytes(growbuf *g, const uint8_t *p, int64_t n) {
    if (n > 0) memcpy(grow_at(g), p, (size_t)n);
    g->len += (Py_ssize_t)n;
}

static inline void set_bit(growbuf *g, Py_ssize_t row) {
    ((uint8_t *)PyByteArray_AS_STRING(g->ba))[row >> 3] |= (uint8_t)(1u << (row & 7));
}

/* Grow a bitmap (zero-filled) to hold `rows` bits. */
static int bitmap_reserve(growbuf *g, Py_ssize_t rows) {
    Py_ssize_t want = (rows + 7) / 8;
    if (want <= g->len) return 0;
    if (grow_reserve(g, want - g->len) < 0) return -1;
    memset(grow_at(g), 0, (size_t)(want - g->len));
    g->len = want;
    return 0;
}

static PyObject *k_decode_columns(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end, count;
    long long base_offset, min_offset, base_ts, stamp_ts;
    int epoch;
    PyObject *out;
    Py_buffer lview;
    if (!PyArg_ParseTuple(args, "y*nnnLLLLiO!w*", &view, &start, &end, &count, &base_offset,
                          &min_offset, &base_ts, &stamp_ts, &epoch, &PyList_Type, &out, &lview))
        return NULL;
    PyObject *result = NULL;
    const char *what = NULL;
    growbuf g[DC_COUNT];
    int64_t *lens = (int64_t *)lview.buf;
    if (lview.len != DC_COUNT * 8) {
        PyErr_Format(PyExc_ValueError, "lens must hold %d int64", DC_COUNT);
        goto done;
    }
    if (PyList_GET_SIZE(out) != DC_COUNT) {
        PyErr_Format(PyExc_ValueError, "out must hold %d bytearrays", DC_COUNT);
        goto done;
    }
    for (int i = 0; i < DC_COUNT; i++) {
        g[i].ba = PyList_GET_ITEM(out, i);
        if (!PyByteArray_Check(g[i].ba)) {
            PyErr_SetString(PyExc_TypeError, "out must hold bytearrays");
            goto done;
        }
        int64_t len;
        memcpy(&len, lens + i, 8);
        if (len < 0 || len > PyByteArray_GET_SIZE(g[i].ba)) {
            PyErr_SetString(PyExc_ValueError, "lens: a length outside its buffer");
            goto done;
        }
        g[i].len = (Py_ssize_t)len;
    }
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "record region outside the buffer");
        goto done;
    }
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "negative record count");
        goto done;
    }
    Py_ssize_t n = g[DC_OFFSETS].len / 8; /* rows held */
    Py_ssize_t region = end - start;
    /* a record takes at least 7 bytes (its length and 6): a hostile count cannot make
     * the reservation larger than the region implies */
    Py_ssize_t rows = count < region / 7 + 1 ? count : region / 7 + 1;
    if (grow_reserve(&g[DC_OFFSETS], rows * 8) < 0 || grow_reserve(&g[DC_TIMESTAMPS], rows * 8) < 0
        || grow_reserve(&g[DC_EPOCHS], rows * 4) < 0
        || grow_reserve(&g[DC_KEY_OFFSETS], rows * 8) < 0
        || grow_reserve(&g[DC_VALUE_OFFSETS], rows * 8) < 0
        || grow_reserve(&g[DC_HEADER_OFFSETS], rows * 8) < 0
        || grow_reserve(&g[DC_KEY_DATA], region) < 0 || grow_reserve(&g[DC_VALUE_DATA], region) < 0
        || bitmap_reserve(&g[DC_KEY_VALID], n + rows) < 0
        || bitmap_reserve(&g[DC_VALUE_VALID], n + rows) < 0)
        goto finish;
    int64_t entries = g[DC_HKEY_OFFSETS].len / 8 - 1; /* header entries held */
    rd r = {(const uint8_t *)view.buf + start, (const uint8_t *)view.buf + end};
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_head h;
        if ((what = rd_record(&r, &h)) != NULL) goto bad;
        rd *rec = &h.rec;
        int64_t nh = h.nh, klen = h.klen, vlen = h.vlen, od = h.od, tsd = h.tsd;
        const uint8_t *kp = h.kp, *vp = h.vp;
        int64_t offset = (int64_t)base_offset + od;
        int keep = offset >= min_offset;
        if (keep && nh > 0) {
            /* a header entry takes at least two bytes: nh bounds the entries */
            Py_ssize_t left = rec->end - rec->p;
            if (grow_reserve(&g[DC_HKEY_OFFSETS], (Py_ssize_t)nh * 8) < 0
                || grow_reserve(&g[DC_HVALUE_OFFSETS], (Py_ssize_t)nh * 8) < 0
                || grow_reserve(&g[DC_HKEY_DATA], left) < 0
                || grow_reserve(&g[DC_HVALUE_DATA], left) < 0
                || bitmap_reserve(&g[DC_HVALUE_VALID], (Py_ssize_t)(entries + nh)) < 0)
                goto finish;
        }
        for (int64_t e = 0; e < nh; e++) {
            const uint8_t *hkp, *hvp;
            int64_t hk, hv;
            if ((what = rd_header(rec, &hkp, &hk, &hvp, &hv)) != NULL) goto bad;
            if (keep) {
                PyObject *check = PyUnicode_DecodeUTF8((const char *)hkp, (Py_ssize_t)hk, NULL);
                if (!check) {
                    PyErr_Clear();
                    what = "header key is not valid UTF-8";
                    goto bad;
                }
                Py_DECREF(check);

                grow_bytes(&g[DC_HKEY_DATA], hkp, hk);
                grow_i64(&g[DC_HKEY_OFFSETS], (int64_t)g[DC_HKEY_DATA].len);
                if (hv >= 0) {
                    grow_bytes(&g[DC_HVALUE_DATA], hvp, hv);
                    set_bit(&g[DC_HVALUE_VALID], (Py_ssize_t)entries);
                }
                grow_i64(&g[DC_HVALUE_OFFSETS], (int64_t)g[DC_HVALUE_DATA].len);
                entries++;
            }
        }
        if (rec->p != rec->end) { what = "record length disagrees with its fields"; goto bad; }
        if (!keep) continue;
        grow_i64(&g[DC_OFFSETS], offset);
        grow_i64(&g[DC_TIMESTAMPS], stamp_ts >= 0 ? (int64_t)stamp_ts : (int64_t)base_ts + tsd);
        int32_t e = (int32_t)epoch;
        memcpy(grow_at(&g[DC_EPOCHS]), &e, 4);
        g[DC_EPOCHS].len += 4;
        if (klen >= 0) {
            grow_bytes(&g[DC_KEY_DATA], kp, klen);
            set_bit(&g[DC_KEY_VALID], n);
        }
        grow_i64(&g[DC_KEY_OFFSETS], (int64_t)g[DC_KEY_DATA].len);
        if (vlen >= 0) {
            grow_bytes(&g[DC_VALUE_DATA], vp, vlen);
            set_bit(&g[DC_VALUE_VALID], n);
        }
        grow_i64(&g[DC_VALUE_OFFSETS], (int64_t)g[DC_VALUE_DATA].len);
        grow_i64(&g[DC_HEADER_OFFSETS], entries);
        n++;
    }
    if (r.p != r.end) {
        what = "unexpected bytes after the last record";
        goto bad;
    }
    /* every buffer to its exact length for the rows held */
    g[DC_KEY_VALID].len = (n + 7) / 8;
    g[DC_VALUE_VALID].len = (n + 7) / 8;
    g[DC_HVALUE_VALID].len = (Py_ssize_t)((entries + 7) / 8);
    result = Py_None;
    goto finish;
bad:
    PyErr_SetString(PyExc_ValueError, what);
finish:
    for (int i = 0; i < DC_COUNT; i++) {
        int64_t len = (int64_t)g[i].len;
        memcpy(lens + i, &len, 8);
    }
    Py_XINCREF(result);
done:
    PyBuffer_Release(&lview);
    PyBuffer_Release(&view);
    return result;
}

/* binary_list(binary) -> list: every cell of a binary column spec (layout at the top)
 * as bytes, or None where its validity bit is 0. */
static PyObject *k_binary_list(PyObject *self, PyObject *args) {
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "O", &spec)) return NULL;
    bincol c;
    if (parse_bincol(spec, &c, "binary") < 0) {
        bincol_release(&c);
        return NULL;
    }
    PyObject *list = PyList_New(c.n);
    if (!list) goto fail;
    for (Py_ssize_t i = 0; i < c.n; i++) {
        const uint8_t *p;
        int64_t len;
        PyObject *item;
        if (cell(&c, i, &p, &len) < 0) {
            PyErr_Format(PyExc_ValueError,
                         "binary: row %zd: offsets are not ascending or run past the data buffer",
                         i);
            goto fail;
        }
        if (len < 0) {
            Py_INCREF(Py_None);
            item = Py_None;
        } else {
            item = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)len);
            if (!item) goto fail;
        }
        PyList_SET_ITEM(list, i, item);
    }
    bincol_release(&c);
    return list;
fail:
    Py_XDECREF(list);
    bincol_release(&c);
    return NULL;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"encode_records", k_encode_records, METH_VARARGS,
     "encode_records(spec, rows, start, stop) -> (records, base_ts, max_ts)"},
    {"size_bounds", k_size_bounds, METH_VARARGS, "size_bounds(spec, out) -> None"},
    {"cut_batches", k_cut_batches, METH_VARARGS,
     "cut_batches(spec, rows, start, stop, max_bytes, max_records) -> [(stop, nbytes)]"},
    {"pack_binary", k_pack_binary, METH_VARARGS,
     "pack_binary(seq, what) -> (offsets, data, validity, null_count)"},
    {"find_outside", k_find_outside, METH_VARARGS, "find_outside(buf, wide, lo, hi) -> int"},
    {"pack_ints", k_pack_ints, METH_VARARGS, "pack_ints(seq, wide) -> bytes | None"},
    {"murmur2_hashes", k_murmur2_hashes, METH_VARARGS, "murmur2_hashes(keys, out) -> None"},
    {"murmur2_partitions", k_murmur2_partitions, METH_VARARGS,
     "murmur2_partitions(keys, num_partitions, out) -> None"},
    {"group_rows", k_group_rows, METH_VARARGS,
     "group_rows(partitions, num_partitions, out) -> starts"},
    {"decode_columns", k_decode_columns, METH_VARARGS,
     "decode_columns(buf, start, end, count, base_offset, min_offset, base_ts, stamp_ts, "
     "epoch, out, lens) -> None"},
    {"binary_list", k_binary_list, METH_VARARGS, "binary_list(binary) -> list"},
    {"decode_rows", k_decode_rows, METH_VARARGS,
     "decode_rows(buf, start, end, count, row_type, topic, partition, base_offset, "
     "min_offset, base_ts, stamp_ts, epoch, out) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeline.protocol._kernel",
    "Columnar RecordBatch v2 kernel (C); see _kernel_py.py for its pure-Python twin.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&module); }
