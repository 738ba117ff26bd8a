/* The bf16 learner (gpt/gpt.h dl_gpt_set_precision, kernels/cpu.h
 * dl_cpu_matmul_*_bf16): the rounding itself (nearest even, inf, NaN), the
 * bf16 GEMMs against fp32 GEMMs on rounded copies (bit for bit: only the
 * inputs are rounded), a forward / backward that differs from fp32 by a
 * bounded amount, the fp32 path unchanged after switching back, and that a
 * bf16 model trains (the loss falls). */
#include "gpt/gpt.h"

#include "core/err.h"
#include "core/rng.h"
#include "kernels/cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_round(void)
{
    float in[] = {1.0f, from_bits(0x3f808000u) /* tie, even down */, from_bits(0x3f818000u) /* tie, odd up */,
                  from_bits(0x3f808001u) /* above the tie */, INFINITY, -INFINITY, NAN, from_bits(0x7f7fffffu),
                  -0.0f, 1e-40f};
    uint32_t want[] = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x3f810000u, 0x7f800000u, 0xff800000u, 0, 0x7f800000u,
                       0x80000000u, 0};
    float out[10];
    dl_cpu_round_bf16(out, in, 10);
    for (int i = 0; i < 10; i++) {
        if (i == 6) CHECK(isnan(out[i]), "NaN stays NaN: %08x", bits(out[i]));
        else if (i == 9) CHECK((bits(out[i]) & 0xffffu) == 0 && fabsf(out[i] - in[i]) < 1e-41f, "subnormal rounds");
        else CHECK(bits(out[i]) == want[i], "round %d: %08x -> %08x, want %08x", i, bits(in[i]), bits(out[i]), want[i]);
    }
}

static void fill(float *x, size_t n, dl_rng *r)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(dl_rng_u64(r) % 2000001) / 1e6 - 1.0);
}

/* bf16 GEMMs == fp32 GEMMs of the rounded operands, bit for bit; the inputs untouched */
static void test_matmul(void)
{
    dl_rng r;
    dl_rng_seed(&r, 3);
    int N = 24, IC = 40, OC = 36;
    size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    float *inp = malloc(ni * 4), *w = malloc(nw * 4), *b = malloc(OC * 4), *dout = malloc(no * 4);
    float *ri = malloc(ni * 4), *rw = malloc(nw * 4), *rd = malloc(no * 4), *keep = malloc(ni * 4);
    float *o1 = malloc(no * 4), *o2 = malloc(no * 4), *di1 = calloc(ni, 4), *di2 = calloc(ni, 4);
    float *dw1 = calloc(nw, 4), *dw2 = calloc(nw, 4), *db1 = calloc(OC, 4), *db2 = calloc(OC, 4);
    fill(inp, ni, &r), fill(w, nw, &r), fill(b, OC, &r), fill(dout, no, &r);
    memcpy(keep, inp, ni * 4);
    dl_cpu_round_bf16(ri, inp, ni), dl_cpu_round_bf16(rw, w, nw), dl_cpu_round_bf16(rd, dout, no);
    dl_cpu_matmul_fwd_bf16(o1, inp, w, b, N, IC, OC);
    dl_cpu_matmul_fwd(o2, ri, rw, b, N, IC, OC);
    CHECK(memcmp(o1, o2, no * 4) == 0 && memcmp(inp, keep, ni * 4) == 0, "fwd: rounded operands, fp32 sums");
    dl_cpu_matmul_bwd_bf16(di1, dw1, db1, dout, inp, w, N, IC, OC);
    dl_cpu_matmul_bwd(di2, dw2, NULL, rd, ri, rw, N, IC, OC);
    memset(db2, 0, OC * 4);
    float *dummy_i = calloc(ni, 4), *dummy_w = calloc(nw, 4);
    dl_cpu_matmul_bwd(dummy_i, dummy_w, db2, dout, inp, w, N, IC, OC); /* dbias from the fp32 dout */
    CHECK(memcmp(di1, di2, ni * 4) == 0 && memcmp(dw1, dw2, nw * 4) == 0, "bwd: rounded operands, fp32 sums");
    CHECK(memcmp(db1, db2, OC * 4) == 0, "bwd: dbias is the fp32 column sum");
    /* and they differ from the fp32 products (the rounding is real) */
    dl_cpu_matmul_fwd(o2, inp, w, b, N, IC, OC);
    CHECK(memcmp(o1, o2, no * 4) != 0, "bf16 fwd differs from fp32");
    free(inp), free(w), free(b), free(dout), free(ri), free(rw), free(rd), free(keep), free(o1), free(o2);
    free(di1), free(di2), free(dw1), free(dw2), free(db1), free(db2), free(dummy_i), free(dummy_w);
}

