/* Unit tests of core/manifest.c: GPT-2 manifests keep the golden plans and fingerprints, a Llama-like
 * table of 1-4-dim tensors plans and fingerprints, every refusal, the first difference, the JSON form. */
#include "core/manifest.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"
#include "core/plan.h"
#include "tests/check.h"

/* ---------------------------------------------------------------- GPT-2 goldens */

/* Fingerprints and block counts computed by main's core/ before manifests
 * existed (commit f0324b6, dl_model_plan_open + dl_model_fingerprint):
 * a GPT-2 manifest must give exactly these, so stores and learners of GPT-2
 * runs keep working. The set covers format 1 (no split: quickstart, P = 1)
 * and format 2 (split plans: 124M at P = 24 and 64, L=2 C=64 at P = 8). */
static const struct {
    int L, NH, C, T, V, P;
    uint64_t fp;
    int nblocks;
} golden[] = {
    {4, 4, 128, 128, 256, 4, 0x4f7397ff1e80a628ull, 52},
    {12, 12, 768, 1024, 50257, 24, 0x5bc5ce3e2af3fd9bull, 171},
    {12, 12, 768, 1024, 50257, 64, 0xce8e44c6665df25aull, 211},
    {2, 2, 64, 32, 100, 8, 0x51ad4200e4be6127ull, 35},
    {2, 2, 64, 32, 100, 1, 0x59fbb13e5f3fbbb7ull, 28},
    {1, 1, 8, 2, 2, 3, 0xce6c26aaa3d8e781ull, 18},
};

static dl_model_config cfg_of(int k)
{
    dl_model_config c = {.n_layer = golden[k].L, .n_head = golden[k].NH, .n_embd = golden[k].C,
                         .seq_len = golden[k].T, .vocab = golden[k].V};
    return c;
}

/* An untagged copy of m's table, built tensor by tensor. */
static dl_manifest *copy_untagged(const dl_manifest *m)
{
    dl_manifest *c;
    REQUIRE(dl_manifest_open(&c) == 0, "%s", dl_errmsg());
    for (int i = 0; i < dl_manifest_ntensors(m); i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        REQUIRE(dl_manifest_add(c, t->name, t->ndim, t->shape, t->kind) == 0, "%s", dl_errmsg());
    }
    return c;
}

