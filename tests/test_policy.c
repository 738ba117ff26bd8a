/* Tests of the merge-round policy (synchronizer/policy.c) with a fake clock:
 * exact close decisions, deadlines, weights, drops, membership, straggler sim. */
#include "synchronizer/policy.h"

#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000LL /* ns */
#define US 1000LL

/* Relative closeness of computed weights: 1e-9 of the expected value. */
#define CHECK_REL(a, b) CHECK_NEAR((a), (b), 1e-9 * fabs((double)(b)) + 1e-12)

static dl_policy *mk(const dl_policy_cfg *c, int P)
{
    dl_policy *p = NULL;
    int rc = dl_policy_open(c, P, &p);
    if (rc) {
        fprintf(stderr, "dl_policy_open: %s\n", dl_errmsg());
        exit(1);
    }
    return p;
}

static void join(dl_policy *p, uint32_t id, int64_t t) { CHECK_EQ(dl_policy_learner_join(p, id, t), 0); }

static dl_policy_verdict push(dl_policy *p, int f, uint32_t id, uint64_t base, int64_t steps, int64_t tokens,
                              int64_t t, uint64_t h)
{
    dl_policy_verdict v;
    CHECK_EQ(dl_policy_push(p, f, id, base, steps, tokens, t, h, &v), 0);
    return v;
}

/* Push at the fragment's current version (a learner that adopted every update). */
static dl_policy_verdict push_fresh(dl_policy *p, int f, uint32_t id, int64_t t)
{
    return push(p, f, id, dl_policy_version(p, f), 8, 800, t, id);
}

static void print_stats(const char *name, const dl_policy *p)
{
    dl_policy_stats s;
    dl_policy_get_stats(p, &s);
    printf("  trace %-14s pushes=%llu pooled=%llu replaced=%llu dropped-stale=%llu rejected=%llu rounds=%llu "
           "merged=%llu | all-in=%llu predicted-none=%llu grace-expired=%llu cap=%llu\n",
           name, (unsigned long long)s.pushes, (unsigned long long)s.pooled, (unsigned long long)s.replaced,
           (unsigned long long)s.dropped_stale, (unsigned long long)s.rejected, (unsigned long long)s.rounds,
           (unsigned long long)s.merged, (unsigned long long)s.close[DL_POLICY_CLOSE_ALL_IN],
           (unsigned long long)s.close[DL_POLICY_CLOSE_PREDICTED_NONE],
           (unsigned long long)s.close[DL_POLICY_CLOSE_GRACE_EXPIRED],
           (unsigned long long)s.close[DL_POLICY_CLOSE_CAP]);
}

/* Poll one round that must be due at `t`, print it, commit it at `t`. */
static dl_policy_round close_one(dl_policy *p, int64_t t)
{
    dl_policy_round r;
    memset(&r, 0, sizeof r);
    int got = dl_policy_poll(p, t, &r);
    CHECK_EQ(got, 1);
    if (got) {
        char line[512];
        dl_policy_round_format(&r, line, sizeof line);
        printf("    t=%.3fms %s\n", (double)t / MS, line);
    }
    return r;
}

/* ------------------------------------------------------------------ config, names, weights */

static void test_config(void)
{
    printf("config validation and names\n");
    dl_policy_cfg c;
    char why[200];
    dl_policy_cfg_default(&c);
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), 0);

    c.quorum = 0;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    CHECK(strstr(why, "quorum") != NULL, "reason: %s", why);
    printf("  K=0 -> %s\n", why);
    dl_policy_cfg_default(&c);
    c.gamma = 0;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    CHECK(strstr(why, "gamma") != NULL, "reason: %s", why);
    c.gamma = 10.5;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    c.gamma = 10;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), 0);
    c.gamma = NAN;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    dl_policy_cfg_default(&c);
    c.grace_cap_ns = 0;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    CHECK(strstr(why, "grace_cap_ns") != NULL, "reason: %s", why);
    dl_policy_cfg_default(&c);
    c.mad_k = -1;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    dl_policy_cfg_default(&c);
    c.max_staleness = -1;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    dl_policy_cfg_default(&c);
    c.max_learners = 0;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    dl_policy_cfg_default(&c);
    c.quorum = 2000; /* > max_learners 1024 */
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    dl_policy_cfg_default(&c);
    c.sfn = DL_POLICY_SFN_HINGE, c.sfn_a = -1;
    CHECK_EQ(dl_policy_cfg_check(&c, why, sizeof why), DL_EINVAL);
    dl_policy *p = (dl_policy *)&c; /* must be overwritten with NULL */
    CHECK_EQ(dl_policy_open(&c, 4, &p), DL_EINVAL);
    CHECK(p == NULL, "a refused open leaves the handle NULL");
    dl_policy_close(&p); /* safe on NULL */

    dl_policy_sfn s = DL_POLICY_SFN_CONST;
    CHECK_EQ(dl_policy_sfn_parse("hinge", &s), 0);
    CHECK_EQ(s, DL_POLICY_SFN_HINGE);
    CHECK_EQ(dl_policy_sfn_parse("poly", &s), 0);
    CHECK_EQ(s, DL_POLICY_SFN_POLY);
    CHECK_EQ(dl_policy_sfn_parse("const", &s), 0);
    CHECK_EQ(s, DL_POLICY_SFN_CONST);
    CHECK_EQ(dl_policy_sfn_parse("linear", &s), DL_EINVAL);
    CHECK(strstr(dl_errmsg(), "linear") && strstr(dl_errmsg(), "const, poly, hinge"), "message: %s", dl_errmsg());
    printf("  unknown staleness fn -> %s\n", dl_errmsg());
    dl_policy_kind k = DL_POLICY_DECOUPLED;
    CHECK_EQ(dl_policy_kind_parse("sync-elastic", &k), 0);
    CHECK_EQ(k, DL_POLICY_SYNC_ELASTIC);
    CHECK_EQ(dl_policy_kind_parse("ddiloco", &k), 0);
    CHECK_EQ(k, DL_POLICY_DECOUPLED);
    CHECK_EQ(dl_policy_kind_parse("sync", &k), 0);
    CHECK_EQ(k, DL_POLICY_SYNC);
    CHECK_EQ(dl_policy_kind_parse("fedavg", &k), DL_EINVAL);
    CHECK(!strcmp(dl_policy_kind_name(DL_POLICY_SYNC_ELASTIC), "sync-elastic"), "kind name");
    CHECK(!strcmp(dl_policy_close_name(DL_POLICY_CLOSE_GRACE_EXPIRED), "grace-expired"), "close name");
}

