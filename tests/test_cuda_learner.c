/* The CUDA learner against the CPU reference: fragment copies (xfer_cuda.c) vs the host interface, a deferred
 * node over them vs an immediate one, trainer steps and checkpoints on both devices. Exits 77 without a device. */
#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "learner/comms.h"
#include "learner/mailbox.h"
#include "gpt/gpt.h"
#include "gpt/gpt_cuda.h"
#include "learner/node.h"
#include "gpt/train.h"
#include "gpt/xfer_cuda.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tolerances:
 *   fragment reads (device -> pinned host) vs dl_plan_gather: bit-identical
 *   apply (axpby on the device) vs the host interface: within 1 ulp (both
 *     compute fmaf(a, theta, b*in), so exact is expected; the count is printed)
 *   a deferred node over the device vs an immediate node over host memory:
 *     pushes bit-identical (one step later), parameters after every adopt
 *     within 1 ulp
 *   trainer, fp32 matmuls: each of 5 steps' loss and gradient norm within 1e-4
 *     relative of the CPU trainer's (as tests/test_cuda_gpt.c), eval too;
 *     checkpoints move between devices bit for bit. */
#define TOL_ULP 1
#define TOL_STEP 1e-4

#include "tests/check.h"
#include "tests/push_pair.h"

#define CU(call)                                                                                                  \
    do {                                                                                                          \
        int cu_rc_ = (call);                                                                                      \
        if (cu_rc_ < 0) {                                                                                         \
            printf("FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, dl_strerror(cu_rc_), dl_errmsg());   \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

#define P 4
#define H 4
#define TOK 64

/* V = 100 pads to Vp = 128: padded rows travel in the wte fragment too */
static dl_model_config CFG = {.n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 32, .vocab = 100};
static size_t total;

/* Distance in units in the last place; NaN against anything else is huge. */
static uint32_t ulps(float a, float b)
{
    if (memcmp(&a, &b, sizeof a) == 0) return 0;
    if (a != a || b != b) return UINT32_MAX;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia; /* monotonic integer order of the floats */
    if (ib < 0) ib = INT32_MIN - ib;
    int64_t d = (int64_t)ia - ib;
    return (uint32_t)(d < 0 ? -d : d);
}

static uint32_t max_ulps(const float *a, const float *b, size_t n, size_t *exact)
{
    uint32_t worst = 0;
    size_t same = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = ulps(a[i], b[i]);
        same += u == 0;
        if (u > worst) worst = u;
    }
    if (exact) *exact = same;
    return worst;
}

static float dyadic(long k) { return (float)(k % 129 - 64) / 8.0f; }

/* ---- 1. the fragment copies against the host interface on the same parameters */

static void test_xfer(void)
{
    dl_gptc *g = NULL;
    CU(dl_gptc_open(&CFG, 2, &g));
    CU(dl_gptc_init(g, 5));
    size_t np = dl_gptc_num_params(g);
    float *theta = dl_xmalloc(np * 4), *dev = dl_xmalloc(np * 4);
    CU(dl_model_init_params(&CFG, 5, theta));
    dl_plan *plan = NULL;
    CU(dl_model_plan_open(&CFG, 5, &plan));
    dl_gptc_xfer *x = NULL;
    CU(dl_gptc_xfer_open(g, plan, &x));
    printf("xfer: %d fragments, %.2f MiB device + %.2f MiB pinned host\n", dl_plan_P(plan),
           (double)dl_gptc_xfer_device_bytes(x) / (1 << 20), (double)dl_gptc_xfer_host_bytes(x) / (1 << 20));
    dl_node_model *hm = NULL;
    CU(dl_node_host_model_open(plan, theta, 0, &hm));
    const dl_node_model *xm = dl_gptc_xfer_model(x);
    CHECK(xm->deferred == 1, "the GPU interface is deferred");

    /* every fragment in flight at once, then each read back: bit-identical */
    int P5 = dl_plan_P(plan);
    for (int p = 0; p < P5; p++) CU(xm->read_begin(xm->ctx, p));
    for (int p = 0; p < P5; p++) {
        const float *a = NULL, *b = NULL;
        CU(xm->read_end(xm->ctx, p, &a));
        CU(hm->read_begin(hm->ctx, p));
        CU(hm->read_end(hm->ctx, p, &b));
        size_t k = dl_plan_fragment_numel(plan, p), ex;
        uint32_t u = max_ulps(a, b, k, &ex);
        CHECK(u == 0, "read of fragment %d: %zu of %zu floats differ from dl_plan_gather", p, k - ex, k);
    }
    printf("xfer reads: %d fragments, all in flight together, bit-identical to dl_plan_gather\n", P5);

    /* apply with every (a, b) of the adopt modes, twice in a row per fragment
     * (the second reuses the staging buffers while the first may still run) */
    dl_rng r;
    dl_rng_seed(&r, 3);
    size_t kmax = dl_plan_max_fragment_numel(plan);
    float *in = dl_xmalloc(kmax * 4), *in2 = dl_xmalloc(kmax * 4);
    const float ab[3][2] = {{0.0f, 1.0f}, {0.3f, 0.7f}, {1.0f, 1.0f}};
    for (int round = 0; round < 3; round++) {
        for (int p = 0; p < P5; p++) {
            size_t k = dl_plan_fragment_numel(plan, p);
            for (size_t i = 0; i < k; i++) in[i] = dl_rng_normal(&r) * 0.02f;
            for (size_t i = 0; i < k; i++) in2[i] = dl_rng_normal(&r) * 1e-3f;
            float a = ab[(round + p) % 3][0], b = ab[(round + p) % 3][1];
            CU(xm->apply(xm->ctx, p, a, b, in));
            CU(hm->apply(hm->ctx, p, a, b, in));
            memset(in, 0xff, k * 4); /* the interface copied `in` before returning */
            CU(xm->apply(xm->ctx, p, 1.0f, 1.0f, in2));
            CU(hm->apply(hm->ctx, p, 1.0f, 1.0f, in2));
        }
        CU(dl_gptc_get_params(g, dev));
        size_t ex;
        uint32_t u = max_ulps(dev, theta, np, &ex);
        printf("xfer apply round %d: max %u ulp vs the host interface, %zu of %zu exact (tol %d ulp)\n", round, u, ex,
               np, TOL_ULP);
        CHECK(u <= TOL_ULP, "apply round %d: %u ulp", round, u);
    }
    /* a read right after an apply sees it (stream order) */
    for (size_t i = 0; i < dl_plan_fragment_numel(plan, 2); i++) in[i] = dyadic((long)i);
    CU(xm->apply(xm->ctx, 2, 0.0f, 1.0f, in));
    CU(xm->read_begin(xm->ctx, 2));
    const float *back = NULL;
    CU(xm->read_end(xm->ctx, 2, &back));
    CHECK(!memcmp(back, in, dl_plan_fragment_numel(plan, 2) * 4), "a read after an overwrite returns it");
    CU(hm->apply(hm->ctx, 2, 0.0f, 1.0f, in));

    /* a NaN on the device does not survive an overwrite */
    int ns;
    const dl_plan_span *sp = dl_plan_fragment_spans(plan, 0, &ns);
    CU(dl_gptc_get_params(g, dev));
    dev[sp[0].src] = NAN;
    CU(dl_gptc_set_params(g, dev));
    for (size_t i = 0; i < dl_plan_fragment_numel(plan, 0); i++) in[i] = dyadic((long)i * 3);
    CU(xm->apply(xm->ctx, 0, 0.0f, 1.0f, in));
    CU(hm->apply(hm->ctx, 0, 0.0f, 1.0f, in));
    CU(dl_gptc_get_params(g, dev));
    CHECK(max_ulps(dev, theta, np, NULL) <= TOL_ULP, "overwrite over a NaN: device differs from the host");

    /* a plan of another model is refused */
    dl_model_config other = CFG;
    other.n_embd = 32;
    dl_plan *bad = NULL;
    CU(dl_model_plan_open(&other, 5, &bad));
    dl_gptc_xfer *y = (dl_gptc_xfer *)&other;
    int rc = dl_gptc_xfer_open(g, bad, &y);
    printf("xfer with another model's plan -> %s: %s\n", dl_strerror(rc), dl_errmsg());
    CHECK(rc == DL_EINVAL && y == NULL, "foreign plan: rc %d", rc);
    dl_plan_close(&bad);

    dl_gptc_xfer_close(&x);
    dl_gptc_xfer_close(&x);
    CHECK(x == NULL, "close NULLs");
    dl_node_host_model_close(&hm);
    dl_plan_close(&plan);
    dl_gptc_close(&g);
    free(theta), free(dev), free(in), free(in2);
}

/* ---- 2. a deferred node over the device vs an immediate node over host memory */

static dl_plan *plan4;

static void global_of(int p, uint64_t version, float *g)
{
    size_t n = dl_plan_fragment_numel(plan4, p);
    for (size_t i = 0; i < n; i++) g[i] = dyadic((long)(i * 13 + (size_t)p * 5 + version * 11));
}

static void train_step(float *theta, int64_t step)
{
    for (size_t i = 0; i < total; i++) theta[i] += (float)((long)(i * 7 + (size_t)step * 3) % 5 - 2) / 8.0f;
}

static dl_mailbox *open_mailbox(void)
{
    dl_mailbox *c = NULL;
    REQUIRE(dl_mailbox_open(plan4, &c) == 0, "dl_mailbox_open: %s", dl_errmsg());
    return c;
}


static void test_node_over_device(int mode, const char *name)
{
    dl_gptc *g = NULL;
    CU(dl_gptc_open(&CFG, 1, &g));
    float *theta = dl_xcalloc(total, 4), *dev = dl_xmalloc(total * 4);
    CU(dl_gptc_set_params(g, theta));
    dl_gptc_xfer *x = NULL;
    CU(dl_gptc_xfer_open(g, plan4, &x));
    dl_mailbox *ca = open_mailbox(), *cb = open_mailbox();
    dl_node_opts oa = {.plan = plan4, .params = theta, .adopt = mode, .alpha = 0.25f};
    dl_node_opts ob = {.plan = plan4, .model = dl_gptc_xfer_model(x), .adopt = mode, .alpha = 0.25f};
    dl_node *na = NULL, *nb = NULL;
    REQUIRE(dl_node_open(&oa, ca, &na) == 0 && dl_node_open(&ob, cb, &nb) == 0, "node open: %s", dl_errmsg());
    for (int p = 0; p < P; p++) put_both(ca, cb, plan4, global_of, p, 1, 1);
    CU(dl_node_poll(na));
    CU(dl_node_poll(nb));
    CU(dl_gptc_get_params(g, dev));
    CHECK(!memcmp(dev, theta, total * 4), "%s: device parameters == host after the initial fetch", name);

    taken prev[P], cura[P], curb[P];
    for (int p = 0; p < P; p++) {
        prev[p].d = dl_mailbox_buf_alloc(ca);
        cura[p].d = dl_mailbox_buf_alloc(ca);
        curb[p].d = dl_mailbox_buf_alloc(cb);
        prev[p].got = 0;
    }
    const int adopt_at = H + 1, forced_at = 2 * H + 2;
    int compared = 0, bad = 0;
    uint32_t worst = 0;
    for (int64_t s = 1; s <= 3 * H; s++) {
        /* "training": the same step on both copies; the device's comes by a
         * synchronous upload queued after the snapshot of the previous step */
        train_step(theta, s);
        CU(dl_gptc_set_params(g, theta));
        double loss = 2.0 + 0.125 * (double)s;
        int ra = dl_node_after_step(na, s, H, TOK, loss, 0.0), rb = dl_node_after_step(nb, s, H, TOK, loss, 0.0);
        CHECK(ra == rb && ra >= 0, "step %lld: %d vs %d pushes", (long long)s, ra, rb);
        take_all(ca, cura, P);
        take_all(cb, curb, P);
        for (int p = 0; p < P; p++) {
            if (!same_push(&prev[p], &curb[p], plan4, p)) {
                bad++;
                CHECK(0, "%s step %lld: deferred device push of %d differs from the host push of the step before",
                      name, (long long)s, p);
            }
            compared += prev[p].got;
            taken t = prev[p];
            prev[p] = cura[p];
            cura[p] = t;
        }
        if (s == adopt_at || s == forced_at) {
            const int q = s == adopt_at ? 1 : 2, forced = s == forced_at;
            put_both(ca, cb, plan4, global_of, q, 5 + (uint64_t)s, forced);
            CHECK(dl_node_poll(na) == 1 && dl_node_poll(nb) == 1, "update of %d adopted", q);
            take_all(cb, curb, P);
            if (!forced) {
                CHECK(same_push(&prev[q], &curb[q], plan4, q), "%s: pending device push of %d posted before the adopt", name,
                      q);
                compared++;
            } else {
                CHECK(!curb[q].got, "%s: forced update dropped the pending push of %d", name, q);
            }
            prev[q].got = 0;
            CU(dl_gptc_get_params(g, dev));
            size_t ex;
            uint32_t u = max_ulps(dev, theta, total, &ex);
            if (u > worst) worst = u;
            CHECK(u <= TOL_ULP, "%s: device parameters after the adopt of %d: %u ulp from the host's", name, q, u);
        }
    }
    CHECK(compared >= 2 * P && bad == 0, "%s: %d pushes compared, %d differ", name, compared, bad);
    int fa = dl_node_flush(na), fb = dl_node_flush(nb);
    CHECK(fa == P && fb == P, "%s: flush %d / %d", name, fa, fb);
    take_all(ca, cura, P);
    take_all(cb, curb, P);
    for (int p = 0; p < P; p++) CHECK(same_push(&cura[p], &curb[p], plan4, p), "%s: final push of %d", name, p);
    printf("node over the device (%s): %d deferred pushes bit-identical to the host node's one step later, "
           "adopts within %u ulp (tol %d)\n", name, compared, worst, TOL_ULP);
    for (int p = 0; p < P; p++) free(prev[p].d), free(cura[p].d), free(curb[p].d);
    dl_node_close(&na);
    dl_node_close(&nb);
    dl_mailbox_close(&ca);
    dl_mailbox_close(&cb);
    dl_gptc_xfer_close(&x);
    dl_gptc_close(&g);
    free(theta), free(dev);
}

/* ---- 3. the trainer on both devices, checkpoints across devices */

static char dir[] = "/tmp/dloco_test_cuda_learner.XXXXXX";
static char corpus[512];

static float FLEET = 0.0f; /* dl_train_cfg.fleet of the trainers open_trainer makes */

static dl_trainer *open_trainer(int device, const char *resume)
{
    dl_data_opts o = {.path = corpus, .format = "text", .seq_len = 32, .vocab = 256, .val_frac = 0.1, .seed = 3};
    dl_data *d = NULL;
    CU(dl_data_open(&o, &d));
    dl_train_cfg tc = {
        .model = {.n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 32, .vocab = 256},
        .batch = 4,
        .steps = 50,
        .lr = 3e-3f,
        .warmup = 2,
        .min_lr_frac = 0.1f,
        .adamw = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
        .seed = 21,
        .val_batches = 2,
        .device = device,
        .fleet = FLEET,
    };
    dl_trainer *t = NULL;
    CU(dl_trainer_open(&tc, d, &t));
    if (resume) CU(dl_trainer_resume(t, resume));
    return t;
}

/* params | m | v of a trainer on the host */
static float *state_of(dl_trainer *t)
{
    size_t n = dl_trainer_num_params(t);
    float *s = dl_xmalloc(3 * n * 4);
    if (dl_trainer_device(t) == DL_DEVICE_CUDA) {
        CU(dl_gptc_get_state(dl_trainer_gptc(t), s, s + n, s + 2 * n));
    } else {
        dl_gpt *g = dl_trainer_model(t);
        memcpy(s, dl_gpt_params(g), n * 4);
        memcpy(s + n, dl_gpt_adam_m(g), n * 4);
        memcpy(s + 2 * n, dl_gpt_adam_v(g), n * 4);
    }
    return s;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void test_trainer(void)
{
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    REQUIRE(f, "corpus");
    for (int i = 1; i <= 600; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog %d\n", i, i * 7919 % 1000);
    fclose(f);
    dl_cuda_set_matmul(DL_MATMUL_FP32);

    dl_trainer *a = open_trainer(DL_DEVICE_CPU, NULL), *b = open_trainer(DL_DEVICE_CUDA, NULL);
    CHECK(dl_trainer_device(b) == DL_DEVICE_CUDA && dl_trainer_gptc(b) && !dl_trainer_model(b), "cuda trainer");
    size_t n = dl_trainer_num_params(a);
    float *sa = state_of(a), *sb = state_of(b);
    CHECK(n == dl_trainer_num_params(b) && !memcmp(sa, sb, 3 * n * 4), "both trainers start from the same state");
    free(sa), free(sb);
    double worst = 0.0;
    for (int s = 1; s <= 5; s++) {
        double la, lb;
        float na, nb;
        CU(dl_trainer_step(a, &la, &na));
        CU(dl_trainer_step(b, &lb, &nb));
        double e = fmax(rel(lb, la), rel(nb, na));
        worst = fmax(worst, e);
        printf("  step %d: loss cuda %.7f cpu %.7f, grad norm cuda %.6f cpu %.6f, worst rel %.2e\n", s, lb, la, nb,
               na, e);
        CHECK(e <= TOL_STEP, "step %d: rel err %.3e", s, e);
    }
    double va, vb;
    CU(dl_trainer_eval(a, &va));
    CU(dl_trainer_eval(b, &vb));
    printf("trainer: 5 steps, worst loss/norm rel err %.2e (tol %.0e); eval cuda %.6f cpu %.6f\n", worst, TOL_STEP,
           vb, va);
    CHECK(rel(vb, va) <= TOL_STEP, "eval rel err %.3e", rel(vb, va));

    /* checkpoints across devices: load bit for bit, save back byte for byte */
    char ca[600], cb[600], cc[600];
    snprintf(ca, sizeof ca, "%s/cpu.ckpt", dir);
    snprintf(cb, sizeof cb, "%s/cuda.ckpt", dir);
    snprintf(cc, sizeof cc, "%s/again.ckpt", dir);
    CU(dl_trainer_save(a, ca));
    CU(dl_trainer_save(b, cb));
    dl_trainer *c = open_trainer(DL_DEVICE_CPU, cb), *d = open_trainer(DL_DEVICE_CUDA, ca);
    CHECK(dl_trainer_steps_done(c) == 5 && dl_trainer_steps_done(d) == 5, "resumed at step 5");
    sa = state_of(a), sb = state_of(b);
    float *sc = state_of(c), *sd = state_of(d);
    CHECK(!memcmp(sc, sb, 3 * n * 4), "cpu trainer resumed from the cuda checkpoint holds the cuda state exactly");
    CHECK(!memcmp(sd, sa, 3 * n * 4), "cuda trainer resumed from the cpu checkpoint holds the cpu state exactly");
    CU(dl_trainer_save(d, cc));
    CHECK(same_file(cc, ca), "cpu checkpoint -> cuda trainer -> checkpoint: byte-identical");
    free(sa), free(sb), free(sc), free(sd);
    /* and they train on: the cuda-resumed trainer next to the cpu one it came from */
    double l[4];
    CU(dl_trainer_step(a, &l[0], NULL));
    CU(dl_trainer_step(b, &l[1], NULL));
    CU(dl_trainer_step(c, &l[2], NULL));
    CU(dl_trainer_step(d, &l[3], NULL));
    printf("step 6: cpu %.7f, cuda-resumed-from-cpu %.7f; cuda %.7f, cpu-resumed-from-cuda %.7f\n", l[0], l[3], l[1],
           l[2]);
    CHECK(rel(l[3], l[0]) <= TOL_STEP && rel(l[2], l[1]) <= TOL_STEP, "step 6 after a cross-device resume");
    dl_trainer_close(&a);
    dl_trainer_close(&b);
    dl_trainer_close(&c);
    dl_trainer_close(&d);
    unlink(ca), unlink(cb), unlink(cc); /* the corpus serves test_fleet_trainer too */
}

/* ---- 4. the split-batch (adam_fleet) trainer on both devices */

static void test_fleet_trainer(void)
{
    FLEET = 8.0f;
    dl_trainer *a = open_trainer(DL_DEVICE_CPU, NULL), *b = open_trainer(DL_DEVICE_CUDA, NULL);
    double worst = 0.0;
    for (int s = 1; s <= 5; s++) {
        double la, lb;
        float na, nb;
        CU(dl_trainer_step(a, &la, &na));
        CU(dl_trainer_step(b, &lb, &nb));
        double e = fmax(rel(lb, la), rel(nb, na));
        worst = fmax(worst, e);
        CHECK(e <= TOL_STEP, "fleet step %d: rel err %.3e", s, e);
    }
    float *sa = state_of(a), *sb = state_of(b);
    size_t n = dl_trainer_num_params(a);
    double dp = 0.0, sc = 0.0;
    for (size_t i = 0; i < n; i++) {
        dp = fmax(dp, fabs((double)sa[i] - sb[i]));
        sc = fmax(sc, fabs((double)sa[i]));
    }
    printf("fleet trainer: 5 steps, worst loss/norm rel err %.2e, params max|d|/max %.2e (tol %.0e)\n", worst,
           dp / sc, TOL_STEP);
    CHECK(dp / sc <= TOL_STEP, "fleet params rel err %.3e", dp / sc);
    free(sa), free(sb);
    dl_trainer_close(&a);
    dl_trainer_close(&b);
    FLEET = 0.0f;
    unlink(corpus);
    rmdir(dir);
}

int main(void)
{
    REQUIRE(dl_model_config_check(&CFG) == 0, "config: %s", dl_errmsg());
    if (!dl_cuda_available()) {
        printf("dl_cuda_available() = 0: %s\n", dl_errmsg());
        dl_cuda_thread_release();
        const char *req = getenv("DLOCO_REQUIRE_CUDA");
        if (req && strcmp(req, "1") == 0) {
            printf("FAIL: DLOCO_REQUIRE_CUDA=1 but no usable CUDA device\n");
            return 1;
        }
        printf("SKIP: no CUDA device — CUDA learner tests (fragment copies vs host, deferred node over the device, "
               "trainer cuda vs cpu, cross-device checkpoints, adam_fleet trainer) did not run\n");
        return 77;
    }
    char name[256];
    CU(dl_cuda_device_name(name, sizeof name));
    printf("device: %s\n", name);
    REQUIRE(dl_model_plan_open(&CFG, P, &plan4) == 0, "plan: %s", dl_errmsg());
    total = dl_plan_total_numel(plan4);

    test_xfer();
    test_node_over_device(DL_ADOPT_OVERWRITE, "overwrite");
    test_node_over_device(DL_ADOPT_MIX, "mix");
    test_node_over_device(DL_ADOPT_KEEP, "keep");
    test_trainer();
    test_fleet_trainer();

    dl_plan_close(&plan4);
    dl_cuda_thread_release();
    printf("%s\n", failures ? "test_cuda_learner: FAILED" : "test_cuda_learner: all checks passed");
    return failures ? 1 : 0;
}
