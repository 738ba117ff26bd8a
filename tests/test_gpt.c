/* GPT forward, backward and AdamW against PyTorch: tests/data/gpt_ref.bin was
 * written by tests/ref/make_ref.py (float64 torch, same weights and batch);
 * then dl_gpt_open's two out-of-memory refusals. */
#include "gpt/gpt.h"

#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static void *read_exact(FILE *f, size_t n)
{
    void *p = malloc(n);
    if (!p || fread(p, 1, n, f) != n) {
        printf("FAIL: reference file truncated\n");
        exit(1);
    }
    return p;
}

/* max |a-b| / max |b| over a tensor: the error relative to the tensor's scale,
 * so tiny entries do not dominate and a wrong sign anywhere shows. */
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

/* dl_gpt_open allocates, in order: the handle, the tensor table, the state
 * blob (params, grads, m, v), the activations, the two token copies. The
 * blob and the activations grow with the config and the batch, so their
 * failures are a DL_ENOMEM that says what and how much; the rest abort. */
static void test_out_of_memory(const dl_model_config *cfg, int B)
{
    dl_gpt *g = NULL;
    long long c0 = dl_alloc_count();
    REQUIRE(dl_gpt_open(cfg, B, &g) == 0, "open: %s", dl_errmsg());
    CHECK_EQ(dl_alloc_count() - c0, 6);
    char want[160];
    snprintf(want, sizeof want, "model state of %zu parameters x 4 buffers (", dl_gpt_num_params(g));
    dl_gpt_close(&g);
    struct { int k; const char *needle; } cases[] = {{3, want}, {4, "activations of "}};
    for (int i = 0; i < 2; i++) {
        g = (dl_gpt *)cfg; /* must come back NULL */
        dl_err_clear();
        dl_alloc_fail_after(cases[i].k);
        int rc = dl_gpt_open(cfg, B, &g);
        dl_alloc_fail_after(0);
        printf("allocation %d of dl_gpt_open failed -> %s: %s\n", cases[i].k, dl_strerror(rc), dl_errmsg());
        CHECK(rc == DL_ENOMEM && g == NULL, "allocation %d: rc %d, handle %p", cases[i].k, rc, (void *)g);
        CHECK(strstr(dl_errmsg(), cases[i].needle) && strstr(dl_errmsg(), " GB") &&
                  strstr(dl_errmsg(), "out of memory"),
              "allocation %d: message '%s' lacks '%s'", cases[i].k, dl_errmsg(), cases[i].needle);
    }
    REQUIRE(dl_gpt_open(cfg, B, &g) == 0, "an open after the failures: %s", dl_errmsg());
    CHECK(dl_gpt_num_params(g) > 0, "the later model is whole");
    dl_gpt_close(&g);
}

int main(void)
{
    const char *src = getenv("DLOCO_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/gpt_ref.bin", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FAIL: cannot open %s\n", path);
        return 1;
    }
    int32_t *hdr = read_exact(f, 16 * 4);
    float *hp = read_exact(f, 8 * 4);
    if (hdr[0] != 0x46524C44 || hdr[1] != 1) {
        printf("FAIL: %s is not a version-1 reference file\n", path);
        return 1;
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

    dl_gpt *g = NULL;
    if (dl_model_config_check(&cfg) || dl_gpt_open(&cfg, B, &g)) {
        printf("FAIL: cannot build the model\n");
        return 1;
    }
    CHECK(dl_gpt_num_params(g) == np, "parameter count %zu, reference %zu", dl_gpt_num_params(g), np);
    if (failures) return 1;
    CHECK(cfg.padded_vocab == V, "the reference has no vocab padding");
    memcpy(dl_gpt_params(g), params, np * 4);

    /* forward */
    double l = dl_gpt_forward(g, inp, tgt, B, T);
    double lerr = fabs(l - *loss) / fabs(*loss);
    printf("loss: dloco %.7f torch %.7f rel err %.2e (tol 1e-4)\n", l, *loss, lerr);
    CHECK(lerr <= 1e-4, "loss relative error %.3e", lerr);
    double logit_err = rel_err(dl_gpt_logits(g), logits, BT * V);
    printf("logits: max|diff|/max|ref| %.2e (tol 1e-4)\n", logit_err);
    CHECK(logit_err <= 1e-4, "logits error %.3e", logit_err);

    /* backward: every tensor's gradient */
    dl_gpt_zero_grad(g);
    dl_gpt_backward(g);
    int nt;
    const dl_tensor *tab = dl_gpt_tensors(g, &nt);
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < nt; i++) {
        double e = rel_err(dl_gpt_grads(g) + tab[i].offset, grads + tab[i].offset, tab[i].numel);
        if (e > worst || e != e) {
            worst = e;
            worst_name = tab[i].name;
        }
        CHECK(e <= 1e-4, "gradient of %s: max|diff|/max|ref| %.3e", tab[i].name, e);
    }
    printf("gradients: %d tensors, worst max|diff|/max|ref| %.2e in %s (tol 1e-4)\n", nt, worst, worst_name);

    /* 10 AdamW steps on the same batch, from the same start */
    memcpy(dl_gpt_params(g), params, np * 4);
    memset(dl_gpt_adam_m(g), 0, np * 4);
    memset(dl_gpt_adam_v(g), 0, np * 4);
    dl_adamw_cfg ac = {.beta1 = hp[1], .beta2 = hp[2], .eps = hp[3], .weight_decay = hp[4], .grad_clip = hp[5]};
    double worst_step = 0.0;
    for (int s = 0; s < nsteps; s++) {
        double ls = dl_gpt_forward(g, inp, tgt, B, T);
        dl_gpt_zero_grad(g);
        dl_gpt_backward(g);
        dl_gpt_adamw_step(g, &ac, hp[0], s + 1);
        double e = fabs(ls - losses[s]) / fabs(losses[s]);
        if (e > worst_step) worst_step = e;
        printf("  step %2d: dloco %.6f torch %.6f rel err %.2e\n", s, ls, losses[s], e);
        CHECK(e <= 1e-4, "AdamW step %d loss relative error %.3e", s, e);
    }
    CHECK(losses[nsteps - 1] < losses[0] - 0.5, "reference losses must fall (sanity of the file)");
    printf("adamw: %d steps, worst loss rel err %.2e (tol 1e-4)\n", nsteps, worst_step);

    dl_gpt_close(&g);
    dl_gpt_close(&g); /* close is safe twice */
    test_out_of_memory(&cfg, B);
    free(hdr); free(hp); free(params); free(inp); free(tgt); free(logits); free(loss); free(grads); free(losses);
    printf("%s\n", failures ? "test_gpt: FAILED" : "test_gpt: all checks passed");
    return failures ? 1 : 0;
}
