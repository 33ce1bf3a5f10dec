/* pipeline.producer._speedups._delivery: awaiting a settled Delivery without Python frames.
 *
 * `await delivery` on a message that is already settled OK is the per-message
 * path of a loop that keeps every Delivery and awaits each. In
 * Python it costs a generator, a NamedTuple built by tuple.__new__ and three
 * attribute reads for the cancellation check (~1.26 us). Here:
 *
 *   SettledAwait  a mixin type with no instance fields (so it is layout-compatible
 *                 with ProducerMessage's __slots__; Delivery inherits from both).
 *                 Its am_await, when the message is OK, no schedule point is due and
 *                 the task is not cancelled, returns a tiny iterator whose first
 *                 am_send / tp_iternext returns the RecordMetadata at once. In every
 *                 other case it returns what pipeline/producer/_outcomes/delivery.py gives it
 *                 at setup(): the Python __await__ (pending -> park, failed ->
 *                 checkpoint + raise) or the settled-but-checkpoint generator (a
 *                 schedule point is due: full checkpoint; cancelled, or the cancel
 *                 status cannot be read: checkpoint_if_cancelled).
 *   metadata(msg) RecordMetadata(topic, partition, offset, timestamp, offset >= 0)
 *                 built by tp_alloc of the NamedTuple class.
 *   schedule_due() the process-wide schedule budget: True on every `every`-th call.
 *                 delivery.py uses this very function when the module is loaded, so
 *                 the C and the Python path share one budget.
 *
 * Slots are read at the offsets of the member descriptors of the fields
 * pipeline/producer/_speedups/fields.py declares (DELIVERY_MESSAGE; the rows':
 * DELIVERY_BURST, DELIVERY_OUTCOMES, DELIVERY_RUN), found once by setup(); every
 * entry point first checks that its argument is an instance of that class.
 * pipeline/producer/_outcomes/delivery.py holds the pure-Python
 * twin of all of it (used when this module is not built or PIPELINE_PURE_PYTHON
 * is set); tests run both and compare.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_shared.h" /* SLOT, member_offset, stop_iteration, throw_unstarted */

/* ------------------------------------------------------------------ state */

static PyTypeObject *message_type = NULL;   /* ProducerMessage */
static PyTypeObject *metadata_type = NULL;  /* RecordMetadata (a tuple subclass) */
static PyObject *python_await = NULL;       /* delivery.py's Python __await__ (a function) */
static PyObject *settled_checkpoint = NULL; /* f(msg, full: bool) -> generator */
static PyObject *run_context = NULL;        /* trio's GLOBAL_RUN_CONTEXT, or anything */
static PyObject *ok_state = NULL;           /* the int OK */
static Py_ssize_t off_state, off_topic, off_partition, off_offset, off_timestamp;
static long schedule_every = 0;
static long countdown = 0;

static PyObject *str_task, *str_cancel_status, *str_effectively_cancelled;

static int check_ready(void) {
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pipeline.producer._speedups._delivery.setup() was not called");
        return -1;
    }
    return 0;
}

static int check_message(PyObject *msg) {
    if (check_ready() < 0) return -1;
    if (!PyObject_TypeCheck(msg, message_type)) {
        PyErr_Format(PyExc_TypeError, "expected a %s, got %.200s", message_type->tp_name,
                     Py_TYPE(msg)->tp_name);
        return -1;
    }
    return 0;
}

/* A slot's value, or NULL with AttributeError (the slot was never set). */
static inline PyObject *slot(PyObject *msg, Py_ssize_t off, const char *name) {
    PyObject *v = SLOT(msg, off);
    if (v == NULL) PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '%s'",
                                Py_TYPE(msg)->tp_name, name);
    return v;
}

/* ------------------------------------------------------------------ metadata */

/* The last RecordMetadata made here, kept: when nobody else holds it any more (an
 * `await d` whose result was dropped, a callback that kept nothing) the next one is
 * this object with its items replaced, instead of a free and an allocation (what
 * zip() and enumerate() do with their result tuple: nobody can see the change). */
static PyObject *spare_metadata = NULL;

/* A RecordMetadata (tp_alloc of the named tuple) of topic, partition, timestamp and known
 * (borrowed) and offset (a new reference, which it steals, released on failure too). */
static PyObject *new_metadata(PyObject *topic, PyObject *partition, PyObject *offset,
                              PyObject *timestamp, PyObject *known) {
    PyObject *r = spare_metadata, *old[5] = {NULL, NULL, NULL, NULL, NULL};
    if (r != NULL && Py_REFCNT(r) == 1 && Py_IS_TYPE(r, metadata_type)) {
        for (int k = 0; k < 5; k++) old[k] = PyTuple_GET_ITEM(r, k);
        Py_INCREF(r);
    } else {
        r = metadata_type->tp_alloc(metadata_type, 5);
        if (r == NULL) {
            Py_DECREF(offset);
            return NULL;
        }
        Py_INCREF(r);
        Py_XSETREF(spare_metadata, r); /* (one still held elsewhere is its holder's alone) */
    }
    PyObject *items[5] = {topic, partition, offset, timestamp, known};
    for (int k = 0; k < 5; k++) {
        if (k != 2) Py_INCREF(items[k]); /* (offset: its reference is the caller's) */
        PyTuple_SET_ITEM(r, k, items[k]);
    }
    for (int k = 0; k < 5; k++) Py_XDECREF(old[k]); /* (str, int, bool: no code runs) */
    return r;
}

/* An int of value v (a new reference) for the next RecordMetadata: the spare's own
 * offset int rewritten in place when nothing but the spare holds either (a loop that
 * awaits and drops each result: nobody can see the change, as with the spare itself),
 * else a new int. Only for one-digit values above the small ints (those are shared
 * singletons), and only where PyLongObject is ob_size + ob_digit (before 3.12).
 * Measured: 10 of the ~80 ns of a settled row's await were this int's malloc and free. */
static PyObject *offset_int(long long v) {
#if PY_VERSION_HEX < 0x030C0000
    PyObject *r = spare_metadata;
    if (v > 256 && v < ((long long)1 << PyLong_SHIFT) && r != NULL && Py_REFCNT(r) == 1 &&
        Py_IS_TYPE(r, metadata_type)) {
        PyObject *o = PyTuple_GET_ITEM(r, 2);
        if (o != NULL && PyLong_CheckExact(o) && Py_REFCNT(o) == 1 && Py_SIZE(o) == 1) {
            ((PyLongObject *)o)->ob_digit[0] = (digit)v;
            Py_INCREF(o); /* (new_metadata puts it back in place and drops the old ref) */
            return o;
        }
    }
#endif
    return PyLong_FromLongLong(v);
}

