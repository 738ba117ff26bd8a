/* Tests of the outer-loop kernels (kernels/outer.c) against hand-computed
 * values on tiny inputs and against plain scalar double loops at n = 1e6. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/rng.h"
#include "kernels/outer.h"
#include "tests/check.h"

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol))

static void check_vec(const char *what, const float *got, const double *want, int n, double tol)
{
    int before = failures;
    for (int i = 0; i < n; i++)
        CHECK(NEAR(got[i], want[i], tol), "%s[%d] = %.9g, want %.9g", what, i, got[i], want[i]);
    printf("  %-34s %s (%d values, tol %.0e)\n", what, failures == before ? "ok" : "FAILED", n, tol);
}

/* ---------------------------------------------------------------- hand-computed */

static void test_weighted_mean_small(void)
{
    /* x1 = (1, 2, 3) w 1, x2 = (5, -2, 7) w 3:
     * ((1+15)/4, (2-6)/4, (3+21)/4) = (4, -1, 6). */
    const float x1[] = {1, 2, 3}, x2[] = {5, -2, 7};
    const float *x[] = {x1, x2};
    const double w[] = {1, 3};
    float out[3];
    dl_cpu_weighted_mean(out, x, w, 2, 3);
    check_vec("weighted mean, w 1:3", out, (const double[]){4, -1, 6}, 3, 1e-6);
    /* One input: itself, whatever its weight. */
    dl_cpu_weighted_mean(out, x, (const double[]){0.25}, 1, 3);
    check_vec("weighted mean, m=1", out, (const double[]){1, 2, 3}, 3, 0);
    /* A zero weight ignores its input. */
    dl_cpu_weighted_mean(out, x, (const double[]){0, 2}, 2, 3);
    check_vec("weighted mean, w 0:2", out, (const double[]){5, -2, 7}, 3, 0);
    /* In place: out aliases x[0]. */
    float y1[] = {1, 2, 3};
    const float *xa[] = {y1, x2};
    dl_cpu_weighted_mean(y1, xa, w, 2, 3);
    check_vec("weighted mean, in place", y1, (const double[]){4, -1, 6}, 3, 1e-6);
}

static void test_norm_clip_small(void)
{
    const float a[] = {3, 4}, b[] = {1, 2, -2};
    CHECK(dl_cpu_norm2(a, 2) == 5.0, "%g", dl_cpu_norm2(a, 2));
    CHECK(dl_cpu_norm2(b, 3) == 3.0, "%g", dl_cpu_norm2(b, 3));
    CHECK(dl_cpu_norm2(a, 0) == 0.0, "empty");
    printf("  %-34s ok\n", "norm2 of (3,4) = 5, (1,2,-2) = 3");

    /* clip (3,4) to 2.5: scaled by 1/2 -> (1.5, 2); returns the old norm 5. */
    float c[] = {3, 4};
    double pre = dl_cpu_clip_norm(c, 2, 2.5);
    CHECK(pre == 5.0, "pre-clip norm %g", pre);
    check_vec("clip (3,4) to 2.5", c, (const double[]){1.5, 2}, 2, 1e-7);
    float d[] = {3, 4};
    pre = dl_cpu_clip_norm(d, 2, 10.0);
    CHECK(pre == 5.0, "%g", pre);
    check_vec("clip (3,4) to 10 (no-op)", d, (const double[]){3, 4}, 2, 0);
    pre = dl_cpu_clip_norm(d, 2, 0.0);
    check_vec("clip (3,4) to 0", d, (const double[]){0, 0}, 2, 0);
}

