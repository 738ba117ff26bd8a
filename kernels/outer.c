/* Outer-loop kernels, CPU reference (OpenMP + SIMD): weighted mean, RDA,
 * Nesterov, norm clipping, trimmed mean and median over fragment payloads. */
#include "kernels/outer.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

/* Below this many floats the loops run on one thread: spawning costs more. */
#define PAR_MIN ((size_t)1 << 15)
/* Coordinates per block of the m-way combinations: the double accumulator
 * (2 KiB) stays in L1 while each input streams through once. 256 measured
 * best for 16 inputs of a GPT-2 fragment on one Intel core (27-28 ms a mean;
 * 512: 33.5, 1024: 37.7, 128: 31-32), the sum's order the same at any size. */
#define BLK 256
/* Reductions sum a fixed number of chunks, then the chunk sums in order, so
 * a result is bit-identical whatever the thread count. */
#define NCHUNK 256

static double weight_sum(const double *w, int m)
{
    double W = 0.0;
    for (int i = 0; i < m; i++) {
        assert(isfinite(w[i]) && w[i] >= 0.0);
        W += w[i];
    }
    assert(W > 0.0 && isfinite(W));
    return W;
}

/* out[j] = sum_i c[i] * x[i][j], double accumulation, block by block; each
 * block is read from every input before it is written, so out may alias one
 * of the x[i]. Inputs with c[i] == 0 are not read. */
static void lincomb(float *out, const float *const *x, const double *c, int m, size_t n)
{
    size_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t j0 = b * BLK, len = n - j0 < BLK ? n - j0 : BLK;
        double acc[BLK];
        for (size_t j = 0; j < len; j++) acc[j] = 0.0;
        for (int i = 0; i < m; i++) {
            if (c[i] == 0.0) continue;
            const float *xi = x[i] + j0;
            double ci = c[i];
#pragma omp simd
            for (size_t j = 0; j < len; j++) acc[j] += ci * (double)xi[j];
        }
#pragma omp simd
        for (size_t j = 0; j < len; j++) out[j0 + j] = (float)acc[j];
    }
}

void dl_cpu_weighted_mean(float *out, const float *const *x, const double *w, int m, size_t n)
{
    assert(out && x && w && m >= 1);
    double W = weight_sum(w, m);
    double *c = dl_xmalloc((size_t)m * sizeof *c);
    for (int i = 0; i < m; i++) c[i] = w[i] / W;
    lincomb(out, x, c, m, n);
    free(c);
}

/* Chunk c of NCHUNK over n elements: [*lo, *hi). */
static void chunk_range(size_t n, int c, size_t *lo, size_t *hi)
{
    size_t chunk = (n + NCHUNK - 1) / NCHUNK;
    *lo = (size_t)c * chunk < n ? (size_t)c * chunk : n;
    *hi = *lo + chunk < n ? *lo + chunk : n;
}

double dl_cpu_norm2(const float *x, size_t n)
{
    assert(x || n == 0);
    double part[NCHUNK];
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int c = 0; c < NCHUNK; c++) {
        size_t lo, hi;
        chunk_range(n, c, &lo, &hi);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        part[c] = s;
    }
    double s = 0.0;
    for (int c = 0; c < NCHUNK; c++) s += part[c];
    return sqrt(s);
}

/* out *= s, computed in double. */
static void scale(float *x, size_t n, double s)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * s);
}

void dl_cpu_rda(float *out, const float *const *x, const double *w, int m, size_t n)
{
    dl_cpu_rda_sumsq(out, x, w, NULL, m, n);
}

void dl_cpu_rda_sumsq(float *out, const float *const *x, const double *w, const double *sumsq, int m, size_t n)
{
    assert(out && x && w && m >= 1);
    double W = weight_sum(w, m);
    double *c = dl_xmalloc((size_t)m * sizeof *c);
    double radial = 0.0;
    int any = 0;
    for (int i = 0; i < m; i++) {
        double r = sumsq ? sqrt(sumsq[i]) : dl_cpu_norm2(x[i], n);
        radial += w[i] * r;
        /* w_i unit(x_i) / W; a zero vector has no direction to contribute. */
        c[i] = r > 0.0 ? w[i] / (W * r) : 0.0;
        any |= c[i] != 0.0;
    }
    radial /= W;
    if (!any) {
        memset(out, 0, n * sizeof *out);
        free(c);
        return;
    }
    lincomb(out, x, c, m, n);
    free(c);
    /* Normalise the direction actually stored, so ||out|| == radial up to
     * float rounding; opposite directions can cancel exactly. */
    double dn = dl_cpu_norm2(out, n);
    if (dn == 0.0) {
        memset(out, 0, n * sizeof *out);
        return;
    }
    scale(out, n, radial / dn);
}

