/* Antialiased bilinear resizing of uint8 RGB images with PyTorch's arithmetic, bit for bit
 * (torch.nn.functional.interpolate(..., mode="bilinear", antialias=True) on uint8, which
 * torchvision's resize calls): the same double-precision triangle weights, the same int16 fixed
 * point, the horizontal pass first and its rows rounded to uint8 before the vertical one. Why
 * our own: PyTorch's operator spends as long around its AVX2 kernels as in them for one image
 * (weights built as tensors, three-channel rows one pixel at a time, a pass of its own to
 * mirror); here one call reads the box where the decoder left it and writes the crop, mirrored
 * or not, into its slot of the batch (data/cpu_decode.py; docs/speed.md, "The input pipeline against bare decoding").
 *
 * resize_box(src, width, height, left, top, right, bottom, out, out_width, out_height, mirror)
 * fills `out` (writable, contiguous, out_height * out_width * 3 bytes) with the box of `src`
 * (contiguous HWC RGB, height * width * 3 bytes) resized, flipped left to right where `mirror`.
 * AVX2 only (SIMD says whether this CPU has it and the module was built for x86-64): gray images
 * and other CPUs are resized by PyTorch (data/transforms.py). ValueError for sizes that do not fit
 * or without AVX2; the GIL is released while resizing. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_buffers.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define AVX2_BUILT 1
#else
#define AVX2_BUILT 0
#endif

#define MAX_SIDE (1 << 29)   /* an image's or a box's side: 3 bytes a pixel stay in an int */
#define MAX_OUTPUT 65535     /* a crop's side */

#if AVX2_BUILT
/* One axis's resampling: output sample i is the sum over t < count[i] of weights[i * taps + t]
 * times input sample first[i] + t, in fixed point of `precision` bits. Weights past count[i] are
 * zero, so a vector kernel may read (in bounds) and multiply them. */
typedef struct {
    int taps, precision;
    int *first, *count;
    int16_t *weights;
} Filter;

static void free_filter(Filter *filter) {
    free(filter->first);
    free(filter->count);
    free(filter->weights);
}

static double triangle(double x) {
    x = x < 0.0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* PyTorch's _compute_index_ranges_int16_weights for bilinear, antialiased, align_corners false,
 * the expressions in its order (doubles; the build keeps them unfused: -ffp-contract=off). The
 * weights are stored `taps` apart: the most any output sample has, rounded up to an even number
 * for the kernels' pairs (upsampling has 2, PyTorch's layout 3). 0, or -1 out of memory. */
