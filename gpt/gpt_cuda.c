/* GPT-2 forward/backward/AdamW on a CUDA device: the step of gpt/gpt.c
 * call for call on the kernels/cuda twins, state in one device allocation. */
#include "gpt/gpt_cuda.h"

#include "core/err.h"
#include "core/plan.h"
#include "kernels/cuda/cuda.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dl_gptc {
    dl_model_config cfg;
    int maxB;
    dl_tensor *tensors; /* host copy of the table, 2 + 12L + 2 entries */
    int ntensors;
    size_t nparams;
    float *state;                  /* device: params | grads | m | v, np floats each */
    float *params, *grads, *m, *v; /* device views */

    /* device activations, one allocation; [L,...] arrays layer-major, shapes as in gpt.c */
    float *acts;
    size_t nacts; /* floats */
#define DL_ACT_FIELD(name, n) float *name;
    DL_GPT_ACTIVATIONS(DL_ACT_FIELD) /* gpt/gpt.h, the CPU model's layout */
#undef DL_ACT_FIELD
    int32_t *inp, *tgt; /* device [maxB*T] token ids of the last forward */

    int B, T;        /* shape of the last forward */
    int has_targets; /* the last forward had targets (backward allowed) */
};

static float *carve(float **cursor, size_t n)
{
    float *p = *cursor;
    *cursor += (n + 63) & ~(size_t)63; /* 256-byte alignment of every view */
    return p;
}

int dl_gptc_open(const dl_model_config *cfg_in, int B, dl_gptc **out)
{
    *out = NULL;
    dl_gptc *g = dl_xcalloc(1, sizeof *g);
    int shaped = dl_model_shape(cfg_in, B, &g->cfg, &g->tensors, &g->ntensors, &g->nparams);
    if (shaped) {
        free(g);
        return shaped;
    }
    dl_model_config cfg = g->cfg;
    g->maxB = B;

    size_t np = (g->nparams + 63) & ~(size_t)63;
    int rc = dl_cuda_malloc(4 * np * sizeof(float), (void **)&g->state);
    if (rc < 0) goto fail;
    rc = dl_cuda_memset0(g->state, 4 * np * sizeof(float));
    if (rc < 0) goto fail;
    g->params = g->state;
    g->grads = g->state + np;
    g->m = g->state + 2 * np;
    g->v = g->state + 3 * np;

    size_t L = (size_t)cfg.n_layer, C = (size_t)cfg.n_embd, T = (size_t)cfg.seq_len, NH = (size_t)cfg.n_head;
    size_t Vp = (size_t)cfg.padded_vocab, BT = (size_t)B * T, TT = (size_t)B * NH * T * T;
    size_t total = 0;
#define DL_ACT_SIZE(name, n) total += ((n) + 63) & ~(size_t)63;
    DL_GPT_ACTIVATIONS(DL_ACT_SIZE)
#undef DL_ACT_SIZE
    total += 2 * ((BT + 63) & ~(size_t)63); /* inp, tgt (int32, float-sized slots) */
    rc = dl_cuda_malloc(total * sizeof(float), (void **)&g->acts);
    if (rc < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        rc = dl_err(rc, "activations of %.2f GiB (B=%d, T=%zu; attention probabilities alone %.2f GiB): %s",
                    (double)total * 4 / (1 << 30), B, T, (double)L * TT * 4 / (1 << 30), why);
        goto fail;
    }
    rc = dl_cuda_memset0(g->acts, total * sizeof(float));
    if (rc < 0) goto fail;
    g->nacts = total;
    float *c = g->acts;
#define DL_ACT_CARVE(name, n) g->name = carve(&c, n);
    DL_GPT_ACTIVATIONS(DL_ACT_CARVE)
#undef DL_ACT_CARVE
    g->inp = (int32_t *)carve(&c, BT);
    g->tgt = (int32_t *)carve(&c, BT);
    assert((size_t)(c - g->acts) == total);
    *out = g;
    return 0;
fail:
    dl_gptc_close(&g);
    return rc;
}

