/* Private to the .cu files of kernels/cuda: the per-thread CUDA context
 * (cuBLAS handle, reduction scratch) and launch-shape helpers they share. */
#ifndef DL_KERNELS_CUDA_INTERNAL_H
#define DL_KERNELS_CUDA_INTERNAL_H

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cuda_runtime.h>
#include <cublas_v2.h>

extern "C" {
#include "core/err.h"
}
#include "kernels/cuda/cuda.h"

/* Threads per block of the element-wise and reduction kernels. */
#define DL_CUDA_BLOCK 256
/* Blocks of the first sumsq pass: fixed, so the reduction tree (and hence the
 * rounding) depends only on n, never on the GPU model. */
#define DL_CUDA_SUMSQ_BLOCKS 1024

/* Row chunks of the deterministic column reductions (bias gradient,
 * layernorm dw/db): fixed, so the summation order depends only on N. */
#define DL_CUDA_COL_CHUNKS 128

/* One per host thread, created on first use on the then-current device. */
struct dl_cuda_ctx {
    cublasHandle_t blas; /* on the legacy default stream */
    double *scratch;     /* device, DL_CUDA_SUMSQ_BLOCKS + 1 doubles */
    void *work;          /* device workspace of the column reductions, grown on demand */
    size_t work_bytes;
};

/* This thread's context, creating it if needed. 0 or DL_ENODEV/DL_ECUDA. */
int dl_cuda_ctx_get(dl_cuda_ctx **out);

/* ctx->work with at least `bytes` bytes. Growing frees the old buffer
 * (cudaFree waits for queued work, so kernels still reading it are safe).
 * One user at a time: valid until the next call on this thread. */
int dl_cuda_ctx_work(dl_cuda_ctx *ctx, size_t bytes, void **out);

/* Strided-batched fp32 GEMM in cuBLAS's column-major terms (batch 1 = plain
 * GEMM): C_i = alpha op(A_i) op(B_i) + beta C_i with X_i = X + i*strideX.
 * Compute type from dl_cuda_set_matmul (fp32, TF32 or bf16 tensor cores). */
int dl_cuda_gemm(dl_cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const float *A, int lda, long long sA, const float *B, int ldb, long long sB, float beta, float *C,
                 int ldc, long long sC, int batch);

/* ---- warp/block reductions (blockDim.x a multiple of 32, <= 1024) */

/* Butterfly sum/max: every lane gets the result. */
__device__ static inline float dl_warp_sum_f(float s)
{
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}
__device__ static inline float dl_warp_max_f(float s)
{
    for (int off = 16; off > 0; off >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, off));
    return s;
}
__device__ static inline double dl_warp_sum_d(double s)
{
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}

/* Block sum/max returned to every thread. `buf` is __shared__ of 32 entries;
 * the call starts and ends with a barrier so `buf` can be reused at once. */
__device__ static inline float dl_block_sum_f(float s, float *buf)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    s = dl_warp_sum_f(s);
    if (lane == 0) buf[wid] = s;
    __syncthreads();
    s = lane < nw ? buf[lane] : 0.0f;
    s = dl_warp_sum_f(s);
    __syncthreads();
    return s;
}
__device__ static inline float dl_block_max_f(float s, float *buf)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    s = dl_warp_max_f(s);
    if (lane == 0) buf[wid] = s;
    __syncthreads();
    s = lane < nw ? buf[lane] : -INFINITY;
    s = dl_warp_max_f(s);
    __syncthreads();
    return s;
}
__device__ static inline double dl_block_sum_d(double s, double *buf)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    s = dl_warp_sum_d(s);
    if (lane == 0) buf[wid] = s;
    __syncthreads();
    s = lane < nw ? buf[lane] : 0.0;
    s = dl_warp_sum_d(s);
    __syncthreads();
    return s;
}

/* The cuBLAS compute type of the process-wide dl_cuda_set_matmul setting. */
cublasComputeType_t dl_cuda_compute_type(void);

/* Blocks for a grid-stride loop over n elements (n > 0). Capped so huge n
 * loops inside the kernel instead of overflowing gridDim. */
static inline unsigned dl_cuda_grid(size_t n)
{
    size_t b = (n + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK;
    const size_t cap = (size_t)1 << 20;
    return (unsigned)(b < cap ? b : cap);
}

#endif
