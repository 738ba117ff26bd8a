/* Tests of the LMDB state store: round trips, run mismatch and resume, version
 * fencing, snapshots, fragments of several blocks and snapshot ranges, map
 * growth (alone, behind this thread's snapshot, under other threads' snapshots),
 * a steady file size over hundreds of commits, the offline checker, bad
 * directories, stale readers and a SIGKILL crash test. Exits non-zero on the
 * first failure. */
#define _GNU_SOURCE /* nftw */
#include "core/manifest.h"
#include "storage/store.h"

#include "core/err.h"
#include "core/log.h"
#include "core/rng.h"
#include "tests/check.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// helpers: every check is a REQUIRE (tests/check.h): the scenarios build on
// each other, so the first failure ends the test

/* The model every test run records (the store checks it is a valid one). */
#define TEST_MODEL {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab = 256}

#define OK(expr)                                                                                         \
    do {                                                                                                 \
        int ok_rc_ = (expr);                                                                             \
        REQUIRE(ok_rc_ == 0, "%s -> %d (%s): %s", #expr, ok_rc_, dl_strerror(ok_rc_), dl_errmsg());        \
    } while (0)

/* expr must fail with `code` and a detail containing `needle` */
#define EXPECT_ERR(expr, code, needle)                                                                   \
    do {                                                                                                 \
        dl_err_clear();                                                                                  \
        int ee_rc_ = (expr);                                                                             \
        REQUIRE(ee_rc_ == (code), "%s -> %d (%s), expected %s: %s", #expr, ee_rc_, dl_strerror(ee_rc_),   \
              dl_strerror(code), dl_errmsg());                                                           \
        REQUIRE(strstr(dl_errmsg(), (needle)) != NULL, "%s: detail '%s' lacks '%s'", #expr, dl_errmsg(),  \
              (needle));                                                                                 \
    } while (0)

#define LMDB_OK(call)                                                                                    \
    do {                                                                                                 \
        int lm_rc_ = (call);                                                                             \
        REQUIRE(lm_rc_ == 0, "%s: %s", #call, mdb_strerror(lm_rc_));                                       \
    } while (0)

static char g_base[4096];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_base, name); }

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* Deterministic contents: params and momentum of fragment p at version v.
 * Integer arithmetic, then one division: a float multiply-add may be
 * contracted to an FMA in one vectorised loop and not in another (gnu11's
 * -ffp-contract=fast), so `a + b * c` computed in fill() and in equal_to()
 * could differ in the last bit depending on a buffer's alignment. */
static float pval(uint32_t p, uint64_t v, size_t i)
{
    return (float)((double)(((uint64_t)p * 1000 + v) * 1000 + i % 977) / 1000.0);
}
static float mval(uint32_t p, uint64_t v, size_t i)
{
    return (float)(((double)(int64_t)(i % 311) - (double)(int64_t)(p + v) * 5000.0) / 10000.0);
}

static float *fill(float *x, size_t n, uint32_t p, uint64_t v, int mom)
{
    for (size_t i = 0; i < n; i++) x[i] = mom ? mval(p, v, i) : pval(p, v, i);
    return x;
}
static int equal_to(const float *x, size_t n, uint32_t p, uint64_t v, int mom)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != (mom ? mval(p, v, i) : pval(p, v, i))) return 0;
    return 1;
}
static int all_zero(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return 0;
    return 1;
}

/* Initial params of a run: arrays at version 0. */
typedef struct {
    float *a[8];
} params_set;
static params_set make_init(uint32_t P, const uint64_t *numel)
{
    params_set ps = {{0}};
    for (uint32_t p = 0; p < P; p++) ps.a[p] = fill(malloc(numel[p] * 4), numel[p], p, 0, 0);
    return ps;
}
static void free_init(params_set *ps)
{
    for (int i = 0; i < 8; i++) free(ps->a[i]);
}

static dl_merge_contrib contrib(const char *id, uint64_t base, uint64_t tokens, double w, int decision,
                                const char *reason)
{
    dl_merge_contrib c = {.base_version = base, .staleness = 1, .steps = tokens / 10, .tokens = tokens,
                          .weight = w, .decision = decision};
    snprintf(c.learner_id, sizeof c.learner_id, "%s", id);
    snprintf(c.reason, sizeof c.reason, "%s", reason);
    return c;
}

/* Commit version v of fragment p (numel n) with the deterministic contents
 * (with_mom 0: no momentum, as a run with outer momentum 0 commits) and a
 * one-contributor record of `tokens` merged tokens. */
static int commit_v_mom(dl_store *s, uint32_t p, uint64_t v, size_t n, uint64_t tokens, int with_mom)
{
    float *x = fill(malloc(n * 4), n, p, v, 0), *m = with_mom ? fill(malloc(n * 4), n, p, v, 1) : NULL;
    dl_merge_contrib c = contrib("learner-0", v - 1, tokens, 1.0, DL_MERGE_MERGED, "");
    dl_merge_record rec = {.epoch = 1, .wallclock_ns = 42, .staleness_fn = "constant", .delta_norm = 0.5,
                           .n_contrib = 1, .contrib = &c};
    dl_store_ledger led = {{[DL_LEDGER_APPLIED] = tokens}};
    int rc = dl_store_commit_merge(s, p, v, x, m, &rec, &led);
    free(x);
    free(m);
    return rc;
}
static int commit_v(dl_store *s, uint32_t p, uint64_t v, size_t n, uint64_t tokens)
{
    return commit_v_mom(s, p, v, n, tokens, 1);
}

static int count_cb(const dl_merge_record *r, void *ctx)
{
    (void)r;
    (*(int *)ctx)++;
    return 0;
}

static int count_learner_cb(const dl_store_learner *r, void *ctx)
{
    (void)r;
    (*(int *)ctx)++;
    return 0;
}

static dl_store *open_store(const char *dir, uint64_t map_size, int durability, int read_only)
{
    dl_store_opts o = dl_store_opts_default();
    o.map_size = map_size;
    o.durability = durability;
    o.read_only = read_only;
    dl_store *s = NULL;
    OK(dl_store_open(dir, &o, &s));
    return s;
}

// ----------------------------------------------------------------------------
// round trip of everything, resume and run mismatch

struct versions {
    uint64_t v[8];
    int n;
};
static int collect_cb(const dl_merge_record *r, void *ctx)
{
    struct versions *vs = ctx;
    if (vs->n < 8) vs->v[vs->n++] = r->version;
    return 0;
}
static int stop_cb(const dl_merge_record *r, void *ctx)
{
    (void)r, (void)ctx;
    return 7;
}
static int learner_list_cb(const dl_store_learner *r, void *ctx)
{
    char *names = ctx;
    strcat(names, r->id);
    strcat(names, ",");
    return 0;
}

