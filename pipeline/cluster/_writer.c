/* pipeline.cluster._writer: a connection's frames written off the event loop.
 *
 * Writer(fd) writes frames (each a list of buffers) to the socket `fd` whole and in
 * submit order. write() offers a frame to the kernel at once (a nonblocking sendmsg,
 * the GIL held) when nothing is queued before it, and queues what the kernel did not
 * take for the writer thread. The thread waits for the socket to take more (poll) and
 * writes it without the GIL.
 *
 * Why: a broker reads a connection's next request only after it answered the one
 * before (Kafka mutes the channel meanwhile), and the kernel holds ~200 KB of a
 * request it has not read. Written by the event loop, the rest of a request waits
 * for the loop's next turn, and a caller that runs for tens of ms between two
 * awaits (building 10,000 messages) leaves the broker idle that long. Written by
 * this thread, the broker reads every queued request as soon as it can: librdkafka's
 * broker threads give it the same.
 *
 * The thread never touches a Python object and never takes the GIL: a frame's buffers
 * are exported (PyObject_GetBuffer) by write() and released by reap() or close(), both
 * called with the GIL. The pure-Python twin is trio's own write of the same frames
 * (pipeline/cluster/transport.py, send_parts): the bytes on the wire are the same.
 *
 * Shared state, under `mu`: the queue (head..tail; the thread writes the head frame
 * with `mu` released, and nobody else reads or changes that frame meanwhile), the
 * written list (frames whose buffers wait for reap), the counts and `error`. The
 * thread tells the loop of progress by a byte on the `done` pipe, which the loop
 * waits for with trio.lowlevel.wait_readable (done_fd); close() wakes a thread that
 * waits in poll() by a byte on the `wake` pipe. POSIX only (poll, pthreads, pipes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* (macOS: SIGPIPE is ignored by Python at startup) */
#endif

/* Buffers per sendmsg call: the POSIX minimum of IOV_MAX. */
#define IOV_CHUNK 16

typedef struct Frame {
    struct Frame *next;
    unsigned long long seq;
    Py_ssize_t nparts;
    Py_ssize_t part;   /* the first part not wholly written */
    Py_ssize_t offset; /* bytes of `part` written */
    Py_ssize_t left;   /* bytes not written */
    Py_buffer views[];
} Frame;

typedef struct {
    PyObject_HEAD
    int fd;
    int wake[2]; /* close() -> a thread in poll() */
    int done[2]; /* the thread -> the loop: a frame was written, or a write failed */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop, closed;
    int error;                 /* errno of the write that failed (0: none) */
    Frame *head, *tail;        /* queued, in submit order; the head is being written */
    Frame *written, *written_tail; /* written, buffers not released yet */
    unsigned long long submitted, completed; /* frames, since the writer was made */
    Py_ssize_t queued_bytes;   /* bytes of the queue not written yet */
} Writer;

static void signal_done(Writer *w) {
    char one = 1;
    ssize_t r = write(w->done[1], &one, 1);
    (void)r; /* EAGAIN: the pipe is full, so the loop will look anyway */
}

/* One sendmsg of what is left of `f`: 0 when it wrote some (`f` then tells what is
 * left), else the errno (EAGAIN: the kernel takes nothing now). No GIL needed. */
static int send_once(int fd, Frame *f) {
    struct iovec iov[IOV_CHUNK];
    int n = 0;
    for (Py_ssize_t i = f->part; i < f->nparts && n < IOV_CHUNK; i++) {
        Py_ssize_t skip = i == f->part ? f->offset : 0;
        if (f->views[i].len == skip) continue;
        iov[n].iov_base = (char *)f->views[i].buf + skip;
        iov[n].iov_len = (size_t)(f->views[i].len - skip);
        n++;
    }
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) return errno == EWOULDBLOCK ? EAGAIN : errno;
    f->left -= sent;
    while (sent > 0) {
        Py_ssize_t rest = f->views[f->part].len - f->offset;
        if (sent >= rest) {
            sent -= rest;
            f->part++;
            f->offset = 0;
        } else {
            f->offset += sent;
            sent = 0;
        }
    }
    while (f->part < f->nparts && f->views[f->part].len == 0) f->part++;
    return 0;
}

/* Write what is left of `f`: 0 when all of it is written, else an errno (ECANCELED:
 * close() asked the thread to stop). Called by the thread: no GIL, `mu` released. */
