/* Tests for learner/node.c and the comms mailbox, without any network: push deltas, schedule, counters, coalescing,
 * version ordering, adopt modes vs hand-computed values, the host parameter interface, deferred vs immediate pushes. */
#include "learner/node.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/model.h"
#include "core/plan.h"
#include "learner/comms.h"
#include "learner/ef.h"
#include "learner/mailbox.h"

#include "tests/check.h"
#include "tests/push_pair.h"

// ---------------------------------------------------------------------------
// fixture: a tiny GPT's tensor table split into P = 4 fragments, a parameter
// buffer the test "trains" itself, and an unstarted comms mailbox.
//
// All values are multiples of 1/8 below 2^10, so every sum, difference and
// product by 0.25 / 0.75 below is exact in fp32 and the expected values can
// be compared with ==, whatever the compiler does with FMA contraction.

#define P 4
#define H 4
#define TOK 32 /* tokens per step */

static dl_model_config CFG = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16};
static dl_plan *plan;
static size_t total;

static float dyadic(long k) { return (float)(k % 129 - 64) / 8.0f; }

static void global_of(int p, uint64_t version, float *g)
{
    size_t n = dl_plan_fragment_numel(plan, p);
    for (size_t i = 0; i < n; i++) g[i] = dyadic((long)(i * 13 + (size_t)p * 5 + version * 11));
}

/* One simulated inner step: every parameter moves by a small dyadic amount. */
static void train_step(float *theta, int64_t step)
{
    for (size_t i = 0; i < total; i++) theta[i] += (float)((long)(i * 7 + (size_t)step * 3) % 5 - 2) / 8.0f;
}

/* Independent statement of the schedule (core/plan.h): due when step > 0 and
 * (step - p*H/P) % H == 0. */
static int due(int64_t step, int p) { return step > 0 && (step - (p * H) / P) % H == 0; }

static float *gather(int p, const float *theta)
{
    float *out = calloc(dl_plan_fragment_numel(plan, p), sizeof(float));
    dl_plan_gather(plan, p, theta, out);
    return out;
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static dl_mailbox *open_mailbox(void)
{
    dl_mailbox *c = NULL;
    REQUIRE(dl_mailbox_open(plan, &c) == 0, "dl_mailbox_open: %s", dl_errmsg());
    return c;
}

/* Fresh node in `mode` holding version 1 of every fragment (a fetch). */
static void setup(int mode, float alpha, float *theta, dl_mailbox **c, dl_node **n)
{
    *c = open_mailbox();
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = mode, .alpha = alpha};
    REQUIRE(dl_node_open(&o, *c, n) == 0, "dl_node_open: %s", dl_errmsg());
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, 1, g);
        dl_mailbox_put_update(*c, p, 1, 1, g, dl_plan_fragment_numel(plan, p));
    }
    free(g);
    REQUIRE(dl_node_poll(*n) == P, "initial fetch adopted");
}

// ---------------------------------------------------------------------------

static void test_fetch_and_pushes(void)
{
    float *theta = calloc(total, sizeof(float));
    for (size_t i = 0; i < total; i++) theta[i] = 99.0f; /* the learner's own init */
    dl_mailbox *c = open_mailbox();
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = DL_ADOPT_OVERWRITE, .alpha = 0.5f};
    dl_node *n = NULL;
    REQUIRE(dl_node_open(&o, c, &n) == 0, "open: %s", dl_errmsg());

    /* nothing held: no counters, no pushes */
    CHECK(!dl_node_holds_all(n), "fresh node holds nothing");
    CHECK(dl_node_after_step(n, 1, H, TOK, 1.0, 0.0) == 0, "a fresh node pushes nothing");
    for (int p = 0; p < P; p++) CHECK(dl_node_steps(n, p) == 0, "fragment %d counted a step before holding it", p);

    /* initial fetch: fragments arrive one by one, with different versions */
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, 10 + (uint64_t)p, g);
        CHECK(dl_mailbox_put_update(c, p, 10 + (uint64_t)p, 1, g, dl_plan_fragment_numel(plan, p)) == 1, "put");
        CHECK(dl_node_poll(n) == 1, "fetch reply %d adopted at the step boundary", p);
        CHECK(dl_node_holds_all(n) == (p == P - 1), "holds_all after %d of %d", p + 1, P);
    }
    for (int p = 0; p < P; p++) {
        global_of(p, 10 + (uint64_t)p, g);
        float *th = gather(p, theta);
        size_t k = dl_plan_fragment_numel(plan, p);
        CHECK(same(th, g, k), "theta_%d = global after the fetch", p);
        CHECK(same(dl_node_base(n, p), g, k), "base_%d = global after the fetch", p);
        CHECK(dl_node_version(n, p) == 10 + (uint64_t)p, "version_%d = %llu", p,
              (unsigned long long)dl_node_version(n, p));
        CHECK(dl_node_steps(n, p) == 0 && dl_node_tokens(n, p) == 0, "counters of %d start at 0", p);
        free(th);
    }
    for (size_t i = 0; i < total; i++) REQUIRE(theta[i] != 99.0f, "parameter %zu kept the local init", i);

    /* 2H steps: pushes exactly when due, delta = base - theta bit for bit,
     * counters since adopt, mean loss */
    float *d = dl_mailbox_buf_alloc(c);
    double loss_sum = 0;
    int npush = 0;
    for (int64_t s = 1; s <= 2 * H; s++) {
        train_step(theta, s);
        double loss = 3.0 + 0.125 * (double)s;
        loss_sum += loss;
        int want = 0;
        for (int p = 0; p < P; p++) want += due(s, p);
        CHECK(dl_node_after_step(n, s, H, TOK, loss, 0.0) == want, "step %lld: %d pushes due", (long long)s, want);
        for (int p = 0; p < P; p++) {
            dl_mailbox_push h;
            int got = dl_mailbox_take_push(c, p, &h, &d);
            CHECK(got == due(s, p), "step %lld fragment %d: pushed %d, due %d", (long long)s, p, got, due(s, p));
            if (!got) continue;
            npush++;
            size_t k = dl_plan_fragment_numel(plan, p);
            float *th = gather(p, theta);
            const float *base = dl_node_base(n, p);
            int exact = 1;
            for (size_t i = 0; i < k; i++) exact &= d[i] == base[i] - th[i];
            CHECK(exact, "push %d at step %lld: delta == base - theta exactly", p, (long long)s);
            CHECK(h.fragment == p && h.base_version == 10 + (uint64_t)p, "push header fragment/base_version");
            CHECK(h.steps == (uint64_t)s && h.tokens == (uint64_t)s * TOK,
                  "push %d at step %lld: steps %llu tokens %llu since adopt", p, (long long)s,
                  (unsigned long long)h.steps, (unsigned long long)h.tokens);
            CHECK(h.loss == loss_sum / (double)s, "push loss %g is the mean %g since adopt", h.loss,
                  loss_sum / (double)s);
            CHECK(!h.final, "scheduled push is not final");
            free(th);
        }
    }
    CHECK(npush == 2 * P, "every fragment pushed once per H steps: %d pushes in 2H steps", npush);
    for (int p = 0; p < P; p++)
        CHECK(dl_node_steps(n, p) == 2 * H && dl_node_tokens(n, p) == 2 * H * TOK, "counters of %d after 2H steps", p);

    /* coalescing: nobody takes pushes for 2H more steps */
    for (int64_t s = 2 * H + 1; s <= 4 * H; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 1.0, 0.0);
    }
    dl_node_stats ns;
    dl_node_get_stats(n, &ns);
    dl_mailbox_stats cs;
    dl_mailbox_get_stats(c, &cs);
    CHECK(ns.coalesced == P && cs.coalesced == P, "2 pushes per fragment, one queued: %llu / %llu coalesced",
          (unsigned long long)ns.coalesced, (unsigned long long)cs.coalesced);
    for (int p = 0; p < P; p++) {
        dl_mailbox_push h;
        CHECK(dl_mailbox_take_push(c, p, &h, &d) == 1, "one push of %d queued", p);
        int64_t last = 0;
        for (int64_t s = 2 * H + 1; s <= 4 * H; s++)
            if (due(s, p)) last = s;
        CHECK(h.steps == (uint64_t)last, "queued push of %d is the newest (steps %llu, want %lld)", p,
              (unsigned long long)h.steps, (long long)last);
        CHECK(dl_mailbox_take_push(c, p, &h, &d) == 0, "and only one");
    }

    /* version ordering: older and equal versions are ignored, newer adopted;
     * in the mailbox the newest version wins */
    const int p = 2;
    size_t k = dl_plan_fragment_numel(plan, p);
    float *before = malloc(total * sizeof(float));
    memcpy(before, theta, total * sizeof(float));
    global_of(p, 5, g);
    CHECK(dl_mailbox_put_update(c, p, 5, 0, g, k) == 1, "put v5");
    CHECK(dl_node_poll(n) == 0, "v5 < held v12 is ignored");
    global_of(p, 12, g);
    dl_mailbox_put_update(c, p, 12, 0, g, k);
    CHECK(dl_node_poll(n) == 0, "v12 == held v12 is ignored");
    CHECK(same(before, theta, total), "ignored updates leave theta alone");
    CHECK(dl_node_version(n, p) == 12, "version stays 12");
    dl_node_get_stats(n, &ns);
    CHECK(ns.ignored == 2, "2 ignored, got %llu", (unsigned long long)ns.ignored);

    global_of(p, 14, g);
    CHECK(dl_mailbox_put_update(c, p, 14, 0, g, k) == 1, "put v14");
    global_of(p, 13, g);
    CHECK(dl_mailbox_put_update(c, p, 13, 0, g, k) == 0, "v13 does not replace a waiting v14");
    global_of(p, 15, g);
    CHECK(dl_mailbox_put_update(c, p, 15, 0, g, k) == 1, "v15 replaces a waiting v14");
    uint64_t steps_before = dl_node_steps(n, p);
    CHECK(steps_before > 0, "fragment %d has progress", p);
    CHECK(dl_node_poll(n) == 1, "one adoption");
    CHECK(dl_node_version(n, p) == 15, "adopted v15, got %llu", (unsigned long long)dl_node_version(n, p));
    float *th = gather(p, theta);
    CHECK(same(th, g, k), "overwrite: theta = global v15");
    free(th);
    CHECK(dl_node_steps(n, p) == 0 && dl_node_tokens(n, p) == 0, "counters restart at adopt");
    for (int q = 0; q < P; q++) {
        if (q == p) continue;
        float *a = gather(q, theta), *b = gather(q, before);
        CHECK(same(a, b, dl_plan_fragment_numel(plan, q)), "adopting %d leaves fragment %d alone", p, q);
        free(a);
        free(b);
    }

    /* final flush: every fragment with steps > 0, marked final */
    int left_before = dl_mailbox_flush_pending(c);
    CHECK(left_before == 0, "no flush pending yet");
    CHECK(dl_node_flush(n) == P - 1, "flush pushes the %d fragments with progress, not the one just adopted", P - 1);
    CHECK(dl_mailbox_flush_pending(c) == P - 1, "flush pending %d", dl_mailbox_flush_pending(c));
    {
        /* the first final push to leave names every other fragment of the flush (Push.final_pending) */
        int q0 = p == 0 ? 1 : 0, want = 0, ok = 1;
        uint32_t pend[P];
        dl_mailbox_claim cl;
        REQUIRE(dl_mailbox_claim_push(c, q0, dl_clock_ns(), pend, &cl, &d) == 1, "claim the flush push of %d", q0);
        for (int q = 0; q < P; q++)
            if (q != p && q != q0) ok &= want < cl.n_pending && pend[want++] == (uint32_t)q;
        CHECK(ok && cl.n_pending == want && cl.pending == pend, "the flush push of %d names the %d others (%d)", q0,
              want, cl.n_pending);
        dl_mailbox_unclaim_push(c, q0, &cl, &d, 1); /* back in its slot */
    }
    for (int q = 0; q < P; q++) {
        dl_mailbox_push h;
        int got = dl_mailbox_take_push(c, q, &h, &d);
        CHECK(got == (q != p), "flush push of %d: %d", q, got);
        if (got) CHECK(h.final && h.steps == dl_node_steps(n, q), "flush push of %d is final with all its steps", q);
    }

    /* a forced update (fetch reply) rebases even onto an older version and
     * drops a queued push relative to the old base */
    train_step(theta, 100);
    dl_node_after_step(n, 4 * H + 1, H, TOK, 1.0, 0.0); /* fragment 1 due at step 17 */
    dl_mailbox_get_stats(c, &cs);
    uint64_t disc0 = cs.discarded;
    global_of(1, 3, g);
    dl_mailbox_put_update(c, 1, 3, 1, g, dl_plan_fragment_numel(plan, 1));
    CHECK(dl_node_poll(n) == 1, "forced update adopted");
    CHECK(dl_node_version(n, 1) == 3, "rebase to an older version: %llu", (unsigned long long)dl_node_version(n, 1));
    th = gather(1, theta);
    CHECK(same(th, g, dl_plan_fragment_numel(plan, 1)), "rebase: theta = global");
    free(th);
    dl_mailbox_push h;
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 0, "queued push of the old base dropped");
    dl_mailbox_get_stats(c, &cs);
    CHECK(cs.discarded == disc0 + 1, "discarded counted");
    dl_node_get_stats(n, &ns);
    CHECK(ns.rebased == P + 1, "rebases: %llu", (unsigned long long)ns.rebased);

    free(before);
    free(d);
    free(g);
    dl_node_close(&n);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    dl_mailbox_close(&c);
    free(theta);
    printf("ok: fetch, schedule, delta = base - theta exactly, counters, coalescing, version ordering, flush, "
           "rebase\n");
}