static int make_filter(int in_size, int out_size, Filter *filter) {
    const double scale = (double)in_size / out_size;
    const double support = scale >= 1.0 ? 1.0 * scale : 1.0;
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    const int max_taps = (int)ceil(support) * 2 + 1;
    double *real = calloc((size_t)out_size * max_taps, sizeof(double));
    filter->first = malloc(sizeof(int) * out_size);
    filter->count = malloc(sizeof(int) * out_size);
    filter->weights = calloc((size_t)out_size * (max_taps + 1), sizeof(int16_t));
    if (real == NULL || !filter->first || !filter->count || !filter->weights) {
        free(real);
        free_filter(filter);
        return -1;
    }
    double largest = 0.0;
    int widest = 0;
    for (int i = 0; i < out_size; i++) {
        const double center = scale * (i + 0.5);
        int64_t first = (int64_t)(center - support + 0.5);
        first = first > 0 ? first : 0;
        int64_t end = (int64_t)(center + support + 0.5);
        int64_t count = (end < in_size ? end : in_size) - first;
        count = count < 0 ? 0 : (count > max_taps ? max_taps : count);
        double *w = real + (size_t)i * max_taps, total = 0.0;
        for (int64_t t = 0; t < count; t++) {
            w[t] = triangle(((double)(t + first) - center + 0.5) * invscale);
            total += w[t];
        }
        if (total != 0.0) {
            for (int64_t t = 0; t < count; t++) {
                w[t] /= total;
                largest = w[t] > largest ? w[t] : largest;
            }
        }
        filter->first[i] = (int)first;
        filter->count[i] = (int)count;
        widest = count > widest ? (int)count : widest;
    }
    int precision = 0;
    for (; precision < 22; precision++) {
        if ((int)(0.5 + largest * (1 << (precision + 1))) >= (1 << 15)) {
            break;
        }
    }
    filter->taps = widest + (widest & 1);
    filter->precision = precision;
    for (int i = 0; i < out_size; i++) {
        for (int t = 0; t < filter->count[i]; t++) {
            const double v = real[(size_t)i * max_taps + t] * (1 << precision);
            filter->weights[(size_t)i * filter->taps + t] =
                (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
        }
    }
    free(real);
    return 0;
}

static inline uint8_t clamp_shift(int32_t sum, int precision) {
    sum >>= precision;
    return (uint8_t)(sum < 0 ? 0 : (sum > 255 ? 255 : sum));
}

/* One output row, or its last bytes, from the input rows filter->first[y] + t, `stride` bytes
 * apart. */
static void vertical_row(const uint8_t *rows, size_t stride, uint8_t *out, size_t length,
                         const Filter *filter, int y, int32_t *sums) {
    const int16_t *k = filter->weights + (size_t)y * filter->taps;
    const uint8_t *first = rows + (size_t)filter->first[y] * stride;
    for (size_t i = 0; i < length; i++) {
        sums[i] = 1 << (filter->precision - 1);
    }
    for (int t = 0; t < filter->count[y]; t++) {
        const uint8_t *row = first + t * stride;
        for (size_t i = 0; i < length; i++) {
            sums[i] += k[t] * row[i];
        }
    }
    for (size_t i = 0; i < length; i++) {
        out[i] = clamp_shift(sums[i], filter->precision);
    }
}

/* Weights 2 * pair and 2 * pair + 1 as the one 32-bit lane a 16-bit multiply-add pairs them in. */
static inline int32_t weight_pair(const int16_t *k, int pair) {
    int32_t both;
    memcpy(&both, k + 2 * pair, sizeof(both));
    return both;
}

/* Two 16-byte loads, of row0 and row1 at `at`, as the two lanes. */
__attribute__((target("avx2"))) static inline __m256i two_rows(const uint8_t *row0,
                                                              const uint8_t *row1, size_t at) {
    return _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row0 + at))),
        _mm_loadu_si128((const __m128i *)(row1 + at)), 1);
}

/* Two rows at once, three channels, one output pixel at a time (any number of taps: downsampling
 * by over 3, where no group of pixels fits horizontal_groups_avx2's loads): each pair of taps is
 * one 16-bit multiply-add of the pair's pixels (shuffled out of a 16-byte load that holds 4
 * taps) by the pair's weights, the rows in the two 128-bit lanes. Reads up to 16 bytes from a
 * tap group's first pixel: the caller keeps that inside the buffer. Each pixel is stored as 4
 * bytes, the fourth overwritten by the next pixel, but for a row's last. */
__attribute__((target("avx2"))) static void horizontal_rows_avx2(
    const uint8_t *row0, const uint8_t *row1, uint8_t *out0, uint8_t *out1,
    const Filter *filter, int width, int mirror) {
    const __m256i pair_masks[2] = {
        _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 0, -1, 3, -1,
                         1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1),
        _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9,
                         -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1),
    };
    const __m256i half = _mm256_set1_epi32(1 << (filter->precision - 1));
    const int pairs = filter->taps / 2;
    for (int q = 0; q < width; q++) {
        const int x = mirror ? width - 1 - q : q;
        const int16_t *k = filter->weights + (size_t)x * filter->taps;
        const size_t at = (size_t)filter->first[x] * 3;
        __m256i sum = half, pixels = _mm256_setzero_si256();
        for (int pair = 0; pair < pairs; pair++) {
            if ((pair & 1) == 0) {
                pixels = two_rows(row0, row1, at + (size_t)pair * 6);
            }
            const __m256i taps = _mm256_shuffle_epi8(pixels, pair_masks[pair & 1]);
            const __m256i weights = _mm256_set1_epi32(weight_pair(k, pair));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(taps, weights));
        }
        sum = _mm256_srai_epi32(sum, filter->precision);
        sum = _mm256_packus_epi16(_mm256_packs_epi32(sum, sum), sum);
        const uint32_t pixel0 = (uint32_t)_mm256_extract_epi32(sum, 0);
        const uint32_t pixel1 = (uint32_t)_mm256_extract_epi32(sum, 4);
        if (q + 1 < width) {
            memcpy(out0 + q * 3, &pixel0, 4);
            memcpy(out1 + q * 3, &pixel1, 4);
        } else {
            memcpy(out0 + q * 3, &pixel0, 3);
            memcpy(out1 + q * 3, &pixel1, 3);
        }
    }
}