static void test_gpt_goldens(void)
{
    for (size_t k = 0; k < sizeof golden / sizeof golden[0]; k++) {
        dl_model_config c = cfg_of((int)k), got;
        dl_manifest *m = NULL;
        dl_plan *pl = NULL, *ref = NULL;
        REQUIRE(dl_manifest_from_gpt(&c, &m) == 0, "%s", dl_errmsg());
        CHECK(dl_manifest_gpt(m, &got) == 1 && got.n_head == c.n_head && got.padded_vocab == (c.vocab + 63) / 64 * 64,
              "GPT tag kept");
        REQUIRE(dl_manifest_plan_open(m, golden[k].P, &pl) == 0, "%s", dl_errmsg());
        uint64_t fp = dl_manifest_fingerprint(m, pl);
        CHECK(fp == golden[k].fp, "L=%d C=%d V=%d P=%d: fingerprint %016llx, golden %016llx", golden[k].L,
              golden[k].C, golden[k].V, golden[k].P, (unsigned long long)fp, (unsigned long long)golden[k].fp);
        CHECK_EQ(dl_plan_nblocks(pl), golden[k].nblocks);
        /* the same as the model's own functions, table entry by entry */
        REQUIRE(dl_model_config_check(&c) == 0 && dl_model_plan_open(&c, golden[k].P, &ref) == 0, "%s", dl_errmsg());
        CHECK(dl_model_fingerprint(&c, ref) == fp, "dl_model_fingerprint agrees");
        size_t numel = 0;
        CHECK_EQ(dl_model_tensor_table(&c, NULL, 0, &numel), dl_manifest_ntensors(m));
        CHECK_EQ(numel, dl_manifest_numel(m));
        for (int i = 0; i < dl_manifest_ntensors(m); i++)
            CHECK(memcmp(dl_plan_tensor(ref, i), dl_manifest_tensor(m, i), sizeof(dl_tensor)) == 0, "tensor %d", i);

        /* An untagged copy of the same table is another kind of run: format 3,
         * another fingerprint. Tagging it restores the golden one. */
        dl_manifest *u = copy_untagged(m);
        dl_plan *pu = NULL;
        CHECK(dl_manifest_gpt(u, NULL) == 0, "copy is untagged");
        REQUIRE(dl_manifest_plan_open(u, golden[k].P, &pu) == 0, "%s", dl_errmsg());
        CHECK(dl_manifest_fingerprint(u, pu) != golden[k].fp, "an untagged table shares the GPT-2 fingerprint");
        CHECK(dl_manifest_fingerprint(u, pu) == dl_plan_fingerprint_v3(pu, NULL, 0), "untagged = format 3");
        char msg[512];
        CHECK(dl_manifest_diff(m, u, "the learner's manifest", msg, sizeof msg) == 1, "tag difference counts 1");
        CHECK(strstr(msg, "not a GPT-2 config") != NULL, "tag difference named: %s", msg);
        CHECK(dl_manifest_set_gpt(u, &c) == 0, "%s", dl_errmsg());
        CHECK(dl_manifest_fingerprint(u, pu) == golden[k].fp, "tagged copy gets the golden fingerprint");
        CHECK(dl_manifest_diff(m, u, "x", msg, sizeof msg) == 0, "tagged copy equals: %s", msg);
        /* another head count: the same tensors, another config */
        dl_model_config c2 = c;
        c2.n_head = c.n_embd / c.n_head == 1 ? c.n_head : 1;
        if (c2.n_head != c.n_head) {
            dl_manifest *m2;
            REQUIRE(dl_manifest_from_gpt(&c2, &m2) == 0, "%s", dl_errmsg());
            CHECK(dl_manifest_diff(m, m2, "x", msg, sizeof msg) == 1 && strstr(msg, "n_head"), "n_head: %s", msg);
            dl_manifest_close(&m2);
        }
        dl_plan_close(&pu);
        dl_manifest_close(&u);
        dl_plan_close(&ref);
        dl_plan_close(&pl);
        dl_manifest_close(&m);
        dl_manifest_close(&m); /* twice is safe */
    }
    /* set_gpt on a table that is not the config's names the difference */
    dl_model_config c = cfg_of(0);
    dl_manifest *m, *u;
    REQUIRE(dl_manifest_from_gpt(&c, &m) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_open(&u) == 0, "%s", dl_errmsg());
    for (int i = 0; i < dl_manifest_ntensors(m); i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        int64_t sh[4] = {t->shape[0], t->shape[1]};
        if (i == 4) sh[0] = 7;
        REQUIRE(dl_manifest_add(u, t->name, t->ndim, sh, t->kind) == 0, "%s", dl_errmsg());
    }
    CHECK(dl_manifest_set_gpt(u, &c) == DL_EMISMATCH, "wrong shape tagged");
    CHECK(strstr(dl_errmsg(), "h.0.attn.c_attn.weight") && strstr(dl_errmsg(), "[7, 128]"), "%s", dl_errmsg());
    CHECK(dl_manifest_gpt(u, NULL) == 0, "refused tag left untagged");
    int64_t one = 1;
    CHECK(dl_manifest_add(m, "extra", 1, &one, DL_TENSOR_VECTOR) == DL_EINVAL, "a GPT-2 manifest grew");
    dl_model_config bad = {.n_layer = 0, .n_head = 1, .n_embd = 8, .seq_len = 2, .vocab = 2};
    dl_manifest *b = (dl_manifest *)&b;
    CHECK(dl_manifest_from_gpt(&bad, &b) == DL_EINVAL && b == NULL, "bad GPT config");
    dl_manifest_close(&u);
    dl_manifest_close(&m);
    printf("ok: %zu GPT-2 configs keep their golden fingerprints and plans; untagged copies differ\n",
           sizeof golden / sizeof golden[0]);
}

/* ---------------------------------------------------------------- a model dloco has never seen */

/* A small Llama-like table: embedding, per layer RMSNorm weights, q/k/v/o,
 * SwiGLU gate/up/down, a final norm, an untied head, plus a 3-D and a 4-D
 * tensor (a per-head bias table and a conv kernel) and a name of 100 bytes. */