/* Adopt v2 of fragment p after `k` steps, given `pushed_at` (0 = no push). */
static void test_mode(int mode, const char *name)
{
    const float alpha = 0.25f;
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *c;
    dl_node *n;
    setup(mode, alpha, theta, &c, &n);
    const int p = 1; /* due at steps 1, 5, 9, ... */
    size_t k = dl_plan_fragment_numel(plan, p);
    float *g = calloc(k, sizeof(float));
    float *d = dl_mailbox_buf_alloc(c);

    /* 3 steps (push of p at step 1), then adopt v2 */
    for (int64_t s = 1; s <= 3; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 2.0, 0.0);
        if (s == 1) {
            dl_mailbox_push h;
            CHECK(dl_mailbox_take_push(c, p, &h, &d) == 1 && h.steps == 1, "%s: push of %d at step 1", name, p);
        }
    }
    float *at_push = NULL;
    { /* theta at the push = init + step 1 */
        float *t0 = calloc(total, sizeof(float));
        float *g1 = calloc(k, sizeof(float));
        global_of(p, 1, g1);
        dl_plan_scatter(plan, p, g1, t0);
        train_step(t0, 1);
        at_push = gather(p, t0);
        free(t0);
        free(g1);
    }
    float *before = gather(p, theta);
    global_of(p, 2, g);
    dl_mailbox_put_update(c, p, 2, 0, g, k);
    CHECK(dl_node_poll(n) == 1, "%s: v2 adopted", name);
    float *after = gather(p, theta);
    int exact = 1;
    for (size_t i = 0; i < k; i++) {
        float want = mode == DL_ADOPT_OVERWRITE ? g[i]
                     : mode == DL_ADOPT_MIX     ? alpha * before[i] + (1.0f - alpha) * g[i]
                                                : g[i] + (before[i] - at_push[i]);
        exact &= after[i] == want;
    }
    CHECK(exact, "%s: theta after adopt matches the hand-computed value", name);
    CHECK(same(dl_node_base(n, p), g, k), "%s: base = global", name);
    CHECK(dl_node_version(n, p) == 2, "%s: version 2", name);
    uint64_t want_steps = mode == DL_ADOPT_KEEP ? 2 : 0; /* keep: steps 2, 3 were made since the push */
    CHECK(dl_node_steps(n, p) == want_steps && dl_node_tokens(n, p) == want_steps * TOK,
          "%s: counters after adopt %llu/%llu, want %llu", name, (unsigned long long)dl_node_steps(n, p),
          (unsigned long long)dl_node_tokens(n, p), (unsigned long long)want_steps);
    /* other fragments keep their counters (3 steps) */
    CHECK(dl_node_steps(n, 0) == 3, "%s: fragment 0 still has 3 steps", name);

    /* the next push is relative to the new base and carries the counters */
    train_step(theta, 4);
    dl_node_after_step(n, 4, H, TOK, 2.0, 0.0);
    train_step(theta, 5);
    dl_node_after_step(n, 5, H, TOK, 2.0, 0.0); /* p due */
    dl_mailbox_push h;
    CHECK(dl_mailbox_take_push(c, p, &h, &d) == 1, "%s: push at step 5", name);
    float *th = gather(p, theta);
    exact = 1;
    for (size_t i = 0; i < k; i++) exact &= d[i] == g[i] - th[i];
    CHECK(exact, "%s: delta = new base - theta", name);
    CHECK(h.base_version == 2 && h.steps == want_steps + 2, "%s: push base %llu steps %llu", name,
          (unsigned long long)h.base_version, (unsigned long long)h.steps);

    if (mode == DL_ADOPT_KEEP) {
        /* an update with no push since the last adopt keeps everything since
         * the push at step 5: theta = g3 + (theta - theta_at_push5) */
        train_step(theta, 6);
        dl_node_after_step(n, 6, H, TOK, 2.0, 0.0);
        float *cur = gather(p, theta);
        float *g3 = calloc(k, sizeof(float));
        global_of(p, 3, g3);
        dl_mailbox_put_update(c, p, 3, 0, g3, k);
        dl_node_poll(n);
        float *a3 = gather(p, theta);
        exact = 1;
        for (size_t i = 0; i < k; i++) exact &= a3[i] == g3[i] + (cur[i] - th[i]);
        CHECK(exact, "keep: second adopt keeps the progress since the push");
        CHECK(dl_node_steps(n, p) == 1, "keep: 1 step since the push at 5, got %llu",
              (unsigned long long)dl_node_steps(n, p));
        /* and a third, without any push: progress since the last adopt too */
        train_step(theta, 7);
        dl_node_after_step(n, 7, H, TOK, 2.0, 0.0);
        float *cur2 = gather(p, theta);
        float *g4 = calloc(k, sizeof(float));
        global_of(p, 4, g4);
        dl_mailbox_put_update(c, p, 4, 0, g4, k);
        dl_node_poll(n);
        float *a4 = gather(p, theta);
        exact = 1;
        for (size_t i = 0; i < k; i++) exact &= a4[i] == g4[i] + (cur2[i] - g3[i]);
        CHECK(exact, "keep: adopt without a push since keeps progress since the last global");
        CHECK(dl_node_steps(n, p) == 2, "keep: counters since the push at 5: 2, got %llu",
              (unsigned long long)dl_node_steps(n, p));
        free(cur);
        free(g3);
        free(a3);
        free(cur2);
        free(g4);
        free(a4);
    }
    free(th);
    free(before);
    free(after);
    free(at_push);
    free(g);
    free(d);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    free(theta);
    printf("ok: adopt %s matches hand-computed parameters and counters\n", name);
}


// ---------------------------------------------------------------------------
// the host parameter interface: reads are gathers, apply is a*theta + b*in

static void test_host_model(void)
{
    float *theta = calloc(total, sizeof(float)), *want = calloc(total, sizeof(float));
    for (size_t i = 0; i < total; i++) theta[i] = dyadic((long)i * 3);
    dl_node_model *m = NULL;
    REQUIRE(dl_node_host_model_open(plan, theta, 1, &m) == 0, "host model: %s", dl_errmsg());
    CHECK(m->deferred == 1, "deferred flag kept");
    size_t kmax = dl_plan_max_fragment_numel(plan);
    float *g = calloc(kmax, sizeof(float));
    /* every read in flight at once: each keeps its own snapshot */
    for (int p = 0; p < P; p++) CHECK(m->read_begin(m->ctx, p) == 0, "read_begin %d", p);
    for (int p = 0; p < P; p++) {
        const float *snap = NULL;
        CHECK(m->read_end(m->ctx, p, &snap) == 0 && snap, "read_end %d", p);
        float *th = gather(p, theta);
        CHECK(same(snap, th, dl_plan_fragment_numel(plan, p)), "snapshot of %d == gather", p);
        free(th);
    }
    memcpy(want, theta, total * sizeof(float));
    for (int p = 0; p < P; p++) {
        size_t k = dl_plan_fragment_numel(plan, p);
        global_of(p, 7, g);
        float *th = gather(p, want);
        float a = p == 0 ? 0.0f : p == 1 ? 0.25f : 1.0f, b = p == 1 ? 0.75f : 1.0f;
        if (p == 3) b = 0.5f;
        for (size_t i = 0; i < k; i++) th[i] = a * th[i] + b * g[i]; /* exact: dyadic values */
        dl_plan_scatter(plan, p, th, want);
        free(th);
        if (p == 0) { /* a NaN in theta must not survive an overwrite */
            int ns;
            const dl_plan_span *sp = dl_plan_fragment_spans(plan, 0, &ns);
            theta[sp[0].src] = NAN;
        }
        CHECK(m->apply(m->ctx, p, a, b, g) == 0, "apply %d", p);
    }
    CHECK(same(theta, want, total), "apply (0,1) (0.25,0.75) (1,1) (1,0.5): theta matches hand-computed values");
    dl_node_host_model_close(&m);
    dl_node_host_model_close(&m);
    CHECK(m == NULL, "close NULLs");
    free(theta);
    free(want);
    free(g);
    printf("ok: host parameter interface: snapshots, apply for every (a, b), NaN does not survive overwrite\n");
}

