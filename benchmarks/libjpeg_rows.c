/* What a libjpeg-turbo decode costs by how its rows are asked for, and in its fast modes: one row a
 * call, all rows in one call, 16-row blocks copied out (what data/formats/_jpeg_region.c does),
 * 16-row blocks with the fast IDCT and merged upsampling. Whole frames, one core, RGB out.
 * Build and run (docs/speed.md, "The input pipeline against bare decoding"):
 *   gcc -O2 -o /tmp/libjpeg_rows benchmarks/libjpeg_rows.c -ljpeg
 *   /tmp/libjpeg_rows $(find /tmp/bd/files_photos_640 -name '*.jpg' | sort | head -300) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>

enum { ONE_ROW, ALL_ROWS, BLOCKS, FAST_BLOCKS, WAYS };
static const char *NAMES[WAYS] = {"one row a call", "all rows in one call", "16-row blocks",
                                  "16-row blocks, fast IDCT + merged upsampling"};
enum { BLOCK_ROWS = 16, MAX_ROWS = 8192, MAX_COLUMNS = 8192 };

static double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static void decode(const unsigned char *data, unsigned long size, int way, unsigned char *out) {
    struct jpeg_decompress_struct info;
    struct jpeg_error_mgr errors;
    info.err = jpeg_std_error(&errors);
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, data, size);
    jpeg_read_header(&info, TRUE);
    info.out_color_space = JCS_RGB;
    if (way == FAST_BLOCKS) {
        info.dct_method = JDCT_IFAST;
        info.do_fancy_upsampling = FALSE;
    }
    jpeg_start_decompress(&info);
    if (info.output_height > MAX_ROWS || info.output_width > MAX_COLUMNS) {
        fprintf(stderr, "a %ux%u image is larger than this benchmark's buffers\n",
                info.output_width, info.output_height);
        exit(2);
    }
    size_t row_bytes = (size_t)info.output_width * 3;
    JSAMPROW rows[MAX_ROWS];
    if (way == ALL_ROWS) {
        for (JDIMENSION y = 0; y < info.output_height && y < MAX_ROWS; y++) {
            rows[y] = out + y * row_bytes;
        }
        while (info.output_scanline < info.output_height) {
            jpeg_read_scanlines(&info, rows + info.output_scanline,
                                info.output_height - info.output_scanline);
        }
    } else {
        int block = way == ONE_ROW ? 1 : BLOCK_ROWS;
        unsigned char *buffer = malloc(row_bytes * (size_t)block);
        for (int i = 0; i < block; i++) {
            rows[i] = buffer + (size_t)i * row_bytes;
        }
        while (info.output_scanline < info.output_height) {
            JDIMENSION first = info.output_scanline;
            JDIMENSION got = jpeg_read_scanlines(&info, rows, (JDIMENSION)block);
            for (JDIMENSION i = 0; i < got; i++) {
                memcpy(out + (first + i) * row_bytes, rows[i], row_bytes);
            }
        }
        free(buffer);
    }
    jpeg_finish_decompress(&info);
    jpeg_destroy_decompress(&info);
}

int main(int argc, char **argv) {
    int count = argc - 1;
    unsigned char **files = malloc((size_t)count * sizeof(*files));
    unsigned long *sizes = malloc((size_t)count * sizeof(*sizes));
    unsigned char *out = malloc((size_t)MAX_ROWS * MAX_COLUMNS * 3);
    for (int i = 0; i < count; i++) {
        FILE *file = fopen(argv[i + 1], "rb");
        if (file == NULL) {
            fprintf(stderr, "cannot open %s\n", argv[i + 1]);
            return 2;
        }
        fseek(file, 0, SEEK_END);
        sizes[i] = (unsigned long)ftell(file);
        fseek(file, 0, SEEK_SET);
        files[i] = malloc(sizes[i]);
        if (fread(files[i], 1, sizes[i], file) != sizes[i]) {
            return 2;
        }
        fclose(file);
    }
    for (int round = 0; round < 5; round++) {
        for (int way = 0; way < WAYS; way++) {
            double started = seconds();
            for (int i = 0; i < count; i++) {
                decode(files[i], sizes[i], way, out);
            }
            printf("%s: %.0f us; ", NAMES[way], (seconds() - started) / count * 1e6);
        }
        printf("\n");
    }
    return 0;
}