static void test_roundtrip(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "rt/nested/store");
    const uint64_t numel[3] = {5, 1000, 70000}; /* tiny (leaf page), medium, large (overflow pages) */
    const char *cfg = "[sync]\nquorum = 2\nouter_lr = 0.7\n";
    dl_store_run run = {"run-A", 0x1234abcd5678ef01ull, cfg, 3, numel, TEST_MODEL, 1337};
    params_set init = make_init(3, numel);

    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    dl_store_run got;
    REQUIRE(dl_store_n_fragments(s) == 0, "fresh store has no run");
    EXPECT_ERR(dl_store_get_run(s, &got), DL_ENOTFOUND, "no run");
    EXPECT_ERR(dl_store_read_fragment(s, 0, &(uint64_t){0}, NULL, NULL), DL_ENOTFOUND, "no run");
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    OK(dl_store_get_run(s, &got));
    REQUIRE(strcmp(got.run_id, "run-A") == 0 && got.fingerprint == run.fingerprint && got.n_fragments == 3,
          "run meta");
    REQUIRE(strcmp(got.config_text, cfg) == 0, "config text kept");
    for (uint32_t p = 0; p < 3; p++) REQUIRE(got.numel[p] == numel[p] && dl_store_fragment_numel(s, p) == numel[p], "numel");
    REQUIRE(dl_store_fragment_numel(s, 3) == 0, "numel out of range is 0");

    uint64_t epoch = 99;
    OK(dl_store_get_epoch(s, &epoch));
    REQUIRE(epoch == 0, "new store at epoch 0, got %llu", (unsigned long long)epoch);
    OK(dl_store_bump_epoch(s, &epoch));
    REQUIRE(epoch == 1, "bump -> 1");
    OK(dl_store_bump_epoch(s, &epoch));
    REQUIRE(epoch == 2, "bump -> 2");
    printf("ok: new store: run meta, config text, numels, epoch 0 -> 1 -> 2\n");

    float *x = malloc(70000 * 4), *m = malloc(70000 * 4);
    for (uint32_t p = 0; p < 3; p++) {
        uint64_t v = 9;
        OK(dl_store_read_fragment(s, p, &v, x, m));
        REQUIRE(v == 0 && equal_to(x, numel[p], p, 0, 0) && all_zero(m, numel[p]), "fragment %u at version 0", p);
    }
    EXPECT_ERR(dl_store_read_fragment(s, 3, &(uint64_t){0}, x, NULL), DL_ERANGE, "out of range");
    printf("ok: every fragment at version 0 with its initial params and zero momentum\n");

    /* merge 1 of fragment 1: two merged, one dropped-stale, one rejected (long reason) */
    const char *long_reason = "non-finite value in the delta at element 12345 of tensor h.3.mlp.c_fc.weight";
    dl_merge_contrib cs[4] = {
        contrib("learner-a", 0, 1000, 0.75, DL_MERGE_MERGED, "ok"),
        contrib("learner-b", 0, 300, 0.25, DL_MERGE_MERGED, ""),
        contrib("learner-c-with-a-64-character-id-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 0, 500, 0.0,
                DL_MERGE_DROPPED_STALE, "staleness 9 > 8"),
        contrib("learner-d", 0, 77, 0.0, DL_MERGE_REJECTED, long_reason),
    };
    REQUIRE(strlen(cs[2].learner_id) == 64, "64-char id used");
    cs[0].staleness = 0, cs[0].steps = 24;
    dl_merge_record rec = {.version = 12345 /* ignored */, .epoch = 2, .wallclock_ns = 1700000000123456789ll,
                           .staleness_fn = "inverse_sqrt", .delta_norm = 3.25, .n_contrib = 4, .contrib = cs};
    fill(x, numel[1], 1, 1, 0), fill(m, numel[1], 1, 1, 1);
    dl_store_ledger led = {{[DL_LEDGER_APPLIED] = 1300, [DL_LEDGER_DROPPED_STALE] = 500}};
    dl_store_ledger led_bad = led;
    led_bad.tokens[DL_LEDGER_APPLIED] = 1299;
    EXPECT_ERR(dl_store_commit_merge(s, 1, 1, x, m, &rec, &led_bad), DL_EINVAL, "applied tokens");
    EXPECT_ERR(dl_store_commit_merge(s, 1, 1, x, m, &rec, NULL), DL_EINVAL, "applied tokens");
    OK(dl_store_commit_merge(s, 1, 1, x, m, &rec, &led));
    uint64_t v = 0;
    OK(dl_store_read_fragment(s, 1, &v, x, m));
    REQUIRE(v == 1 && equal_to(x, numel[1], 1, 1, 0) && equal_to(m, numel[1], 1, 1, 1), "fragment 1 at version 1");
    dl_merge_record r2;
    OK(dl_store_get_merge(s, 1, 1, &r2));
    REQUIRE(r2.version == 1 && r2.epoch == 2 && r2.wallclock_ns == 1700000000123456789ll && r2.delta_norm == 3.25 &&
              strcmp(r2.staleness_fn, "inverse_sqrt") == 0 && r2.n_contrib == 4,
          "record header round trip");
    for (int i = 0; i < 4; i++) {
        const dl_merge_contrib *a = &cs[i], *b = &r2.contrib[i];
        REQUIRE(strcmp(a->learner_id, b->learner_id) == 0 && a->base_version == b->base_version &&
                  a->staleness == b->staleness && a->steps == b->steps && a->tokens == b->tokens &&
                  a->weight == b->weight && a->decision == b->decision,
              "contributor %d round trip", i);
    }
    REQUIRE(strcmp(r2.contrib[0].reason, "ok") == 0 && strcmp(r2.contrib[2].reason, "staleness 9 > 8") == 0, "reasons");
    REQUIRE(strlen(r2.contrib[3].reason) == DL_STORE_REASON_MAX &&
              strncmp(r2.contrib[3].reason, long_reason, DL_STORE_REASON_MAX) == 0,
          "long reason truncated to %d chars: '%s'", DL_STORE_REASON_MAX, r2.contrib[3].reason);
    dl_merge_record_free(&r2);
    REQUIRE(r2.contrib == NULL, "record free NULLs");
    printf("ok: merge commit: params, momentum, version and a 4-contributor record round trip "
           "(64-char id kept, long reason truncated)\n");

    OK(commit_v(s, 1, 2, numel[1], 50));
    struct versions vs = {{0}, 0};
    OK(dl_store_foreach_merge(s, 1, 0, collect_cb, &vs));
    REQUIRE(vs.n == 2 && vs.v[0] == 1 && vs.v[1] == 2, "foreach from 0 sees 1,2 (n=%d)", vs.n);
    vs.n = 0;
    OK(dl_store_foreach_merge(s, 1, 2, collect_cb, &vs));
    REQUIRE(vs.n == 1 && vs.v[0] == 2, "foreach from 2 sees 2");
    vs.n = 0;
    OK(dl_store_foreach_merge(s, 0, 0, collect_cb, &vs));
    REQUIRE(vs.n == 0, "fragment 0 has no records");
    REQUIRE(dl_store_foreach_merge(s, 1, 0, stop_cb, NULL) == 7, "callback stop value returned");
    EXPECT_ERR(dl_store_get_merge(s, 1, 3, &r2), DL_ENOTFOUND, "version 3");
    EXPECT_ERR(dl_store_get_merge(s, 0, 1, &r2), DL_ENOTFOUND, "fragment 0");
    printf("ok: merge records iterate in version order per fragment; absent ones are DL_ENOTFOUND\n");

    dl_store_ledger l;
    OK(dl_store_ledger_get(s, &l));
    REQUIRE(l.tokens[DL_LEDGER_APPLIED] == 1350 && l.tokens[DL_LEDGER_DROPPED_STALE] == 500 &&
              l.tokens[DL_LEDGER_REJECTED] == 0 && l.tokens[DL_LEDGER_LOST] == 0,
          "ledger after commits: %llu %llu %llu %llu", (unsigned long long)l.tokens[0],
          (unsigned long long)l.tokens[1], (unsigned long long)l.tokens[2], (unsigned long long)l.tokens[3]);
    OK(dl_store_ledger_add(s, &(dl_store_ledger){{[DL_LEDGER_REJECTED] = 77}}));
    OK(dl_store_ledger_add(s, &(dl_store_ledger){{[DL_LEDGER_LOST] = 11, [DL_LEDGER_DISCARDED] = 5,
                                                   [DL_LEDGER_OUTSTANDING] = 3}}));
    OK(dl_store_ledger_get(s, &l));
    REQUIRE(l.tokens[2] == 77 && l.tokens[3] == 11 && l.tokens[0] == 1350 && l.tokens[DL_LEDGER_DISCARDED] == 5 &&
              l.tokens[DL_LEDGER_OUTSTANDING] == 3,
          "ledger add");
    printf("ok: ledger: commits add merged (1350) and dropped-stale (500) tokens, not rejected; "
           "ledger_add moves rejected/lost\n");

    dl_store_learner la = {.id = "learner-b", .first_seen_ns = 10, .last_seen_ns = 20, .pushes = 3, .merged = 2,
                           .dropped = 1, .tokens_applied = 300, .bytes_in = 4096, .bytes_out = 8192};
    for (int i = 0; i < DL_STORE_PUBKEY_BYTES; i++) la.pubkey[i] = (uint8_t)(i * 7 + 1);
    OK(dl_store_learner_put(s, &la));
    dl_store_learner lb = la;
    snprintf(lb.id, sizeof lb.id, "learner-a");
    lb.pushes = 1;
    OK(dl_store_learner_put(s, &lb));
    snprintf(lb.id, sizeof lb.id, "learner-c");
    OK(dl_store_learner_put(s, &lb));
    lb.pushes = 99, lb.last_seen_ns = 1000; /* update learner-c */
    OK(dl_store_learner_put(s, &lb));
    dl_store_learner lg;
    OK(dl_store_learner_get(s, "learner-b", &lg));
    REQUIRE(strcmp(lg.id, la.id) == 0 && lg.first_seen_ns == 10 && lg.last_seen_ns == 20 &&
              memcmp(lg.pubkey, la.pubkey, DL_STORE_PUBKEY_BYTES) == 0 && lg.pushes == 3 && lg.merged == 2 &&
              lg.dropped == 1 && lg.tokens_applied == 300 && lg.bytes_in == 4096 && lg.bytes_out == 8192,
          "learner round trip");
    OK(dl_store_learner_get(s, "learner-c", &lg));
    REQUIRE(lg.pushes == 99 && lg.last_seen_ns == 1000, "learner update replaces");
    char names[256] = "";
    OK(dl_store_foreach_learner(s, learner_list_cb, names));
    REQUIRE(strcmp(names, "learner-a,learner-b,learner-c,") == 0, "learners in id order: %s", names);
    EXPECT_ERR(dl_store_learner_get(s, "nobody", &lg), DL_ENOTFOUND, "nobody");
    snprintf(lb.id, sizeof lb.id, "has space");
    EXPECT_ERR(dl_store_learner_put(s, &lb), DL_EINVAL, "learner id");
    printf("ok: learner registry put/replace/get/iterate (id order), unknown id DL_ENOTFOUND, bad id DL_EINVAL\n");
    {
        /* many records in one transaction: all or none */
        dl_store_learner many[3] = {{.id = "learner-b", .pushes = 7}, {.id = "learner-d", .pushes = 8, .step = 80},
                                    {.id = "learner-e", .pushes = 9, .tokens = 90}};
        OK(dl_store_learner_put_many(s, many, 3));
        OK(dl_store_learner_get(s, "learner-b", &lg));
        REQUIRE(lg.pushes == 7, "put_many replaces learner-b");
        OK(dl_store_learner_get(s, "learner-d", &lg));
        REQUIRE(lg.pushes == 8 && lg.step == 80, "put_many inserts learner-d");
        OK(dl_store_learner_get(s, "learner-e", &lg));
        REQUIRE(lg.pushes == 9 && lg.tokens == 90, "put_many inserts learner-e");
        snprintf(many[0].id, sizeof many[0].id, "learner-f");
        snprintf(many[1].id, sizeof many[1].id, "bad id");
        EXPECT_ERR(dl_store_learner_put_many(s, many, 2), DL_EINVAL, "learner id");
        EXPECT_ERR(dl_store_learner_get(s, "learner-f", &lg), DL_ENOTFOUND, "not in the registry"); /* nothing of a refused put_many */
        OK(dl_store_learner_put_many(s, NULL, 0));
        printf("ok: learner registry put_many: one transaction, all or none\n");
    }

    dl_merge_contrib bad = contrib("", 0, 1, 1.0, DL_MERGE_MERGED, "");
    dl_merge_record brec = {.staleness_fn = "x", .n_contrib = 1, .contrib = &bad};
    EXPECT_ERR(dl_store_commit_merge(s, 1, 3, x, m, &brec, NULL), DL_EINVAL, "contributor learner id");
    bad = contrib("ok-id", 0, 1, 1.0, 9, "");
    EXPECT_ERR(dl_store_commit_merge(s, 1, 3, x, m, &brec, NULL), DL_EINVAL, "decision");
    EXPECT_ERR(dl_store_commit_merge(s, 5, 1, x, m, &rec, &led), DL_ERANGE, "out of range");
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.map_size == (1ull << 30) && st.stale_readers_cleared == 0 && st.used_bytes > 0, "stats");
    printf("ok: bad records refused (DL_EINVAL), fragment out of range (DL_ERANGE); stats map %llu MiB\n",
           (unsigned long long)(st.map_size >> 20));

    dl_store_close(&s);
    REQUIRE(s == NULL, "close NULLs");
    dl_store_close(&s); /* safe twice */

    /* reopen: everything persisted, resume keeps state */
    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_get_run(s, &got));
    REQUIRE(strcmp(got.run_id, "run-A") == 0 && got.fingerprint == run.fingerprint && got.n_fragments == 3 &&
              got.numel[2] == 70000 && strcmp(got.config_text, cfg) == 0,
          "run meta after reopen");
    OK(dl_store_init_run(s, &run, NULL));
    OK(dl_store_get_epoch(s, &epoch));
    REQUIRE(epoch == 2, "epoch persisted");
    OK(dl_store_read_fragment(s, 1, &v, x, m));
    REQUIRE(v == 2 && equal_to(x, numel[1], 1, 2, 0) && equal_to(m, numel[1], 1, 2, 1), "fragment 1 kept at v2");
    OK(dl_store_read_fragment(s, 2, &v, x, m));
    REQUIRE(v == 0 && equal_to(x, numel[2], 2, 0, 0), "fragment 2 kept at v0");
    OK(dl_store_ledger_get(s, &l));
    REQUIRE(l.tokens[0] == 1350 && l.tokens[1] == 500 && l.tokens[2] == 77 && l.tokens[3] == 11, "ledger persisted");
    OK(dl_store_learner_get(s, "learner-c", &lg));
    REQUIRE(lg.pushes == 99, "learners persisted");
    printf("ok: reopen + init_run of the same run resumes: meta, epoch, fragments, ledger, learners kept\n");

    dl_store_run other = run;
    other.run_id = "run-B";
    EXPECT_ERR(dl_store_init_run(s, &other, (const float *const *)init.a), DL_EMISMATCH, "'run-A'");
    REQUIRE(strstr(dl_errmsg(), "'run-B'") != NULL, "message names both runs: %s", dl_errmsg());
    other = run;
    other.fingerprint = 0x77;
    EXPECT_ERR(dl_store_init_run(s, &other, (const float *const *)init.a), DL_EMISMATCH, "0000000000000077");
    REQUIRE(strstr(dl_errmsg(), "1234abcd5678ef01") != NULL, "message names both fingerprints: %s", dl_errmsg());
    REQUIRE(strstr(dl_errmsg(), "(the store's model: L=") && strstr(dl_errmsg(), "; this one: L="),
            "message names both shapes: %s", dl_errmsg());
    other = run;
    const uint64_t numel2[3] = {5, 1000, 70001};
    other.numel = numel2;
    EXPECT_ERR(dl_store_init_run(s, &other, (const float *const *)init.a), DL_EMISMATCH, "refusing");
    OK(dl_store_read_fragment(s, 1, &v, NULL, NULL));
    REQUIRE(v == 2, "state untouched by refused init");
    printf("ok: init_run of another run id / fingerprint / numel -> DL_EMISMATCH naming both runs\n");
    dl_store_close(&s);

    OK(dl_store_check(dir, stdout));
    s = open_store(dir, 0, DL_STORE_SYNC, 1);
    OK(dl_store_read_fragment(s, 1, &v, x, NULL));
    REQUIRE(v == 2, "read-only read");
    EXPECT_ERR(commit_v(s, 1, 3, numel[1], 1), DL_EINVAL, "read-only");
    EXPECT_ERR(dl_store_bump_epoch(s, &epoch), DL_EINVAL, "read-only");
    dl_store_close(&s);
    printf("ok: check passes; read-only open reads and refuses writes\n");
    free(x), free(m);
    free_init(&init);
}

