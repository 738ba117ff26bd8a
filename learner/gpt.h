/* The GPT-2 model over one contiguous fp32 parameter buffer with a tensor
 * table (llm.c-style layout, per-layer tensors), its forward/backward on the
 * CPU kernels, and the AdamW inner optimizer over the same contiguous views. */
#ifndef DL_LEARNER_GPT_H
#define DL_LEARNER_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "kernels/cpu.h" /* dl_adamw_hp */

typedef struct {
    int n_layer;      /* L */
    int n_head;       /* NH; n_embd % n_head == 0 */
    int n_embd;       /* C */
    int seq_len;      /* T, maximum context (wpe rows) */
    int vocab;        /* V, real vocabulary */
    int padded_vocab; /* Vp >= V: wte rows, V rounded up to 64 (set by dl_gpt_config_check) */
} dl_gpt_config;

/* Validate a config and fill padded_vocab. DL_EINVAL with a message otherwise. */
int dl_gpt_config_check(dl_gpt_config *cfg);


/* Tensor table of a config, without allocating a model: fills up to `cap`
 * entries, returns the count (2 + 12*L + 2). Total floats in *numel. */
int dl_gpt_tensor_table(const dl_gpt_config *cfg, dl_tensor *out, int cap, size_t *numel);

/* The activation buffers of one model (CPU dl_gpt and CUDA dl_gptc alike),
 * in allocation order: X(name, floats) with the sizes in terms of L, B*T
 * (BT), C, B*NH*T*T (TT) and Vp, which the expanding function defines.
 * [L,...] arrays index layer-major; the backward scratch serves one layer
 * at a time; logits are reused as dlogits in backward. */
#define DL_GPT_ACTIVATIONS(X)                                                          \
    X(encoded, BT * C)                       /* [B,T,C] */                             \
    X(ln1, L * BT * C) X(ln1_mean, L * BT) X(ln1_rstd, L * BT)                         \
    X(qkv, L * BT * 3 * C)                   /* [L,B,T,3C] */                          \
    X(atty, L * BT * C)                      /* [L,B,T,C] */                           \
    X(att, L * TT)                           /* [L,B,NH,T,T] probabilities */          \
    X(res2, L * BT * C)                      /* residual after attention */            \
    X(ln2, L * BT * C) X(ln2_mean, L * BT) X(ln2_rstd, L * BT)                         \
    X(fch, L * BT * 4 * C) X(fch_gelu, L * BT * 4 * C)                                 \
    X(res3, L * BT * C)                      /* residual after MLP = next layer input */ \
    X(lnf, BT * C) X(lnf_mean, BT) X(lnf_rstd, BT)                                     \
    X(logits, BT * Vp) X(probs, BT * Vp) X(losses, BT)                                 \
    X(dres, BT * C)                          /* gradient down the residual stream */   \
    X(dbuf, BT * C) X(dbuf2, BT * C) X(dqkv, BT * 3 * C) X(dfch, BT * 4 * C) X(datt, TT)

typedef struct dl_gpt dl_gpt;

/* Allocate params, grads, AdamW moments and activations for batches up to
 * B x cfg->seq_len. Params are zero until dl_gpt_init or a load. */
int dl_gpt_open(const dl_gpt_config *cfg, int B, dl_gpt **out);
void dl_gpt_close(dl_gpt **g); /* safe on NULL and twice */

/* GPT-2 init from a seed: weights N(0, 0.02), residual projections
 * N(0, 0.02/sqrt(2L)), biases 0, layernorm weights 1, padded wte rows 0. */
void dl_gpt_init(dl_gpt *g, uint64_t seed);
/* The same initialisation into a bare buffer of dl_gpt_tensor_table's numel
 * floats, without allocating a model (the synchronizer's initial state). */
int dl_gpt_init_params(const dl_gpt_config *cfg, uint64_t seed, float *params);

const dl_gpt_config *dl_gpt_cfg(const dl_gpt *g);
size_t dl_gpt_num_params(const dl_gpt *g);
float *dl_gpt_params(dl_gpt *g);
float *dl_gpt_grads(dl_gpt *g);
float *dl_gpt_adam_m(dl_gpt *g);
float *dl_gpt_adam_v(dl_gpt *g);
const dl_tensor *dl_gpt_tensors(const dl_gpt *g, int *n);

/* Forward on inp[B,T] (token ids < vocab, checked by the caller's loader).
 * With targets, computes the mean cross-entropy and returns it; without
 * (NULL), returns 0 and only logits are valid. 1 <= B <= max B, T <= seq_len. */
double dl_gpt_forward(dl_gpt *g, const int32_t *inp, const int32_t *targets, int B, int T);
const float *dl_gpt_logits(const dl_gpt *g); /* [B,T,Vp] of the last forward */

void dl_gpt_zero_grad(dl_gpt *g);
/* Backward of the last forward (which must have had targets); grads += . */
void dl_gpt_backward(dl_gpt *g);

typedef struct {
    float beta1, beta2, eps;
    float weight_decay; /* applied to matrices and embeddings, not to biases / layernorm */
    float grad_clip;    /* global-norm clip; 0 disables */
} dl_adamw_cfg;

/* One AdamW step with learning rate lr at 1-based step t. Returns the global
 * gradient norm before clipping. */
float dl_gpt_adamw_step(dl_gpt *g, const dl_adamw_cfg *c, float lr, int64_t t);

/* Shared by the CPU and CUDA models: the hyper-parameters of one AdamW step
 * with the global-norm clip (torch's coef = clip/(norm+1e-6), applied when
 * < 1) as grad_scale, weight_decay left 0; and the runs of adjacent tensors
 * with the same decay (matrices and embeddings decay, vectors do not):
 * from table entry i, *off and *len (floats) and *decay of the run, returns
 * the index after it. */
dl_adamw_hp dl_gpt_adamw_hp(const dl_adamw_cfg *c, float lr, int64_t t, double norm);
int dl_gpt_decay_run(const dl_tensor *t, int n, int i, size_t *off, size_t *len, int *decay);

/* The same step with the split-batch second moment of dl_cpu_adamw_split:
 * `ga` holds the gradient of the first half of the batch, the model's grads
 * that of the second half; `w` (dl_gpt_num_params floats, zero at start) is
 * the noise moment, kept by the caller. The gradient is (ga + grads) / 2;
 * returns its global norm before clipping. fleet >= 1. */
float dl_gpt_adamw_split_step(dl_gpt *g, const dl_adamw_cfg *c, float lr, int64_t t, const float *ga, float *w,
                              float fleet);

/* The fragment plan of a model with P fragments (core/plan.h) and the run's
 * model fingerprint: dl_plan_fingerprint over (L, NH, C, T, V, Vp) as
 * little-endian int32 and the plan. Learner and synchronizer both compute it;
 * Hello carries it. */
struct dl_plan;
int dl_gpt_plan_open(const dl_gpt_config *cfg, int P, struct dl_plan **out);
uint64_t dl_gpt_fingerprint(const dl_gpt_config *cfg, const struct dl_plan *plan);

/* FLOPs of one training step (forward + backward) per token: 6*N_matmul +
 * attention, for MFU figures. */
double dl_gpt_flops_per_token(const dl_gpt_config *cfg, int T);

#endif
