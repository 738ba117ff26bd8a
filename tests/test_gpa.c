/* Tests of gpt/gpa.c and the GPA trainer: the step against a three-buffer reference (x, y, z, AdamW on z
 * with the gradient at y), mu_x = 0 is AdamW bit for bit, the refusals, checkpoints, and the adopt rules of the parameter interface. */
#include "gpt/gpa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"
#include "core/model.h"
#include "core/plan.h"
#include "gpt/ckpt.h"
#include "learner/mailbox.h"
#include "learner/node.h"
#include "gpt/train.h"

#include "tests/check.h"

static char dir[] = "/tmp/dloco_test_gpa.XXXXXX";
static char corpus[512];

static dl_model_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab = 256};

static dl_data *open_data(void)
{
    dl_data_opts o = {.path = corpus, .format = "text", .seq_len = CFG.seq_len, .vocab = 256, .val_frac = 0.1,
                      .seed = 3};
    dl_data *d = NULL;
    REQUIRE(dl_data_open(&o, &d) == 0, "data: %s", dl_errmsg());
    return d;
}

static dl_train_cfg train_cfg(int optimizer, float mu_x, float mu_y)
{
    return (dl_train_cfg){
        .model = CFG,
        .batch = 4,
        .steps = 20,
        .lr = 3e-3f,
        .warmup = 2,
        .min_lr_frac = 0.1f,
        .adamw = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
        .seed = 11,
        .val_batches = 2,
        .device = DL_DEVICE_CPU,
        .optimizer = optimizer,
        .gpa_mu_x = mu_x,
        .gpa_mu_y = mu_y,
    };
}

static dl_trainer *open_trainer(const dl_train_cfg *tc)
{
    dl_trainer *t = NULL;
    REQUIRE(dl_trainer_open(tc, open_data(), &t) == 0, "trainer: %s", dl_errmsg());
    return t;
}

/* Write `len` bytes at `offset` of checkpoint `path`, then resume a fresh
 * trainer of tc from it: the resume's code (its message in dl_errmsg()). */
static int poke_and_resume(const dl_train_cfg *tc, const char *path, long offset, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "r+b");
    REQUIRE(f, "reopen %s", path);
    REQUIRE(fseek(f, offset, SEEK_SET) == 0 && fwrite(bytes, len, 1, f) == 1, "poke %s", path);
    fclose(f);
    dl_trainer *c = open_trainer(tc);
    dl_err_clear();
    int rc = dl_trainer_resume(c, path);
    dl_trainer_close(&c);
    return rc;
}

