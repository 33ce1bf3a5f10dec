/* pipeline.producer._speedups._send: send()'s row branch in C.
 *
 * `await producer.send(topic, value, ...)` while a columnar burst of that topic is open
 * (burst.py) appends a row to the burst's lists: the row branch of Intake.send
 * (intake.py). In Python that is a coroutine and some 60 bytecodes per message, most
 * of the CPU of a send() + flush() loop. Here:
 *
 *   Sender    what `producer.send` is when this module is built. A call with exactly
 *             two positional arguments and any of send()'s keywords (key=, headers=,
 *             partition=, timestamp=, metadata=, on_delivery=) returns a SendCall; a
 *             key that is not None, bytes or str, an on_delivery that is not None or a
 *             callable, or any other call returns Intake.send's coroutine (the Python
 *             path), as before.
 *   SendCall  an awaitable standing for that coroutine, with its laziness: nothing
 *             happens until it is awaited (never awaited: nothing is sent, and a
 *             RuntimeWarning says so, as for a coroutine). Its first step runs the row
 *             branch when every condition of Intake.send for it holds, and returns the
 *             RowDelivery at once; otherwise it starts Intake.send's coroutine with the
 *             same arguments and forwards every send / throw / close to it.
 *
 * The branch reads and writes the same fields as Intake.send, at the offsets of their
 * __slots__: the fields of Intake, Ledger and RowBurst that fields.py declares
 * (SEND_INTAKE, SEND_LEDGER, SEND_BURST), passed to setup() in C's order. The two
 * paths share all state and may interleave call by call. Conditions, in Intake.send's
 * words: the countdown to the next schedule point does not reach 0, the producer is not
 * closing, the value is bytes or None and the key bytes or None (a str is encoded first),
 * the topic a str equal to the open burst's, headers in their plain form (None, or a
 * list or tuple of (str, bytes | None) tuples, or a dict of str to bytes | None; exact
 * types, keys encodable as UTF-8), a partition None or an int in 0..2**31-1, a timestamp
 * None or an int in 0..2**63-1, the row within max_message_bytes (its size bound is
 * records.batch_size_for_record's) and Ledger.admit_row's room. The CreateTime of a row
 * without a timestamp is the wall clock's millisecond (time.time, or intake.py's `_time`
 * when a test patches it) or the injected clock's (config.timestamp_ms), as in Python.
 * A row with metadata gets burst.new_metadata_row's delivery (it holds the metadata).
 * _intake/intake.py's Intake.send is the twin (PIPELINE_PURE_PYTHON=1, or no compiler);
 * tests/producer/test_send_c.py runs both on the same calls and compares.
 *
 *   Sender.pump  SyncProducer's pump (_sync.py): its queued plain calls through the row
 *             branch, without an awaitable each (SyncDelivery's fields: fields.py's
 *             SYNC_HANDLE); the twin is the pump's awaited send().
 *   SyncQueue SyncProducer.send's plain call: its handle queued (the twin:
 *             SyncProducer.send, which takes every other call).
 *   untracked the twin's handles of plain calls out of the cyclic GC too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_shared.h" /* SLOT, member_offset, stop_iteration, throw_unstarted */

/* ------------------------------------------------------------------ state (setup) */

static PyTypeObject *rows_type = NULL; /* burst.RowBurst */
static PyObject *intake_globals = NULL; /* intake.py's globals: `_time` is read per row */
static PyObject *rows_globals = NULL;   /* burst.py's: `new_row` is read per row */
static PyObject *wall_time = NULL;      /* time.time: then the clock is read directly */
static Py_ssize_t size_base = 0;        /* normalize.SIZE_BASE */
/* Intake */
static Py_ssize_t off_until_yield, off_closing, off_rows, off_wall_clock, off_max_bytes,
    off_ms, off_ms_ends, off_ledger, off_timestamp_ms;
/* Ledger */
static Py_ssize_t off_buffered, off_buffer_memory, off_next_id;
/* RowBurst */
static Py_ssize_t off_s_topic, off_s_values, off_s_timestamps, off_s_on_delivery, off_s_size,
    off_s_keys, off_s_extras, off_s_hkeys, off_s_hvalues, off_s_hends, off_s_partitions,
    off_s_metadata;
static PyObject *str_time, *str_new_row, *str_new_metadata_row;
/* send()'s keywords, in the order of the Python call's kwnames (kw_python) */
enum { KW_KEY, KW_HEADERS, KW_PARTITION, KW_TIMESTAMP, KW_METADATA, KW_ON_DELIVERY, KW_N };
static PyObject *str_kw[KW_N];
static PyObject *kw_python; /* ("key", ..., "on_delivery"): the kwnames of the Python call */

/* time.time(), the same double (3.11-3.12: _PyTime_GetSystemClock, as time_time()). */
static int wall_clock_now(double *now) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    if (PyTime_Time(&t) < 0) return -1;
    *now = PyTime_AsSecondsDouble(t);
#else
    *now = _PyTime_AsSecondsDouble(_PyTime_GetSystemClock());
#endif
    return 0;
}

/* An int slot as a long long, or -1 with *ok = 0 (unset, not an exact int, or too big). */
static long long int_slot(PyObject *obj, Py_ssize_t off, int *ok) {
    PyObject *v = SLOT(obj, off);
    if (v == NULL || !PyLong_CheckExact(v)) {
        *ok = 0;
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *ok = 0;
        return -1;
    }
    return x;
}

/* Replace an object slot's value (stealing `v`). */
static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = v;
    Py_XDECREF(old);
}

/* ------------------------------------------------------------------ the row branch */

/* Bytes of the zigzag varint length prefix of n >= 0 (normalize.prefix_size). */
static inline long long prefix_size(long long n) {
    unsigned long long z = (unsigned long long)n << 1;
    long long s = 1;
    while (z > 0x7F) {
        z >>= 7;
        s++;
    }
    return s;
}

/* An exact int in 0..top as a long long, or -1 (anything else, also a bool). */
static long long plain_int(PyObject *v, long long top) {
    if (!PyLong_CheckExact(v)) return -1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return x < 0 || x > top ? -1 : x;
}

/* A row's headers in their plain form: up to `cap` (key, value) pairs put in `pairs`
 * (borrowed from `headers`, which the caller holds), their count in *count and the
 * bytes they add to the row's size bound (batch_size_for_record's; the header count's
 * varint counted beyond the one byte of no headers) in *size. 1: plain; 0: not plain
 * (anything else: the Python path normalizes it, or raises its error); -1 with
 * *count > cap: more pairs than `cap`, ask again with room for *count. */
static int plain_headers(PyObject *headers, PyObject **pairs, Py_ssize_t cap, Py_ssize_t *count,
                         long long *size) {
    Py_ssize_t h = 0;
    long long total = 0;
    if (headers == Py_None) {
        *count = 0;
        *size = 0;
        return 1;
    }
    if (PyDict_CheckExact(headers)) {
        if (PyDict_GET_SIZE(headers) > cap) {
            *count = PyDict_GET_SIZE(headers);
            return -1;
        }
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(headers, &pos, &k, &v)) {
            pairs[2 * h] = k;
            pairs[2 * h + 1] = v;
            h++;
        }
    } else if (PyList_CheckExact(headers) || PyTuple_CheckExact(headers)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(headers);
        if (n > cap) {
            *count = n;
            return -1;
        }
        for (; h < n; h++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(headers, h);
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) return 0;
            pairs[2 * h] = PyTuple_GET_ITEM(pair, 0);
            pairs[2 * h + 1] = PyTuple_GET_ITEM(pair, 1);
        }
    } else {
        return 0;
    }
    for (Py_ssize_t j = 0; j < h; j++) {
        PyObject *k = pairs[2 * j], *v = pairs[2 * j + 1];
        if (!PyUnicode_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v))) return 0;
        Py_ssize_t klen;
        if (PyUnicode_AsUTF8AndSize(k, &klen) == NULL) { /* not UTF-8: Python raises */
            PyErr_Clear();
            return 0;
        }
        total += prefix_size(klen) + klen;
        if (v == Py_None) {
            total += 1;
        } else {
            Py_ssize_t vlen = PyBytes_GET_SIZE(v);
            total += prefix_size(vlen) + vlen;
        }
    }
    *count = h;
    *size = total + (h ? prefix_size(h) - 1 : 0);
    return 1;
}

