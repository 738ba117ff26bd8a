/* CPU reference kernels for a GPT-2 training step: OpenBLAS sgemm for every
 * matmul (attention included, per batch-head), OpenMP across rows elsewhere. */
#include "kernels/cpu.h"

#include "core/err.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* embedding */

void dl_cpu_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T, int C)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)inp[b * T + t] * C;
            const float *pe = wpe + (size_t)t * C;
#pragma omp simd
            for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
}

void dl_cpu_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C)
{
    /* Parallel over channels: each thread owns a slice of every row, so
     * repeated tokens never race and the summation order is fixed (b, t). */
#pragma omp parallel
    {
        int nth = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nth), c1 = (int)((long)C * (id + 1) / nth);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *dw = dwte + (size_t)inp[b * T + t] * C;
                float *dp = dwpe + (size_t)t * C;
                for (int i = c0; i < c1; i++) {
                    dw[i] += d[i];
                    dp[i] += d[i];
                }
            }
    }
}

/* ------------------------------------------------------------------------ */
/* layernorm */

void dl_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                          int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++) s += x[i];
        float m = s / C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        float r = 1.0f / sqrtf(v / C + 1e-5f);
        float *o = out + (size_t)n * C;
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * r * w[i] + b[i];
        mean[n] = m;
        rstd[n] = r;
    }
}

void dl_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                          const float *mean, const float *rstd, int N, int C)
{
    /* dinp rows are independent; dw/db are reduced per thread over a fixed
     * static row partition and then summed in thread order (deterministic). */
    int nth = omp_get_max_threads();
    float partial[nth][2 * C];
    memset(partial, 0, sizeof partial);
#pragma omp parallel
    {
        int id = omp_get_thread_num();
        float *pw = partial[id], *pb = partial[id] + C;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
            for (int i = 0; i < C; i++) {
                float norm = (x[i] - m) * r;
                float dn = w[i] * d[i];
                dnorm_mean += dn;
                dnorm_norm_mean += dn * norm;
            }
            dnorm_mean /= C;
            dnorm_norm_mean /= C;
            float *di = dinp + (size_t)n * C;
#pragma omp simd
            for (int i = 0; i < C; i++) {
                float norm = (x[i] - m) * r;
                float dn = w[i] * d[i];
                pb[i] += d[i];
                pw[i] += norm * d[i];
                di[i] += (dn - dnorm_mean - norm * dnorm_norm_mean) * r;
            }
        }
    }
    for (int t = 0; t < nth; t++)
        for (int i = 0; i < C; i++) {
            dw[i] += partial[t][i];
            db[i] += partial[t][C + i];
        }
}

/* ------------------------------------------------------------------------ */
/* matmul */

void dl_cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC)
{
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
}

/* dbias += colsum(dout): columns split across threads; each column summed in row order */
static void bias_bwd(float *dbias, const float *dout, int N, int OC)
{
#pragma omp parallel
    {
        int nth = omp_get_num_threads(), id = omp_get_thread_num();
        int o0 = (int)((long)OC * id / nth), o1 = (int)((long)OC * (id + 1) / nth);
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
#pragma omp simd
            for (int o = o0; o < o1; o++) dbias[o] += d[o];
        }
    }
}

void dl_cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                       int N, int IC, int OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (dbias) bias_bwd(dbias, dout, N, OC);
}

/* bf16 GEMM inputs (kernels/cpu.h) */

static inline float bf16_round1(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) { /* inf stays inf; NaN stays a (quiet) NaN */
        if (u & 0x007fffffu) u |= 0x00400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even (may carry into inf: correct) */
    }
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

void dl_cpu_round_bf16(float *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_round1(src[i]);
}

static float *bf16_copy(const float *src, size_t n)
{
    float *d = dl_xmalloc((n ? n : 1) * sizeof(float));
    dl_cpu_round_bf16(d, src, n);
    return d;
}

void dl_cpu_matmul_fwd_bf16(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC)
{
    float *ri = bf16_copy(inp, (size_t)N * IC), *rw = bf16_copy(w, (size_t)OC * IC);
    dl_cpu_matmul_fwd(out, ri, rw, bias, N, IC, OC);
    free(ri);
    free(rw);
}

void dl_cpu_matmul_bwd_bf16(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int IC, int OC)
{
    float *rd = bf16_copy(dout, (size_t)N * OC), *ri = bf16_copy(inp, (size_t)N * IC),
          *rw = bf16_copy(w, (size_t)OC * IC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, rd, OC, rw, IC, 1.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, rd, OC, ri, IC, 1.0f, dw, IC);
    free(rd);
    free(ri);
    free(rw);
    /* dbias from the fp32 dout, as the fp32 path */
    if (dbias) bias_bwd(dbias, dout, N, OC);
}

