/* CUDA twins of the optimizer and outer-loop primitives of kernels/cpu.c:
 * AdamW (plain and split-batch), sums of squares (double), pseudo-gradient, axpby. Grid-stride, fp32 in memory. */
#include "kernels/cuda/internal.h"

#include <cassert>
#include <cmath>

/* ---- AdamW */

/* Same operation order as dl_cpu_adamw; c1, c2 = 1/(1-beta^t) come from the
 * host so both backends use the same powf() result. */
static __global__ void dl_adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                                       float b1, float b2, float eps, float wd, float gs, float c1, float c2)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = grad[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * c1, vhat = vi * c2;
        float p = param[i];
        param[i] = p - lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    }
}

extern "C" int dl_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, const dl_adamw_hp *hp)
{
    assert(hp && hp->t >= 1);
    if (!n) return 0;
    assert(param && grad && m && v);
    float c1 = 1.0f / (1.0f - powf(hp->beta1, (float)hp->t));
    float c2 = 1.0f / (1.0f - powf(hp->beta2, (float)hp->t));
    dl_adamw_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(param, grad, m, v, n, hp->lr, hp->beta1, hp->beta2, hp->eps,
                                                        hp->weight_decay, hp->grad_scale, c1, c2);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- AdamW with the split-batch second moment (dl_cpu_adamw_split) */

static __global__ void dl_adamw_split_kernel(float *param, const float *ga, const float *gb, float *m, float *v,
                                             float *w, size_t n, float lr, float b1, float b2, float eps, float wd,
                                             float gs, float c1, float c2, float q)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float a = ga[i] * gs, b = gb[i] * gs, d = a - b;
        float g = 0.5f * (a + b);
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * a * b;
        float wi = b2 * w[i] + (1.0f - b2) * d * d * q;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
        float mhat = mi * c1, vhat = (fmaxf(vi, 0.0f) + wi) * c2;
        float p = param[i];
        param[i] = p - lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    }
}

extern "C" int dl_cuda_adamw_split(float *param, const float *ga, const float *gb, float *m, float *v, float *w,
                                   size_t n, const dl_adamw_hp *hp, float fleet)
{
    assert(hp && hp->t >= 1 && fleet >= 1.0f);
    if (!n) return 0;
    assert(param && ga && gb && m && v && w);
    float c1 = 1.0f / (1.0f - powf(hp->beta1, (float)hp->t));
    float c2 = 1.0f / (1.0f - powf(hp->beta2, (float)hp->t));
    float q = 1.0f / (4.0f * fleet);
    dl_adamw_split_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(param, ga, gb, m, v, w, n, hp->lr, hp->beta1,
                                                              hp->beta2, hp->eps, hp->weight_decay, hp->grad_scale,
                                                              c1, c2, q);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- sum of squares */

__device__ static double dl_warp_sum(double s)
{
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    return s;
}

/* Sum over the block; the result is valid in thread 0. blockDim.x is a
 * multiple of 32 and at most 1024. */
__device__ static double dl_block_sum(double s)
{
    __shared__ double warp_part[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    s = dl_warp_sum(s);
    if (lane == 0) warp_part[wid] = s;
    __syncthreads();
    s = (threadIdx.x < (blockDim.x >> 5)) ? warp_part[lane] : 0.0;
    if (wid == 0) s = dl_warp_sum(s);
    return s;
}

/* Pass 1: partial[b] = sum over the elements block b visits. */
static __global__ void dl_sumsq_partial_kernel(const float *x, size_t n, double *partial)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double xi = (double)x[i];
        s += xi * xi;
    }
    s = dl_block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* Pass 1 of the sum of squares of (a + b) / 2, in double as the CPU. */
static __global__ void dl_sumsq_mean2_partial_kernel(const float *a, const float *b, size_t n, double *partial)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double x = 0.5 * ((double)a[i] + (double)b[i]);
        s += x * x;
    }
    s = dl_block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* Pass 2 (one block): *out = sum of nb partials. */
static __global__ void dl_sumsq_final_kernel(const double *partial, int nb, double *out)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += partial[i];
    s = dl_block_sum(s);
    if (threadIdx.x == 0) *out = s;
}

extern "C" int dl_cuda_sumsq(const float *x, size_t n, double *out)
{
    assert(out);
    *out = 0.0;
    if (!n) return 0;
    assert(x);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    size_t want = (n + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK;
    int nb = (int)(want < DL_CUDA_SUMSQ_BLOCKS ? want : DL_CUDA_SUMSQ_BLOCKS);
    dl_sumsq_partial_kernel<<<nb, DL_CUDA_BLOCK>>>(x, n, ctx->scratch);
    DL_CUDA_CHECK_LAUNCH();
    dl_sumsq_final_kernel<<<1, DL_CUDA_BLOCK>>>(ctx->scratch, nb, ctx->scratch + DL_CUDA_SUMSQ_BLOCKS);
    DL_CUDA_CHECK_LAUNCH();
    DL_CUDA_CHECK(cudaMemcpy(out, ctx->scratch + DL_CUDA_SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int dl_cuda_sumsq_mean2(const float *a, const float *b, size_t n, double *out)
{
    assert(out);
    *out = 0.0;
    if (!n) return 0;
    assert(a && b);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    size_t want = (n + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK;
    int nb = (int)(want < DL_CUDA_SUMSQ_BLOCKS ? want : DL_CUDA_SUMSQ_BLOCKS);
    dl_sumsq_mean2_partial_kernel<<<nb, DL_CUDA_BLOCK>>>(a, b, n, ctx->scratch);
    DL_CUDA_CHECK_LAUNCH();
    dl_sumsq_final_kernel<<<1, DL_CUDA_BLOCK>>>(ctx->scratch, nb, ctx->scratch + DL_CUDA_SUMSQ_BLOCKS);
    DL_CUDA_CHECK_LAUNCH();
    DL_CUDA_CHECK(cudaMemcpy(out, ctx->scratch + DL_CUDA_SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost));
    return 0;
}

/* ---- pseudo-gradient */

static __global__ void dl_pseudograd_kernel(float *delta, const float *base, const float *theta, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) delta[i] = base[i] - theta[i];
}

extern "C" int dl_cuda_pseudograd(float *delta, const float *base, const float *theta, size_t n)
{
    if (!n) return 0;
    assert(delta && base && theta);
    dl_pseudograd_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(delta, base, theta, n);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---- axpby (adopting a global fragment into the device parameters) */

/* Explicit intrinsics: nvcc must not contract or reassociate differently
 * from the CPU twin, which computes the same fmaf(a, y, b*x). */
static __global__ void dl_axpby_kernel(float *y, float a, const float *x, float b, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __fmaf_rn(a, y[i], __fmul_rn(b, x[i]));
}

static __global__ void dl_scale_copy_kernel(float *y, const float *x, float b, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = __fmul_rn(b, x[i]);
}

extern "C" int dl_cuda_axpby(float *y, float a, const float *x, float b, size_t n)
{
    if (!n) return 0;
    assert(y && x);
    if (a == 0.0f) dl_scale_copy_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(y, x, b, n);
    else dl_axpby_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(y, a, x, b, n);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}