/* A column list of `before` times `fill`, then `last`; untracked by the cyclic GC
 * when `atomic` (atomic_list(): only bytes, str, ints and None go in). */
static PyObject *filled_then(Py_ssize_t before, PyObject *fill, PyObject *last, int atomic) {
    PyObject *list = PyList_New(before + 1);
    if (list == NULL) return NULL;
    for (Py_ssize_t j = 0; j < before; j++) {
        Py_INCREF(fill);
        PyList_SET_ITEM(list, j, fill);
    }
    Py_INCREF(last);
    PyList_SET_ITEM(list, before, last);
    if (atomic) PyObject_GC_UnTrack(list);
    return list;
}

/* RowBurst.add_extras for the row about to be appended (`before` rows precede it):
 * `pairs` its h headers, `partition` its pinned one (-1: none), `md` its metadata. */
static int add_extras(PyObject *rows, Py_ssize_t before, PyObject **pairs, Py_ssize_t h,
                      long long partition, PyObject *md) {
    PyObject *ends = SLOT(rows, off_s_hends);
    if (ends == NULL) return -1;
    if (h) {
        if (ends == Py_None) { /* the burst's first headers: the rows before had none */
            PyObject *zero = PyLong_FromLong(0);
            PyObject *k = PyList_New(0), *v = PyList_New(0);
            PyObject *e = zero == NULL ? NULL : filled_then(before, zero, zero, 1);
            Py_XDECREF(zero);
            if (k == NULL || v == NULL || e == NULL) {
                Py_XDECREF(k);
                Py_XDECREF(v);
                Py_XDECREF(e);
                return -1;
            }
            PyObject_GC_UnTrack(k);
            PyObject_GC_UnTrack(v);
            set_slot(rows, off_s_hkeys, k);
            set_slot(rows, off_s_hvalues, v);
            set_slot(rows, off_s_hends, e);
            Py_INCREF(Py_True);
            set_slot(rows, off_s_extras, Py_True);
            ends = e;
        }
        PyObject *keys = SLOT(rows, off_s_hkeys), *values = SLOT(rows, off_s_hvalues);
        if (keys == NULL || !PyList_CheckExact(keys) || values == NULL ||
            !PyList_CheckExact(values) || !PyList_CheckExact(ends)) {
            PyErr_SetString(PyExc_SystemError, "RowBurst's header columns are not lists");
            return -1;
        }
        for (Py_ssize_t j = 0; j < h; j++)
            if (PyList_Append(keys, pairs[2 * j]) < 0 || PyList_Append(values, pairs[2 * j + 1]) < 0)
                return -1;
        PyObject *end = PyLong_FromSsize_t(PyList_GET_SIZE(keys));
        if (end == NULL) return -1;
        int r = PyList_Append(ends, end);
        Py_DECREF(end);
        if (r < 0) return -1;
    } else if (ends != Py_None) {
        if (!PyList_CheckExact(ends) || PyList_GET_SIZE(ends) == 0) {
            PyErr_SetString(PyExc_SystemError, "RowBurst.header_ends is not a list from 0");
            return -1;
        }
        if (PyList_Append(ends, PyList_GET_ITEM(ends, PyList_GET_SIZE(ends) - 1)) < 0) return -1;
    }
    PyObject *parts = SLOT(rows, off_s_partitions);
    if (parts == NULL) return -1;
    if (parts != Py_None) {
        PyObject *p = PyLong_FromLongLong(partition);
        if (p == NULL) return -1;
        int r = PyList_CheckExact(parts) ? PyList_Append(parts, p) : -1;
        Py_DECREF(p);
        if (r < 0) return -1;
    } else if (partition >= 0) {
        PyObject *none = PyLong_FromLong(-1), *p = PyLong_FromLongLong(partition);
        PyObject *list = none == NULL || p == NULL ? NULL : filled_then(before, none, p, 1);
        Py_XDECREF(none);
        Py_XDECREF(p);
        if (list == NULL) return -1;
        set_slot(rows, off_s_partitions, list);
        Py_INCREF(Py_True);
        set_slot(rows, off_s_extras, Py_True);
    }
    PyObject *kept = SLOT(rows, off_s_metadata);
    if (kept == NULL) return -1;
    if (kept != Py_None) {
        if (!PyList_CheckExact(kept) || PyList_Append(kept, md) < 0) return -1;
    } else if (md != Py_None) { /* (any object: a list the GC tracks) */
        PyObject *list = filled_then(before, Py_None, md, 0);
        if (list == NULL) return -1;
        set_slot(rows, off_s_metadata, list);
        Py_INCREF(Py_True);
        set_slot(rows, off_s_extras, Py_True);
    }
    return 0;
}

#define MAX_PAIRS 16 /* headers checked on the stack; more: on the heap */

/* Intake.send's row branch for send(topic, value, key=, headers=, partition=,
 * timestamp=, metadata=, on_delivery=) on `intake`. Returns the new RowDelivery; NULL
 * without an error: a condition does not hold (nothing was changed, the Python path
 * takes the call); NULL with an error: the error of the Python branch at the same point
 * (a MemoryError, or a patched `_time` that raised). `key`: None or bytes, `fn`: None or
 * a callable (the Sender checked); `value` bytes or anything (checked here). */
