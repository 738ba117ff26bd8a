/* CPU kernels against naive double-precision loops and hand-computed values:
 * matmul, attention, layernorm (with a numerical gradient), GELU's tanh,
 * softmax cross-entropy, AdamW, pseudo-gradient, and run-to-run determinism. */
#include "core/rng.h"
#include "kernels/cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static dl_rng rng;
static float *randv(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = scale * dl_rng_normal(&rng);
    return p;
}
static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

static double maxrel(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        num = d > num || d != d ? d : num;
        den = fabs(b[i]) > den ? fabs(b[i]) : den;
    }
    return num / (den > 0 ? den : 1);
}

static void test_tanh(void)
{
    double worst = 0;
    for (int i = -240000; i <= 240000; i++) {
        float x = (float)i * 5e-5f;
        double e = fabs((double)dl_cpu_tanh(x) - tanh((double)x));
        if (e > worst) worst = e;
    }
    CHECK(fabs(dl_cpu_tanh(1e30f) - 1.0f) == 0 && fabs(dl_cpu_tanh(-1e30f) + 1.0f) == 0, "tanh saturates");
    printf("tanh: max abs error on [-12, 12] %.2e (tol 1e-6)\n", worst);
    CHECK(worst <= 1e-6, "fast tanh error %.3e", worst);
}

static void test_matmul(void)
{
    int N = 37, IC = 29, OC = 23;
    float *inp = randv((size_t)N * IC, 1), *w = randv((size_t)OC * IC, 1), *bias = randv(OC, 1);
    float *out = zeros((size_t)N * OC), *dout = randv((size_t)N * OC, 1);
    double *ref = calloc((size_t)N * OC, sizeof(double));
    dl_cpu_matmul_fwd(out, inp, w, bias, N, IC, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias[o];
            for (int i = 0; i < IC; i++) s += (double)inp[n * IC + i] * w[o * IC + i];
            ref[n * OC + o] = s;
        }
    double e = maxrel(out, ref, (size_t)N * OC);
    printf("matmul fwd: rel err %.2e\n", e);
    CHECK(e < 1e-5, "matmul fwd %.3e", e);

    /* backward accumulates: start from ones to prove += */
    float *dinp = zeros((size_t)N * IC), *dw = zeros((size_t)OC * IC), *db = zeros(OC);
    for (int i = 0; i < N * IC; i++) dinp[i] = 1.0f;
    dl_cpu_matmul_bwd(dinp, dw, db, dout, inp, w, N, IC, OC);
    double *rdi = calloc((size_t)N * IC, sizeof(double)), *rdw = calloc((size_t)OC * IC, sizeof(double));
    double *rdb = calloc(OC, sizeof(double));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = 1.0;
            for (int o = 0; o < OC; o++) s += (double)dout[n * OC + o] * w[o * IC + i];
            rdi[n * IC + i] = s;
        }
    for (int o = 0; o < OC; o++) {
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += (double)dout[n * OC + o] * inp[n * IC + i];
            rdw[o * IC + i] = s;
        }
        double s = 0;
        for (int n = 0; n < N; n++) s += dout[n * OC + o];
        rdb[o] = s;
    }
    double e1 = maxrel(dinp, rdi, (size_t)N * IC), e2 = maxrel(dw, rdw, (size_t)OC * IC), e3 = maxrel(db, rdb, OC);
    printf("matmul bwd: dinp %.2e dw %.2e dbias %.2e\n", e1, e2, e3);
    CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5, "matmul bwd %.3e %.3e %.3e", e1, e2, e3);
    free(inp); free(w); free(bias); free(out); free(dout); free(ref); free(dinp); free(dw); free(db);
    free(rdi); free(rdw); free(rdb);
}

