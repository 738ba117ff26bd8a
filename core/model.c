/* The model's description: config bounds, tensor table, seeded init, fragment
 * plan, fingerprint and FLOPs of a GPT-2 config, without any training code. */
#include "core/model.h"

#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dl_model_config_check(dl_model_config *c)
{
    if (c->n_layer < DL_MODEL_LAYER_MIN || c->n_layer > DL_MODEL_LAYER_MAX)
        return dl_err(DL_EINVAL, "n_layer %d not in [%d, %d]", c->n_layer, DL_MODEL_LAYER_MIN, DL_MODEL_LAYER_MAX);
    if (c->n_embd < DL_MODEL_EMBD_MIN || c->n_embd > DL_MODEL_EMBD_MAX)
        return dl_err(DL_EINVAL, "n_embd %d not in [%d, %d]", c->n_embd, DL_MODEL_EMBD_MIN, DL_MODEL_EMBD_MAX);
    if (c->n_head < DL_MODEL_HEAD_MIN || c->n_head > DL_MODEL_HEAD_MAX)
        return dl_err(DL_EINVAL, "n_head %d not in [%d, %d]", c->n_head, DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX);
    if (c->n_embd % c->n_head)
        return dl_err(DL_EINVAL, "n_embd %d is not a multiple of n_head %d", c->n_embd, c->n_head);
    if (c->seq_len < DL_MODEL_SEQ_MIN || c->seq_len > DL_MODEL_SEQ_MAX)
        return dl_err(DL_EINVAL, "seq_len %d not in [%d, %d]", c->seq_len, DL_MODEL_SEQ_MIN, DL_MODEL_SEQ_MAX);
    if (c->vocab < DL_MODEL_VOCAB_MIN || c->vocab > DL_MODEL_VOCAB_MAX)
        return dl_err(DL_EINVAL, "vocab %d not in [%d, %d]", c->vocab, DL_MODEL_VOCAB_MIN, DL_MODEL_VOCAB_MAX);
    c->padded_vocab = (c->vocab + 63) / 64 * 64;
    return 0;
}

/* The same wording as core/config.c's bounds error, so a value refused here
 * reads like one the table refused. */
static int in_range(const char *name, int64_t v, int64_t lo, int64_t hi)
{
    if (v < lo || v > hi)
        return dl_err(DL_ERANGE, "option %s: %lld out of range [%lld, %lld]", name, (long long)v, (long long)lo,
                      (long long)hi);
    return 0;
}

int dl_model_config_from(const dl_model_opts *o, dl_model_config *out)
{
    memset(out, 0, sizeof *out);
    DL_TRY(in_range("n_layer", o->n_layer, DL_MODEL_LAYER_MIN, DL_MODEL_LAYER_MAX));
    DL_TRY(in_range("n_head", o->n_head, DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX));
    DL_TRY(in_range("n_embd", o->n_embd, DL_MODEL_EMBD_MIN, DL_MODEL_EMBD_MAX));
    DL_TRY(in_range("seq_len", o->seq_len, DL_MODEL_SEQ_MIN, DL_MODEL_SEQ_MAX));
    DL_TRY(in_range("vocab", o->vocab, DL_MODEL_VOCAB_MIN, DL_MODEL_VOCAB_MAX));
    DL_TRY(in_range("fragments", o->fragments, DL_MODEL_FRAGMENTS_MIN, DL_MODEL_FRAGMENTS_MAX));
    *out = (dl_model_config){.n_layer = (int)o->n_layer, .n_head = (int)o->n_head, .n_embd = (int)o->n_embd,
                             .seq_len = (int)o->seq_len, .vocab = (int)o->vocab};
    return dl_model_config_check(out);
}

