/* The wire codecs' CPU kernels (kernels/codec.c) against the layouts of
 * core/codec.h: error bounds, exact layouts, error feedback, unbiased
 * stochastic rounding, chunking, bit-exact decode_add, and hostile payloads. */
#include "core/codec.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/rng.h"
#include "kernels/codec.h"
#include "kernels/codec_elem.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static dl_rng rng;

static const dl_codec_id ALL[] = {DL_CODEC_FP32, DL_CODEC_BF16, DL_CODEC_INT8,
                                  DL_CODEC_INT4, DL_CODEC_E3M0, DL_CODEC_TOPK};
enum { NALL = sizeof ALL / sizeof ALL[0] };

static dl_codec mk(dl_codec_id id, uint32_t block)
{
    dl_codec c = {.id = id};
    if (dl_codec_is_block(id)) c.block = block;
    if (id == DL_CODEC_TOPK) c.topk = block / 16 ? block / 16 : 1;
    return c;
}

static float ldf(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}
static uint32_t bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}
static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Random input: normal, with a per-block scale drawn over 6 decades, one
 * all-zero block, some exact ties and some repeated magnitudes (topk ties). */
static void fill(float *x, uint64_t n, uint32_t b)
{
    uint32_t bb = b ? b : 128;
    for (uint64_t i = 0; i < n; i++) {
        if (i % bb == 0) {
            float sc = powf(10.0f, -3.0f + 6.0f * dl_rng_uniform(&rng));
            for (uint64_t k = i; k < n && k < i + bb; k++) x[k] = sc * dl_rng_normal(&rng);
        }
    }
    if (n > 2 * (uint64_t)bb)
        for (uint64_t k = bb; k < 2 * (uint64_t)bb; k++) x[k] = 0.0f;
    for (uint64_t i = 5; i + 3 < n; i += 97) x[i + 3] = -x[i]; /* equal magnitudes */
}

/* the byte offset, elements and scale of block j */
static uint64_t blk_bytes(const dl_codec *c, uint64_t bj)
{
    switch (c->id) {
    case DL_CODEC_INT8: return 4 + bj;
    case DL_CODEC_INT4:
    case DL_CODEC_E3M0: return 4 + (bj + 1) / 2;
    case DL_CODEC_TOPK: return 6 * (bj < c->topk ? bj : c->topk);
    default: return 0;
    }
}

/* e3m0 neighbour levels (units of s) around t in [0, 1] */
static void e3m0_nb(double t, double *lo, double *hi)
{
    *lo = 0, *hi = 1.0 / 64;
    for (int e = 1; e <= 7; e++) {
        double l = ldexp(1.0, e - 7);
        if (t >= l) *lo = l, *hi = e < 7 ? 2 * l : l;
    }
}

/* ---- round trip of one codec, one block size, one rounding */

