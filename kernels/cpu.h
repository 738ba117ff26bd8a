/* CPU reference kernels: every numeric op of a GPT-2 training step and of the
 * DiLoCo outer loop. OpenBLAS sgemm for matmuls, OpenMP + SIMD elsewhere.
 * Shapes are row-major; B batch, T time, C channels, NH heads, V vocab,
 * N = B*T rows. Backward functions ACCUMULATE (+=) into their outputs. */
#ifndef DL_KERNELS_CPU_H
#define DL_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

/* ---- embedding: out[B,T,C] = wte[inp[b,t]] + wpe[t] */
void dl_cpu_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T, int C);
void dl_cpu_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C);

/* ---- layernorm over C, eps 1e-5; mean/rstd [N] saved for backward */
void dl_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                          int N, int C);
void dl_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                          const float *mean, const float *rstd, int N, int C);

/* ---- linear: out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be NULL) */
void dl_cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);
/* dinp += dout @ w; dw += dout^T @ inp; dbias += colsum(dout) (dbias may be NULL) */
void dl_cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                       int N, int IC, int OC);

/* ---- the same linear with bf16 GEMM inputs (docs/HETEROGENEOUS.md "bf16 learner"), as tensor cores
 * compute: each sgemm's two input operands (inp and w forward; dout and w for dinp, dout and inp for dw)
 * are rounded to bf16 (round to nearest even, dl_cpu_round_bf16) into scratch copies, products summed in
 * fp32, outputs (out, dinp, dw) and the bias / dbias fp32 as in the fp32 functions. The inputs
 * themselves are not modified. Scratch is malloc'd per call (aborts on out of memory, as dl_xmalloc). */
void dl_cpu_matmul_fwd_bf16(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);
void dl_cpu_matmul_bwd_bf16(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int IC, int OC);
/* dst[i] = src[i] rounded to the nearest bf16 (ties to even; NaN stays NaN, inf stays inf), as an fp32. */
void dl_cpu_round_bf16(float *dst, const float *src, size_t n);

/* ---- causal self-attention. qkv[B,T,3C] (q|k|v, heads of C/NH inside each);
 * att[B,NH,T,T] softmax probabilities (zero above the diagonal), out[B,T,C]. */
void dl_cpu_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv += ...; scratch needs B*NH*T*T floats (overwritten) */
void dl_cpu_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B,
                          int T, int C, int NH);

/* ---- GELU, tanh approximation (as GPT-2) */
void dl_cpu_gelu_fwd(float *out, const float *inp, size_t n);
/* the vectorisable tanh the GELU kernels use (exposed for its accuracy test) */
float dl_cpu_tanh(float x);
void dl_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n); /* dinp += */

/* ---- out = a + b */
void dl_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n);

/* ---- softmax over V + cross-entropy against targets. probs[N,V], losses[N].
 * Returns the mean loss (double accumulation). */
double dl_cpu_softmax_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *targets, int N,
                               int V);
/* dlogits = (probs - onehot(target)) * dloss (overwrites, not +=) */
void dl_cpu_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int N, int V, float dloss);

/* ---- optimizer and outer-loop primitives over contiguous buffers */
typedef struct {
    float lr;           /* learning rate of this step */
    float beta1, beta2; /* moment decay */
    float eps;
    float weight_decay; /* decoupled, applied as p -= lr*wd*p */
    float grad_scale;   /* multiply grads by this first (global-norm clipping) */
    int64_t t;          /* 1-based step count, for bias correction */
} dl_adamw_hp;
void dl_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, const dl_adamw_hp *hp);
/* AdamW whose second moment estimates that of a `fleet`-times larger batch,
 * from the gradients ga, gb of the two halves of this step's batch (both
 * scaled by hp->grad_scale). With per-sample gradient mean mu and variance
 * s^2 and B samples per step: E[ga*gb] = mu^2 (the halves' noise is
 * independent) and E[(ga-gb)^2] = 4 s^2 / B, so
 *     v = EMA(ga*gb)   w = EMA((ga-gb)^2 / (4 fleet))
 * and max(v, 0) + w estimates mu^2 + s^2 / (fleet B), the second moment an
 * optimizer stepping on a fleet*B batch would see. The first moment and the
 * update use g = (ga + gb) / 2, the whole batch's gradient. Why: M learners
 * whose updates are averaged (local SGD) each normalise by their own noisy
 * v ~ mu^2 + s^2/B, which shrinks the averaged step in low-signal
 * coordinates up to sqrt(M) times below a data-parallel optimizer's.
 * fleet >= 1; with ga == gb this is exactly dl_cpu_adamw plus w = 0. */
void dl_cpu_adamw_split(float *param, const float *ga, const float *gb, float *m, float *v, float *w, size_t n,
                        const dl_adamw_hp *hp, float fleet);
/* sum of squares, double accumulation */
double dl_cpu_sumsq(const float *x, size_t n);
/* delta = base - theta (the DiLoCo pseudo-gradient) */
void dl_cpu_pseudograd(float *delta, const float *base, const float *theta, size_t n);
/* y = a*y + b*x, computed as fmaf(a, y, b*x) so every backend rounds the same
 * way (the CUDA twin is bit-identical); a == 0 writes y = b*x without reading
 * y (as BLAS does for beta = 0: a NaN in y does not survive). */
void dl_cpu_axpby(float *y, float a, const float *x, float b, size_t n);

#endif