static dl_manifest *llama(int L, int C, int V, int changes)
{
    dl_manifest *m;
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
#define ADD(nm, role, ...)                                                                                        \
    do {                                                                                                          \
        int64_t sh_[] = {__VA_ARGS__};                                                                            \
        REQUIRE(dl_manifest_add(m, nm, (int)(sizeof sh_ / sizeof sh_[0]), sh_, role) == 0, "%s", dl_errmsg());    \
    } while (0)
    char nm[160];
    ADD("model.embed_tokens.weight", DL_TENSOR_EMBED, V, C);
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        ADD(nm, DL_TENSOR_VECTOR, C);
        const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s.weight", l, proj[k]);
            if (changes == 1 && l == 0 && k == 1) ADD(nm, DL_TENSOR_MATRIX, C / 2, C); /* GQA k */
            else ADD(nm, DL_TENSOR_MATRIX, C, C);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(nm, changes == 2 && l == 0 ? DL_TENSOR_MATRIX : DL_TENSOR_VECTOR, C);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(nm, DL_TENSOR_MATRIX, 3 * C, C);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(nm, DL_TENSOR_MATRIX, 3 * C, C);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.%s.weight", l, changes == 3 && l == 1 ? "down" : "down_proj");
        ADD(nm, DL_TENSOR_MATRIX, C, 3 * C);
    }
    ADD("model.rel_bias", DL_TENSOR_MATRIX, 4, 8, 8);
    ADD("model.stem.conv", DL_TENSOR_MATRIX, 16, 3, 3, 3);
    memset(nm, 'n', 100);
    nm[100] = '\0';
    ADD(nm, DL_TENSOR_VECTOR, 5);
    ADD("model.norm.weight", DL_TENSOR_VECTOR, C);
    if (changes != 4) ADD("lm_head.weight", DL_TENSOR_MATRIX, V, C);
#undef ADD
    return m;
}

