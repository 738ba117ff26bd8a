/* Private to the .cu files of kernels/cuda: the per-thread CUDA context
 * (cuBLAS handle, reduction scratch) and launch-shape helpers they share. */
#ifndef DL_KERNELS_CUDA_INTERNAL_H
#define DL_KERNELS_CUDA_INTERNAL_H

#include <cstddef>
#include <cstdio>
#include <cstdlib>
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

/* One per host thread, created on first use on the then-current device. */
struct dl_cuda_ctx {
    cublasHandle_t blas; /* on the legacy default stream */
    double *scratch;     /* device, DL_CUDA_SUMSQ_BLOCKS + 1 doubles */
};

/* This thread's context, creating it if needed. 0 or DL_ENODEV/DL_ECUDA. */
int dl_cuda_ctx_get(dl_cuda_ctx **out);

/* Process-wide TF32 switch read by the matmul wrapper. */
int dl_cuda_tf32_enabled(void);

/* Blocks for a grid-stride loop over n elements (n > 0). Capped so huge n
 * loops inside the kernel instead of overflowing gridDim. */
static inline unsigned dl_cuda_grid(size_t n)
{
    size_t b = (n + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK;
    const size_t cap = (size_t)1 << 20;
    return (unsigned)(b < cap ? b : cap);
}

#endif
