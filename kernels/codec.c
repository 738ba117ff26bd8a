/* The wire codecs on the CPU (kernels/codec.h; layouts in core/codec.h):
 * encode with error feedback and nearest or stochastic rounding, checked decode.
 *
 * Work is per block (fp32/bf16: per chunk of elements), blocks in parallel
 * with OpenMP for large payloads: every block is computed on its own, so the
 * bytes and floats do not depend on the number of threads. Element loops are
 * written for the vectoriser (no early exits; a vector flag finds a bad
 * element, a scalar rescan names it). This file is compiled with
 * -ffp-contract=off (kernels/CMakeLists.txt): decode is q * s, then + base. */
#include "kernels/codec.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/err.h"
#include "kernels/codec_elem.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kernels/codec.c copies little-endian payload fields with memcpy: little-endian hosts only"
#endif

/* Below this many elements one thread does the whole payload. */
#define PAR_MIN ((uint64_t)1 << 16)
#define FLAT_CHUNK DL_CX_FLAT_CHUNK
#define NONE UINT64_MAX
/* a block encoder's "could not allocate its scratch" (topk's key buffer) */
#define NOMEM (UINT64_MAX - 1)

static const char *const rounding_names[] = {"nearest", "stochastic"};

int dl_codec_push_opts(const char *codec, long long block, long long topk, const char *rounding, dl_codec *out,
                       dl_codec_rounding *rounding_out)
{
    dl_codec_id id;
    DL_TRY(dl_codec_parse(codec, &id));
    *out = (dl_codec){.id = id};
    if (block % 2)
        return dl_err(DL_EINVAL, "option push_block: %lld is odd (a block of the 4-bit codecs holds whole bytes)", block);
    if (dl_codec_is_block(id)) out->block = (uint32_t)block;
    if (id == DL_CODEC_TOPK) {
        if (2 * topk > block)
            return dl_err(DL_EINVAL, "option push_topk: %lld is more than half of push_block %lld", topk, block);
        out->topk = (uint32_t)topk;
    }
    char why[160];
    if (dl_codec_check(out, why, sizeof why)) return dl_err(DL_EINVAL, "option push_codec: %s", why);
    return dl_codec_rounding_parse(rounding, rounding_out);
}

int dl_codec_rounding_parse(const char *name, dl_codec_rounding *out)
{
    for (int i = 0; i < 2; i++)
        if (name && !strcmp(name, rounding_names[i])) {
            *out = (dl_codec_rounding)i;
            return 0;
        }
    return dl_err(DL_EINVAL, "unknown rounding '%s' (nearest|stochastic)", name ? name : "");
}

const char *dl_codec_rounding_name(int rounding)
{
    return rounding == 0 || rounding == 1 ? rounding_names[rounding] : "unknown";
}

/* ---- geometry: blocks of b elements, the last b_j = n - j*b may be shorter */

typedef struct {
    uint64_t b;      /* elements per work item (block, or FLAT_CHUNK) */
    uint64_t nb;     /* work items */
    uint64_t stride; /* payload bytes of a full item */
} geom;

static uint64_t item_bytes(const dl_codec *c, uint64_t bj)
{
    return dl_cx_item_bytes(c->id, c->topk, bj);
}

static geom geom_of(const dl_codec *c, uint64_t n)
{
    geom g;
    g.b = dl_codec_is_block(c->id) ? c->block : FLAT_CHUNK;
    g.nb = (n + g.b - 1) / g.b;
    g.stride = item_bytes(c, g.b);
    return g;
}

static inline float ld_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* y = x + r of element i (r NULL: x) */
static inline float y_of(const float *x, const float *r, uint64_t i)
{
    return r ? x[i] + r[i] : x[i];
}

/* max of |y| as ordered bits over [0, bj); > DL_CX_FINITE_MAX when some y is not finite */
static uint32_t absmax_bits(const float *x, const float *r, uint64_t bj)
{
    uint32_t m = 0;
    if (r) {
#pragma omp simd reduction(max : m)
        for (uint64_t i = 0; i < bj; i++) {
            uint32_t k = DL_CX_ABS_BITS(dl_cx_bits(x[i] + r[i]));
            m = k > m ? k : m;
        }
    } else {
#pragma omp simd reduction(max : m)
        for (uint64_t i = 0; i < bj; i++) {
            uint32_t k = DL_CX_ABS_BITS(dl_cx_bits(x[i]));
            m = k > m ? k : m;
        }
    }
    return m;
}