static double max_abs_diff(const float *a, const double *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double max_abs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* ---- the kernel against three explicit buffers, on a quadratic whose
 * gradient is taken at y: f(w) = sum a_i (w_i - c_i)^2 / 2 */

static void test_kernel_reference(void)
{
    enum { N = 1000, STEPS = 40 };
    const float mu_x = 0.95f, mu_y = 0.7f;
    float *x = malloc(N * 4), *y = malloc(N * 4), *g = malloc(N * 4), *m = calloc(N, 4), *v = calloc(N, 4);
    double *rx = malloc(N * 8), *ry = malloc(N * 8), *rz = malloc(N * 8), *rm = calloc(N, 8), *rv = calloc(N, 8);
    double *a = malloc(N * 8), *c = malloc(N * 8);
    for (int i = 0; i < N; i++) {
        x[i] = y[i] = (float)sin(i * 0.37);
        rx[i] = rz[i] = x[i];
        a[i] = 0.5 + (i % 7) * 0.25;
        c[i] = cos(i * 0.11);
    }
    dl_adamw_hp hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 1.0f};
    double worst = 0.0;
    for (int t = 1; t <= STEPS; t++) {
        hp.t = t;
        hp.lr = 1e-2f * (float)(1.0 + 0.5 * sin(t)); /* a schedule that changes every step */
        hp.grad_scale = t % 3 ? 1.0f : 0.5f;         /* and clipping on some steps */
        /* the reference: y, the gradient there, AdamW on z, the average x */
        for (int i = 0; i < N; i++) {
            ry[i] = mu_y * rx[i] + (1.0 - mu_y) * rz[i];
            double gi = a[i] * (ry[i] - c[i]) * hp.grad_scale;
            rm[i] = hp.beta1 * rm[i] + (1.0 - hp.beta1) * gi;
            rv[i] = hp.beta2 * rv[i] + (1.0 - hp.beta2) * gi * gi;
            double mh = rm[i] / (1.0 - pow(hp.beta1, t)), vh = rv[i] / (1.0 - pow(hp.beta2, t));
            rz[i] -= hp.lr * (mh / (sqrt(vh) + hp.eps) + hp.weight_decay * rz[i]);
            rx[i] = mu_x * rx[i] + (1.0 - mu_x) * rz[i];
        }
        /* the kernel: its gradient at its own y */
        for (int i = 0; i < N; i++) g[i] = (float)(a[i] * ((double)y[i] - c[i]));
        dl_gpa_adamw(x, y, g, m, v, N, &hp, mu_x, mu_y);
        for (int i = 0; i < N; i++) ry[i] = mu_y * rx[i] + (1.0 - mu_y) * rz[i];
        double scale = fmax(1.0, max_abs(rz, N));
        worst = fmax(worst, fmax(max_abs_diff(x, rx, N), max_abs_diff(y, ry, N)) / scale);
    }
    float *z = malloc(N * 4);
    dl_gpa_z(z, x, y, N, mu_y);
    double zd = max_abs_diff(z, rz, N) / fmax(1.0, max_abs(rz, N));
    /* stated tolerance: 1e-5 of the largest |z| over 40 steps (fp32 state
     * and z recovered from (x, y) each step against a double reference) */
    printf("kernel vs three-buffer reference, %d steps: max |x - x_ref|, |y - y_ref| = %.3g, |z - z_ref| = %.3g "
           "(relative to max |z|)\n", STEPS, worst, zd);
    CHECK(worst < 1e-5 && zd < 1e-5, "GPA kernel off the reference: %g / %g", worst, zd);
    /* and x really averages: after 40 steps x and z are apart */
    double gap = 0.0;
    for (int i = 0; i < N; i++) gap = fmax(gap, fabs(rx[i] - rz[i]));
    CHECK(gap > 1e-3, "x and z did not separate (gap %g): the test would not see a wrong average", gap);
    free(x), free(y), free(g), free(m), free(v), free(z);
    free(rx), free(ry), free(rz), free(rm), free(rv), free(a), free(c);
    printf("ok: the GPA kernel follows the x, y, z reference within 1e-5\n");
}

/* ---- the trainer against a reference built on a bare dl_gpt: the same
 * batches, the forward/backward at y = mu_y x + (1-mu_y) z, clipping, AdamW
 * (decay on matrices and embeddings) on z in double, the average x */