/* Output pixels taken `pixels` (4 or 2) at a time, where each such group's taps lie within one
 * 16-byte load of the row (upsampling, mild downsampling), or two (downsampling by up to about
 * 3): per group and row one or two loads, then per round of two taps and per 4 output bytes one
 * shuffle of each load, by a mask made here for that group, and one multiply-add by the matching
 * weights. */
typedef struct {
    int pixels, window, groups, rounds, blocks;
    int *base;        /* each group's first byte in the row */
    int8_t *masks;    /* [group][round][block][window]: each 16-bit lane's byte in a load, or -1 */
    int16_t *weights; /* [group][round][block][8] */
} Groups;

static void free_groups(Groups *groups) {
    free(groups->base);
    free(groups->masks);
    free(groups->weights);
}

/* Output position q holds output sample (mirror ? width - 1 - q : q): the group of positions
 * [from, from + n) reads its samples' taps from byte `*base` of the row; their span in bytes. */
static int group_span(const Filter *filter, int width, int mirror, int from, int n, int *base) {
    int low = INT32_MAX, high = 0;
    for (int q = from; q < from + n && q < width; q++) {
        const int x = mirror ? width - 1 - q : q;
        const int end = filter->first[x] + filter->count[x];
        low = filter->first[x] < low ? filter->first[x] : low;
        high = end > high ? end : high;
    }
    *base = 3 * low;
    return 3 * (high - low);
}

/* The cheapest grouping of the output pixels whose every group's taps fit its window: 4 pixels
 * in 16 bytes, 2 in 16, 4 in 32, 2 in 32 (shuffles per pixel and round: 0.75, 1, 1.5, 2). 1, 0
 * where none fits (downsampling by over about 3), -1 out of memory. */
static int make_groups(const Filter *filter, int width, int mirror, Groups *groups) {
    static const int choices[4][2] = {{4, 16}, {2, 16}, {4, 32}, {2, 32}};
    int base;
    memset(groups, 0, sizeof(*groups));
    for (int c = 0; c < 4 && groups->pixels == 0; c++) {
        int fits = 1;
        for (int from = 0; fits && from < width; from += choices[c][0]) {
            fits = group_span(filter, width, mirror, from, choices[c][0], &base) <= choices[c][1];
        }
        if (fits) {
            groups->pixels = choices[c][0];
            groups->window = choices[c][1];
        }
    }
    if (groups->pixels == 0) {
        return 0;
    }
    const int pixels = groups->pixels, window = groups->window;
    groups->groups = (width + pixels - 1) / pixels;
    groups->rounds = filter->taps / 2;
    groups->blocks = (3 * pixels + 3) / 4;
    const size_t entries = (size_t)groups->groups * groups->rounds * groups->blocks;
    groups->base = malloc(sizeof(int) * groups->groups);
    groups->masks = malloc(entries * window);
    groups->weights = calloc(entries * 8, sizeof(int16_t));
    if (!groups->base || !groups->masks || !groups->weights) {
        free_groups(groups);
        return -1;
    }
    memset(groups->masks, -1, entries * window);
    for (int g = 0; g < groups->groups; g++) {
        const int from = g * pixels;
        group_span(filter, width, mirror, from, pixels, &groups->base[g]);
        for (int p = 0; p < pixels && from + p < width; p++) {
            const int x = mirror ? width - 1 - (from + p) : from + p;
            const int16_t *k = filter->weights + (size_t)x * filter->taps;
            const int at = 3 * filter->first[x] - groups->base[g];
            for (int t = 0; t < filter->count[x]; t++) {
                for (int byte = 3 * p; byte < 3 * p + 3; byte++) { /* the pixel's output bytes */
                    const size_t entry =
                        ((size_t)g * groups->rounds + t / 2) * groups->blocks + byte / 4;
                    const int lane = (byte % 4) * 2 + t % 2; /* a 16-bit lane: its low byte */
                    const int in = at + 3 * t + byte - 3 * p;
                    const size_t at_byte = entry * window + (in < 16 ? 0 : 16) + 2 * lane;
                    groups->masks[at_byte] = (int8_t)(in % 16);
                    groups->weights[entry * 8 + lane] = k[t];
                }
            }
        }
    }
    return 1;
}

