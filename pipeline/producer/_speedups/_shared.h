/* What _delivery.c and _send.c share: slot access, and two behaviours of an awaitable
 * iterator written in C (returning a value, being thrown into before its first step).
 *
 * A class's __slots__ member descriptor knows where its object pointer lives in an
 * instance: member_offset() finds it once (at setup), SLOT() then reads or writes the
 * field in one load, without the attribute lookup. Only plain object slots qualify (the
 * ones __slots__ makes, T_OBJECT_EX: NULL while unset). */
#ifndef PIPELINE_PRODUCER_SHARED_H
#define PIPELINE_PRODUCER_SHARED_H

#include <Python.h>
#include <structmember.h>

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

/* The offsets of the slots named by `fields` (a tuple of str, from
 * pipeline/producer/_speedups/fields.py) of `cls`, in the tuple's order: the caller's
 * field order is the tuple's, so no field name is spelled in C. `n`: how many fields the
 * caller's code uses (a tuple of another length is refused). */
static int member_offsets(PyTypeObject *cls, PyObject *fields, Py_ssize_t n, Py_ssize_t *out) {
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != n) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tuple of %zd field names (fields.py)",
                     cls->tp_name, n);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(fields, k));
        if (name == NULL || member_offset(cls, name, &out[k]) < 0) return -1;
    }
    return 0;
}

/* Raise StopIteration(value), as a generator returning `value` does (value stolen;
 * NULL: a bare StopIteration, a return of None). Always returns NULL. */
static PyObject *stop_iteration(PyObject *value) {
    if (value == NULL) {
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    PyObject *exc = PyObject_CallOneArg(PyExc_StopIteration, value);
    Py_DECREF(value);
    if (exc != NULL) {
        PyErr_SetObject(PyExc_StopIteration, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* throw(typ[, val[, tb]]) into an iterator that has not started: the exception comes
 * straight back, as from a generator that has not started. Always returns NULL. */
static PyObject *throw_unstarted(PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : Py_None;
    if (PyExceptionInstance_Check(typ)) {
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    } else if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, val == Py_None ? NULL : val);
    } else {
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    }
    return NULL;
}

#endif
