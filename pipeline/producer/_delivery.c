/* pipeline.producer._delivery: awaiting a settled Delivery without Python frames.
 *
 * `await delivery` on a message that is already settled OK is the per-message
 * path of a loop that keeps every Delivery and awaits each (issue 15 goal 1). In
 * Python it costs a generator, a NamedTuple built by tuple.__new__ and three
 * attribute reads for the cancellation check (~1.26 us). Here:
 *
 *   SettledAwait  a mixin type with no instance fields (so it is layout-compatible
 *                 with ProducerMessage's __slots__; Delivery inherits from both).
 *                 Its am_await, when the message is OK, no schedule point is due and
 *                 the task is not cancelled, returns a tiny iterator whose first
 *                 am_send / tp_iternext returns the RecordMetadata at once. In every
 *                 other case it returns what pipeline/producer/message.py gives it
 *                 at setup(): the Python __await__ (pending -> park, failed ->
 *                 checkpoint + raise) or the settled-but-checkpoint generator (a
 *                 schedule point is due: full checkpoint; cancelled, or the cancel
 *                 status cannot be read: checkpoint_if_cancelled).
 *   metadata(msg) RecordMetadata(topic, partition, offset, timestamp, offset >= 0)
 *                 built by tp_alloc of the NamedTuple class.
 *   schedule_due() the process-wide schedule budget: True on every `every`-th call.
 *                 message.py uses this very function when the module is loaded, so
 *                 the C and the Python path share one budget.
 *
 * Slots are read at the offsets of ProducerMessage's member descriptors, found
 * once by setup(); every entry point first checks that its argument is an
 * instance of that class. pipeline/producer/message.py holds the pure-Python
 * twin of all of it (used when this module is not built or PIPELINE_PURE_PYTHON
 * is set); tests run both and compare.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* ------------------------------------------------------------------ state */

static PyTypeObject *message_type = NULL;   /* ProducerMessage */
static PyTypeObject *metadata_type = NULL;  /* RecordMetadata (a tuple subclass) */
static PyObject *python_await = NULL;       /* message.py's Python __await__ (a function) */
static PyObject *settled_checkpoint = NULL; /* f(msg, full: bool) -> generator */
static PyObject *run_context = NULL;        /* trio's GLOBAL_RUN_CONTEXT, or anything */
static PyObject *ok_state = NULL;           /* the int OK */
static Py_ssize_t off_state, off_topic, off_partition, off_offset, off_timestamp;
static long schedule_every = 0;
static long countdown = 0;

static PyObject *str_task, *str_cancel_status, *str_effectively_cancelled;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int member_offset(PyTypeObject *cls, const char *name, Py_ssize_t *out) {
    PyObject *descr = PyDict_GetItemString(cls->tp_dict, name); /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", cls->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", cls->tp_name, name);
        return -1;
    }
    *out = m->offset;
    return 0;
}

static int check_ready(void) {
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pipeline.producer._delivery.setup() was not called");
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
    PyObject *r = metadata_type->tp_alloc(metadata_type, 5);
    if (r == NULL) {
        Py_DECREF(known);
        return NULL;
    }
    Py_INCREF(topic);
    PyTuple_SET_ITEM(r, 0, topic);
    Py_INCREF(partition);
    PyTuple_SET_ITEM(r, 1, partition);
    Py_INCREF(offset);
    PyTuple_SET_ITEM(r, 2, offset);
    Py_INCREF(timestamp);
    PyTuple_SET_ITEM(r, 3, timestamp);
    PyTuple_SET_ITEM(r, 4, known);
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
    if (r == NULL) {
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    PyObject *exc = PyObject_CallOneArg(PyExc_StopIteration, r);
    Py_DECREF(r);
    if (exc == NULL) return NULL;
    PyErr_SetObject(PyExc_StopIteration, exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *ready_iternext(ReadyObject *self) { return ready_stop(self); }

static PyObject *ready_send(ReadyObject *self, PyObject *arg) { return ready_stop(self); }

/* throw() into an iterator that never yielded: the exception comes straight back,
 * as from a generator that has not started (its result is dropped). */
static PyObject *ready_throw(ReadyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    Py_CLEAR(self->result);
    PyObject *typ = args[0];
    PyObject *val = nargs > 1 ? args[1] : Py_None;
    if (PyExceptionInstance_Check(typ)) {
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    } else if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, val == Py_None ? NULL : val);
    } else {
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    }
    return NULL;
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
    .tp_name = "pipeline.producer._delivery.Ready",
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
static int cancelled(void) {
    PyObject *task = PyObject_GetAttr(run_context, str_task);
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
    .tp_name = "pipeline.producer._delivery.SettledAwait",
    .tp_basicsize = sizeof(PyObject),
    .tp_as_async = &settled_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Mixin of Delivery: __await__ of a settled message without Python frames.",
};

/* ------------------------------------------------------------------ setup */

static PyObject *setup(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"message_type", "metadata_type", "python_await",
                             "settled_checkpoint", "run_context", "ok", "schedule_every",
                             NULL};
    PyObject *mt, *md, *pa, *sc, *rc, *ok;
    long every;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!OOOOl:setup", kwlist, &PyType_Type, &mt,
                                     &PyType_Type, &md, &pa, &sc, &rc, &ok, &every))
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
    Py_ssize_t st, tp, pt, of, ts;
    if (member_offset(cls, "_state", &st) < 0 || member_offset(cls, "topic", &tp) < 0 ||
        member_offset(cls, "partition", &pt) < 0 || member_offset(cls, "offset", &of) < 0 ||
        member_offset(cls, "timestamp", &ts) < 0)
        return NULL;
    off_state = st;
    off_topic = tp;
    off_partition = pt;
    off_offset = of;
    off_timestamp = ts;
    Py_INCREF(mt);
    Py_XSETREF(message_type, cls);
    Py_INCREF(md);
    Py_XSETREF(metadata_type, (PyTypeObject *)md);
    Py_INCREF(pa);
    Py_XSETREF(python_await, pa);
    Py_INCREF(sc);
    Py_XSETREF(settled_checkpoint, sc);
    Py_INCREF(rc);
    Py_XSETREF(run_context, rc);
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
    return old;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(message_type, metadata_type, python_await, settled_checkpoint, run_context, ok, "
     "schedule_every): bind the module to pipeline.producer.message (once, at its import)."},
    {"metadata", metadata, METH_O, "metadata(msg) -> RecordMetadata of a ProducerMessage."},
    {"schedule_due", schedule_due, METH_NOARGS,
     "True on every schedule_every-th call (one budget for the process)."},
    {"set_run_context", set_run_context, METH_O,
     "Replace the object the cancellation check reads .task from; returns the old one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pipeline.producer._delivery",
    "Awaiting a settled Delivery in C (see _delivery.c's header).", -1, methods,
};

PyMODINIT_FUNC PyInit__delivery(void) {
    if (PyType_Ready(&Ready_Type) < 0 || PyType_Ready(&SettledAwait_Type) < 0) return NULL;
    str_task = PyUnicode_InternFromString("task");
    str_cancel_status = PyUnicode_InternFromString("_cancel_status");
    str_effectively_cancelled = PyUnicode_InternFromString("effectively_cancelled");
    if (!str_task || !str_cancel_status || !str_effectively_cancelled) return NULL;
    cancel_status_attr.name = str_cancel_status;
    effectively_cancelled_attr.name = str_effectively_cancelled;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&SettledAwait_Type);
    if (PyModule_AddObject(m, "SettledAwait", (PyObject *)&SettledAwait_Type) < 0) {
        Py_DECREF(&SettledAwait_Type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
