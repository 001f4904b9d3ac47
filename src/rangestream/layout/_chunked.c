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

static PyMethodDef methods[] = {
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
    return PyModule_Create(&module);
}