static void test_llama(void)
{
    dl_manifest *m = llama(2, 64, 256, 0);
    REQUIRE(dl_manifest_check(m) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_gpt(m, NULL) == 0, "not GPT");
    int n = dl_manifest_ntensors(m);
    CHECK_EQ(n, 1 + 2 * 9 + 5);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        CHECK(t->offset == off, "tensor %d offset %zu, want %zu (declaration order)", i, t->offset, off);
        off += t->numel;
    }
    CHECK_EQ(off, dl_manifest_numel(m));
    CHECK(dl_manifest_tensor(m, n) == NULL && dl_manifest_tensor(m, -1) == NULL, "out of range");
    const dl_tensor *conv = dl_manifest_tensor(m, n - 4);
    CHECK(conv->ndim == 4 && conv->numel == 16 * 27 && !strcmp(conv->name, "model.stem.conv"), "4-D tensor");

    /* Plans at several P: row blocks of a 3-/4-D tensor are shape[0] slices. */
    int Ps[] = {1, 3, 8, 16, 24};
    uint64_t fps[5];
    for (int k = 0; k < 5; k++) {
        dl_plan *pl = NULL;
        REQUIRE(dl_manifest_plan_open(m, Ps[k], &pl) == 0, "P=%d: %s", Ps[k], dl_errmsg());
        for (int i = 0; i < n; i++) {
            const dl_tensor *t = dl_plan_tensor(pl, i);
            size_t w = t->numel / (size_t)t->shape[0];
            for (int b = 0; b < dl_plan_tensor_nblocks(pl, i); b++) {
                const dl_plan_span *s = dl_plan_tensor_block(pl, i, b);
                CHECK(s->start % w == 0 && s->numel % w == 0, "P=%d %s block %d not on rows of %zu", Ps[k],
                      t->name, b, w);
            }
        }
        fps[k] = dl_manifest_fingerprint(m, pl);
        CHECK(fps[k] == dl_plan_fingerprint(pl, NULL, 0), "a 100-byte name and 4-D shapes need format 3");
        for (int j = 0; j < k; j++) CHECK(fps[j] != fps[k], "P=%d and P=%d share a fingerprint", Ps[j], Ps[k]);
        if (Ps[k] == 24) CHECK(dl_plan_nblocks(pl) > n, "P=24 splits a big tensor");
        dl_plan_close(&pl);
    }
    /* deterministic, and every kind of change is seen */
    dl_manifest *again = llama(2, 64, 256, 0);
    dl_plan *pa = NULL, *pb = NULL;
    REQUIRE(dl_manifest_plan_open(again, 8, &pa) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_fingerprint(again, pa) == fps[2], "fingerprint not deterministic");
    char msg[512];
    CHECK(dl_manifest_diff(m, again, "the learner's manifest", msg, sizeof msg) == 0 && msg[0] == '\0',
          "equal manifests differ: %s", msg);
    dl_plan_close(&pa);
    const char *want[] = {
        NULL,
        "tensor 'model.layers.0.self_attn.k_proj.weight' (3 of 24) has shape [64, 64] here, [32, 64] in the "
        "learner's manifest",
        "tensor 'model.layers.0.post_attention_layernorm.weight' (6 of 24) has role vector here, matrix in the "
        "learner's manifest",
        "tensor 18 of 24 is 'model.layers.1.mlp.down_proj.weight' here, 'model.layers.1.mlp.down.weight' in the "
        "learner's manifest",
        "24 tensors here, 23 in the learner's manifest: tensor 23 'lm_head.weight' is only here",
    };
    for (int ch = 1; ch <= 4; ch++) {
        dl_manifest *o = llama(2, 64, 256, ch);
        CHECK(dl_manifest_diff(m, o, "the learner's manifest", msg, sizeof msg) == 1, "change %d: one difference",
              ch);
        CHECK_STR(msg, want[ch]);
        int back = dl_manifest_diff(o, m, "the run's manifest", msg, sizeof msg);
        CHECK(back == 1 && strstr(msg, "the run's manifest"), "reverse %d: %s", ch, msg);
        REQUIRE(dl_manifest_plan_open(o, 8, &pb) == 0, "%s", dl_errmsg());
        CHECK(dl_manifest_fingerprint(o, pb) != fps[2], "change %d not in the fingerprint", ch);
        dl_plan_close(&pb);
        dl_manifest_close(&o);
    }
    /* counting: a different table in several places, msg NULL allowed */
    dl_manifest *small = llama(1, 64, 256, 0), *narrow = llama(2, 32, 256, 0);
    CHECK(dl_manifest_diff(m, small, "x", NULL, 0) == 9 + 5, "one layer fewer: %d",
          dl_manifest_diff(m, small, "x", NULL, 0));
    CHECK(dl_manifest_diff(m, narrow, "x", msg, 8) == 24 - 3 && strlen(msg) == 7, "every C-shaped tensor, msg cut");
    dl_manifest_close(&small);
    dl_manifest_close(&narrow);
    dl_manifest_close(&again);
    dl_manifest_close(&m);
    printf("ok: a Llama-like table with 3-D, 4-D tensors and a 100-byte name plans on row slices, fingerprints "
           "(format 3) and names its first difference\n");
}

/* ---------------------------------------------------------------- refusals */