static void test_rda_small(void)
{
    /* x1 = (3, 4) w 1, x2 = (0, 2) w 3.
     *   norms 5 and 2; radial = (1*5 + 3*2)/4 = 2.75
     *   unit(x1) = (0.6, 0.8), unit(x2) = (0, 1)
     *   direction = (1*(0.6, 0.8) + 3*(0, 1))/4 = (0.15, 0.95), |.| = sqrt(0.925) = 0.96176920
     *   out = 2.75 * (0.15, 0.95)/0.96176920 = (0.42889708, 2.71634815)
     * (the weighted mean would be (0.75, 2.5): RDA keeps the mean length 2.75
     * instead of the shrunken |(0.75, 2.5)| = 2.61). */
    const float x1[] = {3, 4}, x2[] = {0, 2};
    const float *x[] = {x1, x2};
    float out[2];
    dl_cpu_rda(out, x, (const double[]){1, 3}, 2, 2);
    check_vec("rda (3,4)w1 + (0,2)w3", out, (const double[]){0.42889708, 2.71634815}, 2, 1e-6);
    CHECK(NEAR(dl_cpu_norm2(out, 2), 2.75, 1e-6), "|rda| = %g", dl_cpu_norm2(out, 2));

    /* A zero input keeps its weight in the radial mean, adds no direction:
     * (3,4) w1 + (0,0) w1 -> radial 2.5 along (0.6, 0.8) = (1.5, 2). */
    const float z[] = {0, 0};
    const float *xz[] = {x1, z};
    dl_cpu_rda(out, xz, (const double[]){1, 1}, 2, 2);
    check_vec("rda with a zero input", out, (const double[]){1.5, 2}, 2, 1e-6);

    /* All inputs zero -> 0. */
    const float *zz[] = {z, z};
    out[0] = out[1] = 7;
    dl_cpu_rda(out, zz, (const double[]){1, 2}, 2, 2);
    check_vec("rda of zeros", out, (const double[]){0, 0}, 2, 0);

    /* Opposite directions, equal weights: the direction cancels -> 0. */
    const float p[] = {1, 0}, q[] = {-2, 0};
    const float *pq[] = {p, q};
    out[0] = out[1] = 7;
    dl_cpu_rda(out, pq, (const double[]){1, 1}, 2, 2);
    check_vec("rda of cancelling inputs", out, (const double[]){0, 0}, 2, 0);

    /* In place, out aliases x[1]. */
    float y2[] = {0, 2};
    const float *xa[] = {x1, y2};
    dl_cpu_rda(y2, xa, (const double[]){1, 3}, 2, 2);
    check_vec("rda in place", y2, (const double[]){0.42889708, 2.71634815}, 2, 1e-6);
}

static void test_nesterov_small(void)
{
    /* lr 0.7, mu 0.9, momentum from 0; PyTorch SGD(nesterov=True):
     *   buf = mu*buf + g; step = g + mu*buf; p -= lr*step
     * element 0: p 1.0, g = 0.5, -0.2, 0.1
     *   s1: buf 0.5,   step 0.5 + 0.45 = 0.95,     p = 1 - 0.665 = 0.335
     *   s2: buf 0.25,  step -0.2 + 0.225 = 0.025,  p = 0.335 - 0.0175 = 0.3175
     *   s3: buf 0.325, step 0.1 + 0.2925 = 0.3925, p = 0.3175 - 0.27475 = 0.04275
     * element 1: p 2.0, g = -1, 0, 1
     *   s1: buf -1,    step -1.9,   p = 2 + 1.33 = 3.33
     *   s2: buf -0.9,  step -0.81,  p = 3.33 + 0.567 = 3.897
     *   s3: buf 0.19,  step 1.171,  p = 3.897 - 0.8197 = 3.0773 */
    float p[] = {1.0f, 2.0f}, m[] = {0, 0};
    const float g[3][2] = {{0.5f, -1.0f}, {-0.2f, 0.0f}, {0.1f, 1.0f}};
    const double want_p[3][2] = {{0.335, 3.33}, {0.3175, 3.897}, {0.04275, 3.0773}};
    const double want_m[3][2] = {{0.5, -1}, {0.25, -0.9}, {0.325, 0.19}};
    for (int s = 0; s < 3; s++) {
        dl_cpu_nesterov(p, m, g[s], 2, 0.7f, 0.9f);
        char what[64];
        snprintf(what, sizeof what, "nesterov step %d param", s + 1);
        check_vec(what, p, want_p[s], 2, 2e-6);
        snprintf(what, sizeof what, "nesterov step %d momentum", s + 1);
        check_vec(what, m, want_m[s], 2, 2e-6);
    }
}