void dl_gptc_close(dl_gptc **gp)
{
    if (!gp || !*gp) return;
    dl_gptc *g = *gp;
    dl_cuda_free((void **)&g->state);
    dl_cuda_free((void **)&g->acts);
    free(g->tensors);
    free(g);
    *gp = NULL;
}

int dl_gptc_init(dl_gptc *g, uint64_t seed)
{
    float *h = dl_xmalloc(g->nparams * sizeof(float));
    int rc = dl_model_init_params(&g->cfg, seed, h);
    if (rc == 0) rc = dl_gptc_set_params(g, h);
    free(h);
    return rc;
}

const dl_model_config *dl_gptc_cfg(const dl_gptc *g) { return &g->cfg; }
size_t dl_gptc_num_params(const dl_gptc *g) { return g->nparams; }
const dl_tensor *dl_gptc_tensors(const dl_gptc *g, int *n)
{
    if (n) *n = g->ntensors;
    return g->tensors;
}
size_t dl_gptc_device_bytes(const dl_gptc *g)
{
    return (4 * ((g->nparams + 63) & ~(size_t)63) + g->nacts) * sizeof(float);
}
float *dl_gptc_params_dev(dl_gptc *g) { return g->params; }
float *dl_gptc_grads_dev(dl_gptc *g) { return g->grads; }
float *dl_gptc_adam_m_dev(dl_gptc *g) { return g->m; }
float *dl_gptc_adam_v_dev(dl_gptc *g) { return g->v; }

int dl_gptc_set_params(dl_gptc *g, const float *host)
{
    return dl_cuda_h2d(g->params, host, g->nparams * sizeof(float));
}
int dl_gptc_get_params(dl_gptc *g, float *host)
{
    return dl_cuda_d2h(host, g->params, g->nparams * sizeof(float));
}
int dl_gptc_get_grads(dl_gptc *g, float *host) { return dl_cuda_d2h(host, g->grads, g->nparams * sizeof(float)); }
int dl_gptc_get_state(dl_gptc *g, float *params, float *m, float *v)
{
    size_t n = g->nparams * sizeof(float);
    DL_TRY(dl_cuda_d2h(params, g->params, n));
    DL_TRY(dl_cuda_d2h(m, g->m, n));
    return dl_cuda_d2h(v, g->v, n);
}
int dl_gptc_set_state(dl_gptc *g, const float *params, const float *m, const float *v)
{
    size_t n = g->nparams * sizeof(float);
    DL_TRY(dl_cuda_h2d(g->params, params, n));
    DL_TRY(dl_cuda_h2d(g->m, m, n));
    return dl_cuda_h2d(g->v, v, n);
}
int dl_gptc_reset_optimizer(dl_gptc *g)
{
    /* m and v are adjacent views: one memset over both */
    return dl_cuda_memset0(g->m, (size_t)(g->v - g->m) * sizeof(float) + g->nparams * sizeof(float));
}
int dl_gptc_get_logits(dl_gptc *g, float *host)
{
    return dl_cuda_d2h(host, g->logits, (size_t)g->B * g->T * g->cfg.padded_vocab * sizeof(float));
}

/* The plan must describe this model's buffer: same tensor count and offsets. */
static void check_plan(const dl_gptc *g, const dl_plan *plan, int p)
{
    assert(plan && p >= 0 && p < dl_plan_P(plan));
    assert(dl_plan_ntensors(plan) == g->ntensors && dl_plan_total_numel(plan) == g->nparams);
    (void)g, (void)plan, (void)p;
}

int dl_gptc_gather(dl_gptc *g, const dl_plan *plan, int p, float *out)
{
    check_plan(g, plan, p);
    int ns;
    const dl_plan_span *sp = dl_plan_fragment_spans(plan, p, &ns);
    for (int i = 0; i < ns; i++) {
        assert(sp[i].src + sp[i].numel <= g->nparams);
        DL_TRY(dl_cuda_d2h(out + sp[i].offset, g->params + sp[i].src, sp[i].numel * sizeof(float)));
    }
    return 0;
}

