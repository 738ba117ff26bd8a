/* dloco-sim's engine (chaos/sim.c): determinism per seed, the interruption
 * process's rate, the data-parallel recovery arithmetic on a case checked by
 * hand and against its closed form, the elastic resize against its closed
 * form, the buckets summing to the provisioned time, the real policy driving
 * the rounds (a learner that never pushes does not block quorum 1; a staleness
 * bound of 0 drops pushes the default keeps), and every cfg refusal. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chaos/sim.h"
#include "core/err.h"
#include "tests/check.h"

static void buckets_sum(const dl_sim_result *r)
{
    double s = r->down + r->startup + r->recovery + r->idle_barrier + r->goodput + r->dropped_stale + r->wasted;
    CHECK_NEAR(s / r->provisioned, 1.0, 1e-9);
}

static void small(dl_sim_cfg *c)
{
    dl_sim_cfg_default(c);
    c->chips = 4000;
    c->learners = 4;
    c->mtbi_s = 4000.0 * 600; /* the fleet: an interruption every 600 s */
    c->slice_chips = 100;
    c->resize_s = 5;
    c->repair_s = 300;
    c->horizon_s = 4 * 3600;
    c->H = 20;
    c->P = 4;
    c->step_s = 0.5;
    c->step_cv = 0.2;
}

static void test_determinism(void)
{
    dl_sim_cfg c;
    small(&c);
    dl_sim_result a, b, d;
    REQUIRE(dl_sim_run(&c, &a) == 0, "run: %s", dl_errmsg());
    REQUIRE(dl_sim_run(&c, &b) == 0, "run: %s", dl_errmsg());
    CHECK(a.goodput == b.goodput && a.events == b.events && a.merges == b.merges && a.wasted == b.wasted,
          "same seed, same result: %.17g/%.17g events %llu/%llu", a.goodput, b.goodput, (unsigned long long)a.events,
          (unsigned long long)b.events);
    c.seed = 2;
    REQUIRE(dl_sim_run(&c, &d) == 0, "run: %s", dl_errmsg());
    CHECK(d.goodput != a.goodput || d.events != a.events, "another seed, another draw");
    buckets_sum(&a);
    CHECK(a.merges > 100 && a.pstats.rounds >= a.merges, "merges %llu, policy rounds %llu",
          (unsigned long long)a.merges, (unsigned long long)a.pstats.rounds);
    CHECK(a.goodput_frac > 0.5 && a.goodput_frac < 1, "goodput %.3f", a.goodput_frac);
}

static void test_rate(void)
{
    /* DP with nothing to absorb (recovery 0): every interruption is counted; 1000 chips, MTBI 1000 s per chip
     * = 1 per s over 20000 s: 20000 +- 4 sigma (566) */
    dl_sim_cfg c;
    dl_sim_cfg_default(&c);
    c.mode = DL_SIM_DP;
    c.chips = 1000;
    c.mtbi_s = 1000;
    c.recovery_s = 0;
    c.horizon_s = 20000;
    dl_sim_result r;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    CHECK(fabs((double)r.interruptions - 20000) < 566, "interruptions %llu, expected 20000",
          (unsigned long long)r.interruptions);
    /* the learners' process: 4 learners of 250 chips, slices of 1, repairs instant, no resize:
     * every interruption hits an up chip, so all are counted */
    dl_sim_cfg_default(&c);
    c.mode = DL_SIM_ELASTIC;
    c.chips = 1000;
    c.mtbi_s = 1000;
    c.slice_chips = 1;
    c.resize_s = 0;
    c.repair_s = 0;
    c.horizon_s = 20000;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    CHECK(fabs((double)r.interruptions - 20000) < 566, "elastic interruptions %llu, expected 20000",
          (unsigned long long)r.interruptions);
    CHECK_NEAR(r.goodput_frac, 1.0, 1e-9);
}

static void test_dp_by_hand(void)
{
    /* 2 chips, 100 s, checkpoint every 4 s of running, recovery 5 s, interruptions at 10, 12 and 50 s:
     * run 0-10 (checkpoints at 4, 8: 8 kept, 2 lost); 12 falls in the recovery (absorbed); recover 10-15;
     * run 15-50 (35 s: 32 kept, 3 lost); recover 50-55; run 55-100 (45 kept, the end).
     * goodput 85/100, recovery 10/100, wasted 5/100 */
    dl_sim_cfg c;
    dl_sim_cfg_default(&c);
    c.mode = DL_SIM_DP;
    c.chips = 2;
    c.learners = 1;
    c.slice_chips = 1;
    c.horizon_s = 100;
    c.recovery_s = 5;
    c.ckpt_s = 4;
    c.fail_at[0] = 10, c.fail_at[1] = 12, c.fail_at[2] = 50;
    c.n_fail_at = 3;
    dl_sim_result r;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    CHECK_NEAR(r.goodput_frac, 0.85, 1e-12);
    CHECK_NEAR(r.recovery / r.provisioned, 0.10, 1e-12);
    CHECK_NEAR(r.wasted / r.provisioned, 0.05, 1e-12);
    CHECK_EQ(r.interruptions, 3);
    buckets_sum(&r);
    /* closed form without checkpoint loss: a renewal of Exp(lambda) running and R recovering (interruptions in
     * the recovery absorbed): goodput = 1 / (1 + lambda R). lambda = 0.01/s, R = 30: 1/1.3 */
    dl_sim_cfg_default(&c);
    c.mode = DL_SIM_DP;
    c.chips = 100;
    c.slice_chips = 1;
    c.mtbi_s = 10000;
    c.recovery_s = 30;
    c.ckpt_s = 0;
    c.horizon_s = 2e7;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    CHECK_NEAR(r.goodput_frac, 1 / 1.3, 0.005);
    buckets_sum(&r);
}