// ----------------------------------------------------------------------------
// a commit must be stored version + 1; a refused commit changes nothing

static void test_version_fence(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "fence");
    const uint64_t numel[2] = {300, 9};
    dl_store_run run = {"fence", 7, NULL, 2, numel, TEST_MODEL, 1337};
    params_set init = make_init(2, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    OK(commit_v(s, 0, 1, numel[0], 10));
    EXPECT_ERR(commit_v(s, 0, 3, numel[0], 10), DL_EMISMATCH, "stored version is 1");
    EXPECT_ERR(commit_v(s, 0, 1, numel[0], 10), DL_EMISMATCH, "refusing to commit version 1");
    EXPECT_ERR(commit_v(s, 0, 0, numel[0], 10), DL_EMISMATCH, "refusing");
    EXPECT_ERR(commit_v(s, 1, 2, numel[1], 10), DL_EMISMATCH, "stored version is 0");
    float x[300], m[300];
    uint64_t v;
    OK(dl_store_read_fragment(s, 0, &v, x, m));
    REQUIRE(v == 1 && equal_to(x, 300, 0, 1, 0) && equal_to(m, 300, 0, 1, 1), "fragment 0 still v1");
    OK(dl_store_read_fragment(s, 1, &v, x, m));
    REQUIRE(v == 0 && equal_to(x, 9, 1, 0, 0) && all_zero(m, 9), "fragment 1 still v0");
    int n = 0;
    OK(dl_store_foreach_merge(s, 0, 0, count_cb, &n));
    REQUIRE(n == 1, "one merge record, got %d", n);
    dl_store_ledger l;
    OK(dl_store_ledger_get(s, &l));
    REQUIRE(l.tokens[0] == 10, "ledger only counts the accepted commit: %llu", (unsigned long long)l.tokens[0]);
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    printf("ok: commits of versions 3, 1, 0 (stored 1) and 2 (stored 0) refused with DL_EMISMATCH; "
           "params, momentum, records, ledger unchanged; check passes\n");
    free_init(&init);
}

// ----------------------------------------------------------------------------
// a snapshot keeps seeing its version while commits happen

static void test_snapshot(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "snap");
    const uint64_t numel[2] = {5, 70000};
    dl_store_run run = {"snap", 8, NULL, 2, numel, TEST_MODEL, 1337};
    params_set init = make_init(2, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    OK(commit_v(s, 0, 1, numel[0], 1));
    OK(commit_v(s, 1, 1, numel[1], 1));

    dl_store_snap *snap = NULL;
    OK(dl_store_snapshot_begin(s, &snap));
    const float *p0, *p1;
    size_t n0, n1;
    uint64_t v0, v1;
    OK(dl_store_snapshot_fragment(snap, 0, &v0, &p0, &n0));
    OK(dl_store_snapshot_fragment(snap, 1, &v1, &p1, &n1));
    REQUIRE(v0 == 1 && v1 == 1 && n0 == 5 && n1 == 70000, "snapshot sees v1");
    REQUIRE((uintptr_t)p0 % 4 == 0 && (uintptr_t)p1 % 4 == 0, "snapshot pointers are float-aligned");
    EXPECT_ERR(dl_store_snapshot_fragment(snap, 2, &v0, &p0, &n0), DL_ERANGE, "out of range");

    /* commits in between: two versions of each fragment */
    OK(commit_v(s, 0, 2, numel[0], 1));
    OK(commit_v(s, 1, 2, numel[1], 1));
    OK(commit_v(s, 1, 3, numel[1], 1));
    REQUIRE(equal_to(p0, 5, 0, 1, 0) && equal_to(p1, 70000, 1, 1, 0), "old pointers still hold v1 contents");
    OK(dl_store_snapshot_fragment(snap, 1, &v1, &p1, &n1));
    REQUIRE(v1 == 1 && equal_to(p1, 70000, 1, 1, 0), "snapshot re-read still v1");
    uint64_t v;
    OK(dl_store_read_fragment(s, 1, &v, NULL, NULL));
    REQUIRE(v == 3, "read outside the snapshot sees v3");
    dl_store_snap *snap2 = NULL;
    OK(dl_store_snapshot_begin(s, &snap2));
    OK(dl_store_snapshot_fragment(snap2, 1, &v1, &p1, &n1));
    REQUIRE(v1 == 3 && equal_to(p1, 70000, 1, 3, 0), "new snapshot sees v3");
    OK(dl_store_snapshot_fragment(snap2, 0, &v0, &p0, &n0));
    REQUIRE(v0 == 2 && equal_to(p0, 5, 0, 2, 0), "new snapshot sees fragment 0 v2");
    dl_store_snapshot_end(&snap);
    dl_store_snapshot_end(&snap2);
    REQUIRE(snap == NULL && snap2 == NULL, "snapshot end NULLs");
    dl_store_snapshot_end(&snap);
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    printf("ok: snapshot taken at v1 keeps serving v1 (same pointers, re-reads) across 3 commits; "
           "a new snapshot sees v3; pointers aligned\n");
    free_init(&init);
}

// ----------------------------------------------------------------------------
// fragments of several blocks: round trip, snapshot ranges, stats

static dl_store *open_store_wait(const char *dir, uint64_t map_size, int durability, uint32_t grow_wait_ms)
{
    dl_store_opts o = dl_store_opts_default();
    o.map_size = map_size;
    o.durability = durability;
    o.grow_wait_ms = grow_wait_ms;
    dl_store *s = NULL;
    OK(dl_store_open(dir, &o, &s));
    return s;
}

static uint64_t file_size(const char *dir)
{
    char path[4300];
    struct stat st;
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    REQUIRE(stat(path, &st) == 0, "stat %s: %s", path, strerror(errno));
    return (uint64_t)st.st_size;
}

#define BF ((uint64_t)DL_STORE_BLOCK_FLOATS)

static void test_blocks(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "blocks");
    /* 3 blocks (a short last one), exactly 1 block, 1 block + 1 element, a leaf-page value */
    const uint64_t numel[4] = {2 * BF + 1000, BF, BF + 1, 3};
    dl_store_run run = {"blocks", 14, NULL, 4, numel, TEST_MODEL, 1337};
    params_set init = make_init(4, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    float *x = malloc(numel[0] * 4), *m = malloc(numel[0] * 4);
    for (uint32_t p = 0; p < 4; p++) {
        uint64_t v = 9;
        OK(dl_store_read_fragment(s, p, &v, x, m));
        REQUIRE(v == 0 && equal_to(x, numel[p], p, 0, 0) && all_zero(m, numel[p]), "fragment %u at v0", p);
        OK(commit_v(s, p, 1, numel[p], 10));
        OK(dl_store_read_fragment(s, p, &v, x, m));
        REQUIRE(v == 1 && equal_to(x, numel[p], p, 1, 0) && equal_to(m, numel[p], p, 1, 1), "fragment %u at v1", p);
    }
    printf("ok: fragments of 3 blocks, 1 block, 1 block + 1 and 3 floats round trip params and momentum "
           "(init and commit)\n");

    dl_store_snap *snap;
    OK(dl_store_snapshot_begin(s, &snap));
    uint64_t v;
    size_t n, n2;
    const float *a, *b;
    OK(dl_store_snapshot_info(snap, 0, &v, &n));
    REQUIRE(v == 1 && n == numel[0], "info: v%llu numel %zu", (unsigned long long)v, n);
    /* chunks that divide a block, starting at a multiple: pointers into the map */
    for (uint64_t off = 0; off < numel[0]; off += BF / 4) {
        OK(dl_store_snapshot_range(snap, 0, off, BF / 4, &v, &a, &n));
        OK(dl_store_snapshot_range(snap, 0, off, BF / 4, &v, &b, &n2));
        uint64_t want = numel[0] - off < BF / 4 ? numel[0] - off : BF / 4;
        REQUIRE(v == 1 && n == want && n2 == n && a == b && (uintptr_t)a % 4 == 0, "chunk at %llu: n %zu, %s",
                (unsigned long long)off, n, a == b ? "same pointer" : "copied");
        for (size_t i = 0; i < n; i += 997)
            REQUIRE(a[i] == pval(0, 1, off + i), "chunk at %llu element %zu", (unsigned long long)off, i);
    }
    /* ranges across a block boundary: copies, right contents */
    OK(dl_store_snapshot_range(snap, 0, BF - 10, 30, &v, &a, &n));
    OK(dl_store_snapshot_range(snap, 0, BF - 10, 30, &v, &b, &n2));
    REQUIRE(n == 30 && a != b, "a range across blocks is copied (%zu)", n);
    for (size_t i = 0; i < n; i++) REQUIRE(a[i] == pval(0, 1, BF - 10 + i) && b[i] == a[i], "across element %zu", i);
    OK(dl_store_snapshot_range(snap, 0, 5, numel[0], &v, &a, &n));
    REQUIRE(n == numel[0] - 5, "a range is cut at the end: %zu", n);
    for (size_t i = 0; i < n; i += 101) REQUIRE(a[i] == pval(0, 1, 5 + i), "long range element %zu", i);
    EXPECT_ERR(dl_store_snapshot_range(snap, 0, numel[0], 1, &v, &a, &n), DL_ERANGE, "past its");
    EXPECT_ERR(dl_store_snapshot_range(snap, 4, 0, 1, &v, &a, &n), DL_ERANGE, "out of range");
    EXPECT_ERR(dl_store_snapshot_info(snap, 4, &v, &n), DL_ERANGE, "out of range");
    /* whole fragments: one block is zero-copy, more are copied once per snapshot */
    OK(dl_store_snapshot_fragment(snap, 1, &v, &a, &n));
    OK(dl_store_snapshot_range(snap, 1, 0, BF, &v, &b, &n2));
    REQUIRE(a == b && n == BF && equal_to(a, n, 1, 1, 0), "a one-block fragment is served from the map");
    const float *w0, *w1;
    OK(dl_store_snapshot_fragment(snap, 0, &v, &w0, &n));
    OK(dl_store_snapshot_fragment(snap, 0, &v, &w1, &n2));
    REQUIRE(w0 == w1 && n == numel[0] && equal_to(w0, n, 0, 1, 0), "a 3-block fragment: one copy, kept");
    OK(dl_store_snapshot_fragment(snap, 3, &v, &a, &n));
    REQUIRE(n == 3 && (uintptr_t)a % 4 == 0 && equal_to(a, 3, 3, 1, 0), "leaf-page value aligned");
    /* a commit meanwhile: the snapshot's pointers keep version 1 */
    const float *c0;
    OK(dl_store_snapshot_range(snap, 0, BF, BF, &v, &c0, &n));
    OK(commit_v(s, 0, 2, numel[0], 10));
    for (size_t i = 0; i < n; i += 333) REQUIRE(c0[i] == pval(0, 1, BF + i), "old block kept after a commit, %zu", i);
    OK(dl_store_snapshot_range(snap, 0, 2 * BF, BF, &v, &a, &n));
    REQUIRE(v == 1 && n == 1000 && a[999] == pval(0, 1, 2 * BF + 999), "the snapshot still reads v1");
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.snapshots_open == 1, "one snapshot open: %u", st.snapshots_open);
    dl_store_snapshot_end(&snap);
    OK(dl_store_get_stats(s, &st));
    uint64_t expect_state = 2 * (3 * (48 + BF * 4) + (48 + BF * 4) + 2 * (48 + BF * 4) + (48 + 12));
    REQUIRE(st.state_bytes == expect_state, "state %llu bytes, expected %llu", (unsigned long long)st.state_bytes,
            (unsigned long long)expect_state);
    REQUIRE(st.used_bytes == st.live_bytes + st.free_bytes && st.live_bytes >= st.state_bytes &&
                st.file_bytes >= st.used_bytes && st.file_bytes == file_size(dir) && st.snapshots_open == 0 &&
                st.map_size >= st.used_bytes,
            "sizes: file %llu used %llu live %llu free %llu state %llu map %llu", (unsigned long long)st.file_bytes,
            (unsigned long long)st.used_bytes, (unsigned long long)st.live_bytes, (unsigned long long)st.free_bytes,
            (unsigned long long)st.state_bytes, (unsigned long long)st.map_size);
    printf("ok: snapshot ranges: block-aligned chunks zero-copy, cross-block ranges copied, a 3-block fragment "
           "copied once; v1 kept across a commit; stats file %llu KiB = used %llu (live %llu + free %llu), "
           "state %llu\n",
           (unsigned long long)(st.file_bytes >> 10), (unsigned long long)(st.used_bytes >> 10),
           (unsigned long long)(st.live_bytes >> 10), (unsigned long long)(st.free_bytes >> 10),
           (unsigned long long)(st.state_bytes >> 10));
    dl_store_close(&s);
    OK(dl_store_check(dir, stdout));
    free(x), free(m);
    free_init(&init);
}

