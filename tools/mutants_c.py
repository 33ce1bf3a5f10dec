"""Hand-written mutants of the C send path (``pipeline/producer/_speedups/_send.c``), of the
metadata reuse and the row lookup in ``_delivery.c``, of ``pack_ints`` in
``pipeline/protocol/_kernel.c``, and of the connection's writer thread
(``pipeline/cluster/_writer.c``): ``tools/mutants.py`` mutates Python only.

Each mutant is one textual change of a condition or a value; the extension is rebuilt
in place with the system compiler, the tests that hold the C path to its Python twin
run, and the original is rebuilt at the end (also after a failure). A survivor is
either killed by a new test or explained in ``EQUIVALENT`` (docs/testing.md, "Mutation testing").

    python tools/mutants_c.py [--only N,M]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEEDUPS = ROOT / "pipeline" / "producer" / "_speedups"
PROTOCOL = ROOT / "pipeline" / "protocol"
CLUSTER = ROOT / "pipeline" / "cluster"
HOME = {"_send.c": SPEEDUPS, "_delivery.c": SPEEDUPS, "_kernel.c": PROTOCOL, "_writer.c": CLUSTER}
TESTS = ["tests/producer/test_send_many_rows.py",
         "tests/producer/test_send_extras.py", "tests/producer/test_send_c.py", "tests/producer/test_hot_path.py",
         "tests/scenarios/test_send_rows.py", "tests/producer/test_row_delivery_c.py",
         "tests/scenarios/test_send_rows_memory.py", "tests/protocol/test_columnar_fuzz.py",
         "tests/scenarios/test_send_rows_keyed.py", "tests/producer/test_sync_producer.py",
         "tests/producer/test_speedup_fields.py", "tests/producer/test_message_init.py"]
# A file whose tests are its own (the writer is held to its twin on sockets, not by the producer).
OWN_TESTS = {"_writer.c": ["tests/cluster/test_frame_writer.py"]}

# (file, original text, mutated text)
MUTANTS: list[tuple[str, str, str]] = [
    # SyncProducer's queue (SyncQueue) and pump (Sender.pump)
    ("_send.c", "        if (SLOT(h, off_h_kwargs) != Py_None ||", "        if (0 ||"),
    ("_send.c", "        set_slot(h, off_h_value, Py_NewRef(Py_None));", ""),
    ("_send.c", "    if (self->closed || nargs != 2 ||", "    if (nargs != 2 ||"),
    ("_send.c", "    if (n == 1)\n        r = PyObject_CallNoArgs(self->wake);",
     "    if (n == 2)\n        r = PyObject_CallNoArgs(self->wake);"),
    ("_send.c", "    SLOT(h, off_h_sync) = Py_NewRef(self->sync);",
     "    SLOT(h, off_h_sync) = Py_NewRef(Py_None);"),
    ("_send.c", "    if (PyObject_IS_GC(h) && PyObject_GC_IsTracked(h)) PyObject_GC_UnTrack(h);", ""),
    ("_send.c", "    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) PyObject_GC_UnTrack(obj);",
     ""),
    ("_send.c", "    if (n >= self->max) return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);",
     ""),
    ("_send.c", "until <= 0", "until < 0"),
    ("_send.c", "if (SLOT(intake, off_closing) != Py_False) return NULL;", ""),
    ("_send.c", "(value != Py_None && !PyBytes_CheckExact(value)) || ", ""),
    ("_send.c", " || !PyUnicode_CheckExact(topic))\n        return NULL;", ")\n        return NULL;"),
    ("_send.c", "if (rows_topic != topic && PyUnicode_Compare(topic, rows_topic) != 0) return NULL;",
     ""),
    ("_send.c", "if (rows_topic != topic && PyUnicode_Compare(topic, rows_topic) != 0) return NULL;",
     "if (rows_topic != topic) return NULL;"),
    ("_send.c", "while (z > 0x7F) {", "while (z >= 0x7F) {"),
    ("_send.c", "(n < 0 ? 1 : prefix_size(n) + n)", "(n < 0 ? 0 : prefix_size(n) + n)"),
    ("_send.c", "(n < 0 ? 1 : prefix_size(n) + n)", "(n < 0 ? 1 : 1 + n)"),
    ("_send.c", "(k < 0 ? 1 : prefix_size(k) + k)", "(k < 0 ? 0 : prefix_size(k) + k)"),
    ("_send.c", "(k < 0 ? 1 : prefix_size(k) + k)", "(k < 0 ? 1 : 1 + k)"),
    ("_send.c", "unsigned long long z = (unsigned long long)n << 1;",
     "unsigned long long z = (unsigned long long)n;"),
    ("_send.c", "!ok || size > max_bytes", "!ok || size >= max_bytes"),
    ("_send.c", "!ok || size > max_bytes", "!ok"),
    ("_send.c", "(used + size > buffer_memory && used)", "(used + size > buffer_memory + 1 && used)"),
    ("_send.c", "(used + size > buffer_memory && used)", "(0)"),
    ("_send.c", "PyLong_FromLongLong(next_id + 1)", "PyLong_FromLongLong(next_id)"),
    ("_send.c", "PyLong_FromLongLong(used + size)", "PyLong_FromLongLong(used)"),
    ("_send.c", "if (PyList_Append(fns, fn) < 0) goto fail;", ""),
    ("_send.c", "    } else if (fn != Py_None) {", "    } else if (0) {"),
    ("_send.c", "filled_then(before, Py_None, fn, 0)", "filled_then(before, Py_None, Py_None, 0)"),
    ("_send.c", "now < PyFloat_AS_DOUBLE(ends_now))", "now <= PyFloat_AS_DOUBLE(ends_now))"),
    ("_send.c", "now < PyFloat_AS_DOUBLE(ends_now))", "0)"),
    ("_send.c", "(double)(ms + 1) / 1000", "(double)(ms + 2) / 1000"),
    ("_send.c", "if (clock == wall_time)", "if (1)"),
    ("_send.c", "if (clock == wall_time)", "if (0)"),
    ("_send.c", "    } else if (!wall) { /* an injected clock", "    } else if (0) { /* an injected clock"),
    ("_send.c", "PyLong_FromLongLong(rows_size + size)", "PyLong_FromLongLong(rows_size)"),
    ("_send.c", "PyObject *u = PyLong_FromLongLong(until)", "PyObject *u = PyLong_FromLongLong(until + 1)"),
    ("_send.c", "if (PyVectorcall_NARGS(nargsf) != 2) return", "if (0) return"),
    ("_send.c", "(j == KW_KEY && v != Py_None && !PyBytes_CheckExact(v) &&", "(0 &&"),
    ("_send.c", "(j == KW_ON_DELIVERY && v != Py_None && !PyCallable_Check(v))", "(0)"),
    ("_send.c", "            given |= self->kw[j] != Py_None;\n", ""),
    ("_send.c", "return name == want || (PyUnicode_CheckExact(name) && PyUnicode_Compare(name, want) == 0);",
     "return name == want;"),
    ("_send.c", "args[2 + j] = self->kw[j];", "args[2 + j] = Py_None;"),
    ("_send.c", "PyUnicode_CheckExact(value) ? PyUnicode_AsUTF8String(value) : Py_NewRef(value);\n"
     "        key = value == NULL",
     "Py_NewRef(value);\n        key = value == NULL"),
    ("_send.c", "PyUnicode_CheckExact(key) ? PyUnicode_AsUTF8String(key) : Py_NewRef(key)",
     "Py_NewRef(key)"),
    ("_send.c", "!PyBytes_CheckExact(v) &&\n                          !PyUnicode_CheckExact(v))",
     "!PyBytes_CheckExact(v))"),
    ("_send.c", "if (PyList_Append(keys, key) < 0) goto fail;", ""),
    ("_send.c", "} else if (key != Py_None) { /* the burst's first key", "} else if (0) { /* the burst's first key"),
    ("_send.c", "filled_then(before, Py_None, key, 1);", "filled_then(before, Py_None, Py_None, 1);"),
    ("_send.c", "PyList_New(before + 1);", "PyList_New(before + 2);"),
    ("_send.c", "filled_then(before, Py_None, key, 1); /* bytes and None only",
     "filled_then(before, Py_None, key, 0); /* bytes and None only"),
    ("_send.c", "if (arg != Py_None) {", "if (0) {"),
    ("_send.c", "    if (self->sender != NULL &&\n        PyErr_WarnEx", "    if (0 &&\n        PyErr_WarnEx"),
    ("_send.c", "if (r != PYGEN_NEXT) Py_CLEAR(self->coro);", ""),
    ("_send.c", "            stamp = ms_now;\n            Py_INCREF(stamp);",
     "            stamp = PyLong_FromLongLong(PyLong_AsLongLong(ms_now));"),
    ("_send.c", "    if (list != NULL) PyObject_GC_UnTrack(list);", ""),
    ("_delivery.c", "r != NULL && Py_REFCNT(r) == 1 && Py_IS_TYPE", "r != NULL && Py_REFCNT(r) >= 1 && Py_IS_TYPE"),
    ("_delivery.c", "Py_REFCNT(o) == 1 && Py_SIZE(o) == 1", "Py_SIZE(o) == 1"),
    ("_delivery.c", "Py_REFCNT(o) == 1 && Py_SIZE(o) == 1", "Py_REFCNT(o) == 1"),
    ("_delivery.c", "v > 256 && v < ((long long)1 << PyLong_SHIFT) &&", "v > 256 &&"),
    ("_delivery.c", "v > 256 && v < ((long long)1 << PyLong_SHIFT) &&",
     "v > 0 && v < ((long long)1 << PyLong_SHIFT) &&"),
    ("_delivery.c", "r != NULL && Py_REFCNT(r) == 1 &&\n        Py_IS_TYPE(r, metadata_type)",
     "r != NULL &&\n        Py_IS_TYPE(r, metadata_type)"),
    ("_delivery.c", "task_seen != NULL && version == task_seen_version", "task_seen != NULL"),
    # the span lookup (RowOutcomes.bounds): the hint, the search, the gap, the start
    ("_delivery.c", "if (i >= n || at < start || at >= stop) {",
     "if (i >= n || at < start || at > stop) {"),
    ("_delivery.c", "if (start <= at) lo = mid + 1;", "if (start < at) lo = mid + 1;"),
    ("_delivery.c", "if (at >= stop) return NULL; /* pending: between",
     "if (at > stop) return NULL; /* pending: between"),
    ("_delivery.c", "*start_out = start + (row - at);", "*start_out = 0;"),
    # a keyed burst's row -> wire position (RowOutcomes.inverse)
    ("_delivery.c", "*start_out = start + (row - at);", "*start_out = start;"),
    ("_delivery.c", "    if (inverse != Py_None) { /* a keyed burst", "    if (0) { /* a keyed burst"),
    ("_delivery.c", "(row + 1) * 8 > PyByteArray_GET_SIZE(inverse)", "0"),
    ("_delivery.c", "if (row < 0 || row >= size) {", "if (row < 0 || row > size) {"),
    ("_delivery.c", "if (row < 0 || row >= size) {", "if (row >= size) {"),
    ("_delivery.c", "long long row, at = place + k;", "long long row, at = place;"),
    ("_delivery.c", "if (out.len % 8 || in.len % 8) {", "if (0) {"),
    # pack_ints: what counts as an int in range
    ("_kernel.c", "if (!PyLong_CheckExact(it)) goto other;", "if (!PyLong_Check(it)) goto other;"),
    ("_kernel.c", "if (overflow || v < 0 || v > top) goto other;",
     "if (overflow || v > top) goto other;"),
    ("_kernel.c", "if (overflow || v < 0 || v > top) goto other;",
     "if (overflow || v < 0 || v >= top) goto other;"),
    ("_kernel.c", "long long top = wide ? INT64_MAX : INT32_MAX;",
     "long long top = INT64_MAX;"),
    # send()'s extras in C: headers, partition, timestamp, metadata (RowBurst.add_extras)
    ("_send.c", "if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) return 0;",
     "if (!PyTuple_CheckExact(pair)) return 0;"),
    ("_send.c", "if (!PyUnicode_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v))) return 0;",
     "if (!PyUnicode_CheckExact(k)) return 0;"),
    ("_send.c", "*size = total + (h ? prefix_size(h) - 1 : 0);", "*size = total;"),
    ("_send.c", "total += prefix_size(klen) + klen;", "total += 1 + klen;"),
    ("_send.c", "total += prefix_size(vlen) + vlen;", "total += 1 + vlen;"),
    ("_send.c", "        if (v == Py_None) {\n            total += 1;", "        if (v == Py_None) {\n            total += 0;"),
    ("_send.c", "    if (plain < 0) { /* many headers", "    if (0) { /* many headers"),
    ("_send.c", "plain_int(partition_obj, INT32_MAX)", "plain_int(partition_obj, INT64_MAX)"),
    ("_send.c", "plain_int(timestamp, INT64_MAX) < 0", "plain_int(timestamp, INT32_MAX) < 0"),
    ("_send.c", "if (!PyLong_CheckExact(v)) return -1;", "if (!PyLong_Check(v)) return -1;"),
    ("_send.c", "return x < 0 || x > top ? -1 : x;", "return x < 0 || x >= top ? -1 : x;"),
    ("_send.c", "        if (PyList_Append(ends, PyList_GET_ITEM(ends, PyList_GET_SIZE(ends) - 1)) < 0) return -1;\n",
     ""),
    ("_send.c", "    } else if (partition >= 0) {", "    } else if (0) {"),
    ("_send.c", "    } else if (md != Py_None) { /* (any object", "    } else if (0) { /* (any object"),
    ("_send.c", "(extras == Py_True || h || partition >= 0 || md != Py_None)",
     "(h || partition >= 0 || md != Py_None)"),
    ("_send.c", "    if (timestamp != Py_None) { /* the row's own */", "    if (0) { /* the row's own */"),
    ("_send.c", "md == Py_None ? str_new_row", "1 ? str_new_row"),
    # send_many's messages as rows: take_messages, accept_messages, settle_messages
    ("_send.c", "        if (Py_TYPE(msg) != message_type) goto plain_none;", ""),
    ("_send.c", "        if (t != topic) {", "        if (0) {"),
    ("_send.c", "            if (eq != 0) goto plain_none;", ""),
    ("_send.c", "    *size = n + prefix_size(n);", "    *size = n + 1;"),
    ("_send.c", "    if (v == Py_None) {\n        *size = 1;", "    if (v == Py_None) {\n        *size = 0;"),
    ("_send.c", "long long size = message_size_base + vsize + ksize;",
     "long long size = message_size_base + vsize;"),
    ("_send.c", "        set_slot(msg, off, b);", ""),
    ("_send.c", "            size += hsize;", ""),
    ("_send.c", "            any_headers = 1;", ""),
    ("_send.c", "        if (truthy) {", "        if (0) {"),
    ("_send.c", "            set_slot(msg, off_m_headers, tuple);", "            Py_DECREF(tuple);"),
    ("_send.c", "        if (key != Py_None) any_key = 1;", ""),
    ("_send.c", "            any_partition = 1;", ""),
    ("_send.c", "if (plain_int(p, MAX_PARTITION) < 0) goto plain_none;",
     "if (plain_int(p, MAX_TIMESTAMP) < 0) goto plain_none;"),
    ("_send.c", "} else if (plain_int(ts, MAX_TIMESTAMP) < 0) {",
     "} else if (plain_int(ts, MAX_PARTITION) < 0) {"),
    ("_send.c", "            set_slot(msg, off_m_timestamp, Py_NewRef(now));", ""),
    ("_send.c", "        if (size > max_bytes) goto plain_none;", "        if (size >= max_bytes) goto plain_none;"),
    ("_send.c", "PyLong_FromLongLong(first ? first + i : 0)", "PyLong_FromLongLong(first + i)"),
    ("_send.c", "PyObject *off = base >= 0 ? PyLong_FromLongLong(base + k)",
     "PyObject *off = base > 0 ? PyLong_FromLongLong(base + k)"),
    ("_send.c", "PyObject *off = base >= 0 ? PyLong_FromLongLong(base + k)",
     "PyObject *off = base >= 0 ? PyLong_FromLongLong(base + k + 1)"),
    ("_send.c", "            set_slot(msg, off_m_partition, Py_NewRef(partition));\n", ""),
    ("_send.c", "            if (stamp != NULL) set_slot(msg, off_m_timestamp, Py_NewRef(stamp));", ""),
    ("_send.c", "            if (partition != Py_None) set_slot(msg, off_m_partition, Py_NewRef(partition));",
     "            set_slot(msg, off_m_partition, Py_NewRef(partition));"),
    ("_send.c", "            set_slot(msg, off_m_outcome, Py_NewRef(outcome));", ""),
    ("_send.c", "            if (index[k] < 0 || index[k] >= n) {", "            if (index[k] < 0 || index[k] > n) {"),
    ("_send.c", "        if (first) set_slot(PyList_GET_ITEM(msgs, i), off_m_deadline, Py_NewRef(args[2]));",
     ""),
    ("_send.c", "        if (step != 1 || start < 0 || stop > n) {", "        if (start < 0 || stop > n) {"),
    ("_send.c", "        first = start;", ""),
    # Sender.pump: a queued str value is sent as UTF-8, as SyncProducer.send's twin does
    ("_send.c", "PyUnicode_CheckExact(value) ? PyUnicode_AsUTF8String(value) : Py_NewRef(value);\n"
     "        if (value == NULL) {",
     "Py_NewRef(value);\n        if (value == NULL) {"),
    # ProducerMessage(...) in C (message_new / message_init)
    ("_delivery.c", "if (v[3] == NULL || v[3] == Py_None) v[3] = mi_no_headers;",
     "if (v[3] == NULL) v[3] = mi_no_headers;"),
    ("_delivery.c", "        if (i < nargs) {", "        if (0) {"),
    ("_delivery.c", "    if ((PyTypeObject *)type != mi_cls) {", "    if (0) {"),
    ("_delivery.c", "PyObject *x = i < MI_ARGS ? v[i] : mi_defaults[i];",
     "PyObject *x = i < MI_ARGS ? v[i] : Py_None;"),
    ("_delivery.c", "if (v[0] == NULL && v[1] == NULL)", "if (v[0] == NULL || v[1] == NULL)"),
    ("_delivery.c", "v[0] == NULL ? \"topic\" : \"value\"", "v[0] == NULL ? \"value\" : \"topic\""),
    ("_delivery.c", "        if (i == MI_ARGS) {\n            PyErr_Format", "        if (0) {\n            PyErr_Format"),
    # messages out of the cyclic GC: at birth when atomic, in flight, back when settled
    ("_send.c", "            if (PyObject_GC_IsTracked(msg)) PyObject_GC_UnTrack(msg);\n", ""),
    ("_send.c", "        } else if (!PyObject_GC_IsTracked(msg)) {\n            PyObject_GC_Track(msg);",
     "        } else if (0) {\n            PyObject_GC_Track(msg);"),
    ("_send.c", "        if (!PyObject_GC_IsTracked(msg)) PyObject_GC_Track(msg); /* (accept_messages) */", ""),
    ("_send.c", "            PyObject_GC_UnTrack(tuple);\n", ""),
    ("_delivery.c", "        if (atomic && !untrack_atomic(x, 2)) atomic = 0;", ""),
    ("_delivery.c", "        if (PyObject_GC_IsTracked(self)) PyObject_GC_UnTrack(self);\n", ""),
    ("_delivery.c", "    } else if (!PyObject_GC_IsTracked(self)) {\n        PyObject_GC_Track(self);",
     "    } else if (0) {\n        PyObject_GC_Track(self);"),
    ("_delivery.c", "!untrack_atomic(value, 2))\n        PyObject_GC_Track(self);",
     "!untrack_atomic(value, 2))\n        ;"),
    ("_delivery.c", "    mi_cls->tp_setattro = message_setattro;\n", ""),
    ("_delivery.c", "        if (i == n) {\n            if ((copied", "        if (0) {\n            if ((copied"),
    ("_delivery.c", "                (PyTuple_GET_ITEM(pair, 1) != Py_None &&\n", "                (1 &&\n"),
    ("_delivery.c", "    int atomic = Py_TYPE(self) == mi_cls;", "    int atomic = 1;"),
    ("_delivery.c", "    if (!PyTuple_CheckExact(x) || depth == 0) return 0;",
     "    if (!PyTuple_CheckExact(x)) return 0;"),
    ("_delivery.c", "            if (!untrack_atomic(PyTuple_GET_ITEM(x, i), depth - 1)) return 0;", ""),
    # the connection's writer: the kernel first, then its thread, in order, until closed
    ("_writer.c", "    int idle = w->head == NULL;", "    int idle = 1;"),
    ("_writer.c", "        if (f->left == 0) {\n            free_frames(f);",
     "        if (0) {\n            free_frames(f);"),
    ("_writer.c", "        if (sent >= rest) {", "        if (sent > rest) {"),
    ("_writer.c", "        Py_ssize_t skip = i == f->part ? f->offset : 0;",
     "        Py_ssize_t skip = 0;"),
    ("_writer.c", "        w->completed = f->seq;\n", ""),
    ("_writer.c", "        w->completed = f->seq;\n        signal_done(w);", "        w->completed = f->seq;"),
    ("_writer.c", "            if (err != ECANCELED) w->error = err;", ""),
    ("_writer.c", "        w->queued_bytes -= before - f->left;", ""),
    ("_writer.c", "    if (err) return raise_errno(err);\n    Py_RETURN_NONE;", "    Py_RETURN_NONE;"),
    ("_writer.c", "    if (w->closed) return raise_errno(EBADF);\n    if (!PyList_CheckExact(parts))",
     "    if (!PyList_CheckExact(parts))"),
    # send()'s schedule point restarts the settled awaits' budget (restart_schedule)
    ("_delivery.c", "    countdown = schedule_every + 1;", "    countdown = schedule_every;"),
    ("_delivery.c", "    countdown = schedule_every + 1;\n    Py_RETURN_NONE;", "    Py_RETURN_NONE;"),
]


# index -> why the mutant cannot be told apart by any test (docs/testing.md, "Mutation testing")
EQUIVALENT = {
    25: "time.time called through its object gives the same double the direct "
        "_PyTime_GetSystemClock read gives (that read only saves the call)",
    45: "a finished coroutine kept until its SendCall is freed: awaiting again raises "
        "RuntimeError('cannot reuse already awaited ...') either way, from the coroutine "
        "instead of from SendCall",
    61: "a bound check for memory safety only: RowOutcomes sizes inverse to the burst's "
        "rows when it is sealed, and a RowDelivery's row is below that count, so the "
        "read is always in bounds",
    147: "a part written exactly to its end stays the current one, its offset at its "
         "length: send_once then skips it (a zero-length rest) and the next count moves "
         "past it, so the same bytes go out in the same calls",
    126: "a type's tp_vectorcall is never inherited (CPython's documented rule), so "
         "message_new is only ever called for ProducerMessage itself; the generic "
         "fallback guards a future CPython that would",
}


def build(file: str) -> None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    src = HOME[file] / file
    out = HOME[file] / (src.stem + suffix)
    include = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", f"-I{include}", f"-I{SPEEDUPS}", str(src),
                    "-o", str(out)], check=True, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutant indices")
    args = parser.parse_args()
    only = {int(i) for i in args.only.split(",")} if args.only else None
    originals = {f: (HOME[f] / f).read_text() for f in {m[0] for m in MUTANTS}}
    survivors = []
    try:
        for i, (file, old, new) in enumerate(MUTANTS):
            if only is not None and i not in only:
                continue
            source = originals[file]
            if source.count(old) != 1:
                print(f"{i:3d} {file}: pattern not found once: {old!r}")
                return 2
            (HOME[file] / file).write_text(source.replace(old, new))
            build(file)
            result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly",
                                     "-p", "no:cacheprovider", *OWN_TESTS.get(file, TESTS)],
                                    cwd=ROOT,
                                    capture_output=True, text=True, timeout=900)
            (HOME[file] / file).write_text(source)
            build(file)
            verdict = "killed" if result.returncode else (
                "equivalent" if i in EQUIVALENT else "SURVIVED")
            if verdict == "SURVIVED":
                survivors.append(i)
            print(f"{i:3d} {verdict:10s} {file}: {old.strip()[:60]!r} -> {new.strip()[:40]!r}",
                  flush=True)
    finally:
        for file, source in originals.items():
            (HOME[file] / file).write_text(source)
            build(file)
    print(f"{len(survivors)} survived: {survivors}" if survivors else "no survivor")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