static PyObject *row_branch(PyObject *intake, PyObject *topic, PyObject *value, PyObject *key,
                            PyObject *fn, PyObject *headers, PyObject *partition_obj,
                            PyObject *timestamp, PyObject *md) {
    int ok = 1;
    long long until = int_slot(intake, off_until_yield, &ok) - 1;
    if (!ok || until <= 0) return NULL; /* a schedule point is due: Python's checkpoint */
    if (SLOT(intake, off_closing) != Py_False) return NULL;
    /* (A topic equal to the burst's is not empty: the burst's first send checked it.) */
    if ((value != Py_None && !PyBytes_CheckExact(value)) || !PyUnicode_CheckExact(topic))
        return NULL;
    PyObject *rows = SLOT(intake, off_rows);
    if (rows == NULL || Py_TYPE(rows) != rows_type) return NULL; /* None: no open burst */
    PyObject *rows_topic = SLOT(rows, off_s_topic);
    if (rows_topic == NULL || !PyUnicode_CheckExact(rows_topic)) return NULL;
    if (rows_topic != topic && PyUnicode_Compare(topic, rows_topic) != 0) return NULL;
    int wall = SLOT(intake, off_wall_clock) == Py_True; /* else config.timestamp_ms's */
    PyObject *injected = SLOT(intake, off_timestamp_ms);
    if (injected == NULL) return NULL;
    long long partition = -1;
    if (partition_obj != Py_None && (partition = plain_int(partition_obj, INT32_MAX)) < 0)
        return NULL;
    if (timestamp != Py_None && plain_int(timestamp, INT64_MAX) < 0) return NULL;
    PyObject *stack[2 * MAX_PAIRS], **pairs = stack;
    Py_ssize_t h = 0;
    long long hsize = 0;
    int plain = plain_headers(headers, pairs, MAX_PAIRS, &h, &hsize);
    if (plain < 0) { /* many headers: room for them on the heap */
        pairs = PyMem_Malloc(sizeof(PyObject *) * 2 * (size_t)h);
        if (pairs == NULL) return PyErr_NoMemory();
        plain = plain_headers(headers, pairs, h, &h, &hsize);
    }
    PyObject *delivery = NULL, *stamp = NULL, *new_row = NULL;
    if (plain <= 0) goto out; /* (-1 again: the dict grew meanwhile; cannot, but Python) */
    Py_ssize_t n = value == Py_None ? -1 : PyBytes_GET_SIZE(value); /* -1: a null value */
    Py_ssize_t k = key == Py_None ? -1 : PyBytes_GET_SIZE(key); /* -1: no key */
    long long size = size_base + hsize + (k < 0 ? 1 : prefix_size(k) + k) +
                     (n < 0 ? 1 : prefix_size(n) + n);
    long long max_bytes = int_slot(intake, off_max_bytes, &ok);
    if (!ok || size > max_bytes) goto out;
    PyObject *ledger = SLOT(intake, off_ledger);
    if (ledger == NULL) goto out;
    long long used = int_slot(ledger, off_buffered, &ok);
    long long buffer_memory = int_slot(ledger, off_buffer_memory, &ok);
    long long next_id = int_slot(ledger, off_next_id, &ok);
    long long rows_size = int_slot(rows, off_s_size, &ok);
    if (!ok || (used + size > buffer_memory && used)) goto out; /* admit_row: no room */
    PyObject *values = SLOT(rows, off_s_values), *stamps = SLOT(rows, off_s_timestamps);
    PyObject *fns = SLOT(rows, off_s_on_delivery), *keys = SLOT(rows, off_s_keys);
    PyObject *extras = SLOT(rows, off_s_extras);
    if (values == NULL || !PyList_CheckExact(values) || stamps == NULL ||
        !PyList_CheckExact(stamps) || fns == NULL || (fns != Py_None && !PyList_CheckExact(fns)) ||
        keys == NULL || (keys != Py_None && !PyList_CheckExact(keys)) ||
        (extras != Py_True && extras != Py_False))
        goto out;
    new_row = PyDict_GetItemWithError(rows_globals, md == Py_None ? str_new_row
                                                                  : str_new_metadata_row);
    PyObject *clock = PyDict_GetItemWithError(intake_globals, str_time); /* borrowed */
    if (new_row == NULL || clock == NULL) {
        PyErr_Clear();
        new_row = NULL;
        goto out;
    }

    /* Every condition holds: the branch itself, in Intake.send's order. The objects it
     * works on are held for its length (a patched clock or the Python new_row twin runs
     * code, which could replace a slot's object), and the millisecond is read after the
     * clock (Intake's _ms_ends is always a float, _ms an int). */
    PyObject *u = PyLong_FromLongLong(until), *a = PyLong_FromLongLong(used + size),
             *b = PyLong_FromLongLong(next_id + 1);
    if (u == NULL || a == NULL || b == NULL) {
        Py_XDECREF(u);
        Py_XDECREF(a);
        Py_XDECREF(b);
        new_row = NULL;
        goto out;
    }
    PyObject *held[10] = {rows, values, stamps, fns, ledger, new_row, wall ? clock : injected,
                          keys, headers, md};
    for (int j = 0; j < 10; j++) Py_INCREF(held[j]);
    set_slot(intake, off_until_yield, u);
    set_slot(ledger, off_buffered, a); /* Ledger.admit_row */
    set_slot(ledger, off_next_id, b);
    Py_ssize_t before = PyList_GET_SIZE(values);
    PyObject *row = PyLong_FromSsize_t(before);
    if (row == NULL) goto fail;
    PyObject *args[3] = {rows, row, md};
    delivery = PyObject_Vectorcall(new_row, args, md == Py_None ? 2 : 3, NULL);
    Py_DECREF(row);
    if (delivery == NULL) goto fail;
    if (fns != Py_None) { /* each row's own callback (or None) */
        if (PyList_Append(fns, fn) < 0) goto fail;
    } else if (fn != Py_None) { /* the burst's first callback */
        PyObject *list = filled_then(before, Py_None, fn, 0);
        if (list == NULL) goto fail;
        set_slot(rows, off_s_on_delivery, list);
    }
    if (keys != Py_None) { /* each row's key (or None) */
        if (PyList_Append(keys, key) < 0) goto fail;
    } else if (key != Py_None) { /* the burst's first key: RowBurst.first_key */
        PyObject *list = filled_then(before, Py_None, key, 1); /* bytes and None only */
        if (list == NULL) goto fail;
        set_slot(rows, off_s_keys, list);
    }
    if ((extras == Py_True || h || partition >= 0 || md != Py_None) &&
        add_extras(rows, before, pairs, h, partition, md) < 0)
        goto fail;
    if (PyList_Append(values, value) < 0) goto fail;
    if (timestamp != Py_None) { /* the row's own */
        stamp = timestamp;
        Py_INCREF(stamp);
    } else if (!wall) { /* an injected clock (config.timestamp_ms, tests) */
        stamp = PyObject_CallNoArgs(injected);
        if (stamp == NULL) goto fail;
    } else {
        double now;
        if (clock == wall_time) {
            if (wall_clock_now(&now) < 0) goto fail;
        } else { /* a patched time.time (tests) */
            PyObject *t = PyObject_CallNoArgs(clock);
            if (t == NULL) goto fail;
            now = PyFloat_AsDouble(t);
            Py_DECREF(t);
            if (now == -1.0 && PyErr_Occurred()) goto fail;
        }
        PyObject *ends_now = SLOT(intake, off_ms_ends), *ms_now = SLOT(intake, off_ms);
        if (ends_now != NULL && PyFloat_CheckExact(ends_now) && ms_now != NULL &&
            now < PyFloat_AS_DOUBLE(ends_now)) { /* the same millisecond: share the int */
            stamp = ms_now;
            Py_INCREF(stamp);
        } else {
            long long ms = (long long)(now * 1000); /* int(now * 1000) */
            stamp = PyLong_FromLongLong(ms);
            PyObject *ends = PyFloat_FromDouble((double)(ms + 1) / 1000); /* (ms + 1) / 1000 */
            if (stamp == NULL || ends == NULL) {
                Py_XDECREF(ends);
                goto fail;
            }
            Py_INCREF(stamp);
            set_slot(intake, off_ms, stamp);
            set_slot(intake, off_ms_ends, ends);
        }
    }
    if (PyList_Append(stamps, stamp) < 0) goto fail;
    PyObject *grown = PyLong_FromLongLong(rows_size + size);
    if (grown == NULL) goto fail;
    set_slot(rows, off_s_size, grown);
    goto done;
fail:
    Py_CLEAR(delivery);
done:
    Py_XDECREF(stamp);
    for (int j = 0; j < 10; j++) Py_DECREF(held[j]);
out:
    if (pairs != stack) PyMem_Free(pairs);
    return delivery;
}

/* ------------------------------------------------------------------ SendCall */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *intake; /* the Intake */
    PyObject *slow;   /* intake.send: the Python path (returns its coroutine) */
} SenderObject;

typedef struct {
    PyObject_HEAD
    SenderObject *sender;     /* until the first step (then NULL), with */
    PyObject *topic, *value;  /* the call's arguments */
    PyObject *kw[KW_N];       /* its keywords, in kw_python's order (None: not given) */
    PyObject *coro;           /* the Python path's coroutine, once started */
} SendCallObject;


static void call_clear(SendCallObject *self) {
    Py_CLEAR(self->sender);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->value);
    for (int j = 0; j < KW_N; j++) Py_CLEAR(self->kw[j]);
    Py_CLEAR(self->coro);
}

/* A SendCall dropped before its first step: what CPython says of such a coroutine.
 * (When the warning is an error, the unraisable hook gets intake.send, alive, not
 * this object: a hook that keeps its object would keep one being freed.) */
static void warn_unawaited(SendCallObject *self) {
    if (self->sender != NULL &&
        PyErr_WarnEx(PyExc_RuntimeWarning,
                     "send() was never awaited: its message was not sent", 1) < 0)
        PyErr_WriteUnraisable(self->sender->slow);
}

static void call_dealloc(SendCallObject *self) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    warn_unawaited(self);
    call_clear(self);
    PyErr_Restore(et, ev, tb);
    PyObject_Free(self);
}

