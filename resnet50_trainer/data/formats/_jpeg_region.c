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
 * default), and for a box outside the image. The GIL is released while decoding. A JPEG with
 * restart markers is first cut down to the MCUs round the box (restart_window).
 *
 * add_restart_markers(data) returns the JPEG rewritten losslessly with a restart marker after
 * every MCU (resnet50-db create --restart_markers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "../_buffers.h"

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

/* libjpeg's error manager made strict: errors jump to errors->escape, warnings are kept. */
static struct jpeg_error_mgr *strict(Errors *errors) {
    struct jpeg_error_mgr *manager = jpeg_std_error(&errors->manager);
    manager->error_exit = on_error;
    manager->emit_message = on_message;
    errors->warned = 0;
    return manager;
}

typedef struct {
    int reduction, left, top, width, height, channels;
} Box;

/* Rows asked of libjpeg at a time: a row at a time costs 4-20% more than the whole frame's rows in
 * one call (fancy upsampling makes two rows at once; one of them is kept aside); 16 rows cost what
 * the whole frame does (docs/speed.md, benchmarks/libjpeg_rows.c). */
enum { BLOCK_ROWS = 16 };
enum { MAX_SIDE = 65535 }; /* a JPEG frame's largest width or height */

/* 0 on success, else errors->message says why. Runs without the GIL: touches no Python object. */
static int decode(const unsigned char *data, unsigned long size, Box box, unsigned char *out,
                  Errors *errors) {
    struct jpeg_decompress_struct info;
    unsigned char *volatile block = NULL;
    int failed = 0;
    memset(&info, 0, sizeof(info)); /* jpeg_destroy_decompress is safe on it if never created */
    info.err = strict(errors);
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
    /* And at least max_h_samp_factor + 1 columns where the image has them (more on the right
     * first), so that every component keeps 2 samples a row or more: where a component falls
     * under 2, jpeg_crop_scanline re-initialises the upsamplers, and libjpeg then repeats chroma
     * (down the rows too) instead of fancy-upsampling it as the full decode does. That was a
     * 1-pixel box at the left edge of a 4:2:0 image at full scale (2 columns with the one beside
     * it: 1 chroma sample), or at its right edge where the width is 16k + 2. */
    JDIMENSION least = (JDIMENSION)info.max_h_samp_factor + 1;
    if (columns < least) {
        JDIMENSION stop = first_column + least < info.output_width ? first_column + least
                                                                   : info.output_width;
        first_column = stop > least ? stop - least : 0;
        columns = stop - first_column;
    }
    if (info.max_h_samp_factor <= 2 && info.max_v_samp_factor <= 2) {
        jpeg_crop_scanline(&info, &first_column, &columns);
    } else { /* see restart_layout: whole rows, as a full decode makes them */
        first_column = 0;
        columns = info.output_width;
    }
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

/* A JPEG with a restart marker every R MCUs (resnet50-db create --restart_markers) is cut down to
 * the MCUs around the box before it is decoded: entropy decoding is sequential and restarts only
 * at a marker, so without them every MCU before the box's last row is Huffman-decoded (about 0.6
 * of a whole decode lies there). The window is a JPEG of its own: the headers with the frame's
 * size made the window's, and the restart intervals of the MCUs it covers, markers renumbered
 * from RST0 (libjpeg checks their sequence). Each interval starts its DC predictions afresh, so
 * the window's blocks are the image's blocks; a margin of 2 pixels (of the decode) round the box
 * keeps chroma upsampling at the box's edges as in the whole frame. */
enum { MIN_WINDOW_MCUS = 3 };

typedef struct {
    size_t frame;  /* the SOF segment's offset (its marker's 0xFF) */
    size_t scan;   /* where the entropy-coded data starts, after the SOS segment */
    unsigned width, height, mcu_width, mcu_height, interval;
} Layout;

static unsigned read16(const unsigned char *at) { return ((unsigned)at[0] << 8) | at[1]; }

/* 1 and the layout where `data` is a baseline or extended sequential JPEG of one interleaved
 * scan (or one component) with restart intervals that never span two MCU rows; else 0. */
static int restart_layout(const unsigned char *data, size_t size, Layout *layout) {
    size_t at = 2;
    int frame_seen = 0, components = 0, max_h = 1, max_v = 1;
    memset(layout, 0, sizeof(*layout));
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
        return 0;
    }
    for (;;) {
        while (at < size && data[at] == 0xFF && at + 1 < size && data[at + 1] == 0xFF) {
            at++; /* fill bytes before a marker */
        }
        if (at + 4 > size || data[at] != 0xFF) {
            return 0;
        }
        unsigned marker = data[at + 1];
        size_t length = read16(data + at + 2);
        if (length < 2 || at + 2 + length > size) {
            return 0;
        }
        const unsigned char *segment = data + at + 4;
        if (marker == 0xC0 || marker == 0xC1) { /* baseline or extended sequential, Huffman */
            if (length < 8 || frame_seen) {
                return 0;
            }
            components = segment[5];
            if (components < 1 || length != 8 + 3 * (size_t)components) {
                return 0;
            }
            for (int i = 0; i < components; i++) {
                int h = segment[6 + 3 * i + 1] >> 4, v = segment[6 + 3 * i + 1] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4) {
                    return 0;
                }
                max_h = h > max_h ? h : max_h;
                max_v = v > max_v ? v : max_v;
            }
            layout->frame = at;
            layout->height = read16(segment + 1);
            layout->width = read16(segment + 3);
            frame_seen = 1;
        } else if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                   marker != 0xCC) {
            return 0; /* progressive, lossless, arithmetic-coded: not cut */
        } else if (marker == 0xDD) {
            if (length != 4) {
                return 0;
            }
            layout->interval = read16(segment);
        } else if (marker == 0xDA) {
            /* One scan of every component: a single-component scan's MCU is one 8x8 block. */
            if (!frame_seen || length < 3 || segment[0] != components) {
                return 0;
            }
            layout->scan = at + 2 + length;
            break;
        } else if (marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD8) || marker == 0x01) {
            return 0;
        }
        at += 2 + length;
    }
    /* Chroma sampled 4 times (4:1:1, 4x2): libjpeg-turbo 2.1's jpeg_crop_scanline miscomputes
     * such components' widths at reduced scales; decoded as before, whole rows. */
    if (max_h > 2 || max_v > 2) {
        return 0;
    }
    int one = components == 1;
    layout->mcu_width = 8 * (one ? 1 : (unsigned)max_h);
    layout->mcu_height = 8 * (one ? 1 : (unsigned)max_v);
    if (layout->width == 0 || layout->height == 0 || layout->interval == 0) {
        return 0;
    }
    unsigned columns = (layout->width + layout->mcu_width - 1) / layout->mcu_width;
    return columns % layout->interval == 0;
}

