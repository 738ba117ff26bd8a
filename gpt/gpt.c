/* GPT-2 forward/backward over one contiguous parameter buffer (per-layer
 * tensors in llm.c order), activations in one allocation, AdamW in place. */
#include "gpt/gpt.h"

#include "core/err.h"
#include "kernels/cpu.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

struct dl_gpt {
    dl_model_config cfg;
    int maxB;
    dl_tensor *tensors; /* 2 + 12L + 2 entries */
    int ntensors;
    size_t nparams;
    float *params, *grads, *m, *v; /* nparams floats each */

    /* activations, one allocation; [L,...] arrays index layer-major */
    float *acts;
    size_t nacts;
#define DL_ACT_FIELD(name, n) float *name;
    DL_GPT_ACTIVATIONS(DL_ACT_FIELD) /* gpt/gpt.h */
#undef DL_ACT_FIELD

    int B, T;                  /* shape of the last forward */
    const int32_t *inp, *targets;
    int32_t *inp_copy, *tgt_copy; /* [maxB*T] kept for backward */
    int bf16;                     /* DL_GPT_PREC_BF16: the linear layers' GEMM inputs in bf16 (dl_gpt_set_precision) */
};

/* The linear layers (QKV, attention projection, MLP up / down, the tied LM head), fp32 or with bf16 GEMM
 * inputs (kernels/cpu.h); everything else (attention's per-head GEMMs, layernorm, GELU, softmax, the loss,
 * AdamW, master weights) stays fp32. */
#define MM_FWD(g, ...) ((g)->bf16 ? dl_cpu_matmul_fwd_bf16(__VA_ARGS__) : dl_cpu_matmul_fwd(__VA_ARGS__))
#define MM_BWD(g, ...) ((g)->bf16 ? dl_cpu_matmul_bwd_bf16(__VA_ARGS__) : dl_cpu_matmul_bwd(__VA_ARGS__))

static float *carve(float **cursor, size_t n)
{
    float *p = *cursor;
    *cursor += (n + 15) & ~(size_t)15; /* keep 64-byte alignment of every view */
    return p;
}

/* Floats of the activations for batches up to B of a checked cfg (each
 * buffer rounded up to 16 floats, as carved). */
static size_t acts_numel(const dl_model_config *cfg, int B)
{
    size_t L = (size_t)cfg->n_layer, C = (size_t)cfg->n_embd, T = (size_t)cfg->seq_len, NH = (size_t)cfg->n_head;
    size_t Vp = (size_t)cfg->padded_vocab, BT = (size_t)B * T, TT = (size_t)B * NH * T * T;
    size_t total = 0;
#define DL_ACT_SIZE(name, n) total += ((n) + 15) & ~(size_t)15;
    DL_GPT_ACTIVATIONS(DL_ACT_SIZE)
#undef DL_ACT_SIZE
    (void)L, (void)C, (void)Vp, (void)BT, (void)TT;
    return total;
}

size_t dl_gpt_open_bytes(const dl_model_config *cfg_in, int B)
{
    dl_model_config cfg = *cfg_in;
    if (dl_model_config_check(&cfg) || B < 1) return 0;
    size_t nparams = 0;
    dl_model_tensor_table(&cfg, NULL, 0, &nparams);
    size_t np = (nparams + 15) & ~(size_t)15;
    return (4 * np + acts_numel(&cfg, B)) * sizeof(float) + 2 * (size_t)B * (size_t)cfg.seq_len * sizeof(int32_t);
}

