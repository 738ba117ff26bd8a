/* Tests of the fragment plan (core/plan.c) on synthetic GPT-2-like tensor
 * tables: packing, balance, determinism, fingerprint, gather/scatter, schedule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/plan.h"
#include "tests/check.h"

/* ---------------------------------------------------------------- synthetic GPT-2 table */

typedef struct {
    int L, C, V, T;
    const char *label;
} gpt_cfg;

static const gpt_cfg GPT2_124M = {12, 768, 50304, 1024, "gpt2-124M"};
static const gpt_cfg TINY = {4, 256, 256, 128, "tiny"};

typedef struct {
    dl_tensor *t;
    int n, cap;
    size_t next; /* next free offset, floats */
    size_t pad;  /* offsets rounded up to a multiple of this (1 = packed) */
} table;

static void add(table *tb, const char *name, int kind, int d0, int d1)
{
    if (tb->n == tb->cap) {
        tb->cap = tb->cap ? 2 * tb->cap : 64;
        tb->t = realloc(tb->t, (size_t)tb->cap * sizeof *tb->t);
        if (!tb->t) abort();
    }
    dl_tensor *e = &tb->t[tb->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = d1 ? 2 : 1;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    e->kind = kind;
    tb->next = (tb->next + tb->pad - 1) / tb->pad * tb->pad;
    e->offset = tb->next;
    tb->next += e->numel;
}

/* GPT-2 layout in buffer order: wte, wpe, 12 tensors per layer, ln_f. */
static table make_gpt(gpt_cfg c, size_t pad)
{
    table tb = {.pad = pad};
    char nm[48];
    add(&tb, "wte", DL_TENSOR_EMBED, c.V, c.C);
    add(&tb, "wpe", DL_TENSOR_EMBED, c.T, c.C);
    for (int l = 0; l < c.L; l++) {
#define ADD(suffix, kind, d0, d1)                                                                            \
    do {                                                                                                     \
        snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);                                                       \
        add(&tb, nm, kind, d0, d1);                                                                          \
    } while (0)
        ADD("ln_1.weight", DL_TENSOR_VECTOR, c.C, 0);
        ADD("ln_1.bias", DL_TENSOR_VECTOR, c.C, 0);
        ADD("attn.c_attn.weight", DL_TENSOR_MATRIX, 3 * c.C, c.C);
        ADD("attn.c_attn.bias", DL_TENSOR_VECTOR, 3 * c.C, 0);
        ADD("attn.c_proj.weight", DL_TENSOR_MATRIX, c.C, c.C);
        ADD("attn.c_proj.bias", DL_TENSOR_VECTOR, c.C, 0);
        ADD("ln_2.weight", DL_TENSOR_VECTOR, c.C, 0);
        ADD("ln_2.bias", DL_TENSOR_VECTOR, c.C, 0);
        ADD("mlp.c_fc.weight", DL_TENSOR_MATRIX, 4 * c.C, c.C);
        ADD("mlp.c_fc.bias", DL_TENSOR_VECTOR, 4 * c.C, 0);
        ADD("mlp.c_proj.weight", DL_TENSOR_MATRIX, c.C, 4 * c.C);
        ADD("mlp.c_proj.bias", DL_TENSOR_VECTOR, c.C, 0);
#undef ADD
    }
    add(&tb, "ln_f.weight", DL_TENSOR_VECTOR, c.C, 0);
    add(&tb, "ln_f.bias", DL_TENSOR_VECTOR, c.C, 0);
    return tb;
}

/* ---------------------------------------------------------------- structure */

/* Every tensor in exactly one fragment, buffer order inside, spans contiguous,
 * sums consistent, and the balance bound of LPT holds. */