static void roundtrip(dl_codec c, dl_codec_rounding rd, uint64_t n)
{
    const char *nm = dl_codec_name(c.id);
    uint64_t bytes = dl_codec_bytes(&c, n);
    REQUIRE(bytes > 0, "%s n %llu: no size", nm, (unsigned long long)n);
    float *x = malloc(n * 4), *r = calloc(n, 4), *d = malloc(n * 4), *base = malloc(n * 4), *o2 = malloc(n * 4);
    uint8_t *p = malloc(bytes + 16);
    fill(x, n, c.block);
    memset(p, 0xA5, bytes + 16);
    dl_codec_enc e = {.c = c, .rounding = rd, .seed = 0x1234 + n};
    CHECK(dl_codec_encode(&e, x, r, n, 0, p) == 0, "%s encode: %s", nm, dl_errmsg());
    int guard = 1;
    for (int i = 0; i < 16; i++) guard &= p[bytes + i] == 0xA5;
    CHECK(guard, "%s b %u n %llu: encode wrote past dl_codec_bytes (%llu)", nm, c.block, (unsigned long long)n,
          (unsigned long long)bytes);
    CHECK(dl_codec_decode(&c, p, bytes, n, d) == 0, "%s decode: %s", nm, dl_errmsg());
    float *xin = x; /* what was encoded: y = x + r = x + 0 (so -0 became +0) */
    x = malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) x[i] = xin[i] + 0.0f;

    /* error feedback: r = y - decode exactly (r started at 0) */
    int ef = 1;
    for (uint64_t i = 0; i < n; i++) ef &= bits(r[i]) == bits(x[i] - d[i]);
    CHECK(ef, "%s b %u %s: residual is not x - decode", nm, c.block, dl_codec_rounding_name(rd));

    /* element bounds, per block */
    uint64_t b = dl_codec_is_block(c.id) ? c.block : n, off = 0, worst = 0;
    double worst_ratio = 0;
    for (uint64_t j0 = 0; j0 < n; j0 += b) {
        uint64_t bj = n - j0 < b ? n - j0 : b;
        double a = 0;
        for (uint64_t i = 0; i < bj; i++) a = fmax(a, fabs(x[j0 + i]));
        if (c.id == DL_CODEC_INT8 || c.id == DL_CODEC_INT4 || c.id == DL_CODEC_E3M0) {
            float top = c.id == DL_CODEC_INT8 ? 127.0f : c.id == DL_CODEC_INT4 ? 7.0f : 1.0f;
            float s = ldf(p + off);
            CHECK(bits(s) == bits((float)a / top), "%s block at %llu: scale %g, want absmax/%g = %g", nm,
                  (unsigned long long)j0, s, top, (float)a / top);
            for (uint64_t i = 0; i < bj; i++) {
                double y = x[j0 + i], err = fabs(d[j0 + i] - y), bound;
                if (c.id == DL_CODEC_E3M0) {
                    double lo, hi;
                    e3m0_nb(a ? fabs(y) / a : 0, &lo, &hi);
                    bound = (hi - lo) * s * (rd == DL_ROUND_NEAREST ? 0.5 : 1.0);
                } else {
                    bound = rd == DL_ROUND_NEAREST ? s * 0.5 : s;
                }
                bound = bound * (1 + 1e-6) + 1e-30; /* fp32 rounding of y/s and q*s */
                if (err > bound) worst++;
                if (bound > 0) worst_ratio = fmax(worst_ratio, err / bound);
            }
        } else if (c.id == DL_CODEC_TOPK) {
            uint64_t k = bj < c.topk ? bj : c.topk, kept = 0;
            double minkept = INFINITY;
            int64_t last_tie_kept = -1;
            for (uint64_t e2 = 0; e2 < k; e2++) {
                uint16_t ix;
                memcpy(&ix, p + off + 6 * e2, 2);
                minkept = fmin(minkept, fabs(x[j0 + ix]));
            }
            int ok = 1;
            uint8_t *flag = calloc(bj, 1);
            for (uint64_t e2 = 0; e2 < k; e2++) {
                uint16_t ix;
                memcpy(&ix, p + off + 6 * e2, 2);
                if (ix < bj) flag[ix] = 1;
            }
            for (uint64_t i = 0; i < bj; i++) {
                float y = x[j0 + i], v = d[j0 + i];
                int is_kept = flag[i];
                kept += is_kept;
                if (is_kept) {
                    ok &= bits(v) == bits(y);
                    if (fabs(y) == minkept) last_tie_kept = (int64_t)i;
                } else {
                    ok &= v == 0.0f && fabs(y) <= minkept;
                    /* a tie left out comes after every tie kept */
                    if (fabs(y) == minkept) ok &= last_tie_kept >= 0;
                }
            }
            free(flag);
            CHECK(ok && kept == k, "topk b %u block at %llu: kept %llu of %llu, set not the top k (ties low index)",
                  c.block, (unsigned long long)j0, (unsigned long long)kept, (unsigned long long)k);
        } else {
            for (uint64_t i = 0; i < bj; i++) {
                double y = x[j0 + i], err = fabs(d[j0 + i] - y);
                double bound = c.id == DL_CODEC_FP32 ? 0 : fabs(y) * ldexp(1, -8);
                if (err > bound) worst++;
            }
        }
        off += blk_bytes(&c, bj);
    }
    CHECK(worst == 0, "%s b %u %s n %llu: %llu elements beyond the error bound (worst err/bound %.4f)", nm, c.block,
          dl_codec_rounding_name(rd), (unsigned long long)n, (unsigned long long)worst, worst_ratio);
    if (dl_codec_is_block(c.id)) CHECK(off == bytes, "%s: blocks add up to %llu bytes, not %llu", nm,
                                       (unsigned long long)off, (unsigned long long)bytes);

    /* decode_add == base + decode, bit for bit, also in place */
    for (uint64_t i = 0; i < n; i++) base[i] = dl_rng_normal(&rng);
    base[0] = -0.0f;
    CHECK(dl_codec_decode_add(&c, p, bytes, n, base, o2) == 0, "%s decode_add: %s", nm, dl_errmsg());
    int same = 1;
    for (uint64_t i = 0; i < n; i++) same &= bits(o2[i]) == bits(base[i] + d[i]);
    CHECK(same, "%s b %u: decode_add != base + decode", nm, c.block);
    CHECK(dl_codec_decode_add(&c, p, bytes, n, base, base) == 0, "%s decode_add in place: %s", nm, dl_errmsg());
    CHECK(same_bits(base, o2, n), "%s b %u: decode_add in place differs", nm, c.block);

    /* chunking: a block-aligned range of the payload is the payload of that
     * range (decode and encode, stochastic included: u is keyed by first + i) */
    if (dl_codec_is_block(c.id) && n > 2 * b) {
        uint64_t from[2] = {1, (n - 1) / b}; /* a middle range, and the last (partial) block alone */
        for (int t = 0; t < 2; t++) {
            uint64_t j0 = from[t], i0 = j0 * b, m = t == 0 ? b : n - i0;
            uint64_t boff = j0 * blk_bytes(&c, b), sb = dl_codec_bytes(&c, m);
            float *sd = malloc(m * 4);
            uint8_t *sp = malloc(sb);
            CHECK(dl_codec_decode(&c, p + boff, sb, m, sd) == 0, "%s sub-range decode: %s", nm, dl_errmsg());
            CHECK(same_bits(sd, d + i0, m), "%s b %u: decode of blocks from %llu != the full decode", nm, c.block,
                  (unsigned long long)j0);
            float *rz = calloc(m, 4);
            CHECK(dl_codec_encode(&e, xin + i0, rz, m, i0, sp) == 0, "%s sub-range encode: %s", nm, dl_errmsg());
            free(rz);
            CHECK(memcmp(sp, p + boff, sb) == 0, "%s b %u %s: encode of blocks from %llu != bytes of the full encode",
                  nm, c.block, dl_codec_rounding_name(rd), (unsigned long long)j0);
            free(sd);
            free(sp);
        }
    }
    free(x), free(xin), free(r), free(d), free(base), free(o2), free(p);
}

/* ---- known answers: layouts, ties, levels */