// ----------------------------------------------------------------------------
// map growth from 64 KiB, MAP_FULL retry, and a grow that times out behind a
// snapshot this thread holds

static void test_map_growth(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "grow");
    const uint64_t numel[2] = {20000, 3};
    dl_store_run run = {"grow", 9, NULL, 2, numel, TEST_MODEL, 1337};
    params_set init = make_init(2, numel);
    /* periodic durability: thousands of small commits without an fsync each */
    dl_store *s = open_store_wait(dir, 64 << 10, DL_STORE_PERIODIC, 100);
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.map_size == 64 << 10, "starts at 64 KiB: %llu", (unsigned long long)st.map_size);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a)); /* 160 KB of values into a 64 KiB map */
    uint64_t v = 0;
    for (v = 1; v <= 30; v++) OK(commit_v(s, 0, v, numel[0], 3));
    v = 30;
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.map_size > (64 << 10) && st.map_grows >= 1, "map grew: %llu bytes, %u grows",
          (unsigned long long)st.map_size, st.map_grows);
    uint64_t after_commits = st.map_size;

    /* small writes are not pre-grown: they fill the map until MDB_MAP_FULL,
     * which must double the map and retry transparently */
    uint32_t retries0 = st.map_full_retries;
    int nl = 0;
    dl_store_learner lr = {.first_seen_ns = 1};
    while (nl < 200000) {
        snprintf(lr.id, sizeof lr.id, "learner-%06d", nl);
        lr.pushes = (uint64_t)nl;
        OK(dl_store_learner_put(s, &lr));
        nl++;
        OK(dl_store_get_stats(s, &st));
        if (st.map_full_retries > retries0 && nl % 1000 == 0) break;
    }
    REQUIRE(st.map_full_retries > retries0, "MDB_MAP_FULL retry happened within %d puts", nl);
    REQUIRE(st.map_size > after_commits, "map grew on MAP_FULL");
    OK(dl_store_sync(s));
    int count = 0;
    char mid[32];
    snprintf(mid, sizeof mid, "learner-%06d", nl / 2);
    OK(dl_store_learner_get(s, mid, &lr));
    REQUIRE(lr.pushes == (uint64_t)(nl / 2), "learner written before growth intact");
    OK(dl_store_foreach_learner(s, count_learner_cb, &count));
    REQUIRE(count == nl, "all %d learners present (%d)", nl, count);
    REQUIRE(st.grow_timeouts == 0, "no grow timed out: %u", st.grow_timeouts);
    printf("ok: map grew from 64 KiB to %llu KiB (%u grows, %u MAP_FULL retries); 30 commits and %d learner "
           "records intact\n",
           (unsigned long long)(st.map_size >> 10), st.map_grows, st.map_full_retries, nl);

    /* This thread holds a snapshot, so a grow can never see zero open
     * transactions: after grow_wait_ms (100) the write fails with DL_EAGAIN,
     * changes nothing, and succeeds once the snapshot ends. */
    dl_store_snap *snap;
    OK(dl_store_snapshot_begin(s, &snap));
    const float *sp;
    size_t sn;
    uint64_t sv;
    OK(dl_store_snapshot_fragment(snap, 0, &sv, &sp, &sn));
    int rc = 0, ncommits = 0;
    while (ncommits < 100000) {
        rc = commit_v(s, 0, v + 1, numel[0], 3);
        if (rc != 0) break;
        v++, ncommits++;
    }
    REQUIRE(rc == DL_EAGAIN && strstr(dl_errmsg(), "stayed open for 100 ms"),
            "commit that needs a grow under this thread's snapshot ends in DL_EAGAIN: %d %s", rc, dl_errmsg());
    uint64_t got;
    OK(dl_store_read_fragment(s, 0, &got, NULL, NULL));
    REQUIRE(got == v, "failed commit left version %llu (got %llu)", (unsigned long long)v, (unsigned long long)got);
    REQUIRE(sv == 30 && equal_to(sp, sn, 0, 30, 0), "snapshot still reads v30 intact");
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.grow_timeouts >= 1, "grow timeouts counted: %u", st.grow_timeouts);
    dl_store_snapshot_end(&snap);
    OK(commit_v(s, 0, v + 1, numel[0], 3));
    v++;
    float *x = malloc(numel[0] * 4);
    OK(dl_store_read_fragment(s, 0, &got, x, NULL));
    REQUIRE(got == v && equal_to(x, numel[0], 0, v, 0), "commit after snapshot end");
    free(x);
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    printf("ok: with this thread's snapshot open, %d commits fit, the next waited 100 ms for a grow and failed "
           "with DL_EAGAIN leaving the store at v%llu (%u grow timeouts); after the snapshot ended the commit "
           "succeeded; check passes\n",
           ncommits, (unsigned long long)(v - 1), st.grow_timeouts);
    free_init(&init);
}

// ----------------------------------------------------------------------------
// grows while other threads take short snapshots back to back, as the
// synchronizer's loop does while serving chunks

struct reader_ctx {
    dl_store *s;
    const uint64_t *numel;
    uint32_t P;
    uint64_t seed;
    atomic_int *stop;
    uint64_t snaps, checked, errors;
    char err[256];
};

static void *reader_main(void *arg)
{
    struct reader_ctx *r = arg;
    dl_rng rng;
    dl_rng_seed(&rng, r->seed);
    while (!atomic_load(r->stop)) {
        dl_store_snap *snap;
        if (dl_store_snapshot_begin(r->s, &snap)) {
            r->errors++;
            snprintf(r->err, sizeof r->err, "begin: %s", dl_errmsg());
            continue;
        }
        uint32_t p = (uint32_t)dl_rng_below(&rng, r->P);
        uint64_t off = dl_rng_below(&rng, r->numel[p]) / BF * BF, v;
        const float *x;
        size_t n;
        if (dl_store_snapshot_range(snap, p, off, BF, &v, &x, &n)) {
            r->errors++;
            snprintf(r->err, sizeof r->err, "range: %s", dl_errmsg());
        } else {
            /* the version's contents, read through the map while grows happen around */
            for (size_t i = 0; i < n; i += 4093)
                if (x[i] != pval(p, v, off + i)) {
                    r->errors++;
                    snprintf(r->err, sizeof r->err, "fragment %u v%llu element %llu: %g", p, (unsigned long long)v,
                             (unsigned long long)(off + i), x[i]);
                    break;
                }
            r->checked++;
        }
        dl_store_snapshot_end(&snap);
        r->snaps++;
    }
    return NULL;
}

