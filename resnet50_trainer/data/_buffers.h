/* Shared by the compiled modules (_resample.c, formats/_jpeg_region.c): the end of a function
   that borrowed an input and an output buffer and may have refused its arguments. */
#ifndef RESNET50_TRAINER_BUFFERS_H
#define RESNET50_TRAINER_BUFFERS_H

#include <Python.h>

/* Releases both buffers; where `refusal` is not NULL, raises ValueError with it and returns -1
   (the caller returns NULL), else returns 0. */
static int release_buffers(Py_buffer *in, Py_buffer *out, const char *refusal) {
    PyBuffer_Release(in);
    PyBuffer_Release(out);
    if (refusal != NULL) {
        PyErr_SetString(PyExc_ValueError, refusal);
        return -1;
    }
    return 0;
}

#endif
