/* codec: throughput of the wire codecs' CPU kernels (kernels/codec.c) on one
 * fp32 vector, next to memcpy of the same buffer in the same run.
 * Usage: codec [floats (16777216: 64 MB)] [block (128)] [repetitions (5)]
 *
 * For each codec (topk with k = block / 16, i.e. 8 of 128): encode with
 * error feedback, nearest and stochastic rounding (the latter only for
 * int8/int4/e3m0: the others ignore it), and decode_add; on one thread and
 * on all of OpenMP's threads. A rate is the input fp32 bytes (4n) per second,
 * the median of the repetitions (each one call over the whole vector);
 * memcpy's is the median of samples taken before every codec figure.
 * Prints a table, then one "codec_<name>_<op>_<threads>t_gb_per_s X" line per
 * figure and memcpy_<threads>t_gb_per_s, for scripts.
 *
 * Measured (Xeon with AVX-512, 2 cores shared with other builds, 16M floats,
 * block 128, an idle moment; x memcpy of the same run in brackets), 1 thread
 * / 2 threads: memcpy 8.1 / 10.1 GB/s; encode nearest with EF: fp32 2.5
 * (0.30) / 4.8, bf16 3.2 / 6.0, int8 3.6 (0.45) / 6.8 (0.67), int4 3.4 /
 * 6.1, e3m0 2.9 / 5.5, topk 1.25 (0.15) / 2.5; stochastic about half of
 * nearest (the splitmix64 per element): int8 1.8 / 3.3; decode_add 3.3 - 5.4
 * / 6.6 - 9.8 (0.65 - 0.96 of memcpy on two threads). Encode reads x and r
 * and writes r and the payload (4 streams against memcpy's 2), so about
 * half of memcpy is the ceiling with error feedback.
 *
 * The synchronizer's delta Update (nearest rounding, its default): update_4pass
 * is the sequence its worker ran until 2026-12-05 over the whole fragment
 * (x = next - base, the residual copied to a scratch, encode with it,
 * decode_add onto base), update_step is dl_codec_encode_step doing the same
 * 16,384 elements at a time, the same bits; their ratio is
 * "update_step_vs_4pass_<codec>_<threads>t". */
#include "core/clock.h"
#include "core/codec.h"
#include "kernels/codec.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* GB/s of one memcpy of `len` bytes, split over the OpenMP threads as the kernels split their work */
static double copy_rate(uint8_t *dst, const uint8_t *src, size_t len)
{
    double t0 = dl_clock_s();
#pragma omp parallel
    {
        size_t id = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        memcpy(dst + len * id / nt, src + len * id / nt, len * (id + 1) / nt - len * id / nt);
    }
    return (double)len / (dl_clock_s() - t0) / 1e9;
}