static void test_trainer_reference(void)
{
    const float mu_x = 0.9f, mu_y = 0.7f;
    dl_train_cfg tc = train_cfg(DL_OPT_GPA, mu_x, mu_y);
    dl_trainer *tr = open_trainer(&tc);
    dl_gpt *g = NULL;
    REQUIRE(dl_gpt_open(&CFG, tc.batch, &g) == 0, "ref model: %s", dl_errmsg());
    dl_gpt_init(g, tc.seed);
    dl_data *d = open_data();
    size_t n = dl_gpt_num_params(g);
    REQUIRE(n == dl_trainer_num_params(tr), "sizes");
    float *p = dl_gpt_params(g), *gr = dl_gpt_grads(g);
    double *x = malloc(n * 8), *z = malloc(n * 8), *m = calloc(n, 8), *v = calloc(n, 8), *y = malloc(n * 8);
    int *decay = malloc(n * sizeof(int));
    int nt;
    const dl_tensor *tens = dl_gpt_tensors(g, &nt);
    for (int k = 0; k < nt; k++)
        for (size_t i = 0; i < tens[k].numel; i++) decay[tens[k].offset + i] = tens[k].kind != DL_TENSOR_VECTOR;
    for (size_t i = 0; i < n; i++) x[i] = z[i] = p[i];
    int B = tc.batch, T = CFG.seq_len;
    int32_t *inp = malloc((size_t)B * T * 4), *tgt = malloc((size_t)B * T * 4);
    const dl_adamw_cfg *c = &tc.adamw;
    double worst = 0.0, lsum_t = 0, lsum_r = 0;
    for (int t = 1; t <= 8; t++) {
        for (size_t i = 0; i < n; i++) p[i] = (float)(mu_y * x[i] + (1.0 - mu_y) * z[i]);
        dl_data_next_train(d, B, inp, tgt);
        lsum_r += dl_gpt_forward(g, inp, tgt, B, T);
        dl_gpt_zero_grad(g);
        dl_gpt_backward(g);
        double ss = 0.0;
        for (size_t i = 0; i < n; i++) ss += (double)gr[i] * gr[i];
        double norm = sqrt(ss), scale = c->grad_clip / (norm + 1e-6);
        if (scale > 1.0) scale = 1.0;
        double lr = dl_trainer_lr_at(tr, t);
        for (size_t i = 0; i < n; i++) {
            double gi = gr[i] * scale;
            m[i] = c->beta1 * m[i] + (1.0 - c->beta1) * gi;
            v[i] = c->beta2 * v[i] + (1.0 - c->beta2) * gi * gi;
            double mh = m[i] / (1.0 - pow(c->beta1, t)), vh = v[i] / (1.0 - pow(c->beta2, t));
            z[i] -= lr * (mh / (sqrt(vh) + c->eps) + (decay[i] ? c->weight_decay : 0.0) * z[i]);
            x[i] = mu_x * x[i] + (1.0 - mu_x) * z[i];
            y[i] = mu_y * x[i] + (1.0 - mu_y) * z[i];
        }
        double loss = 0;
        REQUIRE(dl_trainer_step(tr, &loss, NULL) == 0, "step %d", t);
        lsum_t += loss;
        double e = fmax(max_abs_diff(dl_gpt_params(dl_trainer_model(tr)), x, n),
                        max_abs_diff(dl_trainer_gpa_y(tr), y, n));
        worst = fmax(worst, e);
    }
    /* stated tolerance: 1e-5 absolute (the parameters are O(0.02..1), each
     * step moves them by up to lr = 3e-3; the reference is double, the
     * trainer fp32 with OpenBLAS sums) */
    printf("trainer vs reference over 8 steps: max |x - x_ref|, |y - y_ref| = %.3g; mean loss %.6f vs %.6f\n", worst,
           lsum_t / 8, lsum_r / 8);
    CHECK(worst < 1e-5, "GPA trainer off the reference by %g", worst);
    CHECK(fabs(lsum_t - lsum_r) < 1e-4 * fabs(lsum_r), "losses at y differ: %g vs %g", lsum_t, lsum_r);
    /* and the evaluation is at x: evaluate the reference at x and compare */
    double vt = 0, vr = 0;
    CHECK(dl_trainer_eval(tr, &vt) == 0, "eval");
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    for (int b = 0; b < tc.val_batches; b++) {
        dl_data_val_batch(d, (uint64_t)b, B, inp, tgt);
        vr += dl_gpt_forward(g, inp, tgt, B, T);
    }
    vr /= tc.val_batches;
    printf("validation loss at x: trainer %.6f, reference %.6f\n", vt, vr);
    CHECK(fabs(vt - vr) < 1e-4, "eval is not at x: %g vs %g", vt, vr);
    free(x), free(z), free(m), free(v), free(y), free(decay), free(inp), free(tgt);
    dl_data_close(&d);
    dl_gpt_close(&g);
    dl_trainer_close(&tr);
    printf("ok: the GPA trainer takes the gradient at y, steps z by AdamW, evaluates x (within 1e-5)\n");
}

/* ---- mu_x = 0 is AdamW, bit for bit, for any mu_y; mu_y = 0 alone is not */