static void check_structure(const table *tb, const dl_plan *pl, const char *label)
{
    int P = dl_plan_P(pl), nt = tb->n;
    int *seen = calloc((size_t)nt, sizeof *seen);
    size_t total = 0, maxf = 0, maxt = 0, sum = 0;
    for (int i = 0; i < nt; i++) {
        total += tb->t[i].numel;
        if (tb->t[i].numel > maxt) maxt = tb->t[i].numel;
    }
    CHECK(dl_plan_ntensors(pl) == nt, "%s", label);
    CHECK(dl_plan_total_numel(pl) == total, "%s: %zu vs %zu", label, dl_plan_total_numel(pl), total);
    for (int p = 0; p < P; p++) {
        int ns = -1;
        const dl_plan_span *s = dl_plan_fragment_spans(pl, p, &ns);
        const int *ix = dl_plan_fragment_tensors(pl, p);
        size_t fsum = 0;
        int kinds[3] = {0, 0, 0};
        CHECK(ns == dl_plan_fragment_ntensors(pl, p) && ns >= 1, "%s p=%d ns=%d", label, p, ns);
        for (int k = 0; k < ns; k++) {
            int i = ix[k];
            CHECK(i >= 0 && i < nt, "%s p=%d idx %d", label, p, i);
            if (i < 0 || i >= nt) continue;
            seen[i]++;
            CHECK(s[k].tensor == i, "%s p=%d k=%d", label, p, k);
            CHECK(s[k].offset == fsum, "%s p=%d k=%d: span offset %zu, want %zu", label, p, k, s[k].offset, fsum);
            CHECK(s[k].numel == tb->t[i].numel && s[k].kind == tb->t[i].kind, "%s p=%d k=%d", label, p, k);
            CHECK(k == 0 || ix[k - 1] < i, "%s p=%d: not in buffer order at %d", label, p, k);
            CHECK(dl_plan_fragment_of(pl, i) == p, "%s tensor %d", label, i);
            kinds[tb->t[i].kind] = 1;
            fsum += s[k].numel;
        }
        CHECK(fsum == dl_plan_fragment_numel(pl, p), "%s p=%d: %zu vs %zu", label, p, fsum,
              dl_plan_fragment_numel(pl, p));
        for (int kd = 0; kd < 3; kd++)
            CHECK(dl_plan_fragment_has_kind(pl, p, kd) == kinds[kd], "%s p=%d kind %d", label, p, kd);
        sum += fsum;
        if (fsum > maxf) maxf = fsum;
    }
    for (int i = 0; i < nt; i++) CHECK(seen[i] == 1, "%s: tensor %d (%s) in %d fragments", label, i, tb->t[i].name, seen[i]);
    CHECK(sum == total, "%s: fragments sum %zu, total %zu", label, sum, total);
    CHECK(dl_plan_max_fragment_numel(pl) == maxf, "%s", label);

    /* LPT bound: OPT >= max(mean, largest tensor), LPT <= (4/3 - 1/(3P)) OPT. */
    double mean = (double)total / P, imb = dl_plan_imbalance(pl);
    double opt_lb = fmax(1.0, (double)maxt / mean);
    double bound = (4.0 / 3.0 - 1.0 / (3.0 * P)) * opt_lb;
    CHECK(fabs(imb - (double)maxf / mean) < 1e-12, "%s", label);
    CHECK(imb >= 1.0 - 1e-12 && imb <= bound + 1e-12, "%s P=%d: imbalance %.4f, LPT bound %.4f", label, P, imb, bound);
    printf("  %-10s P=%-3d tensors=%-4d imbalance=%.4f (largest tensor / mean = %.4f, LPT bound %.4f)\n", label, P,
           nt, imb, (double)maxt / mean, bound);
    free(seen);
}