static PySendResult call_am_send(SendCallObject *self, PyObject *arg, PyObject **out) {
    if (self->coro == NULL) {
        if (self->sender == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited send()");
            return PYGEN_ERROR;
        }
        if (arg != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started coroutine");
            return PYGEN_ERROR;
        }
        /* A str value or key is sent as UTF-8, as Intake.send encodes it (first). An
         * encoding error leaves the call to Python, which raises it. */
        PyObject *value = self->value, *key = self->kw[KW_KEY], *delivery = NULL;
        value = PyUnicode_CheckExact(value) ? PyUnicode_AsUTF8String(value) : Py_NewRef(value);
        key = value == NULL ? NULL
            : PyUnicode_CheckExact(key) ? PyUnicode_AsUTF8String(key) : Py_NewRef(key);
        if (value != NULL && key != NULL)
            delivery = row_branch(self->sender->intake, self->topic, value, key,
                                  self->kw[KW_ON_DELIVERY], self->kw[KW_HEADERS],
                                  self->kw[KW_PARTITION], self->kw[KW_TIMESTAMP],
                                  self->kw[KW_METADATA]);
        else
            PyErr_Clear();
        Py_XDECREF(value);
        Py_XDECREF(key);
        if (delivery != NULL || PyErr_Occurred()) {
            call_clear(self);
            *out = delivery;
            return delivery != NULL ? PYGEN_RETURN : PYGEN_ERROR;
        }
        /* the Python path: send(topic, value), with every keyword when one was given */
        PyObject *args[2 + KW_N] = {self->topic, self->value};
        int given = 0;
        for (int j = 0; j < KW_N; j++) {
            args[2 + j] = self->kw[j];
            given |= self->kw[j] != Py_None;
        }
        PyObject *coro = given ? PyObject_Vectorcall(self->sender->slow, args, 2, kw_python)
                               : PyObject_Vectorcall(self->sender->slow, args, 2, NULL);
        call_clear(self);
        if (coro == NULL) return PYGEN_ERROR;
        self->coro = coro;
    }
    PySendResult r = PyIter_Send(self->coro, arg, out);
    if (r != PYGEN_NEXT) Py_CLEAR(self->coro);
    return r;
}

/* The iterator protocol's form of a step: the yielded value, or NULL with
 * StopIteration(result) (or the error). */
static PyObject *step_result(PySendResult r, PyObject *out) {
    if (r == PYGEN_NEXT) return out;
    if (r == PYGEN_ERROR) return NULL;
    if (out == Py_None) {
        Py_DECREF(out);
        out = NULL;
    }
    return stop_iteration(out);
}

static PyObject *call_iternext(SendCallObject *self) {
    PyObject *out = NULL;
    PySendResult r = call_am_send(self, Py_None, &out);
    return step_result(r, out);
}

static PyObject *call_send(SendCallObject *self, PyObject *arg) {
    PyObject *out = NULL;
    PySendResult r = call_am_send(self, arg, &out);
    return step_result(r, out);
}

/* throw(): into the started coroutine; before the first step, as into a coroutine
 * that has not started: the exception comes straight back and nothing is sent. */
static PyObject *call_throw(SendCallObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->coro != NULL) {
        PyObject *coro = self->coro;
        Py_INCREF(coro);
        PyObject *meth = PyObject_GetAttrString(coro, "throw");
        PyObject *r = meth == NULL ? NULL : PyObject_Vectorcall(meth, args, nargs, NULL);
        Py_XDECREF(meth);
        if (r == NULL && self->coro == coro) Py_CLEAR(self->coro); /* returned or raised */
        Py_DECREF(coro);
        return r;
    }
    if (nargs >= 1 && nargs <= 3) call_clear(self);
    return throw_unstarted(args, nargs);
}

static PyObject *call_close(SendCallObject *self, PyObject *unused) {
    PyObject *coro = self->coro;
    self->coro = NULL;
    call_clear(self); /* (not started: nothing to close, and no warning) */
    if (coro == NULL) Py_RETURN_NONE;
    PyObject *r = PyObject_CallMethod(coro, "close", NULL);
    Py_DECREF(coro);
    return r;
}

static PyObject *call_await(PyObject *self) {
    Py_INCREF(self);
    return self;
}

static PyMethodDef call_methods[] = {
    {"send", (PyCFunction)call_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))call_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)call_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods call_async = {
    .am_await = call_await,
    .am_send = (sendfunc)call_am_send,
};

static PyTypeObject SendCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.producer._speedups._send.SendCall",
    .tp_basicsize = sizeof(SendCallObject),
    .tp_dealloc = (destructor)call_dealloc,
    .tp_as_async = &call_async,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The awaitable of send(topic, value): see pipeline/producer/_speedups/_send.c.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)call_iternext,
    .tp_methods = call_methods,
};

/* ------------------------------------------------------------------ Sender */

/* A keyword's name is `want` (interned: call sites have the same object). */
static inline int is_name(PyObject *name, PyObject *want) {
    return name == want || (PyUnicode_CheckExact(name) && PyUnicode_Compare(name, want) == 0);
}

static PyObject *sender_vectorcall(SenderObject *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    /* send(topic, value, **keywords) with key= None, bytes or str and on_delivery= None
     * or a callable (the others are checked by the row branch); anything else: the
     * Python path */
    PyObject *kw[KW_N];
    if (PyVectorcall_NARGS(nargsf) != 2) return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    for (int j = 0; j < KW_N; j++) kw[j] = Py_None;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *v = args[2 + i];
        int j = 0;
        while (j < KW_N && !is_name(name, str_kw[j])) j++;
        if (j == KW_N || (j == KW_KEY && v != Py_None && !PyBytes_CheckExact(v) &&
                          !PyUnicode_CheckExact(v)) ||
            (j == KW_ON_DELIVERY && v != Py_None && !PyCallable_Check(v)))
            return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
        kw[j] = v;
    }
    /* (A new object each call: one kept and reused would outlive a call dropped
     * unawaited, whose warning then came late.) */
    SendCallObject *c = PyObject_New(SendCallObject, &SendCall_Type);
    if (c == NULL) return NULL;
    Py_INCREF(self);
    c->sender = self;
    Py_INCREF(args[0]);
    c->topic = args[0];
    Py_INCREF(args[1]);
    c->value = args[1];
    for (int j = 0; j < KW_N; j++) {
        Py_INCREF(kw[j]);
        c->kw[j] = kw[j];
    }
    c->coro = NULL;
    return (PyObject *)c;
}

static PyObject *sender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *intake, *slow;
    static char *kwlist[] = {"intake", "slow", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Sender", kwlist, &intake, &slow))
        return NULL;
    if (rows_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pipeline.producer._speedups._send.setup() was not called");
        return NULL;
    }
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "slow must be callable (Intake.send, bound)");
        return NULL;
    }
    SenderObject *self = (SenderObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = (vectorcallfunc)sender_vectorcall;
    Py_INCREF(intake);
    self->intake = intake;
    Py_INCREF(slow);
    self->slow = slow;
    return (PyObject *)self;
}

static int sender_traverse(SenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->intake);
    Py_VISIT(self->slow);
    return 0;
}

static int sender_clear(SenderObject *self) {
    Py_CLEAR(self->intake);
    Py_CLEAR(self->slow);
    return 0;
}