static void expect(int rc, int want, const char *what, const char *needle)
{
    CHECK(rc == want, "%s: rc %d, want %d (%s)", what, rc, want, dl_errmsg());
    CHECK(needle == NULL || strstr(dl_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", what, dl_errmsg(),
          needle);
    printf("  refused %-28s -> %s\n", what, dl_errmsg());
}

static void test_refusals(void)
{
    printf("refusals:\n");
    dl_manifest *m;
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    dl_plan *pl = (dl_plan *)&pl;
    expect(dl_manifest_check(m), DL_EINVAL, "empty manifest", "no tensors");
    expect(dl_manifest_plan_open(m, 1, &pl), DL_EINVAL, "plan of an empty manifest", "no tensors");
    CHECK(pl == NULL, "plan reset");
    char *js = (char *)&js;
    expect(dl_manifest_to_json(m, &js, NULL), DL_EINVAL, "JSON of an empty manifest", "no tensors");
    CHECK(js == NULL, "json reset");
    int64_t s2[2] = {4, 0}, s1[1] = {-3}, ok[4] = {2, 3, 4, 5}, big[2] = {INT64_C(1) << 21, INT64_C(1) << 20};
    int64_t huge[1] = {INT64_MAX};
    expect(dl_manifest_add(m, "w", 2, s2, DL_TENSOR_MATRIX), DL_EINVAL, "zero dimension", "'w' has dimension 1 = 0");
    expect(dl_manifest_add(m, "w", 1, s1, DL_TENSOR_VECTOR), DL_EINVAL, "negative dimension", "= -3");
    expect(dl_manifest_add(m, "w", 5, ok, DL_TENSOR_MATRIX), DL_EINVAL, "5 dimensions", "has 5 dimensions");
    expect(dl_manifest_add(m, "w", 0, ok, DL_TENSOR_MATRIX), DL_EINVAL, "0 dimensions", "has 0 dimensions");
    expect(dl_manifest_add(m, "w", 2, big, DL_TENSOR_MATRIX), DL_EINVAL, "2^41 elements", "2^40");
    expect(dl_manifest_add(m, "w", 1, huge, DL_TENSOR_VECTOR), DL_EINVAL, "INT64_MAX elements", "2^40");
    expect(dl_manifest_add(m, "", 1, ok, DL_TENSOR_VECTOR), DL_EINVAL, "empty name", "empty name");
    expect(dl_manifest_add(m, NULL, 1, ok, DL_TENSOR_VECTOR), DL_EINVAL, "no name", "empty name");
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    expect(dl_manifest_add(m, longname, 1, ok, DL_TENSOR_VECTOR), DL_EINVAL, "200-byte name", "longer than 127");
    longname[128] = '\0';
    expect(dl_manifest_add(m, longname, 1, ok, DL_TENSOR_VECTOR), DL_EINVAL, "128-byte name", "longer than 127");
    longname[127] = '\0';
    CHECK(dl_manifest_add(m, longname, 1, ok, DL_TENSOR_VECTOR) == 0, "127-byte name: %s", dl_errmsg());
    expect(dl_manifest_add(m, "a\nb", 1, ok, DL_TENSOR_VECTOR), DL_EINVAL, "newline in a name", "control character");
    expect(dl_manifest_add(m, "w", 1, ok, 7), DL_EINVAL, "unknown role", "role 7");
    CHECK(dl_manifest_ntensors(m) == 1, "refused tensors were not appended: %d", dl_manifest_ntensors(m));
    /* the model's total: 2^40 floats exactly, not one more (2 are in use) */
    int64_t half[2] = {INT64_C(1) << 20, INT64_C(1) << 19}, rest[1] = {(INT64_C(1) << 39) - 2};
    CHECK(dl_manifest_add(m, "h1", 2, half, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_add(m, "h2", 1, rest, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_numel(m) == DL_MANIFEST_NUMEL_MAX, "2^40 floats");
    expect(dl_manifest_add(m, "h3", 1, ok, DL_TENSOR_VECTOR), DL_EINVAL, "model past 2^40 floats", "at tensor 'h3'");
    dl_manifest_close(&m);

    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_add(m, "a", 1, ok, DL_TENSOR_VECTOR) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_add(m, "b", 2, ok, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_add(m, "a", 3, ok, DL_TENSOR_MATRIX) == 0, "%s", dl_errmsg());
    expect(dl_manifest_check(m), DL_EINVAL, "duplicate name", "tensors 0 and 2 are both named 'a'");
    expect(dl_manifest_plan_open(m, 2, &pl), DL_EINVAL, "plan with a duplicate", "both named 'a'");
    dl_manifest_close(&m);

    /* P beyond the tensors: the plan's refusal */
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_add(m, "a", 1, ok, DL_TENSOR_VECTOR) == 0, "%s", dl_errmsg());
    expect(dl_manifest_plan_open(m, 2, &pl), DL_EINVAL, "P above the tensors", "P = 2");
    dl_manifest_close(&m);

    /* Failed allocations return DL_ENOMEM, never abort, and leave the
     * manifest as it was. */
    int fails = 0;
    for (long long k = 1; k < 64; k++) {
        dl_manifest *a = NULL;
        dl_alloc_fail_after(k);
        int rc = dl_manifest_open(&a);
        for (int i = 0; rc == 0 && i < 40; i++) {
            char nm[16];
            snprintf(nm, sizeof nm, "t%d", i);
            rc = dl_manifest_add(a, nm, 1, ok, DL_TENSOR_VECTOR);
            if (rc) CHECK(dl_manifest_ntensors(a) == i, "failed add appended");
        }
        char *j = NULL;
        if (rc == 0) rc = dl_manifest_check(a);
        if (rc == 0) rc = dl_manifest_to_json(a, &j, NULL);
        dl_alloc_fail_after(0);
        free(j);
        dl_manifest_close(&a);
        if (rc == 0) break;
        CHECK(rc == DL_ENOMEM, "allocation %lld: rc %d (%s)", k, rc, dl_errmsg());
        fails++;
    }
    CHECK(fails >= 4, "only %d allocations were failed", fails);
    printf("ok: every bad manifest refused with a named tensor; %d injected allocation failures returned DL_ENOMEM\n",
           fails);
}

/* ---------------------------------------------------------------- JSON */

static void test_json(void)
{
    /* a Llama-like manifest and names JSON must escape round-trip exactly */
    dl_manifest *m = llama(2, 64, 256, 0);
    int64_t one = 3;
    REQUIRE(dl_manifest_add(m, "quote\"back\\slash/\xc3\xa9t\xc3\xa9", 1, &one, DL_TENSOR_EMBED) == 0, "%s",
            dl_errmsg());
    char *js = NULL;
    size_t len = 0;
    REQUIRE(dl_manifest_to_json(m, &js, &len) == 0, "%s", dl_errmsg());
    CHECK(strlen(js) == len, "length");
    CHECK(strstr(js, "{\"name\": \"model.stem.conv\", \"shape\": [16, 3, 3, 3], \"role\": \"matrix\"}") != NULL,
          "4-D line: %.200s", js);
    dl_manifest *back = NULL;
    REQUIRE(dl_manifest_from_json(js, len, &back) == 0, "%s", dl_errmsg());
    char msg[512];
    CHECK(dl_manifest_diff(m, back, "the JSON", msg, sizeof msg) == 0, "round trip differs: %s", msg);
    dl_plan *a = NULL, *b = NULL;
    REQUIRE(dl_manifest_plan_open(m, 6, &a) == 0 && dl_manifest_plan_open(back, 6, &b) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_fingerprint(m, a) == dl_manifest_fingerprint(back, b), "round trip fingerprint");
    dl_plan_close(&a);
    dl_plan_close(&b);
    dl_manifest_close(&back);

    /* files */
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_manifest.%d.json", (int)getpid());
    REQUIRE(dl_manifest_save(m, path) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_load(path, &back) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_diff(m, back, "the file", msg, sizeof msg) == 0, "file round trip: %s", msg);
    dl_manifest_close(&back);
    unlink(path);
    expect(dl_manifest_load(path, &back), DL_EIO, "missing file", path);
    CHECK(back == NULL, "out reset");
    free(js);
    dl_manifest_close(&m);

    /* a GPT-2 manifest keeps its config, hence its golden fingerprint */
    dl_model_config c = cfg_of(3);
    REQUIRE(dl_manifest_from_gpt(&c, &m) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_to_json(m, &js, &len) == 0, "%s", dl_errmsg());
    CHECK(strstr(js, "\"gpt\": {\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 64, \"seq_len\": 32, \"vocab\": 100}"),
          "gpt member: %.200s", js);
    REQUIRE(dl_manifest_from_json(js, len, &back) == 0, "%s", dl_errmsg());
    REQUIRE(dl_manifest_plan_open(back, golden[3].P, &a) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_gpt(back, NULL) && dl_manifest_fingerprint(back, a) == golden[3].fp, "GPT JSON fingerprint");
    dl_plan_close(&a);
    dl_manifest_close(&back);
    /* the same text with another vocabulary in "gpt": the tensors disagree */
    char *bad = strdup(js);
    char *v = strstr(bad, "\"vocab\": 100");
    memcpy(v, "\"vocab\": 200", 12);
    expect(dl_manifest_from_json(bad, strlen(bad), &back), DL_EMISMATCH, "gpt member vs tensors", "'wte'");
    free(bad);
    free(js);
    dl_manifest_close(&m);

    printf("JSON refusals:\n");
    static const struct {
        const char *text, *what, *needle;
        int rc;
    } cases[] = {
        {"", "empty text", "JSON", DL_EFORMAT},
        {"[1]", "not an object", "not an object", DL_EFORMAT},
        {"{\"tensors\": []}", "no version", "dloco_manifest", DL_EFORMAT},
        {"{\"dloco_manifest\": 2, \"tensors\": []}", "version 2", "version 1", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": []}", "no tensors", "no tensors", DL_EINVAL},
        {"{\"dloco_manifest\": 1, \"tensors\": {}}", "tensors not an array", "not an array", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensor\": []}", "unknown member", "unknown member \"tensor\"", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [3]}", "tensor not an object", "tensor 0", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"shape\": [2], \"role\": \"vector\"}]}", "no name", "no \"name\"",
         DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"role\": \"vector\"}]}", "no shape",
         "'w' has no \"shape\"", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2]}]}", "no role", "role (none)",
         DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"bias\"}]}", "bad role",
         "role \"bias\"", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2.5], \"role\": \"vector\"}]}",
         "fractional dimension", "not an integer", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [\"2\"], \"role\": \"vector\"}]}",
         "string dimension", "not an integer", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [1e300], \"role\": \"vector\"}]}",
         "1e300 dimension", "not an integer", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [0], \"role\": \"vector\"}]}",
         "zero dimension", "dimension 0 = 0", DL_EINVAL},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [], \"role\": \"vector\"}]}",
         "no dimensions", "0 dimensions", DL_EINVAL},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [1,1,1,1,1], \"role\": \"vector\"}]}",
         "5 dimensions", "more than 4 dimensions", DL_EINVAL},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"vector\", \"dtype\": "
         "\"BF16\"}]}",
         "bf16 dtype", "dtype BF16", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"vector\", \"rol\": 1}]}",
         "unknown tensor member", "unknown member \"rol\"", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"vector\"}, {\"name\": "
         "\"w\", \"shape\": [3], \"role\": \"vector\"}]}",
         "duplicate names", "both named 'w'", DL_EINVAL},
        {"{\"dloco_manifest\": 1, \"gpt\": {\"n_layer\": 1}, \"tensors\": [{\"name\": \"w\", \"shape\": [2], "
         "\"role\": \"vector\"}]}",
         "incomplete gpt", "\"n_head\"", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"vector\"}", "cut short",
         "JSON", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [], \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": "
         "\"vector\"}]}",
         "tensors twice", "\"tensors\" appears twice", DL_EFORMAT},
        {"{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2], \"role\": \"vector\", \"role\": "
         "\"matrix\"}]}",
         "role twice", "'w' has member \"role\" twice", DL_EFORMAT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dl_manifest *o = (dl_manifest *)&o;
        expect(dl_manifest_from_json(cases[k].text, strlen(cases[k].text), &o), cases[k].rc, cases[k].what,
               cases[k].needle);
        CHECK(o == NULL, "%s: out reset", cases[k].what);
    }
    /* a document of too many values is refused before it is parsed */
    size_t big = DL_MANIFEST_JSON_VALUES_MAX + 2;
    char *many = malloc(big + 1);
    memset(many, ',', big);
    many[0] = '[';
    many[big - 1] = ']';
    many[big] = 0;
    dl_manifest *o = (dl_manifest *)&o;
    expect(dl_manifest_from_json(many, big, &o), DL_EFORMAT, "4M values", "more than 4194304 JSON values");
    CHECK(o == NULL, "out reset");
    free(many);
    /* dtype F32 is accepted and not written back */
    const char *f32 = "{\"dloco_manifest\": 1, \"tensors\": [{\"name\": \"w\", \"shape\": [2, 3], \"role\": "
                      "\"embed\", \"dtype\": \"F32\"}]}";
    REQUIRE(dl_manifest_from_json(f32, strlen(f32), &m) == 0, "%s", dl_errmsg());
    CHECK(dl_manifest_tensor(m, 0)->kind == DL_TENSOR_EMBED && dl_manifest_tensor(m, 0)->numel == 6, "F32 tensor");
    dl_manifest_close(&m);
    printf("ok: JSON round trips (files too, GPT-2 config kept) and %zu malformed documents refused\n",
           sizeof cases / sizeof cases[0]);
}

int main(void)
{
    test_gpt_goldens();
    test_llama();
    test_refusals();
    test_json();
    return CHECK_DONE("test_manifest");
}