int dl_gpt_open(const dl_model_config *cfg_in, int B, dl_gpt **out)
{
    *out = NULL;
    dl_gpt *g = dl_xcalloc(1, sizeof *g);
    int shaped = dl_model_shape(cfg_in, B, &g->cfg, &g->tensors, &g->ntensors, &g->nparams);
    if (shaped) {
        free(g);
        return shaped;
    }
    dl_model_config cfg = g->cfg;
    g->maxB = B;

    size_t np = (g->nparams + 15) & ~(size_t)15;
    float *blob = dl_try_aligned(64, 4 * np * sizeof(float));
    if (!blob) {
        int rc = dl_err(DL_ENOMEM, "model state of %zu parameters x 4 buffers (%.2f GB): out of memory", g->nparams,
                        4.0 * (double)np * sizeof(float) / 1e9);
        free(g->tensors);
        free(g);
        return rc;
    }
    memset(blob, 0, 4 * np * sizeof(float));
    g->params = blob;
    g->grads = blob + np;
    g->m = blob + 2 * np;
    g->v = blob + 3 * np;

    size_t L = (size_t)cfg.n_layer, C = (size_t)cfg.n_embd, T = (size_t)cfg.seq_len, NH = (size_t)cfg.n_head;
    size_t Vp = (size_t)cfg.padded_vocab, BT = (size_t)B * T, TT = (size_t)B * NH * T * T;
    size_t total = acts_numel(&cfg, B);
    g->acts = dl_try_aligned(64, total * sizeof(float));
    if (!g->acts) {
        free(blob);
        free(g->tensors);
        free(g);
        return dl_err(DL_ENOMEM, "activations of %zu floats (%.2f GB) for batch %d x %zu: out of memory", total,
                      (double)total * sizeof(float) / 1e9, B, T);
    }
    memset(g->acts, 0, total * sizeof(float));
    g->nacts = total;
    float *c = g->acts;
#define DL_ACT_CARVE(name, n) g->name = carve(&c, n);
    DL_GPT_ACTIVATIONS(DL_ACT_CARVE)
#undef DL_ACT_CARVE
    assert((size_t)(c - g->acts) == total);
    g->inp_copy = dl_xcalloc(BT, sizeof(int32_t));
    g->tgt_copy = dl_xcalloc(BT, sizeof(int32_t));
    *out = g;
    return 0;
}

void dl_gpt_close(dl_gpt **gp)
{
    if (!gp || !*gp) return;
    dl_gpt *g = *gp;
    free(g->params); /* params, grads, m, v share one allocation */
    free(g->acts);
    free(g->tensors);
    free(g->inp_copy);
    free(g->tgt_copy);
    free(g);
    *gp = NULL;
}

void dl_gpt_init(dl_gpt *g, uint64_t seed)
{
    int rc = dl_model_init_params(&g->cfg, seed, g->params);
    assert(rc == 0); /* the config was checked at open */
    (void)rc;
}

const dl_model_config *dl_gpt_cfg(const dl_gpt *g) { return &g->cfg; }
size_t dl_gpt_num_params(const dl_gpt *g) { return g->nparams; }
void dl_gpt_set_precision(dl_gpt *g, int prec) { g->bf16 = prec == DL_GPT_PREC_BF16; }
int dl_gpt_precision(const dl_gpt *g) { return g->bf16 ? DL_GPT_PREC_BF16 : DL_GPT_PREC_FP32; }
float *dl_gpt_params(dl_gpt *g) { return g->params; }
float *dl_gpt_grads(dl_gpt *g) { return g->grads; }
float *dl_gpt_adam_m(dl_gpt *g) { return g->m; }
float *dl_gpt_adam_v(dl_gpt *g) { return g->v; }
const dl_tensor *dl_gpt_tensors(const dl_gpt *g, int *n)
{
    if (n) *n = g->ntensors;
    return g->tensors;
}
const float *dl_gpt_logits(const dl_gpt *g) { return g->logits; }