static uint64_t first_nonfinite(const float *x, const float *r, uint64_t bj)
{
    for (uint64_t i = 0; i < bj; i++)
        if (!isfinite(y_of(x, r, i))) return i;
    return NONE;
}

/* ---- encode, one work item. Returns NONE, or 2 * (the index in the item of
 * the first element that cannot be encoded) + why: 0 y not finite, 1 y
 * beyond bf16's range (then r of the item is already overwritten). */

static uint64_t enc_fp32(const float *x, float *r, uint64_t bj, uint8_t *o)
{
    if (absmax_bits(x, r, bj) > DL_CX_FINITE_MAX) return 2 * first_nonfinite(x, r, bj);
    if (r) {
        for (uint64_t i = 0; i < bj; i++) {
            float y = x[i] + r[i];
            memcpy(o + 4 * i, &y, 4);
            r[i] = 0.0f; /* y - y */
        }
    } else {
        memcpy(o, x, 4 * bj);
    }
    return NONE;
}

static uint64_t enc_bf16(const float *x, float *r, uint64_t bj, uint8_t *o)
{
    if (absmax_bits(x, r, bj) > DL_CX_FINITE_MAX) /* the first fault of either kind, nothing written */
        for (uint64_t i = 0; i < bj; i++) {
            float y = y_of(x, r, i);
            if (!isfinite(y)) return 2 * i;
            if ((dl_cx_bf16(y) & 0x7f80u) == 0x7f80u) return 2 * i + 1;
        }
    int over = 0;
#pragma omp simd reduction(| : over)
    for (uint64_t i = 0; i < bj; i++) {
        float y = y_of(x, r, i);
        uint16_t h = dl_cx_bf16(y);
        over |= (h & 0x7f80u) == 0x7f80u;
        memcpy(o + 2 * i, &h, 2);
        if (r) r[i] = y - dl_cx_bf16_value(h);
    }
    if (over)
        for (uint64_t i = 0; i < bj; i++) {
            uint16_t h;
            memcpy(&h, o + 2 * i, 2);
            if ((h & 0x7f80u) == 0x7f80u) return 2 * i + 1;
        }
    return NONE;
}

/* Elements per inner run of int4/e3m0: codes go to a small buffer, then are
 * packed two to a byte (both loops vectorise). */
#define RUN 256

#define INLINE static inline __attribute__((always_inline))

/* Codes (one per byte: int8 q, int4 q & 15, e3m0 sign|e) and residuals of m
 * elements with scale s > 0. id, has_r and st are constants at every call
 * site, so each combination compiles to its own branch-free vector loop. */
INLINE void quant_run(dl_codec_id id, int has_r, int st, const float *x, float *r, uint64_t m, float s,
                      uint64_t seed, uint64_t idx0, uint8_t *c)
{
#pragma omp simd
    for (uint64_t i = 0; i < m; i++) {
        float y = has_r ? x[i] + r[i] : x[i];
        float ay = fabsf(y);
        float u = st ? dl_cx_uniform(seed, idx0 + i) : 0.0f;
        float v;
        if (id == DL_CODEC_E3M0) {
            int l = dl_cx_e3m0_level(ay, s, st, u);
            unsigned nib = dl_cx_e3m0_nib(l, y);
            c[i] = (uint8_t)nib;
            v = dl_cx_e3m0_value(nib, s);
        } else {
            int l = dl_cx_int_level(ay, s, id == DL_CODEC_INT8 ? DL_CX_INT8_TOP : DL_CX_INT4_TOP, st, u);
            int q = y < 0.0f ? -l : l;
            c[i] = id == DL_CODEC_INT8 ? (uint8_t)(int8_t)q : (uint8_t)((unsigned)q & 0xfu);
            v = (float)q * s;
        }
        if (has_r) r[i] = y - v;
    }
}

INLINE void quant_block(dl_codec_id id, int has_r, int st, const float *x, float *r, uint64_t bj, float s,
                        uint64_t seed, uint64_t idx0, uint8_t *q)
{
    if (id == DL_CODEC_INT8) {
        quant_run(id, has_r, st, x, r, bj, s, seed, idx0, q);
        return;
    }
    uint8_t c[RUN];
    for (uint64_t i0 = 0; i0 < bj; i0 += RUN) {
        uint64_t m = bj - i0 < RUN ? bj - i0 : RUN;
        quant_run(id, has_r, st, x + i0, has_r ? r + i0 : NULL, m, s, seed, idx0 + i0, c);
        if (m & 1) c[m] = 0; /* the padding nibble of an odd last block */
        uint8_t *o = q + i0 / 2;
#pragma omp simd
        for (uint64_t p = 0; p < (m + 1) / 2; p++) o[p] = (uint8_t)(c[2 * p] | c[2 * p + 1] << 4);
    }
}

