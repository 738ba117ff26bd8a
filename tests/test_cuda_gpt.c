/* Parity of the device-resident GPT (gpt/gpt_cuda.c) with the CPU model and
 * with the PyTorch reference tests/data/gpt_ref.bin. Exits 77 (CTest: Skipped) without a device. */
#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "gpt/gpt.h"
#include "gpt/gpt_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances:
 *   CPU parity (same weights, same batch, fp32 on both sides):
 *     loss |cuda - cpu| / cpu <= 1e-5; logits max|diff|/max|cpu| <= 1e-4;
 *     every gradient tensor max|diff|/max|cpu| <= 1e-4; 5 AdamW steps on
 *     fresh batches: each step's loss and gradient norm within 1e-4 relative.
 *   PyTorch reference (float64 torch): as tests/test_gpt.c, 1e-4 for the loss,
 *     the logits, every gradient and each AdamW step's loss.
 *   Copies (get/set params, fragment gather/scatter) and repeatability of a
 *     step on the device: bit-identical. */
#define TOL_LOSS 1e-5
#define TOL_LOGITS 1e-4
#define TOL_GRAD 1e-4
#define TOL_STEP 1e-4
#define TOL_REF 1e-4

#include "tests/check.h"

/* A call that must succeed; otherwise the rest of the test is moot. */
#define CU(call)                                                                                                  \
    do {                                                                                                          \
        int cu_rc_ = (call);                                                                                      \
        if (cu_rc_ < 0) {                                                                                         \
            printf("FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, dl_strerror(cu_rc_), dl_errmsg());   \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

/* max |a-b| / max |b|; NaN in a counts as infinite error. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || d != d) num = d != d ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 0 ? den : 1.0);
}

/* Every tensor's gradient of the CUDA model vs a reference buffer. */
static double compare_grads(const dl_tensor *tab, int nt, const float *got, const float *ref, double tol,
                            const char *vs)
{
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < nt; i++) {
        double e = rel_err(got + tab[i].offset, ref + tab[i].offset, tab[i].numel);
        if (e > worst || e != e) {
            worst = e;
            worst_name = tab[i].name;
        }
        CHECK(e <= tol, "gradient of %s vs %s: max|diff|/max|ref| %.3e > %.0e", tab[i].name, vs, e, tol);
    }
    printf("gradients vs %s: %d tensors, worst max|diff|/max|ref| %.2e in %s (tol %.0e)\n", vs, nt, worst,
           worst_name, tol);
    return worst;
}

static void random_tokens(dl_rng *r, int32_t *x, size_t n, int V)
{
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)dl_rng_below(r, (uint64_t)V);
}

/* ---- 1. the whole training step against the CPU model */

static void test_vs_cpu(void)
{
    /* V = 100 pads to Vp = 128: the padded-vocab path on both sides */
    dl_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 32, .vocab = 100};
    const int B = 3, T = 32;
    CU(dl_model_config_check(&cfg));
    dl_gpt *cpu = NULL;
    dl_gptc *gpu = NULL;
    CU(dl_gpt_open(&cfg, B, &cpu));
    CU(dl_gptc_open(&cfg, B, &gpu));
    size_t np = dl_gpt_num_params(cpu), BT = (size_t)B * T, Vp = (size_t)cfg.padded_vocab;
    CHECK(dl_gptc_num_params(gpu) == np, "param count %zu vs cpu %zu", dl_gptc_num_params(gpu), np);
    printf("model: L=%d NH=%d C=%d T=%d V=%d (Vp=%d) B=%d, %zu params, %.1f MiB on the device\n", cfg.n_layer,
           cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab, cfg.padded_vocab, B, np,
           (double)dl_gptc_device_bytes(gpu) / (1 << 20));
    int nt;
    const dl_tensor *tab = dl_gptc_tensors(gpu, &nt);

    /* same weights: dl_gptc_init must equal dl_gpt_init bit for bit */
    dl_gpt_init(cpu, 7);
    CU(dl_gptc_init(gpu, 7));
    float *hp = dl_xmalloc(np * 4), *hg = dl_xmalloc(np * 4), *hg2 = dl_xmalloc(np * 4);
    CU(dl_gptc_get_params(gpu, hp));
    CHECK(memcmp(hp, dl_gpt_params(cpu), np * 4) == 0, "dl_gptc_init differs from dl_gpt_init");

    dl_rng r;
    dl_rng_seed(&r, 99);
    int32_t *inp = dl_xmalloc(BT * 4), *tgt = dl_xmalloc(BT * 4);
    random_tokens(&r, inp, BT, cfg.vocab);
    random_tokens(&r, tgt, BT, cfg.vocab);

    /* forward */
    double lc = dl_gpt_forward(cpu, inp, tgt, B, T), lg = -1.0;
    CU(dl_gptc_forward(gpu, inp, tgt, B, T, &lg));
    double el = fabs(lg - lc) / lc;
    printf("loss: cuda %.8f cpu %.8f rel err %.2e (tol %.0e)\n", lg, lc, el, TOL_LOSS);
    CHECK(el <= TOL_LOSS, "loss rel err %.3e", el);
    float *logits = dl_xmalloc(BT * Vp * 4);
    CU(dl_gptc_get_logits(gpu, logits));
    double elog = rel_err(logits, dl_gpt_logits(cpu), BT * Vp);
    printf("logits: max|diff|/max|cpu| %.2e (tol %.0e)\n", elog, TOL_LOGITS);
    CHECK(elog <= TOL_LOGITS, "logits rel err %.3e", elog);

    /* backward */
    dl_gpt_zero_grad(cpu);
    dl_gpt_backward(cpu);
    CU(dl_gptc_zero_grad(gpu));
    CU(dl_gptc_backward(gpu));
    CU(dl_gptc_get_grads(gpu, hg));
    compare_grads(tab, nt, hg, dl_gpt_grads(cpu), TOL_GRAD, "cpu");
    /* padded wte rows never receive gradient */
    size_t pad0 = (size_t)cfg.vocab * cfg.n_embd, pad1 = Vp * cfg.n_embd, nonzero = 0;
    for (size_t i = pad0; i < pad1; i++) nonzero += hg[tab[0].offset + i] != 0.0f;
    CHECK(nonzero == 0, "%zu gradient entries of padded wte rows are nonzero", nonzero);

    /* repeatability: the same step again gives bit-identical gradients */
    CU(dl_gptc_forward(gpu, inp, tgt, B, T, &lg));
    CU(dl_gptc_zero_grad(gpu));
    CU(dl_gptc_backward(gpu));
    CU(dl_gptc_get_grads(gpu, hg2));
    size_t mism = 0;
    for (size_t i = 0; i < np; i++) mism += memcmp(&hg[i], &hg2[i], 4) != 0;
    printf("repeat step: %zu of %zu gradient entries differ (tol: bit-identical)\n", mism, np);
    CHECK(mism == 0, "the device step is not deterministic: %zu gradients differ", mism);

    /* forward without targets: loss 0, same logits */
    double l0 = -1.0;
    float *logits2 = dl_xmalloc(BT * Vp * 4);
    CU(dl_gptc_forward(gpu, inp, NULL, B, T, &l0));
    CU(dl_gptc_get_logits(gpu, logits2));
    CHECK(l0 == 0.0 && memcmp(logits, logits2, BT * Vp * 4) == 0, "forward without targets: loss %g or logits", l0);

    /* bad tokens are refused, nothing runs */
    inp[5] = cfg.vocab;
    int rc = dl_gptc_forward(gpu, inp, tgt, B, T, &l0);
    printf("out-of-vocab token -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), "inp[5]"), "token %d accepted: rc %d", cfg.vocab, rc);
    inp[5] = 1;
    tgt[7] = -1;
    rc = dl_gptc_forward(gpu, inp, tgt, B, T, &l0);
    CHECK(rc == DL_EINVAL && strstr(dl_errmsg(), "targets[7]"), "target -1 accepted: rc %d", rc);
    tgt[7] = 1;

    /* 5 AdamW steps on fresh batches, both models from the same start */
    CU(dl_gptc_set_params(gpu, dl_gpt_params(cpu)));
    CU(dl_gptc_reset_optimizer(gpu));
    memset(dl_gpt_adam_m(cpu), 0, np * 4);
    memset(dl_gpt_adam_v(cpu), 0, np * 4);
    dl_adamw_cfg ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    double worst = 0.0;
    for (int s = 1; s <= 5; s++) {
        random_tokens(&r, inp, BT, cfg.vocab);
        random_tokens(&r, tgt, BT, cfg.vocab);
        double a = dl_gpt_forward(cpu, inp, tgt, B, T), b = -1.0;
        dl_gpt_zero_grad(cpu);
        dl_gpt_backward(cpu);
        float na = dl_gpt_adamw_step(cpu, &ac, 1e-3f, s), nb = -1.0f;
        CU(dl_gptc_forward(gpu, inp, tgt, B, T, &b));
        CU(dl_gptc_zero_grad(gpu));
        CU(dl_gptc_backward(gpu));
        CU(dl_gptc_adamw_step(gpu, &ac, 1e-3f, s, &nb));
        double e = fabs(b - a) / a, en = fabs((double)nb - na) / na;
        worst = fmax(worst, fmax(e, en));
        printf("  adamw step %d: loss cuda %.7f cpu %.7f rel %.2e; grad norm cuda %.6f cpu %.6f rel %.2e\n", s, b,
               a, e, nb, na, en);
        CHECK(e <= TOL_STEP, "step %d loss rel err %.3e", s, e);
        CHECK(en <= TOL_STEP, "step %d grad norm rel err %.3e", s, en);
    }
    CU(dl_gptc_get_params(gpu, hp));
    double ep = rel_err(hp, dl_gpt_params(cpu), np);
    printf("adamw: 5 steps, worst loss/norm rel err %.2e (tol %.0e); params after max|diff|/max|cpu| %.2e\n", worst,
           TOL_STEP, ep);
    CHECK(ac.grad_clip > 0 && ep < 1e-2, "parameters drifted apart after 5 steps: %.3e", ep);

    /* host copies: set/get round trip and fragment gather/scatter */
    for (size_t i = 0; i < np; i++) hp[i] = (float)i * 1e-3f;
    CU(dl_gptc_set_params(gpu, hp));
    CU(dl_gptc_get_params(gpu, hg));
    CHECK(memcmp(hp, hg, np * 4) == 0, "set/get params round trip differs");
    /* P = 3: whole tensors; P = 8: the target (13792 floats) is below the MLP
     * matrices (16384), which the plan cuts into row blocks */
    for (int P = 3; P <= 8; P += 5) {
        dl_plan *plan = NULL;
        CU(dl_model_plan_open(&cfg, P, &plan));
        CHECK((dl_plan_nblocks(plan) > dl_plan_ntensors(plan)) == (P == 8), "P=%d: %d blocks for %d tensors", P,
              dl_plan_nblocks(plan), dl_plan_ntensors(plan));
        for (int p = 0; p < P; p++) {
            size_t fn = dl_plan_fragment_numel(plan, p);
            float *want = dl_xmalloc(fn * 4), *got = dl_xmalloc(fn * 4);
            dl_plan_gather(plan, p, hp, want);
            CU(dl_gptc_gather(gpu, plan, p, got));
            CHECK(memcmp(want, got, fn * 4) == 0, "gather of fragment %d differs from dl_plan_gather", p);
            for (size_t i = 0; i < fn; i++) got[i] = -got[i] - 1.0f;
            CU(dl_gptc_scatter(gpu, plan, p, got));
            dl_plan_scatter(plan, p, got, hp); /* the expected buffer */
            CU(dl_gptc_get_params(gpu, hg));
            CHECK(memcmp(hp, hg, np * 4) == 0, "scatter of fragment %d: device params differ from dl_plan_scatter", p);
            printf("P=%d fragment %d: %zu floats gathered and scattered, bit-identical to dl_plan_gather/scatter\n", P,
                   p, fn);
            free(want), free(got);
        }
        dl_plan_close(&plan);
    }

    dl_gptc_close(&gpu);
    dl_gptc_close(&gpu); /* safe twice */
    CHECK(gpu == NULL, "close must NULL the handle");
    dl_gpt_close(&cpu);
    free(hp), free(hg), free(hg2), free(inp), free(tgt), free(logits), free(logits2);
}

/* ---- 2. the PyTorch reference on the CUDA path (checks of tests/test_gpt.c) */

static void *read_exact(FILE *f, size_t n)
{
    void *p = malloc(n);
    if (!p || fread(p, 1, n, f) != n) {
        printf("FAIL: reference file truncated\n");
        exit(1);
    }
    return p;
}

static void test_vs_torch(void)
{
    const char *src = getenv("DLOCO_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/gpt_ref.bin", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FAIL: cannot open %s\n", path);
        failures++;
        return;
    }
    int32_t *hdr = read_exact(f, 16 * 4);
    float *hpar = read_exact(f, 8 * 4);
    if (hdr[0] != 0x46524C44 || hdr[1] != 1) {
        printf("FAIL: %s is not a version-1 reference file\n", path);
        exit(1);
    }
    dl_model_config cfg = {.n_layer = hdr[2], .n_head = hdr[3], .n_embd = hdr[4], .seq_len = hdr[5], .vocab = hdr[6]};
    int B = hdr[7], nsteps = hdr[8];
    size_t np = (size_t)hdr[9];
    int T = cfg.seq_len, V = cfg.vocab;
    size_t BT = (size_t)B * T;
    float *params = read_exact(f, np * 4);
    int32_t *inp = read_exact(f, BT * 4), *tgt = read_exact(f, BT * 4);
    float *logits = read_exact(f, BT * V * 4);
    double *loss = read_exact(f, 8);
    float *grads = read_exact(f, np * 4);
    double *losses = read_exact(f, (size_t)nsteps * 8);
    fclose(f);

    dl_gptc *g = NULL;
    CU(dl_model_config_check(&cfg));
    CU(dl_gptc_open(&cfg, B, &g));
    CHECK(dl_gptc_num_params(g) == np, "parameter count %zu, reference %zu", dl_gptc_num_params(g), np);
    CHECK(cfg.padded_vocab == V, "the reference has no vocab padding");
    if (failures) exit(1);
    printf("torch reference: L=%d NH=%d C=%d T=%d V=%d B=%d, %d AdamW steps\n", cfg.n_layer, cfg.n_head,
           cfg.n_embd, T, V, B, nsteps);
    CU(dl_gptc_set_params(g, params));

    double l = -1.0;
    CU(dl_gptc_forward(g, inp, tgt, B, T, &l));
    double lerr = fabs(l - *loss) / fabs(*loss);
    printf("loss: cuda %.7f torch %.7f rel err %.2e (tol %.0e)\n", l, *loss, lerr, TOL_REF);
    CHECK(lerr <= TOL_REF, "loss relative error %.3e", lerr);
    float *lg = dl_xmalloc(BT * V * 4);
    CU(dl_gptc_get_logits(g, lg));
    double logit_err = rel_err(lg, logits, BT * V);
    printf("logits: max|diff|/max|ref| %.2e (tol %.0e)\n", logit_err, TOL_REF);
    CHECK(logit_err <= TOL_REF, "logits error %.3e", logit_err);

    CU(dl_gptc_zero_grad(g));
    CU(dl_gptc_backward(g));
    float *hg = dl_xmalloc(np * 4);
    CU(dl_gptc_get_grads(g, hg));
    int nt;
    const dl_tensor *tab = dl_gptc_tensors(g, &nt);
    compare_grads(tab, nt, hg, grads, TOL_REF, "torch");

    CU(dl_gptc_set_params(g, params));
    CU(dl_gptc_reset_optimizer(g));
    dl_adamw_cfg ac = {.beta1 = hpar[1], .beta2 = hpar[2], .eps = hpar[3], .weight_decay = hpar[4],
                       .grad_clip = hpar[5]};
    double worst = 0.0;
    for (int s = 0; s < nsteps; s++) {
        double ls = -1.0;
        CU(dl_gptc_forward(g, inp, tgt, B, T, &ls));
        CU(dl_gptc_zero_grad(g));
        CU(dl_gptc_backward(g));
        CU(dl_gptc_adamw_step(g, &ac, hpar[0], s + 1, NULL));
        double e = fabs(ls - losses[s]) / fabs(losses[s]);
        worst = fmax(worst, e);
        printf("  step %2d: cuda %.6f torch %.6f rel err %.2e\n", s, ls, losses[s], e);
        CHECK(e <= TOL_REF, "AdamW step %d loss relative error %.3e", s, e);
    }
    CHECK(losses[nsteps - 1] < losses[0] - 0.5, "reference losses must fall (sanity of the file)");
    printf("adamw vs torch: %d steps, worst loss rel err %.2e (tol %.0e)\n", nsteps, worst, TOL_REF);
    dl_gptc_close(&g);
    free(hdr), free(hpar), free(params), free(inp), free(tgt), free(logits), free(loss), free(grads);
    free(losses), free(lg), free(hg);
}

int main(void)
{
    if (!dl_cuda_available()) {
        printf("dl_cuda_available() = 0: %s\n", dl_errmsg());
        /* the no-device path of the model itself: a clean error, no handle */
        dl_model_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 10};
        dl_gptc *g = (dl_gptc *)&cfg; /* must be overwritten with NULL */
        int rc = dl_gptc_open(&cfg, 2, &g);
        printf("dl_gptc_open -> %s: %s\n", dl_strerror(rc), dl_errmsg());
        if (rc == 0) {
            /* a device exists but cannot run this build's kernels (arch) */
            printf("a device exists but is not usable by this build\n");
            dl_gptc_close(&g);
        } else {
            CHECK(g == NULL && (rc == DL_ENODEV || rc == DL_ECUDA), "dl_gptc_open without a device: rc %d", rc);
        }
        cfg.vocab = 1;
        rc = dl_gptc_open(&cfg, 2, &g);
        CHECK(rc == DL_EINVAL && g == NULL, "bad config must fail with DL_EINVAL before touching CUDA: rc %d", rc);
        dl_cuda_thread_release();
        if (failures) return 1;
        const char *req = getenv("DLOCO_REQUIRE_CUDA");
        if (req && strcmp(req, "1") == 0) {
            printf("FAIL: DLOCO_REQUIRE_CUDA=1 but no usable CUDA device\n");
            return 1;
        }
        printf("SKIP: no CUDA device — CUDA GPT parity (vs CPU model, vs PyTorch reference) did not run\n");
        return 77;
    }
    char name[256];
    CU(dl_cuda_device_name(name, sizeof name));
    printf("device: %s\n", name);
    test_vs_cpu();
    test_vs_torch();
    dl_cuda_thread_release();
    printf("%s\n", failures ? "test_cuda_gpt: FAILED" : "test_cuda_gpt: all checks passed");
    return failures ? 1 : 0;
}