static void test_robust_small(void)
{
    /* m = 5: coordinate 0 = {1, 100, 3, -50, 2} -> sorted -50 1 2 3 100
     *        coordinate 1 = {0, 0, 0, 0, 10}   -> sorted 0 0 0 0 10 */
    const float a[] = {1, 0}, b[] = {100, 0}, c[] = {3, 0}, d[] = {-50, 0}, e[] = {2, 10};
    const float *x5[] = {a, b, c, d, e};
    float out[2];
    dl_cpu_trimmed_mean(out, x5, 5, 2, 1); /* keep 1 2 3 | 0 0 0 */
    check_vec("trimmed mean m=5 trim=1", out, (const double[]){2, 0}, 2, 1e-7);
    dl_cpu_trimmed_mean(out, x5, 5, 2, 0); /* plain mean: 56/5, 10/5 */
    check_vec("trimmed mean m=5 trim=0", out, (const double[]){11.2, 2}, 2, 1e-6);
    dl_cpu_median(out, x5, 5, 2);
    check_vec("median m=5 (odd)", out, (const double[]){2, 0}, 2, 0);

    /* m = 4: coordinate 0 = {4, 1, 3, 10} -> 1 3 4 10; coordinate 1 = {-1, -2, -3, -4} */
    const float f[] = {4, -1}, g[] = {1, -2}, h[] = {3, -3}, k[] = {10, -4};
    const float *x4[] = {f, g, h, k};
    dl_cpu_median(out, x4, 4, 2); /* (3+4)/2, (-2-3)/2 */
    check_vec("median m=4 (even)", out, (const double[]){3.5, -2.5}, 2, 0);
    dl_cpu_trimmed_mean(out, x4, 4, 2, 1);
    check_vec("trimmed mean m=4 trim=1", out, (const double[]){3.5, -2.5}, 2, 0);
    dl_cpu_trimmed_mean(out, x4, 4, 2, 0); /* 18/4, -10/4 */
    check_vec("trimmed mean m=4 trim=0", out, (const double[]){4.5, -2.5}, 2, 0);
    dl_cpu_median(out, x4, 2, 2); /* m = 2: mean of f and g */
    check_vec("median m=2", out, (const double[]){2.5, -1.5}, 2, 0);
    dl_cpu_median(out, x4, 1, 2);
    check_vec("median m=1", out, (const double[]){4, -1}, 2, 0);
    /* In place: out aliases x[0]. */
    float f2[] = {4, -1};
    const float *x4a[] = {f2, g, h, k};
    dl_cpu_median(f2, x4a, 4, 2);
    check_vec("median in place", f2, (const double[]){3.5, -2.5}, 2, 0);
}

/* ---------------------------------------------------------------- properties */

static void fill_normal(float *x, size_t n, dl_rng *r)
{
    for (size_t i = 0; i < n; i++) x[i] = dl_rng_normal(r);
}