static PyObject *build_metadata(PyObject *msg) {
    PyObject *topic = slot(msg, off_topic, "topic");
    if (topic == NULL) return NULL;
    PyObject *partition = slot(msg, off_partition, "partition");
    if (partition == NULL) return NULL;
    PyObject *offset = slot(msg, off_offset, "offset");
    if (offset == NULL) return NULL;
    PyObject *timestamp = slot(msg, off_timestamp, "timestamp");
    if (timestamp == NULL) return NULL;
    PyObject *known;  /* offset >= 0 (the Python twin's expression) */
    if (PyLong_CheckExact(offset)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(offset, &overflow);
        if (v == -1 && !overflow && PyErr_Occurred()) return NULL;
        known = (overflow > 0 || (overflow == 0 && v >= 0)) ? Py_True : Py_False;
        Py_INCREF(known);
    } else {
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL) return NULL;
        known = PyObject_RichCompare(offset, zero, Py_GE);
        Py_DECREF(zero);
        if (known == NULL) return NULL;
    }
    Py_INCREF(offset);
    PyObject *r = new_metadata(topic, partition, offset, timestamp, known);
    Py_DECREF(known);
    return r;
}

static PyObject *metadata(PyObject *module, PyObject *msg) {
    if (check_message(msg) < 0) return NULL;
    return build_metadata(msg);
}

/* ------------------------------------------------------------------ schedule budget */

static inline int due(void) {
    if (--countdown <= 0) {
        countdown = schedule_every;
        return 1;
    }
    return 0;
}

/* A schedule point was just made elsewhere (send()'s periodic checkpoint): the next
 * schedule_every calls are not due, the one after them is. (schedule_every, not
 * schedule_every - 1: send() yields on its schedule_every-th call after its last
 * checkpoint, so a loop that sends and awaits reaches its next send checkpoint before
 * the awaits' due call.) */
static PyObject *restart_schedule(PyObject *module, PyObject *unused) {
    countdown = schedule_every + 1;
    Py_RETURN_NONE;
}

static PyObject *schedule_due(PyObject *module, PyObject *unused) {
    if (check_ready() < 0) return NULL;
    return PyBool_FromLong(due());
}

/* ------------------------------------------------------------------ the ready iterator */

/* What am_await returns on the fast path: an awaitable iterator that is done at
 * once, its return value the RecordMetadata. One spare is kept and reused when
 * nobody else holds it (the common case: the awaiting frame dropped it). */
typedef struct {
    PyObject_HEAD
    PyObject *result; /* NULL once returned */
} ReadyObject;

static PyTypeObject Ready_Type;
static ReadyObject *spare = NULL;

static void ready_dealloc(ReadyObject *self) {
    Py_CLEAR(self->result);
    PyObject_Free(self);
}

static PySendResult ready_am_send(ReadyObject *self, PyObject *arg, PyObject **out) {
    PyObject *r = self->result;
    if (r == NULL) {
        r = Py_None;
        Py_INCREF(r);
    }
    self->result = NULL;
    *out = r;
    return PYGEN_RETURN;
}

/* next() / send(): raise StopIteration(result), as a returning generator does. */
static PyObject *ready_stop(ReadyObject *self) {
    PyObject *r = self->result;
    self->result = NULL;
    return stop_iteration(r);
}

static PyObject *ready_iternext(ReadyObject *self) { return ready_stop(self); }

static PyObject *ready_send(ReadyObject *self, PyObject *arg) { return ready_stop(self); }

/* throw() into an iterator that never yielded (its result is dropped). */
static PyObject *ready_throw(ReadyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs >= 1 && nargs <= 3) Py_CLEAR(self->result);
    return throw_unstarted(args, nargs);
}

static PyObject *ready_close(ReadyObject *self, PyObject *unused) {
    Py_CLEAR(self->result);
    Py_RETURN_NONE;
}

static PyMethodDef ready_methods[] = {
    {"send", (PyCFunction)ready_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))ready_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)ready_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods ready_async = {
    .am_send = (sendfunc)ready_am_send,
};

static PyTypeObject Ready_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.producer._speedups._delivery.Ready",
    .tp_basicsize = sizeof(ReadyObject),
    .tp_dealloc = (destructor)ready_dealloc,
    .tp_as_async = &ready_async,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An awaitable iterator already done: its return value is the RecordMetadata.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)ready_iternext,
    .tp_methods = ready_methods,
};

static PyObject *ready_with(PyObject *result) {
    ReadyObject *r;
    if (spare != NULL && Py_REFCNT(spare) == 1) {
        r = spare;
        Py_INCREF(r);
        Py_XSETREF(r->result, result);
        return (PyObject *)r;
    }
    r = PyObject_New(ReadyObject, &Ready_Type);
    if (r == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    r->result = result;
    if (spare == NULL) {
        Py_INCREF(r);
        spare = r;
    }
    return (PyObject *)r;
}

/* ------------------------------------------------------------------ am_await */

/* An attribute read that remembers, for the first type it sees, the slot offset of
 * the attribute's member descriptor (trio's Task and CancelStatus are attrs classes
 * with __slots__): then the same read as member_get, without the type lookup. Any
 * other type (seen after the first such one), a type with its own __getattribute__, or an attribute that is not a
 * plain slot member: PyObject_GetAttr. */
typedef struct {
    PyObject *name;
    PyTypeObject *type; /* the type the offset belongs to (a strong reference) */
    Py_ssize_t offset;
} CachedAttr;

static CachedAttr cancel_status_attr, effectively_cancelled_attr;

static PyObject *cached_getattr(PyObject *obj, CachedAttr *a) {
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == a->type) {
        PyObject *v = SLOT(obj, a->offset);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    } else if (a->type == NULL) {
        PyObject *descr = tp->tp_getattro == PyObject_GenericGetAttr
                              ? _PyType_Lookup(tp, a->name) : NULL; /* borrowed */
        if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
            ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX) {
            Py_INCREF(tp);
            a->type = tp;
            a->offset = ((PyMemberDescrObject *)descr)->d_member->offset;
        }
    }
    return PyObject_GetAttr(obj, a->name);
}

/* 1 when the current task is cancelled or its cancel status cannot be read (outside
 * a trio run, or a trio without these internals: the public checkpoint_if_cancelled
 * then decides), 0 if not, -1 on another error. */