static void known_answers(void)
{
    /* int8: absmax 127 -> s = 1; ties away from zero */
    dl_codec c8 = {.id = DL_CODEC_INT8, .block = 16};
    float x[16] = {127, 2.5f, -2.5f, 2.49f, -0.5f, 0.5f, 0.49f, -127, 1, 0, -0.0f, 3, 4, 5, 6, 7};
    int8_t want8[16] = {127, 3, -3, 2, -1, 1, 0, -127, 1, 0, 0, 3, 4, 5, 6, 7};
    uint8_t p[64];
    dl_codec_enc e = {.c = c8};
    CHECK(dl_codec_encode(&e, x, NULL, 16, 0, p) == 0, "int8 known: %s", dl_errmsg());
    CHECK(ldf(p) == 1.0f, "int8 scale %g, want 1", ldf(p));
    CHECK(memcmp(p + 4, want8, 16) == 0, "int8 codes differ from the ties-away-from-zero answer");

    /* int4: absmax 7 -> s = 1; element 2i in the low nibble; odd last block padded with 0 */
    dl_codec c4 = {.id = DL_CODEC_INT4, .block = 16};
    float x4[17] = {7, -7, 1.5f, -1.5f, 0.4f, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -2};
    e.c = c4;
    CHECK(dl_codec_encode(&e, x4, NULL, 17, 0, p) == 0, "int4 known: %s", dl_errmsg());
    CHECK(p[4] == (uint8_t)(0x7 | 0x9 << 4) && p[5] == (uint8_t)(0x2 | 0xE << 4) && p[6] == 0x30,
          "int4 nibbles %02x %02x %02x", p[4], p[5], p[6]);
    CHECK(ldf(p + 12) == 2.0f / 7.0f && p[16] == 0x09, "int4 last block of 1: scale %g code %02x", ldf(p + 12), p[16]);
    CHECK(dl_codec_bytes(&c4, 17) == 17, "int4 17 elements: %llu bytes", (unsigned long long)dl_codec_bytes(&c4, 17));

    /* a chunk sized in bytes: whole blocks of int4/16 (12 bytes each) in 4096 bytes: 341 blocks, 5456 elements
     * (4092 bytes); a byte short of one block: none; fp32/bf16 by the element; topk 4 of 16 (24 bytes) */
    {
        dl_codec f32 = {.id = DL_CODEC_FP32}, b16 = {.id = DL_CODEC_BF16}, tk = {.id = DL_CODEC_TOPK, .block = 16, .topk = 4},
                 bad = {.id = DL_CODEC_INT4, .block = 3};
        uint64_t n4 = dl_codec_chunk_numel(&c4, 4096);
        CHECK(n4 == 5456 && dl_codec_bytes(&c4, n4) == 4092, "int4/16 chunk of 4096 bytes: %llu elements",
              (unsigned long long)n4);
        CHECK(dl_codec_chunk_numel(&c4, 11) == 0 && dl_codec_chunk_numel(&c4, 12) == 16, "int4/16 under one block");
        CHECK(dl_codec_chunk_numel(&f32, 4096) == 1024 && dl_codec_chunk_numel(&f32, 4099) == 1024 &&
                  dl_codec_chunk_numel(&b16, 4096) == 2048 && dl_codec_chunk_numel(&f32, 3) == 0,
              "fp32/bf16 chunks by the element");
        CHECK(dl_codec_chunk_numel(&tk, 4096) == 170 * 16, "topk 4/16: %llu", (unsigned long long)dl_codec_chunk_numel(&tk, 4096));
        CHECK(dl_codec_chunk_numel(&bad, 4096) == 0, "an invalid codec: 0");
    }

    /* e3m0: absmax 1; 0.75 is the midpoint of 1/2 and 1 (-> 1), 0.74 -> 1/2, 0.01 -> 1/64, 0.007 -> 0,
     * 2^-7 (midpoint of 0 and 2^-6) -> 2^-6, 0.375 (midpoint of 1/4 and 1/2) -> 1/2 */
    dl_codec ce = {.id = DL_CODEC_E3M0, .block = 16};
    float xe[16] = {1, 0.75f, -0.74f, 0.01f, 0.007f, -0.0078125f, 0.25f, -1.0f / 64, 0.375f, 0, 0, 0, 0, 0, 0, 0};
    uint8_t wante[16] = {7, 7, 8 | 6, 1, 0, 8 | 1, 5, 8 | 1, 6, 0, 0, 0, 0, 0, 0, 0};
    e.c = ce;
    CHECK(dl_codec_encode(&e, xe, NULL, 16, 0, p) == 0, "e3m0 known: %s", dl_errmsg());
    int ok = ldf(p) == 1.0f;
    for (int i = 0; i < 16; i++) ok &= ((p[4 + i / 2] >> (4 * (i & 1))) & 15) == wante[i];
    CHECK(ok, "e3m0 codes differ from the nearest-level answer");
    float de[16];
    CHECK(dl_codec_decode(&ce, p, 12, 16, de) == 0, "e3m0 decode: %s", dl_errmsg());
    CHECK(de[0] == 1 && de[2] == -0.5f && de[3] == 1.0f / 64 && de[4] == 0 && de[6] == 0.25f,
          "e3m0 decoded %g %g %g %g %g", de[0], de[2], de[3], de[4], de[6]);

    /* bf16: round to nearest even */
    dl_codec cb = {.id = DL_CODEC_BF16};
    float xb[4] = {1 + 0x1p-8f, 1 + 3 * 0x1p-8f, 1 + 0x1p-8f + 0x1p-20f, -2};
    uint16_t wantb[4] = {0x3f80, 0x3f82, 0x3f81, 0xc000};
    e.c = cb;
    CHECK(dl_codec_encode(&e, xb, NULL, 4, 0, p) == 0 && memcmp(p, wantb, 8) == 0, "bf16 RNE: %04x %04x %04x",
          ((uint16_t *)(void *)p)[0], ((uint16_t *)(void *)p)[1], ((uint16_t *)(void *)p)[2]);

    /* topk: k = 2 of 16, ties to the lower index, indices increasing */
    dl_codec ck = {.id = DL_CODEC_TOPK, .block = 16, .topk = 2};
    float xk[16] = {0, 1, -3, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, -2};
    e.c = ck;
    CHECK(dl_codec_encode(&e, xk, NULL, 16, 0, p) == 0, "topk known: %s", dl_errmsg());
    uint16_t i0, i1;
    memcpy(&i0, p, 2), memcpy(&i1, p + 6, 2);
    CHECK(i0 == 2 && i1 == 4 && ldf(p + 2) == -3 && ldf(p + 8) == 3, "topk entries (%u %g) (%u %g)", i0, ldf(p + 2),
          i1, ldf(p + 8));

    /* topk over a block above its stack buffer: the key buffer's allocation
     * failing is a DL_ENOMEM, not an abort (the learner library encodes) */
    {
        enum { BIG = 8192 };
        dl_codec cbig = {.id = DL_CODEC_TOPK, .block = BIG, .topk = 8};
        float *xbig = calloc(BIG, sizeof(float));
        uint8_t *pbig = malloc(dl_codec_bytes(&cbig, BIG));
        for (int i = 0; i < BIG; i++) xbig[i] = (float)(i % 97);
        e.c = cbig;
        dl_alloc_fail_after(1);
        CHECK_EQ(dl_codec_encode(&e, xbig, NULL, BIG, 0, pbig), DL_ENOMEM);
        dl_alloc_fail_after(0);
        CHECK(strstr(dl_errmsg(), "topk") != NULL, "names the codec: %s", dl_errmsg());
        CHECK(dl_codec_encode(&e, xbig, NULL, BIG, 0, pbig) == 0, "then it encodes: %s", dl_errmsg());
        free(xbig);
        free(pbig);
    }

    /* a zero block: scale 0, zero codes; topk keeps the first k zeros */
    float z[16] = {0};
    dl_codec cs[4] = {c8, c4, ce, ck};
    for (int k = 0; k < 4; k++) {
        e.c = cs[k];
        uint64_t nb = dl_codec_bytes(&cs[k], 16);
        uint8_t zero[96] = {0};
        memset(p, 0xff, sizeof p);
        CHECK(dl_codec_encode(&e, z, NULL, 16, 0, p) == 0, "%s zeros: %s", dl_codec_name(cs[k].id), dl_errmsg());
        if (cs[k].id != DL_CODEC_TOPK)
            CHECK(memcmp(p, zero, nb) == 0, "%s: a zero block is not all zero bytes", dl_codec_name(cs[k].id));
        else
            CHECK(p[0] == 0 && p[6] == 1 && ldf(p + 2) == 0 && ldf(p + 8) == 0, "topk zeros: indices %u %u", p[0],
                  p[6]);
    }

    /* nearest ignores the seed; stochastic depends on it and on first */
    dl_codec_enc n1 = {.c = c8, .seed = 1}, n2 = {.c = c8, .seed = 2};
    float y[16];
    for (int i = 0; i < 16; i++) y[i] = dl_rng_normal(&rng);
    uint8_t a[20], b[20];
    dl_codec_encode(&n1, y, NULL, 16, 0, a), dl_codec_encode(&n2, y, NULL, 16, 0, b);
    CHECK(memcmp(a, b, 20) == 0, "nearest depends on the seed");
    n1.rounding = n2.rounding = DL_ROUND_STOCHASTIC;
    dl_codec_encode(&n1, y, NULL, 16, 0, a), dl_codec_encode(&n2, y, NULL, 16, 0, b);
    CHECK(memcmp(a, b, 20) != 0, "stochastic does not depend on the seed");
    dl_codec_encode(&n1, y, NULL, 16, 16, b);
    CHECK(memcmp(a, b, 20) != 0, "stochastic does not depend on first");

    /* the uniform is the first splitmix64 output of the state seed ^ idx * golden, top 24 bits:
     * splitmix64(0) = 0xe220a8397b1dcdaf; the others from a Python reference */
    CHECK(dl_cx_uniform(0, 0) == 14819496 * 0x1p-24f && dl_cx_uniform(42, 1) == 2682851 * 0x1p-24f &&
              dl_cx_uniform(0xfeed, 123456789) == 13366642 * 0x1p-24f &&
              dl_cx_uniform(UINT64_MAX, (1ull << 40) + 3) == 849915 * 0x1p-24f,
          "uniform golden values: %.9g %.9g", dl_cx_uniform(0, 0) * 0x1p24f, dl_cx_uniform(42, 1) * 0x1p24f);
    /* stochastic int8 known answer: s = 1, every y = k + 1/2 goes up exactly when u(seed, first + i) < 1/2 */
    {
        float xs[32];
        for (int i = 0; i < 32; i++) xs[i] = i == 0 ? 127.0f : (float)(i % 7) + 0.5f;
        dl_codec c32 = {.id = DL_CODEC_INT8, .block = 32};
        dl_codec_enc es = {.c = c32, .rounding = DL_ROUND_STOCHASTIC, .seed = 0xabcdef};
        uint8_t ps[36];
        CHECK(dl_codec_encode(&es, xs, NULL, 32, 64, ps) == 0, "stochastic known: %s", dl_errmsg());
        int ok2 = ldf(ps) == 1.0f && ps[4] == 127;
        for (int i = 1; i < 32; i++)
            ok2 &= (int8_t)ps[4 + i] == i % 7 + (dl_cx_uniform(0xabcdef, 64 + (uint64_t)i) < 0.5f);
        CHECK(ok2, "stochastic int8 codes differ from floor + (u < frac)");
    }
    /* the uniform: on the 2^-24 grid of [0, 1), mean 1/2 */
    double mean = 0;
    int grid = 1;
    for (uint64_t i = 0; i < 100000; i++) {
        float u = dl_cx_uniform(42, i);
        grid &= u >= 0 && u < 1 && u * 0x1p24f == floorf(u * 0x1p24f);
        mean += u;
    }
    mean /= 100000;
    CHECK(grid && fabs(mean - 0.5) < 0.005, "uniform: grid %d mean %.5f", grid, mean);
}