static double rel_err(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

static void test_rda_properties(void)
{
    enum { N = 1000, M = 3 };
    dl_rng r;
    dl_rng_seed(&r, 42);
    static float v[N], xs[M][N], out[N], wm[N];
    const double a[M] = {0.5, 2.0, 3.5}, w[M] = {1.0, 2.0, 0.25};
    const float *x[M] = {xs[0], xs[1], xs[2]};
    double W = 0, radial = 0;

    /* Parallel inputs x_i = a_i v (a_i > 0): length and direction agree, so
     * RDA is the weighted mean. */
    fill_normal(v, N, &r);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) xs[i][j] = (float)(a[i] * v[j]);
    dl_cpu_rda(out, x, w, M, N);
    dl_cpu_weighted_mean(wm, x, w, M, N);
    double want[N];
    for (int j = 0; j < N; j++) want[j] = wm[j];
    double e = rel_err(out, want, N);
    CHECK(e < 1e-6, "rda vs weighted mean on parallel inputs: rel err %g", e);
    printf("  %-34s ok (rel err %.2e)\n", "rda == weighted mean if parallel", e);

    /* Random inputs: ||rda|| is the weighted mean of the norms, and it is not
     * the weighted mean (which shrinks). */
    for (int i = 0; i < M; i++) fill_normal(xs[i], N, &r);
    for (int i = 0; i < M; i++) {
        double s = 0;
        for (int j = 0; j < N; j++) s += (double)xs[i][j] * xs[i][j];
        radial += w[i] * sqrt(s);
        W += w[i];
    }
    radial /= W;
    dl_cpu_rda(out, x, w, M, N);
    double nrm = dl_cpu_norm2(out, N);
    CHECK(fabs(nrm - radial) <= 1e-6 * radial, "||rda|| %.9g, weighted mean of norms %.9g", nrm, radial);
    dl_cpu_weighted_mean(wm, x, w, M, N);
    CHECK(dl_cpu_norm2(wm, N) < 0.9 * radial, "weighted mean of random vectors should shrink");
    printf("  %-34s ok (%.6f vs %.6f; weighted mean %.3f)\n", "||rda|| == mean of norms", nrm, radial,
           dl_cpu_norm2(wm, N));
}

/* ---------------------------------------------------------------- large n vs scalar */