static void test_adamw_limit(void)
{
    dl_train_cfg ta = train_cfg(DL_OPT_ADAMW, 0, 0);
    dl_trainer *a = open_trainer(&ta);
    float mys[] = {0.7f, 0.0f};
    for (int k = 0; k < 2; k++) {
        dl_train_cfg tg = train_cfg(DL_OPT_GPA, 0.0f, mys[k]);
        dl_trainer *b = open_trainer(&tg);
        if (k == 1) { /* a second AdamW from scratch, in step with this one */
            dl_trainer_close(&a);
            a = open_trainer(&ta);
        }
        int same_loss = 1;
        for (int s = 0; s < 6; s++) {
            double la = 0, lb = 0;
            CHECK(dl_trainer_step(a, &la, NULL) == 0 && dl_trainer_step(b, &lb, NULL) == 0, "step");
            same_loss &= memcmp(&la, &lb, sizeof la) == 0;
        }
        size_t n = dl_trainer_num_params(a);
        dl_gpt *ga = dl_trainer_model(a), *gb = dl_trainer_model(b);
        CHECK(same_loss, "mu_x 0, mu_y %g: losses differ from AdamW", mys[k]);
        CHECK(!memcmp(dl_gpt_params(ga), dl_gpt_params(gb), n * 4) &&
                  !memcmp(dl_gpt_adam_m(ga), dl_gpt_adam_m(gb), n * 4) &&
                  !memcmp(dl_gpt_adam_v(ga), dl_gpt_adam_v(gb), n * 4),
              "mu_x 0, mu_y %g: parameters or moments differ from AdamW", mys[k]);
        CHECK(!memcmp(dl_gpt_params(gb), dl_trainer_gpa_y(b), n * 4), "mu_x 0: y != x");
        dl_trainer_close(&b);
    }
    /* mu_y = 0 with mu_x > 0: the gradient at z, the model an EMA: not AdamW */
    dl_trainer_close(&a);
    a = open_trainer(&ta);
    dl_train_cfg te = train_cfg(DL_OPT_GPA, 0.9f, 0.0f);
    dl_trainer *e = open_trainer(&te);
    for (int s = 0; s < 5; s++) {
        double l;
        dl_trainer_step(a, &l, NULL);
        dl_trainer_step(e, &l, NULL);
    }
    size_t n = dl_trainer_num_params(a);
    CHECK(memcmp(dl_gpt_params(dl_trainer_model(a)), dl_gpt_params(dl_trainer_model(e)), n * 4) != 0,
          "mu_x 0.9, mu_y 0 gave AdamW's parameters");
    /* but its z (= y, since mu_y = 0) is AdamW's iterate exactly */
    CHECK(!memcmp(dl_gpt_params(dl_trainer_model(a)), dl_trainer_gpa_y(e), n * 4),
          "mu_y 0: z = y is not AdamW's iterate");
    dl_trainer_close(&a);
    dl_trainer_close(&e);
    printf("ok: mu_x = 0 is AdamW bit for bit (mu_y 0.7 and 0); mu_y = 0 keeps AdamW's iterate as z and averages it\n");
}

/* ---- refusals */

static void expect_open_fails(const dl_train_cfg *tc, int want, const char *needle, const char *what)
{
    dl_trainer *t = (dl_trainer *)&CFG;
    dl_err_clear();
    int rc = dl_trainer_open(tc, open_data(), &t);
    printf("%s -> %s: %s\n", what, dl_strerror(rc), dl_errmsg());
    CHECK(rc == want && t == NULL && strstr(dl_errmsg(), needle), "%s: rc %d '%s'", what, rc, dl_errmsg());
}