/* ---- error feedback: the same x pushed T times */

static void error_feedback(dl_codec c, dl_codec_rounding rd)
{
    const uint64_t n = 1000;
    const int T = 500;
    const char *nm = dl_codec_name(c.id);
    uint64_t bytes = dl_codec_bytes(&c, n);
    float *x = malloc(n * 4), *r = calloc(n, 4), *d = malloc(n * 4);
    double *sum = calloc(n, sizeof(double));
    uint8_t *p = malloc(bytes);
    for (uint64_t i = 0; i < n; i++) x[i] = 0.01f * dl_rng_normal(&rng);
    double xmax = 0;
    for (uint64_t i = 0; i < n; i++) xmax = fmax(xmax, fabs(x[i]));
    dl_codec_enc e = {.c = c, .rounding = rd, .seed = 99};
    double rmax_late = 0, rmax_early = 0, drift = 0;
    for (int t = 0; t < T; t++) {
        e.seed = 99 + (uint64_t)t;
        if (dl_codec_encode(&e, x, r, n, 0, p) || dl_codec_decode(&c, p, bytes, n, d)) {
            CHECK(0, "%s EF step %d: %s", nm, t, dl_errmsg());
            break;
        }
        double rm = 0;
        for (uint64_t i = 0; i < n; i++) sum[i] += d[i], rm = fmax(rm, fabs(r[i]));
        if (t < T / 5) rmax_early = fmax(rmax_early, rm);
        if (t >= T - T / 5) rmax_late = fmax(rmax_late, rm);
    }
    /* sum(dec) = T x + r_0 - r_T up to the fp32 rounding of each y = x + r */
    for (uint64_t i = 0; i < n; i++) drift = fmax(drift, fabs(sum[i] - (double)T * x[i] + r[i]));
    /* one quantization step of the largest block: the residual bound */
    double step = c.id == DL_CODEC_INT8   ? 2 * xmax / 127
                  : c.id == DL_CODEC_INT4 ? 2 * xmax / 7
                  : c.id == DL_CODEC_E3M0 ? 2 * xmax
                  : c.id == DL_CODEC_BF16 ? 2 * xmax * ldexp(1, -8)
                  : c.id == DL_CODEC_FP32 ? 0
                                          : 2 * xmax * (double)c.block / c.topk;
    CHECK(drift <= T * 2 * xmax * ldexp(1, -24) + 1e-12, "%s %s EF: |sum dec - T x - (r0 - rT)| = %.3g",
          nm, dl_codec_rounding_name(rd), drift);
    CHECK(rmax_late <= step + 1e-12 && rmax_late <= 1.5 * rmax_early + 1e-12,
          "%s %s EF: residual grows: max |r| %.3g early, %.3g late (step %.3g)", nm, dl_codec_rounding_name(rd),
          rmax_early, rmax_late, step);
    free(x), free(r), free(d), free(sum), free(p);
}

/* ---- stochastic rounding is unbiased: mean over seeds -> y */

static void unbiased(dl_codec c)
{
    const uint64_t n = 256;
    const int S = 4000;
    const char *nm = dl_codec_name(c.id);
    uint64_t bytes = dl_codec_bytes(&c, n);
    float *x = malloc(n * 4), *d = malloc(n * 4);
    double *sum = calloc(n, sizeof(double));
    uint8_t *p = malloc(bytes);
    for (uint64_t i = 0; i < n; i++) x[i] = dl_rng_normal(&rng);
    dl_codec_enc e = {.c = c, .rounding = DL_ROUND_STOCHASTIC};
    for (int s = 0; s < S; s++) {
        e.seed = 1000 + (uint64_t)s * 7919;
        dl_codec_encode(&e, x, NULL, n, 0, p);
        dl_codec_decode(&c, p, bytes, n, d);
        for (uint64_t i = 0; i < n; i++) sum[i] += d[i];
    }
    int bad = 0;
    double worst = 0;
    for (uint64_t j0 = 0; j0 < n; j0 += c.block) {
        double a = 0;
        for (uint64_t i = 0; i < c.block; i++) a = fmax(a, fabs(x[j0 + i]));
        for (uint64_t i = 0; i < c.block; i++) {
            double y = x[j0 + i], step;
            if (c.id == DL_CODEC_E3M0) {
                double lo, hi;
                e3m0_nb(fabs(y) / a, &lo, &hi);
                step = (hi - lo) * a;
            } else {
                step = a / (c.id == DL_CODEC_INT8 ? 127 : 7);
            }
            /* Bernoulli between two levels `step` apart: sd <= step / 2; 5 sigma, plus the 2^-24 grid of u */
            double z = fabs(sum[j0 + i] / S - y), tol = 5 * step / 2 / sqrt(S) + step * 0x1p-23 + 1e-7 * a;
            worst = fmax(worst, z / tol);
            bad += z > tol;
        }
    }
    CHECK(bad == 0, "%s stochastic: %d elements with a biased mean (worst |mean - y| / tol %.3f)", nm, bad, worst);
    printf("%s stochastic: worst |mean - y| / 5-sigma bound over %d seeds: %.3f\n", nm, S, worst);
    free(x), free(d), free(sum), free(p);
}

