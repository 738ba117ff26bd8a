/* learner/timing.h and learner/pressure.h: every sync-timing policy's rules on synthetic pressure traces
 * (fixed is dl_plan_due bit for bit; wa never before H_min, always by H_max, avoids a high-pressure window,
 * falls back to H when pressure is unknown; the forecast; matched_random keeps the counts and stays feasible,
 * its draws are seeded and spread; the oracle is optimal against brute force on tiny traces), and the
 * pressure source's parser and refusals (file and loopback HTTP with a real socket). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "core/err.h"
#include "core/model.h"
#include "core/plan.h"
#include "learner/mailbox.h"
#include "learner/node.h"
#include "learner/pressure.h"
#include "learner/timing.h"

static const dl_pressure_sample calm = {.known = 1, .rate = 10};

/* Run a policy over S steps with pressure pr(step); out[p][i] = push steps. Returns total pushes. */
static int run(dl_timing *t, int P, int H, int64_t S, double (*pr)(int64_t), int64_t out[][512], int *n)
{
    int tot = 0;
    for (int p = 0; p < P; p++) n[p] = 0;
    for (int64_t s = 1; s <= S; s++) {
        dl_pressure_sample x = calm;
        if (pr) x.rate = pr(s);
        dl_timing_observe(t, s, pr ? &x : NULL, 3.0);
        for (int p = 0; p < P; p++)
            if (dl_timing_due(t, s, p, H, NULL)) {
                if (n[p] < 512) out[p][n[p]++] = s;
                tot++;
            }
    }
    return tot;
}

/* feasible as timing.h defines it */
static int feasible(int p, int P, int H, int hmin, int hmax, int64_t S, const int64_t *t, int n)
{
    int64_t off = (int64_t)p * H / P, last = (off ? off : H) - H;
    for (int i = 0; i < n; i++) {
        int64_t g = t[i] - last;
        if (t[i] < 1 || t[i] > S || g > hmax || (g < hmin && !(i == 0 && t[i] == 1 && last + hmin <= 1))) return 0;
        last = t[i];
    }
    return S - last < hmax;
}

static double burst(int64_t s) { return (s >= 40 && s < 60) ? 500.0 : 10.0; }
static double ramp(int64_t s) { return s < 30 ? 10.0 : 10.0 + 40.0 * (double)(s - 30); }

static void test_fixed(void)
{
    dl_timing_cfg c;
    dl_timing *t;
    for (int P = 1; P <= 5; P++)
        for (int H = 1; H <= 9; H += 2) {
            dl_timing_defaults(&c, DL_TIMING_FIXED, P, H);
            REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
            int bad = 0;
            for (int64_t s = 1; s <= 60; s++)
                for (int p = 0; p < P; p++) bad += dl_timing_due(t, s, p, H, NULL) != dl_plan_due(s, p, H, P);
            CHECK(!bad, "fixed differs from dl_plan_due at P=%d H=%d", P, H);
            dl_timing_close(&t);
        }
    printf("ok: fixed is dl_plan_due\n");
}

