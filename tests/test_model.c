/* Tests of core/model.c: the shared option rows and their one set of bounds,
 * the config check, tensor table, seeded init, plan, fingerprint and FLOPs. */
#include "core/model.h"

#include "core/config.h"
#include "core/err.h"
#include "core/plan.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

/* Two programs whose structs hold the model options at different offsets
 * and whose vocabulary defaults differ, as dloco-sync's and dloco-learner's. */
typedef struct {
    char name[DL_CFG_STRLEN];
    dl_model_opts model;
    int64_t H;
} prog_a;
typedef struct {
    double lr;
    int64_t steps;
    dl_model_opts m;
} prog_b;

static const dl_cfg_entry table_a[] = {
    {"name", DL_CFG_STR, offsetof(prog_a, name), 0, 0, "x", NULL, 0, "a string first"},
    DL_MODEL_CFG_ROWS(prog_a, model, "256", "vocabulary"),
    {"H", DL_CFG_INT, offsetof(prog_a, H), 1, 100, "8", NULL, 0, "something after"},
};
static const dl_cfg_entry table_b[] = {
    {"lr", DL_CFG_FLOAT, offsetof(prog_b, lr), 0, 1, "0.1", NULL, 0, "a float first"},
    {"steps", DL_CFG_INT, offsetof(prog_b, steps), 1, 10, "3", NULL, 0, "an int"},
    DL_MODEL_CFG_ROWS(prog_b, m, "0", "vocabulary; 0 = from the data"),
};
#define NA (sizeof table_a / sizeof table_a[0])
#define NB (sizeof table_b / sizeof table_b[0])

/* Set option `name` to `value` in both programs: both must give `want` and,
 * on failure, the same message. */
static void set_both(const char *name, const char *value, int want)
{
    prog_a a;
    prog_b b;
    CHECK(dl_cfg_defaults(table_a, NA, &a) == 0 && dl_cfg_defaults(table_b, NB, &b) == 0, "defaults");
    dl_err_clear();
    int ra = dl_cfg_set(table_a, NA, &a, name, value);
    char msg_a[512];
    snprintf(msg_a, sizeof msg_a, "%s", dl_errmsg());
    dl_err_clear();
    int rb = dl_cfg_set(table_b, NB, &b, name, value);
    CHECK(ra == want && rb == want, "--%s %s: %d and %d, want %d (%s / %s)", name, value, ra, rb, want, msg_a,
          dl_errmsg());
    CHECK_STR(msg_a, dl_errmsg());
}

static void test_rows(void)
{
    prog_a a;
    prog_b b;
    REQUIRE(dl_cfg_defaults(table_a, NA, &a) == 0 && dl_cfg_defaults(table_b, NB, &b) == 0, "defaults: %s",
            dl_errmsg());
    CHECK(a.model.n_layer == 4 && a.model.n_head == 4 && a.model.n_embd == 128 && a.model.seq_len == 128 &&
              a.model.fragments == 4 && a.H == 8,
          "program a's model defaults");
    CHECK(b.m.n_layer == 4 && b.m.n_head == 4 && b.m.n_embd == 128 && b.m.seq_len == 128 && b.m.fragments == 4 &&
              b.steps == 3,
          "program b's model defaults (the rows land at its offsets)");
    CHECK_EQ(a.model.vocab, 256);
    CHECK_EQ(b.m.vocab, 0);

    /* every bound of the rows is DL_MODEL_*: the edge is taken, one past it refused */
    struct {
        const char *name;
        long long lo, hi;
    } b6[] = {{"n_layer", DL_MODEL_LAYER_MIN, DL_MODEL_LAYER_MAX},    {"n_head", DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX},
              {"n_embd", DL_MODEL_EMBD_MIN, DL_MODEL_EMBD_MAX},       {"seq_len", DL_MODEL_SEQ_MIN, DL_MODEL_SEQ_MAX},
              {"vocab", 0, DL_MODEL_VOCAB_MAX}, {"fragments", DL_MODEL_FRAGMENTS_MIN, DL_MODEL_FRAGMENTS_MAX}};
    for (size_t i = 0; i < sizeof b6 / sizeof b6[0]; i++) {
        char v[32];
        snprintf(v, sizeof v, "%lld", b6[i].lo);
        set_both(b6[i].name, v, 0);
        snprintf(v, sizeof v, "%lld", b6[i].hi);
        set_both(b6[i].name, v, 0);
        snprintf(v, sizeof v, "%lld", b6[i].lo - 1);
        set_both(b6[i].name, v, DL_ERANGE);
        snprintf(v, sizeof v, "%lld", b6[i].hi + 1);
        set_both(b6[i].name, v, DL_ERANGE);
    }
    set_both("n_embd", "4", DL_ERANGE);
    CHECK(strstr(dl_errmsg(), "option n_embd: 4 out of range [8, 16384]") != NULL, "bounds message: %s", dl_errmsg());
    set_both("n_head", "four", DL_EINVAL);
    printf("ok: the model rows in two tables: same defaults (vocab per program), same bounds, same errors\n");
}