// ---------------------------------------------------------------------------
// deferred pushes: a node over a deferred host model against a node over the
// same parameters pushing at once. Every deferred push must be the immediate
// push of the step before (same payload bits, same counters), posted one step
// later or when an adopt needs its fragment; a forced update drops it.


static void test_deferred(int mode, const char *name)
{
    float *ta = calloc(total, sizeof(float)), *tb = calloc(total, sizeof(float));
    dl_mailbox *ca = open_mailbox(), *cb = open_mailbox();
    dl_node_model *mb = NULL;
    REQUIRE(dl_node_host_model_open(plan, tb, 1, &mb) == 0, "host model: %s", dl_errmsg());
    dl_node_opts oa = {.plan = plan, .params = ta, .adopt = mode, .alpha = 0.25f};
    dl_node_opts ob = {.plan = plan, .model = mb, .adopt = mode, .alpha = 0.25f};
    dl_node *na = NULL, *nb = NULL;
    REQUIRE(dl_node_open(&oa, ca, &na) == 0 && dl_node_open(&ob, cb, &nb) == 0, "open: %s", dl_errmsg());
    for (int p = 0; p < P; p++) put_both(ca, cb, plan, global_of, p, 1, 1);
    REQUIRE(dl_node_poll(na) == P && dl_node_poll(nb) == P, "initial fetch");

    taken prev[P], cura[P], curb[P];
    for (int p = 0; p < P; p++) {
        prev[p].d = dl_mailbox_buf_alloc(ca);
        cura[p].d = dl_mailbox_buf_alloc(ca);
        curb[p].d = dl_mailbox_buf_alloc(cb);
        prev[p].got = 0;
    }
    const int adopt_at = H + 1, forced_at = 2 * H + 2; /* fragments 1 and 2 are due there */
    int compared = 0, bad = 0;
    for (int64_t s = 1; s <= 3 * H; s++) {
        train_step(ta, s);
        train_step(tb, s);
        double loss = 2.0 + 0.125 * (double)s;
        int ra = dl_node_after_step(na, s, H, TOK, loss, 0.0), rb = dl_node_after_step(nb, s, H, TOK, loss, 0.0);
        CHECK(ra == rb && ra >= 0, "step %lld: %d immediate pushes, %d deferred begun", (long long)s, ra, rb);
        take_all(ca, cura, P);
        take_all(cb, curb, P);
        for (int p = 0; p < P; p++) {
            if (!same_push(&prev[p], &curb[p], plan, p)) {
                bad++;
                CHECK(0, "%s step %lld: deferred push of %d (got %d, steps %llu) is not the immediate push of step "
                         "%lld (got %d, steps %llu)", name, (long long)s, p, curb[p].got,
                      (unsigned long long)curb[p].h.steps, (long long)s - 1, prev[p].got,
                      (unsigned long long)prev[p].h.steps);
            }
            compared += prev[p].got;
            /* the current step's pushes are in flight on b: nothing posted for them yet */
            taken t = prev[p];
            prev[p] = cura[p];
            cura[p] = t;
        }
        if (s == adopt_at || s == forced_at) {
            const int q = s == adopt_at ? 1 : 2, forced = s == forced_at;
            CHECK(prev[q].got, "fragment %d was due at step %lld", q, (long long)s);
            dl_node_stats before;
            dl_node_get_stats(nb, &before);
            put_both(ca, cb, plan, global_of, q, 5 + (uint64_t)s, forced);
            CHECK(dl_node_poll(na) == 1 && dl_node_poll(nb) == 1, "update of %d adopted by both", q);
            take_all(cb, curb, P);
            dl_node_stats after;
            dl_node_get_stats(nb, &after);
            if (!forced) {
                /* the adopt needed fragment q: its pending push was posted first */
                CHECK(same_push(&prev[q], &curb[q], plan, q), "%s: pending push of %d posted before the adopt", name, q);
                compared++;
            } else {
                CHECK(!curb[q].got && after.dropped == before.dropped + 1,
                      "%s: a forced update drops the pending push of %d (posted %d, dropped %llu)", name, q,
                      curb[q].got, (unsigned long long)after.dropped);
            }
            prev[q].got = 0;
            for (int p = 0; p < P; p++)
                if (p != q) CHECK(!curb[p].got, "no other push posted by the adopt of %d", q);
            CHECK(same(ta, tb, total), "%s: parameters identical after the %s adopt of %d", name,
                  forced ? "forced" : "regular", q);
            CHECK(dl_node_steps(na, q) == dl_node_steps(nb, q) && dl_node_tokens(na, q) == dl_node_tokens(nb, q),
                  "%s: counters of %d after adopt: %llu vs %llu", name, q, (unsigned long long)dl_node_steps(na, q),
                  (unsigned long long)dl_node_steps(nb, q));
        }
    }
    CHECK(compared >= 2 * P && bad == 0, "%s: %d deferred pushes compared, %d differ", name, compared, bad);
    /* flush: b completes the last step's push, then the final pushes replace it in the mailbox */
    int fa = dl_node_flush(na), fb = dl_node_flush(nb);
    CHECK(fa == fb && fa == P, "%s: flush %d vs %d final pushes", name, fa, fb);
    take_all(ca, cura, P);
    take_all(cb, curb, P);
    for (int p = 0; p < P; p++) CHECK(same_push(&cura[p], &curb[p], plan, p) && curb[p].h.final, "%s: final push of %d", name, p);
    CHECK(same(ta, tb, total), "%s: parameters identical at the end", name);
    for (int p = 0; p < P; p++) {
        free(prev[p].d);
        free(cura[p].d);
        free(curb[p].d);
    }
    dl_node_close(&na);
    dl_node_close(&nb);
    dl_node_host_model_close(&mb);
    dl_mailbox_close(&ca);
    dl_mailbox_close(&cb);
    free(ta);
    free(tb);
    printf("ok: deferred pushes (%s): %d pushes identical to the immediate ones one step later, posted early for an "
           "adopt, dropped for a rebase, flush\n", name, compared);
}

/* The hold rule without a socket: the test plays the session (claim, decide).
 * (a) a push due while the previous one is undecided is not made; once the
 * decision and the update came it carries only what is new; (b) a decision
 * that never comes releases the hold after push_decision_timeout_ms. */
static void test_hold(void)
{
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *c = open_mailbox();
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = DL_ADOPT_KEEP, .push_decision_timeout_ms = 50};
    dl_node *n = NULL;
    REQUIRE(dl_node_open(&o, c, &n) == 0, "open");
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, 1, g);
        dl_mailbox_put_update(c, p, 1, 1, g, dl_plan_fragment_numel(plan, p));
    }
    REQUIRE(dl_node_poll(n) == P, "fetched");
    float *d = dl_mailbox_buf_alloc(c);
    dl_mailbox_push h;
    dl_mailbox_claim cl;
    train_step(theta, 1);
    dl_node_after_step(n, 1, H, TOK, 1.0, 0.5); /* fragment 1 due */
    CHECK(dl_mailbox_claim_push(c, 1, dl_clock_ns(), NULL, &cl, &d) == 1 && cl.h.steps == 1, "push of step 1 sent");
    for (int64_t s = 2; s <= 5; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 1.0, 0.5);
        for (int p = 0; p < P; p++)
            if (p != 1) dl_mailbox_take_push(c, p, &h, &d);
    }
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 0 && dl_node_owes(n, 1), "(a) step 5: nothing posted, the push is owed");
    CHECK(dl_mailbox_decide(c, 1, DL_DECIDE_PENDING, 1, 0) == 0 && dl_mailbox_decide(c, 1, DL_DECIDE_ACCEPTED, 1, 1) == 1,
          "pooled, then accepted");
    CHECK(dl_mailbox_undecided(c, 1, NULL), "accepted without its update is still undecided");
    train_step(theta, 6);
    dl_node_after_step(n, 6, H, TOK, 1.0, 0.5);
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 0, "still held at step 6");
    global_of(1, 2, g);
    dl_mailbox_put_update(c, 1, 2, 0, g, dl_plan_fragment_numel(plan, 1));
    CHECK(dl_mailbox_undecided(c, 1, NULL), "an update waiting to be adopted holds too");
    CHECK(dl_node_poll(n) == 1 && !dl_mailbox_undecided(c, 1, NULL), "adopted: decided");
    train_step(theta, 7);
    dl_node_after_step(n, 7, H, TOK, 1.0, 0.5);
    float *want = calloc(dl_plan_fragment_numel(plan, 1), sizeof(float));
    dl_node_delta(n, 1, want);
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 1 && h.steps == 6 && h.tokens == 6 * TOK && h.base_version == 2 &&
              h.held == 1 && fabs(h.compute_s - 3.0) < 1e-12,
          "(a) the owed push: steps 2..7 only (%llu), base 2, compute_s %g", (unsigned long long)h.steps, h.compute_s);
    CHECK(same(d, want, dl_plan_fragment_numel(plan, 1)), "its delta = base - theta");
    /* (b) lost decision */
    int64_t now = dl_clock_ns();
    CHECK(dl_mailbox_claim_push(c, 1, now, NULL, &cl, &d) == 0, "nothing left to send");
    train_step(theta, 8);
    dl_node_after_step(n, 8, H, TOK, 1.0, 0.5);
    for (int p = 0; p < P; p++) dl_mailbox_take_push(c, p, &h, &d);
    train_step(theta, 9);
    dl_node_after_step(n, 9, H, TOK, 1.0, 0.5); /* fragment 1 due */
    REQUIRE(dl_mailbox_claim_push(c, 1, dl_clock_ns(), NULL, &cl, &d) == 1, "push of step 9 sent");
    dl_node_stats ns;
    for (int64_t s = 10; s <= 13; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 1.0, 0.5);
        for (int p = 0; p < P; p++)
            if (p != 1) dl_mailbox_take_push(c, p, &h, &d);
    }
    dl_node_get_stats(n, &ns);
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 0 && ns.hold_released == 0, "(b) held while the decision is due");
    struct timespec ts = {0, 60 * 1000000L};
    nanosleep(&ts, NULL);
    train_step(theta, 14);
    dl_node_after_step(n, 14, H, TOK, 1.0, 0.5);
    dl_node_get_stats(n, &ns);
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 1 && ns.hold_released == 1 && ns.held == 2,
          "(b) released after push_decision_timeout_ms: held %llu released %llu", (unsigned long long)ns.held,
          (unsigned long long)ns.hold_released);
    printf("ok: hold rule: no push while the previous one is undecided; the owed push carries only new progress; "
           "a lost decision releases after the timeout\n");
    free(want);
    free(d);
    free(g);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    free(theta);
}