static void test_elastic_closed_form(void)
{
    /* one slice of many, repairs short: goodput ~ (1 - down) x (1 - paused); with 2 pauses of resize_s per
     * interruption at fleet rate lambda, overlaps rare: paused ~ 2 lambda resize / (1 + 2 lambda resize) */
    dl_sim_cfg c;
    dl_sim_cfg_default(&c);
    c.mode = DL_SIM_ELASTIC;
    c.chips = 10000;
    c.slice_chips = 10;
    c.mtbi_s = 1e6; /* lambda = 0.01 /s */
    c.resize_s = 2;
    c.repair_s = 100; /* down: 0.01 x 100 slices-in-repair x 10 chips / 10000 = 0.1% */
    c.horizon_s = 1e6;
    dl_sim_result r;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    double paused = 2 * 0.01 * 2 / (1 + 2 * 0.01 * 2);
    CHECK_NEAR(r.goodput_frac, (1 - 0.001) * (1 - paused), 0.004);
    CHECK_NEAR(r.down / r.provisioned, 0.001, 0.0003);
    buckets_sum(&r);
}

/* n learners of one chip each, no interruptions, 600 s, H = 10 steps of 0.1 s (cv step_cv), P = 2, 1M
 * parameters, quorum 1: the fleets of the policy tests */
static void small_fleet(dl_sim_cfg *c, int n, double step_cv)
{
    dl_sim_cfg_default(c);
    c->chips = n;
    c->learners = n;
    c->slice_chips = 1;
    c->mtbi_s = 0;
    c->horizon_s = 600;
    c->H = 10;
    c->P = 2;
    c->step_s = 0.1;
    c->step_cv = step_cv;
    c->params = 1e6;
    c->policy.quorum = 1;
}

static void test_policy_driven(void)
{
    /* 2 learners, no interruptions; learner 1 is killed at 0.1 s for the whole run: it never pushes. Quorum 1:
     * the live learner's pushes still merge, alone */
    dl_sim_cfg c;
    small_fleet(&c, 2, 0);
    c.kill[0] = (dl_sim_kill){1, 0.1, 1e6};
    c.n_kill = 1;
    dl_sim_result r;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    /* 600 s / (10 x 0.1 s) = 600 periods x 2 fragments */
    CHECK(r.merges >= 1100, "quorum 1 is not blocked by a learner that never pushes: %llu merges",
          (unsigned long long)r.merges);
    CHECK_NEAR(r.mean_contrib, 1.0, 1e-9);
    CHECK(r.deaths == 1, "the killed learner is declared dead once: %llu", (unsigned long long)r.deaths);
    CHECK_EQ(r.pstats.rounds, r.merges);
    /* the live learner's compute, every period merged: goodput ~ 1/2 (the dead one is down) */
    CHECK_NEAR(r.goodput_frac, 0.5, 0.01);
    CHECK_NEAR(r.down / r.provisioned, 0.5, 0.01);
    buckets_sum(&r);
    /* quorum 2 with the second learner dead: K_eff = min(K, live) = 1 keeps it going too */
    c.policy.quorum = 2;
    REQUIRE(dl_sim_run(&c, &r) == 0, "run: %s", dl_errmsg());
    CHECK(r.merges >= 1100, "quorum 2, one learner dead: %llu merges", (unsigned long long)r.merges);
    /* out-of-phase learners (different speeds) with max_staleness 0: the policy drops pushes that are
     * 1 version behind; the default 8 drops none */
    small_fleet(&c, 4, 0.5);
    c.policy.max_staleness = 0;
    dl_sim_result r0, r8;
    REQUIRE(dl_sim_run(&c, &r0) == 0, "run: %s", dl_errmsg());
    c.policy.max_staleness = 8;
    REQUIRE(dl_sim_run(&c, &r8) == 0, "run: %s", dl_errmsg());
    CHECK(r0.dropped > 0 && r0.pstats.dropped_stale == r0.dropped && r0.dropped_stale > 0,
          "max_staleness 0 drops: %llu (policy %llu)", (unsigned long long)r0.dropped,
          (unsigned long long)r0.pstats.dropped_stale);
    CHECK(r8.dropped < r0.dropped && r8.goodput > r0.goodput, "max_staleness 8: %llu dropped, goodput %.4f vs %.4f",
          (unsigned long long)r8.dropped, r8.goodput_frac, r0.goodput_frac);
    buckets_sum(&r0);
    buckets_sum(&r8);
    /* the learner's hold rule: a push of f waits until the previous one is decided (merged and adopted); a
     * commit slower than the period (merge_s 1.5 s, period 1 s) spaces the pushes out, and no push is ever
     * replaced in an open round */
    c.step_cv = 0;
    c.merge_s = 0;
    dl_sim_result fast, slow;
    REQUIRE(dl_sim_run(&c, &fast) == 0, "run: %s", dl_errmsg());
    c.merge_s = 1.5;
    REQUIRE(dl_sim_run(&c, &slow) == 0, "run: %s", dl_errmsg());
    CHECK(fast.pushes >= 4 * 2 * 590 && slow.pushes < fast.pushes * 7 / 10,
          "pushes: %llu with a fast commit, %llu with one slower than the period", (unsigned long long)fast.pushes,
          (unsigned long long)slow.pushes);
    CHECK(fast.pstats.replaced == 0 && slow.pstats.replaced == 0, "replaced %llu / %llu",
          (unsigned long long)fast.pstats.replaced, (unsigned long long)slow.pstats.replaced);
    /* adopt = keep loses nothing at an Update; overwrite drops the progress since the push */
    for (int i = 0; i < 4; i++) c.adopt_overwrite[i] = 1;
    dl_sim_result ow;
    REQUIRE(dl_sim_run(&c, &ow) == 0, "run: %s", dl_errmsg());
    CHECK(ow.goodput < slow.goodput * 0.5 && slow.wasted / slow.provisioned < 0.02,
          "overwrite goodput %.3f vs keep %.3f (keep wasted %.4f)", ow.goodput_frac, slow.goodput_frac,
          slow.wasted / slow.provisioned);
    buckets_sum(&ow);
}