void dl_cpu_nesterov(float *param, float *momentum, const float *grad, size_t n, float lr, float mu)
{
    assert(param && momentum && grad);
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float b = mu * momentum[i] + g;
        momentum[i] = b;
        param[i] -= lr * (g + mu * b);
    }
}

double dl_cpu_nesterov_to(float *param_out, float *mom_out, const float *param_in, const float *mom_in, float *grad,
                          size_t n, float lr, float mu, float sc)
{
    assert(param_out && param_in && (grad || n == 0));
    assert((mom_out && mom_in) || (!mom_out && !mom_in && mu == 0.0f));
    double part[NCHUNK];
    if (!mom_out) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (int c = 0; c < NCHUNK; c++) {
            size_t lo, hi;
            chunk_range(n, c, &lo, &hi);
            double s = 0.0;
            if (sc != 1.0f) {
#pragma omp simd reduction(+ : s)
                for (size_t i = lo; i < hi; i++) {
                    float g = grad[i] * sc;
                    grad[i] = g;
                    s += (double)g * (double)g;
                    param_out[i] = param_in[i] - lr * g;
                }
            } else {
#pragma omp simd reduction(+ : s)
                for (size_t i = lo; i < hi; i++) {
                    float g = grad[i];
                    s += (double)g * (double)g;
                    param_out[i] = param_in[i] - lr * g;
                }
            }
            part[c] = s;
        }
        double s = 0.0;
        for (int c = 0; c < NCHUNK; c++) s += part[c];
        return sqrt(s);
    }
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int c = 0; c < NCHUNK; c++) {
        size_t lo, hi;
        chunk_range(n, c, &lo, &hi);
        double s = 0.0;
        /* two loops, not one with a conditional write-back: that one vectorises its sum differently, and the
         * norm is no longer dl_cpu_norm2's to the bit (test_outer) */
        if (sc != 1.0f) {
#pragma omp simd reduction(+ : s)
            for (size_t i = lo; i < hi; i++) {
                float g = grad[i] * sc;
                grad[i] = g;
                s += (double)g * (double)g;
                float b = mu * mom_in[i] + g;
                mom_out[i] = b;
                param_out[i] = param_in[i] - lr * (g + mu * b);
            }
        } else {
#pragma omp simd reduction(+ : s)
            for (size_t i = lo; i < hi; i++) {
                float g = grad[i];
                s += (double)g * (double)g;
                float b = mu * mom_in[i] + g;
                mom_out[i] = b;
                param_out[i] = param_in[i] - lr * (g + mu * b);
            }
        }
        part[c] = s;
    }
    double s = 0.0;
    for (int c = 0; c < NCHUNK; c++) s += part[c];
    return sqrt(s);
}

double dl_cpu_clip_norm(float *x, size_t n, double max_norm)
{
    assert(x && max_norm >= 0.0 && isfinite(max_norm));
    double norm = dl_cpu_norm2(x, n);
    if (norm > max_norm) scale(x, n, max_norm / norm);
    return norm;
}

/* Ascending sort of a few floats; insertion sort beats qsort for the
 * handful of learners a merge usually has. */
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void sort_small(float *v, int m)
{
    if (m > 48) {
        qsort(v, (size_t)m, sizeof *v, cmp_float);
        return;
    }
    for (int k = 1; k < m; k++) {
        float t = v[k];
        int j = k;
        while (j > 0 && v[j - 1] > t) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = t;
    }
}

void dl_cpu_trimmed_mean(float *out, const float *const *x, int m, size_t n, int trim)
{
    assert(out && x && m >= 1 && trim >= 0 && 2 * trim < m);
    int keep = m - 2 * trim;
#pragma omp parallel if (n >= PAR_MIN / 8)
    {
        /* One scratch row per thread; out may alias an input because every
         * value of a coordinate is copied before it is written. */
        float *v = dl_xmalloc((size_t)m * sizeof *v);
#pragma omp for schedule(static)
        for (size_t j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) v[i] = x[i][j];
            sort_small(v, m);
            double s = 0.0;
            for (int i = trim; i < trim + keep; i++) s += v[i];
            out[j] = (float)(s / keep);
        }
        free(v);
    }
}

void dl_cpu_median(float *out, const float *const *x, int m, size_t n)
{
    assert(m >= 1);
    dl_cpu_trimmed_mean(out, x, m, n, (m - 1) / 2);
}