/* The 16-bit lanes `mask` picks from `low` (and from `high`, the next 16 bytes, when `wide`),
 * multiply-added by `weights`; each 128-bit lane a row. */
__attribute__((target("avx2"))) static inline __m256i tap_pairs(__m256i low, __m256i high,
                                                               int wide, const int8_t *mask,
                                                               const int16_t *weights) {
    const __m256i k = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)weights));
    __m256i taps = _mm256_shuffle_epi8(
        low, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mask)));
    if (wide) {
        taps = _mm256_or_si256(
            taps, _mm256_shuffle_epi8(high, _mm256_broadcastsi128_si256(
                                                _mm_loadu_si128((const __m128i *)(mask + 16)))));
    }
    return _mm256_madd_epi16(taps, k);
}

__attribute__((target("avx2"))) static void horizontal_groups_avx2(
    const uint8_t *row0, const uint8_t *row1, uint8_t *out0, uint8_t *out1,
    const Groups *groups, int width, int precision) {
    const __m256i half = _mm256_set1_epi32(1 << (precision - 1));
    const __m128i shift = _mm_cvtsi32_si128(precision);
    const int blocks = groups->blocks, window = groups->window, wide = window == 32;
    const int8_t *masks = groups->masks;
    const int16_t *weights = groups->weights;
    for (int g = 0; g < groups->groups; g++) {
        const int at = groups->base[g];
        const __m256i low = two_rows(row0, row1, at);
        const __m256i high = wide ? two_rows(row0, row1, at + 16) : low;
        __m256i sum0 = half, sum1 = half, sum2 = half;
        for (int round = 0; round < groups->rounds; round++) {
            sum0 = _mm256_add_epi32(sum0, tap_pairs(low, high, wide, masks, weights));
            sum1 = _mm256_add_epi32(sum1, tap_pairs(low, high, wide, masks + window, weights + 8));
            if (blocks == 3) {
                sum2 = _mm256_add_epi32(
                    sum2, tap_pairs(low, high, wide, masks + 2 * window, weights + 16));
            }
            masks += window * blocks;
            weights += 8 * blocks;
        }
        const __m256i bytes = _mm256_packus_epi16(
            _mm256_packs_epi32(_mm256_sra_epi32(sum0, shift), _mm256_sra_epi32(sum1, shift)),
            _mm256_packs_epi32(_mm256_sra_epi32(sum2, shift), half));
        const int from = g * groups->pixels;
        if (3 * from + 16 <= 3 * width) { /* 16 bytes: later groups overwrite the excess */
            _mm_storeu_si128((__m128i *)(out0 + 3 * from), _mm256_castsi256_si128(bytes));
            _mm_storeu_si128((__m128i *)(out1 + 3 * from), _mm256_extracti128_si256(bytes, 1));
        } else {
            uint8_t last[32];
            _mm256_storeu_si256((__m256i *)last, bytes);
            const int n = width - from < groups->pixels ? width - from : groups->pixels;
            memcpy(out0 + 3 * from, last, 3 * n);
            memcpy(out1 + 3 * from, last + 16, 3 * n);
        }
    }
}

/* One output row, 32 bytes at a time: each pair of input rows is interleaved byte by byte into
 * 16-bit pairs and multiply-added with the pair's weights; the rest of the row as vertical_row. */