static void test_grow_under_snapshots(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "growsnap");
    const uint64_t numel[3] = {BF + 100, 3000, 5};
    dl_store_run run = {"growsnap", 15, NULL, 3, numel, TEST_MODEL, 1337};
    params_set init = make_init(3, numel);
    /* a 256 KiB map for a run of 2 MB */
    dl_store *s = open_store_wait(dir, 256 << 10, DL_STORE_PERIODIC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    dl_store_stats st0, st;
    atomic_int stop = 0;
    struct reader_ctx rd[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        rd[i] = (struct reader_ctx){.s = s, .numel = numel, .P = 3, .seed = 100 + (uint64_t)i, .stop = &stop};
        REQUIRE(pthread_create(&th[i], NULL, reader_main, &rd[i]) == 0, "reader thread");
    }
    OK(dl_store_get_stats(s, &st0));
    /* small writes grow the map on MAP_FULL, large commits ahead of need */
    uint32_t retries0 = st0.map_full_retries;
    dl_store_learner lr = {.first_seen_ns = 1};
    int nl = 0;
    for (st = st0; nl < 200000 && st.map_full_retries == retries0; nl++) {
        snprintf(lr.id, sizeof lr.id, "learner-%06d", nl);
        OK(dl_store_learner_put(s, &lr));
        if (nl % 64 == 0) OK(dl_store_get_stats(s, &st));
    }
    uint64_t v[3] = {0, 0, 0};
    for (int i = 0; i < 30; i++) {
        uint32_t p = i % 5 ? 0 : (uint32_t)(i / 5 % 3);
        OK(commit_v(s, p, v[p] + 1, numel[p], 1));
        v[p]++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    OK(dl_store_get_stats(s, &st));
    for (int i = 0; i < 2; i++)
        REQUIRE(rd[i].errors == 0 && rd[i].checked > 0, "reader %d: %llu snapshots, %llu checked, %llu errors: %s", i,
                (unsigned long long)rd[i].snaps, (unsigned long long)rd[i].checked,
                (unsigned long long)rd[i].errors, rd[i].err);
    REQUIRE(st.map_grows >= st0.map_grows + 2 && st.map_full_retries >= retries0 + 1 && st.grow_timeouts == 0,
            "grows %u -> %u, MAP_FULL retries %u -> %u, timeouts %u", st0.map_grows, st.map_grows, retries0,
            st.map_full_retries, st.grow_timeouts);
    float *x = malloc(numel[0] * 4), *m = malloc(numel[0] * 4);
    for (uint32_t p = 0; p < 3; p++) {
        uint64_t got;
        OK(dl_store_read_fragment(s, p, &got, x, m));
        REQUIRE(got == v[p] && equal_to(x, numel[p], p, got, 0) && equal_to(m, numel[p], p, got, 1),
                "fragment %u at v%llu", p, (unsigned long long)v[p]);
    }
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    printf("ok: 2 threads took %llu + %llu back-to-back snapshots (contents checked) while the map grew %u times "
           "(%u after MAP_FULL, to %llu MiB): every commit and %d registry writes succeeded, no grow timed out\n",
           (unsigned long long)rd[0].snaps, (unsigned long long)rd[1].snaps, st.map_grows - st0.map_grows,
           st.map_full_retries - retries0, (unsigned long long)(st.map_size >> 20), nl);
    free(x), free(m);
    free_init(&init);
}

// ----------------------------------------------------------------------------
// steady size: hundreds of commits of a GPT-2-shaped model (one fragment 8x
// the others, every array several blocks) with short snapshots around them

static void read_chunk(dl_store_snap *snap, dl_rng *rng, const uint64_t *numel, uint32_t P, uint64_t *version_of)
{
    uint32_t p = (uint32_t)dl_rng_below(rng, P);
    uint64_t off = dl_rng_below(rng, numel[p]) / BF * BF, v;
    const float *x;
    size_t n;
    OK(dl_store_snapshot_range(snap, p, off, BF, &v, &x, &n));
    REQUIRE(x[n - 1] == pval(p, v, off + n - 1) && (!version_of || version_of[p] == v), "chunk of fragment %u v%llu", p,
            (unsigned long long)v);
}

static void test_steady_size(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "steady");
    /* GPT-2 124M's first 8 fragments of P=24 (wte and 7 layer-sized ones), / 8 */
    enum { P = 8, COMMITS = 300, WARMUP = 100 };
    const uint64_t numel[P] = {4829184, 589824, 516096, 516096, 442368, 393216, 371232, 371136};
    dl_store_run run = {"steady", 16, NULL, P, numel, TEST_MODEL, 1337};
    params_set init = make_init(P, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_PERIODIC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    free_init(&init);
    uint64_t v[P] = {0}, warm = 0, hi = 0, largest = 0;
    dl_rng rng;
    dl_rng_seed(&rng, 424242);
    dl_store_snap *span = NULL; /* a snapshot left open across the next commit too */
    for (int i = 1; i <= COMMITS; i++) {
        /* warm-up first: the large fragment three times in a row, each other one twice */
        uint32_t p = i <= 3 ? 0 : i <= 3 + 2 * (P - 1) ? (uint32_t)(1 + (i - 4) / 2) : (uint32_t)dl_rng_below(&rng, P);
        dl_store_snap *a;
        OK(dl_store_snapshot_begin(s, &a));
        read_chunk(a, &rng, numel, P, v);
        if (i % 5 == 0) {
            REQUIRE(span == NULL, "one spanning snapshot at a time");
            OK(dl_store_snapshot_begin(s, &span));
            read_chunk(span, &rng, numel, P, NULL);
        }
        OK(commit_v(s, p, v[p] + 1, numel[p], 1));
        read_chunk(a, &rng, numel, P, NULL); /* the old version */
        dl_store_snapshot_end(&a);
        v[p]++;
        if (span && i % 5 == 1) dl_store_snapshot_end(&span);
        for (int k = 0; k < 2; k++) {
            OK(dl_store_snapshot_begin(s, &a));
            read_chunk(a, &rng, numel, P, v);
            dl_store_snapshot_end(&a);
        }
        uint64_t f = file_size(dir);
        if (i == WARMUP) warm = f;
        if (i > WARMUP) {
            REQUIRE(f <= warm + warm / 10 && f >= warm - warm / 10,
                    "commit %d: file %llu bytes, %llu after the warm-up of %d commits (limit +-10%%)", i,
                    (unsigned long long)f, (unsigned long long)warm, WARMUP);
            hi = f > hi ? f : hi;
        }
    }
    dl_store_snapshot_end(&span);
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    largest = 2 * 19 * (48 + BF * 4); /* fragment 0's params + momentum: 19 blocks each */
    /* the bound of LMDB's copy-on-write: the live state, the new copy of the
     * largest fragment, what the previous commit (and one spanning
     * snapshot) still pins */
    REQUIRE(st.used_bytes <= st.state_bytes + 3 * largest + st.state_bytes / 10,
            "used %llu bytes > state %llu + 3 x largest %llu + 10%%", (unsigned long long)st.used_bytes,
            (unsigned long long)st.state_bytes, (unsigned long long)largest);
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    printf("ok: steady size: %d commits (%.0f MB of params + momentum, largest fragment %.0f MB) with 3-4 snapshots "
           "each: file %.1f MB after %d, at most %.1f MB after (<= +10%%); state %.1f MB, live %.1f MB, free %.1f MB\n",
           COMMITS, st.state_bytes / 1e6, largest / 1e6, warm / 1e6, WARMUP, hi / 1e6, st.state_bytes / 1e6,
           st.live_bytes / 1e6, st.free_bytes / 1e6);
}

// ----------------------------------------------------------------------------
// the offline checker against deliberate corruption through raw LMDB

typedef struct {
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
} raw_db;

static raw_db raw_open(const char *dir, const char *dbname)
{
    raw_db r;
    LMDB_OK(mdb_env_create(&r.env));
    LMDB_OK(mdb_env_set_maxdbs(r.env, 8));
    LMDB_OK(mdb_env_set_mapsize(r.env, 64u << 20));
    LMDB_OK(mdb_env_open(r.env, dir, 0, 0644));
    LMDB_OK(mdb_txn_begin(r.env, NULL, 0, &r.txn));
    LMDB_OK(mdb_dbi_open(r.txn, dbname, 0, &r.dbi));
    return r;
}
static void raw_close(raw_db *r)
{
    LMDB_OK(mdb_txn_commit(r->txn));
    mdb_env_close(r->env);
}

static MDB_val frag_key(uint8_t b[4], uint32_t p)
{
    b[0] = (uint8_t)(p >> 24), b[1] = (uint8_t)(p >> 16), b[2] = (uint8_t)(p >> 8), b[3] = (uint8_t)p;
    return (MDB_val){4, b};
}
static MDB_val merge_key(uint8_t b[12], uint32_t p, uint64_t v)
{
    frag_key(b, p);
    for (int i = 0; i < 8; i++) b[4 + i] = (uint8_t)(v >> (56 - 8 * i));
    return (MDB_val){12, b};
}

/* Read the value of key in db into a malloc'd copy. */
static void *raw_get(const char *dir, const char *db, MDB_val k, size_t *len)
{
    raw_db r = raw_open(dir, db);
    MDB_val v;
    LMDB_OK(mdb_get(r.txn, r.dbi, &k, &v));
    void *copy = malloc(v.mv_size);
    memcpy(copy, v.mv_data, v.mv_size);
    *len = v.mv_size;
    raw_close(&r);
    return copy;
}
static void raw_put(const char *dir, const char *db, MDB_val k, const void *val, size_t len)
{
    raw_db r = raw_open(dir, db);
    MDB_val v = {len, (void *)val};
    LMDB_OK(mdb_put(r.txn, r.dbi, &k, &v, 0));
    raw_close(&r);
}
static int raw_has(const char *dir, const char *db, MDB_val k)
{
    raw_db r = raw_open(dir, db);
    MDB_val v;
    int rc = mdb_get(r.txn, r.dbi, &k, &v);
    raw_close(&r);
    REQUIRE(rc == 0 || rc == MDB_NOTFOUND, "mdb_get: %s", mdb_strerror(rc));
    return rc == 0;
}
static void raw_del(const char *dir, const char *db, MDB_val k)
{
    raw_db r = raw_open(dir, db);
    LMDB_OK(mdb_del(r.txn, r.dbi, &k, NULL));
    raw_close(&r);
}

/* The typed model and seed of the run record: round trip through a reopen,
 * resume refused per field, an invalid model refused on init and on read,
 * and a store of schema 1 (no model fields) refused at open. */
static void test_run_model(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "model");
    const uint64_t numel[2] = {40, 9};
    const dl_model_config model = {.n_layer = 3, .n_head = 4, .n_embd = 48, .seq_len = 24, .vocab = 1000};
    dl_store_run run = {"model", 13, "n_layer = 999\n", 2, numel, model, 0xfeedfacecafebeefull};
    params_set init = make_init(2, numel);

    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    dl_store_run bad = run;
    bad.model.n_head = 5; /* 48 % 5 != 0 */
    EXPECT_ERR(dl_store_init_run(s, &bad, (const float *const *)init.a), DL_EINVAL, "not a multiple of n_head");
    bad = run;
    bad.model.vocab = 0;
    EXPECT_ERR(dl_store_init_run(s, &bad, (const float *const *)init.a), DL_EINVAL, "vocab 0");
    REQUIRE(dl_store_n_fragments(s) == 0, "a refused run writes nothing");
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    for (int reopen = 0; reopen < 2; reopen++) {
        dl_store_run got;
        OK(dl_store_get_run(s, &got));
        REQUIRE(got.model.n_layer == 3 && got.model.n_head == 4 && got.model.n_embd == 48 && got.model.seq_len == 24 &&
                  got.model.vocab == 1000 && got.model.padded_vocab == 1024 && got.seed == 0xfeedfacecafebeefull,
              "model and seed (reopen %d): L=%d NH=%d C=%d T=%d V=%d Vp=%d seed %llx", reopen, got.model.n_layer,
              got.model.n_head, got.model.n_embd, got.model.seq_len, got.model.vocab, got.model.padded_vocab,
              (unsigned long long)got.seed);
        /* the config text is audit only: its n_layer is not the model's */
        REQUIRE(strcmp(got.config_text, "n_layer = 999\n") == 0, "config text kept as given");
        dl_store_close(&s);
        s = open_store(dir, 0, DL_STORE_SYNC, 0);
    }
    OK(dl_store_init_run(s, &run, NULL));
    printf("ok: the run's model (Vp derived) and seed round-trip through a reopen; same model resumes\n");

    const char *field[] = {"n_layer", "n_head", "n_embd", "seq_len", "vocab"};
    for (int i = 0; i < 5; i++) {
        dl_store_run other = run;
        int *f[] = {&other.model.n_layer, &other.model.n_head, &other.model.n_embd, &other.model.seq_len,
                    &other.model.vocab};
        int have = *f[i], want = i == 1 ? 8 : have * 2; /* 48 % 8 == 0: only the field differs */
        *f[i] = want;
        char needle[96];
        snprintf(needle, sizeof needle, "with %s %d; refusing %s %d", field[i], have, field[i], want);
        EXPECT_ERR(dl_store_init_run(s, &other, NULL), DL_EMISMATCH, needle);
        char shapes[256];
        dl_model_config *m = &run.model, *o = &other.model;
        snprintf(shapes, sizeof shapes, "(the store's model: L=%d NH=%d C=%d T=%d V=%d P=%u; this one: L=%d NH=%d C=%d "
                 "T=%d V=%d P=%u)", m->n_layer, m->n_head, m->n_embd, m->seq_len, m->vocab, run.n_fragments,
                 o->n_layer, o->n_head, o->n_embd, o->seq_len, o->vocab, other.n_fragments);
        REQUIRE(strstr(dl_errmsg(), shapes) != NULL, "the refusal names both shapes '%s': %s", shapes, dl_errmsg());
    }
    dl_store_run other = run;
    other.seed = 1;
    EXPECT_ERR(dl_store_init_run(s, &other, NULL), DL_EMISMATCH, "seed 18369614221190020847; refusing seed 1");
    uint64_t v = 99;
    OK(dl_store_read_fragment(s, 0, &v, NULL, NULL));
    REQUIRE(v == 0, "state untouched by refused resumes");
    printf("ok: resume with another n_layer / n_head / n_embd / seq_len / vocab / seed -> DL_EMISMATCH naming it\n");
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));

    /* a run record whose model does not pass the check is corrupt */
    size_t len;
    uint8_t *orig = raw_get(dir, "meta", (MDB_val){3, "run"}, &len);
    REQUIRE(len == 128 + 8 * 2, "run value: 128-byte header + P numels, got %zu bytes", len);
    uint8_t *b = malloc(len);
    memcpy(b, orig, len);
    uint32_t nh = 7;
    memcpy(b + 100, &nh, 4);
    raw_put(dir, "meta", (MDB_val){3, "run"}, b, len);
    dl_store_opts o = dl_store_opts_default();
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_ECORRUPT, "meta[run]: bad model: n_embd 48 is not a multiple of n_head 7");
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "meta[run]: bad model");
    raw_put(dir, "meta", (MDB_val){3, "run"}, orig, len);
    OK(dl_store_check(dir, NULL));

    /* a schema-1 store: version 1 in meta[schema] and the run value of then
     * (format 1, 96-byte header, no model): refused at open, not misread */
    uint8_t *schema = raw_get(dir, "meta", (MDB_val){6, "schema"}, &len);
    REQUIRE(len == 8 && schema[4] == DL_STORE_SCHEMA_VERSION, "schema value of this build");
    uint8_t old_schema[8];
    memcpy(old_schema, schema, 8);
    old_schema[4] = 1;
    raw_put(dir, "meta", (MDB_val){6, "schema"}, old_schema, 8);
    uint8_t old_run[96 + 8 * 2];
    memcpy(old_run, orig, 96);
    old_run[4] = 1;
    memcpy(old_run + 96, orig + 128, 8 * 2);
    raw_put(dir, "meta", (MDB_val){3, "run"}, old_run, sizeof old_run);
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EFORMAT, "schema version 1, this build reads schema version 4");
    REQUIRE(s == NULL, "failed open leaves NULL");
    o.read_only = 1;
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EFORMAT, "schema version 1");
    EXPECT_ERR(dl_store_check(dir, NULL), DL_EFORMAT, "schema version 1");
    printf("ok: a bad model in the run record -> DL_ECORRUPT; a schema-1 store -> open (rw and ro) and check refuse "
           "it with DL_EFORMAT naming schema 1\n");
    free(orig), free(b), free(schema);
    free_init(&init);
}

