/* Times training steps (forward + backward + AdamW) of the CPU learner on a
 * given GPT config with random tokens, and OpenBLAS sgemm peak on the same
 * cores (with the kernels kernels/blas_select.h chose), so the bench script
 * can print model FLOP/s as a fraction of peak; "peak" alone: only that. */
#include "core/clock.h"
#include "core/rng.h"
#include "kernels/blas_select.h"
#include "learner/gpt.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double sgemm_peak(void)
{
    /* the largest matmul shape of a step ([B*T, C] x [C, 4C]) at a size
     * where OpenBLAS reaches its plateau: the realistic ceiling */
    int M = 2048, N = 1024, K = 1024;
    float *a = calloc((size_t)M * K, 4), *b = calloc((size_t)K * N, 4), *c = calloc((size_t)M * N, 4);
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = (float)(i % 7) * 0.01f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t = dl_clock_s();
        for (int i = 0; i < 4; i++) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
        t = dl_clock_s() - t;
        double f = 4 * 2.0 * M * N * K / t;
        if (f > best) best = f;
    }
    free(a); free(b); free(c);
    return best;
}

int main(int argc, char **argv)
{
    if (dl_blas_select(&argc, argv)) return 2;
    if (argc == 2 && !strcmp(argv[1], "peak")) {
        printf("sgemm_peak GFLOP/s %.1f threads %d\n", sgemm_peak() * 1e-9, omp_get_max_threads());
        return 0;
    }
    if (argc < 8) {
        fprintf(stderr, "usage: bench_learner [--blas_core auto|CORE] L C NH T B V steps | peak\n");
        return 2;
    }
    dl_model_config cfg = {.n_layer = atoi(argv[1]), .n_embd = atoi(argv[2]), .n_head = atoi(argv[3]),
                         .seq_len = atoi(argv[4]), .vocab = atoi(argv[6])};
    int B = atoi(argv[5]), steps = atoi(argv[7]), T = cfg.seq_len;
    if (dl_model_config_check(&cfg) || B < 1 || steps < 1) {
        fprintf(stderr, "bench_learner: bad config\n");
        return 2;
    }
    dl_gpt *g = NULL;
    if (dl_gpt_open(&cfg, B, &g)) return 1;
    dl_gpt_init(g, 1);
    dl_rng r;
    dl_rng_seed(&r, 2);
    int32_t *inp = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        inp[i] = (int32_t)dl_rng_below(&r, (uint64_t)cfg.vocab);
        tgt[i] = (int32_t)dl_rng_below(&r, (uint64_t)cfg.vocab);
    }
    dl_adamw_cfg ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    int warm = 3;
    double t0 = 0, loss = 0;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) t0 = dl_clock_s();
        loss = dl_gpt_forward(g, inp, tgt, B, T);
        dl_gpt_zero_grad(g);
        dl_gpt_backward(g);
        dl_gpt_adamw_step(g, &ac, 1e-4f, s + 1);
    }
    double dt = (dl_clock_s() - t0) / steps;
    double tps = (double)B * T / dt;
    double flops = dl_model_flops_per_token(&cfg, T) * tps;
    double peak = sgemm_peak();
    printf("dloco_cpu: params %zu threads %d ms/step %.1f tok/s %.0f model GFLOP/s %.1f sgemm_peak GFLOP/s %.1f "
           "fraction_of_peak %.2f loss %.4f\n",
           dl_gpt_num_params(g), omp_get_max_threads(), dt * 1e3, tps, flops * 1e-9, peak * 1e-9, flops / peak, loss);
    dl_gpt_close(&g);
    free(inp);
    free(tgt);
    return 0;
}