/* The run context's per-thread attribute dict, as the thread with id rc_thread
 * (PyThreadState_GetID: unique for the interpreter's life, never reused) sees it:
 * trio's GLOBAL_RUN_CONTEXT is a threading.local, whose attribute read costs three
 * dict lookups (~90 ns); one lookup in the thread's own dict gives the same task.
 * Used only when the type cannot answer "task" any other way: the generic (or
 * threading.local's) getattr and no "task" attribute on the type. NULL: not known
 * for the current thread yet (or the context is not such an object). */
static PyObject *rc_dict = NULL;
static uint64_t rc_thread = 0;
#if PY_VERSION_HEX < 0x030C0000
/* The task last read from rc_dict (borrowed: rc_dict holds it as long as its version
 * tag, PEP 509, is the one it had then; trio rewrites the entry at every task step, so
 * a loop of awaits that never yields looks it up once). */
static PyObject *task_seen = NULL;
static uint64_t task_seen_version = 0;
#endif
static getattrofunc local_getattro = NULL; /* _thread._local's tp_getattro */
static PyObject *str_dict;

static PyObject *current_task(void) {
    uint64_t thread = PyThreadState_GetID(PyThreadState_Get());
    if (rc_dict == NULL || thread != rc_thread) {
        Py_CLEAR(rc_dict);
#if PY_VERSION_HEX < 0x030C0000
        task_seen = NULL;
#endif
        PyTypeObject *tp = Py_TYPE(run_context);
        if ((tp->tp_getattro == PyObject_GenericGetAttr ||
             (local_getattro != NULL && tp->tp_getattro == local_getattro)) &&
            _PyType_Lookup(tp, str_task) == NULL) {
            PyObject *d = PyObject_GetAttr(run_context, str_dict);
            if (d == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
                PyErr_Clear();
            } else if (!PyDict_CheckExact(d)) {
                Py_DECREF(d);
            } else {
                rc_dict = d;
                rc_thread = thread;
            }
        }
        if (rc_dict == NULL) return PyObject_GetAttr(run_context, str_task);
    }
#if PY_VERSION_HEX < 0x030C0000
    uint64_t version = ((PyDictObject *)rc_dict)->ma_version_tag;
    if (task_seen != NULL && version == task_seen_version) {
        Py_INCREF(task_seen);
        return task_seen;
    }
#endif
    PyObject *task = PyDict_GetItemWithError(rc_dict, str_task); /* borrowed */
    if (task == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_GetAttr(run_context, str_task); /* (its AttributeError) */
    }
#if PY_VERSION_HEX < 0x030C0000
    task_seen = task;
    task_seen_version = version;
#endif
    Py_INCREF(task);
    return task;
}

static int cancelled(void) {
    PyObject *task = current_task();
    if (task == NULL) goto missing;
    PyObject *status = cached_getattr(task, &cancel_status_attr);
    Py_DECREF(task);
    if (status == NULL) goto missing;
    PyObject *flag = cached_getattr(status, &effectively_cancelled_attr);
    Py_DECREF(status);
    if (flag == NULL) goto missing;
    int r;
    if (flag == Py_False) {
        r = 0;
    } else if (flag == Py_True) {
        r = 1;
    } else {
        r = PyObject_IsTrue(flag);
    }
    Py_DECREF(flag);
    return r;
missing:
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 1;
    }
    return -1;
}

static PyObject *settled_await(PyObject *self) {
    if (check_message(self) < 0) return NULL;
    PyObject *state = SLOT(self, off_state);
    if (state != ok_state) {  /* pending, failed (or unset): the Python path */
        return PyObject_CallOneArg(python_await, self);
    }
    if (due()) return PyObject_CallFunctionObjArgs(settled_checkpoint, self, Py_True, NULL);
    int c = cancelled();
    if (c < 0) return NULL;
    if (c) return PyObject_CallFunctionObjArgs(settled_checkpoint, self, Py_False, NULL);
    PyObject *meta = build_metadata(self);
    if (meta == NULL) return NULL;
    return ready_with(meta);
}

static PyAsyncMethods settled_async = {
    .am_await = (unaryfunc)settled_await,
};

static PyTypeObject SettledAwait_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.producer._speedups._delivery.SettledAwait",
    .tp_basicsize = sizeof(PyObject),
    .tp_as_async = &settled_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Mixin of Delivery: __await__ of a settled message without Python frames.",
};

/* ------------------------------------------------------------------ rows (burst.py) */

/* A row of a columnar send() burst (burst.RowDelivery, whose fields _rows and
 * _row are RowAwait's) is settled when a span of its burst's RowOutcomes.bounds
 * holds the row and that span's run (RowOutcomes.runs) has _state OK; its
 * metadata comes from that run (topic, partition, base offset plus the row's place
 * in the span, LogAppendTime) and the burst's timestamps list. Every
 * read is a slot at an offset setup_rows() looked up; anything unexpected (an
 * unsealed burst, a pending or failed row, a non-list) takes burst.py's Python
 * await. RowDelivery's instances are no GC objects (make_untracked, below): they
 * can be part of no cycle once their burst is settled (burst.py says why), and
 * a loop that keeps 200k of them then costs the collector nothing. call_back_ok()
 * calls a settled run's on_delivery callbacks in one C loop. */

static PyTypeObject *row_type = NULL;         /* burst.RowDelivery */
static PyObject *row_python_await = NULL;     /* burst._row_await_py */
static PyObject *row_settled_checkpoint = NULL;
/* RowDelivery's own fields live in its C base: the burst and the row's index in
 * it (a C integer: no int object per row). */
typedef struct {
    PyObject_HEAD
    PyObject *rows; /* the RowBurst (NULL until set) */
    Py_ssize_t row;
} RowAwaitObject;

#define ROW(d) ((RowAwaitObject *)(d))
static Py_ssize_t off_s_outcomes, off_s_timestamps;      /* RowBurst */
static Py_ssize_t off_o_bounds, off_o_runs, off_o_inverse; /* RowOutcomes */
static Py_ssize_t off_r_state, off_r_topic, off_r_partition, off_r_offset,
    off_r_timestamp;                                     /* RowRun */

static int check_row(PyObject *d) {
    if (row_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pipeline.producer._speedups._delivery.setup_rows() was not called");
        return -1;
    }
    if (!PyObject_TypeCheck(d, row_type)) {
        PyErr_Format(PyExc_TypeError, "expected a %s, got %.200s", row_type->tp_name,
                     Py_TYPE(d)->tp_name);
        return -1;
    }
    return 0;
}

/* The span last found: the rows awaited one after the other are mostly rows of
 * one run, so it is tried first. Only a hint (an index into whatever spans the
 * next lookup reads, checked against them): never a reference. */
static Py_ssize_t span_hint = 0;