/* a text-like batch: a repeating pattern with noise, so the loss can fall */
static void batch(int32_t *inp, int32_t *tgt, int B, int T, int V, dl_rng *r)
{
    for (int b = 0; b < B; b++) {
        int start = (int)(dl_rng_u64(r) % 7);
        for (int t = 0; t <= T; t++) {
            int tok = (start + 3 * t) % V;
            if (dl_rng_u64(r) % 10 == 0) tok = (int)(dl_rng_u64(r) % V);
            if (t < T) inp[b * T + t] = tok;
            if (t > 0) tgt[b * T + t - 1] = tok;
        }
    }
}

static void test_model(void)
{
    dl_model_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab = 64};
    int B = 8, T = 16;
    REQUIRE(dl_model_config_check(&cfg) == 0, "config: %s", dl_errmsg());
    dl_gpt *g = NULL;
    REQUIRE(dl_gpt_open(&cfg, B, &g) == 0, "open: %s", dl_errmsg());
    dl_gpt_init(g, 11);
    size_t np = dl_gpt_num_params(g);
    int32_t inp[8 * 16], tgt[8 * 16];
    dl_rng r;
    dl_rng_seed(&r, 5);
    batch(inp, tgt, B, T, cfg.vocab, &r);
    float *g32 = malloc(np * 4), *g16 = malloc(np * 4), *p0 = malloc(np * 4);
    memcpy(p0, dl_gpt_params(g), np * 4);
    CHECK(dl_gpt_precision(g) == DL_GPT_PREC_FP32, "fp32 by default");
    dl_gpt_zero_grad(g);
    double l32 = dl_gpt_forward(g, inp, tgt, B, T);
    dl_gpt_backward(g);
    memcpy(g32, dl_gpt_grads(g), np * 4);
    dl_gpt_set_precision(g, DL_GPT_PREC_BF16);
    dl_gpt_zero_grad(g);
    double l16 = dl_gpt_forward(g, inp, tgt, B, T);
    dl_gpt_backward(g);
    memcpy(g16, dl_gpt_grads(g), np * 4);
    double dot = 0, n32 = 0, n16 = 0;
    for (size_t i = 0; i < np; i++) dot += (double)g32[i] * g16[i], n32 += (double)g32[i] * g32[i], n16 += (double)g16[i] * g16[i];
    double cosv = dot / sqrt(n32 * n16);
    printf("bf16 vs fp32: loss %.6f vs %.6f (rel %.2e), gradient cosine %.6f, norm ratio %.4f\n", l16, l32,
           fabs(l16 - l32) / l32, cosv, sqrt(n16 / n32));
    CHECK(l16 != l32 && fabs(l16 - l32) / l32 < 1e-2, "bf16 loss differs from fp32 by < 1%%: %.6f vs %.6f", l16, l32);
    CHECK(cosv > 0.99 && fabs(sqrt(n16 / n32) - 1) < 0.05, "bf16 gradient near fp32: cos %.6f", cosv);
    CHECK(memcmp(p0, dl_gpt_params(g), np * 4) == 0, "a bf16 step leaves the fp32 master weights untouched");
    /* back to fp32: the exact fp32 numbers again */
    dl_gpt_set_precision(g, DL_GPT_PREC_FP32);
    dl_gpt_zero_grad(g);
    double l32b = dl_gpt_forward(g, inp, tgt, B, T);
    dl_gpt_backward(g);
    CHECK(l32b == l32 && memcmp(g32, dl_gpt_grads(g), np * 4) == 0, "fp32 again is bit for bit fp32");
    /* bf16 trains: 60 AdamW steps on fresh batches */
    dl_gpt_set_precision(g, DL_GPT_PREC_BF16);
    dl_adamw_cfg ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f, .grad_clip = 1.0f};
    double first = 0, last = 0;
    for (int s = 1; s <= 60; s++) {
        batch(inp, tgt, B, T, cfg.vocab, &r);
        dl_gpt_zero_grad(g);
        double l = dl_gpt_forward(g, inp, tgt, B, T);
        dl_gpt_backward(g);
        dl_gpt_adamw_step(g, &ac, 3e-3f, s);
        if (s <= 5) first += l / 5;
        if (s > 55) last += l / 5;
    }
    printf("bf16 training: mean loss of steps 1-5 %.4f, of steps 56-60 %.4f\n", first, last);
    CHECK(isfinite(last) && last < 0.8 * first, "bf16 loss falls: %.4f -> %.4f", first, last);
    free(g32), free(g16), free(p0);
    dl_gpt_close(&g);
}

int main(void)
{
    test_round();
    test_matmul();
    test_model();
    return CHECK_DONE("test_bf16");
}