double dl_gpt_forward(dl_gpt *g, const int32_t *inp, const int32_t *targets, int B, int T)
{
    assert(B >= 1 && B <= g->maxB && T >= 1 && T <= g->cfg.seq_len);
    int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, Vp = g->cfg.padded_vocab, V = g->cfg.vocab;
    size_t BT = (size_t)B * T;
    g->B = B;
    g->T = T;
    memcpy(g->inp_copy, inp, BT * sizeof(int32_t));
    if (targets) memcpy(g->tgt_copy, targets, BT * sizeof(int32_t));
    g->targets = targets ? g->tgt_copy : NULL;

    float *P = g->params;
    float *wte = P + g->tensors[0].offset, *wpe = P + g->tensors[1].offset;
    dl_cpu_encoder_fwd(g->encoded, g->inp_copy, wte, wpe, B, T, C);
    const float *x = g->encoded;
    for (int l = 0; l < L; l++) {
        dl_model_block w = dl_model_block_of(g->tensors, P, l);
        float *ln1 = g->ln1 + l * BT * C, *m1 = g->ln1_mean + l * BT, *r1 = g->ln1_rstd + l * BT;
        float *qkv = g->qkv + l * BT * 3 * C, *atty = g->atty + l * BT * C;
        float *att = g->att + (size_t)l * B * NH * T * T;
        float *res2 = g->res2 + l * BT * C;
        float *ln2 = g->ln2 + l * BT * C, *m2 = g->ln2_mean + l * BT, *r2 = g->ln2_rstd + l * BT;
        float *fch = g->fch + l * BT * 4 * C, *fchg = g->fch_gelu + l * BT * 4 * C;
        float *res3 = g->res3 + l * BT * C;

        dl_cpu_layernorm_fwd(ln1, m1, r1, x, w.ln1w, w.ln1b, (int)BT, C);
        MM_FWD(g, qkv, ln1, w.qkvw, w.qkvb, (int)BT, C, 3 * C);
        dl_cpu_attention_fwd(atty, att, qkv, B, T, C, NH);
        /* res2 = x + atty @ Wproj^T + b: start from x, accumulate the matmul */
        MM_FWD(g, g->dbuf, atty, w.projw, w.projb, (int)BT, C, C);
        dl_cpu_residual_fwd(res2, x, g->dbuf, BT * C);
        dl_cpu_layernorm_fwd(ln2, m2, r2, res2, w.ln2w, w.ln2b, (int)BT, C);
        MM_FWD(g, fch, ln2, w.fcw, w.fcb, (int)BT, C, 4 * C);
        dl_cpu_gelu_fwd(fchg, fch, BT * 4 * C);
        MM_FWD(g, g->dbuf, fchg, w.fcpw, w.fcpb, (int)BT, 4 * C, C);
        dl_cpu_residual_fwd(res3, res2, g->dbuf, BT * C);
        x = res3;
    }
    float *lnfw = P + g->tensors[g->ntensors - 2].offset, *lnfb = P + g->tensors[g->ntensors - 1].offset;
    dl_cpu_layernorm_fwd(g->lnf, g->lnf_mean, g->lnf_rstd, x, lnfw, lnfb, (int)BT, C);
    MM_FWD(g, g->logits, g->lnf, wte, NULL, (int)BT, C, Vp);
    if (!targets) return 0.0;
    if (Vp == V) return dl_cpu_softmax_xent_fwd(g->probs, g->losses, g->logits, g->tgt_copy, (int)BT, V);
    /* padded vocab: softmax over the first V columns of each Vp-wide row */
    double total = 0.0;
    for (size_t n = 0; n < BT; n++)
        total += dl_cpu_softmax_xent_fwd(g->probs + n * Vp, g->losses + n, g->logits + n * Vp, g->tgt_copy + n, 1, V);
    return total / (double)BT;
}

void dl_gpt_zero_grad(dl_gpt *g) { memset(g->grads, 0, g->nparams * sizeof(float)); }