static void test_wa(void)
{
    dl_timing_cfg c;
    dl_timing *t;
    int64_t out[4][512];
    int n[4];
    /* calm and flat loss: the fixed period exactly */
    dl_timing_defaults(&c, DL_TIMING_WA, 4, 8);
    c.w_loss = 0;
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    run(t, 4, 8, 200, NULL, out, n);
    int same = 1;
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < n[p]; i++) same &= dl_plan_due(out[p][i], p, 8, 4);
    CHECK(same && n[0] == 25, "unknown pressure: fixed period (n0=%d)", n[0]);
    dl_timing_close(&t);
    /* a burst in 40..59: no push of any fragment inside it unless forced, all gaps in the corridor */
    dl_timing_defaults(&c, DL_TIMING_WA, 4, 8);
    c.h_min = 4, c.h_max = 24;
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    run(t, 4, 8, 200, burst, out, n);
    int inside = 0, feas = 1;
    for (int p = 0; p < 4; p++) {
        feas &= feasible(p, 4, 8, 4, 24, 200, out[p], n[p]);
        for (int i = 0; i < n[p]; i++) /* only a forced push (the H_max deadline) may fall inside */
            inside += out[p][i] >= 40 && out[p][i] < 60 && !(i > 0 && out[p][i] - out[p][i - 1] == 24);
    }
    CHECK(feas, "wa decisions outside the corridor");
    CHECK(inside == 0, "%d unforced wa pushes inside the burst", inside);
    dl_timing_close(&t);
    /* after the burst the held-back fragments do not all go at once: at most ceil(P/H) = 1 unforced per step */
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    int most = 0;
    for (int64_t s = 1; s <= 200; s++) {
        dl_pressure_sample x = {.known = 1, .rate = burst(s)};
        dl_timing_observe(t, s, &x, 3.0);
        int k = 0;
        dl_timing_decision dd;
        for (int p = 0; p < 4; p++) k += dl_timing_due(t, s, p, 8, &dd) && !dd.forced;
        if (k > most) most = k;
    }
    CHECK(most == 1, "%d unforced decisions in one step", most);
    dl_timing_close(&t);
    c.max_per_step = 5;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "max_per_step"), "%s", dl_errmsg());
    c.max_per_step = 0;
    /* endless pressure: always by H_max, never before H_min */
    dl_timing_defaults(&c, DL_TIMING_WA, 3, 6);
    c.h_min = 3, c.h_max = 11;
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    dl_timing_decision d;
    int64_t last[3] = {0}, maxgap = 0, mingap = 1000;
    int forced = 0;
    for (int64_t s = 1; s <= 300; s++) {
        dl_pressure_sample x = {.known = 1, .rate = 1e6};
        dl_timing_observe(t, s, &x, 3.0);
        for (int p = 0; p < 3; p++)
            if (dl_timing_due(t, s, p, 6, &d)) {
                forced += d.forced;
                if (last[p]) {
                    if (s - last[p] > maxgap) maxgap = s - last[p];
                    if (s - last[p] < mingap) mingap = s - last[p];
                }
                last[p] = s;
            }
    }
    CHECK(maxgap == 11 && mingap == 11 && forced > 0, "under pressure gaps %lld..%lld forced %d", (long long)mingap,
          (long long)maxgap, forced);
    dl_timing_close(&t);
    /* falling loss pulls pushes earlier, never before H_min */
    dl_timing_defaults(&c, DL_TIMING_WA, 1, 10);
    c.h_min = 5, c.w_loss = 50;
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    int64_t prev = 0, minl = 1000;
    for (int64_t s = 1; s <= 200; s++) {
        dl_timing_observe(t, s, &calm, 10.0 * exp(-0.01 * (double)s));
        if (dl_timing_due(t, s, 0, 10, NULL)) {
            if (prev && s - prev < minl) minl = s - prev;
            prev = s;
        }
    }
    CHECK(minl >= 5 && minl < 10, "loss term: min gap %lld", (long long)minl);
    dl_timing_close(&t);
    printf("ok: wa: fixed period when calm, avoids a burst, by H_max, never before H_min, loss term\n");
}

/* A rate burst in 40..49 whose backlog outlasts it: queue 5 until step 70. wa must not push unforced
 * while the backlog lasts (the rate is calm from step 50), with the queue term; without it, it does. */
static int backlog_run(double w_queue, int *inside)
{
    dl_timing_cfg c;
    dl_timing *t;
    dl_timing_defaults(&c, DL_TIMING_WA, 4, 8);
    c.h_min = 4, c.h_max = 24, c.w_loss = 0, c.w_queue = w_queue;
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    int64_t last[4] = {0}, pushes = 0;
    int in = 0, feas = 1;
    for (int p = 0; p < 4; p++) last[p] = -1;
    for (int64_t s = 1; s <= 200; s++) {
        dl_pressure_sample ps = {.known = 1, .rate = s >= 40 && s < 50 ? 500 : 10, .queue = s >= 40 && s < 70 ? 5 : 0};
        dl_timing_observe(t, s, &ps, 2.0);
        for (int p = 0; p < 4; p++) {
            dl_timing_decision d;
            if (!dl_timing_due(t, s, p, 8, &d)) continue;
            pushes++;
            if (last[p] >= 0) feas &= s - last[p] >= 4 && s - last[p] <= 24;
            last[p] = s;
            in += s >= 50 && s < 70 && !d.forced;
        }
    }
    dl_timing_close(&t);
    *inside = in;
    return feas && pushes > 0;
}