static MDB_val blk_key(uint8_t b[8], uint32_t p, uint32_t blk)
{
    frag_key(b, p);
    frag_key(b + 4, blk);
    return (MDB_val){8, b};
}

/* The shard layout in the run record: stored, checked on resume both ways
 * (another shard, another S, unsharded), validated, and the checker's rule
 * that only the shard's own fragments move. */
static void test_shard_layout(void)
{
    char dir[4200], flat[4200];
    path_of(dir, sizeof dir, "shard");
    path_of(flat, sizeof flat, "unsharded");
    const uint64_t numel[4] = {16, 8, 12, 4};
    dl_store_run run = {"sharded", 21, NULL, 4, numel, TEST_MODEL, 1337};
    const dl_store_shard mine = {1, 2};
    params_set init = make_init(4, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    EXPECT_ERR(dl_store_init_run_shard(s, &run, &(dl_store_shard){2, 2}, (const float *const *)init.a), DL_EINVAL,
               "shard 2 is not in [0, shards 2)");
    EXPECT_ERR(dl_store_init_run_shard(s, &run, &(dl_store_shard){0, 5}, (const float *const *)init.a), DL_EINVAL,
               "shards 5 > fragments 4");
    REQUIRE(dl_store_n_fragments(s) == 0, "a refused layout writes nothing");
    OK(dl_store_init_run_shard(s, &run, &mine, (const float *const *)init.a));
    dl_store_close(&s);
    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    dl_store_shard got;
    OK(dl_store_get_shard(s, &got));
    REQUIRE(got.shard == 1 && got.shards == 2, "layout read back: shard %u of %u", got.shard, got.shards);
    OK(dl_store_init_run_shard(s, &run, &mine, NULL));
    EXPECT_ERR(dl_store_init_run_shard(s, &run, &(dl_store_shard){0, 2}, NULL), DL_EMISMATCH,
               "holds shard 1 of 2 of run 'sharded'; refusing shard 0 of 2");
    EXPECT_ERR(dl_store_init_run_shard(s, &run, &(dl_store_shard){1, 4}, NULL), DL_EMISMATCH, "refusing shard 1 of 4");
    EXPECT_ERR(dl_store_init_run(s, &run, NULL), DL_EMISMATCH,
               "holds shard 1 of 2 of run 'sharded'; refusing unsharded");
    /* its own fragments move; check passes */
    OK(commit_v(s, 1, 1, numel[1], 10));
    OK(commit_v(s, 3, 1, numel[3], 10));
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    /* a fragment of the other shard that moved is corrupt for this store */
    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(commit_v(s, 2, 1, numel[2], 10));
    dl_store_close(&s);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT,
               "fragment 2 is at version 1 in the store of shard 1 of 2; it belongs to shard 0");
    /* an unsharded store (layout NULL, {0, 0} or {0, 1}: the same) refuses a shard */
    dl_store_run one = run;
    one.run_id = "flat";
    s = open_store(flat, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run_shard(s, &one, &(dl_store_shard){0, 1}, (const float *const *)init.a));
    OK(dl_store_init_run(s, &one, NULL));
    OK(dl_store_init_run_shard(s, &one, &(dl_store_shard){0, 0}, NULL));
    EXPECT_ERR(dl_store_init_run_shard(s, &one, &(dl_store_shard){0, 2}, NULL), DL_EMISMATCH,
               "holds unsharded of run 'flat'; refusing shard 0 of 2");
    OK(dl_store_get_shard(s, &got));
    REQUIRE(got.shard == 0 && got.shards == 0, "an unsharded run stores 0 there, as before sharding");
    OK(commit_v(s, 2, 1, numel[2], 10));
    dl_store_close(&s);
    OK(dl_store_check(flat, NULL));
    /* a layout that cannot be is corrupt */
    size_t len;
    uint8_t *orig = raw_get(flat, "meta", (MDB_val){3, "run"}, &len), *b = malloc(len);
    memcpy(b, orig, len);
    uint32_t lay = 3u | 2u << 16; /* shard 3 of 2 */
    memcpy(b + 116, &lay, 4);
    raw_put(flat, "meta", (MDB_val){3, "run"}, b, len);
    dl_store_opts o = dl_store_opts_default();
    EXPECT_ERR(dl_store_open(flat, &o, &s), DL_ECORRUPT, "meta[run]: bad shard layout: shard 3 is not in [0, shards 2)");
    free(orig), free(b);
    printf("ok: the shard layout is stored in the run record; a resume of another shard, S or an unsharded run is "
           "DL_EMISMATCH; check refuses a moved fragment of another shard\n");
    free_init(&init);
}

/* Zero momentum is not stored: a new run's fragments and every commit without
 * momentum keep params blocks only (header format 3); a commit with momentum
 * brings its blocks back (format 2), one without deletes them again. Reads
 * give zeros, the checker counts no outer block for such a fragment and
 * refuses one that is there, the stats count what is stored, and a header
 * of a format this build does not know is refused. */
static void test_no_momentum(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "nomom");
    const uint64_t numel[2] = {64, DL_STORE_BLOCK_FLOATS + 5000}; /* one block; two, the last short */
    const uint64_t bs1 = 48 + 4 * 64, bs2 = 48 + 4 * DL_STORE_BLOCK_FLOATS;
    dl_store_run run = {"nomom", 11, NULL, 2, numel, TEST_MODEL, 1337};
    params_set init = make_init(2, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.state_bytes == bs1 + 2 * bs2, "new run: params only, %llu bytes (expected %llu)",
            (unsigned long long)st.state_bytes, (unsigned long long)(bs1 + 2 * bs2));
    float *x = malloc(numel[1] * 4), *m = malloc(numel[1] * 4);
    uint64_t v = 9;
    for (size_t i = 0; i < numel[1]; i++) m[i] = 1.0f;
    OK(dl_store_read_fragment(s, 1, &v, x, m));
    REQUIRE(v == 0 && equal_to(x, numel[1], 1, 0, 0) && all_zero(m, numel[1]), "new run: zero momentum read back");
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    uint8_t kb[12];
    size_t len;
    uint8_t *hdr = raw_get(dir, "fragments", frag_key(kb, 1), &len);
    REQUIRE(len == 48 && hdr[4] == 3, "a new run's header: format 3 (no momentum), got %u", hdr[4]);
    free(hdr);
    REQUIRE(!raw_has(dir, "outer", blk_key(kb, 1, 0)), "a new run stores no momentum block");
    printf("ok: a new run stores no momentum (header format 3, params blocks only, %llu bytes); reads give zeros; "
           "check passes\n",
           (unsigned long long)st.state_bytes);

    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(commit_v(s, 1, 1, numel[1], 5)); /* with momentum */
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.state_bytes == bs1 + 4 * bs2, "with momentum: %llu bytes", (unsigned long long)st.state_bytes);
    OK(dl_store_read_fragment(s, 1, &v, x, m));
    REQUIRE(v == 1 && equal_to(x, numel[1], 1, 1, 0) && equal_to(m, numel[1], 1, 1, 1), "v1 with momentum");
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    uint8_t *mblk = raw_get(dir, "outer", blk_key(kb, 1, 1), &len);
    REQUIRE(mblk && len == bs2, "a commit with momentum stores its blocks");

    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(commit_v_mom(s, 1, 2, numel[1], 5, 0)); /* momentum turned off: its blocks go */
    OK(commit_v_mom(s, 0, 1, numel[0], 5, 0));
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.state_bytes == bs1 + 2 * bs2, "without momentum again: %llu bytes", (unsigned long long)st.state_bytes);
    for (size_t i = 0; i < numel[1]; i++) m[i] = 1.0f;
    OK(dl_store_read_fragment(s, 1, &v, x, m));
    REQUIRE(v == 2 && equal_to(x, numel[1], 1, 2, 0) && all_zero(m, numel[1]), "v2 without momentum");
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    REQUIRE(!raw_has(dir, "outer", blk_key(kb, 1, 0)) && !raw_has(dir, "outer", blk_key(kb, 1, 1)),
            "a commit without momentum deletes the fragment's momentum blocks");
    printf("ok: commit with momentum -> its blocks (format 2), without -> deleted in the same commit (format 3); "
           "reads and stats follow; check passes\n");

    /* a momentum block left beside a header that says none is stored: corrupt */
    raw_put(dir, "outer", blk_key(kb, 1, 1), mblk, bs2);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "outer: stray key for fragment 1 block 1");
    REQUIRE(strstr(dl_errmsg(), "no momentum is stored"), "names why: %s", dl_errmsg());
    raw_del(dir, "outer", blk_key(kb, 1, 1));
    OK(dl_store_check(dir, NULL));
    /* a header format this build does not know */
    hdr = raw_get(dir, "fragments", frag_key(kb, 0), &len);
    uint8_t *bad = malloc(len);
    memcpy(bad, hdr, len);
    bad[4] = 4;
    raw_put(dir, "fragments", frag_key(kb, 0), bad, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "fragments[0]: bad magic/format");
    raw_put(dir, "fragments", frag_key(kb, 0), hdr, len);
    OK(dl_store_check(dir, NULL));
    printf("ok: a momentum block beside a no-momentum header -> check DL_ECORRUPT naming it; header format 4 "
           "refused; restored -> passes\n");
    free(hdr), free(bad), free(mblk), free(x), free(m);
    free_init(&init);
}