/* Where each restart interval's bytes begin (starts[i]) and end (ends[i], before its marker), up
 * to interval `last` included; 0 if the scan has fewer, or markers out of sequence. */
static int find_intervals(const unsigned char *data, size_t size, size_t scan, size_t last,
                          size_t *starts, size_t *ends) {
    size_t at = scan, found = 0;
    starts[0] = scan;
    while (found < last) {
        const unsigned char *next = memchr(data + at, 0xFF, size - at);
        if (next == NULL) {
            return 0;
        }
        at = (size_t)(next - data);
        size_t marker_at = at;
        while (at + 1 < size && data[at + 1] == 0xFF) {
            at++; /* fill bytes */
        }
        if (at + 1 >= size) {
            return 0;
        }
        unsigned byte = data[at + 1];
        if (byte == 0x00) { /* a stuffed 0xFF of the data */
            at += 2;
            continue;
        }
        if (byte != 0xD0 + (found & 7)) {
            return 0; /* the scan ended, or a marker out of sequence: let libjpeg judge it */
        }
        ends[found] = marker_at;
        found++;
        at += 2;
        starts[found] = at;
    }
    /* The last one wanted ends at the next marker that is not stuffing. */
    for (;;) {
        const unsigned char *next = memchr(data + at, 0xFF, size - at);
        if (next == NULL) {
            return 0;
        }
        at = (size_t)(next - data);
        if (at + 1 >= size) {
            return 0;
        }
        if (data[at + 1] != 0x00 && data[at + 1] != 0xFF) {
            ends[last] = at;
            return 1;
        }
        at += data[at + 1] == 0x00 ? 2 : 1;
    }
}

/* The window round `box` (in the pixels of the decode at 1/box->reduction), a JPEG in a fresh
 * malloc'd buffer, and box made relative to it; NULL where the JPEG has no usable restart
 * markers (the whole stream is decoded as before) or on any surprise in its structure. */
