/* Times training steps (forward + backward + AdamW) of the device-resident
 * GPT (gpt/gpt_cuda.c) and reports tokens/s and model FLOP utilisation. */
#include "core/clock.h"
#include "core/err.h"
#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "gpt/gpt_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MFU denominator: NVIDIA's dense (no sparsity) BF16 tensor-core peak of the
 * H100/H200 SXM, 989 TFLOP/s. The step keeps fp32 storage and runs its GEMMs
 * in fp32, TF32 (dense peak 494.5 TFLOP/s, so 0.5 is the ceiling) or bf16
 * compute on fp32 operands (CUBLAS_COMPUTE_32F_FAST_16BF). */
#define PEAK_BF16_DENSE 989e12

#define CU(call)                                                                                                  \
    do {                                                                                                          \
        int cu_rc_ = (call);                                                                                      \
        if (cu_rc_ < 0) {                                                                                         \
            fprintf(stderr, "bench_gpu: %s -> %s\n", #call, dl_errmsg());                                         \
            return 1;                                                                                             \
        }                                                                                                         \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: bench_gpu L C NH T B V steps [matmul fp32|tf32|bf16 (default tf32)]\n");
        return 2;
    }
    const char *mm = argc > 8 ? argv[8] : "tf32";
    int prec = !strcmp(mm, "fp32") || !strcmp(mm, "0")   ? DL_MATMUL_FP32
               : !strcmp(mm, "tf32") || !strcmp(mm, "1") ? DL_MATMUL_TF32
               : !strcmp(mm, "bf16")                     ? DL_MATMUL_BF16
                                                         : -1;
    if (prec < 0) {
        fprintf(stderr, "bench_gpu: matmul '%s' is not fp32, tf32 or bf16\n", mm);
        return 2;
    }
    dl_model_config cfg = {.n_layer = atoi(argv[1]), .n_embd = atoi(argv[2]), .n_head = atoi(argv[3]),
                         .seq_len = atoi(argv[4]), .vocab = atoi(argv[6])};
    int B = atoi(argv[5]), steps = atoi(argv[7]), T = cfg.seq_len;
    if (dl_model_config_check(&cfg) || B < 1 || steps < 1) {
        fprintf(stderr, "bench_gpu: bad config: %s\n", dl_errmsg());
        return 2;
    }
    if (!dl_cuda_available()) {
        printf("bench_gpu: no usable CUDA device (%s)\n", dl_errmsg());
        return 77;
    }
    char name[256];
    CU(dl_cuda_device_name(name, sizeof name));
    dl_cuda_set_matmul(prec);
    dl_gptc *g = NULL;
    CU(dl_gptc_open(&cfg, B, &g));
    CU(dl_gptc_init(g, 1));
    dl_rng r;
    dl_rng_seed(&r, 2);
    size_t BT = (size_t)B * T;
    int32_t *inp = dl_xmalloc(BT * sizeof(int32_t)), *tgt = dl_xmalloc(BT * sizeof(int32_t));
    for (size_t i = 0; i < BT; i++) {
        inp[i] = (int32_t)dl_rng_below(&r, (uint64_t)cfg.vocab);
        tgt[i] = (int32_t)dl_rng_below(&r, (uint64_t)cfg.vocab);
    }
    dl_adamw_cfg ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    const int warm = 3;
    double t0 = 0, loss = 0, first_loss = 0;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) {
            CU(dl_cuda_sync());
            t0 = dl_clock_s();
        }
        CU(dl_gptc_forward(g, inp, tgt, B, T, &loss));
        if (s == 0) first_loss = loss;
        CU(dl_gptc_zero_grad(g));
        CU(dl_gptc_backward(g));
        CU(dl_gptc_adamw_step(g, &ac, 1e-4f, s + 1, NULL)); /* synchronizes (norm to the host) */
    }
    CU(dl_cuda_sync());
    double dt = (dl_clock_s() - t0) / steps;
    double tps = (double)BT / dt;
    double flops = dl_model_flops_per_token(&cfg, T) * tps;
    printf("dloco_gpu: %s L=%d C=%d NH=%d T=%d B=%d V=%d params %zu device_mem %.2f GiB matmul %s ms/step %.2f tok/s %.0f "
           "model TFLOP/s %.2f mfu %.4f (vs %.0f TFLOP/s bf16 dense) loss %.4f -> %.4f\n",
           name, cfg.n_layer, cfg.n_embd, cfg.n_head, T, B, cfg.vocab, dl_gptc_num_params(g),
           (double)dl_gptc_device_bytes(g) / (1 << 30), dl_cuda_matmul_name(prec), dt * 1e3, tps, flops * 1e-12,
           flops / PEAK_BF16_DENSE, PEAK_BF16_DENSE * 1e-12, first_loss, loss);
    dl_gptc_close(&g);
    dl_cuda_thread_release();
    free(inp);
    free(tgt);
    return 0;
}