int dl_gptc_scatter(dl_gptc *g, const dl_plan *plan, int p, const float *in)
{
    check_plan(g, plan, p);
    int ns;
    const dl_plan_span *sp = dl_plan_fragment_spans(plan, p, &ns);
    for (int i = 0; i < ns; i++) {
        assert(sp[i].src + sp[i].numel <= g->nparams);
        DL_TRY(dl_cuda_h2d(g->params + sp[i].src, in + sp[i].offset, sp[i].numel * sizeof(float)));
    }
    return 0;
}

static int check_tokens(const int32_t *x, size_t n, int V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] < 0 || x[i] >= V) return dl_err(DL_EINVAL, "%s[%zu] = %d not in [0, %d)", what, i, x[i], V);
    return 0;
}

int dl_gptc_forward(dl_gptc *g, const int32_t *inp, const int32_t *targets, int B, int T, double *loss)
{
    assert(inp && loss && B >= 1 && B <= g->maxB && T >= 1 && T <= g->cfg.seq_len);
    *loss = 0.0;
    int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, Vp = g->cfg.padded_vocab, V = g->cfg.vocab;
    size_t BT = (size_t)B * T, TT = (size_t)B * NH * T * T;
    g->has_targets = 0;
    DL_TRY(check_tokens(inp, BT, V, "inp"));
    if (targets) DL_TRY(check_tokens(targets, BT, V, "targets"));
    g->B = B;
    g->T = T;
    DL_TRY(dl_cuda_h2d(g->inp, inp, BT * sizeof(int32_t)));
    if (targets) DL_TRY(dl_cuda_h2d(g->tgt, targets, BT * sizeof(int32_t)));

    float *P = g->params;
    float *wte = P + g->tensors[0].offset, *wpe = P + g->tensors[1].offset;
    DL_TRY(dl_cuda_encoder_fwd(g->encoded, g->inp, wte, wpe, B, T, C));
    const float *x = g->encoded;
    for (int l = 0; l < L; l++) {
        dl_model_block w = dl_model_block_of(g->tensors, P, l);
        float *ln1 = g->ln1 + l * BT * C, *m1 = g->ln1_mean + l * BT, *r1 = g->ln1_rstd + l * BT;
        float *qkv = g->qkv + l * BT * 3 * C, *atty = g->atty + l * BT * C;
        float *att = g->att + (size_t)l * TT;
        float *res2 = g->res2 + l * BT * C;
        float *ln2 = g->ln2 + l * BT * C, *m2 = g->ln2_mean + l * BT, *r2 = g->ln2_rstd + l * BT;
        float *fch = g->fch + l * BT * 4 * C, *fchg = g->fch_gelu + l * BT * 4 * C;
        float *res3 = g->res3 + l * BT * C;

        DL_TRY(dl_cuda_layernorm_fwd(ln1, m1, r1, x, w.ln1w, w.ln1b, (int)BT, C));
        DL_TRY(dl_cuda_matmul_fwd(qkv, ln1, w.qkvw, w.qkvb, (int)BT, C, 3 * C));
        DL_TRY(dl_cuda_attention_fwd(atty, att, qkv, B, T, C, NH));
        DL_TRY(dl_cuda_matmul_fwd(g->dbuf, atty, w.projw, w.projb, (int)BT, C, C));
        DL_TRY(dl_cuda_residual_fwd(res2, x, g->dbuf, BT * C));
        DL_TRY(dl_cuda_layernorm_fwd(ln2, m2, r2, res2, w.ln2w, w.ln2b, (int)BT, C));
        DL_TRY(dl_cuda_matmul_fwd(fch, ln2, w.fcw, w.fcb, (int)BT, C, 4 * C));
        DL_TRY(dl_cuda_gelu_fwd(fchg, fch, BT * 4 * C));
        DL_TRY(dl_cuda_matmul_fwd(g->dbuf, fchg, w.fcpw, w.fcpb, (int)BT, 4 * C, C));
        DL_TRY(dl_cuda_residual_fwd(res3, res2, g->dbuf, BT * C));
        x = res3;
    }
    float *lnfw = P + g->tensors[g->ntensors - 2].offset, *lnfb = P + g->tensors[g->ntensors - 1].offset;
    DL_TRY(dl_cuda_layernorm_fwd(g->lnf, g->lnf_mean, g->lnf_rstd, x, lnfw, lnfb, (int)BT, C));
    DL_TRY(dl_cuda_matmul_fwd(g->logits, g->lnf, wte, NULL, (int)BT, C, Vp));
    if (!targets) return dl_cuda_sync();
    /* softmax over the first V columns of each Vp-wide row; synchronizes */
    DL_TRY(dl_cuda_softmax_xent_fwd_ld(g->probs, g->losses, g->logits, g->tgt, (int)BT, V, Vp, loss));
    g->has_targets = 1;
    return 0;
}