__attribute__((target("avx2"))) static void vertical_row_avx2(
    const uint8_t *rows, size_t stride, uint8_t *out, size_t length, const Filter *filter, int y,
    int32_t *sums) {
    const int16_t *k = filter->weights + (size_t)y * filter->taps;
    const uint8_t *first = rows + (size_t)filter->first[y] * stride;
    const int count = filter->count[y], pairs = (count + 1) / 2;
    const __m256i zero = _mm256_setzero_si256();
    const __m256i half = _mm256_set1_epi32(1 << (filter->precision - 1));
    size_t i = 0;
    for (; i + 32 <= length; i += 32) {
        __m256i s0 = half, s1 = half, s2 = half, s3 = half;
        for (int pair = 0; pair < pairs; pair++) {
            const uint8_t *upper = first + (size_t)(2 * pair) * stride + i;
            /* An odd count's last pair: its second weight is zero, its row any row in bounds. */
            const uint8_t *lower = 2 * pair + 1 < count ? upper + stride : upper;
            const __m256i a = _mm256_loadu_si256((const __m256i *)upper);
            const __m256i b = _mm256_loadu_si256((const __m256i *)lower);
            const __m256i weights = _mm256_set1_epi32(weight_pair(k, pair));
            const __m256i low = _mm256_unpacklo_epi8(a, b), high = _mm256_unpackhi_epi8(a, b);
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(low, zero), weights));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(low, zero), weights));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(high, zero), weights));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(high, zero), weights));
        }
        const __m128i shift = _mm_cvtsi32_si128(filter->precision);
        const __m256i first_half = _mm256_packs_epi32(_mm256_sra_epi32(s0, shift),
                                                      _mm256_sra_epi32(s1, shift));
        const __m256i second_half = _mm256_packs_epi32(_mm256_sra_epi32(s2, shift),
                                                       _mm256_sra_epi32(s3, shift));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_packus_epi16(first_half, second_half));
    }
    if (i < length) {
        vertical_row(rows + i, stride, out + i, length - i, filter, y, sums);
    }
}

typedef struct {
    const uint8_t *src;
    size_t src_length;
    int width, left, top, box_width, box_height;
    uint8_t *out;
    int out_width, out_height, mirror;
} Job;

/* `row`'s first `reach` bytes in `padded`, those past the buffer's end (`available` away) zero. */
static const uint8_t *padded_row(const uint8_t *row, size_t available, size_t reach,
                                 uint8_t *padded) {
    const size_t kept = available < reach ? available : reach;
    memcpy(padded, row, kept);
    memset(padded + kept, 0, reach - kept);
    return padded;
}

/* All the box's rows, two at a time; where a kernel's loads, `reach` bytes from a row's first,
 * would leave the buffer (`end` bytes from the box's first: its last rows), from copies padded
 * with zeros; a last odd row with a copy of itself. 0, or -1 out of memory. */
static int horizontal_avx2(const Job *job, const Filter *filter, const uint8_t *box, size_t end,
                           uint8_t *into) {
    const size_t stride = (size_t)job->width * 3, out_stride = (size_t)job->out_width * 3;
    Groups groups;
    const int grouped = make_groups(filter, job->out_width, job->mirror, &groups);
    if (grouped < 0) {
        return -1;
    }
    const size_t last_first = (size_t)filter->first[job->out_width - 1] * 3;
    size_t reach = last_first + (size_t)(filter->taps / 4) * 12 + 16;
    if (grouped) {
        reach = 0;
        for (int g = 0; g < groups.groups; g++) {
            const size_t group_reach = (size_t)groups.base[g] + groups.window;
            reach = group_reach > reach ? group_reach : reach;
        }
    }
    uint8_t *scratch = NULL;
    int failed = 0;
    for (int y = 0; y < job->box_height; y += 2) {
        const int last = y + 1 == job->box_height;
        const uint8_t *row0 = box + (size_t)y * stride, *row1 = row0 + stride;
        uint8_t *out0 = into + (size_t)y * out_stride, *out1 = out0 + out_stride;
        if (last || (size_t)(y + 1) * stride + reach > end) {
            if (scratch == NULL && (scratch = malloc(2 * reach + out_stride)) == NULL) {
                failed = 1;
                break;
            }
            row0 = padded_row(row0, end - (size_t)y * stride, reach, scratch);
            row1 = last ? row0
                        : padded_row(row1, end - (size_t)(y + 1) * stride, reach, scratch + reach);
            out1 = last ? scratch + 2 * reach : out1;
        }
        if (grouped) {
            horizontal_groups_avx2(row0, row1, out0, out1, &groups, job->out_width,
                                   filter->precision);
        } else {
            horizontal_rows_avx2(row0, row1, out0, out1, filter, job->out_width, job->mirror);
        }
    }
    free(scratch);
    free_groups(&groups);
    return failed ? -1 : 0;
}