static void test_attention(void)
{
    int B = 2, T = 9, C = 12, NH = 3, hs = C / NH;
    float *qkv = randv((size_t)B * T * 3 * C, 1), *out = zeros((size_t)B * T * C);
    float *att = zeros((size_t)B * NH * T * T);
    double *ref = calloc((size_t)B * T * C, sizeof(double));
    dl_cpu_attention_fwd(out, att, qkv, B, T, C, NH);
    int above_zero = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
                double s[64], mx = -1e300, z = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int c = 0; c < hs; c++) d += (double)q[c] * k[c];
                    s[j] = d / sqrt((double)hs);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
                for (int c = 0; c < hs; c++) {
                    double y = 0;
                    for (int j = 0; j <= i; j++) y += s[j] / z * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + c];
                    ref[((size_t)b * T + i) * C + h * hs + c] = y;
                }
                for (int j = i + 1; j < T; j++)
                    if (att[(((size_t)b * NH + h) * T + i) * T + j] != 0.0f) above_zero = 0;
            }
    double e = maxrel(out, ref, (size_t)B * T * C);
    printf("attention fwd: rel err %.2e, causal mask %s\n", e, above_zero ? "ok" : "BROKEN");
    CHECK(e < 1e-5, "attention fwd %.3e", e);
    CHECK(above_zero, "attention probabilities above the diagonal must be 0");

    /* backward vs central differences of L = sum(out * dout) */
    float *dout = randv((size_t)B * T * C, 1), *dqkv = zeros((size_t)B * T * 3 * C);
    float *scratch = zeros((size_t)B * NH * T * T);
    dl_cpu_attention_bwd(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    double worst = 0;
    for (int idx = 0; idx < B * T * 3 * C; idx += 7) {
        float keep = qkv[idx];
        double lp = 0, lm = 0, h = 1e-2;
        qkv[idx] = keep + (float)h;
        dl_cpu_attention_fwd(out, att, qkv, B, T, C, NH);
        for (int i = 0; i < B * T * C; i++) lp += (double)out[i] * dout[i];
        qkv[idx] = keep - (float)h;
        dl_cpu_attention_fwd(out, att, qkv, B, T, C, NH);
        for (int i = 0; i < B * T * C; i++) lm += (double)out[i] * dout[i];
        qkv[idx] = keep;
        double num = (lp - lm) / (2 * h), d = fabs(num - dqkv[idx]);
        if (d > worst) worst = d;
    }
    printf("attention bwd vs finite differences: max abs diff %.2e (tol 2e-3)\n", worst);
    CHECK(worst < 2e-3, "attention bwd %.3e", worst);
    free(qkv); free(out); free(att); free(ref); free(dout); free(dqkv); free(scratch);
}

static void test_layernorm(void)
{
    int N = 5, C = 16;
    float *x = randv((size_t)N * C, 2), *w = randv(C, 1), *b = randv(C, 1), *out = zeros((size_t)N * C);
    float *mean = zeros(N), *rstd = zeros(N), *dout = randv((size_t)N * C, 1);
    float *dx = zeros((size_t)N * C), *dw = zeros(C), *db = zeros(C);
    dl_cpu_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
    double worst_fwd = 0;
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[n * C + i] - m) * (x[n * C + i] - m);
        v /= C;
        for (int i = 0; i < C; i++) {
            double r = (x[n * C + i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
            if (fabs(r - out[n * C + i]) > worst_fwd) worst_fwd = fabs(r - out[n * C + i]);
        }
    }
    dl_cpu_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, N, C);
    double worst = 0;
    for (int idx = 0; idx < N * C; idx++) {
        float keep = x[idx];
        double lp = 0, lm = 0, h = 1e-2;
        x[idx] = keep + (float)h;
        dl_cpu_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
        for (int i = 0; i < N * C; i++) lp += (double)out[i] * dout[i];
        x[idx] = keep - (float)h;
        dl_cpu_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
        for (int i = 0; i < N * C; i++) lm += (double)out[i] * dout[i];
        x[idx] = keep;
        double d = fabs((lp - lm) / (2 * h) - dx[idx]);
        if (d > worst) worst = d;
    }
    printf("layernorm: fwd max abs err %.2e, bwd vs finite differences %.2e (tol 2e-3)\n", worst_fwd, worst);
    CHECK(worst_fwd < 1e-5, "layernorm fwd %.3e", worst_fwd);
    CHECK(worst < 2e-3, "layernorm bwd %.3e", worst);
    free(x); free(w); free(b); free(out); free(mean); free(rstd); free(dout); free(dx); free(dw); free(db);
}

static void test_xent(void)
{
    int N = 3, V = 5;
    float logits[15] = {1, 2, 3, 4, 5, 0, 0, 0, 0, 0, -1000, 0, 1000, 0, 0};
    int32_t tgt[3] = {4, 2, 0};
    float probs[15], losses[3], d[15];
    double mean = dl_cpu_softmax_xent_fwd(probs, losses, logits, tgt, N, V);
    double l0 = log(exp(-4.0) + exp(-3.0) + exp(-2.0) + exp(-1.0) + 1.0); /* -log p(5) */
    printf("xent: losses %.6f %.6f %.6f (expect %.6f %.6f 2000)\n", losses[0], losses[1], losses[2], l0, log(5.0));
    CHECK(fabs(losses[0] - l0) < 1e-6, "row 0 loss");
    CHECK(fabs(losses[1] - log(5.0)) < 1e-6, "uniform row loss");
    CHECK(fabs(losses[2] - 2000.0f) < 1e-3 && isfinite(mean), "extreme logits stay finite (log-sum-exp)");
    dl_cpu_softmax_xent_bwd(d, probs, tgt, N, V, 0.5f);
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int i = 0; i < V; i++) s += d[n * V + i];
        CHECK(fabs(s) < 1e-6, "dlogits row %d sums to %.3e, expected 0", n, s);
    }
    CHECK(fabs(d[1 * V + 2] - 0.5f * (0.2f - 1.0f)) < 1e-6, "dlogit at the target");
}

