/* The GPT-2 training model over one contiguous fp32 parameter buffer laid out
 * by core/model.h's tensor table: forward/backward on the CPU kernels, and the
 * AdamW inner optimizer over the same contiguous views. */
#ifndef DL_LEARNER_GPT_H
#define DL_LEARNER_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"  /* dl_model_config, the tensor table and init */
#include "core/tensor.h"
#include "kernels/cpu.h" /* dl_adamw_hp */

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
 * B x cfg->seq_len. Params are zero until dl_gpt_init or a load. Errors: the
 * config's (core/model.h), DL_EINVAL (B), DL_ENOMEM (model state or
 * activations too large; the message says which and how many bytes); *out
 * is NULL on error. */
int dl_gpt_open(const dl_model_config *cfg, int B, dl_gpt **out);
/* The bytes dl_gpt_open(cfg, B) allocates (model state and activations), for
 * a memory check before it; 0 for a config dl_model_config_check refuses. */
size_t dl_gpt_open_bytes(const dl_model_config *cfg, int B);
void dl_gpt_close(dl_gpt **g); /* safe on NULL and twice */

/* dl_model_init_params (core/model.h) into the model's params. */
void dl_gpt_init(dl_gpt *g, uint64_t seed);

const dl_model_config *dl_gpt_cfg(const dl_gpt *g);
size_t dl_gpt_num_params(const dl_gpt *g);
/* Compute precision of the linear layers (QKV, attention projection, MLP, LM head), forward and backward:
 * DL_GPT_PREC_FP32 (the default, set by dl_gpt_open) or DL_GPT_PREC_BF16, where each of their GEMMs takes
 * its two inputs rounded to bf16 (nearest even) and sums in fp32, as tensor cores do (kernels/cpu.h
 * dl_cpu_matmul_fwd_bf16). Parameters, gradients, AdamW state and every other op stay fp32
 * (docs/HETEROGENEOUS.md "bf16 learner"). */
enum { DL_GPT_PREC_FP32 = 0, DL_GPT_PREC_BF16 = 1 };
void dl_gpt_set_precision(dl_gpt *g, int prec);
int dl_gpt_precision(const dl_gpt *g);
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

#endif
