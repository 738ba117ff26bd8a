/* Parity test of the CUDA codecs (kernels/cuda/codec.cu) against the CPU
 * reference (kernels/codec.c): identical payload bytes and residuals from
 * encode (nearest and stochastic, with and without error feedback), identical
 * floats from decode / decode_add, identical refusals and messages for
 * hostile payloads (out untouched). Exits 77 (CTest: Skipped) without a device. */
#include "core/codec.h"
#include "core/err.h"
#include "core/rng.h"
#include "kernels/codec.h"
#include "kernels/cuda/codec.h"
#include "kernels/cuda/cuda.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

#define CU(call)                                                                                                  \
    do {                                                                                                          \
        int cu_rc_ = (call);                                                                                      \
        if (cu_rc_ < 0) {                                                                                         \
            printf("FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, dl_strerror(cu_rc_), dl_errmsg());    \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

static dl_rng rng;

static void *dev(size_t bytes)
{
    void *p = NULL;
    CU(dl_cuda_malloc(bytes ? bytes : 1, &p));
    return p;
}
static void *up(const void *h, size_t bytes)
{
    void *d = dev(bytes);
    CU(dl_cuda_h2d(d, h, bytes));
    return d;
}

static int no_device(void)
{
    printf("dl_cuda_available() = 0: %s\n", dl_errmsg());
    /* the argument checks run on the host first: the same refusal as the CPU, without a device */
    dl_codec_enc bad = {.c = {.id = DL_CODEC_INT8, .block = 15}};
    float x[16] = {0};
    uint8_t p[32];
    int rc = dl_cuda_codec_encode(&bad, x, NULL, 16, 0, p);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), "block_size 15"), "encode block 15 without a device: rc %d '%s'",
          rc, dl_errmsg());
    dl_codec c8 = {.id = DL_CODEC_INT8, .block = 16};
    rc = dl_cuda_codec_decode_add(&c8, p, 19, 16, x, x);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), "must be 20 bytes, got 19"), "short payload: rc %d '%s'", rc,
          dl_errmsg());
    /* a valid call must reach the device and fail there */
    rc = dl_cuda_codec_decode(&c8, p, 20, 16, x);
    CHECK(rc == DL_ENODEV || rc == DL_ECUDA, "decode without a device: rc %d (%s)", rc, dl_strerror(rc));
    dl_cuda_thread_release();
    if (failures) {
        printf("test_cuda_codec: %d FAILED check(s) on the no-device path\n", failures);
        return 1;
    }
    const char *req = getenv("DLOCO_REQUIRE_CUDA");
    if (req && strcmp(req, "1") == 0) {
        printf("FAIL: DLOCO_REQUIRE_CUDA=1 but no usable CUDA device\n");
        return 1;
    }
    printf("SKIP: no CUDA device — CUDA codec parity (fp32, bf16, int8, int4, e3m0, topk: encode nearest/stochastic "
           "with error feedback, decode, decode_add, hostile payloads) did not run\n");
    return 77;
}

static dl_codec mk(dl_codec_id id, uint32_t block)
{
    dl_codec c = {.id = id};
    if (dl_codec_is_block(id)) c.block = block;
    if (id == DL_CODEC_TOPK) c.topk = block / 16 ? block / 16 : 1;
    return c;
}

/* normal values with per-block scales over 6 decades, a zero block, ties */
static void fill(float *x, uint64_t n, uint32_t b)
{
    uint32_t bb = b ? b : 128;
    float sc = 1;
    for (uint64_t i = 0; i < n; i++) {
        if (i % bb == 0) sc = powf(10.0f, -3.0f + 6.0f * dl_rng_uniform(&rng));
        x[i] = sc * dl_rng_normal(&rng);
    }
    if (n > 2 * (uint64_t)bb)
        for (uint64_t k = bb; k < 2 * (uint64_t)bb; k++) x[k] = 0.0f;
    for (uint64_t i = 5; i + 3 < n; i += 97) x[i + 3] = -x[i];
}

static int diff_at(const void *a, const void *b, size_t bytes)
{
    const uint8_t *p = a, *q = b;
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != q[i]) return (int)i;
    return -1;
}