static void test_backlog(void)
{
    int in_q = -1, in_noq = -1;
    CHECK(backlog_run(1.0, &in_q), "backlog run infeasible");
    CHECK(in_q == 0, "%d unforced pushes while the backlog outlasted the burst", in_q);
    CHECK(backlog_run(0.0, &in_noq) && in_noq > 0, "without the queue term wa pushes into the backlog (%d)", in_noq);
    printf("ok: wa waits for the backlog to clear (or h_max), not only for the rate (%d pushes without the term)\n",
           in_noq);
}

static void test_forecast(void)
{
    dl_timing_cfg c;
    dl_timing *t;
    dl_timing_defaults(&c, DL_TIMING_WA_FORECAST, 1, 8);
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    /* a linear ramp: Holt's one-step forecast converges to x + slope */
    for (int64_t s = 1; s <= 60; s++) {
        dl_pressure_sample x = {.known = 1, .rate = 10.0 + 5.0 * (double)s};
        dl_timing_observe(t, s, &x, 3.0);
    }
    double f = dl_timing_forecast(t), want = 10.0 + 5.0 * 61;
    CHECK(fabs(f - want) < 0.5, "forecast %g, want %g", f, want);
    /* pressure term uses max(x, forecast) > x */
    double pf = dl_timing_pressure(t);
    CHECK(pf > (10.0 + 5.0 * 60) / 50.0 - 1.0 + 0.05, "forecast pressure %g", pf);
    dl_timing_close(&t);
    /* on a ramp, wa_forecast avoids more of the ramp than wa: its pushes in 30..60 are no more */
    int64_t out[1][512];
    int n1[1], n2[1], in1 = 0, in2 = 0;
    dl_timing_defaults(&c, DL_TIMING_WA, 1, 8);
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    run(t, 1, 8, 200, ramp, out, n1);
    for (int i = 0; i < n1[0]; i++) in1 += out[0][i] >= 30;
    dl_timing_close(&t);
    dl_timing_defaults(&c, DL_TIMING_WA_FORECAST, 1, 8);
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    run(t, 1, 8, 200, ramp, out, n2);
    for (int i = 0; i < n2[0]; i++) in2 += out[0][i] >= 30;
    CHECK(in2 <= in1, "forecast pushes on the ramp %d > wa %d", in2, in1);
    dl_timing_close(&t);
    printf("ok: forecast: Holt one step ahead on a ramp (%.2f), used in the pressure term\n", f);
}

static void test_matched_random(void)
{
    dl_timing_cfg c;
    dl_timing *t, *u;
    int64_t wa[4][512], mr[4][512];
    int nw[4], nm[4];
    dl_timing_defaults(&c, DL_TIMING_WA, 4, 8);
    c.h_min = 4, c.h_max = 16;
    REQUIRE(dl_timing_open(&c, &t) == 0, "%s", dl_errmsg());
    run(t, 4, 8, 300, burst, wa, nw);
    dl_timing_close(&t);
    dl_timing_cfg m = c;
    m.kind = DL_TIMING_MATCHED_RANDOM;
    m.steps = 300;
    m.counts = nw;
    m.seed = 7;
    int feas = 1, same = 1, differ = 0;
    long long hist[17] = {0};
    for (int rep = 0; rep < 50; rep++) {
        m.seed = 7 + (uint64_t)rep;
        REQUIRE(dl_timing_open(&m, &t) == 0, "%s", dl_errmsg());
        run(t, 4, 8, 300, NULL, mr, nm);
        for (int p = 0; p < 4; p++) {
            same &= nm[p] == nw[p];
            feas &= feasible(p, 4, 8, 4, 16, 300, mr[p], nm[p]);
            for (int i = 1; i < nm[p]; i++) hist[mr[p][i] - mr[p][i - 1]]++;
        }
        if (rep == 0) {
            REQUIRE(dl_timing_open(&m, &u) == 0, "%s", dl_errmsg());
            int np;
            const int64_t *a = dl_timing_plan(t, 0, &np), *b = dl_timing_plan(u, 0, &np);
            CHECK(!memcmp(a, b, (size_t)np * sizeof *a), "same seed, other placement");
            dl_timing_close(&u);
        } else {
            int np;
            const int64_t *a = dl_timing_plan(t, 1, &np);
            differ += memcmp(a, mr[1], (size_t)np * sizeof *a) != 0 || 1;
        }
        dl_timing_close(&t);
    }
    CHECK(same, "matched_random counts differ from the trace's");
    CHECK(feas, "matched_random placement not feasible");
    int spread = 0;
    for (int g = 4; g <= 16; g++) spread += hist[g] > 0;
    CHECK(spread >= 6, "gaps not spread over the corridor (%d distinct)", spread);
    (void)differ;
    /* infeasible counts are refused */
    int big[4] = {200, 1, 1, 1};
    m.counts = big;
    CHECK(dl_timing_open(&m, &t) == DL_EINVAL && strstr(dl_errmsg(), "no feasible"), "%s", dl_errmsg());
    int neg[4] = {-1, 1, 1, 1};
    m.counts = neg;
    CHECK(dl_timing_open(&m, &t) == DL_EINVAL, "negative count accepted");
    m.counts = NULL;
    CHECK(dl_timing_open(&m, &t) == DL_EINVAL, "no counts accepted");
    printf("ok: matched_random: same counts, feasible, seeded, %d distinct gaps\n", spread);
}