int dl_model_tensor_table(const dl_model_config *cfg, dl_tensor *out, int cap, size_t *numel)
{
    int L = cfg->n_layer, C = cfg->n_embd, Vp = cfg->padded_vocab, T = cfg->seq_len;
    int n = 0;
    size_t off = 0;
#define ADD(nm, kd, d0, d1)                                                                                       \
    do {                                                                                                          \
        if (n < cap) {                                                                                            \
            dl_tensor *e = &out[n];                                                                               \
            memset(e, 0, sizeof *e);                                                                              \
            snprintf(e->name, sizeof e->name, "%s", nm);                                                          \
            e->offset = off;                                                                                      \
            e->ndim = (d1) != 0 ? 2 : 1;                                                                          \
            e->shape[0] = (d0);                                                                                   \
            e->shape[1] = (d1);                                                                                   \
            e->numel = (size_t)(d0) * ((d1) != 0 ? (size_t)(d1) : 1);                                            \
            e->kind = (kd);                                                                                       \
        }                                                                                                         \
        off += (size_t)(d0) * ((d1) != 0 ? (size_t)(d1) : 1);                                                         \
        n++;                                                                                                      \
    } while (0)
    char nm[48];
    ADD("wte", DL_TENSOR_EMBED, Vp, C);
    ADD("wpe", DL_TENSOR_EMBED, T, C);
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "h.%d.ln_1.weight", l); ADD(nm, DL_TENSOR_VECTOR, C, 0);
        snprintf(nm, sizeof nm, "h.%d.ln_1.bias", l); ADD(nm, DL_TENSOR_VECTOR, C, 0);
        snprintf(nm, sizeof nm, "h.%d.attn.c_attn.weight", l); ADD(nm, DL_TENSOR_MATRIX, 3 * C, C);
        snprintf(nm, sizeof nm, "h.%d.attn.c_attn.bias", l); ADD(nm, DL_TENSOR_VECTOR, 3 * C, 0);
        snprintf(nm, sizeof nm, "h.%d.attn.c_proj.weight", l); ADD(nm, DL_TENSOR_MATRIX, C, C);
        snprintf(nm, sizeof nm, "h.%d.attn.c_proj.bias", l); ADD(nm, DL_TENSOR_VECTOR, C, 0);
        snprintf(nm, sizeof nm, "h.%d.ln_2.weight", l); ADD(nm, DL_TENSOR_VECTOR, C, 0);
        snprintf(nm, sizeof nm, "h.%d.ln_2.bias", l); ADD(nm, DL_TENSOR_VECTOR, C, 0);
        snprintf(nm, sizeof nm, "h.%d.mlp.c_fc.weight", l); ADD(nm, DL_TENSOR_MATRIX, 4 * C, C);
        snprintf(nm, sizeof nm, "h.%d.mlp.c_fc.bias", l); ADD(nm, DL_TENSOR_VECTOR, 4 * C, 0);
        snprintf(nm, sizeof nm, "h.%d.mlp.c_proj.weight", l); ADD(nm, DL_TENSOR_MATRIX, C, 4 * C);
        snprintf(nm, sizeof nm, "h.%d.mlp.c_proj.bias", l); ADD(nm, DL_TENSOR_VECTOR, C, 0);
    }
    ADD("ln_f.weight", DL_TENSOR_VECTOR, C, 0);
    ADD("ln_f.bias", DL_TENSOR_VECTOR, C, 0);
#undef ADD
    if (numel) *numel = off;
    return n;
}

/* The table holds wte, wpe, then each block's 12 tensors in the order of the ADD lines above (the fields of
 * dl_model_block), then ln_f. */
dl_model_block dl_model_block_of(const dl_tensor *tensors, float *base, int l)
{
    const dl_tensor *t = tensors + 2 + 12 * (size_t)l;
    return (dl_model_block){base + t[0].offset, base + t[1].offset, base + t[2].offset,  base + t[3].offset,
                            base + t[4].offset, base + t[5].offset, base + t[6].offset,  base + t[7].offset,
                            base + t[8].offset, base + t[9].offset, base + t[10].offset, base + t[11].offset};
}