static void parity(dl_codec c, dl_codec_rounding rd, uint64_t n, uint64_t first, int with_r)
{
    const char *nm = dl_codec_name(c.id);
    size_t bytes = dl_codec_bytes(&c, n), fb = n * sizeof(float);
    float *x = malloc(fb), *r = malloc(fb), *rc = malloc(fb), *rg = malloc(fb), *base = malloc(fb);
    float *oc = malloc(fb), *og = malloc(fb);
    uint8_t *pc = malloc(bytes), *pg = malloc(bytes);
    fill(x, n, c.block);
    for (uint64_t i = 0; i < n; i++) r[i] = 0.01f * x[i] * dl_rng_normal(&rng), base[i] = dl_rng_normal(&rng);
    memcpy(rc, r, fb);
    dl_codec_enc e = {.c = c, .rounding = rd, .seed = 0xfeed + n};
    CHECK(dl_codec_encode(&e, x, with_r ? rc : NULL, n, first, pc) == 0, "cpu %s encode: %s", nm, dl_errmsg());
    float *dx = up(x, fb), *dr = up(r, fb), *dbase = up(base, fb), *dout = dev(fb);
    uint8_t *dp = dev(bytes);
    CU(dl_cuda_codec_encode(&e, dx, with_r ? dr : NULL, n, first, dp));
    CU(dl_cuda_d2h(pg, dp, bytes));
    CU(dl_cuda_d2h(rg, dr, fb));
    int at = diff_at(pc, pg, bytes);
    CHECK(at < 0, "%s b %u %s n %llu r %d: payload bytes differ from byte %d (cpu %02x gpu %02x)", nm, c.block,
          dl_codec_rounding_name(rd), (unsigned long long)n, with_r, at, at < 0 ? 0 : pc[at], at < 0 ? 0 : pg[at]);
    if (with_r) {
        at = diff_at(rc, rg, fb);
        CHECK(at < 0, "%s b %u %s: residual differs at element %d: cpu %a gpu %a", nm, c.block,
              dl_codec_rounding_name(rd), at / 4, at < 0 ? 0 : rc[at / 4], at < 0 ? 0 : rg[at / 4]);
    }
    /* decode and decode_add of the CPU's payload */
    CU(dl_cuda_h2d(dp, pc, bytes));
    CHECK(dl_codec_decode(&c, pc, bytes, n, oc) == 0, "cpu decode: %s", dl_errmsg());
    CU(dl_cuda_codec_decode(&c, dp, bytes, n, dout));
    CU(dl_cuda_d2h(og, dout, fb));
    at = diff_at(oc, og, fb);
    CHECK(at < 0, "%s b %u: decode differs at element %d", nm, c.block, at / 4);
    CHECK(dl_codec_decode_add(&c, pc, bytes, n, base, oc) == 0, "cpu decode_add: %s", dl_errmsg());
    CU(dl_cuda_codec_decode_add(&c, dp, bytes, n, dbase, dout));
    CU(dl_cuda_d2h(og, dout, fb));
    at = diff_at(oc, og, fb);
    CHECK(at < 0, "%s b %u: decode_add differs at element %d", nm, c.block, at / 4);
    CU(dl_cuda_codec_decode_add(&c, dp, bytes, n, dbase, dbase)); /* in place */
    CU(dl_cuda_d2h(og, dbase, fb));
    CHECK(diff_at(oc, og, fb) < 0, "%s b %u: in-place decode_add differs", nm, c.block);
    dl_cuda_free((void **)&dx), dl_cuda_free((void **)&dr), dl_cuda_free((void **)&dbase);
    dl_cuda_free((void **)&dout), dl_cuda_free((void **)&dp);
    free(x), free(r), free(rc), free(rg), free(base), free(oc), free(og), free(pc), free(pg);
}

static void put_f(uint8_t *p, float f) { memcpy(p, &f, 4); }