/* ---- hostile payloads, refused with a message, out untouched */

static void expect_refused(const dl_codec *c, const uint8_t *p, size_t len, uint64_t n, const char *want)
{
    float *base = malloc(n * 4), *out = malloc(n * 4), *keep = malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) base[i] = (float)i, out[i] = keep[i] = -(float)i - 0.5f;
    dl_err_clear();
    int rc = dl_codec_decode_add(c, p, len, n, base, out);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), want), "%s decode_add: rc %d msg '%s', want '%s'",
          dl_codec_name(c->id), rc, dl_errmsg(), want);
    CHECK(same_bits(out, keep, n), "%s decode_add wrote out on a refused payload ('%s')", dl_codec_name(c->id), want);
    dl_err_clear();
    rc = dl_codec_decode(c, p, len, n, out);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), want), "%s decode: rc %d msg '%s', want '%s'", dl_codec_name(c->id),
          rc, dl_errmsg(), want);
    free(base), free(out), free(keep);
}

static void put_f(uint8_t *p, float f) { memcpy(p, &f, 4); }

static void hostile(void)
{
    const uint64_t n = 64 * 4 + 7; /* last block of 7 (odd: a padding nibble) */
    float *x = malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) x[i] = dl_rng_normal(&rng);
    uint8_t *p = malloc(8 * n + 64), *q = malloc(8 * n + 64);
    char want[160];
    for (int k = 0; k < NALL; k++) {
        dl_codec c = mk(ALL[k], 64);
        const char *nm = dl_codec_name(c.id);
        size_t len = dl_codec_bytes(&c, n);
        dl_codec_enc e = {.c = c};
        REQUIRE(dl_codec_encode(&e, x, NULL, n, 0, p) == 0, "%s: %s", nm, dl_errmsg());
        snprintf(want, sizeof want, "must be %zu bytes, got %zu", len, len - 1);
        expect_refused(&c, p, len - 1, n, want);
        snprintf(want, sizeof want, "must be %zu bytes, got %zu", len, len + 1);
        expect_refused(&c, p, len + 1, n, want);
        size_t bs = dl_codec_is_block(c.id) ? blk_bytes(&c, 64) : 0;
        switch (c.id) {
        case DL_CODEC_FP32:
            memcpy(q, p, len), put_f(q + 4 * 70, NAN);
            expect_refused(&c, q, len, n, "fp32 element 70: nan is not finite");
            memcpy(q, p, len), put_f(q + 4 * 3, -INFINITY);
            expect_refused(&c, q, len, n, "fp32 element 3: -inf is not finite");
            break;
        case DL_CODEC_BF16:
            memcpy(q, p, len), q[2 * 9] = 0xc0, q[2 * 9 + 1] = 0x7f;
            expect_refused(&c, q, len, n, "bf16 element 9: 0x7fc0 (nan) is not finite");
            memcpy(q, p, len), q[2 * 200] = 0x80, q[2 * 200 + 1] = 0xff;
            expect_refused(&c, q, len, n, "bf16 element 200: 0xff80 (-inf) is not finite");
            break;
        case DL_CODEC_INT8:
        case DL_CODEC_INT4:
        case DL_CODEC_E3M0:
            memcpy(q, p, len), put_f(q + 3 * bs, -1.0f);
            snprintf(want, sizeof want, "%s block 3: scale -1 is negative", nm);
            expect_refused(&c, q, len, n, want);
            memcpy(q, p, len), put_f(q + 1 * bs, NAN);
            snprintf(want, sizeof want, "%s block 1: scale nan is not finite", nm);
            expect_refused(&c, q, len, n, want);
            memcpy(q, p, len), put_f(q + 4 * bs, INFINITY);
            snprintf(want, sizeof want, "%s block 4: scale inf is not finite", nm);
            expect_refused(&c, q, len, n, want);
            /* the first of two bad blocks is named */
            memcpy(q, p, len), put_f(q + 4 * bs, -2.0f), put_f(q + 2 * bs, -3.0f);
            snprintf(want, sizeof want, "%s block 2: scale -3 is negative", nm);
            expect_refused(&c, q, len, n, want);
            memcpy(q, p, len);
            if (c.id == DL_CODEC_INT8) {
                q[2 * bs + 4 + 10] = 0x80;
                expect_refused(&c, q, len, n, "int8 block 2: element 10 has code -128");
            } else {
                q[2 * bs + 4 + 5] = (uint8_t)((q[2 * bs + 4 + 5] & 0x0f) | 0x80);
                snprintf(want, sizeof want, "%s block 2: element 11 has code 8", nm);
                expect_refused(&c, q, len, n, want);
                /* the code 8 at every element of a block (the check reads eight bytes at a time), and in
                 * the last, short block's */
                for (int e = 0; e < 64; e++) {
                    memcpy(q, p, len);
                    uint8_t *b = q + 1 * bs + 4 + e / 2;
                    *b = (uint8_t)(e & 1 ? (*b & 0x0f) | 0x80 : (*b & 0xf0) | 0x08);
                    snprintf(want, sizeof want, "%s block 1: element %d has code 8", nm, e);
                    expect_refused(&c, q, len, n, want);
                }
                for (int e = 0; e < 7; e++) {
                    memcpy(q, p, len);
                    uint8_t *b = q + 4 * bs + 4 + e / 2;
                    *b = (uint8_t)(e & 1 ? (*b & 0x0f) | 0x80 : (*b & 0xf0) | 0x08);
                    snprintf(want, sizeof want, "%s block 4: element %d has code 8", nm, e);
                    expect_refused(&c, q, len, n, want);
                }
                memcpy(q, p, len), q[len - 1] |= 0x30;
                snprintf(want, sizeof want, "%s block 4: padding nibble after the last element is 3", nm);
                expect_refused(&c, q, len, n, want);
            }
            break;
        case DL_CODEC_TOPK: {
            uint16_t ix = 70;
            memcpy(q, p, len), memcpy(q + 2 * bs + 6 * 1, &ix, 2);
            expect_refused(&c, q, len, n, "topk block 2: index 70 outside block of 64");
            ix = 7; /* the last block has 7 elements */
            memcpy(q, p, len), memcpy(q + 4 * bs + 6 * 3, &ix, 2);
            expect_refused(&c, q, len, n, "topk block 4: index 7 outside block of 7");
            uint16_t i0;
            memcpy(&i0, p + 6 * 0, 2);
            memcpy(q, p, len), memcpy(q + 6 * 1, &i0, 2); /* duplicate */
            expect_refused(&c, q, len, n, "topk block 0: indices not increasing at entry 1");
            uint16_t a, b;
            memcpy(q, p, len), memcpy(&a, p + bs + 6 * 2, 2), memcpy(&b, p + bs + 6 * 3, 2);
            memcpy(q + bs + 6 * 2, &b, 2), memcpy(q + bs + 6 * 3, &a, 2); /* decreasing */
            expect_refused(&c, q, len, n, "topk block 1: indices not increasing at entry 3");
            memcpy(q, p, len), put_f(q + 3 * bs + 6 * 2 + 2, NAN);
            expect_refused(&c, q, len, n, "topk block 3: entry 2");
            break;
        }
        }
        /* encode refuses a non-finite y, naming the element */
        float keep = x[77];
        x[77] = NAN;
        snprintf(want, sizeof want, "%s encode: element 77 ", nm);
        CHECK(dl_codec_encode(&e, x, NULL, n, 0, p) == DL_EINVAL && strstr(dl_errmsg(), want), "%s NaN x: '%s'", nm,
              dl_errmsg());
        x[77] = keep;
        float *r = calloc(n, 4);
        r[200] = INFINITY;
        snprintf(want, sizeof want, "%s encode: element 200 ", nm);
        CHECK(dl_codec_encode(&e, x, r, n, 0, p) == DL_EINVAL && strstr(dl_errmsg(), want) &&
                  strstr(dl_errmsg(), "not finite"),
              "%s Inf r: '%s'", nm, dl_errmsg());
        free(r);
    }
    /* bf16 overflow: FLT_MAX rounds up past bf16's largest finite value */
    dl_codec_enc eb = {.c = {.id = DL_CODEC_BF16}};
    float big[3] = {1, FLT_MAX, 2};
    CHECK(dl_codec_encode(&eb, big, NULL, 3, 0, p) == DL_EINVAL && strstr(dl_errmsg(), "element 1 ") &&
              strstr(dl_errmsg(), "range of bf16") == NULL && strstr(dl_errmsg(), "bf16's range"),
          "bf16 overflow: '%s'", dl_errmsg());
    /* n == 0: nothing to do, nothing written; a non-empty payload of 0 elements is refused */
    dl_codec_enc e8 = {.c = {.id = DL_CODEC_INT8, .block = 16}};
    p[0] = 0x5a;
    CHECK(dl_codec_encode(&e8, x, NULL, 0, 0, p) == 0 && p[0] == 0x5a, "encode of 0 elements");
    CHECK(dl_codec_decode(&e8.c, p, 0, 0, x) == 0, "decode of 0 elements: %s", dl_errmsg());
    CHECK(dl_codec_decode(&e8.c, p, 5, 0, x) == DL_EINVAL && strstr(dl_errmsg(), "0 elements have no payload size"),
          "5 bytes of 0 elements: '%s'", dl_errmsg());
    /* invalid codec, rounding, first */
    dl_codec_enc bad = {.c = {.id = DL_CODEC_INT8, .block = 15}};
    CHECK(dl_codec_encode(&bad, x, NULL, 16, 0, p) == DL_EINVAL && strstr(dl_errmsg(), "block_size 15"),
          "block 15: '%s'", dl_errmsg());
    CHECK(dl_codec_decode(&bad.c, p, 20, 16, x) == DL_EINVAL, "decode with block 15 accepted");
    bad.c.block = 16, bad.rounding = (dl_codec_rounding)7;
    CHECK(dl_codec_encode(&bad, x, NULL, 16, 0, p) == DL_EINVAL && strstr(dl_errmsg(), "rounding 7"),
          "rounding 7: '%s'", dl_errmsg());
    bad.rounding = DL_ROUND_NEAREST;
    CHECK(dl_codec_encode(&bad, x, NULL, 16, 8, p) == DL_EINVAL && strstr(dl_errmsg(), "first element 8"),
          "first 8: '%s'", dl_errmsg());
    free(x), free(p), free(q);
}