/* Span i of a RowOutcomes.bounds (int64 pairs [start, stop), sorted, disjoint). */
static inline void span_at(const char *bounds, Py_ssize_t i, long long *start, long long *stop) {
    memcpy(start, bounds + 16 * i, 8);
    memcpy(stop, bounds + 16 * i + 8, 8);
}

/* The row's settled run (borrowed) and the first row of that run, or NULL without
 * an error when it is not settled OK or anything is not as expected (then the
 * Python path decides). */
static PyObject *row_settled_run(PyObject *d, PyObject **rows_out, Py_ssize_t *row_out,
                                 long long *start_out) {
    PyObject *rows = ROW(d)->rows;
    if (rows == NULL) return NULL;
    PyObject *outcomes = SLOT(rows, off_s_outcomes);
    if (outcomes == NULL || outcomes == Py_None) return NULL;
    PyObject *bounds = SLOT(outcomes, off_o_bounds), *runs = SLOT(outcomes, off_o_runs);
    if (bounds == NULL || !PyByteArray_CheckExact(bounds) || runs == NULL ||
        !PyList_CheckExact(runs))
        return NULL;
    Py_ssize_t n = PyByteArray_GET_SIZE(bounds) / 16;
    if (n != PyList_GET_SIZE(runs)) return NULL;
    const char *b = PyByteArray_AS_STRING(bounds);
    Py_ssize_t row = ROW(d)->row, at = row; /* at: the row's wire position (row_outcomes.py) */
    PyObject *inverse = SLOT(outcomes, off_o_inverse);
    if (inverse == NULL) return NULL;
    if (inverse != Py_None) { /* a keyed burst: at = inverse[row] */
        if (!PyByteArray_CheckExact(inverse) || (row + 1) * 8 > PyByteArray_GET_SIZE(inverse))
            return NULL;
        long long pos;
        memcpy(&pos, PyByteArray_AS_STRING(inverse) + 8 * row, 8);
        /* -1 (not mapped: its run is pending, or settled and not mapped yet) is before
         * every span, so the search below finds none and the Python lookup (which maps
         * the runs recorded since) decides. */
        at = (Py_ssize_t)pos;
    }
    long long start, stop;
    Py_ssize_t i = span_hint;
    if (i < n) span_at(b, i, &start, &stop);
    if (i >= n || at < start || at >= stop) {
        Py_ssize_t lo = 0, hi = n; /* the first span starting after at */
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            span_at(b, mid, &start, &stop);
            if (start <= at) lo = mid + 1;
            else hi = mid;
        }
        if (lo == 0) return NULL; /* pending: before every settled span */
        i = lo - 1;
        span_at(b, i, &start, &stop);
        if (at >= stop) return NULL; /* pending: between settled spans */
        span_hint = i;
    }
    PyObject *run = PyList_GET_ITEM(runs, i);
    if (SLOT(run, off_r_state) != ok_state) return NULL;
    *rows_out = rows;
    *row_out = row;
    /* The row's place in its run is at - start; callers compute it as row - *start_out. */
    *start_out = start + (row - at);
    return run;
}

/* RecordMetadata of row `row` of settled run `run` (burst.row_offset and
 * RowDelivery.timestamp, in C). NULL with an error, or NULL without one when a
 * field is not what it should be (the caller then takes the Python path). */
static PyObject *build_row_metadata(PyObject *rows, Py_ssize_t row, PyObject *run,
                                    long long start) {
    PyObject *topic = SLOT(run, off_r_topic), *partition = SLOT(run, off_r_partition);
    PyObject *base_obj = SLOT(run, off_r_offset), *ts_obj = SLOT(run, off_r_timestamp);
    if (topic == NULL || partition == NULL || base_obj == NULL || ts_obj == NULL ||
        !PyLong_CheckExact(base_obj) || !PyLong_CheckExact(ts_obj))
        return NULL;
    long long base = PyLong_AsLongLong(base_obj);
    if (base == -1 && PyErr_Occurred()) return NULL;
    PyObject *offset, *known, *timestamp;
    if (base >= 0) {
        offset = offset_int(base + row - start);
        known = Py_True;
    } else {
        offset = PyLong_FromLong(-1);
        known = Py_False;
    }
    if (offset == NULL) return NULL;
    long long append_time = PyLong_AsLongLong(ts_obj);
    if (append_time == -1 && PyErr_Occurred()) {
        Py_DECREF(offset);
        return NULL;
    }
    if (append_time >= 0) {
        timestamp = ts_obj;
    } else {
        PyObject *stamps = SLOT(rows, off_s_timestamps);
        if (stamps == NULL || !PyList_CheckExact(stamps) || row >= PyList_GET_SIZE(stamps)) {
            Py_DECREF(offset);
            return NULL;
        }
        timestamp = PyList_GET_ITEM(stamps, row);
    }
    return new_metadata(topic, partition, offset, timestamp, known);
}

static PyObject *row_await(PyObject *self) {
    if (check_row(self) < 0) return NULL;
    PyObject *rows;
    Py_ssize_t row;
    long long start;
    PyObject *run = row_settled_run(self, &rows, &row, &start);
    if (run == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_CallOneArg(row_python_await, self);
    }
    if (due()) return PyObject_CallFunctionObjArgs(row_settled_checkpoint, self, Py_True, NULL);
    int c = cancelled();
    if (c < 0) return NULL;
    if (c) return PyObject_CallFunctionObjArgs(row_settled_checkpoint, self, Py_False, NULL);
    PyObject *meta = build_row_metadata(rows, row, run, start);
    if (meta == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_CallOneArg(row_python_await, self);
    }
    return ready_with(meta);
}

/* row_metadata(delivery) -> RecordMetadata | None: the metadata of a row settled OK
 * (None otherwise), as the fast path builds it (tests compare it with Python's). */
static PyObject *row_metadata(PyObject *module, PyObject *d) {
    if (check_row(d) < 0) return NULL;
    PyObject *rows;
    Py_ssize_t row;
    long long start;
    PyObject *run = row_settled_run(d, &rows, &row, &start);
    if (run == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *meta = build_row_metadata(rows, row, run, start);
    if (meta == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return meta;
}

/* new_row(rows, row) -> RowDelivery (no GC object: make_untracked). */
static PyObject *new_row(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "new_row(rows, row) takes 2 arguments");
        return NULL;
    }
    if (row_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pipeline.producer._speedups._delivery.setup_rows() was not called");
        return NULL;
    }
    Py_ssize_t row = PyLong_AsSsize_t(args[1]);
    if (row == -1 && PyErr_Occurred()) return NULL;
    PyObject *d = row_type->tp_alloc(row_type, 0);
    if (d == NULL) return NULL;
    Py_INCREF(args[0]);
    ROW(d)->rows = args[0];
    ROW(d)->row = row;
    if (PyObject_GC_IsTracked(d)) PyObject_GC_UnTrack(d); /* (a GC class: see make_untracked) */
    return d;
}