static void test_weights(void)
{
    printf("weights = tokens^2/steps * s(staleness)\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.sfn = DL_POLICY_SFN_CONST;
    CHECK_REL(dl_policy_weight(&c, 10, 1000, 0), 100000.0);
    CHECK_REL(dl_policy_weight(&c, 10, 1000, 7), 100000.0);
    CHECK_REL(dl_policy_weight(&c, 3, 7, 1), 49.0 / 3.0);
    c.sfn = DL_POLICY_SFN_POLY, c.sfn_a = 0.5;
    CHECK_REL(dl_policy_sfactor(&c, 0), 1.0);
    CHECK_REL(dl_policy_sfactor(&c, 3), 0.5);           /* 4^-0.5 */
    CHECK_REL(dl_policy_weight(&c, 10, 1000, 3), 50000.0);
    CHECK_REL(dl_policy_weight(&c, 10, 1000, 8), 100000.0 / 3.0); /* 9^-0.5 */
    c.sfn_a = 1.0;
    CHECK_REL(dl_policy_sfactor(&c, 1), 0.5);
    CHECK_REL(dl_policy_sfactor(&c, 4), 0.2);
    c.sfn = DL_POLICY_SFN_HINGE, c.sfn_a = 0.5, c.sfn_b = 2;
    CHECK_REL(dl_policy_sfactor(&c, 0), 1.0);
    CHECK_REL(dl_policy_sfactor(&c, 2), 1.0);           /* at the hinge */
    CHECK_REL(dl_policy_sfactor(&c, 4), 0.5);           /* 1/(0.5*2+1) */
    CHECK_REL(dl_policy_weight(&c, 10, 1000, 6), 100000.0 / 3.0); /* 1/(0.5*4+1) */

    /* The same numbers inside a closed round. One learner A makes 3 versions,
     * then B pushes with base 0 (staleness 3) and A with base 3. */
    dl_policy_cfg_default(&c);
    c.sfn = DL_POLICY_SFN_POLY, c.sfn_a = 0.5, c.gamma = 0.5;
    dl_policy *p = mk(&c, 1);
    join(p, 1, 0);
    for (int k = 0; k < 3; k++) {
        push(p, 0, 1, (uint64_t)k, 8, 800, k * 100 * MS, 0);
        CHECK_EQ(dl_policy_next_deadline(p), k * 100 * MS); /* only live learner is in: all-in */
        dl_policy_round r = close_one(p, k * 100 * MS);
        CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
        dl_policy_committed(p, 0, (uint64_t)k + 1, k * 100 * MS);
    }
    join(p, 2, 220 * MS);
    dl_policy_verdict v = push(p, 0, 2, 0, 10, 1000, 250 * MS, 0);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    CHECK_EQ(v.staleness, 3);
    /* A: intervals 100 ms, last push 200 ms -> point 300 ms, margin 100/32 ms.
     * slack = median of live learners' median intervals = A's 100 ms (B has
     * none yet), cap = 250 + 0.5*100 = 300 ms. */
    CHECK_EQ(dl_policy_slack_ns(p), 100 * MS);
    int64_t pt = 0, mg = 0;
    CHECK_EQ(dl_policy_prediction(p, 1, 0, &pt, &mg), 0);
    CHECK_EQ(pt, 300 * MS);
    CHECK_EQ(mg, 3125 * US);
    CHECK_EQ(dl_policy_next_deadline(p), 300 * MS); /* min(303.125, cap 300) */
    push(p, 0, 1, 3, 20, 500, 290 * MS, 0);
    dl_policy_round r = close_one(p, 290 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.version, 3);
    CHECK_EQ(r.cap_ns, 300 * MS);
    for (int i = 0; i < r.n; i++) {
        const dl_policy_contrib *ct = &r.contribs[i];
        CHECK_EQ(ct->decision, DL_POLICY_MERGED);
        if (ct->learner == 2) {
            CHECK_EQ(ct->staleness, 3);
            CHECK_REL(ct->sfactor, 0.5);
            CHECK_REL(ct->weight, 50000.0);
        } else {
            CHECK_EQ(ct->staleness, 0);
            CHECK_REL(ct->weight, 12500.0); /* 500^2/20 */
        }
    }
    CHECK_REL(r.weight_sum, 62500.0);
    dl_policy_committed(p, 0, 4, 290 * MS);
    dl_policy_close(&p);
    CHECK(p == NULL, "a refused open leaves the handle NULL");
    dl_policy_close(&p);
}

/* ------------------------------------------------------------------ quorum */

static void test_quorum(void)
{
    printf("quorum not reached -> no close; quorum + everyone in -> immediate early close\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 3;
    dl_policy *p = mk(&c, 2);
    for (uint32_t i = 1; i <= 4; i++) join(p, i, 0);
    push_fresh(p, 0, 1, 1 * MS);
    push_fresh(p, 0, 2, 2 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    dl_policy_round r;
    CHECK_EQ(dl_policy_poll(p, 2999 * MS, &r), 0);
    /* the third distinct learner reaches K; learner 4 has no history: not waited for */
    push_fresh(p, 0, 3, 3000 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), 3000 * MS);
    r = close_one(p, 3000 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.n_missing, 1);
    CHECK_EQ(r.quorum_ns, 3000 * MS);
    dl_policy_committed(p, 0, 1, 3000 * MS);
    print_stats("quorum", p);
    dl_policy_close(&p);

    /* K = 3 of 3: the push that reaches quorum also makes everyone in. */
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    push_fresh(p, 0, 1, 0);
    push_fresh(p, 0, 2, 5 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    CHECK_EQ(dl_policy_poll(p, 8 * MS, &r), 0);
    push_fresh(p, 0, 3, 9 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), 9 * MS);
    r = close_one(p, 9 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.n_missing, 0);
    CHECK_EQ(r.closed_ns, 9 * MS);
    /* in flight: the next round pools but cannot close before the commit */
    push_fresh(p, 0, 1, 1000 * MS);
    push_fresh(p, 0, 2, 1001 * MS);
    push(p, 0, 3, 0, 8, 800, 1002 * MS, 0);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    CHECK_EQ(dl_policy_poll(p, 1003 * MS, &r), 0);
    dl_policy_committed(p, 0, 1, 1004 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), 1004 * MS); /* next pushes predicted ~1 s later */
    r = close_one(p, 1004 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.quorum_ns, 1002 * MS); /* reached while the previous round was in flight */
    CHECK_EQ(r.version, 1);
    CHECK_EQ(r.n, 3);
    for (int i = 0; i < r.n; i++) CHECK_EQ(r.contribs[i].staleness, 1); /* all pushed base 0 */
    dl_policy_abandon(p, 0, 1005 * MS);
    CHECK_EQ(dl_policy_version(p, 0), 1);
    dl_policy_close(&p);
}

/* ------------------------------------------------------------------ grace window */

/* Three learners push fragment 0 every 100 ms at offsets 0 (A=1), 10 (B=2) and
 * 40 ms (C=3); K = 2. Runs `periods` periods, closing and committing every round
 * as soon as it is due. From period 2 on, every round waits for C and closes
 * all-in at C's arrival. */
static void warm(dl_policy *p, int periods)
{
    dl_policy_round r;
    const int64_t off[3] = {0, 10 * MS, 40 * MS};
    for (int n = 0; n < periods; n++) {
        for (int i = 0; i < 3; i++) {
            int64_t t = n * 100 * MS + off[i];
            while (dl_policy_next_deadline(p) < t) {
                int64_t d = dl_policy_next_deadline(p);
                CHECK_EQ(dl_policy_poll(p, d, &r), 1);
                dl_policy_committed(p, 0, r.version + 1, d);
            }
            push_fresh(p, 0, (uint32_t)i + 1, t);
            while (dl_policy_poll(p, t, &r)) {
                if (n == periods - 1 && periods >= 4) {
                    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
                    CHECK_EQ(r.n, 3);
                    CHECK_EQ(r.closed_ns, t);
                }
                dl_policy_committed(p, 0, r.version + 1, t);
            }
        }
    }
}

static void test_grace(void)
{
    printf("adaptive grace window (K=2, learners every 100 ms at +0/+10/+40 ms)\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 2, c.gamma = 0.5, c.grace_cap_ns = 1000 * MS, c.mad_k = 3;
    const int N = 12;
    const int64_t t0 = N * 100 * MS;
    /* At period N: slack = 100 ms (every learner's intervals are 100 ms);
     * quorum when B arrives at t0+10; cap = t0+10+0.5*100 = t0+60;
     * C: point = t0-60+100 = t0+40, margin = max(3*MAD 0, 100/32) = 3.125 ms. */
    const int64_t c_until = t0 + 40 * MS + 3125 * US;

    /* (a) one more learner predicted soon: stays open until it arrives */
    dl_policy *p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    warm(p, N);
    CHECK_EQ(dl_policy_slack_ns(p), 100 * MS);
    push_fresh(p, 0, 1, t0);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER); /* 1 < K */
    push_fresh(p, 0, 2, t0 + 10 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), c_until);
    dl_policy_round r;
    CHECK_EQ(dl_policy_poll(p, t0 + 39 * MS, &r), 0);
    push_fresh(p, 0, 3, t0 + 40 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), t0 + 40 * MS);
    r = close_one(p, t0 + 40 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.quorum_ns, t0 + 10 * MS);
    CHECK_EQ(r.cap_ns, t0 + 60 * MS);
    dl_policy_committed(p, 0, r.version + 1, t0 + 40 * MS);
    print_stats("grace-arrives", p);
    dl_policy_close(&p);

    /* (b) the predicted learner never comes: closes exactly at its predicted
     * time + margin, which lies inside the cap; then a late learner is not
     * waited for in the next round. */
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    warm(p, N);
    push_fresh(p, 0, 1, t0);
    push_fresh(p, 0, 2, t0 + 10 * MS);
    int64_t d = dl_policy_next_deadline(p);
    CHECK_EQ(d, c_until);
    CHECK_EQ(dl_policy_poll(p, d - 1, &r), 0);
    r = close_one(p, d);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_GRACE_EXPIRED);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.n_missing, 1);
    CHECK_EQ(r.deadline_ns, c_until);
    CHECK(r.closed_ns <= r.cap_ns && r.cap_ns == t0 + 60 * MS, "closed %lld cap %lld", (long long)r.closed_ns, (long long)r.cap_ns);
    dl_policy_committed(p, 0, r.version + 1, d);
    /* next period: C's point (t0+40) + margin is long past: not waited for */
    push_fresh(p, 0, 1, t0 + 100 * MS);
    push_fresh(p, 0, 2, t0 + 110 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), t0 + 110 * MS);
    r = close_one(p, t0 + 110 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE);
    dl_policy_committed(p, 0, r.version + 1, t0 + 110 * MS);
    print_stats("grace-expired", p);
    dl_policy_close(&p);

    /* (c) the awaited learner dies: it leaves the expected set, round closes at once */
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    warm(p, N);
    push_fresh(p, 0, 1, t0);
    push_fresh(p, 0, 2, t0 + 10 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), c_until);
    CHECK_EQ(dl_policy_learner_leave(p, 3, t0 + 20 * MS, DL_POLICY_LEAVE_DEAD), 0);
    CHECK_EQ(dl_policy_live_count(p), 2);
    CHECK_EQ(dl_policy_next_deadline(p), t0 + 20 * MS);
    r = close_one(p, t0 + 20 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.n_missing, 0);
    dl_policy_committed(p, 0, r.version + 1, t0 + 20 * MS);
    /* a learner that contributed and then died still counts */
    push_fresh(p, 0, 1, t0 + 100 * MS);
    CHECK_EQ(dl_policy_learner_leave(p, 1, t0 + 101 * MS, DL_POLICY_LEAVE_DEAD), 0);
    /* live = {B}: K_eff = 1, B predicted at t0+110 */
    CHECK_EQ(dl_policy_next_deadline(p), t0 + 113 * MS + 125 * US);
    push_fresh(p, 0, 2, t0 + 110 * MS);
    r = close_one(p, t0 + 110 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 2);
    for (int i = 0; i < r.n; i++) CHECK_EQ(r.contribs[i].learner_dead, r.contribs[i].learner == 1);
    dl_policy_committed(p, 0, r.version + 1, t0 + 110 * MS);
    print_stats("grace-dead", p);
    dl_policy_close(&p);

    /* (d) cap binds: grace_cap 31 ms < C's point + margin */
    c.grace_cap_ns = 31 * MS;
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    warm(p, N);
    push_fresh(p, 0, 1, t0);
    push_fresh(p, 0, 2, t0 + 10 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), t0 + 41 * MS); /* t0+10 + min(31, 0.5*100) */
    r = close_one(p, t0 + 41 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_CAP);
    CHECK_EQ(r.cap_ns, t0 + 41 * MS);
    CHECK_EQ(r.n, 2);
    dl_policy_committed(p, 0, r.version + 1, t0 + 41 * MS);
    /* gamma binds: gamma 0.25 -> cap t0+10+25 < C's point t0+40: not waited */
    dl_policy_close(&p);
    c.grace_cap_ns = 1000 * MS;
    c.gamma = 0.25;
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    warm(p, 2); /* slack 100 ms: cap = quorum + 25 ms */
    push_fresh(p, 0, 1, 200 * MS);
    push_fresh(p, 0, 2, 210 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), 210 * MS);
    r = close_one(p, 210 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE);
    CHECK_EQ(r.cap_ns, 235 * MS);
    dl_policy_committed(p, 0, r.version + 1, 210 * MS);
    print_stats("grace-cap", p);
    dl_policy_close(&p);

    /* (e) a contributor whose pooled push waited a period for quorum is not
     * waited for: its learner holds its next push until this one is decided
     * (the hold rule), so the round closes ALL_IN at quorum (K = 3) */
    c.gamma = 0.5, c.quorum = 3;
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    warm(p, N);
    push_fresh(p, 0, 1, t0);
    push(p, 0, 3, dl_policy_version(p, 0), 8, 800, t0 + 40 * MS, 31); /* B skips this period */
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    dl_policy_verdict v = push_fresh(p, 0, 1, t0 + 100 * MS);
    CHECK_EQ(v.replaced, 1);
    push_fresh(p, 0, 2, t0 + 110 * MS); /* quorum; C's next push (t0+140) is held by C */
    CHECK_EQ(dl_policy_next_deadline(p), t0 + 110 * MS);
    r = close_one(p, t0 + 110 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 3);
    for (int i = 0; i < r.n; i++)
        if (r.contribs[i].learner == 3) CHECK(r.contribs[i].handle == 31 && r.contribs[i].n_replaced == 0,
                                        "learner 3 handle %llu replaced %d", (unsigned long long)r.contribs[i].handle, (int)r.contribs[i].n_replaced);
    dl_policy_committed(p, 0, r.version + 1, t0 + 110 * MS);
    print_stats("grace-refresh", p);
    dl_policy_close(&p);
}