void dl_gpt_backward(dl_gpt *g)
{
    assert(g->targets && "dl_gpt_backward needs a forward with targets");
    int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, Vp = g->cfg.padded_vocab, V = g->cfg.vocab;
    int B = g->B, T = g->T;
    size_t BT = (size_t)B * T;
    float *P = g->params, *G = g->grads;
    float *wte = P + g->tensors[0].offset, *dwte = G + g->tensors[0].offset, *dwpe = G + g->tensors[1].offset;
    float *dlogits = g->logits; /* logits are not needed any more: reuse */
    float dloss = 1.0f / (float)BT;
    if (Vp == V) {
        dl_cpu_softmax_xent_bwd(dlogits, g->probs, g->tgt_copy, (int)BT, V, dloss);
    } else {
        for (size_t n = 0; n < BT; n++) {
            dl_cpu_softmax_xent_bwd(dlogits + n * Vp, g->probs + n * Vp, g->tgt_copy + n, 1, V, dloss);
            memset(dlogits + n * Vp + V, 0, (size_t)(Vp - V) * sizeof(float));
        }
    }
    /* lm head (tied to wte): dlnf = dlogits @ wte, dwte += dlogits^T @ lnf */
    memset(g->dbuf, 0, BT * C * sizeof(float));
    MM_BWD(g, g->dbuf, dwte, NULL, dlogits, g->lnf, wte, (int)BT, C, Vp);
    const float *xlast = L > 0 ? g->res3 + (size_t)(L - 1) * BT * C : g->encoded;
    int lf = g->ntensors - 2;
    memset(g->dres, 0, BT * C * sizeof(float));
    dl_cpu_layernorm_bwd(g->dres, G + g->tensors[lf].offset, G + g->tensors[lf + 1].offset, g->dbuf, xlast,
                         P + g->tensors[lf].offset, g->lnf_mean, g->lnf_rstd, (int)BT, C);

    for (int l = L - 1; l >= 0; l--) {
        dl_model_block w = dl_model_block_of(g->tensors, P, l), dw = dl_model_block_of(g->tensors, G, l);
        const float *x = l == 0 ? g->encoded : g->res3 + (size_t)(l - 1) * BT * C;
        float *ln1 = g->ln1 + l * BT * C, *m1 = g->ln1_mean + l * BT, *r1 = g->ln1_rstd + l * BT;
        float *qkv = g->qkv + l * BT * 3 * C, *atty = g->atty + l * BT * C;
        float *att = g->att + (size_t)l * B * NH * T * T;
        float *res2 = g->res2 + l * BT * C;
        float *ln2 = g->ln2 + l * BT * C, *m2 = g->ln2_mean + l * BT, *r2 = g->ln2_rstd + l * BT;
        float *fch = g->fch + l * BT * 4 * C, *fchg = g->fch_gelu + l * BT * 4 * C;

        /* g->dres holds dL/d(res3); it is also dL/d(res2) through the skip */
        memset(g->dfch, 0, BT * 4 * C * sizeof(float));
        MM_BWD(g, g->dfch, dw.fcpw, dw.fcpb, g->dres, fchg, w.fcpw, (int)BT, 4 * C, C);
        /* dfch holds d(fch_gelu); gelu backward into a second buffer would cost
         * BT*4C floats, so do it in place through the dqkv-free scratch: */
        memset(g->dqkv, 0, BT * 3 * C * sizeof(float));
        float *dpre = g->fch_gelu + l * BT * 4 * C; /* fch_gelu no longer needed after matmul_bwd */
        memset(dpre, 0, BT * 4 * C * sizeof(float));
        dl_cpu_gelu_bwd(dpre, fch, g->dfch, BT * 4 * C);
        memset(g->dbuf, 0, BT * C * sizeof(float));
        MM_BWD(g, g->dbuf, dw.fcw, dw.fcb, dpre, ln2, w.fcw, (int)BT, C, 4 * C);
        dl_cpu_layernorm_bwd(g->dres, dw.ln2w, dw.ln2b, g->dbuf, res2, w.ln2w, m2, r2, (int)BT, C);
        /* g->dres now dL/d(res2); attention branch */
        memset(g->dbuf, 0, BT * C * sizeof(float));
        MM_BWD(g, g->dbuf, dw.projw, dw.projb, g->dres, atty, w.projw, (int)BT, C, C);
        dl_cpu_attention_bwd(g->dqkv, g->datt, g->dbuf, qkv, att, B, T, C, NH);
        memset(g->dbuf2, 0, BT * C * sizeof(float));
        MM_BWD(g, g->dbuf2, dw.qkvw, dw.qkvb, g->dqkv, ln1, w.qkvw, (int)BT, C, 3 * C);
        dl_cpu_layernorm_bwd(g->dres, dw.ln1w, dw.ln1b, g->dbuf2, x, w.ln1w, m1, r1, (int)BT, C);
    }
    dl_cpu_encoder_bwd(dwte, dwpe, g->dres, g->inp_copy, B, T, C);
}