int dl_gptc_zero_grad(dl_gptc *g) { return dl_cuda_memset0(g->grads, g->nparams * sizeof(float)); }

int dl_gptc_backward(dl_gptc *g)
{
    assert(g->has_targets && "dl_gptc_backward needs a forward with targets");
    g->has_targets = 0; /* activations are overwritten below */
    int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, Vp = g->cfg.padded_vocab, V = g->cfg.vocab;
    int B = g->B, T = g->T;
    size_t BT = (size_t)B * T, TT = (size_t)B * NH * T * T;
    float *P = g->params, *G = g->grads;
    float *wte = P + g->tensors[0].offset, *dwte = G + g->tensors[0].offset, *dwpe = G + g->tensors[1].offset;
    float *dlogits = g->logits; /* logits are not needed any more: reuse */
    float dloss = 1.0f / (float)BT;
    /* padding columns V..Vp-1 of dlogits are written as 0 */
    DL_TRY(dl_cuda_softmax_xent_bwd_ld(dlogits, g->probs, g->tgt, (int)BT, V, Vp, dloss));
    /* lm head (tied to wte): dlnf = dlogits @ wte, dwte += dlogits^T @ lnf */
    DL_TRY(dl_cuda_memset0(g->dbuf, BT * C * sizeof(float)));
    DL_TRY(dl_cuda_matmul_bwd(g->dbuf, dwte, NULL, dlogits, g->lnf, wte, (int)BT, C, Vp));
    const float *xlast = g->res3 + (size_t)(L - 1) * BT * C; /* L >= 1 (config check) */
    int lf = g->ntensors - 2;
    DL_TRY(dl_cuda_memset0(g->dres, BT * C * sizeof(float)));
    DL_TRY(dl_cuda_layernorm_bwd(g->dres, G + g->tensors[lf].offset, G + g->tensors[lf + 1].offset, g->dbuf, xlast,
                                 P + g->tensors[lf].offset, g->lnf_mean, g->lnf_rstd, (int)BT, C));

    for (int l = L - 1; l >= 0; l--) {
        dl_model_block w = dl_model_block_of(g->tensors, P, l), dw = dl_model_block_of(g->tensors, G, l);
        const float *x = l == 0 ? g->encoded : g->res3 + (size_t)(l - 1) * BT * C;
        float *ln1 = g->ln1 + l * BT * C, *m1 = g->ln1_mean + l * BT, *r1 = g->ln1_rstd + l * BT;
        float *qkv = g->qkv + l * BT * 3 * C, *atty = g->atty + l * BT * C;
        float *att = g->att + (size_t)l * TT;
        float *res2 = g->res2 + l * BT * C;
        float *ln2 = g->ln2 + l * BT * C, *m2 = g->ln2_mean + l * BT, *r2 = g->ln2_rstd + l * BT;
        float *fch = g->fch + l * BT * 4 * C, *fchg = g->fch_gelu + l * BT * 4 * C;

        /* g->dres holds dL/d(res3); it is also dL/d(res2) through the skip */
        DL_TRY(dl_cuda_memset0(g->dfch, BT * 4 * C * sizeof(float)));
        DL_TRY(dl_cuda_matmul_bwd(g->dfch, dw.fcpw, dw.fcpb, g->dres, fchg, w.fcpw, (int)BT, 4 * C, C));
        /* fch_gelu is dead after that matmul: it receives d(fch) */
        float *dpre = fchg;
        DL_TRY(dl_cuda_memset0(dpre, BT * 4 * C * sizeof(float)));
        DL_TRY(dl_cuda_gelu_bwd(dpre, fch, g->dfch, BT * 4 * C));
        DL_TRY(dl_cuda_memset0(g->dbuf, BT * C * sizeof(float)));
        DL_TRY(dl_cuda_matmul_bwd(g->dbuf, dw.fcw, dw.fcb, dpre, ln2, w.fcw, (int)BT, C, 4 * C));
        DL_TRY(dl_cuda_layernorm_bwd(g->dres, dw.ln2w, dw.ln2b, g->dbuf, res2, w.ln2w, m2, r2, (int)BT, C));
        /* g->dres now dL/d(res2); attention branch */
        DL_TRY(dl_cuda_memset0(g->dbuf, BT * C * sizeof(float)));
        DL_TRY(dl_cuda_matmul_bwd(g->dbuf, dw.projw, dw.projb, g->dres, atty, w.projw, (int)BT, C, C));
        DL_TRY(dl_cuda_memset0(g->dqkv, BT * 3 * C * sizeof(float)));
        DL_TRY(dl_cuda_attention_bwd(g->dqkv, g->datt, g->dbuf, qkv, att, B, T, C, NH));
        DL_TRY(dl_cuda_memset0(g->dbuf2, BT * C * sizeof(float)));
        DL_TRY(dl_cuda_matmul_bwd(g->dbuf2, dw.qkvw, dw.qkvb, g->dqkv, ln1, w.qkvw, (int)BT, C, 3 * C));
        DL_TRY(dl_cuda_layernorm_bwd(g->dres, dw.ln1w, dw.ln1b, g->dbuf2, x, w.ln1w, m1, r1, (int)BT, C));
    }
    DL_TRY(dl_cuda_encoder_bwd(dwte, dwpe, g->dres, g->inp, B, T, C, V));
    return 0;
}