/* map_rows(positions, rows, place): positions[rows[k]] = place + k for each k, where
 * positions is a writable int64 buffer (RowOutcomes.inverse, a keyed burst's row ->
 * wire position) and rows an int64 buffer of row indices (a keyed run's rows); each
 * index must be in 0..len(positions)-1 (ValueError, and nothing written past the
 * bad one, otherwise). RowOutcomes.locate's loop in C (~55 ns a row in Python). The
 * Python twin is row_outcomes._map_rows_py. */
static PyObject *map_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "map_rows(positions, rows, place) takes 3 arguments");
        return NULL;
    }
    long long place = PyLong_AsLongLong(args[2]);
    if (place == -1 && PyErr_Occurred()) return NULL;
    Py_buffer out, in;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &in, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *result = NULL;
    if (out.len % 8 || in.len % 8) {
        PyErr_SetString(PyExc_ValueError, "map_rows: positions and rows must be int64 buffers");
        goto done;
    }
    Py_ssize_t size = out.len / 8, n = in.len / 8;
    char *dst = (char *)out.buf;
    const char *src = (const char *)in.buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        long long row, at = place + k;
        memcpy(&row, src + 8 * k, 8);
        if (row < 0 || row >= size) {
            PyErr_Format(PyExc_ValueError, "map_rows: row %lld is outside 0..%zd", row, size - 1);
            goto done;
        }
        memcpy(dst + 8 * row, &at, 8);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return result;
}

/* call_back_ok(fns, topic, partition, base, stamps, append_time, failed): the
 * on_delivery callbacks of the rows of one run settled OK (RowOutcomes.call_back),
 * in row order: fns[i](meta, None) for each row whose callback is not None, meta
 * being row i's RecordMetadata: offset base + i (or -1, unknown, when base < 0),
 * timestamp append_time when >= 0 (the broker's LogAppendTime) else stamps[i].
 * Each meta is built right before its call, so at most one is alive unless a
 * callback keeps it: a run's worth of GC-tracked tuples alive at once made the
 * cyclic GC run (measured: 56 ms of GC per 200k rows, against 8 without callbacks).
 * An Exception from a callback is the user's bug: failed(fn, meta) is called with
 * it as the exception being handled (what `except Exception:` gives: sys.exc_info()
 * and logging's exc_info see it), then the next row still hears. Anything that is
 * not an Exception (KeyboardInterrupt, ...) and an exception from failed()
 * propagate. The Python twin is burst._call_back_ok_py. */
static PyObject *call_back_ok(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (check_ready() < 0) return NULL;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "call_back_ok(fns, topic, partition, base, stamps, "
                                         "append_time, failed) takes 7 arguments");
        return NULL;
    }
    PyObject *fns = args[0], *topic = args[1], *partition = args[2], *stamps = args[4];
    PyObject *failed = args[6];
    if (!PyList_CheckExact(fns) || !PyList_CheckExact(stamps)) {
        PyErr_SetString(PyExc_TypeError, "call_back_ok: fns and stamps must be lists");
        return NULL;
    }
    if (PyList_GET_SIZE(fns) != PyList_GET_SIZE(stamps)) {
        PyErr_Format(PyExc_ValueError, "call_back_ok: %zd callbacks for %zd rows",
                     PyList_GET_SIZE(fns), PyList_GET_SIZE(stamps));
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[3]);
    if (base == -1 && PyErr_Occurred()) return NULL;
    long long append_time = PyLong_AsLongLong(args[5]);
    if (append_time == -1 && PyErr_Occurred()) return NULL;
    PyObject *known = base >= 0 ? Py_True : Py_False;
    /* The metadata of the row before, when no one else holds it (the callback
     * did not keep it): refilled for the next row instead of a new tuple, as zip()
     * refills its result tuple. No one can see the change: only this loop refers
     * to it. Never tracked by the GC: it holds a str, ints and a bool. */
    PyObject *spare_meta = NULL;
    /* (both lists are the caller's fresh slices, which no callback can reach; the
     * sizes are re-read each row all the same) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fns) && i < PyList_GET_SIZE(stamps); i++) {
        PyObject *fn = PyList_GET_ITEM(fns, i);
        if (fn == Py_None) continue;
        PyObject *offset = PyLong_FromLongLong(base >= 0 ? base + i : -1);
        if (offset == NULL) goto fail;
        PyObject *ts = append_time >= 0 ? args[5] : PyList_GET_ITEM(stamps, i);
        PyObject *meta;
        if (spare_meta != NULL && Py_REFCNT(spare_meta) == 1) {
            meta = spare_meta;
            spare_meta = NULL;
            Py_SETREF(PyTuple_GET_ITEM(meta, 2), offset);
            Py_INCREF(ts);
            Py_SETREF(PyTuple_GET_ITEM(meta, 3), ts);
        } else {
            Py_CLEAR(spare_meta);
            meta = new_metadata(topic, partition, offset, ts, known);
            if (meta == NULL) goto fail;
            if (PyObject_GC_IsTracked(meta)) PyObject_GC_UnTrack(meta);
        }
        Py_INCREF(fn);
        PyObject *call_args[2] = {meta, Py_None};
        PyObject *r = PyObject_Vectorcall(fn, call_args, 2, NULL);
        if (r != NULL) {
            Py_DECREF(r);
        } else if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_DECREF(fn);
            Py_DECREF(meta);
            goto fail;
        } else {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL) PyException_SetTraceback(value, tb);
            PyObject *previous = PyErr_GetHandledException();
            PyErr_SetHandledException(value);
            PyObject *fr = PyObject_CallFunctionObjArgs(failed, fn, meta, NULL);
            PyErr_SetHandledException(previous);
            Py_XDECREF(previous);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            if (fr == NULL) {
                Py_DECREF(fn);
                Py_DECREF(meta);
                goto fail;
            }
            Py_DECREF(fr);
        }
        Py_DECREF(fn);
        spare_meta = meta; /* (this loop's reference) */
    }
    Py_XDECREF(spare_meta);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(spare_meta);
    return NULL;
}

static PyAsyncMethods row_async = {
    .am_await = (unaryfunc)row_await,
};