static void test_structure(void)
{
    const gpt_cfg *cfgs[] = {&TINY, &GPT2_124M};
    const int Ps[] = {1, 2, 3, 4, 8, 12, 24, 48};
    printf("structure and balance:\n");
    for (int c = 0; c < 2; c++) {
        table tb = make_gpt(*cfgs[c], 1);
        int expect_nt = 2 + 12 * cfgs[c]->L + 2;
        CHECK(tb.n == expect_nt, "%d tensors", tb.n);
        for (size_t k = 0; k < sizeof Ps / sizeof Ps[0]; k++) {
            dl_plan *pl = NULL;
            int rc = dl_plan_build(tb.t, tb.n, Ps[k], &pl);
            CHECK(rc == 0 && pl, "%s P=%d: %s", cfgs[c]->label, Ps[k], dl_errmsg());
            if (!pl) continue;
            check_structure(&tb, pl, cfgs[c]->label);
            dl_plan_close(&pl);
        }
        /* P = ntensors: one tensor per fragment. */
        dl_plan *pl = NULL;
        CHECK(dl_plan_build(tb.t, tb.n, tb.n, &pl) == 0, "%s", dl_errmsg());
        if (pl) {
            for (int p = 0; p < tb.n; p++) CHECK(dl_plan_fragment_ntensors(pl, p) == 1, "p=%d", p);
            check_structure(&tb, pl, cfgs[c]->label);
            dl_plan_close(&pl);
        }
        free(tb.t);
    }
}

/* Tiny config, P=4, packed by hand (numel in floats, C=256):
 *   matrices per layer: c_fc 4C*C = 262144, mlp.c_proj 262144, c_attn 3C*C =
 *   196608, attn.c_proj C*C = 65536; wte V*C = 65536, wpe T*C = 32768;
 *   vectors: 3328 per layer (2C + 3C + C + 2C + 4C + C), 2C for ln_f -> 13824.
 *   total = 4*(786432 + 3328) + 65536 + 32768 + 512 = 3257856, mean 814464.
 *   LPT: the eight 262144s go two per fragment (524288 each); the four
 *   196608s one each (720896); then the five 65536s in table order: wte -> f0,
 *   the four c_proj -> f1, f2, f3, f0 (f0 = 851968); wpe -> f1 (819200);
 *   the 13824 vector floats all fit under 819200 on f2 and f3.
 *   So f0 = 851968, f1 = 819200, f2 + f3 = 1586688; imbalance 851968/814464
 *   = 1.04605, and wte sits in f0. */
static void test_tiny_by_hand(void)
{
    table tb = make_gpt(TINY, 1);
    dl_plan *pl = NULL;
    CHECK(dl_plan_build(tb.t, tb.n, 4, &pl) == 0, "%s", dl_errmsg());
    if (!pl) { free(tb.t); return; }
    CHECK(dl_plan_total_numel(pl) == 3257856, "total %zu", dl_plan_total_numel(pl));
    CHECK(dl_plan_fragment_numel(pl, 0) == 851968, "f0 %zu", dl_plan_fragment_numel(pl, 0));
    CHECK(dl_plan_fragment_numel(pl, 1) == 819200, "f1 %zu", dl_plan_fragment_numel(pl, 1));
    CHECK(dl_plan_fragment_numel(pl, 2) + dl_plan_fragment_numel(pl, 3) == 1586688, "f2+f3");
    CHECK(dl_plan_fragment_of(pl, 0) == 0 && dl_plan_fragment_of(pl, 1) == 1, "wte in f0, wpe in f1");
    /* Ties go to the lower table index, then to the lower fragment: the
     * 262144s go L0.c_fc f0, L0.mlp.c_proj f1, L1.c_fc f2, L1.mlp.c_proj f3,
     * L2.c_fc f0, ...; the c_attns L0..L3 to f0..f3; the 65536s as above. */
    static const char *const f0[] = {"wte", "h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight", "h.2.mlp.c_fc.weight",
                                     "h.3.attn.c_proj.weight"};
    static const char *const f1[] = {"wpe", "h.0.attn.c_proj.weight", "h.0.mlp.c_proj.weight",
                                     "h.1.attn.c_attn.weight", "h.2.mlp.c_proj.weight"};
    const char *const *want[2] = {f0, f1};
    for (int p = 0; p < 2; p++) {
        const int *ix = dl_plan_fragment_tensors(pl, p);
        int nk = dl_plan_fragment_ntensors(pl, p);
        CHECK(nk == 5, "f%d has %d tensors, want 5", p, nk);
        for (int k = 0; k < nk && k < 5; k++)
            CHECK(strcmp(dl_plan_tensor(pl, ix[k])->name, want[p][k]) == 0, "f%d[%d] = %s, want %s", p, k,
                  dl_plan_tensor(pl, ix[k])->name, want[p][k]);
    }
    CHECK(fabs(dl_plan_imbalance(pl) - 851968.0 / 814464.0) < 1e-12, "imbalance %.6f", dl_plan_imbalance(pl));
    CHECK(dl_plan_imbalance(pl) <= 1.05, "imbalance %.6f", dl_plan_imbalance(pl));
    printf("tiny P=4 by hand: f0=%zu f1=%zu f2=%zu f3=%zu imbalance=%.5f (want 1.04605)\n",
           dl_plan_fragment_numel(pl, 0), dl_plan_fragment_numel(pl, 1), dl_plan_fragment_numel(pl, 2),
           dl_plan_fragment_numel(pl, 3), dl_plan_imbalance(pl));
    dl_plan_close(&pl);
    dl_plan_close(&pl); /* safe twice */
    CHECK(pl == NULL, "close NULLs");

    /* P=1: everything, in buffer order. */
    CHECK(dl_plan_build(tb.t, tb.n, 1, &pl) == 0, "%s", dl_errmsg());
    if (pl) {
        const int *ix = dl_plan_fragment_tensors(pl, 0);
        int ok = dl_plan_fragment_ntensors(pl, 0) == tb.n;
        for (int i = 0; ok && i < tb.n; i++) ok = ix[i] == i;
        CHECK(ok, "P=1 keeps the table");
        CHECK(dl_plan_imbalance(pl) == 1.0, "%f", dl_plan_imbalance(pl));
        dl_plan_close(&pl);
    }
    free(tb.t);
}