#define QUANT_ID(ID) \
    (r ? (st ? quant_block(ID, 1, 1, x, r, bj, s, seed, idx0, q) : quant_block(ID, 1, 0, x, r, bj, s, seed, idx0, q)) \
       : (st ? quant_block(ID, 0, 1, x, r, bj, s, seed, idx0, q) : quant_block(ID, 0, 0, x, r, bj, s, seed, idx0, q)))

/* int8 / int4 / e3m0: the scale, then the codes */
static uint64_t enc_scaled(const dl_codec_enc *e, const float *x, float *r, uint64_t bj, uint64_t idx0,
                           uint8_t *o)
{
    uint32_t m = absmax_bits(x, r, bj);
    if (m > DL_CX_FINITE_MAX) return 2 * first_nonfinite(x, r, bj);
    dl_codec_id id = e->c.id;
    float a = dl_cx_float(m);
    float s = id == DL_CODEC_INT8 ? a / (float)DL_CX_INT8_TOP : id == DL_CODEC_INT4 ? a / (float)DL_CX_INT4_TOP : a;
    memcpy(o, &s, 4);
    uint8_t *q = o + 4;
    if (s == 0.0f) { /* absmax 0 (or an absmax so small that absmax / top underflows) */
        memset(q, 0, id == DL_CODEC_INT8 ? bj : (bj + 1) / 2);
        if (r)
            for (uint64_t i = 0; i < bj; i++) r[i] = (x[i] + r[i]) - 0.0f;
        return NONE;
    }
    int st = e->rounding == DL_ROUND_STOCHASTIC;
    uint64_t seed = e->seed;
    switch (id) {
    case DL_CODEC_INT8: QUANT_ID(DL_CODEC_INT8); break;
    case DL_CODEC_INT4: QUANT_ID(DL_CODEC_INT4); break;
    default: QUANT_ID(DL_CODEC_E3M0); break;
    }
    return NONE;
}

/* number of keys >= t */
static uint64_t count_ge(const uint32_t *key, uint64_t bj, uint32_t t)
{
    uint32_t c = 0;
#pragma omp simd reduction(+ : c)
    for (uint64_t i = 0; i < bj; i++) c += key[i] >= t;
    return c;
}

/* Elements of the key buffer on the stack; larger topk blocks use the heap. */
#define TOPK_STACK 4096

/* topk: the k_j largest |y| (ties: the lower index), in index order. The
 * keys (|y| as ordered bits) go to a buffer; the threshold T, the k_j-th
 * largest key, is found by bisection on the key bits (vector counts),
 * stopping early at a t with exactly k_j keys >= t (that set is the answer
 * too); then every key > T is kept and the first (k_j - #(> T)) keys == T. */