static void row_await_dealloc(PyObject *self) {
    Py_CLEAR(ROW(self)->rows);
    Py_TYPE(self)->tp_free(self);
}

static PyMemberDef row_await_members[] = {
    {"_rows", T_OBJECT_EX, offsetof(RowAwaitObject, rows), 0, "the burst (a RowBurst)"},
    {"_row", T_PYSSIZET, offsetof(RowAwaitObject, row), 0, "the row's index in the burst"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RowAwait_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.producer._speedups._delivery.RowAwait",
    .tp_basicsize = sizeof(RowAwaitObject),
    .tp_dealloc = row_await_dealloc,
    .tp_as_async = &row_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_members = row_await_members,
    .tp_new = PyType_GenericNew, /* (burst.py's twin allocates with RowDelivery.__new__) */
    .tp_doc = "Base of burst.RowDelivery: its two fields, and __await__ of a settled "
              "row without Python frames.",
};

/* RowDelivery (a Python class: a heap type, so CPython makes its instances GC
 * objects) without the cyclic GC: every instance allocated through the GC counts
 * toward a collection until it dies, so a loop keeping 200k deliveries ran ~280
 * extra collections (measured: 40 ms of 200k awaits' 0.85 s), though untracked
 * instances gave each nothing to do. It can be part of no cycle once its burst is
 * settled (burst.RowDelivery says why). Done once, before any instance exists
 * (setup_rows runs at burst.py's import), and only for the layout this relies on:
 * RowAwait's fields and nothing more (no __dict__, no __weakref__, no slots, no
 * finalizer), so subtype_dealloc's non-GC path (RowAwait's dealloc, then the type's
 * reference) frees all an instance holds. Any other layout (a later CPython's, say)
 * stays a GC class, and new_row untracks each instance instead. */
static int make_untracked(PyTypeObject *tp) {
    if (!PyType_IsSubtype(tp, &RowAwait_Type)) {
        PyErr_Format(PyExc_TypeError, "row_type must be a subclass of RowAwait, not %s",
                     tp->tp_name);
        return -1;
    }
    if (!(tp->tp_flags & Py_TPFLAGS_HAVE_GC)) return 0; /* done already */
    if (tp->tp_base != &RowAwait_Type || tp->tp_basicsize != RowAwait_Type.tp_basicsize ||
        tp->tp_itemsize != 0 || tp->tp_dictoffset != 0 || tp->tp_weaklistoffset != 0 ||
        (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) || tp->tp_finalize != NULL ||
        tp->tp_del != NULL || !(tp->tp_flags & Py_TPFLAGS_HEAPTYPE))
        return 0;
    tp->tp_flags &= ~Py_TPFLAGS_HAVE_GC;
    tp->tp_free = PyObject_Free;
    tp->tp_traverse = NULL;
    tp->tp_clear = NULL;
    PyType_Modified(tp);
    return 0;
}

static PyObject *setup_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"row_type", "rows_type", "rows_fields", "outcomes_type",
                             "outcomes_fields", "run_type", "run_fields", "python_await",
                             "settled_checkpoint", NULL};
    PyObject *dt, *st, *sf, *ot, *of, *rt, *rf, *pa, *sc;
    if (check_ready() < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!OO!OO!OOO:setup_rows", kwlist,
                                     &PyType_Type, &dt, &PyType_Type, &st, &sf, &PyType_Type,
                                     &ot, &of, &PyType_Type, &rt, &rf, &pa, &sc))
        return NULL;
    if (!PyCallable_Check(pa) || !PyCallable_Check(sc)) {
        PyErr_SetString(PyExc_TypeError, "python_await and settled_checkpoint must be callable");
        return NULL;
    }
    /* fields.DELIVERY_BURST, DELIVERY_OUTCOMES, DELIVERY_RUN, in their order */
    Py_ssize_t s[2], o[3], r[5];
    if (make_untracked((PyTypeObject *)dt) < 0 ||
        member_offsets((PyTypeObject *)st, sf, 2, s) < 0 ||
        member_offsets((PyTypeObject *)ot, of, 3, o) < 0 ||
        member_offsets((PyTypeObject *)rt, rf, 5, r) < 0)
        return NULL;
    off_s_outcomes = s[0];
    off_s_timestamps = s[1];
    off_o_bounds = o[0];
    off_o_runs = o[1];
    off_o_inverse = o[2];
    off_r_state = r[0];
    off_r_topic = r[1];
    off_r_partition = r[2];
    off_r_offset = r[3];
    off_r_timestamp = r[4];
    Py_INCREF(dt);
    Py_XSETREF(row_type, (PyTypeObject *)dt);
    Py_INCREF(pa);
    Py_XSETREF(row_python_await, pa);
    Py_INCREF(sc);
    Py_XSETREF(row_settled_checkpoint, sc);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ ProducerMessage() */

/* ProducerMessage.__init__ in C: the twin's stores (pipeline/producer/_message.py), at
 * the offsets of fields.MESSAGE_INIT, in that tuple's order: the seven arguments, then
 * the fields every new message starts with. Installed as the class's __init__ (a method
 * descriptor) by install_message_init; the twin stays the definition. */
enum { MI_ARGS = 7, MI_FIELDS = 15 };
static Py_ssize_t mi_off[MI_FIELDS];
static PyObject *mi_names[MI_ARGS]; /* the argument names, interned */
static PyObject *mi_defaults[MI_FIELDS]; /* what fields 7.. start as */
static PyObject *mi_no_headers;
static PyTypeObject *mi_cls; /* the class whose calls message_new takes */

/* message_gc: a ProducerMessage whose every field is atomic leaves the cyclic GC, as
 * CPython's own tuples and dicts of atomic items do. Atomic: not a GC object (str,
 * bytes, int, float, None), or an exact tuple whose items are atomic (to `depth`
 * levels: headers are a tuple of (str, bytes) pairs), which this untracks. Such a
 * message can be in no reference cycle: nothing it refers to can refer to anything.
 * Every store that can break that puts it back: message_init, message_setattro (every
 * attribute store from Python), and the C stores of _send.c (take_messages untracks
 * the headers tuple it writes, whose pairs are plain; settle_messages tracks every
 * message it settles). Users build send_many's lists of such messages: each one a GC
 * object would have the collector walk the whole list every few hundred messages,
 * measured at a sixth of a keyed send_many's CPU. */
static int untrack_atomic(PyObject *x, int depth) {
    if (!PyObject_IS_GC(x)) return 1;
    if (!PyTuple_CheckExact(x) || depth == 0) return 0;
    if (PyObject_GC_IsTracked(x)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(x); i++)
            if (!untrack_atomic(PyTuple_GET_ITEM(x, i), depth - 1)) return 0;
        PyObject_GC_UnTrack(x);
    }
    return 1;
}