static void sender_dealloc(SenderObject *self) {
    PyObject_GC_UnTrack(self);
    sender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------ SyncProducer's pump */

static PyTypeObject *handle_type = NULL; /* _sync.SyncDelivery (setup_sync) */
/* SyncDelivery: fields.SYNC_HANDLE */
static Py_ssize_t off_h_topic, off_h_value, off_h_kwargs, off_h_delivery, off_h_error,
    off_h_sync;
static PyObject *str_popleft, *str_append;

/* Sender.pump(pending) -> int: SyncProducer's pump (_sync.py) for the plain calls it
 * queued, without an awaitable each: while the deque's first item is a SyncDelivery of a
 * plain send(topic, value) (no keywords, a bytes, str or None value) that the row
 * branch takes, pop it, set its _delivery and drop its value (as the Python pump does).
 * Returns how many it took. Stops at the first call the row branch leaves to Python (a
 * schedule point is due, no open burst of its topic, no room, ...), which stays first in
 * the deque: the Python pump awaits send() for it, as it does for every call on the
 * pure-Python path (its twin). An error of the row branch (MemoryError, a patched clock
 * that raised: no test makes one, since either leaves the burst broken on both paths) is
 * that call's refusal (_error), as the awaited send()'s exception is in Python; a
 * BaseException that is not an Exception propagates, the call popped. Only
 * the pump task calls it; the caller's thread only appends to the deque's other end. */
static PyObject *sender_pump(SenderObject *self, PyObject *pending) {
    if (handle_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pipeline.producer._speedups._send.setup_sync() was not called");
        return NULL;
    }
    Py_ssize_t taken = 0;
    for (;;) {
        Py_ssize_t n = PyObject_Length(pending);
        if (n < 0) return NULL;
        if (n == 0) break;
        PyObject *h = PySequence_GetItem(pending, 0);
        if (h == NULL) return NULL;
        if (!Py_IS_TYPE(h, handle_type)) {
            Py_DECREF(h);
            break;
        }
        PyObject *topic = SLOT(h, off_h_topic), *value = SLOT(h, off_h_value);
        if (SLOT(h, off_h_kwargs) != Py_None ||
            SLOT(h, off_h_delivery) != Py_None || SLOT(h, off_h_error) != Py_None ||
            topic == NULL || !PyUnicode_CheckExact(topic) || value == NULL ||
            !(value == Py_None || PyBytes_CheckExact(value) || PyUnicode_CheckExact(value))) {
            Py_DECREF(h);
            break;
        }
        /* a str value is sent as UTF-8 (Intake.send's rule); one that does not encode is
         * left to Python, which raises the encoding error */
        value = PyUnicode_CheckExact(value) ? PyUnicode_AsUTF8String(value) : Py_NewRef(value);
        if (value == NULL) {
            PyErr_Clear();
            Py_DECREF(h);
            break;
        }
        PyObject *delivery = row_branch(self->intake, topic, value, Py_None, Py_None, Py_None,
                                        Py_None, Py_None, Py_None);
        Py_DECREF(value);
        if (delivery == NULL && !PyErr_Occurred()) {
            Py_DECREF(h);
            break;
        }
        PyObject *type = NULL, *exc = NULL, *tb = NULL;
        if (delivery == NULL) { /* the row branch raised: held while the call is popped */
            PyErr_Fetch(&type, &exc, &tb);
            PyErr_NormalizeException(&type, &exc, &tb);
        }
        PyObject *popped = PyObject_CallMethodNoArgs(pending, str_popleft);
        if (popped == NULL) {
            Py_XDECREF(delivery);
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
            Py_DECREF(h);
            return NULL;
        }
        Py_DECREF(popped); /* (h: only this task pops) */
        if (delivery == NULL) {
            if (!PyErr_GivenExceptionMatches(exc, PyExc_Exception)) {
                PyErr_Restore(type, exc, tb);
                Py_DECREF(h);
                return NULL;
            }
            if (tb != NULL) PyException_SetTraceback(exc, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            set_slot(h, off_h_error, exc);
        } else {
            set_slot(h, off_h_delivery, delivery);
        }
        set_slot(h, off_h_value, Py_NewRef(Py_None));
        Py_DECREF(h);
        taken++;
    }
    return PyLong_FromSsize_t(taken);
}

static PyMethodDef sender_methods[] = {
    {"pump", (PyCFunction)sender_pump, METH_O,
     "pump(pending) -> int: SyncProducer's queued plain calls through the row branch "
     "(see _send.c)."},
    {NULL, NULL, 0, NULL},
};

/* SyncQueue(sync, pending, slow, wake, sleep, max, mask): SyncProducer.send (_sync.py)
 * for the plain call send(topic, value) with a str topic and a bytes, str or None value:
 * a SyncDelivery (not tracked by the cyclic GC: see untracked) appended to `pending`,
 * `wake()` when the queue was empty (the pump may be asleep), `sleep(0)` every mask + 1
 * queued calls (the GIL to the pump). Every other call (keywords, other types, a full
 * queue, once closed) is `slow`'s: SyncProducer.send, the twin, which the pure-Python
 * path runs for every call. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *sync, *pending, *slow, *wake, *sleep;
    Py_ssize_t max, mask;
    char closed; /* set by SyncProducer.close(): then every call is slow's (it raises) */
} SyncQueueObject;

static PyObject *queue_vectorcall(SyncQueueObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->closed || nargs != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) ||
        handle_type == NULL)
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    PyObject *topic = args[0], *value = args[1];
    if (!PyUnicode_CheckExact(topic) ||
        !(value == Py_None || PyBytes_CheckExact(value) || PyUnicode_CheckExact(value)))
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    Py_ssize_t n = PyObject_Length(self->pending);
    if (n < 0) return NULL;
    if (n >= self->max) return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    PyObject *h = handle_type->tp_alloc(handle_type, 0);
    if (h == NULL) return NULL;
    SLOT(h, off_h_sync) = Py_NewRef(self->sync);
    SLOT(h, off_h_topic) = Py_NewRef(topic);
    SLOT(h, off_h_value) = Py_NewRef(value);
    SLOT(h, off_h_kwargs) = Py_NewRef(Py_None);
    SLOT(h, off_h_delivery) = Py_NewRef(Py_None);
    SLOT(h, off_h_error) = Py_NewRef(Py_None);
    if (PyObject_IS_GC(h) && PyObject_GC_IsTracked(h)) PyObject_GC_UnTrack(h);
    PyObject *r = PyObject_CallMethodOneArg(self->pending, str_append, h);
    if (r == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    Py_DECREF(r);
    n += 1;
    if (n == 1)
        r = PyObject_CallNoArgs(self->wake);
    else if (!(n & self->mask)) {
        PyObject *zero = PyLong_FromLong(0);
        r = zero == NULL ? NULL : PyObject_CallOneArg(self->sleep, zero);
        Py_XDECREF(zero);
    } else
        return h;
    if (r == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    Py_DECREF(r);
    return h;
}

static PyObject *queue_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"sync", "pending", "slow", "wake", "sleep", "max", "mask", NULL};
    PyObject *sync, *pending, *slow, *wake, *sleep;
    Py_ssize_t max, mask;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOnn:SyncQueue", kwlist, &sync,
                                     &pending, &slow, &wake, &sleep, &max, &mask))
        return NULL;
    if (!PyCallable_Check(slow) || !PyCallable_Check(wake) || !PyCallable_Check(sleep)) {
        PyErr_SetString(PyExc_TypeError, "slow, wake and sleep must be callable");
        return NULL;
    }
    if (max < 1 || mask < 0) {
        PyErr_SetString(PyExc_ValueError, "max must be >= 1 and mask >= 0");
        return NULL;
    }
    SyncQueueObject *self = (SyncQueueObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = (vectorcallfunc)queue_vectorcall;
    self->sync = Py_NewRef(sync);
    self->pending = Py_NewRef(pending);
    self->slow = Py_NewRef(slow);
    self->wake = Py_NewRef(wake);
    self->sleep = Py_NewRef(sleep);
    self->max = max;
    self->mask = mask;
    self->closed = 0;
    return (PyObject *)self;
}

static int queue_traverse(SyncQueueObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->sync);
    Py_VISIT(self->pending);
    Py_VISIT(self->slow);
    Py_VISIT(self->wake);
    Py_VISIT(self->sleep);
    return 0;
}

static int queue_clear(SyncQueueObject *self) {
    Py_CLEAR(self->sync);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->wake);
    Py_CLEAR(self->sleep);
    return 0;
}

static void queue_dealloc(SyncQueueObject *self) {
    PyObject_GC_UnTrack(self);
    queue_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef queue_members[] = {
    {"closed", T_BOOL, offsetof(SyncQueueObject, closed), 0,
     "True once the SyncProducer closed: every call is then the slow path's"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SyncQueue_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.producer._speedups._send.SyncQueue",
    .tp_basicsize = sizeof(SyncQueueObject),
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_vectorcall_offset = offsetof(SyncQueueObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "SyncQueue(sync, pending, slow, wake, sleep, max, mask): SyncProducer.send's "
              "plain call in C (_send.c).",
    .tp_traverse = (traverseproc)queue_traverse,
    .tp_clear = (inquiry)queue_clear,
    .tp_new = queue_new,
    .tp_members = queue_members,
};

static PyObject *setup_sync(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"handle_type", "handle_fields", NULL};
    PyObject *ht, *hfs;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O:setup_sync", kwlist, &PyType_Type,
                                     &ht, &hfs))
        return NULL;
    /* fields.SYNC_HANDLE, in its order */
    Py_ssize_t fh[6];
    if (member_offsets((PyTypeObject *)ht, hfs, 6, fh) < 0) return NULL;
    off_h_topic = fh[0], off_h_value = fh[1], off_h_kwargs = fh[2], off_h_delivery = fh[3];
    off_h_error = fh[4], off_h_sync = fh[5];
    Py_INCREF(ht);
    Py_XSETREF(handle_type, (PyTypeObject *)ht);
    Py_RETURN_NONE;
}