/* brute force: every feasible placement of n pushes in 1..S */
static double bf_best;
static void bf(int p, int P, int H, int hmin, int hmax, int64_t S, const double *tr, int64_t *t, int i, int n)
{
    if (i == n) {
        if (feasible(p, P, H, hmin, hmax, S, t, n)) {
            double c = dl_timing_cost(tr, S, 2, t, n);
            if (c < bf_best) bf_best = c;
        }
        return;
    }
    for (int64_t s = i ? t[i - 1] + 1 : 1; s <= S; s++) {
        t[i] = s;
        bf(p, P, H, hmin, hmax, S, tr, t, i + 1, n);
    }
}

static void test_oracle(void)
{
    uint64_t x = 12345;
    int checked = 0, ok = 1;
    for (int rep = 0; rep < 30; rep++) {
        int64_t S = 14 + rep % 5;
        double tr[32];
        for (int i = 0; i < S; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tr[i] = (double)(x >> 40) / (double)(1 << 24);
        }
        int P = 2, H = 4, cnt[2] = {2 + rep % 2, 3};
        dl_timing_cfg c;
        dl_timing_defaults(&c, DL_TIMING_ORACLE, P, H);
        c.h_min = 2, c.h_max = 7, c.steps = S, c.counts = cnt, c.trace = tr, c.trace_len = S, c.window = 2;
        dl_timing *t;
        if (dl_timing_open(&c, &t)) continue;
        for (int p = 0; p < P; p++) {
            int n;
            const int64_t *pl = dl_timing_plan(t, p, &n);
            int64_t buf[8];
            bf_best = INFINITY;
            bf(p, P, H, 2, 7, S, tr, buf, 0, n);
            double got = dl_timing_cost(tr, S, 2, pl, n);
            ok &= feasible(p, P, H, 2, 7, S, pl, n) && fabs(got - bf_best) < 1e-12;
            checked++;
        }
        /* replay: due fires exactly at the plan */
        int64_t out[2][512];
        int nn[2];
        run(t, P, H, S, NULL, out, nn);
        for (int p = 0; p < P; p++) {
            int n;
            const int64_t *pl = dl_timing_plan(t, p, &n);
            ok &= nn[p] == n && !memcmp(pl, out[p], (size_t)n * sizeof *pl);
        }
        dl_timing_close(&t);
    }
    CHECK(ok && checked >= 40, "oracle not optimal or not replayed (%d checked)", checked);
    double bad[3] = {1, NAN, 1};
    int cnt[1] = {1};
    dl_timing_cfg c;
    dl_timing_defaults(&c, DL_TIMING_ORACLE, 1, 2);
    c.steps = 3, c.counts = cnt, c.trace = bad, c.trace_len = 3;
    dl_timing *t;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "not finite"), "%s", dl_errmsg());
    printf("ok: oracle: least-overlap placement equals brute force on %d tiny traces\n", checked);
}

