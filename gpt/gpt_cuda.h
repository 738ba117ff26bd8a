/* The GPT-2 model of gpt/gpt.h resident on a CUDA device: parameters,
 * gradients, AdamW moments and activations in device memory, same math on the kernels/cuda twins. */
#ifndef DL_LEARNER_GPT_CUDA_H
#define DL_LEARNER_GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "gpt/gpt.h"

/* Same layout and numerics as dl_gpt (gpt/gpt.c): the tensor table of
 * dl_model_tensor_table, params/grads/m/v as four views of ONE cudaMalloc,
 * activations (including the [L,B,NH,T,T] attention probabilities, as the
 * CPU keeps them) as one more. Forward/backward/AdamW run on the current
 * device's default stream; host pointers are only the token arrays and the
 * buffers of the copy functions.
 *
 * Errors: every call returns 0 or a negative DL_E* code (DL_ENODEV without
 * a device, DL_ECUDA for CUDA/cuBLAS failures including a device allocation
 * that does not fit, DL_EINVAL for bad input) with dl_errmsg() saying why.
 * After a DL_ECUDA the model state is undefined: close it. */
typedef struct dl_gptc dl_gptc;

/* Allocate for batches up to B x cfg->seq_len; params zero until init/set. */
int dl_gptc_open(const dl_model_config *cfg, int B, dl_gptc **out);
void dl_gptc_close(dl_gptc **g); /* safe on NULL and twice */

/* dl_model_init_params on the host, then uploaded (identical to dl_gpt_init). */
int dl_gptc_init(dl_gptc *g, uint64_t seed);

const dl_model_config *dl_gptc_cfg(const dl_gptc *g);
size_t dl_gptc_num_params(const dl_gptc *g);
const dl_tensor *dl_gptc_tensors(const dl_gptc *g, int *n);
/* Bytes of device memory held (state + activations). */
size_t dl_gptc_device_bytes(const dl_gptc *g);
/* Device views of nparams floats each (the push/adopt copies of gpt/xfer_cuda.c). */
float *dl_gptc_params_dev(dl_gptc *g);
float *dl_gptc_grads_dev(dl_gptc *g);
float *dl_gptc_adam_m_dev(dl_gptc *g);
float *dl_gptc_adam_v_dev(dl_gptc *g);

/* Whole-buffer copies, host buffers of dl_gptc_num_params floats. */
int dl_gptc_set_params(dl_gptc *g, const float *host);
int dl_gptc_get_params(dl_gptc *g, float *host);
int dl_gptc_get_grads(dl_gptc *g, float *host);
/* Parameters and AdamW moments to / from three host buffers of
 * dl_gptc_num_params floats each (checkpoints: the same arrays as dl_gpt's). */
int dl_gptc_get_state(dl_gptc *g, float *params, float *m, float *v);
int dl_gptc_set_state(dl_gptc *g, const float *params, const float *m, const float *v);
/* m = v = 0 (a fresh AdamW state). */
int dl_gptc_reset_optimizer(dl_gptc *g);
/* Logits [B,T,Vp] of the last forward into host (B*T*Vp floats). */
int dl_gptc_get_logits(dl_gptc *g, float *host);

/* Fragment p of `plan` (built from this model's tensor table, e.g. by
 * dl_model_plan_open): gather copies its blocks (whole tensors or row blocks
 * of split ones) out of the device parameters into host `out`
 * (dl_plan_fragment_numel floats, fragment payload order as dl_plan_gather);
 * scatter writes host `in` back into those blocks only. */
struct dl_plan;
int dl_gptc_gather(dl_gptc *g, const struct dl_plan *plan, int p, float *out);
int dl_gptc_scatter(dl_gptc *g, const struct dl_plan *plan, int p, const float *in);

/* Forward on host inp[B,T] (and targets, or NULL). Token ids are checked
 * against the vocabulary (DL_EINVAL). With targets *loss = mean
 * cross-entropy, else 0. 1 <= B <= max B, 1 <= T <= seq_len (asserted). */
int dl_gptc_forward(dl_gptc *g, const int32_t *inp, const int32_t *targets, int B, int T, double *loss);
int dl_gptc_zero_grad(dl_gptc *g);
/* Backward of the last forward (which must have had targets); grads += .
 * Like the CPU model it overwrites forward activations: one backward per forward. */
int dl_gptc_backward(dl_gptc *g);
/* AdamW at 1-based step t with global-norm clipping as dl_gpt_adamw_step
 * (torch rule coef = clip/(norm+1e-6)); *norm (may be NULL) = norm before clipping. */
int dl_gptc_adamw_step(dl_gptc *g, const dl_adamw_cfg *c, float lr, int64_t t, float *norm);

/* The split-batch step (dl_gpt_adamw_split_step on the device): ga and w
 * are device buffers of num_params floats (first half's gradient, noise
 * moment), the model's grads hold the second half's. */
int dl_gptc_adamw_split_step(dl_gptc *g, const dl_adamw_cfg *c, float lr, int64_t t, const float *ga, float *w,
                             float fleet, float *norm);

#endif
