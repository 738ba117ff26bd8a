/* CUDA twin of the CPU softmax + cross-entropy: one block per row, per-row
 * losses on the device, the mean reduced in double by one block (deterministic). */
#include "kernels/cuda/internal.h"

#include <cassert>

/* Row n of logits/probs starts at n*ld; softmax over the first V columns. */
static __global__ void dl_xent_fwd_kernel(float *probs, float *losses, const float *logits, const int32_t *targets,
                                          int V, int ld)
{
    __shared__ float buf[32];
    size_t n = blockIdx.x;
    const float *l = logits + n * ld;
    float *p = probs + n * ld;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
    mx = dl_block_max_f(mx, buf);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(l[i] - mx);
        p[i] = e;
        s += e;
    }
    s = dl_block_sum_f(s, buf);
    float inv = 1.0f / s;
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] *= inv;
    /* loss from log-sum-exp, not log(p): exact even when p underflows */
    if (threadIdx.x == 0) losses[n] = logf(s) + mx - l[targets[n]];
}

/* One block: *out = sum of losses[0..N) in double. */
static __global__ void dl_xent_mean_kernel(const float *losses, int N, double *out)
{
    __shared__ double buf[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s += (double)losses[i];
    s = dl_block_sum_d(s, buf);
    if (threadIdx.x == 0) *out = s;
}

extern "C" int dl_cuda_softmax_xent_fwd_ld(float *probs, float *losses, const float *logits, const int32_t *targets,
                                           int N, int V, int ld, double *mean_loss)
{
    assert(probs && losses && logits && targets && mean_loss && N > 0 && V > 0 && ld >= V);
    *mean_loss = 0.0;
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    dl_xent_fwd_kernel<<<(unsigned)N, DL_CUDA_BLOCK>>>(probs, losses, logits, targets, V, ld);
    DL_CUDA_CHECK_LAUNCH();
    double *dsum = ctx->scratch + DL_CUDA_SUMSQ_BLOCKS;
    dl_xent_mean_kernel<<<1, 1024>>>(losses, N, dsum);
    DL_CUDA_CHECK_LAUNCH();
    double total = 0.0;
    DL_CUDA_CHECK(cudaMemcpy(&total, dsum, sizeof total, cudaMemcpyDeviceToHost));
    *mean_loss = total / N;
    return 0;
}

extern "C" int dl_cuda_softmax_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *targets,
                                        int N, int V, double *mean_loss)
{
    return dl_cuda_softmax_xent_fwd_ld(probs, losses, logits, targets, N, V, V, mean_loss);
}

/* dlogits = (probs - onehot) * dloss over the first V columns; columns
 * V..ld-1 (vocab padding) are set to 0. Rounded as the CPU: p*dloss first,
 * then - dloss at the target (no fused multiply-add). */
static __global__ void dl_xent_bwd_kernel(float *dlogits, const float *probs, const int32_t *targets, size_t total,
                                          int V, int ld, float dloss)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        size_t n = idx / ld;
        int i = (int)(idx % ld);
        float d = 0.0f;
        if (i < V) {
            d = __fmul_rn(probs[idx], dloss);
            if (i == targets[n]) d = __fsub_rn(d, dloss);
        }
        dlogits[idx] = d;
    }
}

extern "C" int dl_cuda_softmax_xent_bwd_ld(float *dlogits, const float *probs, const int32_t *targets, int N, int V,
                                           int ld, float dloss)
{
    assert(dlogits && probs && targets && N > 0 && V > 0 && ld >= V);
    size_t total = (size_t)N * ld;
    dl_xent_bwd_kernel<<<dl_cuda_grid(total), DL_CUDA_BLOCK>>>(dlogits, probs, targets, total, V, ld, dloss);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int dl_cuda_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int N, int V,
                                        float dloss)
{
    return dl_cuda_softmax_xent_bwd_ld(dlogits, probs, targets, N, V, V, dloss);
}
