/*
 * copy_rows: copy rows (or one field of each row) out of a block's inner chunks.
 *
 * A block's inner chunks are `chunk_rows` rows of `row_nbytes` bytes followed by a 4-byte
 * checksum, every `stored` bytes. Reading rows [start, start + rows) of one field (bytes
 * [field_offset, field_offset + field_nbytes) of each row) is a few memcpy calls for
 * whole rows, one small memcpy per row for a field interleaved with others. numpy needs
 * five to eight calls for the same copy; this is one. See rangestream/layout/chunked.py.
 *
 * Every offset is checked against both buffers before anything is copied, so damaged
 * geometry raises ValueError instead of reading or writing out of bounds. The source
 * buffer stays exported while copying, so a mapping cannot be closed under it; large
 * copies run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define ARGUMENTS 9
#define RELEASE_GIL_BYTES (1 << 20)

/*
 * The fault guard of copy_piece. A mapped block truncated by something else while mapped
 * faults (SIGBUS) when a copy touches a page wholly past its new end, and reads as zeros
 * in the rest of its last page. copy_piece copies with a SIGBUS handler armed for this
 * thread (sigsetjmp; the handler jumps back, and copy_piece reports the source as gone),
 * then reads one byte of the page after the piece: if the file now ends before the piece
 * does, that page lies wholly past its end and faults too, so zeros are never returned.
 * Faults anywhere else go to the handler that was there before (faulthandler, or the
 * default, which ends the process as it would have). Costs a sigsetjmp without the signal
 * mask and one byte read per copy, instead of an fstat system call.
 */
#if defined(__unix__) || defined(__APPLE__)
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>
#define GUARDED 1
#if defined(__GNUC__) || defined(__clang__)
static __thread __attribute__((tls_model("initial-exec"))) sigjmp_buf *guard;
#else
static _Thread_local sigjmp_buf *guard;
#endif
static struct sigaction previous_bus;
static int guarding = -1; /* -1: not installed yet (on the first guarded copy), 0: refused */
static Py_ssize_t page_nbytes = 4096;

static void
on_bus(int signum, siginfo_t *info, void *context)
{
    sigjmp_buf *jump = guard;
    if (jump != NULL) {
        guard = NULL;
        siglongjmp(*jump, 1);
    }
    if (previous_bus.sa_flags & SA_SIGINFO) {
        previous_bus.sa_sigaction(signum, info, context);
        return;
    }
    if (previous_bus.sa_handler == SIG_DFL || previous_bus.sa_handler == SIG_IGN) {
        signal(signum, SIG_DFL); /* the fault recurs on return and ends the process */
        return;
    }
    previous_bus.sa_handler(signum);
}

/* Installed on the first guarded copy, not at import: a fault handler installed after
   ours (faulthandler.enable(), as pytest does at start) would run first, print a fatal
   error report, and only then hand the fault to ours. Runs with the GIL held: once. */
static void
install_guard(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_bus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0)
        page_nbytes = (Py_ssize_t)page;
    guarding = sigaction(SIGBUS, &action, &previous_bus) == 0;
}
#endif

static int
fits(Py_ssize_t start, Py_ssize_t rows, Py_ssize_t chunk_rows, Py_ssize_t stored,
     Py_ssize_t row_nbytes, Py_ssize_t field_offset, Py_ssize_t field_nbytes,
     Py_ssize_t source_len, Py_ssize_t target_len)
{
    if (start < 0 || rows <= 0 || chunk_rows <= 0 || row_nbytes <= 0 || field_nbytes <= 0)
        return 0;
    if (field_offset < 0 || field_offset > row_nbytes - field_nbytes)
        return 0;
    /* every product below is bounded by a buffer length, so none overflows */
    if (chunk_rows > source_len / row_nbytes || stored < chunk_rows * row_nbytes)
        return 0;
    if (rows > target_len / field_nbytes || rows * field_nbytes != target_len)
        return 0;
    if (start > source_len || rows > source_len)
        return 0;
    Py_ssize_t last = start + rows - 1;
    Py_ssize_t last_chunk = last / chunk_rows;
    if (last_chunk > source_len / stored)
        return 0;
    Py_ssize_t end = last_chunk * stored + (last % chunk_rows) * row_nbytes;
    return end <= source_len - field_offset - field_nbytes;
}