static PyTypeObject Sender_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.producer._speedups._send.Sender",
    .tp_basicsize = sizeof(SenderObject),
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_vectorcall_offset = offsetof(SenderObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Sender(intake, slow): producer.send with the row branch in C (_send.c).",
    .tp_methods = sender_methods,
    .tp_traverse = (traverseproc)sender_traverse,
    .tp_clear = (inquiry)sender_clear,
    .tp_new = sender_new,
};

/* ------------------------------------------------------------------ send_many's messages
 *
 * send_many of plain ProducerMessage objects as columnar rows (_columnar/messages.py,
 * whose _take_py, _accept_py and _settle_py are the twins): one pass over a chunk's
 * messages reading and writing the fields fields.SEND_MESSAGE declares, at their slots'
 * offsets (setup_messages). */

static PyTypeObject *message_type = NULL; /* _message.ProducerMessage */
static Py_ssize_t off_m_topic, off_m_value, off_m_key, off_m_headers, off_m_partition,
    off_m_timestamp, off_m_id, off_m_state, off_m_offset, off_m_outcome, off_m_deadline;
static Py_ssize_t message_size_base = 0; /* normalize.SIZE_BASE */

#define MAX_PARTITION 2147483647LL
#define MAX_TIMESTAMP 9223372036854775807LL

/* A plain value or key (None, bytes; a str becomes its UTF-8 bytes, written back into
 * the slot): its size-bound part in *size, 1; 0: not plain (or not encodable). */
static int plain_binary(PyObject *msg, Py_ssize_t off, long long *size) {
    PyObject *v = SLOT(msg, off);
    if (v == NULL) return 0;
    if (PyUnicode_CheckExact(v)) {
        PyObject *b = PyUnicode_AsUTF8String(v);
        if (b == NULL) {
            PyErr_Clear();
            return 0;
        }
        set_slot(msg, off, b);
        v = b;
    }
    if (v == Py_None) {
        *size = 1;
        return 1;
    }
    if (!PyBytes_CheckExact(v)) return 0;
    Py_ssize_t n = PyBytes_GET_SIZE(v);
    *size = n + prefix_size(n);
    return 1;
}

/* take_messages(msgs, now_ms, max_bytes) -> (topic, values, keys, header_keys,
 * header_values, header_ends, timestamps, partitions, sizes) or None: _take_py's rules
 * and writes, in its order per message. */
static PyObject *take_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_messages(list, int now_ms, int max_bytes)");
        return NULL;
    }
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_messages() was not called");
        return NULL;
    }
    PyObject *msgs = args[0], *now = args[1];
    long long max_bytes = PyLong_AsLongLong(args[2]);
    if (max_bytes == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    if (n == 0) Py_RETURN_NONE;
    PyObject *first = PyList_GET_ITEM(msgs, 0);
    if (Py_TYPE(first) != message_type) Py_RETURN_NONE;
    PyObject *topic = SLOT(first, off_m_topic);
    if (topic == NULL || !PyUnicode_CheckExact(topic) || PyUnicode_GET_LENGTH(topic) == 0)
        Py_RETURN_NONE;
    Py_INCREF(topic); /* (held: a write back cannot free it, the first slot is never written) */
    PyObject *values = PyList_New(n), *keys = PyList_New(n), *stamps = PyList_New(n);
    PyObject *parts = PyList_New(n), *sizes = PyList_New(n);
    PyObject *hkeys = PyList_New(0), *hvalues = PyList_New(0), *ends = PyList_New(n + 1);
    PyObject *result = NULL, *minus_one = PyLong_FromLong(-1);
    PyObject *stack_pairs[16];
    PyObject **pairs = stack_pairs;
    Py_ssize_t cap = 8;
    int any_key = 0, any_headers = 0, any_partition = 0;
    if (values == NULL || keys == NULL || stamps == NULL || parts == NULL || sizes == NULL ||
        hkeys == NULL || hvalues == NULL || ends == NULL || minus_one == NULL)
        goto done;
    /* (filled below item by item: a NULL item of a list cut short is None, for the DECREF) */
    for (Py_ssize_t j = 0; j < n; j++) {
        PyList_SET_ITEM(values, j, Py_NewRef(Py_None));
        PyList_SET_ITEM(keys, j, Py_NewRef(Py_None));
        PyList_SET_ITEM(stamps, j, Py_NewRef(Py_None));
        PyList_SET_ITEM(parts, j, Py_NewRef(Py_None));
        PyList_SET_ITEM(sizes, j, Py_NewRef(Py_None));
        PyList_SET_ITEM(ends, j + 1, Py_NewRef(Py_None));
    }
    PyList_SET_ITEM(ends, 0, PyLong_FromLong(0));
    if (PyList_GET_ITEM(ends, 0) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PyList_GET_ITEM(msgs, i);
        if (Py_TYPE(msg) != message_type) goto plain_none;
        PyObject *t = SLOT(msg, off_m_topic);
        if (t != topic) {
            if (t == NULL || !PyUnicode_CheckExact(t)) goto plain_none;
            int eq = PyUnicode_Compare(t, topic);
            if (eq == -1 && PyErr_Occurred()) goto done;
            if (eq != 0) goto plain_none;
        }
        long long vsize, ksize;
        if (!plain_binary(msg, off_m_value, &vsize) || !plain_binary(msg, off_m_key, &ksize))
            goto plain_none;
        long long size = message_size_base + vsize + ksize;
        PyObject *headers = SLOT(msg, off_m_headers);
        if (headers == NULL) goto plain_none;
        int truthy = PyObject_IsTrue(headers);
        if (truthy < 0) goto done;
        if (truthy) {
            Py_ssize_t h;
            long long hsize;
            int plain = plain_headers(headers, pairs, cap, &h, &hsize);
            if (plain < 0) { /* more pairs than room: grow, ask again */
                cap = h;
                if (pairs != stack_pairs) PyMem_Free(pairs);
                pairs = PyMem_New(PyObject *, 2 * cap);
                if (pairs == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                plain = plain_headers(headers, pairs, cap, &h, &hsize);
            }
            if (plain != 1) goto plain_none;
            PyObject *tuple = PyTuple_New(h); /* normalize's msg.headers: a tuple of pairs */
            if (tuple == NULL) goto done;
            int is_seq = !PyDict_CheckExact(headers);
            for (Py_ssize_t j = 0; j < h; j++) {
                PyObject *pair;
                if (is_seq) {
                    pair = Py_NewRef(PySequence_Fast_GET_ITEM(headers, j));
                } else {
                    pair = PyTuple_Pack(2, pairs[2 * j], pairs[2 * j + 1]);
                    if (pair == NULL) {
                        Py_DECREF(tuple);
                        goto done;
                    }
                }
                PyTuple_SET_ITEM(tuple, j, pair);
                if (PyList_Append(hkeys, pairs[2 * j]) < 0 ||
                    PyList_Append(hvalues, pairs[2 * j + 1]) < 0) {
                    Py_DECREF(tuple);
                    goto done;
                }
            }
            size += hsize;
            /* (plain pairs: an untracked tuple, as message_init leaves atomic headers) */
            for (Py_ssize_t j = 0; j < h; j++) {
                PyObject *pair = PyTuple_GET_ITEM(tuple, j);
                if (PyObject_GC_IsTracked(pair)) PyObject_GC_UnTrack(pair);
            }
            PyObject_GC_UnTrack(tuple);
            set_slot(msg, off_m_headers, tuple); /* (the pairs: held by the tuple now) */
            any_headers = 1;
        }
        PyObject *end = PyLong_FromSsize_t(PyList_GET_SIZE(hkeys));
        if (end == NULL) goto done;
        PyList_SetItem(ends, i + 1, end);
        PyObject *p = SLOT(msg, off_m_partition), *pin;
        if (p == NULL) goto plain_none;
        if (p == Py_None) {
            pin = Py_NewRef(minus_one);
        } else {
            if (plain_int(p, MAX_PARTITION) < 0) goto plain_none;
            pin = Py_NewRef(p);
            any_partition = 1;
        }
        PyList_SetItem(parts, i, pin);
        PyObject *ts = SLOT(msg, off_m_timestamp);
        if (ts == NULL) goto plain_none;
        if (ts == Py_None) {
            set_slot(msg, off_m_timestamp, Py_NewRef(now));
            ts = now;
        } else if (plain_int(ts, MAX_TIMESTAMP) < 0) {
            goto plain_none;
        }
        if (size > max_bytes) goto plain_none;
        PyObject *value = SLOT(msg, off_m_value), *key = SLOT(msg, off_m_key);
        PyList_SetItem(values, i, Py_NewRef(value));
        PyList_SetItem(keys, i, Py_NewRef(key));
        if (key != Py_None) any_key = 1;
        PyList_SetItem(stamps, i, Py_NewRef(ts));
        PyObject *sz = PyLong_FromLongLong(size);
        if (sz == NULL) goto done;
        PyList_SetItem(sizes, i, sz);
    }
    result = Py_BuildValue("(OOOOOOOOO)", topic, values, any_key ? keys : Py_None,
                           any_headers ? hkeys : Py_None, any_headers ? hvalues : Py_None,
                           any_headers ? ends : Py_None, stamps,
                           any_partition ? parts : Py_None, sizes);
    goto done;
plain_none:
    result = Py_NewRef(Py_None);
done:
    if (pairs != stack_pairs) PyMem_Free(pairs);
    Py_DECREF(topic);
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(stamps);
    Py_XDECREF(parts);
    Py_XDECREF(sizes);
    Py_XDECREF(hkeys);
    Py_XDECREF(hvalues);
    Py_XDECREF(ends);
    Py_XDECREF(minus_one);
    return result;
}

/* accept_messages(msgs, first_id, deadline): message i's `_id` is first_id + i and its
 * `_deadline` the chunk's (first_id 0: every `_id` back to 0, `_deadline` untouched).
 *
 * An accepted message also leaves the cyclic GC until it settles (settle_messages, or
 * first_id 0 here, puts it back). In flight its chunk (RowChunk.messages, reachable
 * from the ledger) holds it, so nothing it refers to can be garbage then: untracking
 * only hides cycles through it, and those are visible again once it is tracked again,
 * which every accepted message is, exactly once (every accepted row settles). Without
 * this a send_many loop keeps a buffer's worth of messages (hundreds of thousands) in
 * the GC's generations, and every full collection walks all of them: measured, a third
 * of send_many's CPU with two headers a message. */
static PyObject *accept_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) ||
        !PyFloat_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "accept_messages(list, int first_id, float deadline)");
        return NULL;
    }
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_messages() was not called");
        return NULL;
    }
    PyObject *msgs = args[0];
    long long first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (Py_TYPE(PyList_GET_ITEM(msgs, i)) != message_type) {
            PyErr_SetString(PyExc_TypeError, "accept_messages: not a ProducerMessage");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PyList_GET_ITEM(msgs, i);
        PyObject *id = PyLong_FromLongLong(first ? first + i : 0);
        if (id == NULL) return NULL;
        set_slot(msg, off_m_id, id);
        if (first) {
            set_slot(msg, off_m_deadline, Py_NewRef(args[2]));
            if (PyObject_GC_IsTracked(msg)) PyObject_GC_UnTrack(msg);
        } else if (!PyObject_GC_IsTracked(msg)) {
            PyObject_GC_Track(msg);
        }
    }
    Py_RETURN_NONE;
}

