/* CUDA twins of dl_cpu_matmul_fwd/bwd: cuBLAS GEMMs (fp32 compute, TF32 or
 * bf16 tensor cores on request) on the thread's handle, a bias broadcast and a deterministic bias-gradient reduction. */
#include "kernels/cuda/internal.h"

#include <cassert>

int dl_cuda_gemm(dl_cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const float *A, int lda, long long sA, const float *B, int ldb, long long sB, float beta, float *C,
                 int ldc, long long sC, int batch)
{
    cublasComputeType_t ct = dl_cuda_compute_type();
    if (batch == 1) {
        DL_CUBLAS_CHECK(cublasGemmEx(ctx->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb,
                                     &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
    } else {
        DL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, sA, B,
                                                   CUDA_R_32F, ldb, sB, &beta, C, CUDA_R_32F, ldc, sC, batch, ct,
                                                   CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}

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
    DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, 0, inp, IC, 0, 0.0f, out, OC, 0, 1));
    if (bias) {
        size_t total = (size_t)N * (size_t)OC;
        dl_bias_add_kernel<<<dl_cuda_grid(total), DL_CUDA_BLOCK>>>(out, bias, total, OC);
        DL_CUDA_CHECK_LAUNCH();
    }
    return 0;
}

/* Column sums of x[N,OC], pass 1: chunk blockIdx.y of DL_CUDA_COL_CHUNKS
 * row ranges, one thread per column summing its rows in order. */
static __global__ void dl_colsum_partial_kernel(float *partial, const float *x, int N, int OC, int nch)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (o >= OC) return;
    int n0 = (int)((long long)N * ch / nch), n1 = (int)((long long)N * (ch + 1) / nch);
    float s = 0.0f;
    for (int n = n0; n < n1; n++) s += x[(size_t)n * OC + o];
    partial[(size_t)ch * OC + o] = s;
}

/* Pass 2: out[o] += sum of the chunk partials, in chunk order. */
static __global__ void dl_colsum_final_kernel(float *out, const float *partial, int OC, int nch)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float s = 0.0f;
    for (int c = 0; c < nch; c++) s += partial[(size_t)c * OC + o];
    out[o] += s;
}

extern "C" int dl_cuda_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                                  const float *w, int N, int IC, int OC)
{
    assert(dinp && dw && dout && inp && w && N > 0 && IC > 0 && OC > 0);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    /* dinp^T[IC,N] += w^T[IC,OC] (column-major view of w, OP_N) dout^T[OC,N] (OP_N) */
    DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, 0, dout, OC, 0, 1.0f, dinp, IC, 0, 1));
    /* dw^T[IC,OC] += inp^T[IC,N] (OP_N) dout[N,OC] (view dout^T, hence OP_T) */
    DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f, dw, IC, 0, 1));
    if (dbias) {
        int nch = N < DL_CUDA_COL_CHUNKS ? N : DL_CUDA_COL_CHUNKS;
        void *work;
        DL_TRY(dl_cuda_ctx_work(ctx, (size_t)nch * OC * sizeof(float), &work));
        dim3 grid((unsigned)((OC + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK), (unsigned)nch);
        dl_colsum_partial_kernel<<<grid, DL_CUDA_BLOCK>>>((float *)work, dout, N, OC, nch);
        DL_CUDA_CHECK_LAUNCH();
        dl_colsum_final_kernel<<<(OC + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK, DL_CUDA_BLOCK>>>(dbias, (const float *)work,
                                                                                          OC, nch);
        DL_CUDA_CHECK_LAUNCH();
    }
    return 0;
}