static PyObject *message_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    PyObject *v[MI_ARGS] = {NULL, NULL, Py_None, NULL, Py_None, Py_None, Py_None};
    if (nargs > MI_ARGS) {
        PyErr_Format(PyExc_TypeError,
                     "ProducerMessage.__init__() takes from 3 to 8 positional arguments but "
                     "%zd were given", nargs + 1);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) v[i] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        while (i < MI_ARGS && name != mi_names[i]) i++;
        if (i == MI_ARGS) { /* not interned the same: compare the text */
            for (i = 0; i < MI_ARGS; i++) {
                int eq = PyUnicode_Compare(name, mi_names[i]);
                if (eq == -1 && PyErr_Occurred()) return NULL;
                if (eq == 0) break;
            }
        }
        if (i == MI_ARGS) {
            PyErr_Format(PyExc_TypeError,
                         "ProducerMessage.__init__() got an unexpected keyword argument '%S'",
                         name);
            return NULL;
        }
        if (i < nargs) {
            PyErr_Format(PyExc_TypeError,
                         "ProducerMessage.__init__() got multiple values for argument '%S'",
                         name);
            return NULL;
        }
        v[i] = args[nargs + k];
    }
    if (v[0] == NULL || v[1] == NULL) {
        if (v[0] == NULL && v[1] == NULL)
            PyErr_SetString(PyExc_TypeError, "ProducerMessage.__init__() missing 2 required "
                            "positional arguments: 'topic' and 'value'");
        else
            PyErr_Format(PyExc_TypeError, "ProducerMessage.__init__() missing 1 required "
                         "positional argument: '%s'", v[0] == NULL ? "topic" : "value");
        return NULL;
    }
    if (v[3] == NULL || v[3] == Py_None) v[3] = mi_no_headers;
    PyObject *copied = NULL; /* a list of plain pairs, as the twin keeps it: a tuple */
    if (PyList_CheckExact(v[3])) {
        Py_ssize_t n = PyList_GET_SIZE(v[3]), i = 0;
        for (; i < n; i++) {
            PyObject *pair = PyList_GET_ITEM(v[3], i);
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0)) ||
                (PyTuple_GET_ITEM(pair, 1) != Py_None &&
                 !PyBytes_CheckExact(PyTuple_GET_ITEM(pair, 1))))
                break;
        }
        if (i == n) {
            if ((copied = PyList_AsTuple(v[3])) == NULL) return NULL;
            v[3] = copied;
        }
    }
    int atomic = Py_TYPE(self) == mi_cls;
    for (int i = 0; i < MI_FIELDS; i++) {
        PyObject *x = i < MI_ARGS ? v[i] : mi_defaults[i];
        Py_INCREF(x);
        Py_XSETREF(SLOT(self, mi_off[i]), x);
        if (atomic && !untrack_atomic(x, 2)) atomic = 0;
    }
    Py_XDECREF(copied);
    /* Every slot was just written (MESSAGE_INIT is all of them): untracked when each
     * refers to nothing that can refer back (message_gc says why); else tracked (a
     * message untracked before, given a dict of metadata by a second __init__). */
    if (atomic) {
        if (PyObject_GC_IsTracked(self)) PyObject_GC_UnTrack(self);
    } else if (!PyObject_GC_IsTracked(self)) {
        PyObject_GC_Track(self);
    }
    Py_RETURN_NONE;
}

/* ProducerMessage.__setattr__ (the class's tp_setattro): the generic store, then the
 * message back in the cyclic GC when it was out of it and the value could lead back to
 * it (message_gc). */
static int message_setattro(PyObject *self, PyObject *name, PyObject *value) {
    if (PyObject_GenericSetAttr(self, name, value) < 0) return -1;
    if (value != NULL && !PyObject_GC_IsTracked(self) && !untrack_atomic(value, 2))
        PyObject_GC_Track(self);
    return 0;
}


/* ProducerMessage(...) itself (the class's tp_vectorcall): allocate, then message_init,
 * with no argument tuple or dict. Another class (a subclass that inherited the slot)
 * goes the generic way. */
static PyObject *message_new(PyObject *type, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((PyTypeObject *)type != mi_cls) {
        PyObject *tuple = PyTuple_New(nargs);
        if (tuple == NULL) return NULL;
        for (Py_ssize_t i = 0; i < nargs; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(tuple, i, args[i]);
        }
        PyObject *kwargs = NULL;
        Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
        if (nkw) {
            kwargs = PyDict_New();
            for (Py_ssize_t k = 0; kwargs != NULL && k < nkw; k++) {
                if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) < 0)
                    Py_CLEAR(kwargs);
            }
            if (kwargs == NULL) { Py_DECREF(tuple); return NULL; }
        }
        PyObject *out = PyType_Type.tp_call(type, tuple, kwargs);
        Py_DECREF(tuple);
        Py_XDECREF(kwargs);
        return out;
    }
    PyObject *self = mi_cls->tp_alloc(mi_cls, 0);
    if (self == NULL) return NULL;
    PyObject *r = message_init(self, args, nargs, kwnames);
    if (r == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(r);
    return self;
}

static PyMethodDef message_init_def = {
    "__init__", (PyCFunction)(void (*)(void))message_init, METH_FASTCALL | METH_KEYWORDS,
    "__init__($self, /, topic, value, key=None, headers=None, partition=None, "
    "timestamp=None, metadata=None)\n--\n\nProducerMessage.__init__, in C."};

/* install_message_init(cls, fields, defaults): cls.__init__ = the C init; `fields` is
 * fields.MESSAGE_INIT's names, `defaults` what its fields after the seven arguments
 * start as (in order), `()` the headers of a message given none. */