/* ---- a reference decoder written from core/codec.h alone, scalar, in
 * double where exact: 0 and out, or -1 for a payload it refuses */

static int ref_decode(const dl_codec *c, const uint8_t *p, size_t len, uint64_t n, float *out)
{
    if (len != dl_codec_bytes(c, n)) return -1;
    if (c->id == DL_CODEC_FP32 || c->id == DL_CODEC_BF16) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t b = 0;
            if (c->id == DL_CODEC_FP32)
                memcpy(&b, p + 4 * i, 4);
            else
                b = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            float v;
            memcpy(&v, &b, 4);
            if (!isfinite(v)) return -1;
            out[i] = v;
        }
        return 0;
    }
    for (uint64_t j0 = 0; j0 < n; j0 += c->block) {
        uint64_t bj = n - j0 < c->block ? n - j0 : c->block;
        if (c->id == DL_CODEC_TOPK) {
            uint64_t k = bj < c->topk ? bj : c->topk;
            for (uint64_t i = 0; i < bj; i++) out[j0 + i] = 0;
            long prev = -1;
            for (uint64_t e = 0; e < k; e++, p += 6) {
                long ix = p[0] | p[1] << 8;
                float v = ldf(p + 2);
                if (ix <= prev || ix >= (long)bj || !isfinite(v)) return -1;
                out[j0 + ix] = v, prev = ix;
            }
            continue;
        }
        float s = ldf(p);
        if (!isfinite(s) || s < 0) return -1;
        p += 4;
        for (uint64_t i = 0; i < bj; i++) {
            int code = c->id == DL_CODEC_INT8 ? p[i] : (p[i / 2] >> (i % 2 ? 4 : 0)) & 15;
            double v;
            if (c->id == DL_CODEC_INT8) {
                if (code == 128) return -1;
                v = (double)(int8_t)code * s;
            } else if (c->id == DL_CODEC_INT4) {
                if (code == 8) return -1;
                v = (double)(code < 8 ? code : code - 16) * s;
            } else {
                if (code == 8) return -1;
                v = (code & 7) ? ldexp((double)s, (code & 7) - 7) : 0.0;
                if (code & 8) v = -v;
            }
            out[j0 + i] = (float)v; /* exact: a product of at most 8 and 24 significant bits */
        }
        if (c->id != DL_CODEC_INT8 && (bj & 1) && (p[bj / 2] >> 4)) return -1;
        p += c->id == DL_CODEC_INT8 ? bj : (bj + 1) / 2;
    }
    return 0;
}