/* 0, or -1 out of memory. A box as tall as the output needs no vertical pass (its weights would
 * copy each row): the horizontal one writes the output. */
static int resize(const Job *job) {
    const size_t stride = (size_t)job->width * 3, length = (size_t)job->out_width * 3;
    const uint8_t *box = job->src + (size_t)job->top * stride + (size_t)job->left * 3;
    const size_t end = job->src_length - (size_t)(box - job->src);
    Filter across = {0}, down = {0};
    if (make_filter(job->box_width, job->out_width, &across) != 0) {
        return -1;
    }
    if (job->box_height == job->out_height) {
        const int failed = horizontal_avx2(job, &across, box, end, job->out);
        free_filter(&across);
        return failed;
    }
    uint8_t *rows = malloc(length * job->box_height);
    int32_t *sums = malloc(sizeof(int32_t) * length);
    int failed =
        rows == NULL || sums == NULL || make_filter(job->box_height, job->out_height, &down) != 0;
    if (!failed) {
        failed = horizontal_avx2(job, &across, box, end, rows) != 0;
        for (int y = 0; !failed && y < job->out_height; y++) {
            vertical_row_avx2(rows, length, job->out + y * length, length, &down, y, sums);
        }
        free_filter(&down);
    }
    free(rows);
    free(sums);
    free_filter(&across);
    return failed ? -1 : 0;
}

static int avx2_usable(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
}
#else
static int avx2_usable(void) { return 0; }
#endif

static int has_avx2;

static const char *refusal(int width, int height, long long left, long long top, long long right,
                           long long bottom, size_t src_length, int out_width, int out_height,
                           size_t out_length) {
    if (!has_avx2) {
        return "needs a CPU with AVX2 and the module built for x86-64 (see SIMD)";
    }
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE) {
        return "the image must be 1 to 536870912 pixels a side";
    }
    if ((size_t)width * height * 3 > src_length) {
        return "the image buffer is smaller than width * height * 3";
    }
    if (left < 0 || top < 0 || right <= left || bottom <= top || right > width || bottom > height) {
        return "the box must be non-empty and inside the image";
    }
    if (out_width < 1 || out_height < 1 || out_width > MAX_OUTPUT || out_height > MAX_OUTPUT) {
        return "the output must be 1 to 65535 pixels a side";
    }
    if ((size_t)out_width * out_height * 3 > out_length) {
        return "the output buffer is smaller than out_width * out_height * 3";
    }
    return NULL;
}

static PyObject *resize_box(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    int width, height, left, top, right, bottom, out_width, out_height, mirror;
    if (!PyArg_ParseTuple(args, "y*iiiiiiw*iip", &src, &width, &height, &left, &top, &right,
                          &bottom, &out, &out_width, &out_height, &mirror)) {
        return NULL;
    }
    const char *refused = refusal(width, height, left, top, right, bottom, (size_t)src.len,
                                  out_width, out_height, (size_t)out.len);
    int failed = 0;
#if AVX2_BUILT
    if (refused == NULL) {
        const Job job = {src.buf, (size_t)src.len, width, left, top, right - left, bottom - top,
                         out.buf, out_width, out_height, mirror};
        Py_BEGIN_ALLOW_THREADS
        failed = resize(&job);
        Py_END_ALLOW_THREADS
    }
#endif
    if (release_buffers(&src, &out, refused) < 0) {
        return NULL;
    }
    if (failed) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resize_box", resize_box, METH_VARARGS,
     "resize_box(src, width, height, left, top, right, bottom, out, out_width, out_height, "
     "mirror): the box of an HWC RGB uint8 image resized into out, bilinear antialiased with "
     "PyTorch's uint8 arithmetic, mirrored where asked; ValueError on bad sizes or no AVX2."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample", NULL, -1, methods};

PyMODINIT_FUNC PyInit__resample(void) {
    has_avx2 = avx2_usable();
    PyObject *created = PyModule_Create(&module);
    if (created != NULL && PyModule_AddIntConstant(created, "SIMD", has_avx2 != 0) != 0) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