static unsigned char *restart_window(const unsigned char *data, size_t size, Box *box,
                                     size_t *window_size) {
    Layout layout;
    if (!restart_layout(data, size, &layout)) {
        return NULL;
    }
    unsigned red = (unsigned)box->reduction, margin = 2 * red;
    unsigned columns = (layout.width + layout.mcu_width - 1) / layout.mcu_width;
    unsigned rows = (layout.height + layout.mcu_height - 1) / layout.mcu_height;
    unsigned left = (unsigned)box->left * red, top = (unsigned)box->top * red;
    unsigned right = (unsigned)(box->left + box->width) * red;
    unsigned bottom = (unsigned)(box->top + box->height) * red;
    unsigned first_column = (left > margin ? left - margin : 0) / layout.mcu_width;
    unsigned first_row = (top > margin ? top - margin : 0) / layout.mcu_height;
    unsigned end_column = (right + margin + layout.mcu_width - 1) / layout.mcu_width;
    unsigned end_row = (bottom + margin + layout.mcu_height - 1) / layout.mcu_height;
    end_column = end_column < columns ? end_column : columns;
    end_row = end_row < rows ? end_row : rows;
    first_column -= first_column % layout.interval; /* whole intervals only */
    end_column += (layout.interval - end_column % layout.interval) % layout.interval;
    /* At least 3 MCUs wide where the image is: libjpeg upsamples chroma 2 samples wide or less
     * by repeating it, not by fancy upsampling, and would change the box's pixels. */
    while (end_column - first_column < MIN_WINDOW_MCUS &&
           (first_column > 0 || end_column < columns)) {
        if (end_column < columns) {
            end_column += layout.interval;
        } else {
            first_column -= layout.interval;
        }
    }
    if (first_row >= end_row || first_column >= end_column || end_column > columns) {
        return NULL;
    }
    if (first_column == 0 && first_row == 0 && end_column == columns && end_row == rows) {
        return NULL; /* the whole image: nothing to cut */
    }
    size_t per_row = columns / layout.interval;
    size_t last = (size_t)(end_row - 1) * per_row + (end_column / layout.interval) - 1;
    if (last > (size - layout.scan) / 2) {
        return NULL; /* more intervals than the data could hold (a marker is 2 bytes) */
    }
    size_t *starts = malloc(2 * (last + 2) * sizeof(size_t));
    unsigned char *window = NULL;
    if (starts == NULL) {
        return NULL;
    }
    size_t *ends = starts + last + 2;
    if (!find_intervals(data, size, layout.scan, last, starts, ends)) {
        goto done;
    }
    size_t used = (size_t)(end_column - first_column) / layout.interval;
    size_t capacity = layout.scan + 2 + (size_t)(end_row - first_row) * used * 2;
    for (unsigned row = first_row; row < end_row; row++) {
        size_t first = row * per_row + first_column / layout.interval;
        capacity += ends[first + used - 1] - starts[first];
    }
    window = malloc(capacity);
    if (window == NULL) {
        goto done;
    }
    memcpy(window, data, layout.scan);
    unsigned window_width = (end_column * layout.mcu_width < layout.width
                                 ? end_column * layout.mcu_width
                                 : layout.width) -
                            first_column * layout.mcu_width;
    unsigned window_height = (end_row * layout.mcu_height < layout.height
                                  ? end_row * layout.mcu_height
                                  : layout.height) -
                             first_row * layout.mcu_height;
    unsigned char *frame = window + layout.frame + 5; /* FF Cx, length (2), precision (1) */
    frame[0] = (unsigned char)(window_height >> 8);
    frame[1] = (unsigned char)window_height;
    frame[2] = (unsigned char)(window_width >> 8);
    frame[3] = (unsigned char)window_width;
    size_t at = layout.scan, written = 0;
    for (unsigned row = first_row; row < end_row; row++) {
        size_t first = row * per_row + first_column / layout.interval;
        for (size_t i = first; i < first + used; i++) {
            if (written > 0) {
                window[at++] = 0xFF;
                window[at++] = (unsigned char)(0xD0 + ((written - 1) & 7));
            }
            memcpy(window + at, data + starts[i], ends[i] - starts[i]);
            at += ends[i] - starts[i];
            written++;
        }
    }
    window[at++] = 0xFF;
    window[at++] = 0xD9;
    *window_size = at;
    box->left -= (int)(first_column * layout.mcu_width / red);
    box->top -= (int)(first_row * layout.mcu_height / red);
done:
    free(starts);
    return window;
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
    } else if ((long long)box.left + box.width > MAX_SIDE ||
               (long long)box.top + box.height > MAX_SIDE) {
        refusal = "the box lies outside any JPEG (65535 pixels a side at most)";
    } else if (out.len < (Py_ssize_t)box.width * box.height * box.channels) {
        refusal = "the output buffer is smaller than the box";
    } else if (!PyBuffer_IsContiguous(&out, 'C')) {
        refusal = "the output buffer is not contiguous";
    }
    Errors errors;
    int failed = 0;
    if (refusal == NULL) {
        Py_BEGIN_ALLOW_THREADS
        size_t window_size = 0;
        Box in_window = box;
        unsigned char *window = restart_window(data.buf, (size_t)data.len, &in_window, &window_size);
        if (window != NULL) {
            failed = decode(window, (unsigned long)window_size, in_window, out.buf, &errors);
            free(window);
        } else {
            failed = decode(data.buf, (unsigned long)data.len, box, out.buf, &errors);
        }
        Py_END_ALLOW_THREADS
    }
    if (release_buffers(&data, &out, refusal) < 0) {
        return NULL;
    }
    if (failed) {
        PyErr_SetString(PyExc_ValueError, errors.message);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The same JPEG, losslessly, with a restart marker after every MCU and Huffman tables fitted to
 * it (jpegtran -optimize -restart 1B): the coefficients are copied, never requantised, so every
 * decoder makes the same pixels of it; the markers let restart_window cut any box out. Markers
 * of the file's own (EXIF, ICC profiles, comments) are copied; JFIF and Adobe ones are written by
 * libjpeg as the copied parameters say. 0 and a malloc'd buffer, or 1 and errors->message. */
static int with_restart_markers(const unsigned char *data, unsigned long size,
                                unsigned char **out, unsigned long *out_size, Errors *errors) {
    struct jpeg_decompress_struct source;
    struct jpeg_compress_struct target;
    int failed = 0;
    memset(&source, 0, sizeof(source)); /* jpeg_destroy_* is safe on a struct never created */
    memset(&target, 0, sizeof(target));
    source.err = target.err = strict(errors);
    if (setjmp(errors->escape)) {
        failed = 1;
        goto done;
    }
    jpeg_create_decompress(&source);
    jpeg_create_compress(&target);
    jpeg_mem_src(&source, data, size);
    jpeg_save_markers(&source, JPEG_COM, 0xFFFF);
    for (int i = 1; i < 16; i++) {
        if (i != 14) {
            jpeg_save_markers(&source, JPEG_APP0 + i, 0xFFFF);
        }
    }
    jpeg_read_header(&source, TRUE);
    jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&source);
    jpeg_mem_dest(&target, out, out_size); /* *out: the caller's buffer, large enough */
    jpeg_copy_critical_parameters(&source, &target);
    target.restart_interval = 1;
    target.optimize_coding = TRUE;
    jpeg_write_coefficients(&target, coefficients);
    for (jpeg_saved_marker_ptr marker = source.marker_list; marker; marker = marker->next) {
        jpeg_write_marker(&target, marker->marker, marker->data, marker->data_length);
    }
    jpeg_finish_compress(&target);
    jpeg_finish_decompress(&source);
    failed = errors->warned;
done:
    jpeg_destroy_compress(&target);
    jpeg_destroy_decompress(&source);
    return failed;
}