/* ---------------------------------------------------------------- determinism and fingerprint */

static int plans_equal(const dl_plan *a, const dl_plan *b)
{
    if (dl_plan_P(a) != dl_plan_P(b) || dl_plan_ntensors(a) != dl_plan_ntensors(b)) return 0;
    for (int p = 0; p < dl_plan_P(a); p++) {
        int na, nb;
        const dl_plan_span *sa = dl_plan_fragment_spans(a, p, &na), *sb = dl_plan_fragment_spans(b, p, &nb);
        if (na != nb || memcmp(sa, sb, (size_t)na * sizeof *sa) != 0) return 0;
    }
    return 1;
}

static void test_fingerprint(void)
{
    const char cfg[] = "n_layer=4 n_embd=256 vocab=256 ctx=128";
    table tb = make_gpt(TINY, 1);
    dl_plan *a = NULL, *b = NULL, *c = NULL;
    CHECK(dl_plan_build(tb.t, tb.n, 6, &a) == 0 && dl_plan_build(tb.t, tb.n, 6, &b) == 0, "%s", dl_errmsg());
    if (!a || !b) goto out;
    uint64_t fa = dl_plan_fingerprint(a, cfg, sizeof cfg);
    CHECK(plans_equal(a, b), "two builds differ");
    CHECK(fa == dl_plan_fingerprint(b, cfg, sizeof cfg), "fingerprint not deterministic");
    CHECK(fa == dl_plan_fingerprint(a, cfg, sizeof cfg), "fingerprint not repeatable");
    printf("fingerprint tiny P=6: %016llx\n", (unsigned long long)fa);

    /* Config bytes matter. */
    char cfg2[sizeof cfg];
    memcpy(cfg2, cfg, sizeof cfg);
    cfg2[8] ^= 1;
    CHECK(dl_plan_fingerprint(a, cfg2, sizeof cfg2) != fa, "config change not seen");
    CHECK(dl_plan_fingerprint(a, cfg, sizeof cfg - 1) != fa, "config length not seen");
    CHECK(dl_plan_fingerprint(a, NULL, 0) != fa, "empty config equals");

    /* P matters. */
    CHECK(dl_plan_build(tb.t, tb.n, 7, &c) == 0, "%s", dl_errmsg());
    if (c) CHECK(dl_plan_fingerprint(c, cfg, sizeof cfg) != fa, "P change not seen");
    dl_plan_close(&c);

    /* A shape change with the same numel (c_attn [3C,C] -> [C,3C]) keeps the
     * packing but must change the fingerprint. */
    int ca = 4; /* wte, wpe, ln_1.weight, ln_1.bias, c_attn.weight */
    CHECK(strcmp(tb.t[ca].name, "h.0.attn.c_attn.weight") == 0, "%s", tb.t[ca].name);
    int s0 = tb.t[ca].shape[0];
    tb.t[ca].shape[0] = tb.t[ca].shape[1];
    tb.t[ca].shape[1] = s0;
    CHECK(dl_plan_build(tb.t, tb.n, 6, &c) == 0, "%s", dl_errmsg());
    if (c) {
        CHECK(plans_equal(a, c), "same numel, same packing");
        CHECK(dl_plan_fingerprint(c, cfg, sizeof cfg) != fa, "shape change not seen");
    }
    dl_plan_close(&c);
    tb.t[ca].shape[1] = tb.t[ca].shape[0];
    tb.t[ca].shape[0] = s0;

    /* A name change, and bytes after a name's terminator (not part of it). */
    tb.t[2].name[0] = 'L';
    CHECK(dl_plan_build(tb.t, tb.n, 6, &c) == 0, "%s", dl_errmsg());
    if (c) CHECK(dl_plan_fingerprint(c, cfg, sizeof cfg) != fa, "name change not seen");
    dl_plan_close(&c);
    tb.t[2].name[0] = 'h';
    tb.t[2].name[sizeof tb.t[2].name - 1] = 'x';
    CHECK(dl_plan_build(tb.t, tb.n, 6, &c) == 0, "%s", dl_errmsg());
    if (c) CHECK(dl_plan_fingerprint(c, cfg, sizeof cfg) == fa, "garbage after the name terminator was hashed");
    dl_plan_close(&c);
    tb.t[2].name[sizeof tb.t[2].name - 1] = '\0';

    /* An offset change (padding) keeps the packing but not the fingerprint. */
    table padded = make_gpt(TINY, 1000);
    CHECK(dl_plan_build(padded.t, padded.n, 6, &c) == 0, "%s", dl_errmsg());
    if (c) {
        CHECK(plans_equal(a, c), "padding changes packing");
        CHECK(dl_plan_fingerprint(c, cfg, sizeof cfg) != fa, "offset change not seen");
    }
    dl_plan_close(&c);
    free(padded.t);
out:
    dl_plan_close(&a);
    dl_plan_close(&b);
    free(tb.t);
}