dl_adamw_hp dl_gpt_adamw_hp(const dl_adamw_cfg *c, float lr, int64_t t, double norm)
{
    float scale = 1.0f;
    /* same rule as torch.nn.utils.clip_grad_norm_ */
    if (c->grad_clip > 0.0f) {
        double coef = c->grad_clip / (norm + 1e-6);
        if (coef < 1.0) scale = (float)coef;
    }
    return (dl_adamw_hp){.lr = lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps, .grad_scale = scale, .t = t};
}

int dl_gpt_decay_run(const dl_tensor *t, int n, int i, size_t *off, size_t *len, int *decay)
{
    assert(i >= 0 && i < n);
    int d = t[i].kind != DL_TENSOR_VECTOR, j = i + 1;
    while (j < n && (t[j].kind != DL_TENSOR_VECTOR) == d) j++;
    *off = t[i].offset;
    *len = t[j - 1].offset + t[j - 1].numel - *off;
    *decay = d;
    return j;
}

/* Both AdamW variants over the decay runs (one kernel call per run); ga
 * NULL: plain AdamW on the grads, else the split step with ga and grads. */
static void adamw_runs(dl_gpt *g, const dl_adamw_cfg *c, float lr, int64_t t, double norm, const float *ga, float *w,
                       float fleet)
{
    dl_adamw_hp hp = dl_gpt_adamw_hp(c, lr, t, norm);
    size_t off, n;
    int decay;
    for (int i = 0; i < g->ntensors;) {
        i = dl_gpt_decay_run(g->tensors, g->ntensors, i, &off, &n, &decay);
        hp.weight_decay = decay ? c->weight_decay : 0.0f;
        if (ga)
            dl_cpu_adamw_split(g->params + off, ga + off, g->grads + off, g->m + off, g->v + off, w + off, n, &hp,
                               fleet);
        else
            dl_cpu_adamw(g->params + off, g->grads + off, g->m + off, g->v + off, n, &hp);
    }
}

float dl_gpt_adamw_step(dl_gpt *g, const dl_adamw_cfg *c, float lr, int64_t t)
{
    assert(t >= 1);
    double norm = sqrt(dl_cpu_sumsq(g->grads, g->nparams));
    adamw_runs(g, c, lr, t, norm, NULL, NULL, 0.0f);
    return (float)norm;
}

float dl_gpt_adamw_split_step(dl_gpt *g, const dl_adamw_cfg *c, float lr, int64_t t, const float *ga, float *w,
                              float fleet)
{
    assert(t >= 1 && ga && w && fleet >= 1.0f);
    const float *gb = g->grads;
    double ss = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : ss)
    for (size_t i = 0; i < g->nparams; i++) {
        double x = 0.5 * ((double)ga[i] + (double)gb[i]);
        ss += x * x;
    }
    double norm = sqrt(ss);
    adamw_runs(g, c, lr, t, norm, ga, w, fleet);
    return (float)norm;
}