// ---------------------------------------------------------------------------
// barrier: under a barrier policy (Welcome.policy sync / sync-elastic) a held
// push stops training in dl_node_barrier_wait until its predecessor is
// decided; a thread plays the session's late answer.

typedef struct {
    dl_mailbox *c;
    int p;
    uint64_t base, version;
    int delay_ms;
} late_answer;

static void *answer_late(void *arg)
{
    late_answer *a = arg;
    struct timespec ts = {0, a->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    global_of(a->p, a->version, g);
    dl_mailbox_decide(a->c, a->p, DL_DECIDE_ACCEPTED, a->base, 1);
    dl_mailbox_put_update(a->c, a->p, a->version, DL_UPDATE_NORMAL, g, dl_plan_fragment_numel(plan, a->p));
    free(g);
    return NULL;
}

/* Steps from..to: train, after_step, and the session takes every push but
 * fragment 1's (those are decided at once: they never hold). Returns the
 * number of barrier waits those steps made (none expected). */
static int steps_without_1(dl_node *n, dl_mailbox *c, float *theta, int64_t from, int64_t to, float **d)
{
    int waits = 0;
    dl_mailbox_push h;
    for (int64_t s = from; s <= to; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 1.0, 0.5);
        for (int p = 0; p < P; p++)
            if (p != 1) dl_mailbox_take_push(c, p, &h, d);
        dl_node_barrier bw;
        waits += dl_node_barrier_wait(n, NULL, &bw);
    }
    return waits;
}

static void test_barrier(int mode, const char *name)
{
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *c = open_mailbox();
    dl_node *n = NULL;
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = mode, .alpha = 0.5f, .push_decision_timeout_ms = 300};
    REQUIRE(dl_node_open(&o, c, &n) == 0, "open");
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, 1, g);
        dl_mailbox_put_update(c, p, 1, DL_UPDATE_FETCHED, g, dl_plan_fragment_numel(plan, p));
    }
    REQUIRE(dl_node_poll(n) == P, "fetched");
    float *d = dl_mailbox_buf_alloc(c);
    dl_mailbox_push h;
    dl_mailbox_claim cl;
    dl_node_barrier bw;
    dl_node_stats ns;

    /* decoupled (the default before any Welcome): a held push never waits */
    CHECK(!dl_mailbox_barrier(c), "no barrier before a Welcome");
    steps_without_1(n, c, theta, 1, 1, &d);
    REQUIRE(dl_mailbox_claim_push(c, 1, dl_clock_ns(), NULL, &cl, &d) == 1, "push of step 1 sent");
    CHECK(steps_without_1(n, c, theta, 2, 5, &d) == 0 && dl_node_owes(n, 1) && dl_node_barrier_blocked(n) == -1,
          "decoupled: step 5 owes fragment 1's push and goes on");
    dl_mailbox_set_policy(c, "decoupled");
    CHECK(!dl_mailbox_barrier(c) && dl_node_barrier_wait(n, NULL, &bw) == 0, "decoupled: no wait");

    /* sync: the owed push stops training until it is decided and adopted */
    dl_mailbox_set_policy(c, "sync");
    CHECK(dl_mailbox_barrier(c) && dl_node_barrier_blocked(n) == 1, "sync: fragment 1 blocks");
    REQUIRE(dl_mailbox_decide(c, 1, DL_DECIDE_PENDING, 1, 0) == 0, "pooled");
    late_answer a = {.c = c, .p = 1, .base = 1, .version = 2, .delay_ms = 40};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, answer_late, &a) == 0, "thread");
    int64_t t0 = dl_clock_ns();
    int w = dl_node_barrier_wait(n, NULL, &bw);
    double el = (double)(dl_clock_ns() - t0) * 1e-9;
    pthread_join(t, NULL);
    CHECK(w == 1 && bw.fragment == 1 && !strcmp(bw.end, "decided") && bw.waited_s >= 0.035 && bw.waited_s <= el,
          "sync: waited for the decision (%d, fragment %d, %s, %.3f s)", w, bw.fragment, bw.end ? bw.end : "-",
          bw.waited_s);
    CHECK(dl_node_version(n, 1) == 2 && !dl_node_owes(n, 1) && dl_node_barrier_blocked(n) == -1,
          "the update was adopted and the debt paid");
    int made = dl_mailbox_take_push(c, 1, &h, &d);
    if (mode == DL_ADOPT_KEEP)
        CHECK(made == 1 && h.steps == 4 && h.base_version == 2 && h.held == 1,
              "keep: the owed push (steps 2..5: %llu) went before the next step", (unsigned long long)h.steps);
    else
        CHECK(made == 0, "%s: the adopt took the progress; nothing owed is sent", name);
    dl_node_get_stats(n, &ns);
    CHECK(ns.barrier_waits == 1 && ns.barrier_wait_s == bw.waited_s, "counted: %llu waits, %.3f s",
          (unsigned long long)ns.barrier_waits, ns.barrier_wait_s);

    /* decided before the step boundary: no wait, the debt is settled at once all the same */
    CHECK(steps_without_1(n, c, theta, 6, 8, &d) == 0, "steps 6..8: nothing waits");
    train_step(theta, 9);
    dl_node_after_step(n, 9, H, TOK, 1.0, 0.5); /* fragment 1 due */
    REQUIRE(dl_mailbox_claim_push(c, 1, dl_clock_ns(), NULL, &cl, &d) == 1, "push of step 9 sent");
    CHECK(steps_without_1(n, c, theta, 10, 12, &d) == 0, "steps 10..12: nothing waits");
    train_step(theta, 13);
    dl_node_after_step(n, 13, H, TOK, 1.0, 0.5); /* fragment 1 due, held */
    CHECK(dl_node_owes(n, 1), "step 13: fragment 1 owed");
    REQUIRE(dl_mailbox_decide(c, 1, DL_DECIDE_PENDING, 2, 0) == 0, "pooled");
    a.base = 2;
    a.version = 3;
    a.delay_ms = 0;
    answer_late(&a);
    REQUIRE(dl_node_poll(n) == 1, "the update adopted at the step boundary");
    CHECK(dl_node_barrier_wait(n, NULL, &bw) == 0 && !dl_node_owes(n, 1), "decided in time: no wait, no debt");
    made = dl_mailbox_take_push(c, 1, &h, &d);
    if (mode == DL_ADOPT_KEEP)
        CHECK(made == 1 && h.base_version == 3 && h.held == 1 && h.steps == 4,
              "keep: the owed push (steps 10..13: %llu) went before the next step", (unsigned long long)h.steps);
    else
        CHECK(made == 0, "%s: nothing owed is sent", name);

    /* a stop ends the wait; the push stays owed */
    CHECK(steps_without_1(n, c, theta, 14, 16, &d) == 0, "steps 14..16: nothing waits");
    train_step(theta, 17);
    dl_node_after_step(n, 17, H, TOK, 1.0, 0.5); /* fragment 1 due */
    REQUIRE(dl_mailbox_claim_push(c, 1, dl_clock_ns(), NULL, &cl, &d) == 1, "push of step 17 sent");
    CHECK(steps_without_1(n, c, theta, 18, 20, &d) == 0, "steps 18..20: nothing waits");
    train_step(theta, 21);
    dl_node_after_step(n, 21, H, TOK, 1.0, 0.5); /* fragment 1 due, held */
    volatile sig_atomic_t stop = 1;
    CHECK(dl_node_barrier_wait(n, &stop, &bw) == 1 && !strcmp(bw.end, "signal") && dl_node_owes(n, 1) &&
              dl_node_barrier_blocked(n) == 1,
          "a stop ends the wait, the push still owed");
    /* a decision that never comes: released after push_decision_timeout_ms */
    CHECK(dl_node_barrier_wait(n, NULL, &bw) == 1 && !strcmp(bw.end, "released") && !dl_node_owes(n, 1) &&
              dl_mailbox_take_push(c, 1, &h, &d) == 1 && h.held == 1,
          "a lost decision: released (%s after %.3f s), the push made", bw.end, bw.waited_s);
    dl_node_get_stats(n, &ns);
    CHECK(ns.barrier_waits == 3 && ns.hold_released == 1, "3 waits, 1 release counted once (%llu)",
          (unsigned long long)ns.hold_released);
    dl_mailbox_set_policy(c, "sync-elastic");
    CHECK(dl_mailbox_barrier(c), "sync-elastic is a barrier too");
    dl_mailbox_set_policy(c, NULL);
    CHECK(!dl_mailbox_barrier(c), "a Welcome without a policy is not");
    printf("ok: barrier (%s): a held push stops training until decided and adopted, then goes at once (as one "
           "decided before the step boundary does); a stop ends the wait, the decision timeout releases it; decoupled never waits\n", name);
    free(d);
    free(g);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    free(theta);
}

// ---------------------------------------------------------------------------
// trust: an update with a non-finite value, or farther from the learner's own
// parameters than update_max_ratio allows, changes nothing and asks the
// serving session for a fresh fetch (dl_mailbox_take_refetches), counting the
// refusals of the fragment in a row until its next adopt.

static int refetch_of(dl_mailbox *c, int p)
{
    int frags[P] = {0, 1, 2, 3}, k[P];
    dl_mailbox_take_refetches(c, frags, P, k);
    return k[p];
}