static void refused(dl_sim_cfg *c, const char *want)
{
    dl_sim_result r;
    int rc = dl_sim_run(c, &r);
    CHECK(rc != 0 && strstr(dl_errmsg(), want), "want '%s', got rc %d '%s'", want, rc, dl_errmsg());
    dl_sim_cfg_default(c);
}

static void test_refusals(void)
{
    dl_sim_cfg c;
    dl_sim_cfg_default(&c);
    c.horizon_s = 0, refused(&c, "horizon_s");
    c.chips = 0, refused(&c, "chips");
    c.learners = 0, refused(&c, "learners");
    c.chips = 4, c.learners = 8, refused(&c, "learners 8");
    c.mtbi_s = 0.5, refused(&c, "mtbi_s");
    c.recovery_s = -1, refused(&c, "recovery_s");
    c.ckpt_s = -1, refused(&c, "ckpt_s");
    c.slice_chips = 0, refused(&c, "slice_chips");
    c.resize_s = -1, refused(&c, "resize_s");
    c.repair_s = -1, refused(&c, "repair_s");
    c.learner_fail = (dl_sim_fail)7, refused(&c, "learner_fail");
    c.startup_s = -1, refused(&c, "startup_s");
    c.step_s = 0, refused(&c, "step_s");
    c.step_cv = 3, refused(&c, "step_cv");
    c.H = 0, refused(&c, "H 0");
    c.P = 0, refused(&c, "P 0");
    c.params = 0, refused(&c, "params");
    c.bytes_per_param = 0, refused(&c, "bytes_per_param");
    c.n_sites = 0, refused(&c, "sites");
    c.bandwidth_mbit[0] = -1, refused(&c, "bandwidth_mbit");
    c.site_of[0] = 5, refused(&c, "site 5");
    c.liveness = 0, refused(&c, "liveness");
    c.merge_s = -1, refused(&c, "merge_s");
    c.update_s = -1, refused(&c, "update_s");
    c.step_overhead_s = -1, refused(&c, "step_overhead_s");
    c.n_kill = 1, c.kill[0] = (dl_sim_kill){99, 0, 1}, refused(&c, "kill 0");
    c.n_kill = 1, c.kill[0] = (dl_sim_kill){0, INFINITY, 1}, refused(&c, "kill 0");
    c.n_fail_at = 2, c.fail_at[0] = 5, c.fail_at[1] = 1, refused(&c, "non-decreasing");
    c.n_fail_at = 1, c.fail_at[0] = -1, refused(&c, "fail_at 0");
    c.n_fail_at = 1, c.fail_at[0] = NAN, refused(&c, "fail_at 0");
    c.policy.kind = DL_POLICY_SYNC, refused(&c, "only the decoupled policy");
    c.policy.quorum = 0, refused(&c, "quorum"); /* the policy's own check */
    c.mode = (dl_sim_mode)9, refused(&c, "mode");
}

int main(void)
{
    test_determinism();
    test_rate();
    test_dp_by_hand();
    test_elastic_closed_form();
    test_policy_driven();
    test_refusals();
    printf("test_sim: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