static uint64_t enc_topk(const dl_codec *c, const float *x, float *r, uint64_t bj, uint8_t *o)
{
    uint32_t stack[TOPK_STACK], *key = bj <= TOPK_STACK ? stack : dl_try_malloc(bj * sizeof *key), m = 0;
    if (!key) return NOMEM;
#pragma omp simd reduction(max : m)
    for (uint64_t i = 0; i < bj; i++) {
        uint32_t kk = DL_CX_ABS_BITS(dl_cx_bits(y_of(x, r, i)));
        key[i] = kk;
        m = kk > m ? kk : m;
    }
    if (m > DL_CX_FINITE_MAX) {
        if (key != stack) free(key);
        return 2 * first_nonfinite(x, r, bj);
    }
    uint64_t k = bj < c->topk ? bj : c->topk;
    uint32_t lo = 0, hi = m; /* count_ge(lo) >= k always, the answer is in [lo, hi] */
    /* first down from absmax by powers of two (the k-th largest is usually
     * within a few octaves of it), then bisection inside the bracket */
    for (uint32_t d = 1u << 23; lo < hi && d <= (8u << 23); d += 1u << 23) {
        uint32_t t = hi > d ? m - d : 0; /* hi == m until the bracket is found */
        uint64_t cnt = count_ge(key, bj, t);
        if (cnt >= k) {
            lo = t;
            if (cnt == k) hi = t;
            break;
        }
        hi = t - 1;
    }
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        uint64_t cnt = count_ge(key, bj, mid);
        if (cnt >= k) lo = mid;
        if (cnt == k) break;
        if (cnt < k) hi = mid - 1;
    }
    uint64_t gt = count_ge(key, bj, lo + 1), ties = k - gt, w = 0;
    if (count_ge(key, bj, lo) == k) { /* every tie kept (distinct keys, early exit): keep = key >= T */
        for (uint64_t c0 = 0; c0 < bj; c0 += 64) { /* 64 keys to a bit mask, then its set bits */
            uint64_t mk = 0, m64 = bj - c0 < 64 ? bj - c0 : 64;
#pragma omp simd reduction(| : mk)
            for (uint64_t i = 0; i < m64; i++) mk |= (uint64_t)(key[c0 + i] >= lo) << i;
            for (; mk; mk &= mk - 1) {
                uint64_t i = c0 + (uint64_t)__builtin_ctzll(mk);
                float y = y_of(x, r, i);
                uint16_t ix = (uint16_t)i;
                memcpy(o + 6 * w, &ix, 2);
                memcpy(o + 6 * w + 2, &y, 4);
                w++;
            }
        }
        if (r) {
#pragma omp simd
            for (uint64_t i = 0; i < bj; i++) r[i] = key[i] >= lo ? 0.0f : x[i] + r[i];
        }
    } else {
        for (uint64_t i = 0; i < bj; i++) {
            int keep = key[i] > lo || (key[i] == lo && ties > 0);
            if (key[i] == lo && keep) ties--;
            if (keep) {
                float y = y_of(x, r, i);
                uint16_t ix = (uint16_t)i;
                memcpy(o + 6 * w, &ix, 2);
                memcpy(o + 6 * w + 2, &y, 4);
                w++;
                if (r) r[i] = 0.0f;
            } else if (r) {
                r[i] = x[i] + r[i];
            }
        }
    }
    assert(w == k);
    if (key != stack) free(key);
    return NONE;
}

int dl_codec_enc_args_(const dl_codec_enc *e, uint64_t n, uint64_t first)
{
    assert(e);
    char why[160];
    const dl_codec *c = &e->c;
    if (dl_codec_check(c, why, sizeof why)) return DL_EINVAL;
    if (e->rounding != DL_ROUND_NEAREST && e->rounding != DL_ROUND_STOCHASTIC)
        return dl_err(DL_EINVAL, "%s encode: unknown rounding %d", dl_codec_name(c->id), (int)e->rounding);
    if (dl_codec_is_block(c->id) && first % c->block)
        return dl_err(DL_EINVAL, "%s encode: first element %llu is not on a block of %u", dl_codec_name(c->id),
                      (unsigned long long)first, c->block);
    if (n == 0) return 1;
    if (!dl_codec_bytes(c, n))
        return dl_err(DL_EINVAL, "%s encode: %llu elements have no payload size", dl_codec_name(c->id),
                      (unsigned long long)n);
    return 0;
}

int dl_codec_enc_fail_(const dl_codec *c, uint64_t bad, uint64_t first, float x, float y)
{
    uint64_t i = bad / 2;
    if (bad & 1)
        return dl_err(DL_EINVAL, "bf16 encode: element %llu (fragment element %llu): x = %g, y = x + r is beyond bf16's range",
                      (unsigned long long)i, (unsigned long long)(first + i), (double)x);
    return dl_err(DL_EINVAL, "%s encode: element %llu (fragment element %llu): y = x + r = %g is not finite",
                  dl_codec_name(c->id), (unsigned long long)i, (unsigned long long)(first + i), (double)y);
}