static void test_trust(void)
{
    float *theta = calloc(total, sizeof(float));
    for (size_t i = 0; i < total; i++) theta[i] = dyadic((long)i * 3); /* the learner's own init */
    float *theta0 = malloc(total * sizeof(float));
    memcpy(theta0, theta, total * sizeof(float));
    dl_mailbox *c = open_mailbox();
    const double R = 10;
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = DL_ADOPT_OVERWRITE, .update_max_ratio = R};
    dl_node *n = NULL;
    REQUIRE(dl_node_open(&o, c, &n) == 0, "open: %s", dl_errmsg());
    size_t k0 = dl_plan_fragment_numel(plan, 0), k1 = dl_plan_fragment_numel(plan, 1);
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));

    /* a fetch reply with one NaN, into a fresh learner: refused, theta untouched, refetch asked */
    global_of(0, 1, g);
    g[k0 / 2] = NAN;
    dl_mailbox_put_update(c, 0, 1, DL_UPDATE_FETCHED, g, k0);
    CHECK(dl_node_poll(n) == 0 && !dl_node_held(n, 0), "a NaN fetch reply is not adopted");
    CHECK(same(theta, theta0, total), "theta untouched by the refused fetch");
    CHECK(refetch_of(c, 0) == 1 && refetch_of(c, 0) == 0, "one fresh fetch of fragment 0 asked for (and taken once)");
    /* the refetch brings a good one */
    for (int p = 0; p < P; p++) {
        global_of(p, 1, g);
        dl_mailbox_put_update(c, p, 1, DL_UPDATE_FETCHED, g, dl_plan_fragment_numel(plan, p));
    }
    CHECK(dl_node_poll(n) == P && dl_node_holds_all(n), "the fetched fragments are adopted");

    /* a merge result of 1e38s (finite): refused by the ratio, twice in a row */
    float *base1 = malloc(k1 * sizeof(float)), *th1 = gather(1, theta);
    memcpy(base1, dl_node_base(n, 1), k1 * sizeof(float));
    for (int r = 1; r <= 2; r++) {
        for (size_t i = 0; i < k1; i++) g[i] = 1e38f;
        dl_mailbox_put_update(c, 1, 2, DL_UPDATE_NORMAL, g, k1);
        CHECK(dl_node_poll(n) == 0, "1e38 update refused (%d)", r);
        CHECK(refetch_of(c, 1) == r, "refusal %d in a row of fragment 1", r);
    }
    float *now1 = gather(1, theta);
    CHECK(dl_node_version(n, 1) == 1 && same(dl_node_base(n, 1), base1, k1) && same(now1, th1, k1),
          "version, base and theta of fragment 1 unchanged");
    free(now1);
    /* the bound: r * (||own|| + 0.1 sqrt(n)) with own = base_1; a uniform
     * shift of 0.99 of it is adopted, of 1.01 refused */
    double o2 = 0;
    for (size_t i = 0; i < k1; i++) o2 += (double)base1[i] * base1[i];
    double bound = R * (sqrt(o2) + DL_NODE_RATIO_FLOOR_RMS * sqrt((double)k1)), per = bound / sqrt((double)k1);
    for (size_t i = 0; i < k1; i++) g[i] = base1[i] + (float)(1.01 * per);
    dl_mailbox_put_update(c, 1, 2, DL_UPDATE_NORMAL, g, k1);
    CHECK(dl_node_poll(n) == 0 && refetch_of(c, 1) == 3, "a distance of 1.01 x the bound is refused (3rd in a row)");
    for (size_t i = 0; i < k1; i++) g[i] = base1[i] + (float)(0.99 * per);
    dl_mailbox_put_update(c, 1, 2, DL_UPDATE_NORMAL, g, k1);
    CHECK(dl_node_poll(n) == 1 && dl_node_version(n, 1) == 2, "0.99 x the bound is adopted");
    CHECK(refetch_of(c, 1) == 0, "an adopt asks for nothing");
    for (size_t i = 0; i < k1; i++) g[i] = INFINITY;
    dl_mailbox_put_update(c, 1, 3, DL_UPDATE_REBASE, g, k1);
    CHECK(dl_node_poll(n) == 0 && refetch_of(c, 1) == 1, "an inf rebase is refused; the adopt restarted the count");
    /* an ignored update (not newer) is ignored, not refused, whatever it holds */
    for (size_t i = 0; i < k1; i++) g[i] = NAN;
    dl_mailbox_put_update(c, 1, 1, DL_UPDATE_NORMAL, g, k1);
    CHECK(dl_node_poll(n) == 0 && refetch_of(c, 1) == 0, "an old update is only ignored");
    dl_node_stats st;
    dl_node_get_stats(n, &st);
    CHECK(st.refused == 5 && st.ignored == 1, "refused %llu, ignored %llu", (unsigned long long)st.refused,
          (unsigned long long)st.ignored);
    dl_node_close(&n);

    /* update_max_ratio 0: no distance bound, finiteness still checked */
    o.update_max_ratio = 0;
    REQUIRE(dl_node_open(&o, c, &n) == 0, "open");
    for (size_t i = 0; i < k0; i++) g[i] = 1e38f;
    CHECK(dl_node_adopt(n, 0, 5, DL_UPDATE_FETCHED, g) == 1, "ratio 0: 1e38 adopted");
    g[0] = NAN;
    CHECK(dl_node_adopt(n, 0, 6, DL_UPDATE_FETCHED, g) == 0 && dl_node_version(n, 0) == 5, "ratio 0: NaN refused");
    dl_node_close(&n);
    o.update_max_ratio = -1;
    CHECK(dl_node_open(&o, c, &n) == DL_EINVAL && !n, "negative update_max_ratio refused");
    o.update_max_ratio = INFINITY;
    CHECK(dl_node_open(&o, c, &n) == DL_EINVAL && !n, "infinite update_max_ratio refused");
    free(base1);
    free(th1);
    free(g);
    free(theta0);
    dl_mailbox_close(&c);
    free(theta);
    printf("ok: trust: NaN / inf / 1e38 updates and fetches refused (theta, base, version untouched), refetch asked, "
           "refusals counted in a row; the ratio bound is exact; 0 turns it off\n");
}

static void test_bad_input(void)
{
    dl_mailbox *mb = open_mailbox();
    dl_comms_opts co = {.mailbox = mb, .endpoint = "tcp://127.0.0.1:1", .learner_id = "bad id", .run_id = "t",
                        .plan = plan};
    dl_comms *c = NULL;
    CHECK(dl_comms_open(&co, &c) == DL_EINVAL && c == NULL, "learner id with a space refused");
    CHECK(strstr(dl_errmsg(), "bad id") != NULL, "message names the id: %s", dl_errmsg());
    co.learner_id = "";
    CHECK(dl_comms_open(&co, &c) == DL_EINVAL, "empty learner id refused");
    char longid[80];
    memset(longid, 'a', 65);
    longid[65] = 0;
    co.learner_id = longid;
    CHECK(dl_comms_open(&co, &c) == DL_EINVAL, "65-byte learner id refused");
    longid[64] = 0;
    CHECK(dl_comms_id_ok(longid) && dl_comms_id_ok("a.B_c-9") && !dl_comms_id_ok("a/b"), "id rule");
    co.learner_id = "ok";
    int two[2] = {1, 1};
    co.fragments = two;
    co.n_fragments = 2;
    CHECK(dl_comms_open(&co, &c) == DL_EINVAL, "a fragment listed twice refused");
    co.fragments = NULL;
    co.hello_retry_ms = 50; /* at or below poll_max_ms (100) */
    CHECK(dl_comms_open(&co, &c) == DL_EINVAL && strstr(dl_errmsg(), "poll_max_ms < hello_retry_ms"),
          "hello retry below the poll period refused: %s", dl_errmsg());
    co.hello_retry_ms = 0;
    REQUIRE(dl_comms_open(&co, &c) == 0, "open");
    float theta[1];
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = 7, .alpha = 0.5f};
    dl_node *n = NULL;
    CHECK(dl_node_open(&o, mb, &n) == DL_EINVAL && !n, "unknown adopt mode refused");
    o.adopt = DL_ADOPT_MIX;
    o.alpha = 1.5f;
    CHECK(dl_node_open(&o, mb, &n) == DL_EINVAL && !n, "alpha 1.5 refused");
    CHECK(dl_comms_state(c, NULL, 0) == DL_COMMS_IDLE, "unstarted mailbox is idle");
    dl_comms *c2 = NULL;
    snprintf(co.curve_server, sizeof co.curve_server, "%s", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
    CHECK(dl_comms_open(&co, &c2) == DL_EINVAL && !c2 && strstr(dl_errmsg(), "1 of the 3"),
          "a CURVE server key without a key pair refused: %s", dl_errmsg());
    snprintf(co.curve_public, sizeof co.curve_public, "%s", "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID");
    snprintf(co.curve_secret, sizeof co.curve_secret, "%s", "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs");
    co.curve_secret[5] = '~'; /* not Z85 */
    CHECK(dl_comms_open(&co, &c2) == DL_EINVAL && strstr(dl_errmsg(), "secret key is not 40 Z85"),
          "a key outside Z85 refused: %s", dl_errmsg());
    co.curve_server[0] = co.curve_public[0] = co.curve_secret[0] = 0;
    co.byzantine = 1;
    co.byzantine_scale = NAN;
    CHECK(dl_comms_open(&co, &c2) == DL_EINVAL && strstr(dl_errmsg(), "byzantine"), "a NaN byzantine scale refused");
    co.byzantine = 0;
    CHECK(dl_mailbox_state(mb, NULL, 0) == DL_COMMS_IDLE, "and so is the mailbox");
    dl_comms_close(&c);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    printf("ok: bad learner ids, log file, fragment list, timeouts, adopt mode and alpha are refused\n");
}

// ---------------------------------------------------------------------------
// keep: the rebase after a push dropped stale (DL_UPDATE_STALE) carries what
// was trained after that push onto g (theta = g + theta - theta at the push,
// counters of those steps); before, it was theta = g and the partition's
// progress was thrown away (docs/ARCHITECTURE.md "The hold rule")

static void test_stale_keep(void)
{
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *c = NULL;
    dl_node *n = NULL;
    setup(DL_ADOPT_KEEP, 0.5f, theta, &c, &n);
    size_t k = dl_plan_fragment_numel(plan, 1);
    float *g = calloc(k, sizeof(float)), *d = dl_mailbox_buf_alloc(c);
    train_step(theta, 1);
    dl_node_after_step(n, 1, H, TOK, 1.0, 0.0); /* fragment 1 is due at step 1: pushed, queued */
    float *at_push = gather(1, theta);
    dl_mailbox_claim cl;
    CHECK(dl_mailbox_claim_push(c, 1, 1, NULL, &cl, &d) == 1, "stale keep: the session sends the push");
    const dl_mailbox_push h = cl.h;
    train_step(theta, 2);
    dl_node_after_step(n, 2, H, TOK, 1.0, 0.0);
    float *before = gather(1, theta);
    CHECK(dl_mailbox_decide(c, 1, DL_DECIDE_DROPPED, h.base_version, 1) == 1, "stale keep: the push is dropped");
    global_of(1, 1, g);
    for (size_t i = 0; i < k; i++) g[i] += 0.5f;
    dl_mailbox_put_update(c, 1, 1, DL_UPDATE_STALE, g, k);
    CHECK(dl_node_poll(n) == 1, "stale keep: the rebase is adopted");
    float *th = gather(1, theta);
    double err = 0.0, moved = 0.0;
    for (size_t i = 0; i < k; i++) {
        err = fmax(err, fabs((double)th[i] - ((double)g[i] + (double)before[i] - (double)at_push[i])));
        moved = fmax(moved, fabs((double)before[i] - (double)at_push[i]));
    }
    dl_node_stats ns;
    dl_node_get_stats(n, &ns);
    CHECK(moved > 0 && err < 1e-5 && same(dl_node_base(n, 1), g, k) && dl_node_steps(n, 1) == 1 &&
              dl_node_tokens(n, 1) == TOK && ns.discarded_tokens == 0,
          "stale keep: theta = g + the step after the push (err %.3g), base = g, counters 1 step, nothing discarded",
          err);
    printf("ok: keep: the rebase after a stale drop keeps the steps trained after the dropped push\n");
    free(th);
    free(before);
    free(at_push);
    free(g);
    free(d);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    free(theta);
}