/* settle_messages(msgs, rows, state, offset, partition, timestamp, outcome): _settle_py,
 * and each message back in the cyclic GC (accept_messages says why it left).
 * `rows`: a range of step 1 (a null-key split, or a whole run) or a buffer of int64 row
 * indices (a keyed or pinned split); every index is checked against len(msgs) before
 * anything is written. */
static PyObject *settle_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "settle_messages(list, rows, state, offset, "
                                         "partition, timestamp, outcome)");
        return NULL;
    }
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_messages() was not called");
        return NULL;
    }
    PyObject *msgs = args[0], *rows = args[1], *state = args[2], *partition = args[4];
    PyObject *outcome = args[6];
    long long st = PyLong_AsLongLong(state), base = PyLong_AsLongLong(args[3]);
    long long append_time = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (st != 1 && st != 2) {
        PyErr_Format(PyExc_ValueError, "settle_messages: state %lld is not OK or FAILED", st);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs), count, first = 0;
    Py_buffer view = {0};
    const long long *index = NULL;
    if (PyObject_TypeCheck(rows, &PyRange_Type)) {
        PyObject *a = PyObject_GetAttrString(rows, "start");
        PyObject *b = PyObject_GetAttrString(rows, "stop");
        PyObject *c = PyObject_GetAttrString(rows, "step");
        Py_ssize_t start = a ? PyLong_AsSsize_t(a) : -1, stop = b ? PyLong_AsSsize_t(b) : -1;
        Py_ssize_t step = c ? PyLong_AsSsize_t(c) : -1;
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        if (PyErr_Occurred()) return NULL;
        if (step != 1 || start < 0 || stop > n) {
            PyErr_Format(PyExc_ValueError, "settle_messages: rows range(%zd, %zd, %zd) is not "
                         "within 0..%zd in steps of 1", start, stop, step, n - 1);
            return NULL;
        }
        first = start;
        count = stop > start ? stop - start : 0;
    } else {
        if (PyObject_GetBuffer(rows, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
        const char *f = view.format;
        if (view.itemsize != 8 || f == NULL ||
            !(strcmp(f, "q") == 0 || strcmp(f, "l") == 0 || strcmp(f, "=q") == 0 ||
              strcmp(f, "<q") == 0 || strcmp(f, "@q") == 0)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "settle_messages: rows must be int64");
            return NULL;
        }
        index = (const long long *)view.buf;
        count = view.len / 8;
        for (Py_ssize_t k = 0; k < count; k++) {
            if (index[k] < 0 || index[k] >= n) {
                PyErr_Format(PyExc_ValueError, "settle_messages: row %lld is outside 0..%zd",
                             index[k], n - 1);
                PyBuffer_Release(&view);
                return NULL;
            }
        }
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if (Py_TYPE(PyList_GET_ITEM(msgs, index ? index[k] : first + k)) != message_type) {
            PyErr_SetString(PyExc_TypeError, "settle_messages: not a ProducerMessage");
            if (index) PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyObject *stamp = NULL, *minus_one = PyLong_FromLong(-1);
    if (minus_one == NULL) goto fail;
    if (st == 1 && append_time >= 0) stamp = Py_NewRef(args[5]);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *msg = PyList_GET_ITEM(msgs, index ? index[k] : first + k);
        set_slot(msg, off_m_state, Py_NewRef(state));
        if (st == 1) {
            PyObject *off = base >= 0 ? PyLong_FromLongLong(base + k) : Py_NewRef(minus_one);
            if (off == NULL) goto fail;
            set_slot(msg, off_m_offset, off);
            set_slot(msg, off_m_partition, Py_NewRef(partition));
            if (stamp != NULL) set_slot(msg, off_m_timestamp, Py_NewRef(stamp));
        } else {
            set_slot(msg, off_m_outcome, Py_NewRef(outcome));
            if (partition != Py_None) set_slot(msg, off_m_partition, Py_NewRef(partition));
        }
        if (!PyObject_GC_IsTracked(msg)) PyObject_GC_Track(msg); /* (accept_messages) */
    }
    Py_XDECREF(stamp);
    Py_DECREF(minus_one);
    if (index) PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(stamp);
    Py_XDECREF(minus_one);
    if (index) PyBuffer_Release(&view);
    return NULL;
}

static PyObject *setup_messages(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"message_type", "message_fields", "size_base", NULL};
    PyObject *mt, *mfs;
    Py_ssize_t base;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!On:setup_messages", kwlist, &PyType_Type,
                                     &mt, &mfs, &base))
        return NULL;
    /* fields.SEND_MESSAGE, in its order */
    Py_ssize_t f[11];
    if (member_offsets((PyTypeObject *)mt, mfs, 11, f) < 0) return NULL;
    off_m_topic = f[0], off_m_value = f[1], off_m_key = f[2], off_m_headers = f[3];
    off_m_partition = f[4], off_m_timestamp = f[5], off_m_id = f[6], off_m_state = f[7];
    off_m_offset = f[8], off_m_outcome = f[9], off_m_deadline = f[10];
    message_size_base = base;
    Py_INCREF(mt);
    Py_XSETREF(message_type, (PyTypeObject *)mt);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ setup */