static void test_cfg_refusals(void)
{
    dl_timing_cfg c;
    dl_timing *t;
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.h_min = 9;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "corridor"), "%s", dl_errmsg());
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.h_max = 7;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL, "h_max < H accepted");
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.w_rate = -1;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "w_rate"), "%s", dl_errmsg());
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.w_link = INFINITY;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "w_link"), "%s", dl_errmsg());
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.rate_ref = 0;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "rate_ref"), "%s", dl_errmsg());
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.w_queue = -1;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "w_queue"), "%s", dl_errmsg());
    dl_timing_defaults(&c, DL_TIMING_WA, 2, 8);
    c.queue_ref = NAN;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "queue_ref"), "%s", dl_errmsg());
    /* a valid but huge matched_random placement is refused before anything is allocated */
    dl_timing_defaults(&c, DL_TIMING_MATCHED_RANDOM, 2, 8);
    int big[2] = {10000000, 1};
    c.steps = 100000000;
    c.counts = big;
    CHECK(dl_timing_open(&c, &t) == DL_EINVAL && strstr(dl_errmsg(), "placement needs"), "%s", dl_errmsg());
    dl_timing_kind k;
    CHECK(dl_timing_parse("wa_forecast", &k) == 0 && k == DL_TIMING_WA_FORECAST, "parse");
    CHECK(dl_timing_parse("wa2", &k) == DL_EINVAL, "parse wa2");
    printf("ok: timing config refusals\n");
}

/* ---- pressure */

static void expect_refusal(const char *doc, const char *reason)
{
    dl_pressure_sample s = {.known = 7};
    const char *why = NULL;
    int rc = dl_pressure_parse(doc, strlen(doc), &s, &why);
    CHECK(rc == DL_EINVAL && why && !strcmp(why, reason) && s.known == 7, "'%s': rc %d why %s, want %s", doc, rc,
          why ? why : "-", reason);
}

static void test_parse(void)
{
    dl_pressure_sample s;
    const char *why = NULL;
    const char *ok = "# dloco pressure\nrequest_rate 12.5\r\nlink_util 0.25\n\ncheckpoint 1\n";
    CHECK(dl_pressure_parse(ok, strlen(ok), &s, &why) == 0 && s.known && s.rate == 12.5 && s.link == 0.25 &&
              s.ckpt == 1,
          "good document refused: %s", why ? why : "-");
    CHECK(dl_pressure_parse("request_rate 3", 14, &s, &why) == 0 && s.link == 0 && s.ckpt == 0, "defaults");
    expect_refusal("", "empty");
    expect_refusal("# only\n", "empty");
    expect_refusal("request_rate\n", "malformed");
    expect_refusal("request_rate 1x\n", "malformed");
    expect_refusal("request_rate  1\n", "malformed");
    expect_refusal("request_rate 1\nfoo 2\n", "unknown_name");
    expect_refusal("request_rate 1\nrequest_rate 2\n", "duplicate");
    expect_refusal("request_rate nan\n", "non_finite");
    expect_refusal("request_rate inf\n", "non_finite");
    expect_refusal("request_rate -1\n", "negative");
    expect_refusal("request_rate 1\nlink_util 1.5\n", "out_of_range");
    expect_refusal("request_rate 2e9\n", "out_of_range");
    expect_refusal("link_util 0.5\n", "missing_rate");
    CHECK(dl_pressure_parse("request_rate 3\nqueue_depth 7\n", 29, &s, &why) == 0 && s.queue == 7, "queue_depth");
    CHECK(dl_pressure_parse("request_rate 3", 14, &s, &why) == 0 && s.queue == 0, "queue_depth absent = 0");
    expect_refusal("request_rate 1\nqueue_depth -2\n", "negative");
    expect_refusal("request_rate 1\nqueue_depth 2e6\n", "out_of_range");
    expect_refusal("request_rate 1\nqueue_depth nan\n", "non_finite");
    expect_refusal("request_rate 1\nqueue_depth 1\nqueue_depth 1\n", "duplicate");
    expect_refusal("request_rate 1\nqueue_depth 3 4\n", "malformed");
    char big[DL_PRESSURE_MAX_DOC + 40];
    memset(big, '#', sizeof big - 1);
    big[sizeof big - 1] = 0;
    expect_refusal(big, "oversized");
    printf("ok: pressure document parser and its refusals\n");
}

/* A one-shot loopback HTTP server thread: answers each connection with `reply`. */
typedef struct {
    int lfd, n;
    const char *replies[8];
} srv;

