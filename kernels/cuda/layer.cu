/* CUDA twins of the row-wise kernels of kernels/cpu.c: embedding, layernorm,
 * GELU and residual; every backward reduction has a fixed order (no float atomics). */
#include "kernels/cuda/internal.h"

#include <cassert>

/* ------------------------------------------------------------------------ */
/* embedding */

static __global__ void dl_encoder_fwd_kernel(float *out, const int32_t *inp, const float *wte, const float *wpe,
                                             size_t total, int T, int C)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
    }
}

extern "C" int dl_cuda_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                                   int C)
{
    assert(out && inp && wte && wpe && B > 0 && T > 0 && C > 0);
    size_t total = (size_t)B * T * C;
    dl_encoder_fwd_kernel<<<dl_cuda_grid(total), DL_CUDA_BLOCK>>>(out, inp, wte, wpe, total, T, C);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* dwte: one block per vocabulary row v. The block scans the tokens in
 * position order, compacts the positions holding v (order kept), and each
 * thread adds those rows of dout to its channels of dwte[v] one after the
 * other: the same additions in the same (b, t) order as the CPU, so the
 * result is bit-identical and independent of the launch shape. */
static __global__ void dl_encoder_bwd_wte_kernel(float *dwte, const float *dout, const int32_t *inp, int BT, int C)
{
    __shared__ int hits[DL_CUDA_BLOCK];
    __shared__ int warp_hits[DL_CUDA_BLOCK / 32];
    const int v = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *row = dwte + (size_t)v * C;
    for (int base = 0; base < BT; base += blockDim.x) {
        int pos = base + threadIdx.x;
        bool hit = pos < BT && inp[pos] == v;
        unsigned mask = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[wid] = __popc(mask);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < nw; w++) {
            before += w < wid ? warp_hits[w] : 0;
            total += warp_hits[w];
        }
        if (hit) hits[before + __popc(mask & ((1u << lane) - 1u))] = pos;
        __syncthreads();
        for (int h = 0; h < total; h++) {
            const float *d = dout + (size_t)hits[h] * C;
            for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] += d[c];
        }
        __syncthreads(); /* hits/warp_hits are rewritten by the next chunk */
    }
}

/* dwpe[t, c] += dout[b, t, c] for b = 0..B-1 in order (as the CPU). */
static __global__ void dl_encoder_bwd_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t total = (size_t)T * C, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += dout[(size_t)b * total + i];
        dwpe[i] = acc;
    }
}

extern "C" int dl_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                   int C, int V)
{
    assert(dwte && dwpe && dout && inp && B > 0 && T > 0 && C > 0 && V > 0);
    dl_encoder_bwd_wte_kernel<<<(unsigned)V, DL_CUDA_BLOCK>>>(dwte, dout, inp, B * T, C);
    DL_CUDA_CHECK_LAUNCH();
    dl_encoder_bwd_wpe_kernel<<<dl_cuda_grid((size_t)T * C), DL_CUDA_BLOCK>>>(dwpe, dout, B, T, C);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ------------------------------------------------------------------------ */
/* layernorm: one warp per row, two-pass variance as the CPU */

#define DL_LN_ROWS (DL_CUDA_BLOCK / 32) /* rows per block */

static __global__ void dl_layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                               const float *b, int N, int C)
{
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * DL_LN_ROWS + (threadIdx.x >> 5);
    if (n >= N) return; /* whole warps leave together */
    const float *x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += x[i];
    float m = dl_warp_sum_f(s) / C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = x[i] - m;
        v += d * d;
    }
    v = dl_warp_sum_f(v);
    float r = 1.0f / sqrtf(v / C + 1e-5f);
    float *o = out + (size_t)n * C;
    for (int i = lane; i < C; i += 32) o[i] = (x[i] - m) * r * w[i] + b[i];
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}

extern "C" int dl_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                     const float *b, int N, int C)
{
    assert(out && mean && rstd && inp && w && b && N > 0 && C > 0);
    dl_layernorm_fwd_kernel<<<(unsigned)((N + DL_LN_ROWS - 1) / DL_LN_ROWS), DL_CUDA_BLOCK>>>(out, mean, rstd, inp, w,
                                                                                             b, N, C);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* dinp rows, one warp per row (same formula as the CPU). */
static __global__ void dl_layernorm_bwd_dinp_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                                    const float *mean, const float *rstd, int N, int C)
{
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * DL_LN_ROWS + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    float m = mean[n], r = rstd[n];
    float dm = 0.0f, dnm = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * r;
        float dn = w[i] * d[i];
        dm += dn;
        dnm += dn * norm;
    }
    dm = dl_warp_sum_f(dm) / C;
    dnm = dl_warp_sum_f(dnm) / C;
    float *di = dinp + (size_t)n * C;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * r;
        float dn = w[i] * d[i];
        di[i] += (dn - dm - norm * dnm) * r;
    }
}

