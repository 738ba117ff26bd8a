/* The push guards (synchronizer/guard.c): each rule accepts a realistic push
 * and refuses the hostile one with its reason. */
#include "synchronizer/guard.h"

#include "core/hash.h"

#include "core/err.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tests/check.h"

#define HAS(s, sub) CHECK(strstr((s), (sub)) != NULL, "\"%s\" lacks \"%s\"", (s), (sub))

static dl_guard *open_guard(const dl_guard_cfg *c, int P, int L)
{
    dl_guard *g = NULL;
    int rc = dl_guard_open(c, P, L, &g);
    REQUIRE(rc == 0 && g, "open: %s", dl_errmsg());
    return g;
}

static void test_cfg(void)
{
    dl_guard_cfg d = dl_guard_cfg_default();
    CHECK_EQ(dl_guard_cfg_check(&d), 0);
    CHECK(d.norm_k == 10 && d.norm_window == 32 && d.norm_min_history == 1 && d.norm_param_ratio == 10 &&
              d.norm_action == DL_GUARD_REJECT && d.param_abs_max == 1000 && d.max_step_rate == 10000 &&
              d.step_slack == 64 && d.max_batch == 65536 && d.max_tokens_per_step == 1ull << 24,
          "defaults");
    struct {
        const char *field;
        dl_guard_cfg c;
    } bad[14];
    int nb = 0;
#define BAD(f, v) (bad[nb].field = #f, bad[nb].c = d, bad[nb].c.f = (v), nb++)
    BAD(norm_k, -1.0);
    BAD(norm_k, 0.5);
    BAD(norm_k, NAN);
    BAD(norm_window, 0);
    BAD(norm_window, DL_GUARD_MAX_WINDOW + 1);
    BAD(norm_min_history, 0);
    BAD(norm_min_history, 33); /* > norm_window 32 */
    BAD(norm_param_ratio, -2.0);
    BAD(norm_action, (dl_guard_action)7);
    BAD(param_abs_max, INFINITY);
    BAD(max_step_rate, 0.0);
    BAD(max_batch, 0u);
    BAD(max_tokens_per_step, 0u);
    BAD(max_tokens_per_step, (1ull << 40) + 1);
#undef BAD
    for (int i = 0; i < nb; i++) {
        int rc = dl_guard_cfg_check(&bad[i].c);
        CHECK(rc == DL_EINVAL, "%s: rc %d", bad[i].field, rc);
        HAS(dl_errmsg(), bad[i].field);
    }
    dl_guard_cfg off = d;
    off.norm_k = 0;
    off.norm_param_ratio = 0;
    off.param_abs_max = 0;
    CHECK_EQ(dl_guard_cfg_check(&off), 0);
    dl_guard *g = NULL;
    CHECK(dl_guard_open(&bad[0].c, 1, 1, &g) == DL_EINVAL && !g, "open refuses a bad config");
    CHECK(dl_guard_open(&d, 0, 1, &g) == DL_EINVAL && !g, "open refuses 0 fragments");
    CHECK(dl_guard_open(&d, 1, DL_GUARD_MAX_LEARNERS + 1, &g) == DL_EINVAL && !g, "open refuses too many learners");

    dl_guard_action a;
    CHECK(dl_guard_action_parse("clip", &a) == 0 && a == DL_GUARD_CLIP, "parse clip");
    CHECK(dl_guard_action_parse("reject", &a) == 0 && a == DL_GUARD_REJECT, "parse reject");
    CHECK(dl_guard_action_parse("drop", &a) == DL_EINVAL, "parse refuses drop");
    CHECK(dl_guard_action_parse(NULL, &a) == DL_EINVAL, "parse refuses NULL");
    CHECK_STR(dl_guard_action_name(DL_GUARD_CLIP), "clip");
}

