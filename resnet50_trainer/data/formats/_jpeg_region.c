/* Region-of-interest JPEG decoding with libjpeg-turbo's libjpeg API (jpeglib.h, libjpeg.so.62):
 * decode only the rows and columns of a box, at 1/1, 1/2, 1/4 or 1/8 DCT scale, into a caller's
 * buffer. No Python binding on PyPI reaches jpeg_crop_scanline / jpeg_skip_scanlines (simplejpeg
 * and PyTurboJPEG call TurboJPEG's whole-frame decode; TurboJPEG 3's cropping region is not in
 * Debian 12's libturbojpeg 2.1), hence this small module (jpeg_region.py wraps it).
 *
 * decode_region(data, reduction, left, top, width, height, channels, out) fills `out` (writable,
 * contiguous, at least width * height * channels bytes) with the box's pixels, HWC uint8, RGB when
 * channels is 3 and gray when 1; the box is in the pixels of the image decoded at 1/reduction.
 * Raises ValueError with libjpeg's message on any error or warning (strict, as simplejpeg's
 * default), and for a box outside the image. The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr manager;
    jmp_buf escape;
    int warned;
    char message[JMSG_LENGTH_MAX];
} Errors;

static void on_error(j_common_ptr info) {
    Errors *errors = (Errors *)info->err;
    (*info->err->format_message)(info, errors->message);
    longjmp(errors->escape, 1);
}

static void on_message(j_common_ptr info, int level) {
    Errors *errors = (Errors *)info->err;
    if (level < 0 && !errors->warned) { /* a warning: corrupt data libjpeg would paper over */
        (*info->err->format_message)(info, errors->message);
        errors->warned = 1;
    }
}

typedef struct {
    int reduction, left, top, width, height, channels;
} Box;

/* Rows asked of libjpeg at a time: a row at a time costs 4-20% more than the whole frame's rows in
 * one call (fancy upsampling makes two rows at once; one of them is kept aside); 16 rows cost what
 * the whole frame does (BENCHMARKS.md, scripts/libjpeg_rows.c). */
enum { BLOCK_ROWS = 16 };

/* 0 on success, else errors->message says why. Runs without the GIL: touches no Python object. */
static int decode(const unsigned char *data, unsigned long size, Box box, unsigned char *out,
                  Errors *errors) {
    struct jpeg_decompress_struct info;
    unsigned char *volatile block = NULL;
    int failed = 0;
    info.err = jpeg_std_error(&errors->manager);
    errors->manager.error_exit = on_error;
    errors->manager.emit_message = on_message;
    errors->warned = 0;
    if (setjmp(errors->escape)) {
        failed = 1;
        goto done;
    }
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, data, size);
    jpeg_read_header(&info, TRUE);
    if (info.num_components != 1 && info.num_components != 3) {
        snprintf(errors->message, JMSG_LENGTH_MAX, "%d components: not gray or colour",
                 info.num_components);
        failed = 1;
        goto done;
    }
    info.out_color_space = box.channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    info.scale_num = 1;
    info.scale_denom = (unsigned int)box.reduction;
    jpeg_start_decompress(&info);
    if ((JDIMENSION)(box.left + box.width) > info.output_width ||
        (JDIMENSION)(box.top + box.height) > info.output_height) {
        snprintf(errors->message, JMSG_LENGTH_MAX, "box outside the %ux%u image",
                 info.output_width, info.output_height);
        failed = 1;
        goto done;
    }
    /* The decoded columns start at an iMCU boundary at or left of the box and may run past it.
     * One more column each side where there is one: fancy upsampling treats the decoded columns'
     * edges as the image's, so the box's own edge columns would differ from a full decode's. */
    JDIMENSION first_column = (JDIMENSION)(box.left > 0 ? box.left - 1 : 0);
    JDIMENSION end = (JDIMENSION)(box.left + box.width);
    JDIMENSION columns = (end < info.output_width ? end + 1 : end) - first_column;
    jpeg_crop_scanline(&info, &first_column, &columns);
    size_t row_bytes = (size_t)box.width * (size_t)box.channels;
    size_t skip_bytes = (size_t)(box.left - (int)first_column) * (size_t)box.channels;
    size_t block_row_bytes = (size_t)columns * (size_t)info.output_components;
    block = malloc(block_row_bytes * BLOCK_ROWS);
    if (block == NULL) {
        snprintf(errors->message, JMSG_LENGTH_MAX, "out of memory");
        failed = 1;
        goto done;
    }
    if (box.top > 0 && jpeg_skip_scanlines(&info, (JDIMENSION)box.top) != (JDIMENSION)box.top) {
        snprintf(errors->message, JMSG_LENGTH_MAX, "could not skip to row %d", box.top);
        failed = 1;
        goto done;
    }
    JSAMPROW rows[BLOCK_ROWS];
    for (int i = 0; i < BLOCK_ROWS; i++) {
        rows[i] = block + (size_t)i * block_row_bytes;
    }
    for (int y = 0; y < box.height;) {
        int wanted = box.height - y < BLOCK_ROWS ? box.height - y : BLOCK_ROWS;
        int got = (int)jpeg_read_scanlines(&info, rows, (JDIMENSION)wanted);
        if (got == 0) {
            snprintf(errors->message, JMSG_LENGTH_MAX, "image ended at row %d", box.top + y);
            failed = 1;
            goto done;
        }
        for (int i = 0; i < got; i++, y++) {
            memcpy(out + (size_t)y * row_bytes, rows[i] + skip_bytes, row_bytes);
        }
    }
    failed = errors->warned;
done:
    free(block);
    jpeg_destroy_decompress(&info); /* also abandons the rows below the box, undecoded */
    return failed;
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    Box box;
    if (!PyArg_ParseTuple(args, "y*iiiiiiw*", &data, &box.reduction, &box.left, &box.top,
                          &box.width, &box.height, &box.channels, &out)) {
        return NULL;
    }
    const char *refusal = NULL;
    if (box.reduction != 1 && box.reduction != 2 && box.reduction != 4 && box.reduction != 8) {
        refusal = "reduction must be 1, 2, 4 or 8";
    } else if (box.channels != 1 && box.channels != 3) {
        refusal = "channels must be 1 or 3";
    } else if (box.left < 0 || box.top < 0 || box.width <= 0 || box.height <= 0) {
        refusal = "the box must have a non-negative corner and a positive size";
    } else if (out.len < (Py_ssize_t)box.width * box.height * box.channels) {
        refusal = "the output buffer is smaller than the box";
    } else if (!PyBuffer_IsContiguous(&out, 'C')) {
        refusal = "the output buffer is not contiguous";
    }
    Errors errors;
    int failed = 0;
    if (refusal == NULL) {
        Py_BEGIN_ALLOW_THREADS
        failed = decode(data.buf, (unsigned long)data.len, box, out.buf, &errors);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (refusal != NULL) {
        PyErr_SetString(PyExc_ValueError, refusal);
        return NULL;
    }
    if (failed) {
        PyErr_SetString(PyExc_ValueError, errors.message);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, reduction, left, top, width, height, channels, out): the box's "
     "pixels of a JPEG decoded at 1/reduction, HWC uint8, into out; ValueError on any error."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