static void test_checker(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "check");
    const uint64_t numel[2] = {64, DL_STORE_BLOCK_FLOATS + 5000}; /* one block; two, the last short */
    dl_store_run run = {"check", 10, NULL, 2, numel, TEST_MODEL, 1337};
    params_set init = make_init(2, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    for (uint64_t v = 1; v <= 3; v++) OK(commit_v(s, 0, v, numel[0], 5));
    for (uint64_t v = 1; v <= 2; v++) OK(commit_v(s, 1, v, numel[1], 7));
    dl_store_close(&s);
    OK(dl_store_check(dir, stdout));
    printf("ok: check passes on a good store (2 fragments, 5 merge records)\n");

    uint8_t kb[12];
    size_t len;
    /* flip one params value in fragment 1's second block */
    uint8_t *orig = raw_get(dir, "params", blk_key(kb, 1, 1), &len);
    REQUIRE(len == 48 + 4 * DL_STORE_BLOCK_FLOATS, "a short last block is stored full size: %zu bytes", len);
    uint8_t *bad = malloc(len);
    memcpy(bad, orig, len);
    float f;
    memcpy(&f, bad + 48 + 4 * 100, 4);
    f += 1.0f;
    memcpy(bad + 48 + 4 * 100, &f, 4);
    raw_put(dir, "params", blk_key(kb, 1, 1), bad, len);
    EXPECT_ERR(dl_store_check(dir, stdout), DL_ECORRUPT, "fragment 1 version 2: params checksum");
    REQUIRE(strstr(dl_errmsg(), "params[1,1]"), "names the block: %s", dl_errmsg());
    s = open_store(dir, 0, DL_STORE_SYNC, 1);
    float *x = malloc(numel[1] * 4);
    uint64_t v;
    EXPECT_ERR(dl_store_read_fragment(s, 1, &v, x, NULL), DL_ECORRUPT, "params checksum");
    OK(dl_store_read_fragment(s, 1, &v, NULL, NULL)); /* version alone needs no params */
    dl_store_close(&s);
    raw_put(dir, "params", blk_key(kb, 1, 1), orig, len);
    OK(dl_store_check(dir, NULL));
    printf("ok: a flipped params value -> check DL_ECORRUPT '%s'; read_fragment also refuses it; "
           "restored -> passes\n",
           "fragment 1 version 2: params checksum ... (params[1,1])");

    /* a block of another version, a block too many, a block missing, a header that disagrees */
    memcpy(bad, orig, len);
    bad[16] = 1; /* version 2 -> 1 */
    raw_put(dir, "params", blk_key(kb, 1, 1), bad, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "params[1,1]: block of version 1, fragment 1 is at version 2");
    s = open_store(dir, 0, DL_STORE_SYNC, 1);
    EXPECT_ERR(dl_store_read_fragment(s, 1, &v, x, NULL), DL_ECORRUPT, "params[1,1]: block of version 1");
    dl_store_snap *snap;
    const float *sp;
    size_t sn;
    OK(dl_store_snapshot_begin(s, &snap));
    EXPECT_ERR(dl_store_snapshot_range(snap, 1, DL_STORE_BLOCK_FLOATS, 10, &v, &sp, &sn), DL_ECORRUPT,
               "params[1,1]: block of version 1");
    dl_store_snapshot_end(&snap);
    dl_store_close(&s);
    raw_put(dir, "params", blk_key(kb, 1, 1), orig, len);
    raw_put(dir, "params", blk_key(kb, 1, 2), orig, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "params: stray key for fragment 1 block 2");
    raw_del(dir, "params", blk_key(kb, 1, 2));
    raw_put(dir, "outer", blk_key(kb, 5, 0), orig, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "outer: stray key for fragment 5 block 0");
    raw_del(dir, "outer", blk_key(kb, 5, 0));
    raw_del(dir, "params", blk_key(kb, 1, 1));
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "params[1,1] missing (fragment 1 has 2 blocks)");
    raw_put(dir, "params", blk_key(kb, 1, 1), orig, len);
    free(orig), free(bad);
    orig = raw_get(dir, "fragments", frag_key(kb, 1), &len);
    REQUIRE(len == 48, "fragment header: 48 bytes, got %zu", len);
    bad = malloc(len);
    memcpy(bad, orig, len);
    bad[12] = 3; /* blocks */
    raw_put(dir, "fragments", frag_key(kb, 1), bad, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "fragments[1]: numel 267144 in 3 blocks");
    raw_put(dir, "fragments", frag_key(kb, 1), orig, len);
    OK(dl_store_check(dir, NULL));
    free(orig), free(bad);
    printf("ok: a block of an older version (check, read, snapshot), a stray block, a block of a fragment >= P, "
           "a missing block, a header with the wrong block count each caught naming the key; restored -> passes\n");

    /* delete a middle merge record, then the last one */
    orig = raw_get(dir, "merges", merge_key(kb, 0, 2), &len);
    raw_del(dir, "merges", merge_key(kb, 0, 2));
    EXPECT_ERR(dl_store_check(dir, stdout), DL_ECORRUPT, "fragment 0: merge record version 2 missing");
    raw_put(dir, "merges", merge_key(kb, 0, 2), orig, len);
    free(orig);
    orig = raw_get(dir, "merges", merge_key(kb, 0, 3), &len);
    raw_del(dir, "merges", merge_key(kb, 0, 3));
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "fragment 0 is at version 3 but has 2 merge records");
    raw_put(dir, "merges", merge_key(kb, 0, 3), orig, len);
    OK(dl_store_check(dir, NULL));
    printf("ok: deleted merge record v2 -> 'merge record version 2 missing'; deleted v3 -> "
           "'at version 3 but has 2 merge records'; restored -> passes\n");

    /* bad magic of a record, a stray record beyond P, a tampered ledger, momentum */
    bad = malloc(len);
    memcpy(bad, orig, len);
    bad[0] ^= 0xff;
    raw_put(dir, "merges", merge_key(kb, 0, 3), bad, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "merges[0,3]: bad size/magic");
    raw_put(dir, "merges", merge_key(kb, 0, 3), orig, len);
    free(bad);
    size_t len1;
    bad = raw_get(dir, "merges", merge_key(kb, 0, 1), &len1); /* record 1 stored under key 3 */
    raw_put(dir, "merges", merge_key(kb, 0, 3), bad, len1);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "merges[0,3]: value says fragment 0 version 1");
    raw_put(dir, "merges", merge_key(kb, 0, 3), orig, len);
    free(bad);
    raw_put(dir, "merges", merge_key(kb, 2, 1), orig, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "stray key");
    raw_del(dir, "merges", merge_key(kb, 2, 1));
    free(orig);
    orig = raw_get(dir, "ledger", (MDB_val){6, "totals"}, &len);
    bad = malloc(len);
    memcpy(bad, orig, len);
    bad[8] ^= 1; /* applied tokens */
    raw_put(dir, "ledger", (MDB_val){6, "totals"}, bad, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "ledger says applied");
    raw_put(dir, "ledger", (MDB_val){6, "totals"}, orig, len);
    free(orig), free(bad);
    orig = raw_get(dir, "outer", blk_key(kb, 0, 0), &len);
    bad = malloc(len);
    memcpy(bad, orig, len);
    bad[48 + 8] ^= 0x10;
    raw_put(dir, "outer", blk_key(kb, 0, 0), bad, len);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "fragment 0 version 3: momentum checksum");
    raw_put(dir, "outer", blk_key(kb, 0, 0), orig, len);
    raw_del(dir, "outer", blk_key(kb, 0, 0));
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ECORRUPT, "outer[0,0] missing");
    raw_put(dir, "outer", blk_key(kb, 0, 0), orig, len);
    free(orig), free(bad);
    OK(dl_store_check(dir, NULL));
    printf("ok: bad record magic, a record under another version's key, stray record of fragment 2 (P=2), tampered ledger, flipped momentum, "
           "missing momentum each caught with a message naming it; restored -> passes\n");

    /* wrong schema version */
    orig = raw_get(dir, "meta", (MDB_val){6, "schema"}, &len);
    REQUIRE(len == 8, "schema value is 8 bytes");
    bad = malloc(len);
    memcpy(bad, orig, len);
    bad[4] = 99;
    raw_put(dir, "meta", (MDB_val){6, "schema"}, bad, len);
    dl_store_opts o = dl_store_opts_default();
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EFORMAT, "schema version 99");
    REQUIRE(s == NULL, "failed open leaves NULL");
    EXPECT_ERR(dl_store_check(dir, NULL), DL_EFORMAT, "schema version 99");
    raw_put(dir, "meta", (MDB_val){6, "schema"}, orig, len);
    free(orig), free(bad);
    OK(dl_store_check(dir, NULL));
    printf("ok: schema version 99 -> open and check fail with DL_EFORMAT naming it\n");
    free(x);
    free_init(&init);
}

// ----------------------------------------------------------------------------
// directories that are not stores

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(data, 1, n, f) == n, "write %s", path);
    fclose(f);
}

static void test_bad_dirs(void)
{
    char dir[4200], path[4300];
    dl_store *s = NULL;
    dl_store_opts o = dl_store_opts_default(), ro = o;
    ro.read_only = 1;

    path_of(dir, sizeof dir, "garbage");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    uint8_t junk[16384];
    dl_rng rng;
    dl_rng_seed(&rng, 5);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)dl_rng_u64(&rng);
    write_file(path, junk, sizeof junk);
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EFORMAT, "data.mdb is not an LMDB environment");
    EXPECT_ERR(dl_store_open(dir, &ro, &s), DL_EFORMAT, "not an LMDB environment");
    EXPECT_ERR(dl_store_check(dir, NULL), DL_EFORMAT, "not an LMDB environment");
    printf("ok: 16 KiB of random bytes as data.mdb -> DL_EFORMAT '%s'\n", dl_errmsg());
    const char *text = "this is not a database\n";
    write_file(path, text, strlen(text));
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EFORMAT, "not an LMDB environment");
    printf("ok: a short text file as data.mdb -> DL_EFORMAT\n");

    path_of(dir, sizeof dir, "plainfile");
    write_file(dir, text, strlen(text));
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EINVAL, "not a directory");
    path_of(dir, sizeof dir, "missing");
    EXPECT_ERR(dl_store_open(dir, &ro, &s), DL_ENOTFOUND, "does not exist");
    path_of(dir, sizeof dir, "emptydir");
    mkdir(dir, 0755);
    EXPECT_ERR(dl_store_open(dir, &ro, &s), DL_ENOTFOUND, "no data.mdb");
    EXPECT_ERR(dl_store_check(dir, NULL), DL_ENOTFOUND, "no data.mdb");
    printf("ok: a plain file -> DL_EINVAL; read-only on a missing dir / dir without data.mdb -> DL_ENOTFOUND\n");

    path_of(dir, sizeof dir, "foreign");
    mkdir(dir, 0755);
    MDB_env *env;
    MDB_txn *t;
    MDB_dbi dbi;
    LMDB_OK(mdb_env_create(&env));
    LMDB_OK(mdb_env_open(env, dir, 0, 0644));
    LMDB_OK(mdb_txn_begin(env, NULL, 0, &t));
    LMDB_OK(mdb_dbi_open(t, NULL, 0, &dbi));
    MDB_val k = {5, "hello"}, v = {5, "world"};
    LMDB_OK(mdb_put(t, dbi, &k, &v, 0));
    LMDB_OK(mdb_txn_commit(t));
    mdb_env_close(env);
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_EFORMAT, "not a dloco store");
    EXPECT_ERR(dl_store_open(dir, &ro, &s), DL_EFORMAT, "not a dloco store");
    printf("ok: an LMDB environment of something else -> DL_EFORMAT 'not a dloco store'\n");

    path_of(dir, sizeof dir, "norun");
    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    dl_store *s2 = NULL;
    EXPECT_ERR(dl_store_open(dir, &o, &s2), DL_EBUSY, "already open for writing");
    dl_store_close(&s);
    EXPECT_ERR(dl_store_check(dir, NULL), DL_EFORMAT, "has no run");
    s = open_store(dir, 0, DL_STORE_SYNC, 0); /* lock released by close */
    dl_store_close(&s);
    printf("ok: second writer -> DL_EAGAIN; check of a store without a run -> DL_EFORMAT\n");
}

// ----------------------------------------------------------------------------
// stale reader slot of a killed process is cleared at open