int dl_model_shape(const dl_model_config *in, int B, dl_model_config *cfg, dl_tensor **tensors, int *ntensors,
                   size_t *nparams)
{
    *cfg = *in;
    DL_TRY(dl_model_config_check(cfg));
    if (B < 1 || B > 65536) return dl_err(DL_EINVAL, "batch size %d not in [1, 65536]", B);
    *ntensors = dl_model_tensor_table(cfg, NULL, 0, nparams);
    *tensors = dl_xcalloc((size_t)*ntensors, sizeof(dl_tensor));
    dl_model_tensor_table(cfg, *tensors, *ntensors, NULL);
    return 0;
}

int dl_model_init_params(const dl_model_config *cfg_in, uint64_t seed, float *params)
{
    dl_model_config cfg = *cfg_in;
    DL_TRY(dl_model_config_check(&cfg));
    int nt = dl_model_tensor_table(&cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_try_calloc((size_t)nt, sizeof *tab);
    if (!tab) return dl_err(DL_ENOMEM, "model init: out of memory for %d tensors", nt);
    dl_model_tensor_table(&cfg, tab, nt, NULL);
    dl_rng r;
    dl_rng_seed(&r, seed);
    float resid_std = 0.02f / sqrtf(2.0f * (float)cfg.n_layer);
    for (int i = 0; i < nt; i++) {
        const dl_tensor *t = &tab[i];
        float *p = params + t->offset;
        const char *nm = t->name;
        size_t len = strlen(nm);
        if (t->kind == DL_TENSOR_VECTOR) {
            /* biases 0, layernorm weights 1 */
            float val = (len > 7 && !strcmp(nm + len - 7, ".weight")) ? 1.0f : 0.0f;
            for (size_t j = 0; j < t->numel; j++) p[j] = val;
            continue;
        }
        float std = strstr(nm, "c_proj.weight") ? resid_std : 0.02f;
        size_t n = t->numel;
        if (!strcmp(nm, "wte")) n = (size_t)cfg.vocab * cfg.n_embd; /* padded rows stay 0 */
        for (size_t j = 0; j < n; j++) p[j] = std * dl_rng_normal(&r);
        for (size_t j = n; j < t->numel; j++) p[j] = 0.0f;
    }
    free(tab);
    return 0;
}

int dl_model_plan_open(const dl_model_config *cfg_in, int P, dl_plan **out)
{
    *out = NULL;
    dl_model_config cfg = *cfg_in;
    DL_TRY(dl_model_config_check(&cfg));
    int nt = dl_model_tensor_table(&cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_try_calloc((size_t)nt, sizeof *tab);
    if (!tab) return dl_err(DL_ENOMEM, "plan: a table of %d tensors: out of memory", nt);
    dl_model_tensor_table(&cfg, tab, nt, NULL);
    int rc = dl_plan_build(tab, nt, P, out);
    free(tab);
    return rc;
}

uint64_t dl_model_fingerprint(const dl_model_config *cfg, const dl_plan *plan)
{
    unsigned char b[24];
    int32_t v[6] = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len, cfg->vocab, cfg->padded_vocab};
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 4; k++) b[i * 4 + k] = (unsigned char)((uint32_t)v[i] >> (8 * k));
    return dl_plan_fingerprint(plan, b, sizeof b);
}

double dl_model_flops_per_token(const dl_model_config *cfg, int T)
{
    double L = cfg->n_layer, C = cfg->n_embd, Vp = cfg->padded_vocab;
    double matmul_params = L * 12.0 * C * C + Vp * C; /* qkv 3CC + proj CC + fc 4CC + fcproj 4CC, lm head */
    double attn = L * 2.0 * 2.0 * T * C;              /* qk^T and av, per token, full (non-causal) count */
    return 3.0 * (2.0 * matmul_params + attn);        /* forward + 2x for backward */
}