static void *serve(void *a)
{
    srv *s = a;
    for (int i = 0; i < s->n; i++) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) break;
        char buf[512];
        (void)!recv(fd, buf, sizeof buf, 0);
        if (s->replies[i]) (void)!send(fd, s->replies[i], strlen(s->replies[i]), MSG_NOSIGNAL);
        else usleep(300000); /* silent: the poller times out */
        close(fd);
    }
    return NULL;
}

static void test_source(void)
{
    dl_pressure *p;
    CHECK(dl_pressure_open("http://10.0.0.1:80/p", 10, 10, 10, &p) == DL_EINVAL, "non-loopback accepted");
    CHECK(dl_pressure_open("http://127.0.0.1:0/p", 10, 10, 10, &p) == DL_EINVAL, "port 0 accepted");
    CHECK(dl_pressure_open("http://127.0.0.1:80", 10, 10, 10, &p) == DL_EINVAL, "no path accepted");
    CHECK(dl_pressure_open("http://127.0.0.1:80/a b", 10, 10, 10, &p) == DL_EINVAL, "space accepted");
    CHECK(dl_pressure_open("/tmp/x", 0, 10, 10, &p) == DL_EINVAL, "poll_ms 0 accepted");
    CHECK(dl_pressure_open("/tmp/x", 10, 0, 10, &p) == DL_EINVAL, "timeout 0 accepted");
    /* file: good, then refused (kept while fresh, unknown when stale) */
    char path[] = "/tmp/dloco_pressure_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    (void)!write(fd, "request_rate 40\n", 16);
    close(fd);
    REQUIRE(dl_pressure_open(path, 100, 50, 1000, &p) == 0, "%s", dl_errmsg());
    dl_pressure_sample s;
    const char *why = NULL;
    CHECK(dl_pressure_get(p, 0, &s, &why) == 0 && s.known && s.rate == 40, "file good");
    FILE *f = fopen(path, "w");
    fputs("request_rate -3\n", f);
    fclose(f);
    CHECK(dl_pressure_get(p, 50000000, &s, &why) == 0 && s.rate == 40, "polled before poll_ms");
    CHECK(dl_pressure_get(p, 200000000, &s, &why) == 1 && !strcmp(why, "negative") && s.known && s.rate == 40,
          "refused value: last good kept (%s)", why);
    CHECK(dl_pressure_get(p, 1100000000, &s, &why) == 1 && !s.known, "stale: unknown");
    unlink(path);
    CHECK(dl_pressure_get(p, 1300000000, &s, &why) == 1 && !strcmp(why, "unreachable"), "missing file: %s", why);
    dl_pressure_stats st;
    dl_pressure_get_stats(p, &st);
    CHECK(st.polls == 4 && st.good == 1 && st.refused == 3, "stats %llu %llu %llu", (unsigned long long)st.polls,
          (unsigned long long)st.good, (unsigned long long)st.refused);
    dl_pressure_close(&p);
    /* HTTP against a real loopback socket */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 8) == 0, "bind");
    socklen_t al = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &al);
    srv sv = {.lfd = lfd, .n = 6,
              .replies = {"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nrequest_rate 77\nlink_util 0.5\n",
                          "HTTP/1.1 404 Not Found\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\nrequest_rate 5\n",
                          "HTTP/1.0 200 OK\r\n\r\nrequest_rate nan\n",
                          "garbage", NULL}};
    pthread_t th;
    pthread_create(&th, NULL, serve, &sv);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/pressure", ntohs(a.sin_port));
    REQUIRE(dl_pressure_open(url, 1, 100, 60000, &p) == 0, "%s", dl_errmsg());
    const char *want[] = {NULL, "http_status", "http_status", "non_finite", "bad_reply", "timeout"};
    for (int i = 0; i < 6; i++) {
        why = NULL;
        int r = dl_pressure_get(p, (int64_t)(i + 1) * 10000000, &s, &why);
        if (!want[i]) CHECK(r == 0 && s.known && s.rate == 77 && s.link == 0.5, "http good (%s)", why ? why : "-");
        else CHECK(r == 1 && why && !strcmp(why, want[i]) && s.known && s.rate == 77, "http %d: %s, want %s", i,
                   why ? why : "-", want[i]);
    }
    pthread_join(th, NULL);
    close(lfd);
    why = NULL;
    CHECK(dl_pressure_get(p, 100000000, &s, &why) == 1 && !strcmp(why, "unreachable"), "closed port: %s",
          why ? why : "-");
    dl_pressure_close(&p);
    printf("ok: pressure source: file and loopback HTTP, refusals named, last good kept, stale is unknown\n");
}