static void
copy(const char *source, char *target, Py_ssize_t start, Py_ssize_t rows,
     Py_ssize_t chunk_rows, Py_ssize_t stored, Py_ssize_t row_nbytes,
     Py_ssize_t field_offset, Py_ssize_t field_nbytes)
{
    Py_ssize_t chunk = start / chunk_rows, row = start % chunk_rows;
    if (field_nbytes == row_nbytes) { /* whole rows: one run per inner chunk */
        while (rows > 0) {
            Py_ssize_t run = chunk_rows - row;
            if (run > rows)
                run = rows;
            memcpy(target, source + chunk * stored + row * row_nbytes, run * row_nbytes);
            target += run * row_nbytes;
            rows -= run;
            chunk += 1;
            row = 0;
        }
        return;
    }
    const char *at = source + chunk * stored + row * row_nbytes + field_offset;
    for (; rows > 0; rows--) {
        memcpy(target, at, field_nbytes);
        target += field_nbytes;
        if (++row == chunk_rows) {
            row = 0;
            chunk += 1;
            at = source + chunk * stored + field_offset;
        } else {
            at += row_nbytes;
        }
    }
}

static PyObject *
copy_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != ARGUMENTS) {
        PyErr_Format(PyExc_TypeError, "copy_rows takes %d arguments, %zd given", ARGUMENTS,
                     nargs);
        return NULL;
    }
    Py_ssize_t value[ARGUMENTS - 2];
    for (int i = 0; i < ARGUMENTS - 2; i++) {
        value[i] = PyLong_AsSsize_t(args[2 + i]);
        if (value[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t start = value[0], rows = value[1], chunk_rows = value[2], stored = value[3];
    Py_ssize_t row_nbytes = value[4], field_offset = value[5], field_nbytes = value[6];
    Py_buffer source, target;
    if (PyObject_GetBuffer(args[0], &source, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &target, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&source);
        return NULL;
    }
    PyObject *result = Py_None;
    if (!fits(start, rows, chunk_rows, stored, row_nbytes, field_offset, field_nbytes,
              source.len, target.len)) {
        PyErr_Format(PyExc_ValueError,
                     "copy_rows: rows [%zd, +%zd) of field bytes [%zd, +%zd) in %zd-row "
                     "chunks of %zd-byte rows stored every %zd bytes do not fit a "
                     "%zd-byte source and a %zd-byte target",
                     start, rows, field_offset, field_nbytes, chunk_rows, row_nbytes, stored,
                     source.len, target.len);
        result = NULL;
    } else if (target.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        copy(source.buf, target.buf, start, rows, chunk_rows, stored, row_nbytes,
             field_offset, field_nbytes);
        Py_END_ALLOW_THREADS
    } else {
        copy(source.buf, target.buf, start, rows, chunk_rows, stored, row_nbytes,
             field_offset, field_nbytes);
    }
    PyBuffer_Release(&source);
    PyBuffer_Release(&target);
    Py_XINCREF(result);
    return result;
}

/*
 * copy_piece: one piece of a mapped block, as the mapped executor's hot path needs it.
 *
 * Checks that every inner chunk the rows touch is flagged verified in `verified` (a
 * bytearray, or None when checksums are off), counts one request of those chunks' stored
 * bytes in `counter` ([requests, bytes], a list), and copies the rows into each output
 * (target, field_offset, field_nbytes) of `outputs`, a tuple. Returns 0 when done, 1 when a
 * chunk is not verified yet (the caller checks it and calls again), 2 when the rows lie
 * outside the source (the caller reads them another way); nothing is counted or copied
 * unless it returns 0. One call instead of a flag scan, two counter updates and a copy per
 * output in Python, which were most of a local window's time.
 */
static PyObject *
add_to_item(PyObject *list, Py_ssize_t index, Py_ssize_t amount)
{
    PyObject *old = PyList_GET_ITEM(list, index);
    PyObject *step = PyLong_FromSsize_t(amount);
    if (step == NULL)
        return NULL;
    PyObject *sum = PyNumber_Add(old, step);
    Py_DECREF(step);
    if (sum == NULL)
        return NULL;
    PyList_SET_ITEM(list, index, sum);
    Py_DECREF(old);
    return sum;
}

#define PIECE_ARGUMENTS 9

/* Whether the source is at least `needed` bytes long now, by `size_now()`: 1, 0, -1 error. */
static int
still_there(PyObject *size_now, Py_ssize_t needed)
{
    PyObject *answer = PyObject_CallNoArgs(size_now);
    if (answer == NULL)
        return -1;
    Py_ssize_t size = PyLong_AsSsize_t(answer);
    Py_DECREF(answer);
    if (size == -1 && PyErr_Occurred())
        return -1;
    return size >= needed;
}

/*
 * Copies rows [start, start + rows) of `source` into each of `count` targets (field
 * `offsets[i]`, `nbytes[i]` of each row), every geometry already checked (`fits`), and
 * `end` the chunk after the last one touched. With `size_now` (a callable giving the file's
 * size now) the copy runs under the fault guard, asking `size_now()` only where the guard
 * cannot tell (or before copying, where there is no guard). Returns 0 when copied, 3 when
 * the source's file is shorter now than the rows (truncated since mapped: targets hold
 * garbage), -1 with an exception set when `size_now()` failed.
 */
static int
guarded_copy(const Py_buffer *source, char *const *targets, const Py_ssize_t *offsets,
             const Py_ssize_t *nbytes, Py_ssize_t count, Py_ssize_t start, Py_ssize_t rows,
             Py_ssize_t chunk_rows, Py_ssize_t stored, Py_ssize_t row_nbytes, Py_ssize_t end,
             PyObject *size_now)
{
    /* 1: ask size_now() before copying (no guard), 2: after (the guard could not tell) */
    volatile int check_size = size_now != Py_None; /* changed after sigsetjmp */
#ifdef GUARDED
    sigjmp_buf jump;
    if (size_now != Py_None && guarding < 0)
        install_guard();
    if (size_now != Py_None && guarding > 0) {
        if (sigsetjmp(jump, 0) != 0) /* the source faulted: truncated since mapped */
            return 3;
        guard = &jump;
        check_size = 0;
    }
#endif
    if (check_size) { /* unguarded: a copy past the file's end would fault */
        int there = still_there(size_now, end * stored);
        if (there <= 0)
            return there < 0 ? -1 : 3;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        copy(source->buf, targets[i], start, rows, chunk_rows, stored, row_nbytes, offsets[i],
             nbytes[i]);
#ifdef GUARDED
    if (guard != NULL) {
        /* the page after the piece: wholly past the end of a file cut before the piece's
           end, so it faults; past the source, the file's size is asked instead */
        Py_ssize_t probe = ((end * stored - 1) / page_nbytes + 1) * page_nbytes;
        if (probe < source->len)
            (void)*(volatile const char *)((const char *)source->buf + probe);
        else
            check_size = 2;
        guard = NULL;
    }
#endif
    if (check_size == 2) {
        int there = still_there(size_now, end * stored);
        if (there <= 0)
            return there < 0 ? -1 : 3;
    }
    return 0;
}

static PyObject *
copy_piece(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != PIECE_ARGUMENTS && nargs != PIECE_ARGUMENTS + 1) {
        PyErr_Format(PyExc_TypeError, "copy_piece takes %d or %d arguments, %zd given",
                     PIECE_ARGUMENTS, PIECE_ARGUMENTS + 1, nargs);
        return NULL;
    }
    PyObject *outputs = args[1], *verified = args[7], *counter = args[8];
    PyObject *size_now = nargs > PIECE_ARGUMENTS ? args[9] : Py_None;
    if (size_now != Py_None && !PyCallable_Check(size_now)) {
        PyErr_SetString(PyExc_TypeError, "copy_piece: size_now must be callable or None");
        return NULL;
    }
    if (!PyTuple_Check(outputs)) {
        PyErr_SetString(PyExc_TypeError, "copy_piece: outputs must be a tuple");
        return NULL;
    }
    if (verified != Py_None && !PyByteArray_Check(verified)) {
        PyErr_SetString(PyExc_TypeError, "copy_piece: verified must be a bytearray or None");
        return NULL;
    }
    if (!PyList_Check(counter) || PyList_GET_SIZE(counter) != 2) {
        PyErr_SetString(PyExc_TypeError, "copy_piece: counter must be a list of two ints");
        return NULL;
    }
    Py_ssize_t value[5];
    for (int i = 0; i < 5; i++) {
        value[i] = PyLong_AsSsize_t(args[2 + i]);
        if (value[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t start = value[0], rows = value[1], chunk_rows = value[2], stored = value[3];
    Py_ssize_t row_nbytes = value[4];
    if (start < 0 || rows <= 0 || chunk_rows <= 0 || stored <= 0)
        return PyLong_FromLong(2);
    Py_ssize_t first = start / chunk_rows, end = (start + rows - 1) / chunk_rows + 1;
    Py_buffer source;
    if (PyObject_GetBuffer(args[0], &source, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(outputs);
    Py_buffer targets[8];
    Py_ssize_t offsets[8], nbytes[8];
    int status = 0;
    Py_ssize_t got = 0;
    /* whole stored chunks must lie in the source before a flag is trusted or a chunk checked */
    if (count > 8 || end > source.len / stored) {
        status = 2;
        goto done;
    }
    if (verified != Py_None) {
        const char *flags = PyByteArray_AS_STRING(verified);
        if (end > PyByteArray_GET_SIZE(verified)) {
            status = 2;
            goto done;
        }
        if (memchr(flags + first, 0, (size_t)(end - first)) != NULL) {
            status = 1;
            goto done;
        }
    }
    for (; got < count; got++) { /* every output checked before anything is copied */
        PyObject *output = PyTuple_GET_ITEM(outputs, got);
        if (!PyTuple_Check(output) || PyTuple_GET_SIZE(output) != 3) {
            PyErr_SetString(PyExc_TypeError,
                            "copy_piece: each output is a (target, offset, nbytes) tuple");
            goto failed;
        }
        offsets[got] = PyLong_AsSsize_t(PyTuple_GET_ITEM(output, 1));
        nbytes[got] = PyLong_AsSsize_t(PyTuple_GET_ITEM(output, 2));
        if (PyErr_Occurred())
            goto failed;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(output, 0), &targets[got],
                               PyBUF_SIMPLE | PyBUF_WRITABLE) < 0)
            goto failed;
        if (!fits(start, rows, chunk_rows, stored, row_nbytes, offsets[got], nbytes[got],
                  source.len, targets[got].len)) {
            PyBuffer_Release(&targets[got]);
            status = 2;
            goto done;
        }
    }
    {
        char *buffers[8];
        for (Py_ssize_t i = 0; i < count; i++)
            buffers[i] = targets[i].buf;
        status = guarded_copy(&source, buffers, offsets, nbytes, count, start, rows, chunk_rows,
                              stored, row_nbytes, end, size_now);
        if (status < 0)
            goto failed;
        if (status != 0)
            goto done;
    }
    if (add_to_item(counter, 0, 1) == NULL || add_to_item(counter, 1, (end - first) * stored) == NULL)
        goto failed;
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&targets[i]);
    PyBuffer_Release(&source);
    return PyLong_FromLong(status);
failed:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&targets[i]);
    PyBuffer_Release(&source);
    return NULL;
}

/*
 * copy_bytes: rows of a mapped block as a new bytes object (a document's bytes).
 *
 * copy_piece for one whole-row output that is made here: the rows' bytes, contiguous, in
 * a bytes object of rows * row_nbytes bytes, copied once from the block under the same
 * fault guard. Returns that bytes object, or 1 when a chunk is not verified yet, 2 when the
 * rows lie outside the source, 3 when the source's bytes are gone; b"" for no rows. Counts
 * nothing: its caller counts the coalesced requests of a batch of documents. One call
 * instead of an empty array, a slice of it, an output tuple and tobytes per document.
 */
#define BYTES_ARGUMENTS 7

static PyObject *
copy_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != BYTES_ARGUMENTS && nargs != BYTES_ARGUMENTS + 1) {
        PyErr_Format(PyExc_TypeError, "copy_bytes takes %d or %d arguments, %zd given",
                     BYTES_ARGUMENTS, BYTES_ARGUMENTS + 1, nargs);
        return NULL;
    }
    PyObject *verified = args[6];
    PyObject *size_now = nargs > BYTES_ARGUMENTS ? args[7] : Py_None;
    if (size_now != Py_None && !PyCallable_Check(size_now)) {
        PyErr_SetString(PyExc_TypeError, "copy_bytes: size_now must be callable or None");
        return NULL;
    }
    if (verified != Py_None && !PyByteArray_Check(verified)) {
        PyErr_SetString(PyExc_TypeError, "copy_bytes: verified must be a bytearray or None");
        return NULL;
    }
    Py_ssize_t value[5];
    for (int i = 0; i < 5; i++) {
        value[i] = PyLong_AsSsize_t(args[1 + i]);
        if (value[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t start = value[0], rows = value[1], chunk_rows = value[2], stored = value[3];
    Py_ssize_t row_nbytes = value[4];
    if (start < 0 || rows < 0 || chunk_rows <= 0 || stored <= 0 || row_nbytes <= 0)
        return PyLong_FromLong(2);
    if (rows == 0)
        return PyBytes_FromStringAndSize(NULL, 0);
    if (rows > PY_SSIZE_T_MAX / row_nbytes)
        return PyLong_FromLong(2);
    Py_ssize_t first = start / chunk_rows, end = (start + rows - 1) / chunk_rows + 1;
    Py_buffer source;
    if (PyObject_GetBuffer(args[0], &source, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    int status = 0;
    /* whole stored chunks must lie in the source before a flag is trusted */
    if (end > source.len / stored ||
        !fits(start, rows, chunk_rows, stored, row_nbytes, 0, row_nbytes, source.len,
              rows * row_nbytes)) {
        status = 2;
        goto done;
    }
    if (verified != Py_None) {
        if (end > PyByteArray_GET_SIZE(verified)) {
            status = 2;
            goto done;
        }
        if (memchr(PyByteArray_AS_STRING(verified) + first, 0, (size_t)(end - first)) != NULL) {
            status = 1;
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, rows * row_nbytes);
    if (result == NULL)
        goto done;
    {
        char *buffers[1] = {PyBytes_AS_STRING(result)};
        Py_ssize_t offsets[1] = {0}, nbytes[1] = {row_nbytes};
        status = guarded_copy(&source, buffers, offsets, nbytes, 1, start, rows, chunk_rows,
                              stored, row_nbytes, end, size_now);
    }
    if (status != 0)
        Py_CLEAR(result);
done:
    PyBuffer_Release(&source);
    if (result != NULL || status < 0)
        return result;
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"copy_bytes", (PyCFunction)(void (*)(void))copy_bytes, METH_FASTCALL,
     "copy_bytes(source, start, rows, chunk_rows, stored, row_nbytes, verified, "
     "size_now=None)\n--\n\n"
     "Rows [start, start + rows) of a mapped block as a new bytes object, if every inner\n"
     "chunk they touch is flagged in verified (None: checksums off); else 1 when a chunk is\n"
     "not verified yet, 2 when the rows lie outside the source, 3 when the source's bytes\n"
     "are gone (its file was truncated since it was mapped). b'' for no rows. Counts\n"
     "nothing. With size_now, the copy is guarded as copy_piece's is."},
    {"copy_piece", (PyCFunction)(void (*)(void))copy_piece, METH_FASTCALL,
     "copy_piece(source, outputs, start, rows, chunk_rows, stored, row_nbytes, verified, "
     "counter, size_now=None)\n--\n\n"
     "Copy rows [start, start + rows) of a mapped block into each (target, field_offset,\n"
     "field_nbytes) of outputs and count one request in counter, if every inner chunk they\n"
     "touch is flagged in verified: 0 when done, 1 when a chunk is not verified yet, 2 when\n"
     "the rows lie outside the source, 3 when the source's bytes are gone (its file was\n"
     "truncated since it was mapped; outputs hold garbage), nothing counted but for 0.\n"
     "With size_now (a callable giving the file's size now), the copy is guarded against\n"
     "the fault of a truncated mapping and checked for the zeros of its last page."},
    {"copy_rows", (PyCFunction)(void (*)(void))copy_rows, METH_FASTCALL,
     "copy_rows(source, target, start, rows, chunk_rows, stored, row_nbytes, field_offset, "
     "field_nbytes)\n--\n\n"
     "Copy bytes [field_offset, field_offset + field_nbytes) of rows [start, start + rows)\n"
     "of a block whose inner chunks of chunk_rows rows start every stored bytes of\n"
     "source into target, which must hold exactly rows * field_nbytes bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rangestream.layout._chunked",
    "Compiled row copies out of a block's inner chunks (see rangestream.layout.chunked).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__chunked(void)
{
    PyObject *created = PyModule_Create(&module);
    if (created == NULL)
        return NULL;
    int guards = 0;
#ifdef GUARDED
    guards = 1; /* installed on the first guarded copy */
#endif
    if (PyModule_AddIntConstant(created, "GUARDS_FAULTS", guards) < 0) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
