/* chaos/loadsched.h: the load generator's schedule is a pure function of its config and seed (same seed, same
 * arrivals; another seed, others), holds its regime's shape (counts match the rate integral, bursts are
 * denser), stays inside the run, and every out-of-range value is refused. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chaos/loadsched.h"
#include "check.h"
#include "core/err.h"

static double integral(const dl_loadsched *s, double dur)
{
    double a = 0;
    for (double t = 0; t < dur; t += 0.001) a += dl_loadsched_rate(s, t) * 0.001;
    return a;
}

int main(void)
{
    for (int r = 0; r < 3; r++) {
        dl_loadsched_cfg c = {.regime = (dl_load_regime)r, .rate = 40, .burst_x = 4, .period_s = 5, .duty = 0.3,
                              .duration_s = 120, .seed = 11};
        dl_loadsched *a, *b, *d;
        REQUIRE(dl_loadsched_open(&c, &a) == 0 && dl_loadsched_open(&c, &b) == 0, "%s", dl_errmsg());
        c.seed = 12;
        REQUIRE(dl_loadsched_open(&c, &d) == 0, "%s", dl_errmsg());
        int64_t na, nb, nd;
        const double *ta = dl_loadsched_times(a, &na), *tb = dl_loadsched_times(b, &nb), *td = dl_loadsched_times(d, &nd);
        CHECK(na == nb && !memcmp(ta, tb, (size_t)na * sizeof *ta), "%s: same seed, other schedule", dl_loadsched_name(c.regime));
        CHECK(na != nd || memcmp(ta, td, (size_t)na * sizeof *ta), "%s: seeds 11 and 12 give one schedule", dl_loadsched_name(c.regime));
        int inc = 1;
        for (int64_t i = 0; i < na; i++) inc &= ta[i] >= 0 && ta[i] < 120 && (i == 0 || ta[i] > ta[i - 1]);
        CHECK(inc, "%s: times not increasing inside [0, 120)", dl_loadsched_name(c.regime));
        double want = integral(a, 120);
        CHECK(fabs((double)na - want) < 5 * sqrt(want), "%s: %lld arrivals, rate integral %.0f", dl_loadsched_name(c.regime),
              (long long)na, want);
        if (r) { /* arrivals where the rate is X*R: about X times denser per second */
            double tb_ = 0, tq = 0;
            int64_t kb = 0, kq = 0;
            for (double t = 0; t < 120; t += 0.01) {
                if (dl_loadsched_rate(a, t) > 40) tb_ += 0.01; else tq += 0.01;
            }
            for (int64_t i = 0; i < na; i++) {
                if (dl_loadsched_rate(a, ta[i]) > 40) kb++; else kq++;
            }
            CHECK(tb_ > 5 && kb / tb_ > 2.5 * (kq / tq), "%s: burst density %.1f vs %.1f /s", dl_loadsched_name(c.regime),
                  kb / tb_, kq / tq);
        }
        printf("ok: %s: %lld arrivals, deterministic per seed\n", dl_loadsched_name(c.regime), (long long)na);
        dl_loadsched_close(&a), dl_loadsched_close(&b), dl_loadsched_close(&d);
    }
    dl_loadsched_cfg ok = {.regime = DL_LOAD_BURSTY, .rate = 10, .burst_x = 2, .period_s = 1, .duty = 0.5, .duration_s = 1};
    dl_loadsched_cfg bad[6];
    for (int i = 0; i < 6; i++) bad[i] = ok;
    bad[0].rate = 0, bad[1].burst_x = 0.5, bad[2].period_s = 0.01, bad[3].duty = 1, bad[4].duration_s = NAN;
    bad[5].rate = 1e5, bad[5].duration_s = 86400;
    static const char *const what[] = {"rate", "burst_x", "period_s", "duty", "duration_s", "1e7"};
    for (int i = 0; i < 6; i++) {
        dl_loadsched *s;
        CHECK(dl_loadsched_open(&bad[i], &s) == DL_EINVAL && strstr(dl_errmsg(), what[i]), "%s: %s", what[i], dl_errmsg());
    }
    dl_load_regime g;
    CHECK(dl_loadsched_parse("bursty", &g) == 0 && g == DL_LOAD_BURSTY && dl_loadsched_parse("burst", &g) == DL_EINVAL, "parse");
    printf("ok: loadsched refusals\n%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