enum { OP_ENC_NEAREST, OP_ENC_STOCH, OP_DECODE_ADD, OP_UPDATE_PASSES, OP_UPDATE_STEP, NOPS };
static const char *const op_names[NOPS] = {"encode_nearest", "encode_stochastic", "decode_add", "update_4pass",
                                           "update_step"};

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)1 << 24;
    unsigned block = argc > 2 ? (unsigned)atoi(argv[2]) : 128;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (n < 1024 || n > ((size_t)1 << 32) || block < DL_CODEC_BLOCK_MIN || block > DL_CODEC_BLOCK_MAX || block % 2 ||
        reps < 1 || reps > 101) {
        fprintf(stderr, "usage: codec [floats 1024..2^32] [block: even, 16..65536] [repetitions 1..101]\n");
        return 2;
    }
    int maxth = omp_get_max_threads();
    float *x = malloc(n * 4), *r = calloc(n, 4), *base = malloc(n * 4), *out = malloc(n * 4);
    uint8_t *pay = malloc(n * 4), *cpy = malloc(n * 4);
    float *nxt = malloc(n * 4), *rout = calloc(n, 4), *xs = calloc(n, 4); /* the Update's G', new residual, x */
    if (!x || !r || !base || !out || !pay || !cpy || !nxt || !rout || !xs) return 2;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17; /* xorshift: uniform noise, a few decades of block scales */
        x[i] = ((float)(s >> 40) * 0x1p-24f - 0.5f) * (float)(1 + (i / block) % 1000) * 1e-4f;
        base[i] = 0.01f * (float)(i % 1000);
    }
    memset(pay, 0, n * 4), memset(cpy, 0, n * 4), memcpy(out, base, n * 4);
    for (size_t i = 0; i < n; i++) nxt[i] = base[i] + x[i];

    static const dl_codec_id ids[] = {DL_CODEC_FP32, DL_CODEC_BF16, DL_CODEC_INT8,
                                      DL_CODEC_INT4, DL_CODEC_E3M0, DL_CODEC_TOPK};
    enum { NC = sizeof ids / sizeof ids[0] };
    int ths[2] = {1, maxth}, nth = maxth > 1 ? 2 : 1;
    double g[NC][NOPS][2], mc[2], *t = malloc((size_t)reps * sizeof(double));
    memset(g, 0, sizeof g);
    /* memcpy is sampled before every codec figure and the median of all
     * those samples is the reference: load from other processes that comes
     * and goes hits both alike */
    double *mt = malloc((size_t)(NC * NOPS + 1) * (size_t)reps * sizeof(double));
    for (int ti = 0; ti < nth; ti++) {
        omp_set_num_threads(ths[ti]);
        int nm = 0;
        for (int k = 0; k < reps; k++) mt[nm++] = copy_rate(cpy, (const uint8_t *)x, n * 4);
        for (int c = 0; c < NC; c++) {
            dl_codec_enc e = {.c = {.id = ids[c]}, .seed = 7};
            if (dl_codec_is_block(ids[c])) e.c.block = block;
            if (ids[c] == DL_CODEC_TOPK) e.c.topk = block / 16;
            size_t bytes = dl_codec_bytes(&e.c, n);
            for (int op = 0; op < NOPS; op++) {
                int scaled = ids[c] == DL_CODEC_INT8 || ids[c] == DL_CODEC_INT4 || ids[c] == DL_CODEC_E3M0;
                if (op == OP_ENC_STOCH && !scaled) continue;
                e.rounding = op == OP_ENC_STOCH ? DL_ROUND_STOCHASTIC : DL_ROUND_NEAREST;
                for (int k = 0; k < reps; k++) mt[nm++] = copy_rate(cpy, (const uint8_t *)x, n * 4);
                for (int k = 0; k <= reps; k++) { /* k = 0: warm-up (page faults of the payload) */
                    double t0 = dl_clock_s();
                    int rc;
                    if (op == OP_UPDATE_STEP) {
                        rc = dl_codec_encode_step(&e, nxt, base, r, rout, n, pay);
                    } else if (op == OP_UPDATE_PASSES) {
#pragma omp parallel for simd schedule(static)
                        for (size_t i = 0; i < n; i++) xs[i] = nxt[i] - base[i];
                        memcpy(rout, r, n * 4);
                        rc = dl_codec_encode(&e, xs, rout, n, 0, pay);
                        if (!rc) rc = dl_codec_decode_add(&e.c, pay, bytes, n, base, nxt);
                    } else {
                        rc = op == OP_DECODE_ADD ? dl_codec_decode_add(&e.c, pay, bytes, n, out, out)
                                                 : dl_codec_encode(&e, x, r, n, 0, pay);
                    }
                    double dt = dl_clock_s() - t0;
                    if (rc) {
                        fprintf(stderr, "codec: %s %s failed\n", dl_codec_name(ids[c]), op_names[op]);
                        return 1;
                    }
                    if (k) t[k - 1] = (double)n * 4 / dt / 1e9;
                }
                g[c][op][ti] = median(t, reps);
            }
        }
        mc[ti] = median(mt, nm);
    }
    printf("codec throughput: %zu floats (%.0f MB fp32), block %u, topk %u per block, median of %d, GB/s of fp32 input\n",
           n, (double)n * 4 / 1e6, block, block / 16, reps);
    printf("%-6s %-18s", "codec", "op");
    for (int ti = 0; ti < nth; ti++) printf("  %2dt GB/s  x memcpy", ths[ti]);
    printf("\n%-6s %-18s", "-", "memcpy");
    for (int ti = 0; ti < nth; ti++) printf("  %8.2f  %8.2f", mc[ti], 1.0);
    printf("\n");
    for (int c = 0; c < NC; c++)
        for (int op = 0; op < NOPS; op++) {
            if (g[c][op][0] == 0) continue;
            printf("%-6s %-18s", dl_codec_name(ids[c]), op_names[op]);
            for (int ti = 0; ti < nth; ti++) printf("  %8.2f  %8.2f", g[c][op][ti], g[c][op][ti] / mc[ti]);
            printf("\n");
        }
    for (int ti = 0; ti < nth; ti++) {
        printf("memcpy_%dt_gb_per_s %.3f\n", ths[ti], mc[ti]);
        for (int c = 0; c < NC; c++)
            for (int op = 0; op < NOPS; op++)
                if (g[c][op][0] > 0)
                    printf("codec_%s_%s_%dt_gb_per_s %.3f\n", dl_codec_name(ids[c]), op_names[op], ths[ti],
                           g[c][op][ti]);
        for (int c = 0; c < NC; c++)
            if (g[c][OP_UPDATE_PASSES][ti] > 0)
                printf("update_step_vs_4pass_%s_%dt %.2f\n", dl_codec_name(ids[c]), ths[ti],
                       g[c][OP_UPDATE_STEP][ti] / g[c][OP_UPDATE_PASSES][ti]);
    }
    free(x), free(r), free(base), free(out), free(pay), free(cpy), free(t), free(mt), free(nxt), free(rout), free(xs);
    return 0;
}