static void test_config_from(void)
{
    dl_model_opts o = {.n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 32, .vocab = 100, .fragments = 3};
    dl_model_config c;
    CHECK(dl_model_config_from(&o, &c) == 0, "valid options: %s", dl_errmsg());
    CHECK(c.n_layer == 2 && c.n_head == 4 && c.n_embd == 64 && c.seq_len == 32 && c.vocab == 100 &&
              c.padded_vocab == 128,
          "config of the options, Vp = V rounded up to 64");

    /* the same bounds as the rows, in the rows' words */
    dl_model_opts bad = o;
    bad.vocab = 0;
    CHECK(dl_model_config_from(&bad, &c) == DL_ERANGE, "vocab 0 is for the program to resolve");
    CHECK(strstr(dl_errmsg(), "option vocab: 0 out of range [2, 16777216]") != NULL, "message: %s", dl_errmsg());
    bad = o;
    bad.n_layer = 257;
    CHECK(dl_model_config_from(&bad, &c) == DL_ERANGE && strstr(dl_errmsg(), "option n_layer: 257 out of range"),
          "n_layer 257: %s", dl_errmsg());
    bad = o;
    bad.fragments = 0;
    CHECK(dl_model_config_from(&bad, &c) == DL_ERANGE && strstr(dl_errmsg(), "option fragments: 0 out of range"),
          "fragments 0: %s", dl_errmsg());
    bad = o;
    bad.n_embd = 30;
    CHECK(dl_model_config_from(&bad, &c) == DL_EINVAL && strstr(dl_errmsg(), "is not a multiple of n_head 4"),
          "n_embd 30 / n_head 4: %s", dl_errmsg());
    bad = o;
    bad.n_embd = (int64_t)1 << 40; /* no truncation to int before the check */
    CHECK(dl_model_config_from(&bad, &c) == DL_ERANGE, "n_embd 2^40");

    dl_model_config m = {.n_layer = 1, .n_head = 300, .n_embd = 300 * 8, .seq_len = 8, .vocab = 64};
    CHECK(dl_model_config_check(&m) == DL_EINVAL && strstr(dl_errmsg(), "n_head 300 not in [1, 256]"),
          "the check has the rows' n_head bound: %s", dl_errmsg());
    m = (dl_model_config){.n_layer = 1, .n_head = 1, .n_embd = 8, .seq_len = 2, .vocab = 64};
    CHECK(dl_model_config_check(&m) == 0 && m.padded_vocab == 64, "smallest model, V already a multiple of 64");
    printf("ok: dl_model_config_from: bounds as the rows word them, vocab 0 refused, n_embd %% n_head checked\n");
}

