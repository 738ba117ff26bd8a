/* CUDA twin of dl_cpu_matmul_fwd: one cuBLAS GEMM (fp32 compute, TF32 on
 * request) on the thread's handle, then a bias broadcast kernel. */
#include "kernels/cuda/internal.h"

#include <cassert>

/* out[r, o] += bias[o] for r < N, o < OC (row-major out[N,OC]). */
static __global__ void dl_bias_add_kernel(float *out, const float *bias, size_t total, int OC)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) out[i] += bias[i % OC];
}

extern "C" int dl_cuda_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC,
                                  int OC)
{
    assert(out && inp && w && N > 0 && IC > 0 && OC > 0);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    /* cuBLAS is column-major: a row-major X[r,c] is the column-major X^T[c,r].
     * So out^T[OC,N] = w[OC,IC] (column-major view: w^T[IC,OC], hence OP_T)
     * times inp^T[IC,N] (OP_N). */
    const float one = 1.0f, zero = 0.0f;
    cublasComputeType_t ct = dl_cuda_tf32_enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DL_CUBLAS_CHECK(cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, w, CUDA_R_32F, IC, inp,
                                 CUDA_R_32F, IC, &zero, out, CUDA_R_32F, OC, ct, CUBLAS_GEMM_DEFAULT));
    if (bias) {
        size_t total = (size_t)N * (size_t)OC;
        dl_bias_add_kernel<<<dl_cuda_grid(total), DL_CUDA_BLOCK>>>(out, bias, total, OC);
        DL_CUDA_CHECK_LAUNCH();
    }
    return 0;
}