/* random byte changes in valid payloads: the decoder accepts exactly what the
 * reference accepts, with the same floats; a refusal leaves decode_add's out alone */
static void mutations(void)
{
    const uint64_t n = 16 * 5 + 3;
    float x[16 * 5 + 3], ref[16 * 5 + 3], got[16 * 5 + 3], base[16 * 5 + 3], keep[16 * 5 + 3];
    uint8_t p[8 * (16 * 5 + 3)], q[8 * (16 * 5 + 3)];
    int accepted = 0, refused = 0, bad = 0;
    for (int k = 0; k < NALL; k++) {
        dl_codec c = mk(ALL[k], 16);
        c.topk = c.id == DL_CODEC_TOPK ? 5 : 0;
        size_t len = dl_codec_bytes(&c, n);
        for (int it = 0; it < 3000; it++) {
            for (uint64_t i = 0; i < n; i++) x[i] = dl_rng_normal(&rng), base[i] = (float)i;
            dl_codec_enc e = {.c = c, .rounding = (dl_codec_rounding)(it & 1), .seed = (uint64_t)it};
            dl_codec_encode(&e, x, NULL, n, 0, p);
            memcpy(q, p, len);
            int flips = 1 + (int)dl_rng_below(&rng, 3);
            for (int f = 0; f < flips; f++) {
                size_t at = dl_rng_below(&rng, len);
                q[at] = dl_rng_below(&rng, 4) ? (uint8_t)dl_rng_below(&rng, 256) : (uint8_t)(q[at] ^ 0x80);
            }
            int want = ref_decode(&c, q, len, n, ref);
            for (uint64_t i = 0; i < n; i++) got[i] = keep[i] = -7.0f;
            int rc = dl_codec_decode_add(&c, q, len, n, base, got);
            if (want == 0) {
                accepted++;
                int same = rc == 0;
                for (uint64_t i = 0; i < n && same; i++) same = bits(got[i]) == bits(base[i] + ref[i]);
                if (!same && bad++ < 5)
                    CHECK(0, "%s: mutated payload (iteration %d) rc %d '%s' differs from the reference decode",
                          dl_codec_name(c.id), it, rc, rc ? dl_errmsg() : "");
            } else {
                refused++;
                if ((rc != DL_EINVAL || !same_bits(got, keep, n)) && bad++ < 5)
                    CHECK(0, "%s: mutated payload (iteration %d) accepted or out written: rc %d",
                          dl_codec_name(c.id), it, rc);
            }
        }
    }
    CHECK(bad == 0, "%d mutated payloads decoded unlike the reference", bad);
    printf("mutated payloads: %d accepted, %d refused, all as the reference decoder\n", accepted, refused);
}

/* ---- golden bits: the bytes of every codec and the floats of decode_add on
 * an input made only of exact operations (no libm), pinned by XXH64, so
 * every build (vector width, -march, compiler) and the GPU (same code)
 * must produce them. When a deliberate format change moves them, the
 * printed values are the new ones. */

static void golden(void)
{
    enum { N = 1000 };
    static const uint64_t want[NALL] = {0x9077a9b88048d46dull, 0x630cb67b32c0021dull, 0x151a7a878a6139b2ull,
                                        0xfe1796a420a0d6c0ull, 0x80ecac29b43554dcull, 0x9943c636ca67a202ull};
    float x[N], r[N], base[N], out[N];
    uint8_t p[4 * N];
    for (int k = 0; k < NALL; k++) {
        dl_codec c = mk(ALL[k], 128);
        uint64_t h = 0x1234;
        for (int rd = 0; rd < 2; rd++) {
            uint64_t z = 0x9e3779b97f4a7c15ull;
            for (int i = 0; i < N; i++) { /* values k * 2^-20 * 2^(block octave): exact */
                z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                x[i] = ldexpf((float)((int64_t)(z % 2000001) - 1000000), -20 + (i / 128) % 5 - 2);
                r[i] = ldexpf((float)((int64_t)((z >> 32) % 2001) - 1000), -24);
                base[i] = (float)(i % 37) - 18.0f;
            }
            dl_codec_enc e = {.c = c, .rounding = (dl_codec_rounding)rd, .seed = 77};
            size_t len = dl_codec_bytes(&c, N);
            CHECK(dl_codec_encode(&e, x, r, N, 256, p) == 0, "golden encode: %s", dl_errmsg());
            CHECK(dl_codec_decode_add(&c, p, len, N, base, out) == 0, "golden decode: %s", dl_errmsg());
            h = dl_hash64(p, len, h), h = dl_hash64(r, sizeof r, h), h = dl_hash64(out, sizeof out, h);
        }
        CHECK(h == want[k], "%s: golden bits 0x%016llx, want 0x%016llx", dl_codec_name(c.id), (unsigned long long)h,
              (unsigned long long)want[k]);
    }
}

/* ---- same bytes and floats whatever the thread count */

static void threads(void)
{
    const uint64_t n = (1u << 18) + 77;
    float *x = malloc(n * 4), *r1 = calloc(n, 4), *r2 = calloc(n, 4), *d1 = malloc(n * 4), *d2 = malloc(n * 4);
    fill(x, n, 128);
    for (int k = 0; k < NALL; k++) {
        dl_codec c = mk(ALL[k], 128);
        uint64_t bytes = dl_codec_bytes(&c, n);
        uint8_t *p1 = malloc(bytes), *p2 = malloc(bytes);
        dl_codec_enc e = {.c = c, .rounding = DL_ROUND_STOCHASTIC, .seed = 5};
        memset(r1, 0, n * 4), memset(r2, 0, n * 4);
        omp_set_num_threads(1);
        dl_codec_encode(&e, x, r1, n, 0, p1);
        dl_codec_decode(&c, p1, bytes, n, d1);
        omp_set_num_threads(4);
        dl_codec_encode(&e, x, r2, n, 0, p2);
        dl_codec_decode(&c, p2, bytes, n, d2);
        CHECK(memcmp(p1, p2, bytes) == 0 && same_bits(r1, r2, n) && same_bits(d1, d2, n),
              "%s: 1 and 4 threads differ", dl_codec_name(c.id));
        free(p1), free(p2);
    }
    free(x), free(r1), free(r2), free(d1), free(d2);
}

/* dl_codec_encode_step against the sequence it fuses (x = next - base, a copy of the residual, encode,
 * decode_add), bit for bit: payload, residual and the new global; every residual combination; a bad value
 * in a later tile names its fragment element. n crosses tiles (16384 elements) unevenly. */