static PyObject *setup(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"intake_type", "intake_fields", "ledger_type", "ledger_fields",
                             "rows_type", "rows_fields", "size_base", "intake_globals",
                             "rows_globals", "wall_time", NULL};
    PyObject *it, *lt, *rt, *ifs, *lfs, *rfs, *ig, *rg, *wt;
    Py_ssize_t base;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO!OO!OnO!O!O:setup", kwlist, &PyType_Type,
                                     &it, &ifs, &PyType_Type, &lt, &lfs, &PyType_Type, &rt, &rfs,
                                     &base, &PyDict_Type, &ig, &PyDict_Type, &rg, &wt))
        return NULL;
    PyTypeObject *i = (PyTypeObject *)it, *l = (PyTypeObject *)lt, *r = (PyTypeObject *)rt;
    /* fields.SEND_INTAKE, SEND_LEDGER, SEND_BURST, in their order */
    Py_ssize_t fi[9], fl[3], fr[12];
    if (member_offsets(i, ifs, 9, fi) < 0 || member_offsets(l, lfs, 3, fl) < 0 ||
        member_offsets(r, rfs, 12, fr) < 0)
        return NULL;
    off_until_yield = fi[0], off_closing = fi[1], off_rows = fi[2], off_wall_clock = fi[3];
    off_max_bytes = fi[4], off_ms = fi[5], off_ms_ends = fi[6], off_ledger = fi[7];
    off_timestamp_ms = fi[8];
    off_buffered = fl[0], off_buffer_memory = fl[1], off_next_id = fl[2];
    off_s_topic = fr[0], off_s_values = fr[1], off_s_timestamps = fr[2];
    off_s_on_delivery = fr[3], off_s_size = fr[4], off_s_keys = fr[5], off_s_extras = fr[6];
    off_s_hkeys = fr[7], off_s_hvalues = fr[8], off_s_hends = fr[9], off_s_partitions = fr[10];
    off_s_metadata = fr[11];
    size_base = base;
    Py_INCREF(ig);
    Py_XSETREF(intake_globals, ig);
    Py_INCREF(rg);
    Py_XSETREF(rows_globals, rg);
    Py_INCREF(wt);
    Py_XSETREF(wall_time, wt);
    Py_INCREF(rt);
    Py_XSETREF(rows_type, r);
    Py_RETURN_NONE;
}

/* atomic_list() -> []: a list the cyclic GC does not track. For a burst's values
 * (bytes) and timestamps (ints): lists that hold only atomic objects can be in no
 * cycle, and a kept burst's 512-item lists made every young collection walk them
 * (measured: 30 ms of GC per 1M kept deliveries, against 4 ms when dropped). A list
 * is never tracked again by CPython once untracked; it must get only atomic items, or
 * be in no cycle the code does not cut itself. */
static PyObject *atomic_list(PyObject *module, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list != NULL) PyObject_GC_UnTrack(list);
    return list;
}

/* untracked(obj) -> obj, no longer tracked by the cyclic GC (a no-op for an object
 * that is not). For SyncProducer's queued calls: one GC object per blocking send()
 * that outlives a young collection (the pump takes the queue in turns with the
 * caller) was promoted to the old generations and made full collections walk the
 * queue (measured: a fifth of the blocking send()'s CPU). The caller guarantees the
 * object is in no cycle it does not cut itself: an untracked object's references are
 * never followed, so a cycle through it would never be collected. */
static PyObject *untracked(PyObject *module, PyObject *obj) {
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) PyObject_GC_UnTrack(obj);
    Py_INCREF(obj);
    return obj;
}

static PyMethodDef methods[] = {
    {"atomic_list", atomic_list, METH_NOARGS,
     "atomic_list() -> a new empty list the cyclic GC does not track (atomic items only)."},
    {"setup_sync", (PyCFunction)(void (*)(void))setup_sync, METH_VARARGS | METH_KEYWORDS,
     "setup_sync(handle_type, handle_fields): bind Sender.pump to SyncDelivery (once, at "
     "the import of pipeline.producer._sync)."},
    {"untracked", untracked, METH_O,
     "untracked(obj) -> obj, not tracked by the cyclic GC (it must be in no cycle)."},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(intake_type, intake_fields, ledger_type, ledger_fields, rows_type, rows_fields, "
     "size_base, intake_globals, rows_globals, wall_time): bind the module to the intake "
     "(once, at the import of pipeline.producer._intake.send_path)."},
    {"setup_messages", (PyCFunction)(void (*)(void))setup_messages,
     METH_VARARGS | METH_KEYWORDS,
     "setup_messages(message_type, message_fields, size_base): bind take_messages, "
     "accept_messages and settle_messages to ProducerMessage (fields.SEND_MESSAGE)."},
    {"take_messages", (PyCFunction)(void (*)(void))take_messages, METH_FASTCALL,
     "take_messages(msgs, now_ms, max_bytes) -> column lists or None (messages.py)."},
    {"accept_messages", (PyCFunction)(void (*)(void))accept_messages, METH_FASTCALL,
     "accept_messages(msgs, first_id, deadline): the messages' acceptance ids and delivery "
     "deadline (messages.py)."},
    {"settle_messages", (PyCFunction)(void (*)(void))settle_messages, METH_FASTCALL,
     "settle_messages(msgs, rows, state, offset, partition, timestamp, outcome): a run's "
     "outcome onto its rows' messages (messages.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pipeline.producer._speedups._send",
    "send()'s common call in C (see _send.c's header).", -1, methods,
};

PyMODINIT_FUNC PyInit__send(void) {
    if (PyType_Ready(&SendCall_Type) < 0 || PyType_Ready(&Sender_Type) < 0 ||
        PyType_Ready(&SyncQueue_Type) < 0)
        return NULL;
    str_time = PyUnicode_InternFromString("_time");
    str_new_row = PyUnicode_InternFromString("new_row");
    str_new_metadata_row = PyUnicode_InternFromString("new_metadata_row");
    str_popleft = PyUnicode_InternFromString("popleft");
    str_append = PyUnicode_InternFromString("append");
    /* (interned: call sites have the same objects) */
    static const char *const kw_names[KW_N] = {"key", "headers", "partition", "timestamp",
                                               "metadata", "on_delivery"};
    for (int j = 0; j < KW_N; j++)
        if ((str_kw[j] = PyUnicode_InternFromString(kw_names[j])) == NULL) return NULL;
    kw_python = PyTuple_New(KW_N);
    if (kw_python == NULL || str_time == NULL || str_new_row == NULL ||
        str_new_metadata_row == NULL || str_popleft == NULL || str_append == NULL)
        return NULL;
    for (int j = 0; j < KW_N; j++) {
        Py_INCREF(str_kw[j]);
        PyTuple_SET_ITEM(kw_python, j, str_kw[j]);
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &Sender_Type) < 0 || PyModule_AddType(m, &SendCall_Type) < 0 ||
        PyModule_AddType(m, &SyncQueue_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