int dl_codec_encode(const dl_codec_enc *e, const float *x, float *r, uint64_t n, uint64_t first, uint8_t *out)
{
    int rc = dl_codec_enc_args_(e, n, first);
    if (rc) return rc < 0 ? rc : 0;
    const dl_codec *c = &e->c;
    assert(x && out);
    geom g = geom_of(c, n);
    uint64_t bad = NONE;
    int nomem = 0;
#pragma omp parallel for schedule(static) reduction(min : bad) reduction(| : nomem) if (g.nb > 1 && n >= PAR_MIN)
    for (uint64_t j = 0; j < g.nb; j++) {
        uint64_t i0 = j * g.b, bj = n - i0 < g.b ? n - i0 : g.b, b;
        const float *xj = x + i0;
        float *rj = r ? r + i0 : NULL;
        uint8_t *o = out + j * g.stride;
        switch (c->id) {
        case DL_CODEC_FP32: b = enc_fp32(xj, rj, bj, o); break;
        case DL_CODEC_BF16: b = enc_bf16(xj, rj, bj, o); break;
        case DL_CODEC_TOPK: b = enc_topk(c, xj, rj, bj, o); break;
        default: b = enc_scaled(e, xj, rj, bj, first + i0, o); break;
        }
        if (b == NOMEM) nomem = 1;
        else if (b != NONE && 2 * i0 + b < bad) bad = 2 * i0 + b;
    }
    if (nomem)
        return dl_err(DL_ENOMEM, "%s encode: no memory for a block's scratch (%u elements)", dl_codec_name(c->id),
                      (unsigned)g.b);
    if (bad != NONE) return dl_codec_enc_fail_(c, bad, first, x[bad / 2], y_of(x, r, bad / 2));
    return 0;
}

/* ---- decode: a checking pass over the whole payload (nothing written),
 * then the decoding pass. Each item check has a vector test and a scalar
 * rescan that writes the reason. Returns 0 when the item is valid. */

static int bad_scale(const dl_codec *c, uint64_t j, float s, char *why, size_t cap)
{
    if (isfinite(s) && s >= 0.0f) return 0;
    snprintf(why, cap, "%s block %llu: scale %g is %s", dl_codec_name(c->id), (unsigned long long)j, (double)s,
             isfinite(s) ? "negative" : "not finite");
    return 1;
}

static int check_item(const dl_codec *c, uint64_t j, uint64_t i0, const uint8_t *p, uint64_t bj, char *why,
                      size_t cap)
{
    const char *name = dl_codec_name(c->id);
    int bad = 0;
    switch (c->id) {
    case DL_CODEC_FP32:
#pragma omp simd reduction(| : bad)
        for (uint64_t i = 0; i < bj; i++) bad |= DL_CX_ABS_BITS(dl_cx_bits(ld_f32(p + 4 * i))) > DL_CX_FINITE_MAX;
        if (!bad) return 0;
        for (uint64_t i = 0; i < bj; i++) {
            float v = ld_f32(p + 4 * i);
            if (!isfinite(v)) {
                snprintf(why, cap, "fp32 element %llu: %g is not finite", (unsigned long long)(i0 + i), (double)v);
                return 1;
            }
        }
        return 0;
    case DL_CODEC_BF16:
#pragma omp simd reduction(| : bad)
        for (uint64_t i = 0; i < bj; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            bad |= (h & 0x7f80u) == 0x7f80u;
        }
        if (!bad) return 0;
        for (uint64_t i = 0; i < bj; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if ((h & 0x7f80u) == 0x7f80u) {
                snprintf(why, cap, "bf16 element %llu: 0x%04x (%g) is not finite", (unsigned long long)(i0 + i), h,
                         (double)dl_cx_bf16_value(h));
                return 1;
            }
        }
        return 0;
    case DL_CODEC_INT8: {
        if (bad_scale(c, j, ld_f32(p), why, cap)) return 1;
        const int8_t *q = (const int8_t *)(p + 4);
#pragma omp simd reduction(| : bad)
        for (uint64_t i = 0; i < bj; i++) bad |= q[i] == -128;
        if (!bad) return 0;
        for (uint64_t i = 0; i < bj; i++)
            if (q[i] == -128) {
                snprintf(why, cap, "int8 block %llu: element %llu has code -128, outside [-127, 127]",
                         (unsigned long long)j, (unsigned long long)i);
                return 1;
            }
        return 0;
    }
    case DL_CODEC_INT4:
    case DL_CODEC_E3M0: {
        if (bad_scale(c, j, ld_f32(p), why, cap)) return 1;
        const uint8_t *q = p + 4;
        uint64_t full = bj / 2;
        /* int4 -8 and e3m0 "negative zero" are both the nibble 8: never written by an encoder */
#pragma omp simd reduction(| : bad)
        for (uint64_t i = 0; i < full; i++) bad |= (q[i] & 0xfu) == 8u || (q[i] >> 4) == 8u;
        if (bj & 1) bad |= (q[full] & 0xfu) == 8u || (q[full] >> 4) != 0;
        if (!bad) return 0;
        for (uint64_t i = 0; i < bj; i++) {
            unsigned nib = (q[i / 2] >> (4 * (i & 1))) & 0xfu;
            if (nib == 8u) {
                snprintf(why, cap, "%s block %llu: element %llu has code 8 (%s)", name, (unsigned long long)j,
                         (unsigned long long)i, c->id == DL_CODEC_INT4 ? "-8, outside [-7, 7]" : "negative zero");
                return 1;
            }
        }
        snprintf(why, cap, "%s block %llu: padding nibble after the last element is %u, not 0", name,
                 (unsigned long long)j, (unsigned)(q[full] >> 4));
        return 1;
    }
    case DL_CODEC_TOPK: {
        uint64_t k = bj < c->topk ? bj : c->topk;
        int64_t prev = -1;
        for (uint64_t e = 0; e < k; e++) {
            uint16_t ix;
            memcpy(&ix, p + 6 * e, 2);
            float v = ld_f32(p + 6 * e + 2);
            if (ix >= bj) {
                snprintf(why, cap, "topk block %llu: index %u outside block of %llu", (unsigned long long)j, ix,
                         (unsigned long long)bj);
                return 1;
            }
            if ((int64_t)ix <= prev) {
                snprintf(why, cap, "topk block %llu: indices not increasing at entry %llu (%u after %lld)",
                         (unsigned long long)j, (unsigned long long)e, ix, (long long)prev);
                return 1;
            }
            if (!isfinite(v)) {
                snprintf(why, cap, "topk block %llu: entry %llu (index %u) value %g is not finite",
                         (unsigned long long)j, (unsigned long long)e, ix, (double)v);
                return 1;
            }
            prev = ix;
        }
        return 0;
    }
    }
    return 0;
}