/* ---------------------------------------------------------------- gather / scatter */

/* Padded table (offsets multiple of 1000 floats, so gaps exist between
 * tensors): gather reads exactly the fragment's elements, scatter writes
 * exactly them, and scatter(gather(x)) == x. */
static void test_gather_scatter(void)
{
    table tb = make_gpt(TINY, 1000);
    size_t nbuf = tb.next + 16; /* gaps plus a tail nobody owns */
    float *params = malloc(nbuf * sizeof *params), *work = malloc(nbuf * sizeof *params);
    unsigned char *owned = calloc(nbuf, 1);
    const int Ps[] = {1, 4, 7};
    printf("gather/scatter on %zu floats (padded layout):\n", nbuf);
    for (size_t i = 0; i < nbuf; i++) params[i] = (float)i;
    for (size_t k = 0; k < sizeof Ps / sizeof Ps[0]; k++) {
        dl_plan *pl = NULL;
        CHECK(dl_plan_build(tb.t, tb.n, Ps[k], &pl) == 0, "%s", dl_errmsg());
        if (!pl) continue;
        size_t covered = 0;
        float *payload = malloc(dl_plan_max_fragment_numel(pl) * sizeof *payload);
        for (int p = 0; p < Ps[k]; p++) {
            size_t fn = dl_plan_fragment_numel(pl, p);
            int ns;
            const dl_plan_span *s = dl_plan_fragment_spans(pl, p, &ns);
            memset(owned, 0, nbuf);
            for (int j = 0; j < ns; j++) memset(owned + tb.t[s[j].tensor].offset, 1, s[j].numel);

            /* gather: payload[span.offset + e] == params[tensor.offset + e] */
            for (size_t e = 0; e < fn; e++) payload[e] = -1.0f;
            dl_plan_gather(pl, p, params, payload);
            int bad = 0;
            for (int j = 0; j < ns; j++)
                for (size_t e = 0; e < s[j].numel; e++)
                    bad += payload[s[j].offset + e] != (float)(tb.t[s[j].tensor].offset + e);
            CHECK(bad == 0, "P=%d p=%d: %d gathered elements wrong", Ps[k], p, bad);

            /* scatter a sentinel: owned elements change, nothing else does */
            memcpy(work, params, nbuf * sizeof *work);
            for (size_t e = 0; e < fn; e++) payload[e] = -2.0f - (float)e;
            dl_plan_scatter(pl, p, payload, work);
            size_t changed = 0, wrong = 0;
            for (size_t i = 0; i < nbuf; i++) {
                changed += work[i] != params[i];
                wrong += owned[i] ? work[i] >= 0.0f : work[i] != params[i];
            }
            CHECK(wrong == 0 && changed == fn, "P=%d p=%d: scatter changed %zu of %zu, %zu wrong", Ps[k], p, changed,
                  fn, wrong);
            /* round trip: gather what we scattered, then scatter the original */
            float *back = malloc(fn * sizeof *back);
            dl_plan_gather(pl, p, work, back);
            CHECK(memcmp(back, payload, fn * sizeof *back) == 0, "P=%d p=%d: gather(scatter(x)) != x", Ps[k], p);
            dl_plan_gather(pl, p, params, back);
            dl_plan_scatter(pl, p, back, work);
            CHECK(memcmp(work, params, nbuf * sizeof *work) == 0, "P=%d p=%d: scatter(gather(x)) != x", Ps[k], p);
            free(back);
            covered += fn;
        }
        CHECK(covered == dl_plan_total_numel(pl), "P=%d: covered %zu", Ps[k], covered);
        printf("  P=%d: %zu floats gathered and scattered, gaps untouched\n", Ps[k], covered);
        free(payload);
        dl_plan_close(&pl);
    }
    free(params);
    free(work);
    free(owned);
    free(tb.t);
}