static void test_adamw(void)
{
    /* one parameter, two steps, computed by hand:
     * g=1: m=0.1, v=0.001, mhat=1, vhat=1 -> p = 1 - 0.1*(1/(1+1e-8) + 0.5*1) = 0.85
     * g=1 again: m=0.19, v=0.001999, mhat=0.19/0.19=1, vhat=1 -> p = 0.85 - 0.1*(1 + 0.425) = 0.7075 */
    float p = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
    dl_adamw_hp hp = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.5f,
                      .grad_scale = 1.0f, .t = 1};
    dl_cpu_adamw(&p, &g, &m, &v, 1, &hp);
    CHECK(fabsf(p - 0.85f) < 1e-6, "adamw step 1: %.7f, expected 0.85", p);
    hp.t = 2;
    dl_cpu_adamw(&p, &g, &m, &v, 1, &hp);
    CHECK(fabsf(p - 0.7075f) < 1e-6, "adamw step 2: %.7f, expected 0.7075", p);
    /* grad_scale 0 means a pure decay step */
    float q = 2.0f, gz = 5.0f, mz = 0, vz = 0;
    hp.grad_scale = 0.0f;
    hp.t = 1;
    dl_cpu_adamw(&q, &gz, &mz, &vz, 1, &hp);
    CHECK(fabsf(q - 1.9f) < 1e-6, "adamw with zero grad: %.7f, expected 1.9", q);
    printf("adamw: hand-computed steps %.4f, %.4f\n", 0.85, p);
}

static void test_adamw_split(void)
{
    /* equal halves: exactly dl_cpu_adamw, and the noise moment stays 0 */
    size_t n = 1001;
    float *g = randv(n, 1), *p1 = randv(n, 1), *p2 = zeros(n), *m1 = zeros(n), *v1 = zeros(n), *m2 = zeros(n),
          *v2 = zeros(n), *w = zeros(n);
    memcpy(p2, p1, n * sizeof(float));
    dl_adamw_hp hp = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                      .grad_scale = 0.5f, .t = 1};
    for (hp.t = 1; hp.t <= 3; hp.t++) {
        dl_cpu_adamw(p1, g, m1, v1, n, &hp);
        dl_cpu_adamw_split(p2, g, g, m2, v2, w, n, &hp, 4.0f);
    }
    int w0 = 1;
    for (size_t i = 0; i < n; i++) w0 &= w[i] == 0.0f;
    CHECK(!memcmp(p1, p2, n * 4) && !memcmp(m1, m2, n * 4) && !memcmp(v1, v2, n * 4) && w0,
          "split AdamW with equal halves must be bit-identical to AdamW (and w = 0)");
    free(g); free(p1); free(p2); free(m1); free(v1); free(m2); free(v2); free(w);

    /* hand-computed first steps (lr 0.1, no decay, eps 0, fleet 4):
     * halves 0.3, 0.1: g 0.2, m 0.02, v 0.05*0.03, w 0.05*0.04/16,
     *   mhat 0.2, vhat 20*(0.0015+0.000125) = 0.0325, p -= 0.1*0.2/sqrt(0.0325);
     * halves 0.3, -0.1: the product is negative and counts as 0:
     *   g 0.1, w 0.05*0.16/16, vhat 20*0.0005 = 0.01, p -= 0.1*0.1/0.1 */
    float pa[2] = {1.0f, 1.0f}, ga[2] = {0.3f, 0.3f}, gb[2] = {0.1f, -0.1f}, m[2] = {0}, v[2] = {0}, ww[2] = {0};
    dl_adamw_hp h1 = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 0.0f, .weight_decay = 0.0f,
                      .grad_scale = 1.0f, .t = 1};
    dl_cpu_adamw_split(pa, ga, gb, m, v, ww, 2, &h1, 4.0f);
    double e0 = 1.0 - 0.1 * 0.2 / sqrt(0.0325), e1 = 1.0 - 0.1;
    CHECK(fabs(pa[0] - e0) < 1e-6 && fabs(pa[1] - e1) < 1e-6, "split AdamW hand steps %.7f %.7f, expected %.7f %.7f",
          pa[0], pa[1], e0, e1);
    CHECK(v[1] < 0.0f && fabsf(ww[1] - 0.0005f) < 1e-9f, "negative product kept in v (%g), noise moment %g", v[1],
          ww[1]);

    /* the estimator: per-sample gradients mean mu, sd s, B samples a step
     * (halves of B/2). After many steps at lr 0, max(v,0)+w (bias-corrected)
     * must approach mu^2 + s^2/(fleet*B), the second moment of a fleet*B
     * batch, not the own batch's mu^2 + s^2/B. Averaged over coordinates. */
    size_t k = 4000;
    int B = 16;
    float fleet = 4.0f, mu = 0.05f, sd = 1.0f;
    float *P = zeros(k), *A = zeros(k), *Bv = zeros(k), *M = zeros(k), *V = zeros(k), *W = zeros(k);
    dl_adamw_hp h0 = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1.0f};
    float hsd = sd / sqrtf((float)B / 2);
    for (h0.t = 1; h0.t <= 400; h0.t++) {
        for (size_t i = 0; i < k; i++) {
            A[i] = mu + hsd * dl_rng_normal(&rng);
            Bv[i] = mu + hsd * dl_rng_normal(&rng);
        }
        dl_cpu_adamw_split(P, A, Bv, M, V, W, k, &h0, fleet);
    }
    double c2 = 1.0 / (1.0 - pow(0.95, 400)), est = 0, raw = 0;
    for (size_t i = 0; i < k; i++) {
        est += ((V[i] > 0 ? V[i] : 0) + W[i]) * c2;
        raw += (V[i] + W[i] * fleet) * c2; /* v + fleet*w estimates the own batch's mu^2 + s^2/B */
    }
    est /= (double)k;
    raw /= (double)k;
    double want = mu * mu + sd * sd / (fleet * B), own = mu * mu + sd * sd / B;
    /* max(v,0) adds a small positive bias (noise of the product's EMA) */
    CHECK(est > 0.9 * want && est < 1.6 * want, "fleet second moment %.5f, want ~%.5f (own batch %.5f)", est, want,
          own);
    CHECK(fabs(raw - own) < 0.1 * own, "own-batch second moment %.5f, want %.5f", raw, own);
    printf("adamw split: fleet second moment %.5f (target %.5f, own batch %.5f)\n", est, want, own);
    free(P); free(A); free(Bv); free(M); free(V); free(W);
}