static void test_refusals(void)
{
    struct {
        double mx, my;
        const char *needle;
    } bad[] = {{1.0, 0.7, "mu_x 1"},  {-0.1, 0.7, "mu_x -0.1"}, {NAN, 0.7, "mu_x nan"}, {INFINITY, 0.7, "mu_x inf"},
               {0.9, 1.0, "mu_y 1"},  {0.9, -1e-9, "mu_y -1e-09"}, {0.9, NAN, "mu_y nan"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dl_err_clear();
        int rc = dl_gpa_check(bad[i].mx, bad[i].my);
        CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), bad[i].needle), "check(%g, %g): rc %d '%s'", bad[i].mx,
              bad[i].my, rc, dl_errmsg());
    }
    CHECK(dl_gpa_check(0.0, 0.0) == 0 && dl_gpa_check(0.999, 0.999) == 0, "valid coefficients refused");
    dl_train_cfg tc = train_cfg(DL_OPT_GPA, 1.0f, 0.7f);
    expect_open_fails(&tc, DL_EINVAL, "gpa mu_x 1", "trainer with mu_x 1");
    tc = train_cfg(DL_OPT_GPA, 0.9f, 1.0f);
    expect_open_fails(&tc, DL_EINVAL, "gpa mu_y 1", "trainer with mu_y 1");
    tc = train_cfg(7, 0.9f, 0.7f);
    expect_open_fails(&tc, DL_EINVAL, "unknown optimizer 7", "optimizer 7");
    tc = train_cfg(DL_OPT_GPA, 0.9f, 0.7f);
    tc.device = DL_DEVICE_CUDA; /* refused before any device is touched, with or without CUDA */
    expect_open_fails(&tc, DL_EINVAL, "cpu only", "gpa on cuda");
    tc = train_cfg(DL_OPT_GPA, 0.9f, 0.7f);
    tc.fleet = 2.0f;
    expect_open_fails(&tc, DL_EINVAL, "adam_fleet", "gpa with adam_fleet");
    /* y does not fit: its allocation is the third from the last of an open
     * (then the two batch buffers), counted on a successful open first */
    tc = train_cfg(DL_OPT_GPA, 0.9f, 0.7f);
    dl_trainer *t = NULL;
    dl_data *dd = open_data();
    long long c0 = dl_alloc_count();
    REQUIRE(dl_trainer_open(&tc, dd, &t) == 0, "open: %s", dl_errmsg());
    long long c1 = dl_alloc_count();
    dl_trainer_close(&t);
    dd = open_data();
    dl_err_clear();
    dl_alloc_fail_after(c1 - c0 - 2);
    int rc = dl_trainer_open(&tc, dd, &t);
    dl_alloc_fail_after(0);
    printf("gpa without memory for y -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_ENOMEM && t == NULL && strstr(dl_errmsg(), "gpa: the copy y"), "y out of memory: rc %d '%s'", rc,
          dl_errmsg());
    CHECK(fabs(dl_gpa_mu_x_from(0.9, 32) - 0.99671) < 1e-5 && dl_gpa_mu_x_from(0.9, 1) == 0.9 &&
              fabs(pow(dl_gpa_mu_x_from(0.9, 4), 4) - 0.9) < 1e-12,
          "mapping mu^(1/H): %.6f", dl_gpa_mu_x_from(0.9, 32));
    printf("ok: coefficient, optimizer, device, adam_fleet and memory refusals\n");
}

/* ---- checkpoints: a GPA run resumes bit for bit; the kinds do not mix */