/* the payload q (len bytes) refused alike by both, the device's out untouched */
static void refused_alike(const dl_codec *c, const uint8_t *q, size_t len, uint64_t n, const char *what)
{
    size_t fb = n * sizeof(float);
    float *base = malloc(fb), *out = malloc(fb), *back = malloc(fb);
    for (uint64_t i = 0; i < n; i++) base[i] = (float)i, out[i] = -1.5f;
    int rc_cpu = dl_codec_decode_add(c, q, len, n, base, out);
    char msg[300];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    uint8_t *dq = up(q, len + 1);
    float *dbase = up(base, fb), *dout = up(out, fb);
    int rc_gpu = dl_cuda_codec_decode_add(c, dq, len, n, dbase, dout);
    CHECK(rc_cpu == DL_EINVAL && rc_gpu == DL_EINVAL && strcmp(msg, dl_errmsg()) == 0,
          "%s %s: cpu rc %d '%s', gpu rc %d '%s'", dl_codec_name(c->id), what, rc_cpu, msg, rc_gpu, dl_errmsg());
    CU(dl_cuda_d2h(back, dout, fb));
    int same = 1;
    for (uint64_t i = 0; i < n; i++) same &= back[i] == -1.5f;
    CHECK(same, "%s %s: the device wrote out on a refused payload", dl_codec_name(c->id), what);
    dl_cuda_free((void **)&dq), dl_cuda_free((void **)&dbase), dl_cuda_free((void **)&dout);
    free(base), free(out), free(back);
}

static void hostile(void)
{
    const uint64_t n = 64 * 5 + 7;
    float x[64 * 5 + 7];
    for (uint64_t i = 0; i < n; i++) x[i] = dl_rng_normal(&rng);
    static uint8_t p[8 * (64 * 5 + 7)], q[8 * (64 * 5 + 7) + 8];
    static const dl_codec_id ids[] = {DL_CODEC_FP32, DL_CODEC_BF16, DL_CODEC_INT8,
                                      DL_CODEC_INT4, DL_CODEC_E3M0, DL_CODEC_TOPK};
    for (int k = 0; k < 6; k++) {
        dl_codec c = mk(ids[k], 64);
        dl_codec_enc e = {.c = c};
        size_t len = dl_codec_bytes(&c, n), bs = dl_codec_is_block(c.id) ? dl_codec_bytes(&c, 64) : 0;
        CHECK(dl_codec_encode(&e, x, NULL, n, 0, p) == 0, "encode: %s", dl_errmsg());
        memcpy(q, p, len);
        refused_alike(&c, q, len - 1, n, "short");
        switch (c.id) {
        case DL_CODEC_FP32: put_f(q + 4 * 176, NAN), put_f(q + 4 * 70, INFINITY); break;
        case DL_CODEC_BF16: q[2 * 9] = 0x80, q[2 * 9 + 1] = 0x7f; break;
        case DL_CODEC_INT8: q[3 * bs + 4 + 9] = 0x80, put_f(q + 4 * bs, -1.0f); break;
        case DL_CODEC_INT4:
        case DL_CODEC_E3M0: q[len - 1] |= 0x50, put_f(q + 2 * bs, NAN); break;
        case DL_CODEC_TOPK: {
            uint16_t ix = 64;
            memcpy(q + 3 * bs + 6, &ix, 2);
            memcpy(q + 1 * bs + 12, q + 1 * bs + 6, 2); /* duplicate in block 1: named first */
            break;
        }
        }
        refused_alike(&c, q, len, n, "corrupt");
        /* encode of a NaN: the same message */
        float y[64 * 5 + 7];
        memcpy(y, x, sizeof y);
        y[200] = NAN, y[300] = INFINITY;
        int rc_cpu = dl_codec_encode(&e, y, NULL, n, 0, p);
        char msg[300];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        float *dy = up(y, sizeof y);
        uint8_t *dp = dev(len);
        int rc_gpu = dl_cuda_codec_encode(&e, dy, NULL, n, 0, dp);
        CHECK(rc_cpu == DL_EINVAL && rc_gpu == DL_EINVAL && strcmp(msg, dl_errmsg()) == 0,
              "%s NaN encode: cpu '%s', gpu '%s'", dl_codec_name(c.id), msg, dl_errmsg());
        dl_cuda_free((void **)&dy), dl_cuda_free((void **)&dp);
    }
}

/* random byte changes in valid payloads: the device accepts and refuses what
 * the CPU does, with the same message and the same floats */