/* dw/db pass 1: chunk blockIdx.y of the rows, one thread per channel, rows in
 * order. partial[ch][0..C) = sum norm*dout, partial[ch][C..2C) = sum dout. */
static __global__ void dl_layernorm_bwd_partial_kernel(float *partial, const float *dout, const float *inp,
                                                       const float *mean, const float *rstd, int N, int C, int nch)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (c >= C) return;
    int n0 = (int)((long long)N * ch / nch), n1 = (int)((long long)N * (ch + 1) / nch);
    float pw = 0.0f, pb = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + c;
        float d = dout[i];
        float norm = (inp[i] - mean[n]) * rstd[n];
        pw += norm * d;
        pb += d;
    }
    partial[(size_t)ch * 2 * C + c] = pw;
    partial[(size_t)ch * 2 * C + C + c] = pb;
}

/* pass 2: dw[c] += sum over chunks of partial w, db likewise, in chunk order. */
static __global__ void dl_layernorm_bwd_final_kernel(float *dw, float *db, const float *partial, int C, int nch)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= 2 * C) return;
    float s = 0.0f;
    for (int ch = 0; ch < nch; ch++) s += partial[(size_t)ch * 2 * C + j];
    if (j < C)
        dw[j] += s;
    else
        db[j - C] += s;
}

extern "C" int dl_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                     const float *w, const float *mean, const float *rstd, int N, int C)
{
    assert(dinp && dw && db && dout && inp && w && mean && rstd && N > 0 && C > 0);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    dl_layernorm_bwd_dinp_kernel<<<(unsigned)((N + DL_LN_ROWS - 1) / DL_LN_ROWS), DL_CUDA_BLOCK>>>(
        dinp, dout, inp, w, mean, rstd, N, C);
    DL_CUDA_CHECK_LAUNCH();
    int nch = N < DL_CUDA_COL_CHUNKS ? N : DL_CUDA_COL_CHUNKS;
    void *work;
    DL_TRY(dl_cuda_ctx_work(ctx, (size_t)nch * 2 * C * sizeof(float), &work));
    dim3 grid((unsigned)((C + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK), (unsigned)nch);
    dl_layernorm_bwd_partial_kernel<<<grid, DL_CUDA_BLOCK>>>((float *)work, dout, inp, mean, rstd, N, C, nch);
    DL_CUDA_CHECK_LAUNCH();
    dl_layernorm_bwd_final_kernel<<<(unsigned)((2 * C + DL_CUDA_BLOCK - 1) / DL_CUDA_BLOCK), DL_CUDA_BLOCK>>>(
        dw, db, (const float *)work, C, nch);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ------------------------------------------------------------------------ */
/* GELU (tanh approximation) with the CPU's rational tanh */

#define DL_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* Same coefficients and clamps as fast_tanhf in kernels/cpu.c. */
__device__ static inline float dl_tanh_rational(float x)
{
    float c = x > 9.0f ? 9.0f : (x < -9.0f ? -9.0f : x);
    float x2 = c * c;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    float t = c * p / q;
    return t > 1.0f ? 1.0f : (t < -1.0f ? -1.0f : t);
}

static __global__ void dl_gelu_fwd_kernel(float *out, const float *inp, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = inp[i];
        float u = DL_GELU_K * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + dl_tanh_rational(u));
    }
}

static __global__ void dl_gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = inp[i];
        float u = DL_GELU_K * (x + 0.044715f * x * x * x);
        float th = dl_tanh_rational(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * DL_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += g * dout[i];
    }
}

extern "C" int dl_cuda_gelu_fwd(float *out, const float *inp, size_t n)
{
    if (!n) return 0;
    assert(out && inp);
    dl_gelu_fwd_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(out, inp, n);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int dl_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (!n) return 0;
    assert(dinp && inp && dout);
    dl_gelu_bwd_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(dinp, inp, dout, n);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

/* ------------------------------------------------------------------------ */
/* residual */

static __global__ void dl_residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = a[i] + b[i];
}

extern "C" int dl_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
    if (!n) return 0;
    assert(out && a && b);
    dl_residual_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(out, a, b, n);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}