static PyObject *add_restart_markers(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    Errors errors;
    /* libjpeg's memory destination, outgrowing a buffer, moves to one of its own (freeing its
     * own earlier ones, never the caller's) and names it in `out` only when the image is
     * finished: so the first buffer is ours, freed here, and libjpeg's last one too where it
     * named one (a finished image, warnings or not). After an error mid-image a buffer of
     * libjpeg's own may leak; twice the file is rarely outgrown (photographs grow about 2%, flat
     * images several times: each MCU's marker outweighs its few bits of data). */
    unsigned long capacity = 2 * (unsigned long)data.len + 65536;
    unsigned char *buffer = malloc(capacity), *out = buffer;
    unsigned long out_size = capacity;
    if (buffer == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = with_restart_markers(data.buf, (unsigned long)data.len, &out, &out_size, &errors);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *result = NULL;
    if (failed) {
        PyErr_SetString(PyExc_ValueError, errors.message);
    } else {
        result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_size);
    }
    if (out != buffer) {
        free(out);
    }
    free(buffer);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, reduction, left, top, width, height, channels, out): the box's "
     "pixels of a JPEG decoded at 1/reduction, HWC uint8, into out; ValueError on any error."},
    {"add_restart_markers", add_restart_markers, METH_VARARGS,
     "add_restart_markers(data): the JPEG, losslessly, with a restart marker after every MCU; "
     "ValueError on any error."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