static void mutations(void)
{
    enum { N = 16 * 5 + 3 };
    const uint64_t n = N;
    float x[N], base[N], oc[N], og[N];
    uint8_t p[8 * N], q[8 * N];
    static const dl_codec_id ids[] = {DL_CODEC_FP32, DL_CODEC_BF16, DL_CODEC_INT8,
                                      DL_CODEC_INT4, DL_CODEC_E3M0, DL_CODEC_TOPK};
    float *dbase = dev(sizeof base), *dout = dev(sizeof og);
    uint8_t *dq = dev(sizeof q);
    int bad = 0, refused = 0;
    for (int k = 0; k < 6; k++) {
        dl_codec c = mk(ids[k], 16);
        if (c.id == DL_CODEC_TOPK) c.topk = 5;
        size_t len = dl_codec_bytes(&c, n);
        for (int it = 0; it < 300; it++) {
            for (uint64_t i = 0; i < n; i++) x[i] = dl_rng_normal(&rng), base[i] = (float)i;
            dl_codec_enc e = {.c = c, .seed = (uint64_t)it};
            dl_codec_encode(&e, x, NULL, n, 0, p);
            memcpy(q, p, len);
            for (int f = 0; f < 2; f++) q[dl_rng_below(&rng, len)] = (uint8_t)dl_rng_below(&rng, 256);
            for (uint64_t i = 0; i < n; i++) oc[i] = -7.0f;
            int rc_cpu = dl_codec_decode_add(&c, q, len, n, base, oc);
            char msg[300];
            snprintf(msg, sizeof msg, "%s", rc_cpu ? dl_errmsg() : "");
            CU(dl_cuda_h2d(dq, q, len));
            CU(dl_cuda_h2d(dbase, base, sizeof base));
            CU(dl_cuda_h2d(dout, oc, sizeof oc)); /* the CPU's out: unchanged on refusal, else overwritten */
            int rc_gpu = dl_cuda_codec_decode_add(&c, dq, len, n, dbase, dout);
            CU(dl_cuda_d2h(og, dout, sizeof og));
            int same = rc_cpu == rc_gpu && (rc_cpu == 0 || strcmp(msg, dl_errmsg()) == 0) && diff_at(oc, og, sizeof og) < 0;
            refused += rc_cpu != 0;
            if (!same && bad++ < 5)
                CHECK(0, "%s mutation %d: cpu rc %d '%s', gpu rc %d '%s'", dl_codec_name(c.id), it, rc_cpu, msg, rc_gpu,
                      rc_gpu ? dl_errmsg() : "");
        }
    }
    CHECK(bad == 0, "%d mutated payloads decoded differently on the device", bad);
    printf("mutated payloads: %d of %d refused, device and CPU alike\n", refused, 6 * 300);
    dl_cuda_free((void **)&dbase), dl_cuda_free((void **)&dout), dl_cuda_free((void **)&dq);
}

int main(void)
{
    if (!dl_cuda_available()) return no_device();
    char name[128];
    dl_cuda_device_name(name, sizeof name);
    printf("device: %s\n", name);
    dl_rng_seed(&rng, 7);
    static const dl_codec_id ids[] = {DL_CODEC_FP32, DL_CODEC_BF16, DL_CODEC_INT8,
                                      DL_CODEC_INT4, DL_CODEC_E3M0, DL_CODEC_TOPK};
    static const uint32_t blocks[] = {16, 128, 4096};
    for (int k = 0; k < 6; k++)
        for (int bi = 0; bi < 3; bi++) {
            if (!dl_codec_is_block(ids[k]) && bi) continue;
            uint32_t b = blocks[bi];
            dl_codec c = mk(ids[k], b);
            uint64_t ns[2] = {7 * (uint64_t)b + b / 2 + 1, 1};
            for (int ni = 0; ni < 2; ni++)
                for (int rd = 0; rd < 2; rd++)
                    for (int wr = 0; wr < 2; wr++) parity(c, (dl_codec_rounding)rd, ns[ni], 3 * (uint64_t)b, wr);
        }
    /* many blocks: grid-stride loops, the 1M-block grid cap not reached but > 1 wave */
    for (int k = 0; k < 6; k++) parity(mk(ids[k], 128), DL_ROUND_STOCHASTIC, (1u << 22) + 77, 0, 1);
    hostile();
    mutations();
    dl_cuda_thread_release();
    return CHECK_DONE("test_cuda_codec");
}