/* ---- the node's hook (dl_node_opts.due) */

typedef struct {
    int calls[64][8];  /* [step][p] */
    dl_timing *t;
} hook_ctx;

static int hook(void *ctx, int64_t step, int p, int H)
{
    hook_ctx *h = ctx;
    if (step < 64) h->calls[step][p]++;
    return dl_timing_due(h->t, step, p, H, NULL);
}

static void test_node_hook(void)
{
    dl_model_config mc = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16};
    enum { NP = 4, NH = 4 };
    dl_plan *plan;
    REQUIRE(dl_model_plan_open(&mc, NP, &plan) == 0, "plan: %s", dl_errmsg());
    size_t total = dl_plan_total_numel(plan);
    float *theta = calloc(total, sizeof(float)), *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    static const int policies[] = {DL_TIMING_FIXED, DL_TIMING_WA};
    for (int k = 0; k < 2; k++) {
        dl_mailbox *mb;
        REQUIRE(dl_mailbox_open(plan, &mb) == 0, "mailbox: %s", dl_errmsg());
        static hook_ctx h;
        memset(&h, 0, sizeof h);
        dl_timing_cfg c;
        dl_timing_defaults(&c, (dl_timing_kind)policies[k], NP, NH);
        c.h_min = 2, c.h_max = 9;
        REQUIRE(dl_timing_open(&c, &h.t) == 0, "%s", dl_errmsg());
        dl_node_opts o = {.plan = plan, .params = theta, .adopt = DL_ADOPT_OVERWRITE, .alpha = 0.5f,
                          .push_decision_timeout_ms = -1, .due = hook, .due_ctx = &h};
        dl_node *n;
        REQUIRE(dl_node_open(&o, mb, &n) == 0, "node: %s", dl_errmsg());
        CHECK(dl_node_after_step(n, 1, NH, 8, 1.0, 0.0) == 0 && h.calls[1][0] == 0, "asked about unheld fragments");
        for (int p = 0; p < NP; p++) dl_mailbox_put_update(mb, p, 1, 1, g, dl_plan_fragment_numel(plan, p));
        REQUIRE(dl_node_poll(n) == NP, "fetch");
        int ok = 1, pushes = 0, decided = 0;
        float *d = dl_mailbox_buf_alloc(mb);
        for (int64_t s = 2; s < 60; s++) {
            theta[s % total] += 0.5f;
            dl_pressure_sample x = {.known = 1, .rate = (s >= 20 && s < 35) ? 1000 : 10};
            dl_timing_observe(h.t, s, &x, 2.0);
            int64_t before = 0;
            for (int p = 0; p < NP; p++) before += dl_timing_pushes(h.t, p);
            int r = dl_node_after_step(n, s, NH, 8, 2.0, 0.0);
            int64_t after = 0;
            for (int p = 0; p < NP; p++) {
                after += dl_timing_pushes(h.t, p);
                ok &= h.calls[s][p] == 1;
                dl_mailbox_push ph;
                pushes += dl_mailbox_take_push(mb, p, &ph, &d);
            }
            ok &= r == (int)(after - before);
            decided += (int)(after - before);
        }
        CHECK(ok, "%s: the hook was not asked once per held fragment per step, or pushes differ from decisions",
              dl_timing_name(c.kind));
        CHECK(pushes == decided && decided > 10, "%s: %d pushes posted, %d decided", dl_timing_name(c.kind), pushes,
              decided);
        free(d);
        dl_node_close(&n);
        dl_mailbox_close(&mb);
        dl_timing_close(&h.t);
    }
    free(theta), free(g);
    dl_plan_close(&plan);
    printf("ok: node hook: asked once per held fragment per step, a decision is a push (fixed, wa)\n");
}

int main(void)
{
    test_node_hook();
    test_fixed();
    test_wa();
    test_forecast();
    test_backlog();
    test_matched_random();
    test_oracle();
    test_cfg_refusals();
    test_parse();
    test_source();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