// ---------------------------------------------------------------------------
// the Update after an Ack with rebase (DL_UPDATE_REBASE) is a rebase in every
// adopt mode: theta = g, counters 0, even when not newer; a queued push of the
// abandoned base is dropped

static void test_rebase_kind(int mode, const char *name)
{
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *c = NULL;
    dl_node *n = NULL;
    setup(mode, 0.5f, theta, &c, &n);
    size_t k = dl_plan_fragment_numel(plan, 1);
    float *g = calloc(k, sizeof(float)), *d = dl_mailbox_buf_alloc(c);
    for (int64_t s = 1; s <= 2; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 1.0, 0.0); /* fragment 1 is due at step 1: pushed, queued */
    }
    uint64_t rebased0 = 0;
    dl_node_stats ns;
    dl_node_get_stats(n, &ns);
    rebased0 = ns.rebased;
    CHECK(dl_node_steps(n, 1) == 2, "%s: fragment 1 trained 2 steps (%llu)", name,
          (unsigned long long)dl_node_steps(n, 1));
    global_of(1, 1, g);
    for (size_t i = 0; i < k; i++) g[i] += 0.5f; /* the synchronizer's v1 differs from what was trained on */
    dl_mailbox_put_update(c, 1, 1, DL_UPDATE_REBASE, g, k);
    CHECK(dl_node_poll(n) == 1, "%s: the rebase of v1 (not newer) is adopted", name);
    float *th = gather(1, theta);
    dl_node_get_stats(n, &ns);
    CHECK(same(th, g, k) && same(dl_node_base(n, 1), g, k) && dl_node_steps(n, 1) == 0 && dl_node_tokens(n, 1) == 0 &&
              ns.rebased == rebased0 + 1,
          "%s: rebase: theta = base = g, counters 0, counted a rebase", name);
    dl_mailbox_push h;
    CHECK(dl_mailbox_take_push(c, 1, &h, &d) == 0, "%s: the queued push of the abandoned base is dropped", name);
    printf("ok: %s: the update after an Ack with rebase rebases (theta = g, counters 0), even when not newer\n", name);
    free(th);
    free(g);
    free(d);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    free(theta);
}

// ---------------------------------------------------------------------------
// push fates (issue: a REJECTED push's progress must stay the learner's): a
// plan of one fragment, every step adds exactly 1 to every parameter, so
// theta - base counts the steps whose progress the learner still holds.

/* Every element of the delta of fragment 0 equals want. */
static int delta_is(dl_node *n, dl_plan *pl, float want)
{
    size_t k = dl_plan_fragment_numel(pl, 0);
    float *d = calloc(k, sizeof(float));
    dl_node_delta(n, 0, d);
    int ok = 1;
    for (size_t i = 0; i < k; i++) ok &= d[i] == want;
    if (!ok) fprintf(stderr, "  delta[0] = %g, want %g\n", d[0], want);
    free(d);
    return ok;
}

/* order: 0 = the REJECTED comes before the NORMAL update, 1 = after it;
 * fate: DL_DECIDE_REJECTED (no rebase) or DL_DECIDE_ACCEPTED (the update
 * after it is the merge of another learner, then the push's own merge). */
static void test_fate(int mode, const char *name, int order, int decision)
{
    dl_plan *pl = NULL;
    REQUIRE(dl_model_plan_open(&CFG, 1, &pl) == 0, "plan: %s", dl_errmsg());
    size_t k = dl_plan_fragment_numel(pl, 0), tot = dl_plan_total_numel(pl);
    float *theta = calloc(tot, sizeof(float));
    dl_mailbox *c = NULL;
    REQUIRE(dl_mailbox_open(pl, &c) == 0, "mailbox");
    dl_node_opts o = {.plan = pl, .params = theta, .adopt = mode, .alpha = 0.5f};
    dl_node *n = NULL;
    REQUIRE(dl_node_open(&o, c, &n) == 0, "open");
    float *g = calloc(k, sizeof(float)), *d = dl_mailbox_buf_alloc(c);
    for (size_t i = 0; i < k; i++) g[i] = 0.0f;
    dl_mailbox_put_update(c, 0, 1, DL_UPDATE_FETCHED, g, k);
    REQUIRE(dl_node_poll(n) == 1, "fetched");
    int64_t step = 0;
#define STEP()                                                                                                         \
    do {                                                                                                               \
        for (size_t i = 0; i < tot; i++) theta[i] += 1.0f;                                                             \
        dl_node_after_step(n, ++step, 4, TOK, 1.0, 0.0);                                                               \
    } while (0)
    for (int i = 0; i < 4; i++) STEP();
    dl_mailbox_claim cl;
    REQUIRE(dl_mailbox_claim_push(c, 0, dl_clock_ns(), NULL, &cl, &d) == 1 && cl.h.steps == 4, "push of steps 1..4 sent");
    CHECK(d[0] == -4.0f, "%s: its delta is -4", name);
    if (decision == DL_DECIDE_ACCEPTED || order == 1) dl_mailbox_decide(c, 0, DL_DECIDE_PENDING, 1, 0);
    if (order == 0) CHECK(dl_mailbox_decide(c, 0, decision, 1, 0) == 1, "rejected");
    STEP();
    STEP();
    /* another learner's merge: v2 = base + 10 */
    for (size_t i = 0; i < k; i++) g[i] = 10.0f;
    dl_mailbox_put_update(c, 0, 2, DL_UPDATE_NORMAL, g, k);
    CHECK(dl_node_poll(n) == 1, "v2 adopted");
    if (order == 1) {
        CHECK(dl_mailbox_decide(c, 0, decision, 1, decision == DL_DECIDE_ACCEPTED) == 1, "decided after the adopt");
        if (decision == DL_DECIDE_ACCEPTED) {
            /* the push's own merge: v3 = v2 + 4 (its progress, outer lr 1) */
            for (size_t i = 0; i < k; i++) g[i] = 14.0f;
            dl_mailbox_put_update(c, 0, 3, DL_UPDATE_NORMAL, g, k);
        }
        dl_node_poll(n);
    }
    dl_node_stats st;
    dl_node_get_stats(n, &st);
    if (decision == DL_DECIDE_ACCEPTED) {
        /* merged: only steps 5..6 are the learner's (keep) */
        if (mode == DL_ADOPT_KEEP)
            CHECK(delta_is(n, pl, -2.0f) && dl_node_steps(n, 0) == 2 && theta[0] == 16.0f,
                  "%s accepted after a keep adopt: delta -2, steps 2 (%llu), theta = v3 + 2", name,
                  (unsigned long long)dl_node_steps(n, 0));
        else CHECK(st.discarded_tokens == 2 * TOK, "%s accepted: only steps 5..6 discarded", name);
    } else if (mode == DL_ADOPT_KEEP) {
        CHECK(delta_is(n, pl, -6.0f) && dl_node_steps(n, 0) == 6 && dl_node_tokens(n, 0) == 6 * TOK &&
                  st.returned == 1,
              "%s, rejected %s the update: the next delta carries all 6 steps (steps %llu)", name,
              order ? "after" : "before", (unsigned long long)dl_node_steps(n, 0));
    } else {
        CHECK(st.discarded_tokens == 6 * TOK && st.returned == 1 && dl_node_steps(n, 0) == 0,
              "%s, rejected %s the update: all 6 steps counted discarded (%llu tokens)", name,
              order ? "after" : "before", (unsigned long long)st.discarded_tokens);
    }
    if (mode == DL_ADOPT_KEEP && decision == DL_DECIDE_REJECTED) {
        /* the next push carries them */
        STEP();
        STEP();
        REQUIRE(dl_mailbox_claim_push(c, 0, dl_clock_ns(), NULL, &cl, &d) == 1, "push of step 8 sent");
        CHECK(cl.h.steps == 8 && cl.h.base_version == 2 && d[0] == -8.0f,
              "keep: the push of step 8 carries the rejected 4 steps (steps %llu, delta %g)",
              (unsigned long long)cl.h.steps, d[0]);
    }
#undef STEP
    free(g);
    free(d);
    dl_node_close(&n);
    dl_mailbox_close(&c);
    free(theta);
    dl_plan_close(&pl);
}

/* The hold rule's check and the post are one step for the mailbox
 * (dl_mailbox_post_push_if): a push the check saw queued that a session
 * claims before the next post makes that post refused (it would carry the
 * claimed one's progress again), and a post never replaces a queued push on
 * another base (it does not contain that one's progress). */
static void test_post_if(void)
{
    dl_mailbox *c = open_mailbox();
    float *d = dl_mailbox_buf_alloc(c), *e = dl_mailbox_buf_alloc(c);
    dl_mailbox_push h = {.fragment = 2, .base_version = 5, .steps = 4, .tokens = 4 * TOK, .loss = 1.0};
    REQUIRE(dl_mailbox_post_push(c, &h, &d) == 0, "queued");
    uint64_t k = dl_mailbox_claims(c, 2);
    CHECK(!dl_mailbox_undecided(c, 2, NULL), "a queued push is no hold");
    dl_mailbox_claim cl;
    REQUIRE(dl_mailbox_claim_push(c, 2, dl_clock_ns(), NULL, &cl, &e) == 1, "claimed");
    h.steps = 8, h.tokens = 8 * TOK;
    CHECK(dl_mailbox_post_push_if(c, &h, &d, k) == -1, "claimed since the check: refused");
    CHECK(dl_mailbox_post_push_if(c, &h, &d, dl_mailbox_claims(c, 2)) == 0, "a fresh check: posted");
    h.base_version = 6, h.steps = 2, h.tokens = 2 * TOK;
    CHECK(dl_mailbox_post_push_if(c, &h, &d, UINT64_MAX) == -1, "a queued push on another base is never replaced");
    h.base_version = 5, h.steps = 9, h.tokens = 9 * TOK;
    CHECK(dl_mailbox_post_push_if(c, &h, &d, UINT64_MAX) == 1, "the same base coalesces");
    free(d);
    free(e);
    dl_mailbox_close(&c);
    printf("ok: post_push_if: no post after a claim the hold check did not see, none over another base\n");
}