/* ------------------------------------------------------------------------ */
/* causal self-attention, one sgemm pair per (batch, head) */

void dl_cpu_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            /* a = scale * q k^T (only the lower triangle is used) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
            for (int i = 0; i < T; i++) {
                float *row = a + (size_t)i * T;
                float mx = -INFINITY;
                for (int j = 0; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
                float s = 0.0f;
                for (int j = 0; j <= i; j++) {
                    float e = expf(row[j] - mx);
                    row[j] = e;
                    s += e;
                }
                float inv = 1.0f / s;
#pragma omp simd
                for (int j = 0; j <= i; j++) row[j] *= inv;
                for (int j = i + 1; j < T; j++) row[j] = 0.0f;
            }
            float *o = out + (size_t)b * T * C + h * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
        }
}

void dl_cpu_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B,
                          int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C;
            float *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            float *da = scratch + ((size_t)b * NH + h) * T * T;
            const float *d = dout + (size_t)b * T * C + h * hs;
            /* dv += a^T d ; da = d v^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 1.0f, dv, C3);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f, da, T);
            /* softmax backward, in place: ds = a * (da - sum(da * a)) * scale */
            for (int i = 0; i < T; i++) {
                const float *ar = a + (size_t)i * T;
                float *dr = da + (size_t)i * T;
                float s = 0.0f;
                for (int j = 0; j <= i; j++) s += ar[j] * dr[j];
#pragma omp simd
                for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - s) * scale;
                for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
            }
            /* dq += ds k ; dk += ds^T q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, k, C3, 1.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, C3, 1.0f, dk, C3);
        }
}

/* ------------------------------------------------------------------------ */
/* GELU (tanh approximation) */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh as a 13/6 rational function of x (the minimax fit used by Eigen and
 * XLA), clamped at |x| = 9 where tanhf is 1.0f: branch-free, so the GELU
 * loops vectorise; libm's tanhf made GELU a third of the step time. Max abs
 * error vs tanh() is checked in tests/test_kernels.c. */
static inline float fast_tanhf(float x)
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

float dl_cpu_tanh(float x) { return fast_tanhf(x); }

void dl_cpu_gelu_fwd(float *out, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + fast_tanhf(u));
    }
}

void dl_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = fast_tanhf(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += g * dout[i];
    }
}

void dl_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ------------------------------------------------------------------------ */
/* softmax + cross-entropy over the first V columns of rows of width V */

double dl_cpu_softmax_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *targets, int N, int V)
{
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        float s = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = expf(l[i] - mx);
            s += p[i];
        }
        float inv = 1.0f / s;
#pragma omp simd
        for (int i = 0; i < V; i++) p[i] *= inv;
        /* loss from log-sum-exp, not log(p): exact even when p underflows */
        float loss = logf(s) + mx - l[targets[n]];
        losses[n] = loss;
        total += loss;
    }
    return total / N;
}

void dl_cpu_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int N, int V, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dlogits + (size_t)n * V;
        const float *p = probs + (size_t)n * V;
#pragma omp simd
        for (int i = 0; i < V; i++) d[i] = p[i] * dloss;
        d[targets[n]] -= dloss;
    }
}

/* ------------------------------------------------------------------------ */
/* optimizer primitives */

void dl_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, const dl_adamw_hp *hp)
{
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps, wd = hp->weight_decay, gs = hp->grad_scale;
    float c1 = 1.0f / (1.0f - powf(b1, (float)hp->t));
    float c2 = 1.0f / (1.0f - powf(b2, (float)hp->t));
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * c1, vhat = vi * c2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
    }
}

void dl_cpu_adamw_split(float *param, const float *ga, const float *gb, float *m, float *v, float *w, size_t n,
                        const dl_adamw_hp *hp, float fleet)
{
    assert(fleet >= 1.0f);
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps, wd = hp->weight_decay, gs = hp->grad_scale;
    float c1 = 1.0f / (1.0f - powf(b1, (float)hp->t));
    float c2 = 1.0f / (1.0f - powf(b2, (float)hp->t));
    float q = 1.0f / (4.0f * fleet);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float a = ga[i] * gs, b = gb[i] * gs, d = a - b;
        float g = 0.5f * (a + b);
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * a * b;
        float wi = b2 * w[i] + (1.0f - b2) * d * d * q;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
        float mhat = mi * c1, vhat = (fmaxf(vi, 0.0f) + wi) * c2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
    }
}

double dl_cpu_sumsq(const float *x, size_t n)
{
    double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void dl_cpu_pseudograd(float *delta, const float *base, const float *theta, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) delta[i] = base[i] - theta[i];
}

void dl_cpu_axpby(float *y, float a, const float *x, float b, size_t n)
{
    if (a == 0.0f) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) y[i] = b * x[i];
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = fmaf(a, y[i], b * x[i]);
}