#if defined(__AVX2__)
/* int4 decode of 16 bytes (32 elements in order) at q: (float)code * s, +
 * base when given, two roundings as the scalar loop (no contraction here). */
INLINE void dec_int4_16(int has_base, const uint8_t *q, __m256 s, const float *base, float *out)
{
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)q);
    __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    /* element 2i is byte i's low nibble, 2i + 1 its high one; two's complement nibbles: (x ^ 8) - 8 */
    __m128i e0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
    __m128i e1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
    __m128i part[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])), s);
        if (has_base) v = _mm256_add_ps(_mm256_loadu_ps(base + 8 * k), v);
        _mm256_storeu_ps(out + 8 * k, v);
    }
}
#endif

/* int4 / e3m0 decode, two elements per byte; e3 and has_base are constants
 * at the call sites. */
INLINE void dec_nibbles(int e3, int has_base, const uint8_t *p, uint64_t bj, const float *base, float *out)
{
    float s = ld_f32(p);
    const uint8_t *q = p + 4;
    uint64_t full = bj / 2, i0 = 0;
#if defined(__AVX2__)
    /* the vectoriser's version of the loop below interleaves the two nibbles
     * element by element: a fifth of the synchronizer's core at GPT-2 size
     * with int4 pushes (bench/sync_load.sh) */
    if (!e3) {
        __m256 sv = _mm256_set1_ps(s);
        for (; i0 + 16 <= full; i0 += 16)
            dec_int4_16(has_base, q + i0, sv, has_base ? base + 2 * i0 : NULL, out + 2 * i0);
    }
#endif
#pragma omp simd
    for (uint64_t i = i0; i < full; i++) {
        unsigned lo = q[i] & 0xfu, hi = q[i] >> 4;
        float v0 = e3 ? dl_cx_e3m0_value(lo, s) : (float)dl_cx_nib_int(lo) * s;
        float v1 = e3 ? dl_cx_e3m0_value(hi, s) : (float)dl_cx_nib_int(hi) * s;
        out[2 * i] = has_base ? base[2 * i] + v0 : v0;
        out[2 * i + 1] = has_base ? base[2 * i + 1] + v1 : v1;
    }
    if (bj & 1) {
        unsigned lo = q[full] & 0xfu;
        float v = e3 ? dl_cx_e3m0_value(lo, s) : (float)dl_cx_nib_int(lo) * s;
        out[bj - 1] = has_base ? base[bj - 1] + v : v;
    }
}

/* Elements per run of the topk decode: the run's sums are taken from base
 * before the run is written (out may be base). */
#define TOPK_RUN 1024

/* topk decode: per run, out = base + 0 (or 0) for every element, then the
 * run's entries: base + v computed before the run was overwritten. */