static void test_counters(void)
{
    dl_guard_cfg c = dl_guard_cfg_default();
    c.max_step_rate = 1000; /* the figures below */
    dl_guard *g = open_guard(&c, 4, 8);
    char why[256];

    /* realistic: 100 steps of batch 16 x 64 tokens in 2 s */
    CHECK_EQ(dl_guard_counters(g, 16, 64, 100, 100 * 16 * 64, 2.0, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters(g, 16, 64, 100, 100 * 16 * 64 - 5, 2.0, why, sizeof why), 0);
    /* tokens one over the bound */
    CHECK_EQ(dl_guard_counters(g, 16, 64, 100, 100 * 16 * 64 + 1, 2.0, why, sizeof why), DL_ERANGE);
    /* 2^62 tokens claimed for 4 steps */
    why[0] = 0;
    CHECK_EQ(dl_guard_counters(g, 16, 64, 4, (uint64_t)1 << 62, 2.0, why, sizeof why), DL_ERANGE);
    CHECK_STR(why, "tokens 4611686018427387904 > steps 4 x batch 16 x seq_len 64 = 4096");
    CHECK_STR(dl_errmsg(), why);
    /* no batch declared: max_batch bounds it */
    CHECK_EQ(dl_guard_counters(g, 0, 64, 4, 4ull * 65536 * 64, 2.0, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters(g, 0, 64, 4, 4ull * 65536 * 64 + 1, 2.0, why, sizeof why), DL_ERANGE);
    HAS(why, "max_batch");
    /* zero steps can claim no tokens */
    CHECK_EQ(dl_guard_counters(g, 16, 64, 0, 1, 2.0, why, sizeof why), DL_ERANGE);
    CHECK_EQ(dl_guard_counters(g, 16, 64, 0, 0, 2.0, why, sizeof why), 0);

    /* overflow-safe: steps x batch x seq_len well past 2^64 never wraps */
    uint64_t big = UINT64_MAX / 2; /* x 2^32 x 2^32 would wrap a 64-bit product to a small number */
    CHECK_EQ(dl_guard_counters(g, UINT32_MAX, UINT32_MAX, big, UINT64_MAX, INFINITY, why, sizeof why), 0);
    /* batch x seq_len = 2^32 exactly; steps 2^32 - 1: product 2^64 - 2^32 < UINT64_MAX */
    dl_guard_cfg cb = c;
    cb.max_batch = UINT32_MAX;
    dl_guard *gb = open_guard(&cb, 1, 1);
    uint64_t s32 = ((uint64_t)1 << 32) - 1, prod = s32 << 32;
    CHECK_EQ(dl_guard_counters(gb, 65536, 65536, s32, prod, INFINITY, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters(gb, 65536, 65536, s32, prod + 1, INFINITY, why, sizeof why), DL_ERANGE);
    CHECK_STR(why, "tokens 18446744069414584321 > steps 4294967295 x batch 65536 x seq_len 65536 = "
                   "18446744069414584320");
    /* steps 2^32: the product is exactly 2^64, one past UINT64_MAX: every token count fits */
    CHECK_EQ(dl_guard_counters(gb, 65536, 65536, s32 + 1, UINT64_MAX, INFINITY, why, sizeof why), 0);
    /* a 64-bit product would wrap 2^33 x 2^32 x 2^32 to 0 and refuse everything */
    CHECK_EQ(dl_guard_counters(gb, UINT32_MAX, UINT32_MAX, (uint64_t)1 << 33, 12345, INFINITY, why, sizeof why), 0);
    dl_guard_close(&gb);

    /* step rate: 1000 steps/s, slack 64 */
    CHECK_EQ(dl_guard_counters(g, 1, 1, 1064, 1000, 1.0, why, sizeof why), 0);
    why[0] = 0;
    CHECK_EQ(dl_guard_counters(g, 1, 1, 1000000, 1000, 1.0, why, sizeof why), DL_ERANGE);
    CHECK_STR(why, "steps 1000000 > 1064 plausible in 1 s (max_step_rate 1000/s + step_slack 64)");
    CHECK_EQ(dl_guard_counters(g, 1, 1, 1065, 1000, 1.0, why, sizeof why), DL_ERANGE);
    /* elapsed 0: only the slack; ceil rounds a fraction of a step up */
    CHECK_EQ(dl_guard_counters(g, 1, 1, 64, 64, 0.0, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters(g, 1, 1, 65, 65, 0.0, why, sizeof why), DL_ERANGE);
    CHECK_EQ(dl_guard_counters(g, 1, 1, 65, 65, 0.0001, why, sizeof why), 0);
    /* saturating: huge elapsed and slack do not wrap */
    dl_guard_cfg cs = c;
    cs.step_slack = UINT64_MAX - 1;
    CHECK_EQ(dl_guard_reconfigure(g, &cs), 0);
    CHECK_EQ(dl_guard_counters(g, 1, 1, UINT64_MAX, UINT64_MAX, 1e30, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters(g, 1, 1, UINT64_MAX, UINT64_MAX, 0.5, why, sizeof why), 0);
    CHECK_EQ(dl_guard_reconfigure(g, &c), 0);
    /* NULL why: still refused, reason in dl_errmsg() */
    CHECK_EQ(dl_guard_counters(g, 1, 1, 1000000, 1000, 1.0, NULL, 0), DL_ERANGE);
    HAS(dl_errmsg(), "steps 1000000 > 1064");

    /* batch at Hello */
    CHECK_EQ(dl_guard_batch(g, 0, why, sizeof why), 0);
    CHECK_EQ(dl_guard_batch(g, 65536, why, sizeof why), 0);
    CHECK_EQ(dl_guard_batch(g, 65537, why, sizeof why), DL_ERANGE);
    CHECK_STR(why, "batch 65537 > max_batch 65536");

    /* manifest learners: a bound of tokens per step they claim at Hello */
    uint64_t tps = 0;
    CHECK_EQ(dl_guard_tokens_bound(g, 0, &tps, why, sizeof why), 0);
    CHECK_EQ(tps, 1ull << 24); /* none claimed: the run's cap */
    CHECK_EQ(dl_guard_tokens_bound(g, 4096, &tps, why, sizeof why), 0);
    CHECK_EQ(tps, 4096);
    CHECK_EQ(dl_guard_tokens_bound(g, (1ull << 24) + 1, &tps, why, sizeof why), DL_ERANGE);
    CHECK_STR(why, "max_tokens_per_step 16777217 > the run's max_tokens_per_step 16777216");
    CHECK_EQ(dl_guard_counters_tps(g, 4096, 2, 8192, 1.0, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters_tps(g, 4096, 2, 8193, 1.0, why, sizeof why), DL_ERANGE);
    CHECK_STR(why, "tokens 8193 > steps 2 x max_tokens_per_step 4096 = 8192");
    CHECK_EQ(dl_guard_counters_tps(g, 1ull << 40, UINT64_MAX, UINT64_MAX, INFINITY, why, sizeof why), 0);
    CHECK_EQ(dl_guard_counters_tps(g, 1, 1000000, 1000, 1.0, why, sizeof why), DL_ERANGE);
    HAS(why, "steps 1000000 > 1064");
    dl_guard_close(&g);
}

static void test_norm(void)
{
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)((i % 7) - 3) * 0.5f;
    double ref = 0;
    for (int i = 0; i < 1000; i++) ref += (double)x[i] * x[i];
    int fin = -1;
    CHECK_NEAR(dl_guard_norm(x, 1000, &fin), sqrt(ref), 1e-9 * sqrt(ref));
    CHECK_EQ(fin, 1);
    CHECK(dl_guard_norm(x, 0, &fin) == 0.0 && fin == 1, "empty delta");
    /* 1e38 everywhere: float squares overflow, the double sum does not */
    for (int i = 0; i < 1000; i++) x[i] = 1e38f;
    double n38 = dl_guard_norm(x, 1000, &fin);
    CHECK(fin == 1 && isfinite(n38), "1e38 delta is finite in double: %g", n38);
    CHECK_NEAR(n38 / (1e38 * sqrt(1000.0)), 1.0, 1e-6);
    x[500] = INFINITY;
    dl_guard_norm(x, 1000, &fin);
    CHECK_EQ(fin, 0);
    x[500] = -INFINITY;
    dl_guard_norm(x, 1000, &fin);
    CHECK_EQ(fin, 0);
    x[500] = NAN;
    double nn = dl_guard_norm(x, 1000, &fin);
    CHECK(fin == 0 && !isfinite(nn), "nan delta: finite %d norm %g", fin, nn);
    /* large fragment through the threaded path, with one nan at the end */
    size_t n = (size_t)1 << 20;
    float *big = dl_xmalloc(n * sizeof *big);
    for (size_t i = 0; i < n; i++) big[i] = 1.0f;
    double nb = dl_guard_norm(big, n, &fin);
    CHECK(fin == 1 && nb == 1024.0, "1M ones: norm %g", nb);
    big[n - 1] = NAN;
    dl_guard_norm(big, n, &fin);
    CHECK_EQ(fin, 0);
    free(big);
}

static void test_value(void)
{
    dl_guard_cfg c = dl_guard_cfg_default();
    c.norm_min_history = 3; /* the arming rule below */
    dl_guard *g = open_guard(&c, 3, 4);
    char why[256];
    double sc = -1;
    int cnt = -1;

    /* no history: only the parameter-ratio bound (10 x 12.5 = 125) */
    CHECK(dl_guard_median(g, 0, &cnt) == 0.0 && cnt == 0, "empty history");
    CHECK_EQ(dl_guard_value(g, 0, 100.0, 1, 0.0, 12.5, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK(sc == 1.0, "ok scale %g", sc);
    /* a 1e38 delta of 1000 floats has norm ~3e39: far over the parameter ratio */
    CHECK_EQ(dl_guard_value(g, 0, 5e37, 1, 0.0, 12.5, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_STR(why, "norm 5e+37 > 10 x parameter norm 12.5");
    CHECK(sc == 0.0, "rejected scale %g", sc);
    CHECK_EQ(dl_guard_value(g, 0, INFINITY, 1, 0.0, 12.5, &sc, why, sizeof why), DL_GUARD_REJECTED);
    HAS(why, "not finite");
    CHECK_EQ(dl_guard_value(g, 0, NAN, 1, 0.0, 12.5, &sc, why, sizeof why), DL_GUARD_REJECTED);
    /* parameters all zero: the ratio bound is off, so only min_history protects */
    CHECK_EQ(dl_guard_value(g, 0, 1e30, 1, 0.0, 0.0, &sc, why, sizeof why), DL_GUARD_OK);

    /* min_history 3: two remembered norms do not arm the median rule */
    dl_guard_observe(g, 0, 0, 1.0, 1, 0.0);
    dl_guard_observe(g, 0, 1, 1.2, 1, 0.0);
    CHECK_EQ(dl_guard_value(g, 0, 100.0, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    dl_guard_observe(g, 0, 2, 1.1, 1, 0.0);
    CHECK_NEAR(dl_guard_median(g, 0, &cnt), 1.1, 1e-12);
    CHECK_EQ(cnt, 3);
    /* a realistic push (within 10 x 1.1) passes, 10^6 x median is refused */
    CHECK_EQ(dl_guard_value(g, 0, 1.5, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 10 * 1.1, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK); /* exactly the bound */
    CHECK_EQ(dl_guard_value(g, 0, 1.1e6, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_STR(why,
              "norm 1.1e+06 > 10 x median 1.1 of 3 learner(s)' latest pushes (per sqrt(step), x sqrt(1 steps))");
    /* other fragments keep their own history */
    CHECK_EQ(dl_guard_value(g, 1, 1.1e6, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    /* the tighter of the two bounds wins: parameter norm 0.5 -> bound 5 < 11 */
    CHECK_EQ(dl_guard_value(g, 0, 8.0, 1, 0.0, 0.5, &sc, why, sizeof why), DL_GUARD_REJECTED);
    HAS(why, "parameter norm 0.5");

    /* one learner is one vote, however often it pushes, and its norms are
     * remembered at most at the bound: a 4th learner pushing 1e6 ten times
     * leaves the median at (1.1 + 1.2) / 2 */
    for (int i = 0; i < 10; i++) dl_guard_observe(g, 0, 3, 1e6, 1, 0.0);
    CHECK_NEAR(dl_guard_median(g, 0, &cnt), 1.15, 1e-12);
    CHECK_EQ(cnt, 4); /* one record per learner */
    CHECK_EQ(dl_guard_value(g, 0, 1e6, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);

    /* clipping: the scale brings the delta exactly to the bound */
    dl_guard_cfg cc = c;
    cc.norm_action = DL_GUARD_CLIP;
    CHECK_EQ(dl_guard_reconfigure(g, &cc), 0);
    CHECK_NEAR(dl_guard_median(g, 0, &cnt), 1.15, 1e-12); /* history kept */
    CHECK_EQ(dl_guard_value(g, 0, 46.0, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_CLIPPED);
    CHECK_NEAR(sc, 0.25, 1e-12);
    HAS(why, "median 1.15");
    HAS(why, "clipped");
    CHECK_EQ(dl_guard_value(g, 0, 1e9, 1, 0.0, 0.5, &sc, why, sizeof why), DL_GUARD_CLIPPED); /* bound 5 < 11.5 */
    CHECK_NEAR(sc, 5.0 / 1e9, 1e-20);
    HAS(why, "parameter norm 0.5");
    /* non-finite is rejected even when clipping */
    CHECK_EQ(dl_guard_value(g, 0, INFINITY, 1, 0.0, 2.0, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_EQ(dl_guard_value(g, 0, 2.0, 1, 0.0, 2.0, &sc, NULL, 0), DL_GUARD_OK);

    /* the window: the newest norm_window records; a shrink keeps the newest */
    dl_guard_cfg cw = c;
    cw.norm_window = 4;
    cw.norm_min_history = 2;
    CHECK_EQ(dl_guard_reconfigure(g, &cw), 0); /* keeps the 4 records, one per learner */
    CHECK_EQ((dl_guard_median(g, 0, &cnt), cnt), 4);
    dl_guard_observe(g, 0, 0, 3.0, 1, 0.0);
    dl_guard_observe(g, 0, 1, 5.0, 1, 0.0);
    dl_guard_observe(g, 0, 0, 0.0, 1, 0.0); /* zero norms are not remembered */
    dl_guard_observe(g, 0, 2, 4.0, 1, 0.0); /* window: [3: x, 0: 3.0, 1: 5.0, 2: 4.0] */
    double m4 = dl_guard_median(g, 0, &cnt);
    CHECK_EQ(cnt, 4);
    CHECK(m4 > 4.0 && m4 <= 5.0, "median over 4 learners' latest: %g", m4);
    for (int i = 0; i < 4; i++) dl_guard_observe(g, 0, i, 7.0, 1, 0.0); /* the window turns over */
    CHECK_NEAR(dl_guard_median(g, 0, &cnt), 7.0, 1e-12);
    cw.norm_window = 1;
    cw.norm_min_history = 1;
    CHECK_EQ(dl_guard_reconfigure(g, &cw), 0);
    dl_guard_observe(g, 0, 0, 2.0, 1, 0.0);
    CHECK_NEAR(dl_guard_median(g, 0, &cnt), 2.0, 1e-12);
    CHECK_EQ(cnt, 1);
    CHECK_EQ(dl_guard_reconfigure(g, &c), 0); /* grow again: keeps what there is */
    CHECK_NEAR(dl_guard_median(g, 0, &cnt), 2.0, 1e-12);
    CHECK_EQ(cnt, 1);
    /* a refused reconfigure changes nothing */
    dl_guard_cfg bad = c;
    bad.norm_window = 0;
    CHECK_EQ(dl_guard_reconfigure(g, &bad), DL_EINVAL);
    CHECK_EQ(dl_guard_get_cfg(g)->norm_window, 32);

    /* the warm-up (measured in bench/byzantine.sh): 4 honest learners at norm
     * 0.1, then all at ~1.1. A median of accepted norms refused them forever;
     * this one refuses the first two (their norms are remembered, at the
     * bound), then follows: the third passes, and so do the first two next time */
    dl_guard *gw = open_guard(&c, 1, 4);
    for (int l = 0; l < 4; l++) dl_guard_observe(gw, 0, l, 0.1, 1, 0.0);
    int fate[4];
    for (int l = 0; l < 4; l++) {
        fate[l] = dl_guard_value(gw, 0, 1.1, 1, 0.0, 1e6, &sc, NULL, 0);
        dl_guard_observe(gw, 0, l, 1.1, 1, 0.0);
    }
    CHECK(fate[0] == DL_GUARD_REJECTED && fate[1] == DL_GUARD_REJECTED && fate[2] == DL_GUARD_OK &&
              fate[3] == DL_GUARD_OK,
          "warm-up: fates %d %d %d %d", fate[0], fate[1], fate[2], fate[3]);
    for (int l = 0; l < 4; l++) CHECK_EQ(dl_guard_value(gw, 0, 1.2, 1, 0.0, 1e6, &sc, NULL, 0), DL_GUARD_OK);
    dl_guard_close(&gw);

    /* a learner pushing far more often than the others cannot evict their
     * votes (found in review: with an arrival ring, 32 pushes of one learner
     * made the median its own and 60 pushes took it to 5.5e29) */
    dl_guard *ge = open_guard(&c, 1, 4);
    for (int l = 0; l < 3; l++) dl_guard_observe(ge, 0, l, 1.0, 1, 0.0);
    for (int i = 0; i < 100; i++) {
        double sc2;
        dl_guard_value(ge, 0, 1e30, 1, 0.0, 1e40, &sc2, NULL, 0);
        dl_guard_observe(ge, 0, 3, 1e30, 1, 0.0);
    }
    CHECK_NEAR(dl_guard_median(ge, 0, &cnt), 1.0, 1e-12);
    CHECK_EQ(cnt, 4);
    CHECK_EQ(dl_guard_value(ge, 0, 1e3, 1, 0.0, 1e40, &sc, NULL, 0), DL_GUARD_REJECTED);
    dl_guard_close(&ge);

    /* inflation, as the header warns: a learner alone (or a majority) raises
     * the median by at most norm_k per push, geometrically */
    cc.norm_min_history = 1;
    dl_guard *gi = open_guard(&cc, 1, 1);
    for (int i = 0; i < 3; i++) dl_guard_observe(gi, 0, 0, 1.0, 1, 0.0);
    for (int i = 0; i < 20; i++) {
        double m = dl_guard_median(gi, 0, NULL);
        dl_guard_observe(gi, 0, 0, 1e30, 1, 0.0);
        CHECK(dl_guard_median(gi, 0, NULL) <= 10.0 * m * (1 + 1e-12), "median grows at most norm_k per push");
    }
    CHECK(dl_guard_median(gi, 0, NULL) > 1e6, "an attacker alone inflates the median: %g", dl_guard_median(gi, 0, NULL));
    dl_guard_close(&gi);
    dl_guard_close(&g);
    dl_guard_close(&g); /* twice is safe */
    dl_guard_close(NULL);
}

/* Like with like: pushes are judged per step. A fleet of 4 pushing 8 steps
 * at norm 1; honest pushes that carry more steps (outage work, a learner's
 * first push after a long start, the warm-up of the issue that found it:
 * "norm 2.06 > 10 x median 0.2") are merged; scaled pushes still fail, also
 * when they claim more steps than they made. */
static void test_per_step(void)
{
    dl_guard_cfg c = dl_guard_cfg_default();
    dl_guard *g = open_guard(&c, 1, 8);
    double sc;
    char why[256];
    for (int l = 0; l < 4; l++) dl_guard_observe(g, 0, l, 1.0, 8, 0.0);
    CHECK_NEAR(dl_guard_median(g, 0, NULL), 1.0 / sqrt(8.0), 1e-12); /* remembered per sqrt(step) */
    /* an outage: 80 steps (10 periods) at once; noise grows ~sqrt(10) = 3.2, a drift up to 10 x; bound
     * 10 x sqrt(80 / 8) = 31.6 x the others' norm. The old rule (norm <= 10 x their median norm, whatever the
     * steps) refused the 12: */
    CHECK_EQ(dl_guard_value(g, 0, 3.2, 80, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 12.0, 80, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    /* the same norm with the others' steps is an outlier */
    CHECK_EQ(dl_guard_value(g, 0, 12.0, 8, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    /* a push of few steps gets a tighter bound: 1 step, bound 10 x 1 / sqrt(8) = 3.54 */
    CHECK_EQ(dl_guard_value(g, 0, 0.5, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 3.6, 1, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_STR(why, "norm 3.6 > 10 x median 0.354 of 4 learner(s)' latest pushes (per sqrt(step), x sqrt(1 steps))");
    /* scaled x100 with the steps it made: refused */
    CHECK_EQ(dl_guard_value(g, 0, 100.0, 8, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    /* scaled x100 claiming 10^6 steps: the steps count at most norm_k x the median (80), a bound of
     * 10 x sqrt(80 / 8) = 31.6 x the others' norm: refused */
    CHECK_EQ(dl_guard_value(g, 0, 100.0, 1000000, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_STR(why, "norm 100 > 10 x median 3.16 of 4 learner(s)' latest pushes (per sqrt(step), x sqrt(80 steps))");
    dl_guard_close(&g);

    /* the warm-up seen in a run: the fleet's latest pushes at norm 0.2 with 4 steps, a learner's push of norm
     * 2.06 with 16 steps (its first after joining): 2.06 <= 10 x 0.2 x sqrt(16 / 4) = 4 */
    g = open_guard(&c, 1, 8);
    for (int l = 0; l < 4; l++) dl_guard_observe(g, 0, l, 0.2, 4, 0.0);
    CHECK_EQ(dl_guard_value(g, 0, 2.06, 16, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 2.06, 4, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED); /* same steps: an outlier */
    /* a learner's record keeps its steps: a long push remembered per sqrt(step) does not inflate the median */
    dl_guard_observe(g, 0, 4, 2.06, 16, 0.0);
    CHECK_NEAR(dl_guard_median(g, 0, NULL), 0.1, 1e-12); /* 4 x 0.1 and 0.515 */
    dl_guard_close(&g);

    /* the [wan] issue's run: six learners at H=16 (16 steps a push) around norm 0.555; after a 20 s outage a
     * learner's first push carried 412 steps at norm 5.65 and was refused ("norm 5.65 > 10 x median 0.555").
     * Per step: the steps count up to 10 x 16 = 160, bound 10 x 0.555 / sqrt(16) x sqrt(160) = 17.5 */
    g = open_guard(&c, 1, 8);
    for (int l = 0; l < 6; l++) dl_guard_observe(g, 0, l, 0.5 + 0.022 * l, 16, 0.0); /* median 0.555 */
    CHECK_NEAR(dl_guard_median(g, 0, NULL) * 4.0, 0.555, 1e-9);
    CHECK_EQ(dl_guard_value(g, 0, 5.65, 412, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    /* even if its 412 steps had drifted in one direction (norm x 412 / 16 = 14.3) */
    CHECK_EQ(dl_guard_value(g, 0, 0.555 * 412 / 16, 412, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    /* a byzantine push scaled x100 claiming those 412 steps, or any number: the steps stop at 160 */
    CHECK_EQ(dl_guard_value(g, 0, 55.5, 412, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_STR(why, "norm 55.5 > 10 x median 1.76 of 6 learner(s)' latest pushes (per sqrt(step), x sqrt(160 steps))");
    CHECK_EQ(dl_guard_value(g, 0, 55.5, UINT64_MAX, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    HAS(why, "x sqrt(160 steps)");
    /* what lying about steps buys at most: sqrt(norm_k) = 3.16 x the bound of its honest 16 steps */
    CHECK_EQ(dl_guard_value(g, 0, 17.4, UINT64_MAX, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 17.6, UINT64_MAX, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    CHECK_EQ(dl_guard_value(g, 0, 5.6, 16, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    /* the outage push is remembered per sqrt(step): the median stays the fleet's */
    dl_guard_observe(g, 0, 6, 5.65, 412, 0.0);
    CHECK_NEAR(dl_guard_median(g, 0, NULL) * 4.0, 0.566, 1e-9); /* one rank up, not x 10 */
    dl_guard_close(&g);

    /* test_wan_downlink under load: a fleet at H=16 pushing every 0.25 s (64 steps/s), a thin learner cut off
     * for 5 s pushed 781 steps 12.2 s after the base it pushed on, its norm grown like a drift: refused with the
     * steps capped at 10 x 16 = 160 ("x sqrt(160 steps)"). The time term: in 12.2 s the median learner makes
     * 64 x 12.2 = 781 steps, up to 10 x that count, so the push is judged on its own 781 */
    g = open_guard(&c, 1, 8);
    for (int l = 0; l < 3; l++) dl_guard_observe(g, 0, l, 4.0, 16, 0.25); /* 1 per sqrt(step), 64 steps/s */
    double drift = 4.0 * 781 / 16; /* 195: a steady drift over the cut */
    CHECK_EQ(dl_guard_value(g, 0, drift, 781, 0.0, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED); /* no time: capped */
    HAS(why, "x sqrt(160 steps)");
    CHECK_EQ(dl_guard_value(g, 0, drift, 781, 12.2, 1e6, &sc, why, sizeof why), DL_GUARD_OK); /* bound 10 x sqrt(781) */
    /* a liar claiming those steps without the time: capped at 10 x 64 x 0.25 = 160, refused */
    CHECK_EQ(dl_guard_value(g, 0, drift, 781, 0.25, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    HAS(why, "x sqrt(160 steps)");
    /* with the time, at most sqrt(norm_k) x the bound of an honest learner's steps in that time (10 x sqrt(7808))
     * and, however long it waited, at most norm_k x the cap without time: 10 x sqrt(1600) = 400 */
    CHECK_EQ(dl_guard_value(g, 0, 399.0, UINT64_MAX, 12.2, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 401.0, UINT64_MAX, 12.2, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    HAS(why, "x sqrt(1600 steps)");
    CHECK_EQ(dl_guard_value(g, 0, 401.0, UINT64_MAX, 1e9, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    /* 1 s: 10 x 64 = 640 steps count */
    CHECK_EQ(dl_guard_value(g, 0, 10 * sqrt(640.0) - 0.1, UINT64_MAX, 1.0, 1e6, &sc, why, sizeof why), DL_GUARD_OK);
    CHECK_EQ(dl_guard_value(g, 0, 10 * sqrt(640.0) + 0.1, UINT64_MAX, 1.0, 1e6, &sc, why, sizeof why),
             DL_GUARD_REJECTED);
    /* records without a known rate (elapsed 0) add no time term */
    dl_guard_close(&g);
    g = open_guard(&c, 1, 8);
    for (int l = 0; l < 3; l++) dl_guard_observe(g, 0, l, 4.0, 16, 0.0);
    CHECK_EQ(dl_guard_value(g, 0, drift, 781, 12.2, 1e6, &sc, why, sizeof why), DL_GUARD_REJECTED);
    dl_guard_close(&g);
    printf("ok: per-step norms: outage and warm-up pushes merged, scaled ones refused\n");
}

static void test_replay(void)
{
    dl_guard_cfg c = dl_guard_cfg_default();
    dl_guard *g = open_guard(&c, 3, 4);
    char why[256];
    /* nothing merged yet: base 0 is fine */
    CHECK_EQ(dl_guard_replay(g, 1, 2, 0, why, sizeof why), 0);
    dl_guard_applied(g, 1, 2, 5);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 5, why, sizeof why), 1);
    CHECK_STR(why, "base version 5 of fragment 2 is not newer than 5, already merged from this learner");
    CHECK_EQ(dl_guard_replay(g, 1, 2, 4, why, sizeof why), 1);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 0, NULL, 0), 1);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 6, why, sizeof why), 0); /* a newer base */
    /* other fragments and other learners are independent */
    CHECK_EQ(dl_guard_replay(g, 1, 1, 5, why, sizeof why), 0);
    CHECK_EQ(dl_guard_replay(g, 0, 2, 5, why, sizeof why), 0);
    /* an older base applied later does not lower the mark */
    dl_guard_applied(g, 1, 2, 3);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 5, why, sizeof why), 1);
    dl_guard_applied(g, 1, 2, 9);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 8, why, sizeof why), 1);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 10, why, sizeof why), 0);
    /* base 0 merged: only base 0 itself is a replay */
    dl_guard_applied(g, 3, 0, 0);
    CHECK_EQ(dl_guard_replay(g, 3, 0, 0, why, sizeof why), 1);
    CHECK_EQ(dl_guard_replay(g, 3, 0, 1, why, sizeof why), 0);
    /* the slot's next learner starts clean */
    dl_guard_forget(g, 1);
    CHECK_EQ(dl_guard_replay(g, 1, 2, 5, why, sizeof why), 0);
    dl_guard_forget(g, 1); /* twice, and a slot never used */
    dl_guard_forget(g, 2);
    CHECK_EQ(dl_guard_replay(g, 3, 0, 0, why, sizeof why), 1); /* others untouched */
    /* reconfigure keeps replay state */
    dl_guard_cfg c2 = c;
    c2.norm_window = 8;
    CHECK_EQ(dl_guard_reconfigure(g, &c2), 0);
    CHECK_EQ(dl_guard_replay(g, 3, 0, 0, why, sizeof why), 1);
    dl_guard_close(&g);
}

static void test_params(void)
{
    dl_guard_cfg c = dl_guard_cfg_default();
    dl_guard *g = open_guard(&c, 4, 1);
    char why[256];
    float x[2000];
    for (int i = 0; i < 2000; i++) x[i] = (float)(i % 11) * 0.1f - 0.5f;
    CHECK_EQ(dl_guard_params(g, 3, x, 2000, why, sizeof why), 0);
    x[1000] = 1000.0f; /* exactly the bound */
    x[1001] = -1000.0f;
    CHECK_EQ(dl_guard_params(g, 3, x, 2000, why, sizeof why), 0);
    x[1234] = NAN;
    CHECK_EQ(dl_guard_params(g, 3, x, 2000, why, sizeof why), DL_ECORRUPT);
    CHECK_STR(why, "parameter 1234 of fragment 3 is nan");
    CHECK_STR(dl_errmsg(), why);
    x[7] = 3.1e5f; /* the first offender is reported */
    CHECK_EQ(dl_guard_params(g, 0, x, 2000, why, sizeof why), DL_ECORRUPT);
    CHECK_STR(why, "parameter 7 of fragment 0 is 3.1e+05 > param_abs_max 1000");
    x[7] = -2000.0f;
    CHECK_EQ(dl_guard_params(g, 0, x, 2000, why, sizeof why), DL_ECORRUPT);
    HAS(why, "-2e+03 < -param_abs_max 1000");
    x[7] = 0;
    x[1234] = -INFINITY;
    CHECK_EQ(dl_guard_params(g, 0, x, 2000, why, sizeof why), DL_ECORRUPT);
    CHECK_STR(why, "parameter 1234 of fragment 0 is -inf");
    /* param_abs_max 0: any finite value passes, inf and nan still refused */
    x[1234] = 1e37f;
    CHECK_EQ(dl_guard_params(g, 0, x, 2000, why, sizeof why), DL_ECORRUPT);
    CHECK_EQ(dl_guard_params_max(0.0, 0, x, 2000, why, sizeof why), 0);
    x[1999] = INFINITY;
    CHECK_EQ(dl_guard_params_max(0.0, 0, x, 2000, why, sizeof why), DL_ECORRUPT);
    CHECK_STR(why, "parameter 1999 of fragment 0 is inf");
    CHECK_EQ(dl_guard_params_max(0.0, 0, x, 0, why, sizeof why), 0);
    /* the threaded path */
    size_t n = (size_t)1 << 20;
    float *big = dl_xcalloc(n, sizeof *big);
    CHECK_EQ(dl_guard_params(g, 1, big, n, why, sizeof why), 0);
    big[n - 3] = NAN;
    CHECK_EQ(dl_guard_params(g, 1, big, n, NULL, 0), DL_ECORRUPT);
    HAS(dl_errmsg(), "parameter 1048573 of fragment 1 is nan");
    free(big);
    dl_guard_close(&g);
}

/* The fused passes agree with the separate ones: copy + sum of squares of
 * a received (unaligned) frame, and the worker's one pass over a merged
 * fragment (the params check, its norm, its checksum and its block
 * checksums), including a refusal. */
static void test_fused(void)
{
    size_t n = 3 * 1000 + 17, blk = 1000;
    float *x = malloc(n * 4), *dst = malloc(n * 4);
    unsigned char *raw = malloc(n * 4 + 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 97) - 48) * 0.125f;
    memcpy(raw + 1, x, n * 4); /* a frame at an odd address */
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    double ss = dl_guard_copy_sumsq(dst, raw + 1, n);
    CHECK(memcmp(dst, x, n * 4) == 0, "copy_sumsq copies every value");
    CHECK_NEAR(ss, ref, 1e-12 * ref);
    CHECK_NEAR(dl_guard_sumsq(x, n), ref, 1e-12 * ref);
    CHECK_NEAR(sqrt(dl_guard_sumsq(x, 1000) + dl_guard_sumsq(x + 1000, n - 1000)), sqrt(ref), 1e-12 * sqrt(ref));
    double norm = -1;
    uint64_t hash = 0, sums[4] = {0};
    char why[200];
    CHECK_EQ(dl_guard_params_scan(100.0, 3, x, n, blk, &norm, &hash, sums, why, sizeof why), 0);
    CHECK_NEAR(norm, sqrt(ref), 1e-12 * sqrt(ref));
    CHECK(hash == dl_checksum64(x, n * 4), "the scan's hash is the fragment's checksum");
    for (size_t b = 0; b < 4; b++) {
        size_t len = b < 3 ? blk : 17;
        CHECK(sums[b] == dl_checksum64(x + b * blk, len * 4), "block %zu checksum", b);
    }
    /* a value over the bound, in the last block: the reason dl_guard_params_max gives, outputs untouched */
    x[n - 3] = 1e6f;
    norm = -1;
    char why2[200];
    CHECK_EQ(dl_guard_params_scan(100.0, 3, x, n, blk, &norm, &hash, sums, why, sizeof why), DL_ECORRUPT);
    CHECK_EQ(dl_guard_params_max(100.0, 3, x, n, why2, sizeof why2), DL_ECORRUPT);
    CHECK(!strcmp(why, why2) && norm == -1, "refused as dl_guard_params_max: %s", why);
    x[n - 3] = NAN;
    CHECK_EQ(dl_guard_params_scan(0.0, 3, x, n, blk, &norm, &hash, sums, why, sizeof why), DL_ECORRUPT);
    CHECK(strstr(why, "nan") != NULL, "a nan is named: %s", why);
    free(x);
    free(dst);
    free(raw);
}

int main(void)
{
    test_cfg();
    test_counters();
    test_norm();
    test_value();
    test_per_step();
    test_replay();
    test_params();
    test_fused();
    return CHECK_DONE("test_guard");
}