/* Both AdamW variants over the decay runs of gpt/gpt.c; ga NULL: plain. */
static int adamw_runs(dl_gptc *g, const dl_adamw_cfg *c, float lr, int64_t t, double norm, const float *ga,
                      float *w, float fleet)
{
    if (!isfinite(norm)) return dl_err(DL_ERANGE, "gradient norm is %g: step skipped", norm);
    dl_adamw_hp hp = dl_gpt_adamw_hp(c, lr, t, norm);
    size_t off, n;
    int decay;
    for (int i = 0; i < g->ntensors;) {
        i = dl_gpt_decay_run(g->tensors, g->ntensors, i, &off, &n, &decay);
        hp.weight_decay = decay ? c->weight_decay : 0.0f;
        if (ga)
            DL_TRY(dl_cuda_adamw_split(g->params + off, ga + off, g->grads + off, g->m + off, g->v + off, w + off, n,
                                       &hp, fleet));
        else
            DL_TRY(dl_cuda_adamw(g->params + off, g->grads + off, g->m + off, g->v + off, n, &hp));
    }
    return 0;
}

int dl_gptc_adamw_step(dl_gptc *g, const dl_adamw_cfg *c, float lr, int64_t t, float *norm_out)
{
    assert(c && t >= 1);
    double ss = 0.0;
    DL_TRY(dl_cuda_sumsq(g->grads, g->nparams, &ss)); /* synchronizes */
    double norm = sqrt(ss);
    if (norm_out) *norm_out = (float)norm;
    return adamw_runs(g, c, lr, t, norm, NULL, NULL, 0.0f);
}

int dl_gptc_adamw_split_step(dl_gptc *g, const dl_adamw_cfg *c, float lr, int64_t t, const float *ga, float *w,
                             float fleet, float *norm_out)
{
    assert(c && t >= 1 && ga && w && fleet >= 1.0f);
    double ss = 0.0;
    DL_TRY(dl_cuda_sumsq_mean2(ga, g->grads, g->nparams, &ss)); /* synchronizes */
    double norm = sqrt(ss);
    if (norm_out) *norm_out = (float)norm;
    return adamw_runs(g, c, lr, t, norm, ga, w, fleet);
}