/* ---------------------------------------------------------------- schedule */

static void test_schedule(void)
{
    const int HP[][2] = {{24, 24}, {24, 4}, {24, 5}, {8, 24}, {1, 3}, {7, 3}, {10, 10}, {3, 7}, {5, 1}, {30, 24}};
    const int K = 5;
    printf("schedule:\n");
    for (size_t c = 0; c < sizeof HP / sizeof HP[0]; c++) {
        int H = HP[c][0], P = HP[c][1];
        int cap = (P + H - 1) / H, maxdue = 0;
        int *count = calloc((size_t)P, sizeof *count);
        int64_t *last = calloc((size_t)P, sizeof *last);
        int gaps_ok = 1;
        for (int64_t step = -2 * H; step <= 0; step++)
            for (int p = 0; p < P; p++) CHECK(!dl_plan_due(step, p, H, P), "H=%d P=%d due at step %lld", H, P,
                                               (long long)step);
        for (int64_t step = 1; step <= (int64_t)H * K; step++) {
            int due = 0;
            for (int p = 0; p < P; p++) {
                if (!dl_plan_due(step, p, H, P)) continue;
                due++;
                if (count[p]++ && step - last[p] != H) gaps_ok = 0;
                last[p] = step;
            }
            if (due > maxdue) maxdue = due;
        }
        for (int p = 0; p < P; p++) CHECK(count[p] == K, "H=%d P=%d: fragment %d due %d times in %d steps", H, P, p,
                                          count[p], H * K);
        CHECK(gaps_ok, "H=%d P=%d: a fragment's pushes are not H apart", H, P);
        CHECK(maxdue <= cap, "H=%d P=%d: %d due at once, cap %d", H, P, maxdue, cap);
        printf("  H=%-2d P=%-2d: each fragment due %d times in %d steps, at most %d per step (cap %d)\n", H, P, K,
               H * K, maxdue, cap);
        free(count);
        free(last);
    }
    /* Decoupled DiLoCo (P=H=24): fragment p first leaves at step p, fragment 0 at 24. */
    for (int p = 1; p < 24; p++) CHECK(dl_plan_due(p, p, 24, 24) && !dl_plan_due(p - 1, p, 24, 24), "p=%d", p);
    CHECK(dl_plan_due(24, 0, 24, 24) && dl_plan_due(48, 0, 24, 24) && !dl_plan_due(12, 0, 24, 24), "p=0");
    /* H=24, P=4: one fragment every 6 steps, at steps 6 12 18 24. */
    for (int step = 1; step <= 24; step++) {
        int any = 0;
        for (int p = 0; p < 4; p++) any |= dl_plan_due(step, p, 24, 4);
        CHECK(any == (step % 6 == 0), "H=24 P=4 step %d", step);
    }
}