/* ------------------------------------------------------------------ stale, reject, replace */

static void test_stale_reject(void)
{
    printf("drop beyond max_staleness (rebase), rejections\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.max_staleness = 2;
    c.sfn = DL_POLICY_SFN_CONST;
    dl_policy *p = mk(&c, 2);
    join(p, 1, 0);
    join(p, 2, 0);
    dl_policy_round r;
    for (int k = 0; k < 4; k++) { /* learner 1 alone makes versions 1..4 of fragment 0 */
        push_fresh(p, 0, 1, k * MS);
        CHECK_EQ(dl_policy_poll(p, k * MS, &r), 1);
        dl_policy_committed(p, 0, (uint64_t)k + 1, k * MS);
    }
    dl_policy_verdict v = push(p, 0, 2, 1, 8, 800, 10 * MS, 77);
    CHECK_EQ(v.decision, DL_POLICY_DROPPED_STALE);
    CHECK_EQ(v.reason, DL_POLICY_R_STALE);
    CHECK_EQ(v.staleness, 3);
    CHECK_EQ(v.rebase, 1);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER); /* nothing pooled */
    v = push(p, 0, 2, 2, 8, 800, 11 * MS, 78);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    CHECK_EQ(v.staleness, 2);
    CHECK_EQ(v.rebase, 0);
    r = close_one(p, 11 * MS);
    CHECK_EQ(r.n, 1);
    CHECK_EQ(r.contribs[0].staleness, 2);
    CHECK_EQ(r.contribs[0].handle, 78);
    /* while that round is in flight a push merges onto version 5 at the earliest */
    v = push(p, 0, 1, 2, 8, 800, 12 * MS, 79);
    CHECK_EQ(v.decision, DL_POLICY_DROPPED_STALE);
    CHECK_EQ(v.staleness, 3);
    v = push(p, 0, 1, 3, 8, 800, 13 * MS, 80);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    CHECK_EQ(v.staleness, 2);
    dl_policy_committed(p, 0, 5, 14 * MS);
    r = close_one(p, 14 * MS);
    CHECK_EQ(r.contribs[0].staleness, 2);
    CHECK_EQ(r.version, 5);
    dl_policy_committed(p, 0, 6, 14 * MS);

    /* rejections leave no trace */
    v = push(p, 1, 1, 0, 0, 800, 20 * MS, 1);
    CHECK_EQ(v.decision, DL_POLICY_REJECTED);
    CHECK_EQ(v.reason, DL_POLICY_R_BAD_STEPS);
    v = push(p, 1, 1, 0, -3, 800, 20 * MS, 1);
    CHECK_EQ(v.reason, DL_POLICY_R_BAD_STEPS);
    v = push(p, 1, 1, 0, 8, -5, 20 * MS, 1);
    CHECK_EQ(v.decision, DL_POLICY_REJECTED);
    CHECK_EQ(v.reason, DL_POLICY_R_BAD_TOKENS);
    v = push(p, 1, 1, 0, 8, 0, 20 * MS, 1);
    CHECK_EQ(v.reason, DL_POLICY_R_BAD_TOKENS);
    v = push(p, 1, 1, 99, 8, 800, 20 * MS, 1);
    CHECK_EQ(v.reason, DL_POLICY_R_FUTURE_VERSION);
    v = push(p, 1, 77, 0, 8, 800, 20 * MS, 1);
    CHECK_EQ(v.reason, DL_POLICY_R_NOT_MEMBER);
    v = push(p, 2, 1, 0, 8, 800, 20 * MS, 1);
    CHECK_EQ(v.reason, DL_POLICY_R_BAD_FRAGMENT);
    v = push(p, -1, 1, 0, 8, 800, 20 * MS, 1);
    CHECK_EQ(v.reason, DL_POLICY_R_BAD_FRAGMENT);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    dl_policy_stats s;
    dl_policy_get_stats(p, &s);
    CHECK_EQ(s.rejected, 8);
    CHECK_EQ(s.dropped_stale, 2);
    print_stats("stale-reject", p);
    dl_policy_close(&p);
}

static void test_replace(void)
{
    printf("second push by the same learner in the same open round replaces the first\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 2;
    c.sfn = DL_POLICY_SFN_CONST;
    dl_policy *p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    dl_policy_verdict v = push(p, 0, 1, 0, 5, 50, 0, 11);
    CHECK_EQ(v.replaced, 0);
    v = push(p, 0, 1, 0, 8, 80, 500 * MS, 12);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    CHECK_EQ(v.replaced, 1);
    CHECK_EQ(v.replaced_handle, 11);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER); /* one distinct learner < K */
    push(p, 0, 2, 0, 4, 40, 501 * MS, 21);
    dl_policy_round r = close_one(p, 501 * MS); /* A's next push: ~1000 ms, after the cap */
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE); /* learner 3 has no history */
    for (int i = 0; i < r.n; i++) {
        const dl_policy_contrib *ct = &r.contribs[i];
        if (ct->learner == 1) {
            CHECK_EQ(ct->handle, 12);
            CHECK_EQ(ct->steps, 8);
            CHECK_EQ(ct->tokens, 80);
            CHECK_EQ(ct->n_replaced, 1);
            CHECK_EQ(ct->arrival_ns, 500 * MS);
            CHECK_REL(ct->weight, 800.0);
        } else {
            CHECK_EQ(ct->handle, 21);
            CHECK_REL(ct->weight, 400.0);
        }
    }
    dl_policy_committed(p, 0, 1, 501 * MS);
    dl_policy_stats s;
    dl_policy_get_stats(p, &s);
    CHECK_EQ(s.replaced, 1);
    CHECK_EQ(s.merged, 2);
    print_stats("replace", p);
    dl_policy_close(&p);
}

static void progress(dl_policy *p, uint32_t id, int64_t step, int64_t tokens, double rate, int64_t t)
{
    CHECK_EQ(dl_policy_learner_progress(p, id, (uint64_t)step, (uint64_t)tokens, rate, t), 0);
}

/* Issue 27, bug 2: a learner's pooled push replaced by its push on a newer
 * base lost the pooled progress. Quorum 2, learners A, B, C: C pushes on
 * base 0 into A's open round, v1 commits (A + B), C adopts it and -- its hold
 * released by the decision timeout -- pushes on base 1: refused, not
 * replacing; the round merges C's base-0 push. */