static void encode_step(dl_codec c, dl_codec_rounding rd, uint64_t n)
{
    const char *nm = dl_codec_name(c.id);
    uint64_t bytes = dl_codec_bytes(&c, n);
    float *next = malloc(n * 4), *base = malloc(n * 4), *rin = malloc(n * 4), *x = malloc(n * 4);
    float *r1 = malloc(n * 4), *r2 = malloc(n * 4), *g1 = malloc(n * 4), *g2 = malloc(n * 4);
    uint8_t *p1 = malloc(bytes), *p2 = malloc(bytes);
    fill(base, n, c.block ? c.block : 128);
    fill(x, n, c.block ? c.block : 128);
    for (uint64_t i = 0; i < n; i++) {
        next[i] = base[i] + 0.01f * x[i];
        rin[i] = 1e-3f * x[(i * 7) % n];
    }
    dl_codec_enc e = {.c = c, .rounding = rd, .seed = 0xfeed + n};
    for (int mode = 0; mode < 4; mode++) { /* r_in given or not, r_out kept or not */
        const float *ri = mode & 1 ? rin : NULL;
        for (uint64_t i = 0; i < n; i++) {
            x[i] = next[i] - base[i];
            r1[i] = ri ? ri[i] : 0.0f;
        }
        memcpy(g1, next, n * 4);
        CHECK(dl_codec_encode(&e, x, r1, n, 0, p1) == 0 && dl_codec_decode_add(&c, p1, bytes, n, base, g1) == 0,
              "%s reference: %s", nm, dl_errmsg());
        memcpy(g2, next, n * 4);
        memset(r2, 0x5a, n * 4);
        int rc = dl_codec_encode_step(&e, g2, base, ri, mode & 2 ? r2 : NULL, n, p2);
        CHECK(rc == 0, "%s encode_step n %llu mode %d: %s", nm, (unsigned long long)n, mode, dl_errmsg());
        CHECK(memcmp(p1, p2, bytes) == 0, "%s encode_step n %llu mode %d: payload differs", nm, (unsigned long long)n,
              mode);
        CHECK(memcmp(g1, g2, n * 4) == 0, "%s encode_step n %llu mode %d: new global differs", nm,
              (unsigned long long)n, mode);
        CHECK(!(mode & 2) || memcmp(r1, r2, n * 4) == 0, "%s encode_step n %llu mode %d: residual differs", nm,
              (unsigned long long)n, mode);
    }
    if (n > 40000) { /* a value the encoder refuses, in a later tile */
        memcpy(g2, next, n * 4);
        g2[40000] = INFINITY;
        CHECK(dl_codec_encode_step(&e, g2, base, rin, r2, n, p2) == DL_EINVAL && strstr(dl_errmsg(), "40000"),
              "%s encode_step of an infinity at 40000: %s", nm, dl_errmsg());
    }
    free(next), free(base), free(rin), free(x), free(r1), free(r2), free(g1), free(g2), free(p1), free(p2);
}

int main(void)
{
    dl_rng_seed(&rng, 20261201);
    dl_codec_rounding rd;
    CHECK(dl_codec_rounding_parse("stochastic", &rd) == 0 && rd == DL_ROUND_STOCHASTIC, "parse stochastic");
    CHECK(dl_codec_rounding_parse("nearest", &rd) == 0 && rd == DL_ROUND_NEAREST, "parse nearest");
    CHECK(dl_codec_rounding_parse("round", &rd) == DL_EINVAL && strstr(dl_errmsg(), "nearest|stochastic"),
          "parse 'round': %s", dl_errmsg());
    CHECK_STR(dl_codec_rounding_name(DL_ROUND_STOCHASTIC), "stochastic");
    CHECK_STR(dl_codec_rounding_name(9), "unknown");

    known_answers();
    static const uint32_t blocks[] = {16, 128, 4096};
    for (int k = 0; k < NALL; k++)
        for (int bi = 0; bi < 3; bi++) {
            if (!dl_codec_is_block(ALL[k]) && bi) continue;
            dl_codec c = mk(ALL[k], blocks[bi]);
            uint32_t b = blocks[bi];
            uint64_t ns[3] = {3 * (uint64_t)b + b / 2 + 1, 5 * (uint64_t)b, 1};
            for (int ni = 0; ni < 3; ni++)
                for (int r = 0; r < 2; r++) roundtrip(c, (dl_codec_rounding)r, ns[ni]);
        }
    /* the largest block: topk's keys on the heap, index 65535 */
    for (int k = 0; k < NALL; k++)
        if (dl_codec_is_block(ALL[k])) roundtrip(mk(ALL[k], DL_CODEC_BLOCK_MAX), DL_ROUND_STOCHASTIC, 2 * DL_CODEC_BLOCK_MAX + 37);
    {
        dl_codec ck = {.id = DL_CODEC_TOPK, .block = DL_CODEC_BLOCK_MAX, .topk = 1};
        float *xm = calloc(DL_CODEC_BLOCK_MAX, 4);
        xm[DL_CODEC_BLOCK_MAX - 1] = -5;
        uint8_t pm[6];
        dl_codec_enc em = {.c = ck};
        CHECK(dl_codec_encode(&em, xm, NULL, DL_CODEC_BLOCK_MAX, 0, pm) == 0 && pm[0] == 0xff && pm[1] == 0xff &&
                  ldf(pm + 2) == -5,
              "topk index 65535: %02x%02x %g", pm[1], pm[0], ldf(pm + 2));
        float *om = malloc(DL_CODEC_BLOCK_MAX * 4);
        CHECK(dl_codec_decode(&ck, pm, 6, DL_CODEC_BLOCK_MAX, om) == 0 && om[DL_CODEC_BLOCK_MAX - 1] == -5 &&
                  om[0] == 0,
              "topk decode of index 65535: %s", dl_errmsg());
        free(xm), free(om);
    }
    for (int k = 0; k < NALL; k++)
        for (int r = 0; r < 2; r++) error_feedback(mk(ALL[k], 128), (dl_codec_rounding)r);
    unbiased(mk(DL_CODEC_INT8, 128));
    unbiased(mk(DL_CODEC_INT4, 16));
    unbiased(mk(DL_CODEC_E3M0, 128));
    for (int k = 0; k < NALL; k++)
        for (int r = 0; r < 2; r++) {
            encode_step(mk(ALL[k], 128), (dl_codec_rounding)r, 3 * 16384 + 1000 + 3);
            if (dl_codec_is_block(ALL[k])) { /* a block past the tile; odd blocks */
                encode_step(mk(ALL[k], DL_CODEC_BLOCK_MAX), (dl_codec_rounding)r, 2 * DL_CODEC_BLOCK_MAX + 37);
                encode_step(mk(ALL[k], 16), (dl_codec_rounding)r, 70001);
            }
        }
    encode_step(mk(DL_CODEC_INT4, 128), DL_ROUND_STOCHASTIC, 5);
    hostile();
    mutations();
    golden();
    threads();
    return CHECK_DONE("test_codec");
}