static void dec_topk(const dl_codec *c, const uint8_t *p, uint64_t bj, const float *base, float *out)
{
    uint64_t k = bj < c->topk ? bj : c->topk, e = 0;
    float sum[TOPK_RUN];
    uint16_t at[TOPK_RUN];
    for (uint64_t c0 = 0; c0 < bj; c0 += TOPK_RUN) {
        uint64_t m = bj - c0 < TOPK_RUN ? bj - c0 : TOPK_RUN, ne = 0;
        for (; e < k; e++, ne++) {
            uint16_t ix;
            memcpy(&ix, p + 6 * e, 2);
            if (ix >= c0 + m) break;
            float v = ld_f32(p + 6 * e + 2);
            sum[ne] = base ? base[ix] + v : v;
            at[ne] = ix;
        }
        if (base) {
#pragma omp simd
            for (uint64_t i = c0; i < c0 + m; i++) out[i] = base[i] + 0.0f;
        } else {
            memset(out + c0, 0, m * sizeof *out);
        }
        for (uint64_t i = 0; i < ne; i++) out[at[i]] = sum[i];
    }
}

/* out[i] = v (base NULL) or base[i] + v, for each decoded value v of the item */
static void dec_item(const dl_codec *c, const uint8_t *p, uint64_t bj, const float *base, float *out)
{
    switch (c->id) {
    case DL_CODEC_FP32:
        if (!base) {
            memcpy(out, p, 4 * bj);
            return;
        }
#pragma omp simd
        for (uint64_t i = 0; i < bj; i++) out[i] = base[i] + ld_f32(p + 4 * i);
        return;
    case DL_CODEC_BF16:
#pragma omp simd
        for (uint64_t i = 0; i < bj; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            float v = dl_cx_bf16_value(h);
            out[i] = base ? base[i] + v : v;
        }
        return;
    case DL_CODEC_INT8: {
        float s = ld_f32(p);
        const int8_t *q = (const int8_t *)(p + 4);
#pragma omp simd
        for (uint64_t i = 0; i < bj; i++) {
            float v = (float)q[i] * s;
            out[i] = base ? base[i] + v : v;
        }
        return;
    }
    case DL_CODEC_INT4:
        if (base)
            dec_nibbles(0, 1, p, bj, base, out);
        else
            dec_nibbles(0, 0, p, bj, base, out);
        return;
    case DL_CODEC_E3M0:
        if (base)
            dec_nibbles(1, 1, p, bj, base, out);
        else
            dec_nibbles(1, 0, p, bj, base, out);
        return;
    case DL_CODEC_TOPK: dec_topk(c, p, bj, base, out); return;
    }
}

int dl_codec_dec_args_(const dl_codec *c, size_t len, uint64_t n)
{
    assert(c);
    char why[200];
    if (dl_codec_check(c, why, sizeof why)) return DL_EINVAL;
    if (n == 0 && len == 0) return 1;
    uint64_t want = dl_codec_bytes(c, n);
    if (want == 0)
        return dl_err(DL_EINVAL, "%s decode: %llu elements have no payload size", dl_codec_name(c->id),
                      (unsigned long long)n);
    if ((uint64_t)len != want)
        return dl_err(DL_EINVAL, "%s payload of %llu elements must be %llu bytes, got %zu", dl_codec_name(c->id),
                      (unsigned long long)n, (unsigned long long)want, len);
    return 0;
}

int dl_codec_item_check_(const dl_codec *c, uint64_t j, uint64_t bj, const uint8_t *item)
{
    char why[200];
    uint64_t b = dl_codec_is_block(c->id) ? c->block : FLAT_CHUNK;
    if (check_item(c, j, j * b, item, bj, why, sizeof why)) return dl_err(DL_EINVAL, "%s", why);
    return 0;
}

static int decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, const float *base, float *out)
{
    int rc = dl_codec_dec_args_(c, len, n);
    if (rc) return rc < 0 ? rc : 0;
    assert(in && out);
    geom g = geom_of(c, n);
    uint64_t bad = NONE;
    int par = g.nb > 1 && n >= PAR_MIN;
#pragma omp parallel for schedule(static) reduction(min : bad) if (par)
    for (uint64_t j = 0; j < g.nb; j++) {
        uint64_t i0 = j * g.b, bj = n - i0 < g.b ? n - i0 : g.b;
        char w[200];
        if (j < bad && check_item(c, j, i0, in + j * g.stride, bj, w, sizeof w)) bad = j;
    }
    if (bad != NONE) {
        uint64_t i0 = bad * g.b, bj = n - i0 < g.b ? n - i0 : g.b;
        return dl_codec_item_check_(c, bad, bj, in + bad * g.stride);
    }
#pragma omp parallel for schedule(static) if (par)
    for (uint64_t j = 0; j < g.nb; j++) {
        uint64_t i0 = j * g.b, bj = n - i0 < g.b ? n - i0 : g.b;
        dec_item(c, in + j * g.stride, bj, base ? base + i0 : NULL, out + i0);
    }
    return 0;
}