static void test_checkpoints(void)
{
    char pg[600], pa[600];
    snprintf(pg, sizeof pg, "%s/gpa.ckpt", dir);
    snprintf(pa, sizeof pa, "%s/adamw.ckpt", dir);
    dl_train_cfg tg = train_cfg(DL_OPT_GPA, 0.9f, 0.7f), ta = train_cfg(DL_OPT_ADAMW, 0, 0);
    dl_trainer *a = open_trainer(&tg), *b = open_trainer(&tg), *w = open_trainer(&ta);
    double l;
    for (int s = 0; s < 4; s++) {
        dl_trainer_step(a, &l, NULL);
        dl_trainer_step(w, &l, NULL);
    }
    REQUIRE(dl_trainer_save(a, pg) == 0, "save gpa: %s", dl_errmsg());
    REQUIRE(dl_trainer_save(w, pa) == 0, "save adamw: %s", dl_errmsg());
    size_t n = dl_trainer_num_params(a);
    FILE *f = fopen(pg, "rb");
    REQUIRE(f, "open %s", pg);
    fseek(f, 0, SEEK_END);
    CHECK(ftell(f) == (long)(128 + 4 * n * sizeof(float)), "gpa checkpoint of %ld bytes", ftell(f));
    fclose(f);
    dl_alloc_fail_after(1); /* the resume's first allocation, before the file is read */
    dl_err_clear();
    int rc0 = dl_trainer_resume(b, pg);
    dl_alloc_fail_after(0);
    printf("gpa resume without memory -> %s: %s\n", dl_strerror(rc0), dl_errmsg());
    CHECK(rc0 == DL_ENOMEM && strstr(dl_errmsg(), "room to re-derive y") && dl_trainer_steps_done(b) == 0,
          "resume out of memory: rc %d '%s'", rc0, dl_errmsg());
    REQUIRE(dl_trainer_resume(b, pg) == 0, "resume gpa: %s", dl_errmsg());
    CHECK(dl_trainer_steps_done(b) == 4, "resumed at %lld", (long long)dl_trainer_steps_done(b));
    int same = 1;
    for (int s = 0; s < 5; s++) {
        double la = 0, lb = 0;
        dl_trainer_step(a, &la, NULL);
        dl_trainer_step(b, &lb, NULL);
        same &= la == lb;
    }
    CHECK(same && !memcmp(dl_gpt_params(dl_trainer_model(a)), dl_gpt_params(dl_trainer_model(b)), n * 4) &&
              !memcmp(dl_trainer_gpa_y(a), dl_trainer_gpa_y(b), n * 4),
          "gpa resume is not bit-exact");

    /* the kinds do not mix: both directions refused, the trainer untouched */
    dl_trainer *c = open_trainer(&ta);
    dl_err_clear();
    int rc = dl_trainer_resume(c, pg);
    printf("adamw run resuming a gpa checkpoint -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_EMISMATCH && strstr(dl_errmsg(), "checkpoint of a gpa run") &&
              strstr(dl_errmsg(), "--optimizer gpa") && dl_trainer_steps_done(c) == 0,
          "adamw <- gpa checkpoint: rc %d '%s'", rc, dl_errmsg());
    dl_err_clear();
    rc = dl_trainer_resume_optimizer(c, pg);
    CHECK(rc == DL_EMISMATCH, "adamw resume_optimizer <- gpa checkpoint: rc %d", rc);
    dl_trainer_close(&c);
    c = open_trainer(&tg);
    dl_err_clear();
    rc = dl_trainer_resume(c, pa);
    printf("gpa run resuming an adamw checkpoint -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_EMISMATCH && strstr(dl_errmsg(), "checkpoint of an adamw run") &&
              strstr(dl_errmsg(), "--optimizer adamw") && dl_trainer_steps_done(c) == 0,
          "gpa <- adamw checkpoint: rc %d '%s'", rc, dl_errmsg());
    dl_trainer_close(&c);

    /* another mu_y: x exact, y re-derived so that z is the file's */
    dl_train_cfg t5 = train_cfg(DL_OPT_GPA, 0.9f, 0.5f);
    c = open_trainer(&t5);
    REQUIRE(dl_trainer_resume(c, pg) == 0, "resume under mu_y 0.5: %s", dl_errmsg());
    dl_ckpt_state st;
    float *buf = malloc(4 * n * 4), *z1 = malloc(n * 4), *z2 = malloc(n * 4);
    REQUIRE(dl_ckpt_load_gpa(pg, dl_trainer_model_cfg(c), n, buf, buf + n, buf + 2 * n, buf + 3 * n, &st) == 0,
            "load_gpa: %s", dl_errmsg());
    CHECK(st.gpa_mu_y == 0.7f && st.step == 4, "file mu_y %g step %lld", (double)st.gpa_mu_y, (long long)st.step);
    dl_gpa_z(z1, buf, buf + 3 * n, n, 0.7f);
    dl_gpa_z(z2, dl_gpt_params(dl_trainer_model(c)), dl_trainer_gpa_y(c), n, 0.5f);
    double zd = 0;
    for (size_t i = 0; i < n; i++) zd = fmax(zd, fabs((double)z1[i] - z2[i]));
    CHECK(!memcmp(buf, dl_gpt_params(dl_trainer_model(c)), n * 4) && zd < 1e-6,
          "mu_y change: x differs or z moved by %g", zd);
    printf("resume under another mu_y: x exact, z kept within %.3g\n", zd);
    dl_trainer_close(&c);

    /* a header mu_y outside [0, 1) (offset 84: after the fixed fields and
     * the optimizer code): the header checksum (offset 96) catches the edit;
     * with the checksum zeroed, as in files from before it, the value check
     * refuses it as a format error */
    float bad = 1.5f;
    rc = poke_and_resume(&tg, pg, 84, &bad, sizeof bad);
    CHECK(rc == DL_ECORRUPT && strstr(dl_errmsg(), "header checksum"), "edited header: rc %d '%s'", rc, dl_errmsg());
    uint64_t zero = 0;
    rc = poke_and_resume(&tg, pg, 96, &zero, sizeof zero);
    printf("gpa checkpoint with mu_y 1.5 -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_EFORMAT && strstr(dl_errmsg(), "mu_y 1.5"), "bad mu_y: rc %d '%s'", rc, dl_errmsg());
    free(buf), free(z1), free(z2);
    dl_trainer_close(&a);
    dl_trainer_close(&b);
    dl_trainer_close(&w);
    unlink(pg);
    unlink(pa);
    printf("ok: gpa checkpoints (x, m, v, y) resume bit for bit; adamw <-> gpa refused both ways\n");
}

/* ---- the networked parameter interface: what a GPA learner pushes and
 * how an adopt moves x, y and z. Values are multiples of 1/8 (exact sums
 * and products by 0.25 / 0.75), so x and y compare with ==; z, recovered
 * through mu_y/(1-mu_y), within 1e-5. */

#define NP 3
static float dy(long k) { return (float)(k % 129 - 64) / 8.0f; }

static void fill(float *b, size_t n, long salt)
{
    for (size_t i = 0; i < n; i++) b[i] = dy((long)i * 13 + salt);
}

static void test_node_model(void)
{
    dl_model_config mc = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16};
    REQUIRE(dl_model_config_check(&mc) == 0, "cfg");
    dl_plan *plan = NULL;
    REQUIRE(dl_model_plan_open(&mc, NP, &plan) == 0, "plan: %s", dl_errmsg());
    size_t n = dl_plan_total_numel(plan), fm = dl_plan_max_fragment_numel(plan);
    const float mu_y = 0.75f;
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4), *z0 = malloc(n * 4), *x0 = malloc(n * 4),
          *y0 = malloc(n * 4), *gl = malloc(fm * 4), *g2 = malloc(fm * 4), *t1 = malloc(fm * 4), *t2 = malloc(fm * 4),
          *d = malloc(fm * 4);
    fill(x, n, 1);
    fill(y, n, 2);
    dl_node_model *gm = NULL;
    CHECK(dl_gpa_node_model_open(NULL, x, y, &gm) == DL_EINVAL && !gm, "NULL plan accepted");
    REQUIRE(dl_gpa_node_model_open(plan, x, y, &gm) == 0, "gpa model: %s", dl_errmsg());

    /* reads are x */
    const float *th = NULL;
    CHECK(gm->read_begin(gm->ctx, 1) == 0 && gm->read_end(gm->ctx, 1, &th) == 0, "read");
    dl_plan_gather(plan, 1, x, t1);
    CHECK(!memcmp(th, t1, dl_plan_fragment_numel(plan, 1) * 4), "read_end is not x");

    int modes[] = {DL_ADOPT_KEEP, DL_ADOPT_OVERWRITE, DL_ADOPT_MIX};
    const char *names[] = {"keep", "overwrite", "mix"};
    for (int mi = 0; mi < 3; mi++) {
        dl_mailbox *mb = NULL;
        REQUIRE(dl_mailbox_open(plan, &mb) == 0, "mailbox");
        dl_node_opts o = {.plan = plan, .model = gm, .adopt = modes[mi], .alpha = 0.25f};
        dl_node *node = NULL;
        REQUIRE(dl_node_open(&o, mb, &node) == 0, "node: %s", dl_errmsg());
        /* the initial fetch (a rebase): x = y = z = g exactly */
        for (int p = 0; p < NP; p++) {
            size_t k = dl_plan_fragment_numel(plan, p);
            fill(gl, k, 100 + p);
            CHECK(dl_node_adopt(node, p, 1, DL_UPDATE_FETCHED, gl) == 1, "fetch %d", p);
            dl_plan_gather(plan, p, x, t1);
            dl_plan_gather(plan, p, y, t2);
            CHECK(!memcmp(t1, gl, k * 4) && !memcmp(t2, gl, k * 4), "%s: rebase did not set x = y = g (p %d)",
                  names[mi], p);
        }
        dl_gpa_z(z, x, y, n, mu_y);
        CHECK(!memcmp(z, x, n * 4), "%s: z != g after the rebase", names[mi]);
        /* "train": x and y move apart (z with them) */
        for (size_t i = 0; i < n; i++) {
            x[i] += dy((long)i * 7 + 3) / 8.0f;
            y[i] += dy((long)i * 5 + 1) / 4.0f;
        }
        memcpy(x0, x, n * 4);
        memcpy(y0, y, n * 4);
        dl_gpa_z(z0, x, y, n, mu_y);
        /* a push is base - x */
        dl_node_delta(node, 0, d);
        fill(gl, dl_plan_fragment_numel(plan, 0), 100);
        dl_plan_gather(plan, 0, x, t1);
        int okd = 1;
        for (size_t i = 0; i < dl_plan_fragment_numel(plan, 0); i++) okd &= d[i] == gl[i] - t1[i];
        CHECK(okd, "%s: the delta is not base - x", names[mi]);
        /* a merge result (version 2) for fragment 1 */
        int p = 1;
        size_t k = dl_plan_fragment_numel(plan, p);
        fill(g2, k, 300);
        fill(gl, k, 101); /* the base adopted at the fetch */
        CHECK(dl_node_adopt(node, p, 2, DL_UPDATE_NORMAL, g2) == 1, "%s: adopt", names[mi]);
        dl_plan_gather(plan, p, x, t1);
        dl_plan_gather(plan, p, y, t2);
        float *ex = malloc(k * 4), *ey = malloc(k * 4), *ez = malloc(k * 4), *px = malloc(k * 4), *py = malloc(k * 4),
              *pz = malloc(k * 4), *zn = malloc(k * 4);
        dl_plan_gather(plan, p, x0, px);
        dl_plan_gather(plan, p, y0, py);
        dl_plan_gather(plan, p, z0, pz);
        for (size_t i = 0; i < k; i++) {
            if (modes[mi] == DL_ADOPT_KEEP) { /* no push since the fetch: ref = the base */
                float sh = g2[i] - gl[i];
                ex[i] = px[i] + sh, ey[i] = py[i] + sh, ez[i] = pz[i] + sh;
            } else if (modes[mi] == DL_ADOPT_OVERWRITE) {
                ex[i] = ey[i] = ez[i] = g2[i];
            } else {
                ex[i] = 0.25f * px[i] + 0.75f * g2[i], ey[i] = 0.25f * py[i] + 0.75f * g2[i];
                ez[i] = 0.25f * pz[i] + 0.75f * g2[i];
            }
        }
        dl_gpa_z(zn, t1, t2, k, mu_y);
        double zd = 0;
        for (size_t i = 0; i < k; i++) zd = fmax(zd, fabs((double)zn[i] - ez[i]));
        CHECK(!memcmp(t1, ex, k * 4) && !memcmp(t2, ey, k * 4), "%s: x or y not as the rule says", names[mi]);
        CHECK(zd < 1e-5, "%s: z off its rule by %g", names[mi], zd);
        printf("%s adopt: x, y exact; z within %.2g of its rule\n", names[mi], zd);
        /* the other fragments did not move */
        int others = 1;
        for (int q = 0; q < NP; q++) {
            if (q == p) continue;
            size_t kq = dl_plan_fragment_numel(plan, q);
            float *a1 = malloc(kq * 4), *a2 = malloc(kq * 4);
            dl_plan_gather(plan, q, x, a1);
            dl_plan_gather(plan, q, x0, a2);
            others &= !memcmp(a1, a2, kq * 4);
            dl_plan_gather(plan, q, y, a1);
            dl_plan_gather(plan, q, y0, a2);
            others &= !memcmp(a1, a2, kq * 4);
            free(a1), free(a2);
        }
        CHECK(others, "%s: an adopt of fragment %d moved another fragment", names[mi], p);
        free(ex), free(ey), free(ez), free(px), free(py), free(pz), free(zn);
        dl_node_close(&node);
        dl_mailbox_close(&mb);
    }
    dl_gpa_node_model_close(&gm);
    dl_gpa_node_model_close(&gm);
    CHECK(gm == NULL, "close NULLs");
    free(x), free(y), free(z), free(z0), free(x0), free(y0), free(gl), free(g2), free(t1), free(t2), free(d);
    dl_plan_close(&plan);
    printf("ok: a GPA node pushes base - x; rebase sets x = y = z = g, keep shifts all three, mix pulls all three\n");
}

int main(void)
{
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    REQUIRE(f, "corpus");
    for (int i = 1; i <= 400; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog %d\n", i, i * 7919 % 1000);
    fclose(f);
    REQUIRE(dl_model_config_check(&CFG) == 0, "config: %s", dl_errmsg());

    test_kernel_reference();
    test_trainer_reference();
    test_adamw_limit();
    test_refusals();
    test_checkpoints();
    test_node_model();

    unlink(corpus);
    rmdir(dir);
    printf("test_gpa: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