static void test_large(void)
{
    const size_t n = 1000000;
    enum { M = 5 };
    const double w[M] = {1.0, 0.5, 3.0, 0.0, 2.25};
    dl_rng r;
    dl_rng_seed(&r, 7);
    float *xs[M], *out = dl_xmalloc(n * sizeof *out), *out1 = dl_xmalloc(n * sizeof *out);
    double *ref = dl_xmalloc(n * sizeof *ref);
    for (int i = 0; i < M; i++) {
        xs[i] = dl_xmalloc(n * sizeof *xs[i]);
        fill_normal(xs[i], n, &r);
        for (size_t j = 0; j < n; j++) xs[i][j] += 0.1f * (float)i; /* not centred: no full cancellation */
    }
    const float *const *x = (const float *const *)xs;
    int threads = omp_get_max_threads() < 4 ? 4 : omp_get_max_threads();
    printf("large n = %zu, m = %d, %d threads vs 1:\n", n, M, threads);
    omp_set_num_threads(threads);

    /* norm2 */
    double s = 0;
    for (size_t j = 0; j < n; j++) s += (double)xs[0][j] * xs[0][j];
    double nr = dl_cpu_norm2(xs[0], n);
    CHECK(fabs(nr - sqrt(s)) <= 1e-6 * sqrt(s), "norm2 %.12g vs %.12g", nr, sqrt(s));
    omp_set_num_threads(1);
    CHECK(dl_cpu_norm2(xs[0], n) == nr, "norm2 depends on the thread count");
    omp_set_num_threads(threads);
    printf("  %-34s ok (%.9g, same bits on 1 thread)\n", "norm2", nr);

    /* weighted mean */
    double W = 0;
    for (int i = 0; i < M; i++) W += w[i];
    for (size_t j = 0; j < n; j++) {
        double a = 0;
        for (int i = 0; i < M; i++) a += w[i] * xs[i][j];
        ref[j] = a / W;
    }
    dl_cpu_weighted_mean(out, x, w, M, n);
    double e = rel_err(out, ref, n);
    CHECK(e < 1e-6, "weighted mean rel err %g", e);
    omp_set_num_threads(1);
    dl_cpu_weighted_mean(out1, x, w, M, n);
    omp_set_num_threads(threads);
    CHECK(memcmp(out, out1, n * sizeof *out) == 0, "weighted mean depends on the thread count");
    printf("  %-34s ok (rel err %.2e)\n", "weighted mean", e);

    /* RDA, scalar: norms, radial mean, direction, rescale, all in double */
    double radial = 0, nrm[M];
    for (int i = 0; i < M; i++) {
        double q = 0;
        for (size_t j = 0; j < n; j++) q += (double)xs[i][j] * xs[i][j];
        nrm[i] = sqrt(q);
        radial += w[i] * nrm[i];
    }
    radial /= W;
    double dn = 0;
    for (size_t j = 0; j < n; j++) {
        double a = 0;
        for (int i = 0; i < M; i++) a += w[i] * xs[i][j] / nrm[i];
        ref[j] = a / W;
        dn += ref[j] * ref[j];
    }
    dn = sqrt(dn);
    for (size_t j = 0; j < n; j++) ref[j] *= radial / dn;
    dl_cpu_rda(out, x, w, M, n);
    e = rel_err(out, ref, n);
    CHECK(e < 1e-6, "rda rel err %g", e);
    omp_set_num_threads(1);
    dl_cpu_rda(out1, x, w, M, n);
    omp_set_num_threads(threads);
    CHECK(memcmp(out, out1, n * sizeof *out) == 0, "rda depends on the thread count");
    printf("  %-34s ok (rel err %.2e)\n", "rda", e);

    /* Nesterov: two steps against the float formula */
    float *p = dl_xmalloc(n * sizeof *p), *m = dl_xcalloc(n, sizeof *m);
    double *mref = dl_xcalloc(n, sizeof *mref);
    for (size_t j = 0; j < n; j++) ref[j] = p[j] = xs[1][j];
    for (int step = 0; step < 2; step++) {
        const float *g = xs[2 + step];
        dl_cpu_nesterov(p, m, g, n, 0.7f, 0.9f);
        for (size_t j = 0; j < n; j++) {
            mref[j] = 0.9 * mref[j] + g[j];
            ref[j] -= 0.7 * (g[j] + 0.9 * mref[j]);
        }
    }
    e = rel_err(p, ref, n);
    CHECK(e < 1e-6, "nesterov rel err %g", e);
    printf("  %-34s ok (rel err %.2e)\n", "nesterov, 2 steps", e);

    /* the fused step (scale, norm, step out of place) against the three passes, bit for bit, and on 1 thread */
    for (int k = 0; k < 2; k++) {
        float sc = k ? 0.375f : 1.0f;
        float *g3 = dl_xmalloc(n * sizeof *g3), *gf = dl_xmalloc(n * sizeof *gf);
        float *p3 = dl_xmalloc(n * sizeof *p3), *m3 = dl_xmalloc(n * sizeof *m3);
        float *pf = dl_xmalloc(n * sizeof *pf), *mf = dl_xmalloc(n * sizeof *mf);
        memcpy(g3, xs[4], n * sizeof *g3);
        memcpy(gf, xs[4], n * sizeof *gf);
        memcpy(p3, p, n * sizeof *p3);
        memcpy(m3, m, n * sizeof *m3);
        for (size_t j = 0; j < n; j++) g3[j] *= sc;
        double n3 = dl_cpu_norm2(g3, n);
        dl_cpu_nesterov(p3, m3, g3, n, 0.7f, 0.9f);
        double nf = dl_cpu_nesterov_to(pf, mf, p, m, gf, n, 0.7f, 0.9f, sc);
        CHECK(nf == n3, "fused norm %.17g vs %.17g (sc %g)", nf, n3, sc);
        CHECK(memcmp(pf, p3, n * sizeof *pf) == 0 && memcmp(mf, m3, n * sizeof *mf) == 0,
              "fused step differs from the three passes (sc %g)", sc);
        CHECK(memcmp(gf, g3, n * sizeof *gf) == 0, "fused scale of grad differs (sc %g)", sc);
        omp_set_num_threads(1);
        memcpy(gf, xs[4], n * sizeof *gf);
        CHECK(dl_cpu_nesterov_to(pf, mf, p, m, gf, n, 0.7f, 0.9f, sc) == nf, "fused norm depends on the thread count");
        omp_set_num_threads(threads);
        /* momentum 0 without momentum buffers: the same params and norm as the momentum path with mu 0 (a
         * zero's sign aside: == compares them) and the same scaled grad; the momentum path's m is nonzero
         * here, which mu 0 must ignore */
        float *g0 = dl_xmalloc(n * sizeof *g0), *p0 = dl_xmalloc(n * sizeof *p0);
        memcpy(gf, xs[4], n * sizeof *gf);
        memcpy(g0, xs[4], n * sizeof *g0);
        double nm = dl_cpu_nesterov_to(pf, mf, p, m, gf, n, 0.7f, 0.0f, sc);
        double n0 = dl_cpu_nesterov_to(p0, NULL, p, NULL, g0, n, 0.7f, 0.0f, sc);
        size_t bad0 = 0;
        for (size_t j = 0; j < n; j++) bad0 += p0[j] != pf[j] || g0[j] != gf[j];
        CHECK(n0 == nm && bad0 == 0, "momentum-free step: norm %.17g vs %.17g, %zu coordinates differ (sc %g)", n0,
              nm, bad0, sc);
        free(g0), free(p0);
        free(g3), free(gf), free(p3), free(m3), free(pf), free(mf);
    }
    printf("  %-34s ok (same bits as scale, norm2, nesterov; mu 0 without momentum)\n", "fused nesterov_to");

    /* clip */
    memcpy(out, xs[0], n * sizeof *out);
    double pre = dl_cpu_clip_norm(out, n, 0.5 * nr);
    CHECK(pre == nr, "clip pre-norm %.12g vs %.12g", pre, nr);
    for (size_t j = 0; j < n; j++) ref[j] = xs[0][j] * 0.5;
    e = rel_err(out, ref, n);
    CHECK(e < 1e-6, "clip rel err %g", e);
    printf("  %-34s ok (rel err %.2e)\n", "clip to half the norm", e);

    /* trimmed mean (trim 1 of 5) and median against sorting each column */
    float *tm = dl_xmalloc(n * sizeof *tm), *md = dl_xmalloc(n * sizeof *md);
    dl_cpu_trimmed_mean(tm, x, M, n, 1);
    dl_cpu_median(md, x, M, n);
    size_t bad_tm = 0, bad_md = 0;
    for (size_t j = 0; j < n; j++) {
        float v[M];
        for (int i = 0; i < M; i++) v[i] = xs[i][j];
        for (int a = 0; a < M; a++) /* selection sort, written independently */
            for (int b = a + 1; b < M; b++)
                if (v[b] < v[a]) { float t = v[a]; v[a] = v[b]; v[b] = t; }
        double want_tm = ((double)v[1] + v[2] + v[3]) / 3.0;
        bad_tm += !NEAR(tm[j], want_tm, 1e-6 * (1 + fabs(want_tm)));
        bad_md += md[j] != v[2];
    }
    CHECK(bad_tm == 0, "%zu trimmed-mean coordinates wrong", bad_tm);
    CHECK(bad_md == 0, "%zu median coordinates wrong", bad_md);
    printf("  %-34s ok\n", "trimmed mean and median");

    for (int i = 0; i < M; i++) free(xs[i]);
    free(out); free(out1); free(ref); free(p); free(m); free(mref); free(tm); free(md);
}

int main(void)
{
    printf("hand-computed:\n");
    test_weighted_mean_small();
    test_norm_clip_small();
    test_rda_small();
    test_nesterov_small();
    test_robust_small();
    printf("properties:\n");
    test_rda_properties();
    test_large();
    if (failures) {
        fprintf(stderr, "test_outer: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("test_outer: all %d checks passed\n", checks);
    return 0;
}