/* ---------------------------------------------------------------- bad input */

static void expect_einval(const dl_tensor *t, int n, int P, const char *what)
{
    dl_plan *pl = (dl_plan *)&pl; /* non-NULL: build must reset it */
    dl_err_clear();
    int rc = dl_plan_build(t, n, P, &pl);
    CHECK(rc == DL_EINVAL && pl == NULL && dl_errmsg()[0], "%s: rc %d", what, rc);
    printf("  rejected %-22s -> %s\n", what, dl_errmsg());
}

static void test_rejects(void)
{
    table tb = make_gpt(TINY, 1);
    printf("bad input:\n");
    expect_einval(tb.t, tb.n, 0, "P = 0");
    expect_einval(tb.t, tb.n, -3, "P < 0");
    expect_einval(tb.t, tb.n, tb.n + 1, "P > ntensors");
    expect_einval(tb.t, 0, 1, "empty table");
    dl_tensor save;
#define MUTATE(i, stmt, what)                                                                                \
    do {                                                                                                     \
        save = tb.t[i];                                                                                      \
        stmt;                                                                                                \
        expect_einval(tb.t, tb.n, 4, what);                                                                  \
        tb.t[i] = save;                                                                                      \
    } while (0)
    MUTATE(3, tb.t[3].offset -= 1, "overlapping offsets");
    MUTATE(5, tb.t[5].offset = 0, "offsets out of order");
    MUTATE(4, tb.t[4].numel += 1, "numel != shape product");
    MUTATE(4, tb.t[4].ndim = 3, "ndim 3");
    MUTATE(4, tb.t[4].shape[1] = 0, "zero dimension");
    MUTATE(2, tb.t[2].kind = 7, "unknown kind");
    MUTATE(2, tb.t[2].name[0] = '\0', "empty name");
    MUTATE(2, memset(tb.t[2].name, 'a', sizeof tb.t[2].name), "unterminated name");
    MUTATE(3, strcpy(tb.t[3].name, tb.t[2].name), "duplicate name");
#undef MUTATE
    dl_plan *pl = NULL;
    CHECK(dl_plan_build(tb.t, tb.n, 4, &pl) == 0, "restored table builds: %s", dl_errmsg());
    dl_plan_close(&pl);
    free(tb.t);
}

int main(void)
{
    test_structure();
    test_tiny_by_hand();
    test_fingerprint();
    test_gather_scatter();
    test_schedule();
    test_rejects();
    return CHECK_DONE("test_plan");
}
