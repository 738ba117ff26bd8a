/* gpt/dynh.h: the dynamic-H rule (speed ratio, rounding, bounds, unknown
 * rates) and the cycle schedule: with any sequence of H changes every
 * fragment is due exactly once per cycle (never skipped, never doubled), and
 * with a constant H the schedule is dl_plan_due's step for step. */
#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"
#include "gpt/dynh.h"
#include "tests/check.h"

#include <math.h>
#include <stdint.h>

static void test_rule(void)
{
    dl_dynh d;
    CHECK_EQ(dl_dynh_init(&d, DL_DYNH_SPEED, 1, 0), 0);
    /* speeds 1, 1, 0.5, 0.25 over a fleet median of 0.75 at H = 16 */
    CHECK_EQ(dl_dynh_rule(&d, 16, 1.0, 0.75), 21);  /* 21.33 */
    CHECK_EQ(dl_dynh_rule(&d, 16, 0.5, 0.75), 11);  /* 10.67 */
    CHECK_EQ(dl_dynh_rule(&d, 16, 0.25, 0.75), 5);  /* 5.33 */
    CHECK_EQ(dl_dynh_rule(&d, 16, 0.75, 0.75), 16);
    /* bounds: h_max 0 = 4 x H, h_min */
    CHECK_EQ(dl_dynh_rule(&d, 16, 100.0, 1.0), 64);
    CHECK_EQ(dl_dynh_rule(&d, 16, 1e-6, 1.0), 1);
    CHECK_EQ(dl_dynh_init(&d, DL_DYNH_SPEED, 4, 20), 0);
    CHECK_EQ(dl_dynh_rule(&d, 16, 100.0, 1.0), 20);
    CHECK_EQ(dl_dynh_rule(&d, 16, 0.01, 1.0), 4);
    /* unknown rates keep the Welcome's H */
    CHECK_EQ(dl_dynh_rule(&d, 16, 0.0, 1.0), 16);
    CHECK_EQ(dl_dynh_rule(&d, 16, 1.0, 0.0), 16);
    CHECK_EQ(dl_dynh_rule(&d, 16, NAN, 1.0), 16);
    CHECK_EQ(dl_dynh_rule(&d, 16, 1.0, INFINITY), 16);
    /* off: always the Welcome's */
    CHECK_EQ(dl_dynh_init(&d, DL_DYNH_OFF, 1, 0), 0);
    CHECK_EQ(dl_dynh_rule(&d, 16, 0.25, 1.0), 16);
    /* refusals, named */
    CHECK(dl_dynh_init(&d, DL_DYNH_SPEED, 0, 0) == DL_EINVAL && strstr(dl_errmsg(), "dynamic_h_min: 0"),
          "h_min 0 refused: %s", dl_errmsg());
    CHECK(dl_dynh_init(&d, DL_DYNH_SPEED, 8, 4) == DL_EINVAL &&
              strstr(dl_errmsg(), "dynamic_h_max: 4 is below dynamic_h_min 8"),
          "h_max < h_min refused: %s", dl_errmsg());
    CHECK(dl_dynh_init(&d, DL_DYNH_SPEED, 1, DL_DYNH_H_MAX + 1) == DL_EINVAL && strstr(dl_errmsg(), "dynamic_h_max"),
          "h_max too large refused: %s", dl_errmsg());
}

/* Constant H: the schedule step is congruent to the real one mod H, so every
 * fragment is due at exactly the plain schedule's steps. */
static void test_constant(void)
{
    const int Hs[] = {1, 2, 3, 7, 16, 30};
    const int Ps[] = {1, 3, 4, 9};
    for (size_t a = 0; a < sizeof Hs / sizeof *Hs; a++)
        for (size_t b = 0; b < sizeof Ps / sizeof *Ps; b++) {
            int H = Hs[a], P = Ps[b], diff = 0, ch = 0;
            dl_dynh d;
            dl_dynh_init(&d, DL_DYNH_SPEED, 1, 0);
            for (int64_t s = 1; s <= 500; s++) {
                int h, c;
                int64_t q = dl_dynh_step(&d, s, H, 1.0, 1.0, &h, &c); /* own == fleet: H */
                ch += c;
                for (int p = 0; p < P; p++) diff += dl_plan_due(q, p, h, P) != dl_plan_due(s, p, H, P);
            }
            CHECK(diff == 0 && ch == 0, "H=%d P=%d: %d due flags differ from the plain schedule, %d changes", H, P,
                  diff, ch);
        }
}

/* Random speeds and Welcome H's: each fragment is due exactly once in every
 * cycle, the cycles tile the steps, and H stays in its bounds. */
static void test_changes(void)
{
    dl_rng r;
    dl_rng_seed(&r, 7);
    for (int trial = 0; trial < 200; trial++) {
        int P = 1 + (int)(dl_rng_u64(&r) % 12), base = 1 + (int)(dl_rng_u64(&r) % 40);
        int hmin = 1 + (int)(dl_rng_u64(&r) % 3), hmax = trial % 2 ? 0 : hmin + (int)(dl_rng_u64(&r) % 60);
        dl_dynh d;
        REQUIRE(dl_dynh_init(&d, DL_DYNH_SPEED, hmin, hmax) == 0, "init");
        int64_t first = 1 + (int64_t)(dl_rng_u64(&r) % 100); /* a resumed learner starts anywhere */
        int count[16] = {0}, cur = 0, bad_once = 0, bad_bounds = 0, cycles = 0;
        int64_t cycle_start = INT64_MIN;
        for (int64_t s = first; s < first + 2000; s++) {
            if (s % 97 == 0) base = 1 + (int)(dl_rng_u64(&r) % 40); /* a re-hello's Welcome */
            double own = 0.05 + (double)(dl_rng_u64(&r) % 1000) / 250.0, fleet = trial % 5 ? 1.0 : 0.0;
            int h, c;
            int64_t q = dl_dynh_step(&d, s, base, own, fleet, &h, &c);
            if (d.start != cycle_start) { /* a new cycle: the last one saw each fragment once */
                /* (the first cycle, from the step before the first, has no push of the fragments
                 * at offset 0, as the plain schedule's from step 0) */
                for (int p = 0; cycles && p < P; p++)
                    bad_once += count[p] != (cycle_start == first - 1 && (int64_t)p * cur / P == 0 ? 0 : 1);
                for (int p = 0; p < P; p++) count[p] = 0;
                if (cycle_start != INT64_MIN && d.start != cycle_start + cur) bad_once++; /* cycles tile the steps */
                cycle_start = d.start;
                cur = h;
                cycles++;
                int hi = hmax ? hmax : 4 * base; /* the bounds of the Welcome's H at the cycle's start */
                if (hi < hmin) hi = hmin;
                if (fleet > 0 && (h < hmin || h > hi)) bad_bounds++;
            }
            if (h != cur) bad_once++; /* H changed inside a cycle */
            for (int p = 0; p < P; p++) count[p] += dl_plan_due(q, p, h, P);
        }
        CHECK(bad_once == 0 && bad_bounds == 0 && (uint64_t)cycles <= d.cycles && d.cycles <= (uint64_t)cycles + 1,
              "trial %d P=%d: %d cycles with a fragment not due exactly once, %d H out of bounds, cycles %d/%llu",
              trial, P, bad_once, bad_bounds, cycles, (unsigned long long)d.cycles);
    }
}

int main(void)
{
    test_rule();
    test_constant();
    test_changes();
    return CHECK_DONE("test_dynh");
}