/* Push.final_pending as the mailbox keeps it: a final push's claim lists the
 * fragments with a push still to leave -- final pushes queued, owed ones
 * (dl_mailbox_flush_owe), one whose claim was undone with requeue, and a
 * scheduled push queued (one due at the last step leaves after the flush's
 * first push when the session's round robin or an unanswered previous push
 * of its fragment puts it behind) -- and never its own, nor one claimed
 * already or no longer owed. */
static void test_flush_owed(void)
{
    dl_mailbox *c = open_mailbox();
    float *d = dl_mailbox_buf_alloc(c), *e = dl_mailbox_buf_alloc(c);
    uint32_t pend[P];
    dl_mailbox_claim cl;
    dl_mailbox_push h = {.fragment = 1, .base_version = 5, .steps = 4, .tokens = 4 * TOK, .loss = 1.0};
    REQUIRE(dl_mailbox_post_push(c, &h, &d) == 0, "a scheduled push of 1 queued");
    h.final = 1, h.fragment = 0;
    REQUIRE(dl_mailbox_post_push(c, &h, &d) == 0, "final push of 0 queued");
    h.fragment = 2;
    REQUIRE(dl_mailbox_post_push(c, &h, &e) == 0, "final push of 2 queued");
    dl_mailbox_flush_owe(c, 3, 1); /* held: made once its previous push is decided */
    REQUIRE(dl_mailbox_claim_push(c, 0, dl_clock_ns(), pend, &cl, &d) == 1, "claim 0");
    CHECK(cl.n_pending == 3 && pend[0] == 1 && pend[1] == 2 && pend[2] == 3, "0 names 1, 2 and 3 (%d)",
          cl.n_pending);
    dl_mailbox_unclaim_push(c, 0, &cl, &d, 1); /* did not leave: back in its slot, owed again */
    REQUIRE(dl_mailbox_claim_push(c, 1, dl_clock_ns(), pend, &cl, &d) == 1, "claim 1");
    CHECK(cl.n_pending == 0, "a push that is not final names nothing (%d)", cl.n_pending);
    REQUIRE(dl_mailbox_claim_push(c, 2, dl_clock_ns(), pend, &cl, &e) == 1, "claim 2");
    CHECK(cl.n_pending == 2 && pend[0] == 0 && pend[1] == 3, "2 names 0 and 3 (%d)", cl.n_pending);
    dl_mailbox_flush_owe(c, 3, 0); /* nothing left of 3 */
    dl_mailbox_flush_owe(c, 0, 0); /* queued: stays owed until claimed */
    REQUIRE(dl_mailbox_claim_push(c, 0, dl_clock_ns(), pend, &cl, &d) == 1, "claim 0 again");
    CHECK(cl.n_pending == 0, "0 names nothing now (%d)", cl.n_pending);
    free(d);
    free(e);
    dl_mailbox_close(&c);
    printf("ok: a final push names the fragments the flush still owes\n");
}

/* The node's state across a restart (node.h): a keep-mode learner with a
 * push undecided and progress since, saved and restored into a new node over
 * the same parameters, carries exactly the progress since that push (its
 * next delta) on its held versions; a fragment the journal says was pushed
 * after the save carries nothing; every bad state is refused with the node
 * untouched. */
static void test_state(void)
{
    float *theta = calloc(total, sizeof(float));
    float *at[H + 3]; /* theta after each step */
    dl_mailbox *c;
    dl_node *n;
    setup(DL_ADOPT_KEEP, 0.5f, theta, &c, &n);
    /* H + 2 steps, no decisions: each fragment's latest push is undecided (a queued one is replaced by the
     * next due push), and the steps since it are the progress a restart must carry */
    const int64_t steps = H + 2;
    for (int64_t s = 1; s <= steps; s++) {
        train_step(theta, s);
        dl_node_after_step(n, s, H, TOK, 1.0, 0.0);
        at[s] = malloc(total * sizeof(float));
        memcpy(at[s], theta, total * sizeof(float));
    }
    /* a session sends fragment 3's push: it left (undecided); the others' are still queued (never left) */
    dl_mailbox_claim cl;
    float *sent = dl_mailbox_buf_alloc(c);
    REQUIRE(dl_mailbox_claim_push(c, 3, 1, NULL, &cl, &sent) == 1, "claim fragment 3's push");
    free(sent);
    size_t len = 0;
    uint8_t *buf = malloc(dl_node_state_bytes(n));
    REQUIRE(dl_node_state_copy(n, 7, 9, (uint64_t)steps, buf, &len) == 0 && len == dl_node_state_bytes(n), "copy");
    uint64_t jr[2 * P];
    char tmpl[] = "/tmp/dloco_test_node_XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0, "mkstemp");
    REQUIRE(dl_node_set_journal(n, fd, 9) == 0, "journal");
    CHECK(dl_node_journal_read(tmpl, 9, jr, P) == 2 * P, "the journal reads back");
    CHECK(dl_node_journal_read(tmpl, 10, jr, P) == 0, "a journal of another tag is none");
    dl_node_close(&n);
    dl_mailbox_close(&c);

    dl_mailbox *c2 = open_mailbox();
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = DL_ADOPT_KEEP};
    dl_node *n2 = NULL;
    REQUIRE(dl_node_open(&o, c2, &n2) == 0, "open");
    dl_node_restored got_r;
    uint64_t step = (uint64_t)steps;
    /* hostile states: each refused, the node untouched */
    CHECK(dl_node_state_restore(n2, buf, 10, 7, 9, step, jr, 2 * P, &got_r) == DL_ETRUNC, "a truncated head refused");
    CHECK(dl_node_state_restore(n2, buf, len - 1, 7, 9, step, jr, P, &got_r) == DL_ETRUNC,
          "a truncated state refused");
    CHECK(dl_node_state_restore(n2, buf, len, 8, 9, step, jr, P, &got_r) == DL_EMISMATCH, "another model refused");
    CHECK(dl_node_state_restore(n2, buf, len, 7, 10, step, jr, P, &got_r) == DL_EMISMATCH,
          "another run or learner refused");
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, step + 1, jr, P, &got_r) == DL_EMISMATCH,
          "another step than the parameters' refused: %s", dl_errmsg());
    buf[len / 2] ^= 1;
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, step, jr, P, &got_r) == DL_ECORRUPT, "a flipped bit refused");
    buf[len / 2] ^= 1;
    uint32_t magic, bad = 0;
    memcpy(&magic, buf, 4);
    memcpy(buf, &bad, 4);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, step, jr, P, &got_r) == DL_EFORMAT, "bad magic refused");
    memcpy(buf, &magic, 4);
    CHECK(!dl_node_holds_all(n2) && got_r.carried == 0, "a refused state leaves the node fresh");
    /* fragment 1 was pushed after the save: its journal counter moved */
    jr[1]++;
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, step, jr, 2 * P, &got_r) == 0, "restore: %s", dl_errmsg());
    CHECK(dl_node_holds_all(n2), "every fragment held after the restore");
    float *got = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    uint64_t tot = 0;
    for (int p = 0; p < P; p++) {
        size_t k = dl_plan_fragment_numel(plan, p);
        uint64_t v;
        CHECK(dl_mailbox_held(c2, p, &v) && v == 1, "fragment %d held at version 1 for the Hello", p);
        dl_node_delta(n2, p, got);
        int64_t last = steps;
        while (!due(last, p)) last--; /* its latest push */
        /* fragment 3's push left: the progress since it (theta at that push - theta now; the push is the
         * synchronizer's); 0 and 2: still queued, all since the base (global v1 - theta now) */
        float *ref = gather(p, at[last]), *now = gather(p, theta);
        if (p != 3) global_of(p, 1, ref);
        uint64_t want_tok = p == 1 ? 0 : p == 3 ? (uint64_t)(steps - last) * TOK : (uint64_t)steps * TOK;
        double err = 0;
        for (size_t i = 0; i < k; i++) {
            double w = p == 1 ? 0.0 : (double)ref[i] - (double)now[i];
            err = fmax(err, fabs((double)got[i] - w));
        }
        CHECK(err == 0.0, "fragment %d carries its unpushed progress (latest push at step %lld; err %g)", p,
              (long long)last, err);
        CHECK(dl_node_tokens(n2, p) == want_tok && dl_mailbox_carried(c2, p) == want_tok,
              "fragment %d: %llu tokens carried, want %llu", p, (unsigned long long)dl_node_tokens(n2, p),
              (unsigned long long)want_tok);
        tot += want_tok;
        free(ref);
        free(now);
    }
    CHECK(got_r.carried == tot && tot > 0 && got_r.format == 2 && got_r.residuals == 0,
          "carried %llu = %llu fragment-tokens", (unsigned long long)got_r.carried,
          (unsigned long long)tot);
    dl_node_close(&n2);
    dl_mailbox_close(&c2);
    /* fragment 0's queued push left after the save (its claim counter moved): it carries nothing */
    jr[1]--;
    jr[P + 0]++;
    c2 = open_mailbox();
    REQUIRE(dl_node_open(&o, c2, &n2) == 0, "open");
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, step, jr, 2 * P, &got_r) == 0, "restore: %s", dl_errmsg());
    CHECK(dl_node_tokens(n2, 0) == 0 && dl_node_tokens(n2, 2) == (uint64_t)steps * TOK,
          "a queued push sent after the save carries nothing (%llu), one still queued all (%llu)",
          (unsigned long long)dl_node_tokens(n2, 0), (unsigned long long)dl_node_tokens(n2, 2));
    /* a journal without the claim counters (P entries): a queued push's fate is unknown, nothing carried */
    dl_node_close(&n2);
    dl_mailbox_close(&c2);
    jr[P + 0]--;
    c2 = open_mailbox();
    REQUIRE(dl_node_open(&o, c2, &n2) == 0, "open");
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, step, jr, P, &got_r) == 0, "restore: %s", dl_errmsg());
    CHECK(dl_node_tokens(n2, 2) == 0 && dl_node_tokens(n2, 3) > 0,
          "a short journal: a queued push carries nothing (%llu), one that left is judged by its counter (%llu)",
          (unsigned long long)dl_node_tokens(n2, 2), (unsigned long long)dl_node_tokens(n2, 3));
    dl_node_close(&n2);
    dl_mailbox_close(&c2);
    for (int64_t s = 1; s <= steps; s++) free(at[s]);
    free(got);
    free(buf);
    close(fd);
    unlink(tmpl);
    free(theta);
    printf("ok: node state: restored, it carries the progress since a push that left, all of it past a push still "
           "queued; pushed since the save: nothing; truncated, other model / run / step, damaged: refused\n");
}

/* A state's checksum again after an edit (the hostile files below must get past it). */
static void reseal(uint8_t *buf, size_t len)
{
    uint64_t sum = dl_hash64(buf, len - 8, 0);
    memcpy(buf + len - 8, &sum, 8);
}

