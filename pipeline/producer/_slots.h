/* Reading and writing Python objects' __slots__ from C, shared by _delivery.c and _send.c.
 *
 * A class's __slots__ member descriptor knows where its object pointer lives in an
 * instance: member_offset() finds it once (at setup), SLOT() then reads or writes the
 * field in one load, without the attribute lookup. Only plain object slots qualify (the
 * ones __slots__ makes, T_OBJECT_EX: NULL while unset). */
#ifndef PIPELINE_PRODUCER_SLOTS_H
#define PIPELINE_PRODUCER_SLOTS_H

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

#endif