static void test_replace_other_base(void)
{
    printf("a push on another base never replaces the learner's pooled push (refused, progress kept)\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 2;
    c.sfn = DL_POLICY_SFN_CONST;
    dl_policy *p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    push(p, 0, 1, 0, 10, 100, 0, 11);
    push(p, 0, 2, 0, 10, 100, 1 * MS, 21);
    dl_policy_round r = close_one(p, 1 * MS);
    CHECK_EQ(r.n, 2);
    /* C's push of base 0 pools into the next round while v1 is in flight */
    dl_policy_verdict v = push(p, 0, 3, 0, 24, 240, 2 * MS, 31);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    dl_policy_committed(p, 0, 1, 3 * MS);
    v = push(p, 0, 3, 1, 10, 100, 30000 * MS, 32);
    CHECK_EQ(v.decision, DL_POLICY_REJECTED);
    CHECK_EQ(v.reason, DL_POLICY_R_POOLED_OTHER_BASE);
    CHECK_EQ(v.replaced, 0);
    CHECK_EQ(v.rebase, 0);
    CHECK(strstr(dl_policy_reason_name(v.reason), "next push") != NULL, "reason names what happens: %s",
          dl_policy_reason_name(v.reason));
    /* the same base still replaces (the newer push contains the older progress) */
    v = push(p, 0, 3, 0, 30, 300, 30001 * MS, 33);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    CHECK_EQ(v.replaced, 1);
    CHECK_EQ(v.replaced_handle, 31);
    push(p, 0, 1, 1, 10, 100, 30002 * MS, 12);
    r = close_one(p, 30002 * MS);
    CHECK_EQ(r.n, 2);
    int c_in = 0;
    for (int i = 0; i < r.n; i++)
        if (r.contribs[i].learner == 3) c_in = r.contribs[i].handle == 33 && r.contribs[i].base_version == 0;
    CHECK(c_in, "C's base-0 progress is merged");
    dl_policy_committed(p, 0, 2, 30002 * MS);
    /* after that round C's base-1 progress pools normally */
    v = push(p, 0, 3, 1, 20, 200, 30003 * MS, 34);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    CHECK_EQ(v.replaced, 0);
    print_stats("replace-base", p);
    dl_policy_close(&p);
}

/* Issue 27, bug 3: the grace window waited for a contributor's next push,
 * which its learner holds until the pooled one is decided. One learner at
 * 10 steps/s, quorum 1, H = 4, grace_steps 4: the round closes at once. */
static void test_grace_contributor(void)
{
    printf("the grace window never waits for a learner already in the round\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 1, c.H = 4, c.tau_steps = 4, c.grace_cap_ns = 5000 * MS;
    dl_policy *p = mk(&c, 1);
    join(p, 0, 0);
    for (int k = 1; k <= 3; k++) {
        int64_t t = k * 400 * MS;
        progress(p, 0, 4 * k, 4 * k * 256, 10.0, t);
        push(p, 0, 0, dl_policy_version(p, 0), 4, 4 * 256, t, (uint64_t)k);
        CHECK_EQ(dl_policy_next_deadline(p), t);
        dl_policy_round r = close_one(p, t);
        CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
        dl_policy_committed(p, 0, r.version + 1, t);
    }
    dl_policy_stats s;
    dl_policy_get_stats(p, &s);
    CHECK_EQ(s.close[DL_POLICY_CLOSE_CAP], 0);
    print_stats("grace-contrib", p);
    dl_policy_close(&p);
}

/* Issue 27, a same-id restart at quorum 3 (tests/test_conserve.sh): learners
 * that end out of phase. Learner 3 (restarted) made its last push of
 * fragment 0 into round v1 and is in its final flush (a push flagged final
 * came, of fragment 1); learners 1 and 2 then push fragment 0 (2's final
 * push, 1's held final one). Learner 3 never pushes fragment 0 again, so a
 * round that counted it in K_eff (3 live) waited for it until the learners'
 * flush timeouts; it closes at once now, K_eff = 2, nobody missing. A
 * finishing learner that did contribute still counts, and a restart (its
 * step count going down) makes it expected again. */
static void test_final_flush(void)
{
    printf("a learner in its final flush is not waited for: K_eff counts it only with a contribution\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 3;
    dl_policy *p = mk(&c, 2);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    for (uint32_t i = 1; i <= 3; i++) push_fresh(p, 0, i, (int64_t)i * MS);
    dl_policy_round r = close_one(p, 3 * MS);
    CHECK_EQ(r.n, 3);
    dl_policy_committed(p, 0, 1, 4 * MS);
    CHECK_EQ(dl_policy_learner_final(p, 3, 1, NULL, 0, 5 * MS), 0); /* learner 3's final push of fragment 1 */
    push_fresh(p, 1, 3, 5 * MS);
    push_fresh(p, 0, 1, 6 * MS);
    push_fresh(p, 0, 2, 7 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), 7 * MS);
    r = close_one(p, 7 * MS);
    CHECK_EQ(r.fragment, 0);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n_missing, 0);
    dl_policy_committed(p, 0, 2, 8 * MS);
    /* fragment 1: learner 3 contributed, so it counts: 1 and 2 complete the quorum of 3 */
    push_fresh(p, 1, 1, 9 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    push_fresh(p, 1, 2, 10 * MS);
    r = close_one(p, 10 * MS);
    CHECK_EQ(r.n, 3);
    dl_policy_committed(p, 1, 1, 11 * MS);
    /* learner 3 restarts and counts from a lower step: it trains again, K_eff is 3 again */
    progress(p, 3, 100, 800, 10.0, 12 * MS);
    progress(p, 3, 20, 160, 10.0, 13 * MS);
    push_fresh(p, 0, 1, 14 * MS);
    push_fresh(p, 0, 2, 15 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    CHECK_EQ(dl_policy_learner_final(p, 99, 0, NULL, 0, 16 * MS), DL_ENOTFOUND);
    print_stats("final-flush", p);
    dl_policy_close(&p);
}

/* The final flush of learners that end together (bench/bandwidth.sh at H=64:
 * 2.647 against 2.473 before the rule above, found by bisection). Learner 3's
 * first final push (fragment 0) names fragment 1 as still to come
 * (Push.final_pending): fragment 1's round, where learners 1 and 2 pushed,
 * waits for it (K_eff 3) and closes with all three once it comes. Without
 * the list it closed at once with two, and learner 3's progress of
 * fragment 1 went in a round of its own on a stale base. The head of its
 * next final push (fragment 1) lists nothing more: fragment 1 waits for
 * that push's body (bench/bandwidth.sh again: a round closed between a
 * chunked final push's first chunk and its last), and fragment 0's next
 * round no longer counts it. */
static void test_final_pending(void)
{
    printf("a learner in its final flush is waited for in the fragments it has yet to push\n");
    for (int with_list = 1; with_list >= 0; with_list--) {
        dl_policy_cfg c;
        dl_policy_cfg_default(&c);
        c.quorum = 3;
        dl_policy *p = mk(&c, 2);
        for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
        push_fresh(p, 1, 1, 1 * MS);
        push_fresh(p, 1, 2, 2 * MS);
        /* learner 3's first final push (its head, then its body): fragment 1 is still to come */
        const uint32_t pend[] = {1, 7}; /* 7 >= P: ignored */
        CHECK_EQ(dl_policy_learner_final(p, 3, 0, pend, with_list ? 2 : 0, 3 * MS), 0);
        push_fresh(p, 0, 3, 3 * MS);
        if (!with_list) { /* the rule without the list: fragment 1 closes with learners 1 and 2 */
            CHECK_EQ(dl_policy_next_deadline(p), 3 * MS);
            dl_policy_round r = close_one(p, 3 * MS);
            CHECK_EQ(r.fragment, 1);
            CHECK_EQ(r.n, 2);
            dl_policy_close(&p);
            continue;
        }
        CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER); /* fragment 0 waits for 1 and 2, fragment 1 for 3 */
        /* the head of its last final push, naming nothing more: fragment 1 waits for its body (a chunked
         * push's chunks arrive over several loop turns) */
        CHECK_EQ(dl_policy_learner_final(p, 3, 1, NULL, 0, 4 * MS), 0);
        CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
        push_fresh(p, 1, 3, 4 * MS);
        CHECK_EQ(dl_policy_next_deadline(p), 4 * MS);
        dl_policy_round r = close_one(p, 4 * MS);
        CHECK_EQ(r.fragment, 1);
        CHECK_EQ(r.n, 3);
        CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
        dl_policy_committed(p, 1, 1, 5 * MS);
        /* fragment 0: learner 3 contributed; 1 and 2 complete it */
        push_fresh(p, 0, 1, 6 * MS);
        CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
        push_fresh(p, 0, 2, 7 * MS);
        r = close_one(p, 7 * MS);
        CHECK_EQ(r.n, 3);
        dl_policy_committed(p, 0, 1, 8 * MS);
        /* a new round of fragment 1 (learner 1 goes on): learner 3 owes nothing, K_eff is 2 */
        push_fresh(p, 1, 1, 9 * MS);
        CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
        push_fresh(p, 1, 2, 10 * MS);
        r = close_one(p, 10 * MS);
        CHECK_EQ(r.n, 2);
        CHECK_EQ(r.n_missing, 0);
        print_stats("final-pending", p);
        dl_policy_close(&p);
    }
}

/* Issue 27, the final flush: learners that end one after the other each
 * flush, then say Bye. Counting only the live ones in a share's expected
 * tokens gave each later flush a larger share (the last learner's a whole
 * outer step). A learner that said Bye counts for one more push period. */
static void test_share_after_bye(void)
{
    printf("a learner that said bye still counts in shares for a period\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 1, c.H = 8, c.tau_steps = 1, c.sfn = DL_POLICY_SFN_CONST;
    dl_policy *p = mk(&c, 1);
    join(p, 0, 0), join(p, 1, 0);
    progress(p, 0, 8, 8 * 256, 10.0, 800 * MS);
    progress(p, 1, 8, 8 * 256, 10.0, 800 * MS); /* fleet step 100 ms: a period is 800 ms */
    push(p, 0, 0, 0, 8, 8 * 256, 800 * MS, 1);
    int64_t d = dl_policy_next_deadline(p); /* the window waits a step for learner 1 */
    dl_policy_round r = close_one(p, d);
    CHECK_REL(r.share, 0.5);
    dl_policy_committed(p, 0, 1, d);
    CHECK_EQ(dl_policy_learner_leave(p, 0, 910 * MS, DL_POLICY_LEAVE_BYE), 0);
    push(p, 0, 1, 0, 8, 8 * 256, 920 * MS, 2); /* learner 1's flush, just after 0's bye */
    r = close_one(p, 920 * MS);
    CHECK_REL(r.share, 0.5);
    dl_policy_committed(p, 0, 2, 920 * MS);
    /* a period after the bye the fleet is learner 1 alone */
    progress(p, 1, 17, 17 * 256, 10.0, 1800 * MS);
    push(p, 0, 1, 2, 8, 8 * 256, 1800 * MS, 3);
    r = close_one(p, 1800 * MS);
    CHECK_REL(r.share, 1.0);
    dl_policy_committed(p, 0, 3, 1800 * MS);
    dl_policy_close(&p);
}

/* ------------------------------------------------------------------ membership */

static void test_sync(void)
{
    printf("SYNC waits for every registered learner, SYNC_ELASTIC only for live ones\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.kind = DL_POLICY_SYNC;
    c.quorum = 1;
    dl_policy *p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    CHECK_EQ(dl_policy_learner_leave(p, 3, 1 * MS, DL_POLICY_LEAVE_DEAD), 0);
    push_fresh(p, 0, 1, 2 * MS);
    push_fresh(p, 0, 2, 3 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER); /* dead learner 3 still expected */
    dl_policy_round r;
    CHECK_EQ(dl_policy_poll(p, 3600000 * MS, &r), 0);
    /* its push revives it and completes the barrier */
    push_fresh(p, 0, 3, 3600001 * MS);
    CHECK_EQ(dl_policy_live_count(p), 3);
    r = close_one(p, 3600001 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.cap_ns, DL_POLICY_NEVER);
    dl_policy_committed(p, 0, 1, 3600001 * MS);
    /* bye unregisters: the barrier shrinks */
    push_fresh(p, 0, 1, 3600100 * MS);
    push_fresh(p, 0, 2, 3600101 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    CHECK_EQ(dl_policy_learner_leave(p, 3, 3600102 * MS, DL_POLICY_LEAVE_BYE), 0);
    CHECK_EQ(dl_policy_next_deadline(p), 3600102 * MS);
    r = close_one(p, 3600102 * MS);
    CHECK_EQ(r.n, 2);
    dl_policy_committed(p, 0, 2, 3600102 * MS);
    /* a learner that joins after a round opened is expected from the next round */
    push_fresh(p, 0, 1, 3600200 * MS);
    join(p, 4, 3600201 * MS);
    push_fresh(p, 0, 2, 3600202 * MS);
    r = close_one(p, 3600202 * MS);
    CHECK_EQ(r.n, 2);
    dl_policy_committed(p, 0, 3, 3600202 * MS);
    push_fresh(p, 0, 1, 3600300 * MS);
    push_fresh(p, 0, 2, 3600301 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER); /* now 4 is expected */
    CHECK_EQ(dl_policy_learner_alive(p, 3, 3600302 * MS), DL_ENOTFOUND); /* said bye */
    print_stats("sync", p);
    dl_policy_close(&p);

    c.kind = DL_POLICY_SYNC_ELASTIC;
    p = mk(&c, 1);
    for (uint32_t i = 1; i <= 3; i++) join(p, i, 0);
    CHECK_EQ(dl_policy_learner_leave(p, 3, 1 * MS, DL_POLICY_LEAVE_DEAD), 0);
    push_fresh(p, 0, 1, 2 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    push_fresh(p, 0, 2, 3 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), 3 * MS);
    r = close_one(p, 3 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 2);
    dl_policy_committed(p, 0, 1, 3 * MS);
    /* death during an open barrier closes it at once */
    CHECK_EQ(dl_policy_learner_alive(p, 3, 4 * MS), 0);
    push_fresh(p, 0, 1, 5 * MS);
    push_fresh(p, 0, 2, 6 * MS);
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    CHECK_EQ(dl_policy_learner_leave(p, 3, 7 * MS, DL_POLICY_LEAVE_DEAD), 0);
    CHECK_EQ(dl_policy_next_deadline(p), 7 * MS);
    r = close_one(p, 7 * MS);
    CHECK_EQ(r.n, 2);
    dl_policy_committed(p, 0, 2, 7 * MS);
    print_stats("sync-elastic", p);
    dl_policy_close(&p);
}

static void test_capacity(void)
{
    printf("learner slots are bounded by max_learners\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.max_learners = 4;
    c.quorum = 2;
    dl_policy *p = mk(&c, 3);
    for (uint32_t i = 1; i <= 4; i++) join(p, i, 0);
    CHECK_EQ(dl_policy_learner_join(p, 5, 0), DL_ERANGE);
    printf("  5th learner -> %s\n", dl_errmsg());
    join(p, 4, 0); /* re-join of a registered learner is fine */
    CHECK_EQ(dl_policy_learner_leave(p, 2, 1 * MS, DL_POLICY_LEAVE_BYE), 0);
    join(p, 5, 2 * MS); /* reuses learner 2's slot */
    dl_policy_verdict v = push_fresh(p, 0, 2, 3 * MS);
    CHECK_EQ(v.reason, DL_POLICY_R_NOT_MEMBER);
    v = push_fresh(p, 0, 5, 3 * MS);
    CHECK_EQ(v.decision, DL_POLICY_POOLED);
    /* learner 3 pushes then says bye: its slot holds a pooled push, not reusable */
    push_fresh(p, 1, 3, 4 * MS);
    CHECK_EQ(dl_policy_learner_leave(p, 3, 5 * MS, DL_POLICY_LEAVE_BYE), 0);
    CHECK_EQ(dl_policy_learner_join(p, 6, 6 * MS), DL_ERANGE);
    push_fresh(p, 1, 4, 7 * MS); /* quorum on fragment 1: 3 (gone) + 4 */
    dl_policy_round r = close_one(p, 7 * MS);
    CHECK_EQ(r.fragment, 1);
    CHECK_EQ(r.n, 2);
    for (int i = 0; i < r.n; i++) CHECK_EQ(r.contribs[i].learner_dead, r.contribs[i].learner == 3);
    dl_policy_committed(p, 1, 1, 7 * MS);
    join(p, 6, 8 * MS);
    CHECK_EQ(dl_policy_live_count(p), 4);
    CHECK_EQ(dl_policy_learner_leave(p, 99, 9 * MS, DL_POLICY_LEAVE_DEAD), DL_ENOTFOUND);
    dl_policy_close(&p);
}

/* ------------------------------------------------------------------ schedule-driven rounds (H > 0) */

#define SCH_H 64
#define SCH_P 4
#define SCH_STEP (100 * MS) /* 10 steps/s */
#define SCH_PERIODS 4


typedef struct {
    int64_t t;
    uint32_t id;
    int64_t step;
} sch_ev;

static int sch_cmp(const void *a, const void *b)
{
    const sch_ev *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

typedef struct {
    int n_rounds, n_in_phase, n_alone, n_joined, bad; /* n_joined: learner 4 inside an in-phase round */
    double share_in[SCH_P][SCH_PERIODS + 1], share_alone[SCH_P][SCH_PERIODS + 1];
} sch_res;

/* Learners 0..3 in phase (+2 ms each) at 10 steps/s, tokens per step 256;
 * mode 1: learner 4 (512 tokens per step) runs 32 steps + 1 ms behind; mode
 * 2: learner 4 is a straggler at 1/4 speed (2.5 steps/s), for a quarter of
 * the steps. Each learner reports progress (a Heartbeat) at its start and right
 * before every push; a push of f carries the steps since its previous push
 * of f (or since the start) and is relative to the version it adopted last
 * (contributors adopt the merge of their push). Every round is committed as
 * soon as it closes. */
static void sch_sim(int mode, sch_res *o)
{
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 1, c.H = SCH_H, c.tau_steps = 4, c.grace_cap_ns = 5000 * MS, c.sfn = DL_POLICY_SFN_CONST;
    dl_policy *p = mk(&c, SCH_P);
    memset(o, 0, sizeof *o);
    const int nl = mode ? 5 : 4;
    int64_t phase[5] = {0, 2 * MS, 4 * MS, 6 * MS, mode == 1 ? 32 * SCH_STEP + MS : MS};
    int64_t tps[5] = {256, 256, 256, 256, 512};
    int64_t step_ns[5] = {SCH_STEP, SCH_STEP, SCH_STEP, SCH_STEP, mode == 2 ? 4 * SCH_STEP : SCH_STEP};
    double rate[5] = {10, 10, 10, 10, mode == 2 ? 2.5 : 10};
    static sch_ev ev[5 * SCH_H * SCH_PERIODS];
    int ne = 0;
    for (uint32_t i = 0; i < (uint32_t)nl; i++)
        for (int64_t s = 0; s <= SCH_H * SCH_PERIODS / (step_ns[i] / SCH_STEP); s++) {
            int due = s == 0;
            for (int f = 0; f < SCH_P; f++) due |= dl_plan_due(s, f, SCH_H, SCH_P);
            if (due) ev[ne++] = (sch_ev){phase[i] + s * step_ns[i], i, s};
        }
    qsort(ev, (size_t)ne, sizeof *ev, sch_cmp);
    uint64_t adopted[5][SCH_P] = {{0}};
    int64_t last_step[5][SCH_P] = {{0}};
    dl_policy_round r;
    for (int e = 0; e <= ne; e++) {
        int64_t t = e < ne ? ev[e].t : INT64_MAX;
        for (;;) {
            int64_t d = dl_policy_next_deadline(p);
            if (d > t || d == DL_POLICY_NEVER) break;
            if (!dl_policy_poll(p, d, &r)) break;
            int in = 0, alone = 0;
            int64_t last_arrival = 0, step = 0;
            for (int k = 0; k < r.n; k++) {
                const dl_policy_contrib *ct = &r.contribs[k];
                adopted[ct->learner][r.fragment] = r.version + 1;
                in += ct->learner < 4, alone += ct->learner == 4;
                if (ct->arrival_ns > last_arrival) last_arrival = ct->arrival_ns;
                if (ct->learner < 4 || !step) step = last_step[ct->learner][r.fragment];
            }
            int period = (int)((step - 1) / SCH_H); /* 0-based period of the pushes' step */
            o->n_rounds++;
            if (in == 4) {
                o->n_in_phase++;
                o->n_joined += alone;
                if (!alone) o->share_in[r.fragment][period] += r.share;
                /* nobody waited in vain: closed at the 4th in-phase arrival */
                if (r.closed_ns != last_arrival ||
                    r.reason != (mode && r.n_missing ? DL_POLICY_CLOSE_PREDICTED_NONE : DL_POLICY_CLOSE_ALL_IN))
                    o->bad++;
            } else if (alone == 1 && !in) {
                o->n_alone++;
                o->share_alone[r.fragment][period] += r.share;
                if (r.closed_ns != last_arrival) o->bad++;
            } else {
                o->bad++;
                char line[512];
                dl_policy_round_format(&r, line, sizeof line);
                printf("    unexpected round t=%.3fms %s\n", (double)r.closed_ns / MS, line);
            }
            dl_policy_committed(p, r.fragment, r.version + 1, d);
        }
        if (e == ne) break;
        uint32_t id = ev[e].id;
        int64_t s = ev[e].step;
        if (s == 0) join(p, id, t);
        progress(p, id, s, s * tps[id], rate[id], t);
        for (int f = 0; f < SCH_P; f++) {
            if (!dl_plan_due(s, f, SCH_H, SCH_P)) continue;
            int64_t steps = s - last_step[id][f];
            last_step[id][f] = s;
            dl_policy_verdict v;
            CHECK_EQ(dl_policy_push(p, f, id, adopted[id][f], steps, steps * tps[id], t, (uint64_t)e, &v), 0);
            CHECK_EQ(v.decision, DL_POLICY_POOLED);
            CHECK_EQ(v.replaced, 0);
        }
    }
    CHECK_EQ(dl_policy_next_deadline(p), DL_POLICY_NEVER);
    print_stats(mode == 2 ? "schedule +slow" : mode ? "schedule +oop" : "schedule", p);
    dl_policy_close(&p);
}

static void test_schedule_gather(void)
{
    printf("schedule-driven rounds: 4 in-phase learners, K=1, H=%d, P=%d, %d periods\n", SCH_H, SCH_P, SCH_PERIODS);
    static sch_res o;
    /* (a) every round of every fragment gathers all 4, closing ALL_IN at the 4th arrival */
    sch_sim(0, &o);
    printf("  in phase: %d rounds, %d with all 4, bad %d\n", o.n_rounds, o.n_in_phase, o.bad);
    CHECK_EQ(o.n_rounds, SCH_P * SCH_PERIODS);
    CHECK_EQ(o.n_in_phase, SCH_P * SCH_PERIODS);
    CHECK_EQ(o.bad, 0);
    /* shares: a first push carries offset_f steps (a partial period), later ones H */
    for (int f = 0; f < SCH_P; f++) {
        int64_t off = (int64_t)f * SCH_H / SCH_P;
        CHECK_REL(o.share_in[f][0], off ? (double)off / SCH_H : 1.0);
        for (int k = 1; k < SCH_PERIODS; k++) CHECK_REL(o.share_in[f][k], 1.0);
    }
    /* a learner 32 steps out of phase is predicted beyond the cap (q + 4 steps):
     * the in-phase rounds do not wait for it, and its pushes close their own
     * rounds at once; each fragment's shares of a full period still sum to 1 */
    sch_sim(1, &o);
    printf("  + out of phase: %d rounds, %d in-phase, %d alone, bad %d; shares of a period %.4f + %.4f\n", o.n_rounds,
           o.n_in_phase, o.n_alone, o.bad, o.share_in[0][2], o.share_alone[0][2]);
    CHECK_EQ(o.n_in_phase, SCH_P * SCH_PERIODS);
    CHECK_EQ(o.n_alone, o.n_rounds - o.n_in_phase);
    CHECK(o.n_alone >= SCH_P * (SCH_PERIODS - 1), "alone %d", o.n_alone);
    CHECK_EQ(o.n_joined, 0);
    CHECK_EQ(o.bad, 0);
    for (int f = 0; f < SCH_P; f++)
        for (int k = 2; k < SCH_PERIODS; k++) { /* periods in which both sides push H steps' worth */
            CHECK_REL(o.share_in[f][k], 2.0 / 3.0); /* 4 x 256 of 4 x 256 + 512 tokens per step */
            CHECK_REL(o.share_alone[f][k], 1.0 / 3.0);
            CHECK_REL(o.share_in[f][k] + o.share_alone[f][k], 1.0);
        }
    /* a straggler at 1/4 speed is never waited for (predicted a long period
     * ahead); the in-phase rounds close at the 4th arrival as without it */
    sch_sim(2, &o);
    printf("  + straggler at 1/4 speed: %d rounds, %d in-phase (%d with the straggler), %d alone, bad %d\n",
           o.n_rounds, o.n_in_phase, o.n_joined, o.n_alone, o.bad);
    CHECK_EQ(o.n_in_phase, SCH_P * SCH_PERIODS);
    CHECK_EQ(o.n_alone + o.n_in_phase, o.n_rounds);
    CHECK_EQ(o.n_alone + o.n_joined, SCH_P); /* its pushes: one period's worth */
    CHECK_EQ(o.bad, 0);
}

/* (b) a learner with no push history is waited for; (c) cap = q + tau steps. */
static void test_schedule_predict(void)
{
    printf("schedule prediction: no push history, cap = q + tau steps\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 1, c.H = 64, c.tau_steps = 4, c.grace_cap_ns = 5000 * MS;
    dl_policy *p = mk(&c, 4);
    join(p, 0, 0), join(p, 1, 0);
    int64_t pt, mg;
    CHECK_EQ(dl_policy_prediction(p, 1, 1, &pt, &mg), DL_ENOTFOUND); /* no report yet */
    CHECK_EQ(dl_policy_learner_progress(p, 7, 0, 0, 10, 0), DL_ENOTFOUND);
    progress(p, 0, 0, 0, 10.0, 0);
    progress(p, 1, 0, 0, 10.0, 0);
    CHECK_EQ(dl_policy_step_ns(p), 100 * MS);
    /* learner 1 has never pushed: its first push of fragment 1 is due at step 16 */
    CHECK_EQ(dl_policy_prediction(p, 1, 1, &pt, &mg), 0);
    CHECK_EQ(pt, 1600 * MS);
    CHECK_EQ(mg, 100 * MS); /* one step */
    CHECK_EQ(dl_policy_prediction(p, 1, 0, &pt, &mg), 0);
    CHECK_EQ(pt, 6400 * MS); /* offset 0: first due at step H */
    progress(p, 0, 16, 16 * 256, 10.0, 1600 * MS);
    push(p, 1, 0, 0, 16, 16 * 256, 1600 * MS, 1);
    /* cap = 1600 + min(5000, 4 x 100) = 2000 ms; learner 1 until 1700 ms */
    CHECK_EQ(dl_policy_next_deadline(p), 1700 * MS);
    CHECK_EQ(dl_policy_prediction(p, 0, 1, &pt, &mg), 0);
    CHECK_EQ(pt, 8000 * MS); /* learner 0's next push of fragment 1: step 80 */
    progress(p, 1, 16, 16 * 256, 10.0, 1650 * MS); /* its Heartbeat, the push still on the wire */
    CHECK_EQ(dl_policy_next_deadline(p), 1750 * MS);
    push(p, 1, 1, 0, 16, 16 * 256, 1660 * MS, 2);
    dl_policy_round r = close_one(p, 1660 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_ALL_IN);
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.cap_ns, 2000 * MS);
    CHECK_REL(r.share, 0.25); /* 2 x 16 x 256 of 2 x 64 x 256 */
    CHECK_REL(r.expected_tokens, 2.0 * 64 * 256);
    dl_policy_committed(p, 1, 1, 1660 * MS);
    /* a learner counting again from step 3 (restarted) is due at step 16 again */
    CHECK_EQ(dl_policy_prediction(p, 1, 1, &pt, &mg), 0);
    CHECK_EQ(pt, 1650 * MS + 64 * 100 * MS); /* step 80 */
    progress(p, 1, 3, 3 * 256, 10.0, 1700 * MS);
    CHECK_EQ(dl_policy_prediction(p, 1, 1, &pt, &mg), 0);
    CHECK_EQ(pt, 1700 * MS + 13 * 100 * MS);
    dl_policy_close(&p);

    /* (c) learner 0 at 12.8 steps/s reaches step 16 at 1250 ms; learner 1 at
     * 10/s is predicted at 1600 ms. Fleet step = median(78.125, 100) ms =
     * 89.0625 ms, cap = 1250 + 4 x 89.0625 = 1606.25 ms: point 1600 <= cap,
     * until 1700 > cap, so the round closes at the cap. */
    p = mk(&c, 4);
    join(p, 0, 0), join(p, 1, 0);
    progress(p, 0, 0, 0, 12.8, 0);
    progress(p, 1, 0, 0, 10.0, 0);
    CHECK_EQ(dl_policy_step_ns(p), 89062500);
    progress(p, 0, 16, 16 * 256, 12.8, 1250 * MS);
    push(p, 1, 0, 0, 16, 16 * 256, 1250 * MS, 1);
    CHECK_EQ(dl_policy_next_deadline(p), 1606250 * US);
    r = close_one(p, 1606250 * US);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_CAP);
    CHECK_EQ(r.cap_ns, 1606250 * US);
    CHECK_EQ(r.n, 1);
    dl_policy_committed(p, 1, 1, 1606250 * US);
    /* tau 2 (a reload): cap = q + 178.125 ms, learner 1 (1 step behind at
     * its next push, 1 s after learner 0's) is beyond it: not waited for */
    dl_policy_cfg c2 = c;
    c2.tau_steps = 2;
    CHECK_EQ(dl_policy_reconfigure(p, &c2), 0);
    c2.H = 32;
    CHECK_EQ(dl_policy_reconfigure(p, &c2), DL_EINVAL);
    c2 = c, c2.tau_steps = 0;
    CHECK_EQ(dl_policy_cfg_check(&c2, NULL, 0), DL_EINVAL);
    c2 = c, c2.H = -1;
    CHECK_EQ(dl_policy_cfg_check(&c2, NULL, 0), DL_EINVAL);
    push(p, 1, 1, 0, 16, 16 * 256, 1700 * MS, 2); /* learner 1 late for round 1 (no report): alone */
    r = close_one(p, 1700 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE);
    CHECK_EQ(r.n, 1);
    dl_policy_committed(p, 1, 2, 1700 * MS);
    /* next period: learner 0 at step 80 at 6250 ms, learner 1 predicted at
     * 1700 ms + (80 - 16) x 100 ms = 8100 ms > cap 6428.125 ms */
    progress(p, 0, 80, 80 * 256, 12.8, 6250 * MS);
    progress(p, 1, 17, 17 * 256, 10.0, 1700 * MS); /* an old report (times never go back: treated as now) */
    push(p, 1, 0, 1, 64, 64 * 256, 6250 * MS, 3);
    r = close_one(p, 6250 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE);
    CHECK_EQ(r.cap_ns, 6250 * MS + 178125 * US);
    dl_policy_committed(p, 1, 3, 6250 * MS);
    dl_policy_close(&p);
}

/* (d2) ids that register and heartbeat (claiming progress) but never push
 * dilute the honest learner's share only for DL_POLICY_CONTRIB_PERIODS of the
 * fleet's push periods after they joined; a learner that stops pushing stops
 * counting the same way. */
static void test_silent_ids(void)
{
    printf("share: 64 ids that heartbeat but never push stop diluting after %d periods\n", DL_POLICY_CONTRIB_PERIODS);
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 1, c.H = 64, c.tau_steps = 4, c.grace_cap_ns = 5000 * MS, c.sfn = DL_POLICY_SFN_CONST;
    dl_policy *p = mk(&c, 1);
    for (uint32_t i = 0; i <= 64; i++) join(p, i, 0);
    const int64_t period = 6400 * MS; /* 64 steps at 10 steps/s */
    double share[8];
    for (int k = 0; k < 8; k++) {
        int64_t t = (k + 1) * period;
        for (uint32_t i = 0; i <= 64; i++) progress(p, i, 64 * (k + 1), 64 * (k + 1) * 256, 10.0, t);
        push(p, 0, 0, dl_policy_version(p, 0), 64, 64 * 256, t, (uint64_t)k + 1);
        int64_t d = dl_policy_next_deadline(p);
        CHECK(d < t + period, "round %d closes within its period", k);
        dl_policy_round r = close_one(p, d);
        share[k] = r.share;
        dl_policy_committed(p, 0, r.version + 1, d);
    }
    printf("  shares of the honest learner's merges, period by period: %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.4f\n",
           share[0], share[1], share[2], share[3], share[4], share[5], share[6], share[7]);
    CHECK_REL(share[0], 1.0 / 65); /* within the bound: a joiner counts until it could have pushed */
    for (int k = DL_POLICY_CONTRIB_PERIODS; k < 8; k++) CHECK_REL(share[k], 1.0);
    /* an honest second learner counts while it pushes, and stops counting once it has been silent for the bound */
    join(p, 100, 9 * period);
    progress(p, 100, 64, 64 * 256, 10.0, 9 * period);
    push(p, 0, 100, dl_policy_version(p, 0), 64, 64 * 256, 9 * period, 100);
    push(p, 0, 0, dl_policy_version(p, 0), 64, 64 * 256, 9 * period, 101);
    dl_policy_round r = close_one(p, dl_policy_next_deadline(p));
    CHECK_REL(r.share, 1.0); /* both contributed: 2 of 2 */
    dl_policy_committed(p, 0, r.version + 1, 9 * period + 1);
    push(p, 0, 0, dl_policy_version(p, 0), 64, 64 * 256, 10 * period, 102);
    r = close_one(p, dl_policy_next_deadline(p));
    CHECK_REL(r.share, 0.5); /* learner 100's push of this period is still to come */
    dl_policy_committed(p, 0, r.version + 1, 10 * period + 1);
    push(p, 0, 0, dl_policy_version(p, 0), 64, 64 * 256, 13 * period, 103);
    r = close_one(p, dl_policy_next_deadline(p));
    CHECK_REL(r.share, 1.0); /* silent for more than the bound: no longer expected */
    dl_policy_committed(p, 0, r.version + 1, 13 * period + 1);
    dl_policy_close(&p);
}

/* (d) share per fragment from pooled pushes only. */
static void test_share(void)
{
    printf("share: expected tokens of a full period from pooled pushes, staleness in single rounds\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 1, c.H = 64, c.tau_steps = 4, c.grace_cap_ns = 5000 * MS, c.sfn = DL_POLICY_SFN_CONST;
    c.max_staleness = 1;
    dl_policy *p = mk(&c, 1);
    const int64_t tps[4] = {100, 200, 300, 400};
    for (uint32_t i = 0; i < 4; i++) join(p, i, 0);
    /* learners 0, 1 at step 64; 2, 3 at step 40 (their push of the period
     * is 2.4 s away, beyond the cap): the period lands in two rounds */
    for (uint32_t i = 0; i < 4; i++) progress(p, i, i < 2 ? 64 : 40, (i < 2 ? 64 : 40) * tps[i], 10.0, 0);
    push(p, 0, 0, 0, 64, 64 * tps[0], 0, 1);
    push(p, 0, 1, 0, 64, 64 * tps[1], 1 * MS, 2);
    dl_policy_round r = close_one(p, 1 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE);
    CHECK_EQ(r.n, 2);
    /* 2, 3 by their heartbeat tokens per step (300, 400), capped at the
     * largest pooled rate (200): a heartbeat alone proves no batch */
    CHECK_REL(r.expected_tokens, 64.0 * (100 + 200 + 200 + 200));
    CHECK_REL(r.share, 19200.0 / 44800.0);
    double sum = 19200.0 / 64000.0; /* that round at the rates proven below: the period sums to 1 */
    dl_policy_committed(p, 0, 1, 1 * MS);
    for (uint32_t i = 2; i < 4; i++) progress(p, i, 64, 64 * tps[i], 10.0, 2400 * MS);
    push(p, 0, 2, 0, 64, 64 * tps[2], 2400 * MS, 3); /* staleness 1 onto version 1: s = 1 (const) */
    push(p, 0, 3, 0, 64, 64 * tps[3], 2401 * MS, 4);
    r = close_one(p, 2401 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_PREDICTED_NONE); /* 0, 1: next push a period away */
    CHECK_EQ(r.n, 2);
    CHECK_REL(r.share, 0.7);
    sum += r.share;
    CHECK_REL(sum, 1.0);
    dl_policy_committed(p, 0, 2, 2401 * MS);
    /* a rejected and a dropped push with other tokens per step do not move
     * the expected tokens (only POOLED pushes set a learner's rate) */
    CHECK_EQ(push(p, 0, 0, 5, 64, 64 * 99999, 2500 * MS, 5).decision, DL_POLICY_REJECTED); /* future base */
    CHECK_EQ(push(p, 0, 1, 0, 1, 99999, 2501 * MS, 6).decision, DL_POLICY_DROPPED_STALE);  /* staleness 2 > 1 */
    push(p, 0, 0, 2, 64, 64 * tps[0], 6400 * MS, 7);
    /* learner 1 (reported step 64 at 0 ms) is predicted at step 128 = 6400 ms */
    CHECK_EQ(dl_policy_next_deadline(p), 6500 * MS);
    r = close_one(p, 6500 * MS);
    CHECK_EQ(r.reason, DL_POLICY_CLOSE_GRACE_EXPIRED);
    CHECK_REL(r.expected_tokens, 64.0 * 1000);
    CHECK_REL(r.share, 0.1);
    dl_policy_committed(p, 0, 3, 6500 * MS);
    /* a learner without a pooled push or a report counts at the others' mean */
    join(p, 9, 6500 * MS);
    push(p, 0, 1, 3, 64, 64 * tps[1], 6600 * MS, 8);
    r = close_one(p, 6600 * MS);
    CHECK_REL(r.expected_tokens, 64.0 * 1250);
    CHECK_REL(r.share, 200.0 / 1250);
    dl_policy_committed(p, 0, 4, 6600 * MS);
    dl_policy_close(&p);

    /* a single stale contribution moves the model by s(staleness) x its fraction */
    c.sfn = DL_POLICY_SFN_POLY, c.sfn_a = 0.5, c.max_staleness = 8;
    p = mk(&c, 1);
    for (uint32_t i = 0; i < 4; i++) join(p, i, 0), progress(p, i, 10, 10 * 100, 10.0, 0);
    dl_policy_set_version(p, 0, 3);
    push(p, 0, 0, 0, 64, 64 * 100, 0, 1);
    r = close_one(p, 0);
    CHECK_EQ(r.n, 1);
    CHECK_EQ(r.contribs[0].staleness, 3);
    CHECK_REL(r.contribs[0].weight / r.weight_sum, 1.0); /* weights stay normalised in a round */
    CHECK_REL(r.share, 0.25 * 0.5);                      /* (1 + 3)^-0.5 of a quarter */
    dl_policy_committed(p, 0, 4, 0);
    dl_policy_close(&p);

    /* H unknown: expected = the live learners' latest pooled tokens of the fragment */
    dl_policy_cfg_default(&c);
    c.sfn = DL_POLICY_SFN_CONST;
    p = mk(&c, 2);
    join(p, 0, 0), join(p, 1, 0);
    progress(p, 0, 8, 800, 10.0, 0); /* no effect while H is unknown */
    progress(p, 1, 8, 9999, 10.0, 0);
    CHECK_EQ(dl_policy_step_ns(p), 0);
    push(p, 0, 0, 0, 8, 800, 0, 1);
    r = close_one(p, 0);
    CHECK_REL(r.share, 1.0);
    dl_policy_committed(p, 0, 1, 0);
    push(p, 0, 1, 1, 8, 2400, 1 * MS, 2);
    r = close_one(p, 1 * MS);
    CHECK_REL(r.expected_tokens, 3200);
    CHECK_REL(r.share, 0.75);
    dl_policy_committed(p, 0, 2, 1 * MS);
    push(p, 1, 0, 0, 8, 800, 2 * MS, 3); /* fragment 1 knows only learner 0's push */
    r = close_one(p, 2 * MS);
    CHECK_REL(r.share, 1.0);
    dl_policy_committed(p, 1, 1, 2 * MS);
    dl_policy_close(&p);
}

/* ------------------------------------------------------------------ straggler simulation */

#define SIM_T (100 * MS)   /* fast learners push each fragment every 100 ms */
#define SIM_N 200          /* periods */
#define SIM_P 2
#define SIM_WARM (10 * SIM_T) /* compare rounds closed after the statistics filled */
#define SIM_SLOW_OFF (25 * MS)

typedef struct {
    int64_t t;
    uint32_t id;
    int f;
} sim_ev;

typedef struct {
    int fragment, has_slow;
    int64_t closed_ns;
} sim_fast_round;

typedef struct {
    int merged[4], pushes[4], replaced_by[4];
    int folded[4], owed_made[4]; /* scheduled pushes held (hold rule) and folded into an owed one; owed ones made */
    int replaced_after_warm; /* replacements of pushes made after SIM_WARM */
    int rounds;
    sim_fast_round fast[SIM_P * SIM_N * 2]; /* fast-containing rounds closed after SIM_WARM */
    int n_fast;
    int slow_stale_min, slow_stale_max, slow_alone;
    uint64_t replaced, dropped;
    uint64_t close[5];
} sim_res;

static int ev_cmp(const void *a, const void *b)
{
    const sim_ev *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

/* The learners' side of the simulation: the version each adopted last, and
 * the hold rule (learner/node.h): a push due while the learner's previous
 * push of the fragment is pooled is not made but owed, and made (with the
 * progress of both periods) as soon as the pooled one is merged. */
typedef struct {
    uint64_t adopted[4][SIM_P];
    int pooled[4][SIM_P], owed[4][SIM_P];
} sim_learners;

static void sim_round(dl_policy *p, const dl_policy_round *r, sim_learners *L, sim_res *o)
{
    int fast = 0, slow = 0;
    for (int i = 0; i < r->n; i++) {
        const dl_policy_contrib *ct = &r->contribs[i];
        o->merged[ct->learner]++;
        L->adopted[ct->learner][r->fragment] = r->version + 1; /* contributors adopt the update */
        L->pooled[ct->learner][r->fragment] = 0;
        if (ct->learner < 3) {
            fast = 1;
        } else {
            slow = 1;
            if (r->closed_ns >= SIM_WARM) {
                if (ct->staleness < o->slow_stale_min) o->slow_stale_min = (int)ct->staleness;
                if (ct->staleness > o->slow_stale_max) o->slow_stale_max = (int)ct->staleness;
            }
        }
    }
    o->rounds++;
    if (fast && r->closed_ns >= SIM_WARM) o->fast[o->n_fast++] = (sim_fast_round){r->fragment, slow, r->closed_ns};
    if (slow && !fast && r->closed_ns >= SIM_WARM) o->slow_alone++;
    dl_policy_committed(p, r->fragment, r->version + 1, r->closed_ns);
    for (int i = 0; i < r->n; i++) {
        uint32_t id = r->contribs[i].learner;
        if (!L->owed[id][r->fragment]) continue;
        L->owed[id][r->fragment] = 0;
        dl_policy_verdict v;
        CHECK_EQ(dl_policy_push(p, r->fragment, id, L->adopted[id][r->fragment], 16, 8192, r->closed_ns, 1u << 30, &v),
                 0);
        CHECK_EQ(v.decision, DL_POLICY_POOLED);
        L->pooled[id][r->fragment] = 1;
        o->owed_made[id]++;
    }
}

/* 3 fast learners (ids 0..2: period T, offsets 0/1/2 ms, +-0.2 ms jitter) and
 * optionally a straggler at 1/4 speed (id 3: period 4T, offset 25 ms, inside the
 * grace cap of 0.3*T after the fast learners' quorum). Fragment f is pushed
 * half a period after fragment f-1. Every push is relative to the version the
 * learner adopted last (contributors adopt the merge of their push); every
 * round is committed as soon as it closes. */
static void sim(int with_straggler, int K, sim_res *o)
{
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = K, c.gamma = 0.3, c.grace_cap_ns = 1000 * MS, c.mad_k = 3, c.max_staleness = 8;
    c.sfn = DL_POLICY_SFN_POLY, c.sfn_a = 0.5;
    dl_policy *p = mk(&c, SIM_P);
    memset(o, 0, sizeof *o);
    o->slow_stale_min = 1 << 30;
    static sim_ev ev[4 * SIM_N * SIM_P];
    int ne = 0;
    for (uint32_t i = 0; i < 3; i++) {
        dl_rng rng;
        dl_rng_seed(&rng, 100 + i);
        for (int n = 0; n < SIM_N; n++)
            for (int f = 0; f < SIM_P; f++) {
                int64_t jit = (int64_t)((dl_rng_uniform(&rng) - 0.5f) * 400.0f) * US;
                ev[ne++] = (sim_ev){n * SIM_T + f * SIM_T / 2 + (int64_t)i * MS + jit, i, f};
            }
    }
    if (with_straggler) {
        dl_rng rng;
        dl_rng_seed(&rng, 999);
        for (int m = 0; m < SIM_N / 4; m++)
            for (int f = 0; f < SIM_P; f++) {
                int64_t jit = (int64_t)((dl_rng_uniform(&rng) - 0.5f) * 400.0f) * US;
                ev[ne++] = (sim_ev){m * 4 * SIM_T + SIM_SLOW_OFF + f * SIM_T / 2 + jit, 3, f};
            }
    }
    qsort(ev, (size_t)ne, sizeof *ev, ev_cmp);
    for (uint32_t i = 0; i < (with_straggler ? 4u : 3u); i++) join(p, i, -1000 * MS);

    static sim_learners L;
    memset(&L, 0, sizeof L);
    dl_policy_round r;
    for (int e = 0; e < ne; e++) {
        int64_t t = ev[e].t;
        while (dl_policy_next_deadline(p) < t) {
            int64_t d = dl_policy_next_deadline(p);
            CHECK_EQ(dl_policy_poll(p, d, &r), 1);
            sim_round(p, &r, &L, o);
        }
        uint32_t id = ev[e].id;
        int f = ev[e].f;
        o->pushes[id]++;
        if (L.pooled[id][f]) { /* held: its progress goes with the owed push */
            o->folded[id]++;
            L.owed[id][f] = 1;
            continue;
        }
        dl_policy_verdict v;
        CHECK_EQ(dl_policy_push(p, f, id, L.adopted[id][f], 8, 4096, t, (uint64_t)e, &v), 0);
        CHECK_EQ(v.decision, DL_POLICY_POOLED);
        L.pooled[id][f] = 1;
        o->replaced_by[id] += v.replaced;
        if (v.replaced && t >= SIM_WARM) o->replaced_after_warm++;
        while (dl_policy_poll(p, t, &r)) sim_round(p, &r, &L, o);
    }
    while (dl_policy_next_deadline(p) != DL_POLICY_NEVER) {
        int64_t d = dl_policy_next_deadline(p);
        CHECK_EQ(dl_policy_poll(p, d, &r), 1);
        sim_round(p, &r, &L, o);
    }
    dl_policy_stats s;
    dl_policy_get_stats(p, &s);
    o->replaced = s.replaced;
    o->dropped = s.dropped_stale;
    memcpy(o->close, s.close, sizeof o->close);
    char name[32];
    snprintf(name, sizeof name, "sim K=%d %s", K, with_straggler ? "+slow" : "");
    print_stats(name, p);
    dl_policy_close(&p);
}

static void test_straggler(void)
{
    printf("straggler at 1/4 speed among 3 fast learners, %d periods x %d fragments\n", SIM_N, SIM_P);
    static sim_res base, slow;
    for (int K = 1; K <= 2; K++) {
        sim(0, K, &base);
        sim(1, K, &slow);
        double secs = (double)(SIM_N * SIM_T) / 1e9;
        int joined = 0;
        for (int k = 0; k < slow.n_fast; k++) joined += slow.fast[k].has_slow;
        printf("  K=%d: fast merges/s %.2f (no straggler) vs %.2f (straggler); fast rounds after warm-up %d vs %d;"
               " straggler merged %d/%d (%d into fast rounds after warm-up), staleness %d..%d\n",
               K, base.merged[0] / secs, slow.merged[0] / secs, base.n_fast, slow.n_fast, slow.merged[3],
               slow.pushes[3], joined, slow.slow_stale_min, slow.slow_stale_max);
        /* every push made is merged once; a scheduled push held by the hold
         * rule (its learner's previous one still pooled: during warm-up only)
         * is folded into the owed push made when that one merged. Nothing is
         * replaced: a learner never has two pushes of a fragment pooled. */
        for (int i = 0; i < 3; i++) {
            /* with K = 2 a learner's last push may wait for a quorum that never comes (the end of the run) */
            int left_b = base.pushes[i] - base.folded[i] + base.owed_made[i] - base.merged[i];
            int left_s = slow.pushes[i] - slow.folded[i] + slow.owed_made[i] - slow.merged[i];
            CHECK_EQ(base.pushes[i], SIM_N * SIM_P);
            CHECK(left_b >= 0 && left_b <= (K - 1) * SIM_P && left_s >= 0 && left_s <= (K - 1) * SIM_P,
                  "learner %d: %d / %d pushes left unmerged", i, left_b, left_s);
            CHECK(slow.folded[i] <= 2 * SIM_P && base.folded[i] <= 2 * SIM_P, "learner %d folded %d / %d", i,
                  slow.folded[i], base.folded[i]);
            CHECK_EQ(base.replaced_by[i] + slow.replaced_by[i], 0);
        }
        CHECK_EQ(base.replaced_after_warm, 0);
        CHECK_EQ(slow.replaced_after_warm, 0);
        /* Same number of fast rounds per unit of simulated time, closing at the
         * same times; a round is later only when the straggler was predicted
         * inside the window and really came (then by < the 30 ms cap). Nobody
         * waited in vain: no grace-expired or cap closes. (K = 2: a learner
         * whose first push missed its round in warm-up -- no predictions yet --
         * stays a round behind: its next push is pooled alone, the round that
         * takes it closes before its fresher push, which the hold rule keeps
         * back; so the close times of the two runs are compared with K = 1.) */
        CHECK_EQ(slow.n_fast, base.n_fast);
        CHECK(base.n_fast >= SIM_P * (SIM_N - 11), "n_fast %lld", (long long)base.n_fast);
        int bad_time = 0, n = slow.n_fast < base.n_fast ? slow.n_fast : base.n_fast;
        for (int k = 0; k < n; k++) {
            const sim_fast_round *x = &slow.fast[k], *y = &base.fast[k];
            int64_t dt = x->closed_ns - y->closed_ns;
            if (x->fragment != y->fragment || (!x->has_slow && dt != 0) || (x->has_slow && (dt <= 0 || dt > 30 * MS)))
                if (bad_time++ < 5)
                    fprintf(stderr, "  round %d: frag %d/%d slow=%d closed %.3f ms vs %.3f ms\n", k, x->fragment,
                            y->fragment, x->has_slow, (double)x->closed_ns / MS, (double)y->closed_ns / MS);
        }
        if (K == 1) CHECK_EQ(bad_time, 0);
        CHECK_EQ(base.close[DL_POLICY_CLOSE_GRACE_EXPIRED] + base.close[DL_POLICY_CLOSE_CAP], 0);
        CHECK_EQ(slow.close[DL_POLICY_CLOSE_GRACE_EXPIRED] + slow.close[DL_POLICY_CLOSE_CAP], 0);
        /* the straggler's pushes are all merged, with staleness 3 (three fast
         * merges of the fragment while it computed), into the fast rounds */
        CHECK_EQ(slow.pushes[3], SIM_N / 4 * SIM_P);
        CHECK_EQ(slow.merged[3], slow.pushes[3]);
        CHECK_EQ(slow.slow_stale_min, 3);
        CHECK_EQ(slow.slow_stale_max, 3);
        CHECK_EQ(slow.slow_alone, 0);
        CHECK(joined >= slow.pushes[3] - 2 * SIM_P * 3, "joined %lld pushes %lld", (long long)joined, (long long)slow.pushes[3]);
        CHECK_EQ(slow.replaced_by[3], 0);
        CHECK_EQ(slow.dropped, 0);
    }
}

/* Heartbeats are settled lazily (policy.c "unsettled"): a policy that is
 * read after every heartbeat (the eager recompute, as before) and one that
 * takes runs of heartbeats unread end every run in the same state: the same
 * deadlines, fleet step time, and rounds (reason, deadline, quorum, cap,
 * missing learners) with pushes, leaves and commits between the runs. 32
 * learners at drifting rates over 4 fragments, decoupled with a quorum. */
static void test_lazy_heartbeats(void)
{
    printf("lazy heartbeats: the same rounds as a recompute at every heartbeat\n");
    dl_policy_cfg c;
    dl_policy_cfg_default(&c);
    c.quorum = 3, c.H = 16, c.tau_steps = 6, c.grace_cap_ns = 4000 * MS;
    enum { N = 32, P = 4 };
    dl_policy *eager = mk(&c, P), *lazy = mk(&c, P);
    dl_policy *both[2] = {eager, lazy};
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < N; i++) join(both[k], i, 0);
    uint64_t x = 12345;
    int64_t t = 0;
    int rounds = 0, runs = 0, same = 1;
    int64_t step[N] = {0};
    int gone[N] = {0};
    for (int it = 0; it < 400; it++) {
        /* a run of heartbeats */
        int len = 1 + (int)(x % 7);
        for (int h = 0; h < len; h++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t id = (uint32_t)(x >> 33) % N;
            t += (int64_t)((x >> 20) % 40) * MS;
            if (gone[id]) continue;
            step[id] += 1 + (int64_t)((x >> 40) % 3);
            double rate = 5.0 + (double)((x >> 45) % 100) / 10.0;
            for (int k = 0; k < 2; k++) {
                progress(both[k], id, step[id], step[id] * 256, rate, t);
                if (k == 0) dl_policy_recompute(eager); /* every heartbeat's full recompute */
            }
        }
        runs++;
        same &= dl_policy_next_deadline(eager) == dl_policy_next_deadline(lazy);
        same &= dl_policy_step_ns(eager) == dl_policy_step_ns(lazy);
        /* then a push, sometimes a leave, and whatever rounds are due */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t id = (uint32_t)(x >> 33) % N;
        int f = (int)((x >> 13) % P);
        t += MS;
        if (gone[id]) continue;
        dl_policy_verdict v[2];
        for (int k = 0; k < 2; k++) v[k] = push(both[k], f, id, dl_policy_version(both[k], f), 8, 2048, t, (uint64_t)it);
        same &= v[0].decision == v[1].decision;
        uint32_t bye = (uint32_t)((x >> 7) % N);
        if (it % 97 == 96 && bye != id) {
            for (int k = 0; k < 2; k++) dl_policy_learner_leave(both[k], bye, t, DL_POLICY_LEAVE_BYE);
            gone[bye] = 1;
        }
        for (;;) {
            dl_policy_round r[2];
            int got[2];
            for (int k = 0; k < 2; k++) got[k] = dl_policy_poll(both[k], t, &r[k]);
            same &= got[0] == got[1];
            if (!got[0] || !got[1]) break;
            same &= r[0].fragment == r[1].fragment && r[0].n == r[1].n && r[0].reason == r[1].reason &&
                    r[0].deadline_ns == r[1].deadline_ns && r[0].quorum_ns == r[1].quorum_ns &&
                    r[0].cap_ns == r[1].cap_ns && r[0].n_missing == r[1].n_missing;
            rounds++;
            for (int k = 0; k < 2; k++) dl_policy_committed(both[k], r[k].fragment, r[k].version + 1, t);
        }
        if (!same) break;
    }
    CHECK(same, "lazy and eager policies agree (diverged after %d runs)", runs);
    CHECK(rounds > 20, "%d rounds closed", rounds);
    printf("  %d runs of heartbeats, %d rounds: identical\n", runs, rounds);
    dl_policy_close(&eager);
    dl_policy_close(&lazy);
}

int main(void)
{
    test_lazy_heartbeats();
    test_replace_other_base();
    test_grace_contributor();
    test_final_flush();
    test_final_pending();
    test_share_after_bye();
    test_config();
    test_weights();
    test_quorum();
    test_grace();
    test_stale_reject();
    test_replace();
    test_sync();
    test_capacity();
    test_schedule_gather();
    test_schedule_predict();
    test_share();
    test_silent_ids();
    test_straggler();
    return CHECK_DONE("test_policy");
}