static void test_misc(void)
{
    size_t n = 100003;
    float *a = randv(n, 1), *b = randv(n, 1), *d = zeros(n);
    dl_cpu_pseudograd(d, a, b, n);
    int exact = 1;
    double ss = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] != a[i] - b[i]) exact = 0;
        ss += (double)a[i] * a[i];
    }
    CHECK(exact, "pseudograd must be exactly base - theta");
    double s = dl_cpu_sumsq(a, n);
    CHECK(fabs(s - ss) / ss < 1e-12, "sumsq %.17g vs %.17g", s, ss);
    free(a); free(b); free(d);
}

static void test_determinism(void)
{
    /* resume-from-checkpoint relies on bitwise-identical reruns */
    int B = 4, T = 32, C = 64, NH = 4;
    float *qkv = randv((size_t)B * T * 3 * C, 1), *dout = randv((size_t)B * T * C, 1);
    float *o1 = zeros((size_t)B * T * C), *o2 = zeros((size_t)B * T * C);
    float *a1 = zeros((size_t)B * NH * T * T), *a2 = zeros((size_t)B * NH * T * T);
    float *d1 = zeros((size_t)B * T * 3 * C), *d2 = zeros((size_t)B * T * 3 * C), *s = zeros((size_t)B * NH * T * T);
    dl_cpu_attention_fwd(o1, a1, qkv, B, T, C, NH);
    dl_cpu_attention_fwd(o2, a2, qkv, B, T, C, NH);
    dl_cpu_attention_bwd(d1, s, dout, qkv, a1, B, T, C, NH);
    dl_cpu_attention_bwd(d2, s, dout, qkv, a2, B, T, C, NH);
    CHECK(!memcmp(o1, o2, (size_t)B * T * C * 4) && !memcmp(d1, d2, (size_t)B * T * 3 * C * 4),
          "attention is not bitwise deterministic");
    free(qkv); free(dout); free(o1); free(o2); free(a1); free(a2); free(d1); free(d2); free(s);
}

int main(void)
{
    dl_rng_seed(&rng, 7);
    test_tanh();
    test_matmul();
    test_attention();
    test_layernorm();
    test_xent();
    test_adamw();
    test_adamw_split();
    test_misc();
    test_determinism();
    printf("%s\n", failures ? "test_kernels: FAILED" : "test_kernels: all checks passed");
    return failures ? 1 : 0;
}