static void test_stale_readers(void)
{
    char dir[4200];
    path_of(dir, sizeof dir, "readers");
    const uint64_t numel[1] = {16};
    dl_store_run run = {"readers", 11, NULL, 1, numel, TEST_MODEL, 1337};
    params_set init = make_init(1, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    dl_store_close(&s);
    free_init(&init);

    /* A keeps the environment open (so the lock table is not reset when the
     * parent opens), B dies holding a read snapshot. */
    int ready[2], hold[2];
    REQUIRE(pipe(ready) == 0 && pipe(hold) == 0, "pipes");
    fflush(NULL);
    pid_t a = fork();
    REQUIRE(a >= 0, "fork");
    if (a == 0) {
        close(ready[0]), close(hold[1]);
        dl_store *cs = open_store(dir, 0, DL_STORE_SYNC, 1);
        REQUIRE(write(ready[1], "a", 1) == 1, "ready");
        char c;
        while (read(hold[0], &c, 1) > 0) {}
        dl_store_close(&cs);
        _exit(0);
    }
    pid_t b = fork();
    REQUIRE(b >= 0, "fork");
    if (b == 0) {
        close(ready[0]), close(hold[1]), close(hold[0]);
        dl_store *cs = open_store(dir, 0, DL_STORE_SYNC, 1);
        dl_store_snap *snap;
        OK(dl_store_snapshot_begin(cs, &snap));
        REQUIRE(write(ready[1], "b", 1) == 1, "ready");
        for (;;) pause();
    }
    close(ready[1]), close(hold[0]);
    char c[2];
    REQUIRE(read(ready[0], c, 1) == 1 && read(ready[0], c + 1, 1) == 1, "children ready");
    kill(b, SIGKILL);
    int status;
    waitpid(b, &status, 0);
    s = open_store(dir, 0, DL_STORE_SYNC, 0);
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    dl_store_close(&s);
    close(hold[1]);
    waitpid(a, &status, 0);
    REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "holder exited cleanly");
    close(ready[0]);
    REQUIRE(st.stale_readers_cleared >= 1, "stale reader of the killed process cleared: %d", st.stale_readers_cleared);
    printf("ok: a process killed inside a snapshot left a reader slot; open cleared %d stale reader(s)\n",
           st.stale_readers_cleared);
}

// ----------------------------------------------------------------------------
// crash test: SIGKILL a committing child, no acknowledged version lost

#define CRASH_NUMEL (DL_STORE_BLOCK_FLOATS + 4096) /* two blocks, a short last one */

static void crash_child(const char *dir, int wfd)
{
    dl_log_set_name("crash-child");
    dl_store *s = NULL;
    int rc = dl_store_open(dir, NULL, &s); /* DL_STORE_SYNC */
    if (rc) {
        fprintf(stderr, "child: open: %s\n", dl_errmsg());
        _exit(2);
    }
    for (int i = 0; i < 1000000; i++) {
        uint64_t v;
        if (dl_store_read_fragment(s, 0, &v, NULL, NULL) || commit_v(s, 0, v + 1, CRASH_NUMEL, 10)) {
            fprintf(stderr, "child: %s\n", dl_errmsg());
            _exit(3);
        }
        v++;
        if (write(wfd, &v, sizeof v) != sizeof v) _exit(4);
    }
    dl_store_close(&s);
    _exit(0);
}

static void test_crash(uint64_t seed)
{
    char dir[4200];
    path_of(dir, sizeof dir, "crash");
    const uint64_t numel[2] = {CRASH_NUMEL, 7};
    dl_store_run run = {"crash", 12, NULL, 2, numel, TEST_MODEL, 1337};
    params_set init = make_init(2, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    dl_store_close(&s);
    free_init(&init);

    dl_rng rng;
    dl_rng_seed(&rng, seed);
    float *x = malloc(CRASH_NUMEL * 4), *m = malloc(CRASH_NUMEL * 4);
    uint64_t last_acked = 0;
    for (int round = 0; round < 8; round++) {
        int fds[2];
        REQUIRE(pipe(fds) == 0, "pipe");
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0, "fork");
        if (pid == 0) {
            close(fds[0]);
            crash_child(dir, fds[1]);
        }
        close(fds[1]);
        /* wait for the first ack of this round (bounded), then a seeded delay */
        struct pollfd pfd = {fds[0], POLLIN, 0};
        REQUIRE(poll(&pfd, 1, 30000) == 1, "child acked a commit within 30 s");
        unsigned delay_us = (unsigned)dl_rng_below(&rng, 40000);
        usleep(delay_us);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        REQUIRE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
              "child failed on its own (exit %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        uint8_t buf[8192], acc[8];
        size_t have = 0;
        uint64_t acks = 0;
        for (;;) {
            ssize_t n = read(fds[0], buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            for (ssize_t i = 0; i < n; i++) {
                acc[have++] = buf[i];
                if (have == 8) {
                    uint64_t a;
                    memcpy(&a, acc, 8);
                    REQUIRE(a > last_acked, "acks increase");
                    last_acked = a;
                    have = 0;
                    acks++;
                }
            }
        }
        close(fds[0]);
        OK(dl_store_check(dir, NULL));
        s = open_store(dir, 0, DL_STORE_SYNC, 0);
        uint64_t v;
        OK(dl_store_read_fragment(s, 0, &v, x, m));
        dl_store_ledger l;
        OK(dl_store_ledger_get(s, &l));
        dl_store_close(&s);
        REQUIRE(v >= last_acked && v <= last_acked + 1, "round %d: stored v%llu, last acked v%llu", round,
              (unsigned long long)v, (unsigned long long)last_acked);
        REQUIRE(equal_to(x, CRASH_NUMEL, 0, v, 0) && equal_to(m, CRASH_NUMEL, 0, v, 1),
              "round %d: params and momentum are exactly those of v%llu", round, (unsigned long long)v);
        REQUIRE(l.tokens[DL_LEDGER_APPLIED] == 10 * v, "round %d: ledger applied %llu for v%llu", round,
              (unsigned long long)l.tokens[DL_LEDGER_APPLIED], (unsigned long long)v);
        printf("ok: crash round %d: SIGKILL %u us after the first ack (%llu acks); last acked v%llu, stored v%llu; "
               "check passes, contents and ledger match\n",
               round, delay_us, (unsigned long long)acks, (unsigned long long)last_acked, (unsigned long long)v);
        last_acked = v; /* a commit that landed without an ack is still the new floor */
    }
    free(x), free(m);
}

/* A manifest run (core/manifest.h): the store records the manifest under
 * meta key "manifest", reads it back on reopen, resumes only on the same
 * manifest (a difference names the tensor), refuses a GPT-2 run on it and a
 * manifest run on a GPT-2 store, and calls a missing or damaged manifest
 * corrupt. */
static void test_run_manifest(void)
{
    char dir[4200], gdir[4200];
    path_of(dir, sizeof dir, "manifest");
    path_of(gdir, sizeof gdir, "manifest-gpt");
    dl_manifest *m, *m2;
    int64_t e[2] = {5, 4}, c[3] = {2, 2, 3}, v[1] = {4};
    REQUIRE(dl_manifest_open(&m) == 0 && dl_manifest_add(m, "tok.embed", 2, e, DL_TENSOR_EMBED) == 0 &&
                dl_manifest_add(m, "conv", 3, c, DL_TENSOR_MATRIX) == 0 &&
                dl_manifest_add(m, "norm", 1, v, DL_TENSOR_VECTOR) == 0,
            "%s", dl_errmsg());
    int64_t c2[3] = {2, 3, 2};
    REQUIRE(dl_manifest_open(&m2) == 0 && dl_manifest_add(m2, "tok.embed", 2, e, DL_TENSOR_EMBED) == 0 &&
                dl_manifest_add(m2, "conv", 3, c2, DL_TENSOR_MATRIX) == 0 &&
                dl_manifest_add(m2, "norm", 1, v, DL_TENSOR_VECTOR) == 0,
            "%s", dl_errmsg());
    const uint64_t numel[2] = {20, 16};
    dl_store_run run = {"mrun", 0x77, NULL, 2, numel, {0}, 0, m};
    params_set init = make_init(2, numel);
    dl_store *s = open_store(dir, 0, DL_STORE_SYNC, 0);
    dl_store_run bad = run;
    bad.model.n_layer = 2;
    EXPECT_ERR(dl_store_init_run(s, &bad, (const float *const *)init.a), DL_EINVAL, "no GPT-2 model fields");
    OK(dl_store_init_run(s, &run, (const float *const *)init.a));
    for (int reopen = 0; reopen < 2; reopen++) {
        dl_store_run got;
        OK(dl_store_get_run(s, &got));
        char msg[256];
        REQUIRE(got.manifest && dl_manifest_diff(m, got.manifest, "the store's", msg, sizeof msg) == 0,
                "manifest (reopen %d): %s", reopen, got.manifest ? msg : "none");
        REQUIRE(got.model.n_layer == 0 && got.seed == 0, "no GPT-2 model, no seed");
        dl_store_close(&s);
        s = open_store(dir, 0, DL_STORE_SYNC, 0);
    }
    OK(dl_store_init_run(s, &run, NULL));
    dl_store_run other = run;
    other.manifest = m2;
    EXPECT_ERR(dl_store_init_run(s, &other, NULL), DL_EMISMATCH,
               "tensor 'conv' (1 of 3) has shape [2, 2, 3] here, [2, 3, 2] in the manifest given");
    other = run;
    other.manifest = NULL;
    other.model = (dl_model_config){.n_layer = 1, .n_head = 1, .n_embd = 8, .seq_len = 2, .vocab = 2};
    EXPECT_ERR(dl_store_init_run(s, &other, NULL), DL_EMISMATCH, "refusing a GPT-2 run");
    dl_store_close(&s);
    OK(dl_store_check(dir, NULL));
    /* a manifest run of the same run id on a GPT-2 store */
    s = open_store(gdir, 0, DL_STORE_SYNC, 0);
    dl_store_run gpt = {"mrun", 0x78, NULL, 2, numel, TEST_MODEL, 1337};
    OK(dl_store_init_run(s, &gpt, (const float *const *)init.a));
    EXPECT_ERR(dl_store_init_run(s, &run, NULL), DL_EMISMATCH, "holds GPT-2 run 'mrun'");
    REQUIRE(strstr(dl_errmsg(), "refusing a run described by a manifest (3 tensors)"), "%s", dl_errmsg());
    dl_store_close(&s);
    /* damaged: the manifest's bytes, or the key gone */
    size_t len;
    uint8_t *orig = raw_get(dir, "meta", (MDB_val){8, "manifest"}, &len);
    REQUIRE(orig && len > 16, "meta[manifest] written (%zu bytes)", len);
    uint8_t *b = malloc(len);
    memcpy(b, orig, len);
    b[16] = 'X'; /* the JSON's first byte */
    raw_put(dir, "meta", (MDB_val){8, "manifest"}, b, len);
    dl_store_opts o = dl_store_opts_default();
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_ECORRUPT, "meta[manifest]:");
    raw_del(dir, "meta", (MDB_val){8, "manifest"});
    EXPECT_ERR(dl_store_open(dir, &o, &s), DL_ECORRUPT, "no GPT-2 model and no meta[manifest]");
    raw_put(dir, "meta", (MDB_val){8, "manifest"}, orig, len);
    OK(dl_store_check(dir, NULL));
    printf("ok: a manifest run's store keeps its manifest across reopens, resumes only on it (the refusal names the "
           "tensor), refuses GPT-2 runs on it and manifest runs on a GPT-2 store, and a damaged or missing "
           "meta[manifest] is DL_ECORRUPT\n");
    free(orig), free(b);
    free_init(&init);
    dl_manifest_close(&m);
    dl_manifest_close(&m2);
}

int main(void)
{
    dl_log_set_level(DL_LOG_WARN);
    const char *bin = getenv("DLOCO_BIN");
    snprintf(g_base, sizeof g_base, "%s/test_store.XXXXXX", bin && *bin ? bin : "/tmp");
    REQUIRE(mkdtemp(g_base) != NULL, "mkdtemp %s: %s", g_base, strerror(errno));
    printf("test_store: working in %s\n", g_base);

    test_bad_dirs();
    test_roundtrip();
    test_version_fence();
    test_snapshot();
    test_blocks();
    test_map_growth();
    test_grow_under_snapshots();
    test_steady_size();
    test_checker();
    test_no_momentum();
    test_run_model();
    test_run_manifest();
    test_shard_layout();
    test_stale_readers();
    uint64_t seed = 20240611;
    printf("crash test seed %llu\n", (unsigned long long)seed);
    test_crash(seed);

    rm_rf(g_base);
    return CHECK_DONE("test_store");
}