static void test_description(void)
{
    dl_model_config c = {.n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 100};
    REQUIRE(dl_model_config_check(&c) == 0, "config: %s", dl_errmsg());
    size_t numel = 0;
    int n = dl_model_tensor_table(&c, NULL, 0, &numel);
    CHECK_EQ(n, 2 + 12 * 2 + 2);
    size_t C = 16, L = 2, Vp = 128, T = 8;
    CHECK_EQ(numel, Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
    dl_tensor *t = calloc((size_t)n, sizeof *t);
    CHECK_EQ(dl_model_tensor_table(&c, t, n, NULL), n);
    CHECK_STR(t[0].name, "wte");
    CHECK_STR(t[n - 1].name, "ln_f.bias");
    CHECK(t[n - 1].offset + t[n - 1].numel == numel, "table covers the buffer");

    /* the init: seeded, layernorm weights 1, biases 0, padded wte rows 0 */
    float *p = malloc(numel * sizeof *p), *q = malloc(numel * sizeof *q);
    CHECK(dl_model_init_params(&c, 7, p) == 0 && dl_model_init_params(&c, 7, q) == 0, "init");
    CHECK(memcmp(p, q, numel * sizeof *p) == 0, "same seed, same params");
    CHECK(dl_model_init_params(&c, 8, q) == 0 && memcmp(p, q, numel * sizeof *p) != 0, "another seed differs");
    int ok = 1;
    for (size_t j = (size_t)c.vocab * C; j < Vp * C; j++) ok &= p[j] == 0.0f;
    CHECK(ok, "padded wte rows are 0");
    CHECK(p[t[2].offset] == 1.0f && p[t[3].offset] == 0.0f, "h.0.ln_1 weight 1, bias 0");
    double ss = 0;
    for (size_t j = 0; j < (size_t)c.vocab * C; j++) ss += (double)p[j] * p[j];
    CHECK_NEAR(sqrt(ss / (double)(c.vocab * C)), 0.02, 0.002);
    dl_model_config bad = c;
    bad.n_head = 3;
    CHECK(dl_model_init_params(&bad, 7, q) == DL_EINVAL, "init checks the config");

    /* plan and fingerprint: every field and P count */
    dl_plan *plan = NULL;
    REQUIRE(dl_model_plan_open(&c, 3, &plan) == 0, "plan: %s", dl_errmsg());
    CHECK_EQ(dl_plan_total_numel(plan), numel);
    uint64_t fp = dl_model_fingerprint(&c, plan);
    dl_plan *plan4 = NULL;
    REQUIRE(dl_model_plan_open(&c, 4, &plan4) == 0, "plan P=4");
    CHECK(dl_model_fingerprint(&c, plan4) != fp, "P is part of the fingerprint");
    dl_plan_close(&plan4);
    for (int f = 0; f < 5; f++) {
        dl_model_config o = c;
        int *fld[] = {&o.n_layer, &o.n_head, &o.n_embd, &o.seq_len, &o.vocab};
        *fld[f] *= 2;
        REQUIRE(dl_model_config_check(&o) == 0, "config %d", f);
        dl_plan *po = NULL;
        REQUIRE(dl_model_plan_open(&o, 3, &po) == 0, "plan %d", f);
        CHECK(dl_model_fingerprint(&o, po) != fp, "field %d is part of the fingerprint", f);
        dl_plan_close(&po);
    }
    CHECK(dl_model_plan_open(&bad, 3, &plan4) == DL_EINVAL && plan4 == NULL, "plan checks the config");
    dl_plan_close(&plan);

    /* FLOPs: 6 x matmul params + attention, per token */
    double want = 3.0 * (2.0 * (2.0 * 12 * 16 * 16 + 128.0 * 16) + 2.0 * 2 * 2 * 8 * 16);
    CHECK_NEAR(dl_model_flops_per_token(&c, 8), want, 1e-6);
    free(t), free(p), free(q);
    printf("ok: tensor table, seeded init, plan, fingerprint over every field and P, FLOPs per token\n");
}

int main(void)
{
    test_rows();
    test_config_from();
    test_description();
    return CHECK_DONE("test_model");
}