static PyObject *install_message_init(PyObject *module, PyObject *args) {
    PyObject *cls, *names, *defaults;
    if (!PyArg_ParseTuple(args, "O!OO!:install_message_init", &PyType_Type, &cls, &names,
                          &PyTuple_Type, &defaults))
        return NULL;
    if (PyTuple_GET_SIZE(defaults) != MI_FIELDS - MI_ARGS) {
        PyErr_Format(PyExc_TypeError, "defaults: expected %d values", MI_FIELDS - MI_ARGS);
        return NULL;
    }
    if (member_offsets((PyTypeObject *)cls, names, MI_FIELDS, mi_off) < 0) return NULL;
    for (int i = 0; i < MI_FIELDS; i++) {
        PyObject *x = i < MI_ARGS ? PyTuple_GET_ITEM(names, i)
                                  : PyTuple_GET_ITEM(defaults, i - MI_ARGS);
        Py_INCREF(x);
        if (i < MI_ARGS) {
            PyUnicode_InternInPlace(&x);
            Py_XSETREF(mi_names[i], x);
        } else {
            Py_XSETREF(mi_defaults[i], x);
        }
    }
    if (mi_no_headers == NULL && (mi_no_headers = PyTuple_New(0)) == NULL) return NULL;
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, &message_init_def);
    if (descr == NULL) return NULL;
    int rc = PyObject_SetAttrString(cls, "__init__", descr);
    Py_DECREF(descr);
    if (rc < 0) return NULL;
    Py_INCREF(cls);
    Py_XSETREF(mi_cls, (PyTypeObject *)cls);
    mi_cls->tp_vectorcall = message_new;
    mi_cls->tp_setattro = message_setattro;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ setup */

static PyObject *setup(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"message_type", "message_fields", "metadata_type", "python_await",
                             "settled_checkpoint", "run_context", "ok", "schedule_every",
                             NULL};
    PyObject *mt, *mf, *md, *pa, *sc, *rc, *ok;
    long every;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO!OOOOl:setup", kwlist, &PyType_Type, &mt,
                                     &mf, &PyType_Type, &md, &pa, &sc, &rc, &ok, &every))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)md, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "metadata_type must be a tuple subclass");
        return NULL;
    }
    if (!PyCallable_Check(pa) || !PyCallable_Check(sc)) {
        PyErr_SetString(PyExc_TypeError, "python_await and settled_checkpoint must be callable");
        return NULL;
    }
    if (every < 1) {
        PyErr_SetString(PyExc_ValueError, "schedule_every must be >= 1");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)mt;
    Py_ssize_t m[5]; /* fields.DELIVERY_MESSAGE, in its order */
    if (member_offsets(cls, mf, 5, m) < 0) return NULL;
    off_state = m[0];
    off_topic = m[1];
    off_partition = m[2];
    off_offset = m[3];
    off_timestamp = m[4];
    Py_INCREF(mt);
    Py_XSETREF(message_type, cls);
    Py_INCREF(md);
    Py_XSETREF(metadata_type, (PyTypeObject *)md);
    Py_CLEAR(spare_metadata);
    Py_INCREF(pa);
    Py_XSETREF(python_await, pa);
    Py_INCREF(sc);
    Py_XSETREF(settled_checkpoint, sc);
    Py_INCREF(rc);
    Py_XSETREF(run_context, rc);
    Py_CLEAR(rc_dict);
    Py_INCREF(ok);
    Py_XSETREF(ok_state, ok);
    schedule_every = every;
    countdown = every;
    Py_RETURN_NONE;
}

static PyObject *set_run_context(PyObject *module, PyObject *rc) {
    if (check_ready() < 0) return NULL;
    PyObject *old = run_context; /* its reference goes to the caller */
    Py_INCREF(rc);
    run_context = rc;
    Py_CLEAR(rc_dict); /* another context: its dict is found again */
    return old;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(message_type, message_fields, metadata_type, python_await, settled_checkpoint, "
     "run_context, ok, schedule_every): bind the module to the message type (once, at the "
     "import of pipeline.producer._outcomes.delivery)."},
    {"metadata", metadata, METH_O, "metadata(msg) -> RecordMetadata of a ProducerMessage."},
    {"install_message_init", install_message_init, METH_VARARGS,
     "install_message_init(cls, fields, defaults): cls.__init__ = ProducerMessage's init "
     "in C (fields.MESSAGE_INIT's order)."},
    {"schedule_due", schedule_due, METH_NOARGS,
     "True on every schedule_every-th call (one budget for the process)."},
    {"restart_schedule", restart_schedule, METH_NOARGS,
     "A schedule point was just made: the next schedule_every calls are False."},
    {"setup_rows", (PyCFunction)(void (*)(void))setup_rows, METH_VARARGS | METH_KEYWORDS,
     "setup_rows(row_type, rows_type, rows_fields, outcomes_type, outcomes_fields, run_type, "
     "run_fields, python_await, settled_checkpoint): bind the row await to "
     "pipeline.producer._columnar.burst (after setup)."},
    {"row_metadata", row_metadata, METH_O,
     "row_metadata(row_delivery) -> RecordMetadata of a row settled OK, else None."},
    {"map_rows", (PyCFunction)(void (*)(void))map_rows, METH_FASTCALL,
     "map_rows(positions, rows, place): positions[rows[k]] = place + k (int64 buffers)."},
    {"call_back_ok", (PyCFunction)(void (*)(void))call_back_ok, METH_FASTCALL,
     "call_back_ok(fns, topic, partition, base, stamps, append_time, failed): the "
     "on_delivery(meta, None) of each row of a run settled OK; errors go to failed."},
    {"new_row", (PyCFunction)(void (*)(void))new_row, METH_FASTCALL,
     "new_row(rows, row) -> RowDelivery (not a GC object)."},
    {"set_run_context", set_run_context, METH_O,
     "Replace the object the cancellation check reads .task from; returns the old one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pipeline.producer._speedups._delivery",
    "Awaiting a settled Delivery in C (see _delivery.c's header).", -1, methods,
};

PyMODINIT_FUNC PyInit__delivery(void) {
    if (PyType_Ready(&Ready_Type) < 0 || PyType_Ready(&SettledAwait_Type) < 0 ||
        PyType_Ready(&RowAwait_Type) < 0)
        return NULL;
    str_dict = PyUnicode_InternFromString("__dict__");
    if (str_dict == NULL) return NULL;
    PyObject *thread_mod = PyImport_ImportModule("_thread");
    if (thread_mod == NULL) return NULL;
    PyObject *local_type = PyObject_GetAttrString(thread_mod, "_local");
    Py_DECREF(thread_mod);
    if (local_type == NULL) return NULL;
    if (PyType_Check(local_type)) local_getattro = ((PyTypeObject *)local_type)->tp_getattro;
    Py_DECREF(local_type); /* (a static type: the pointer stays valid) */
    str_task = PyUnicode_InternFromString("task");
    str_cancel_status = PyUnicode_InternFromString("_cancel_status");
    str_effectively_cancelled = PyUnicode_InternFromString("effectively_cancelled");
    if (!str_task || !str_cancel_status || !str_effectively_cancelled) return NULL;
    cancel_status_attr.name = str_cancel_status;
    effectively_cancelled_attr.name = str_effectively_cancelled;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &SettledAwait_Type) < 0 || PyModule_AddType(m, &RowAwait_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