int dl_codec_decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, float *out)
{
    return decode(c, in, len, n, NULL, out);
}

int dl_codec_decode_add(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, const float *base, float *out)
{
    assert(base || n == 0);
    return decode(c, in, len, n, base, out);
}

/* Elements per tile of dl_codec_encode_step: its five arrays' tiles (x, r, next, base, payload) fit a core's
 * L2 (16384 floats: 64 KiB each), rounded to whole work items. */
#define STEP_TILE 16384u

int dl_codec_encode_step(const dl_codec_enc *e, float *next, const float *base, const float *r_in, float *r_out,
                         uint64_t n, uint8_t *out)
{
    int rc = dl_codec_enc_args_(e, n, 0);
    if (rc) return rc < 0 ? rc : 0;
    assert(next && base && out);
    const dl_codec *c = &e->c;
    geom g = geom_of(c, n);
    uint64_t tile = g.b >= STEP_TILE ? g.b : STEP_TILE / g.b * g.b, nt = (n + tile - 1) / tile;
    uint64_t bad = NONE; /* the first tile that failed */
#pragma omp parallel reduction(min : bad) if (nt > 1 && n >= PAR_MIN)
    {
        float *x = malloc(tile * sizeof *x);
        float *r = r_out ? NULL : malloc(tile * sizeof *r); /* the residual of a tile when r_out keeps none */
#pragma omp for schedule(static)
        for (uint64_t t = 0; t < nt; t++) {
            if (!x || (!r_out && !r)) {
                bad = t < bad ? t : bad;
                continue;
            }
            uint64_t i0 = t * tile, m = n - i0 < tile ? n - i0 : tile;
            float *rt = r_out ? r_out + i0 : r;
            for (uint64_t i = 0; i < m; i++) x[i] = next[i0 + i] - base[i0 + i];
            if (r_in) memcpy(rt, r_in + i0, m * sizeof *rt);
            else memset(rt, 0, m * sizeof *rt);
            /* items are whole in a tile: its payload is the slice from the byte of its first item */
            uint8_t *o = out + dl_codec_bytes(c, i0);
            uint64_t len = dl_codec_bytes(c, i0 + m) - dl_codec_bytes(c, i0);
            if (dl_codec_encode(e, x, rt, m, i0, o) || decode(c, o, (size_t)len, m, base + i0, next + i0))
                bad = t < bad ? t : bad;
        }
        free(x);
        free(r);
    }
    if (bad == NONE) return 0;
    /* the failing tile again, alone, for its message (every tile before it succeeded) */
    uint64_t i0 = bad * tile, m = n - i0 < tile ? n - i0 : tile;
    float *x = malloc(tile * sizeof *x), *r = malloc(tile * sizeof *r);
    if (!x || !r) {
        free(x);
        free(r);
        return dl_err(DL_ENOMEM, "%s encode: no memory for a tile's scratch (%llu elements)", dl_codec_name(c->id),
                      (unsigned long long)tile);
    }
    for (uint64_t i = 0; i < m; i++) x[i] = next[i0 + i] - base[i0 + i];
    if (r_in) memcpy(r, r_in + i0, m * sizeof *r);
    else memset(r, 0, m * sizeof *r);
    uint8_t *o = out + dl_codec_bytes(c, i0);
    rc = dl_codec_encode(e, x, r, m, i0, o);
    if (!rc && decode(c, o, (size_t)(dl_codec_bytes(c, i0 + m) - dl_codec_bytes(c, i0)), m, base + i0, next + i0))
        rc = dl_err(DL_EINVAL, "%s encode: elements from %llu: the payload does not decode: %s", dl_codec_name(c->id),
                    (unsigned long long)i0, dl_errmsg());
    else if (!rc) /* it went through alone: a thread's scratch was what failed */
        rc = dl_err(DL_ENOMEM, "%s encode: no memory for a tile's scratch (%llu elements)", dl_codec_name(c->id),
                    (unsigned long long)tile);
    free(x);
    free(r);
    return rc;
}