/* Error feedback residuals across a restart (node.h "Encoded pushes"): an
 * int4 learner whose fragment 0 had a push ACCEPTED, fragment 1 a push
 * undecided, fragment 2 none and fragment 3 a push ACCEPTED but pushed again
 * after the save, saved and restored into a new node and new residuals:
 * fragment 0 starts from the committed residual (its next encoded push is
 * byte for byte the killed process's), 1 from the undecided push's (taken as
 * accepted), 2 and 3 from zero; a format 1 file (no residuals) still loads;
 * a damaged, truncated or impossible residual section is refused. */
static void test_state_residuals(void)
{
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *c;
    dl_node *n;
    setup(DL_ADOPT_KEEP, 0.5f, theta, &c, &n);
    uint64_t numel[P];
    size_t maxn = dl_plan_max_fragment_numel(plan);
    for (int p = 0; p < P; p++) numel[p] = dl_plan_fragment_numel(plan, p);
    dl_ef *ef = NULL;
    REQUIRE(dl_ef_open(P, numel, 1, &ef) == 0, "ef open");
    dl_codec_enc enc = {.c = {.id = DL_CODEC_INT4, .block = 32}, .rounding = DL_ROUND_NEAREST};
    size_t bytes = (size_t)dl_codec_bytes(&enc.c, maxn);
    uint8_t *pay = malloc(bytes), *pay2 = malloc(bytes);
    float *x = malloc(maxn * sizeof(float)), *want0 = malloc(maxn * sizeof(float)),
          *want1 = malloc(maxn * sizeof(float));
    for (int64_t s = 1; s <= 3; s++) train_step(theta, s);
    for (int p = 0; p < P; p++) dl_node_set_ef(n, p, ef);
    for (int p = 0; p < P; p++) {
        if (p == 2) continue;
        dl_node_delta(n, p, x);
        REQUIRE(dl_ef_encode(ef, &enc, p, x, 1, pay) == 0, "encode %d", p);
        if (p != 1) dl_ef_decided(ef, p, DL_DECIDE_ACCEPTED, 0, 1);
    }
    REQUIRE(dl_ef_committed(ef, 0) && dl_ef_pending(ef, 1, NULL), "residuals to save");
    memcpy(want0, dl_ef_committed(ef, 0), numel[0] * sizeof(float));
    memcpy(want1, dl_ef_pending(ef, 1, NULL), numel[1] * sizeof(float));
    size_t len = 0, cap = dl_node_state_bytes(n);
    CHECK(cap == dl_node_state_max_bytes(n), "every fragment attached: the largest state");
    uint8_t *buf = malloc(cap + 64);
    REQUIRE(dl_node_state_copy(n, 7, 9, 3, buf, &len) == 0, "copy");
    CHECK(len == cap - numel[2] * sizeof(float), "three residuals saved, none for the fragment never pushed (%zu)", len);
    uint64_t jr[2 * P] = {0};
    jr[3] = 1; /* fragment 3 pushed after the save */
    /* restore into a fresh process: new mailbox, node and residuals */
    dl_mailbox *c2 = open_mailbox();
    dl_node_opts o = {.plan = plan, .params = theta, .adopt = DL_ADOPT_KEEP};
    dl_node *n2 = NULL;
    dl_ef *ef2 = NULL;
    REQUIRE(dl_node_open(&o, c2, &n2) == 0 && dl_ef_open(P, numel, 1, &ef2) == 0, "open");
    for (int p = 0; p < P; p++) dl_node_set_ef(n2, p, ef2);
    dl_node_restored got;
    /* hostile residual sections: each refused, nothing restored */
    buf[len - 12] ^= 1;
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == DL_ECORRUPT, "a flipped residual bit refused");
    buf[len - 12] ^= 1;
    CHECK(dl_node_state_restore(n2, buf, len - 4, 7, 9, 3, jr, 2 * P, &got) == DL_ETRUNC, "a cut residual refused");
    CHECK(dl_node_state_restore(n2, buf, len + 4, 7, 9, 3, jr, 2 * P, &got) == DL_ETRUNC, "a longer file refused");
    /* the records: head 48 bytes, then P records of 72, the flag at 12 (layout of node.c) */
    uint8_t *rec0 = buf + 48;
    uint32_t flag = 2;
    memcpy(rec0 + 12, &flag, 4);
    reseal(buf, len);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == DL_ERANGE, "a residual flag of 2 refused");
    flag = 1;
    memcpy(rec0 + 12, &flag, 4);
    float nan = NAN, keep;
    memcpy(&keep, buf + len - 12, 4);
    memcpy(buf + len - 12, &nan, 4);
    reseal(buf, len);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == DL_ERANGE, "a non-finite residual refused");
    memcpy(buf + len - 12, &keep, 4);
    uint32_t fmt = 3;
    memcpy(buf + 4, &fmt, 4);
    reseal(buf, len);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == DL_EFORMAT, "a newer format refused: %s",
          dl_errmsg());
    fmt = 1;
    memcpy(buf + 4, &fmt, 4);
    reseal(buf, len);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == DL_ERANGE,
          "a format 1 file with residuals refused");
    CHECK(!dl_node_holds_all(n2) && !dl_ef_committed(ef2, 0), "refusals leave node and residuals untouched");
    fmt = 2;
    memcpy(buf + 4, &fmt, 4);
    reseal(buf, len);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == 0, "restore: %s", dl_errmsg());
    CHECK(got.format == 2 && got.residuals == 2 && got.residuals_dropped == 1, "2 residuals restored, 1 dropped (%d, %d)",
          got.residuals, got.residuals_dropped);
    const float *r0 = dl_ef_committed(ef2, 0), *r1 = dl_ef_committed(ef2, 1);
    CHECK(r0 && !memcmp(r0, want0, numel[0] * sizeof(float)), "fragment 0: the committed residual as saved");
    CHECK(r1 && !memcmp(r1, want1, numel[1] * sizeof(float)), "fragment 1: the undecided push's residual");
    CHECK(!dl_ef_committed(ef2, 2) && !dl_ef_committed(ef2, 3), "fragments 2 (none) and 3 (pushed since): zero");
    /* the next push of fragment 0: what the killed process would have sent */
    dl_node_delta(n2, 0, x);
    REQUIRE(dl_ef_encode(ef, &enc, 0, x, 1, pay) == 0 && dl_ef_encode(ef2, &enc, 0, x, 1, pay2) == 0, "encode");
    CHECK(!memcmp(pay, pay2, (size_t)dl_codec_bytes(&enc.c, numel[0])), "the restarted push is the killed one's");
    dl_node_close(&n2);
    dl_mailbox_close(&c2);
    dl_ef_close(&ef2);

    /* a learner without residuals (fp32 pushes) restores the state and drops them, saying so */
    c2 = open_mailbox();
    REQUIRE(dl_node_open(&o, c2, &n2) == 0 && dl_ef_open(P, numel, 0, &ef2) == 0, "open");
    for (int p = 0; p < P; p++) dl_node_set_ef(n2, p, ef2);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == 0 && got.residuals == 0 &&
              got.residuals_dropped == 3, "residuals off: restored, %d dropped", got.residuals_dropped);
    dl_node_close(&n2);
    dl_mailbox_close(&c2);
    dl_ef_close(&ef2);

    /* a format 1 file (written before residuals were saved): loads, residuals zero */
    for (int p = 0; p < P; p++) dl_node_set_ef(n, p, NULL);
    REQUIRE(dl_node_state_copy(n, 7, 9, 3, buf, &len) == 0 && len == cap - total * sizeof(float), "copy without");
    fmt = 1;
    memcpy(buf + 4, &fmt, 4);
    reseal(buf, len);
    c2 = open_mailbox();
    REQUIRE(dl_node_open(&o, c2, &n2) == 0 && dl_ef_open(P, numel, 1, &ef2) == 0, "open");
    for (int p = 0; p < P; p++) dl_node_set_ef(n2, p, ef2);
    CHECK(dl_node_state_restore(n2, buf, len, 7, 9, 3, jr, 2 * P, &got) == 0 && got.format == 1 &&
              got.residuals == 0 && dl_node_holds_all(n2) && !dl_ef_committed(ef2, 0),
          "a format 1 state loads, residuals zero: %s", dl_errmsg());
    dl_node_close(&n2);
    dl_mailbox_close(&c2);
    dl_ef_close(&ef2);

    dl_node_close(&n);
    dl_mailbox_close(&c);
    dl_ef_close(&ef);
    free(buf), free(pay), free(pay2), free(x), free(want0), free(want1), free(theta);
    printf("ok: node state: error feedback residuals saved and restored (committed, undecided taken as accepted), "
           "zero when pushed since; format 1 loads; damaged, cut, impossible residuals refused\n");
}

int main(void)
{
    REQUIRE(dl_model_config_check(&CFG) == 0, "config: %s", dl_errmsg());
    REQUIRE(dl_model_plan_open(&CFG, P, &plan) == 0, "plan: %s", dl_errmsg());
    total = dl_plan_total_numel(plan);
    for (int p = 0; p < P; p++) REQUIRE(dl_plan_fragment_numel(plan, p) > 0, "fragment %d empty", p);

    test_fetch_and_pushes();
    test_mode(DL_ADOPT_OVERWRITE, "overwrite");
    test_mode(DL_ADOPT_MIX, "mix");
    test_mode(DL_ADOPT_KEEP, "keep");
    test_host_model();
    test_deferred(DL_ADOPT_OVERWRITE, "overwrite");
    test_deferred(DL_ADOPT_MIX, "mix");
    test_deferred(DL_ADOPT_KEEP, "keep");
    test_hold();
    test_barrier(DL_ADOPT_KEEP, "keep");
    test_barrier(DL_ADOPT_OVERWRITE, "overwrite");
    test_trust();
    test_bad_input();
    test_rebase_kind(DL_ADOPT_OVERWRITE, "overwrite");
    test_rebase_kind(DL_ADOPT_MIX, "mix");
    test_rebase_kind(DL_ADOPT_KEEP, "keep");
    test_stale_keep();
    for (int order = 0; order < 2; order++) {
        test_fate(DL_ADOPT_KEEP, "keep", order, DL_DECIDE_REJECTED);
        test_fate(DL_ADOPT_OVERWRITE, "overwrite", order, DL_DECIDE_REJECTED);
        test_fate(DL_ADOPT_MIX, "mix", order, DL_DECIDE_REJECTED);
    }
    test_fate(DL_ADOPT_KEEP, "keep", 1, DL_DECIDE_ACCEPTED);
    test_fate(DL_ADOPT_OVERWRITE, "overwrite", 1, DL_DECIDE_ACCEPTED);
    test_post_if();
    test_flush_owed();
    test_state();
    test_state_residuals();

    dl_plan_close(&plan);
    printf("test_node: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