static int write_frame(Writer *w, Frame *f) {
    while (f->left > 0) {
        int err = send_once(w->fd, f);
        if (err == 0 || err == EINTR) continue;
        if (err != EAGAIN) return err;
        struct pollfd fds[2] = {{w->fd, POLLOUT, 0}, {w->wake[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0 && errno != EINTR) return errno;
        if (fds[1].revents) return ECANCELED;
        /* (POLLERR, POLLHUP: the next sendmsg says which error) */
    }
    return 0;
}

static void *run(void *arg) {
    Writer *w = (Writer *)arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && w->head == NULL) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        Frame *f = w->head;
        Py_ssize_t before = f->left;
        pthread_mutex_unlock(&w->mu);
        int err = write_frame(w, f);
        pthread_mutex_lock(&w->mu);
        w->queued_bytes -= before - f->left;
        if (err) {
            if (err != ECANCELED) w->error = err;
            w->stop = 1;
            signal_done(w);
            break;
        }
        w->head = f->next;
        if (w->head == NULL) w->tail = NULL;
        f->next = NULL;
        if (w->written_tail) w->written_tail->next = f;
        else w->written = f;
        w->written_tail = f;
        w->completed = f->seq;
        signal_done(w);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void free_frames(Frame *f) {
    while (f) {
        Frame *next = f->next;
        for (Py_ssize_t i = 0; i < f->nparts; i++) PyBuffer_Release(&f->views[i]);
        PyMem_Free(f);
        f = next;
    }
}

static int set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static PyObject *writer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int fd;
    static char *kwlist[] = {"fd", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i:Writer", kwlist, &fd)) return NULL;
    Writer *w = (Writer *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->fd = fd;
    w->wake[0] = w->wake[1] = w->done[0] = w->done[1] = -1;
    w->closed = 1; /* until everything below exists (dealloc then frees only that) */
    if (pipe(w->wake) < 0 || pipe(w->done) < 0 || set_nonblocking(w->wake[0]) < 0 ||
        set_nonblocking(w->wake[1]) < 0 || set_nonblocking(w->done[0]) < 0 ||
        set_nonblocking(w->done[1]) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->closed = 0;
    return (PyObject *)w;
}

/* Stop the thread (it leaves the frame it writes unfinished), release every buffer,
 * close the pipes. The socket stays open: its owner closes it, after this. */
static void writer_shutdown(Writer *w) {
    if (w->closed) return;
    w->closed = 1;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    char one = 1;
    ssize_t r = write(w->wake[1], &one, 1);
    (void)r;
    if (w->started) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(w->thread, NULL);
        Py_END_ALLOW_THREADS
        w->started = 0;
    }
    free_frames(w->head);
    free_frames(w->written);
    w->head = w->tail = w->written = w->written_tail = NULL;
    w->queued_bytes = 0;
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

static void writer_dealloc(Writer *w) {
    writer_shutdown(w);
    for (int i = 0; i < 2; i++) {
        if (w->wake[i] >= 0) close(w->wake[i]);
        if (w->done[i] >= 0) close(w->done[i]);
    }
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *raise_errno(int err) {
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* write(parts) -> int: write the frame `parts` (a list of bytes-like objects) after
 * every frame before it. 0: the kernel took all of it now; else its sequence number
 * (1, 2, ...), written once `completed` reaches it. OSError: an earlier write failed
 * or the writer is closed (nothing of this frame was written). */
static PyObject *writer_write(Writer *w, PyObject *parts) {
    if (w->closed) return raise_errno(EBADF);
    if (!PyList_CheckExact(parts)) {
        PyErr_SetString(PyExc_TypeError, "write() takes a list of buffers");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(parts);
    Frame *f = PyMem_Malloc(sizeof(Frame) + (size_t)n * sizeof(Py_buffer));
    if (f == NULL) return PyErr_NoMemory();
    memset(f, 0, sizeof(Frame));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(parts, i), &f->views[i], PyBUF_SIMPLE) < 0) {
            for (Py_ssize_t j = 0; j < i; j++) PyBuffer_Release(&f->views[j]);
            PyMem_Free(f);
            return NULL;
        }
        f->nparts = i + 1;
        f->left += f->views[i].len;
    }
    while (f->part < f->nparts && f->views[f->part].len == 0) f->part++;
    /* (The thread stops on its own only when a write failed: `error` says so.) */
    pthread_mutex_lock(&w->mu);
    int err = w->error;
    int idle = w->head == NULL;
    pthread_mutex_unlock(&w->mu);
    if (err) {
        free_frames(f);
        return raise_errno(err);
    }
    if (idle) {
        /* Nothing queued: the thread waits on `cv` and touches no socket until a frame
         * is queued, which only this code does (with the GIL). */
        while (f->left > 0) {
            int e = send_once(w->fd, f);
            if (e == 0 || e == EINTR) continue;
            if (e == EAGAIN) break;
            free_frames(f);
            return raise_errno(e);
        }
        if (f->left == 0) {
            free_frames(f);
            return PyLong_FromLong(0);
        }
    }
    if (!w->started) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024 > PTHREAD_STACK_MIN ? 256 * 1024
                                                                          : PTHREAD_STACK_MIN);
        int r = pthread_create(&w->thread, &attr, run, w);
        pthread_attr_destroy(&attr);
        if (r != 0) {
            free_frames(f);
            return raise_errno(r);
        }
        w->started = 1;
    }
    pthread_mutex_lock(&w->mu);
    f->seq = ++w->submitted;
    w->queued_bytes += f->left;
    if (w->tail) w->tail->next = f;
    else w->head = f;
    w->tail = f;
    pthread_cond_signal(&w->cv);
    unsigned long long seq = f->seq;
    pthread_mutex_unlock(&w->mu);
    return PyLong_FromUnsignedLongLong(seq);
}

/* reap() -> None: release the buffers of the frames written so far and empty the
 * done pipe. OSError: a write failed (the connection is broken). */
static PyObject *writer_reap(Writer *w, PyObject *Py_UNUSED(ignored)) {
    if (w->closed) return raise_errno(EBADF);
    char sink[64];
    while (read(w->done[0], sink, sizeof sink) > 0) {
    }
    pthread_mutex_lock(&w->mu);
    Frame *written = w->written;
    w->written = w->written_tail = NULL;
    int err = w->error;
    pthread_mutex_unlock(&w->mu);
    free_frames(written);
    if (err) return raise_errno(err);
    Py_RETURN_NONE;
}

static PyObject *writer_close(Writer *w, PyObject *Py_UNUSED(ignored)) {
    writer_shutdown(w);
    Py_RETURN_NONE;
}

static PyObject *writer_completed(Writer *w, void *Py_UNUSED(c)) {
    if (w->closed) return PyLong_FromUnsignedLongLong(w->completed);
    pthread_mutex_lock(&w->mu);
    unsigned long long c = w->completed;
    pthread_mutex_unlock(&w->mu);
    return PyLong_FromUnsignedLongLong(c);
}

static PyObject *writer_queued_bytes(Writer *w, void *Py_UNUSED(c)) {
    if (w->closed) return PyLong_FromLong(0);
    pthread_mutex_lock(&w->mu);
    Py_ssize_t q = w->queued_bytes;
    pthread_mutex_unlock(&w->mu);
    return PyLong_FromSsize_t(q);
}

static PyObject *writer_done_fd(Writer *w, void *Py_UNUSED(c)) {
    return PyLong_FromLong(w->done[0]);
}

static PyObject *writer_started(Writer *w, void *Py_UNUSED(c)) {
    return PyBool_FromLong(w->started);
}

static PyObject *writer_is_closed(Writer *w, void *Py_UNUSED(c)) {
    return PyBool_FromLong(w->closed);
}

static PyMethodDef writer_methods[] = {
    {"write", (PyCFunction)writer_write, METH_O,
     "write(parts) -> 0 (written now) or the frame's sequence number (queued)."},
    {"reap", (PyCFunction)writer_reap, METH_NOARGS,
     "Release what was written; OSError if a write failed."},
    {"close", (PyCFunction)writer_close, METH_NOARGS,
     "Stop the thread (joined), release every buffer; the socket stays open."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef writer_getset[] = {
    {"completed", (getter)writer_completed, NULL, "sequence number of the last frame written",
     NULL},
    {"queued_bytes", (getter)writer_queued_bytes, NULL, "bytes queued, not written yet", NULL},
    {"done_fd", (getter)writer_done_fd, NULL, "readable when a queued frame was written", NULL},
    {"started", (getter)writer_started, NULL, "the writer thread exists", NULL},
    {"closed", (getter)writer_is_closed, NULL, "close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.cluster._writer.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(fd): frames to the socket fd, in order; past what the kernel takes "
              "at once, written by a thread of its own.",
    .tp_methods = writer_methods,
    .tp_getset = writer_getset,
    .tp_new = writer_new,
};

static struct PyModuleDef writer_module = {
    PyModuleDef_HEAD_INIT, "_writer", "A connection's frames written off the event loop.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__writer(void) {
    if (PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&writer_module);
    if (m == NULL) return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
