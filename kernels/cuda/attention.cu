/* CUDA twin of the CPU causal self-attention: cuBLAS strided-batched GEMMs
 * over the heads of each batch row (qkv rows of stride 3C), causal softmax kernels. */
#include "kernels/cuda/internal.h"

#include <cassert>

#define DL_ATT_ROWS (DL_CUDA_BLOCK / 32) /* softmax rows per block, one warp each */

/* In place on rows of a[R, T] (R = B*NH*T, row r is query i = r % T):
 * softmax over j <= i, zero above the diagonal. Same steps as the CPU. */
static __global__ void dl_causal_softmax_kernel(float *a, size_t R, int T)
{
    int lane = threadIdx.x & 31;
    size_t r = (size_t)blockIdx.x * DL_ATT_ROWS + (threadIdx.x >> 5);
    if (r >= R) return;
    int i = (int)(r % T);
    float *row = a + r * T;
    float mx = -INFINITY;
    for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, row[j]);
    mx = dl_warp_max_f(mx);
    float s = 0.0f;
    for (int j = lane; j <= i; j += 32) {
        float e = expf(row[j] - mx);
        row[j] = e;
        s += e;
    }
    float inv = 1.0f / dl_warp_sum_f(s);
    for (int j = lane; j <= i; j += 32) row[j] *= inv;
    for (int j = i + 1 + lane; j < T; j += 32) row[j] = 0.0f;
}

/* Softmax backward in place on da: ds = a * (da - sum_j a*da) * scale for
 * j <= i, zero above the diagonal. */
static __global__ void dl_causal_softmax_bwd_kernel(float *da, const float *a, size_t R, int T, float scale)
{
    int lane = threadIdx.x & 31;
    size_t r = (size_t)blockIdx.x * DL_ATT_ROWS + (threadIdx.x >> 5);
    if (r >= R) return;
    int i = (int)(r % T);
    const float *ar = a + r * T;
    float *dr = da + r * T;
    float s = 0.0f;
    for (int j = lane; j <= i; j += 32) s += ar[j] * dr[j];
    s = dl_warp_sum_f(s);
    for (int j = lane; j <= i; j += 32) dr[j] = ar[j] * (dr[j] - s) * scale;
    for (int j = i + 1 + lane; j < T; j += 32) dr[j] = 0.0f;
}

static unsigned softmax_grid(size_t R) { return (unsigned)((R + DL_ATT_ROWS - 1) / DL_ATT_ROWS); }

/* Column-major view used below: a row-major X[rows, cols] with row stride ld
 * is the column-major X^T with leading dimension ld. Per batch row b, the
 * NH heads form a strided batch: q/k/v/out of head h start h*hs floats in,
 * att of head h starts h*T*T floats in. */

extern "C" int dl_cuda_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    assert(out && att && qkv && B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long sTT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C;
        float *a = att + (size_t)b * NH * sTT;
        /* a = scale q k^T, i.e. a^T[T,T] = scale k[T,hs] q^T: k is OP_T of its view */
        DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, C3, hs, q, C3, hs, 0.0f, a, T, sTT, NH));
    }
    size_t R = (size_t)B * NH * T;
    dl_causal_softmax_kernel<<<softmax_grid(R), DL_CUDA_BLOCK>>>(att, R, T);
    DL_CUDA_CHECK_LAUNCH();
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * C3 + 2 * C;
        const float *a = att + (size_t)b * NH * sTT;
        float *o = out + (size_t)b * T * C;
        /* out = a v, i.e. out^T[hs,T] = v^T[hs,T] a^T[T,T], both plain views */
        DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs, a, T, sTT, 0.0f, o, C, hs, NH));
    }
    return 0;
}

extern "C" int dl_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                     const float *att, int B, int T, int C, int NH)
{
    assert(dqkv && scratch && dout && qkv && att && B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long sTT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * C3 + 2 * C;
        float *dv = dqkv + (size_t)b * T * C3 + 2 * C;
        const float *a = att + (size_t)b * NH * sTT;
        float *da = scratch + (size_t)b * NH * sTT;
        const float *d = dout + (size_t)b * T * C;
        /* dv += a^T d: dv^T[hs,T] += d^T[hs,T] (view) a[T,T] (OP_T of the view a^T) */
        DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, d, C, hs, a, T, sTT, 1.0f, dv, C3, hs, NH));
        /* da = d v^T: da^T[T,T] = v[T,hs] (OP_T of the view) d^T[hs,T] (view) */
        DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, hs, d, C, hs, 0.0f, da, T, sTT, NH));
    }
    size_t R = (size_t)B * NH * T;
    dl_causal_softmax_bwd_kernel<<<softmax_grid(R), DL_CUDA_BLOCK>>>(scratch, att, R, T, scale);
    DL_CUDA_CHECK_LAUNCH();
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C;
        float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C;
        const float *ds = scratch + (size_t)b * NH * sTT;
        /* dq += ds k: dq^T[hs,T] += k^T[hs,T] (view) ds^T[T,T] (view) */
        DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, k, C3, hs, ds, T, sTT, 1.0f, dq, C3, hs, NH));
        /* dk += ds^T q: dk^T[hs,T] += q^T[hs,T] (view) ds[T,T] (OP_T of the view) */
        DL_TRY(dl_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, q, C3, hs, ds, T, sTT, 1.0f, dk, C3, hs, NH));
    }
    return 0;
}
