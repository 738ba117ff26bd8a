/* A real learner (mailbox + comms session + node, in process, and the dloco-learner binary) against a fake
 * synchronizer that lies: NaN / 1e38 updates, absurd epochs, timings and versions, oversized frames, silence.
 *
 * The fake synchronizer is a ROUTER on loopback speaking the real protocol
 * (proto/wire.h); each case starts a fresh learner against a fresh one and
 * checks what the learner adopts, what it sends next (a refetch, a Hello on
 * a new connection) and its counters and events. Every wait is bounded
 * (WAIT_MS); nothing asserts on how long anything took. */
#include "learner/comms.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/model.h"
#include "core/plan.h"
#include "learner/node.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "tests/fakesync.h"

#include "tests/check.h"
#include "tests/fakesync_check.h"
#include "tests/proc.h"

#define P 4
#define H 4
#define TOK 32

static dl_model_config CFG = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16};
static dl_plan *plan;
static size_t total;
static float *init_other; /* [total] the synchronizer's model: another seed's init */
static char evlog[300];

/* The honest global fragment p at `version`: another init, moved a little per version. */
static void global_of(int p, uint64_t version, float *g)
{
    dl_plan_gather(plan, p, init_other, g);
    for (size_t i = 0; i < dl_plan_fragment_numel(plan, p); i++) g[i] += 0.001f * (float)(version % 1000);
}

// ---------------------------------------------------------------------------
// the fake synchronizer (tests/fakesync.h): talks to one learner

typedef dl_fakesync fake;

/* A fake synchronizer for learner `id`; with `curve` a CURVE server of that key pair. */
static void f_open_curve(fake *h, const char *id, const dl_auth_keypair *curve) { fs_open(h, plan, id, curve); }
static void f_open(fake *h, const char *id) { f_open_curve(h, id, NULL); }
static void f_close(fake *h) { fs_close(h); }

typedef struct {
    uint64_t epoch, version;
    uint32_t h, hb_ms, liveness;
    int must_fetch;
} welcome_args;

static void f_welcome(fake *h, welcome_args a)
{
    fs_welcome_args w = {.epoch = a.epoch, .version = a.version, .h = a.h, .hb_ms = a.hb_ms, .liveness = a.liveness,
                         .must_fetch = a.must_fetch, .policy = "lying"};
    REQUIRE(fs_welcome(h, NULL, &w) == 0, "fake welcome");
}

/* A sane Welcome: H 4, heartbeat 100 ms, liveness 50 (5 s of silence allowed). */
static welcome_args good_welcome(uint64_t epoch, uint64_t version, int must_fetch)
{
    return (welcome_args){.epoch = epoch, .version = version, .h = H, .hb_ms = 100, .liveness = 50,
                          .must_fetch = must_fetch};
}

/* Update of fragment p: `bytes` of payload (4 x numel unless a test lies about it). */
static void f_update_raw(fake *h, uint64_t epoch, int p, uint64_t version, const void *data, size_t bytes)
{
    REQUIRE(fs_update_raw(h, NULL, epoch, p, version, data, bytes) == 0, "fake update");
}

enum { HONEST = 0, NANS = 1, HUGE_VALUES = 2 };

static void f_update(fake *h, uint64_t epoch, int p, uint64_t version, int kind)
{
    float *g = calloc(h->numel[p], sizeof(float));
    global_of(p, version, g);
    if (kind == NANS) g[h->numel[p] / 3] = NAN;
    if (kind == HUGE_VALUES)
        for (size_t i = 0; i < h->numel[p]; i++) g[i] = 1e38f;
    f_update_raw(h, epoch, p, version, g, h->numel[p] * 4);
    free(g);
}

/* Push of p on base merged at once into `version`: pooled (MERGED_PENDING),
 * then ACCEPTED and the Update -- the answers a real synchronizer gives. The
 * learner takes an ACCEPTED only for a push it was told is pooled. */
static void f_merge(fake *h, uint64_t epoch, int p, uint64_t base, uint64_t version)
{
    for (int k = 0; k < 2; k++) {
        Dloco__V1__Ack a;
        dloco__v1__ack__init(&a);
        a.fragment = (uint32_t)p;
        a.base_version = base;
        a.decision = k ? DLOCO__V1__DECISION__DECISION_ACCEPTED : DLOCO__V1__DECISION__DECISION_MERGED_PENDING;
        a.merged_version = k ? version : 0;
        a.reason = "";
        Dloco__V1__Envelope env;
        dl_wire_env_init(&env, "dloco", epoch, h->id);
        dl_wire_set_ack(&env, &a);
        fs_check_send(h, NULL, &env, NULL, 0);
    }
    f_update(h, epoch, p, version, HONEST);
}

static void f_heartbeat(fake *h, uint64_t epoch) { REQUIRE(fs_heartbeat(h, NULL, epoch) == 0, "fake heartbeat"); }

/* Expect a Fetch; with want >= 0 it must name exactly fragment `want`, else all. */
static int f_expect_fetch(fake *h, int want, const char *what)
{
    dl_wire_msg m;
    if (!fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, what)) return 0;
    const Dloco__V1__Fetch *f = m.env->fetch;
    int ok = want < 0 ? f->n_fragments == 0 : f->n_fragments == 1 && (int)f->fragments[0] == want;
    CHECK(ok, "%s: fetch of %zu fragments (first %d), wanted %d", what, f->n_fragments,
          f->n_fragments ? (int)f->fragments[0] : -1, want);
    dl_wire_msg_close(&m);
    return ok;
}

// ---------------------------------------------------------------------------
// the learner under test

typedef struct {
    float *theta;
    dl_mailbox *mb;
    dl_comms *c;
    dl_node *n;
} learner;

/* Fast timings, so backoffs and silences are short (their order is what
 * dl_comms_check_timeouts demands). */
static dl_comms_opts base_opts(fake *h)
{
    return (dl_comms_opts){
        .endpoint = h->ep, .learner_id = h->id, .run_id = "dloco", .plan = plan,
        .fingerprint = dl_model_fingerprint(&CFG, plan), .n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4,
        .vocab = 16, .device = "cpu", .batch = 7,
        .poll_max_ms = 10, .hello_unsent_ms = 10, .hello_retry_ms = 100, .hello_retry_max_ms = 200,
        .silence_min_ms = 400, .silence_rebuild_ms = 800, .reconnect_ms = 20, .reconnect_max_ms = 100, .connect_timeout_ms = 20000,
    };
}

static void l_start(learner *L, dl_comms_opts co)
{
    memset(L, 0, sizeof *L);
    L->theta = calloc(total, sizeof(float));
    REQUIRE(dl_model_init_params(&CFG, 1, L->theta) == 0, "init");
    REQUIRE(dl_mailbox_open(plan, &L->mb) == 0, "mailbox: %s", dl_errmsg());
    co.mailbox = L->mb;
    REQUIRE(dl_comms_open(&co, &L->c) == 0, "comms open: %s", dl_errmsg());
    dl_node_opts no = {.plan = plan, .params = L->theta, .adopt = DL_ADOPT_OVERWRITE,
                       .push_decision_timeout_ms = -1, .update_max_ratio = 10};
    REQUIRE(dl_node_open(&no, L->mb, &L->n) == 0, "node open: %s", dl_errmsg());
    REQUIRE(dl_comms_start(L->c) == 0, "comms start: %s", dl_errmsg());
}

static void l_stop(learner *L)
{
    dl_node_close(&L->n);
    dl_comms_close(&L->c);
    dl_mailbox_close(&L->mb);
    free(L->theta);
}

static dl_comms_stats cst(learner *L)
{
    dl_comms_stats s;
    dl_comms_get_stats(L->c, &s);
    return s;
}

static dl_node_stats nst(learner *L)
{
    dl_node_stats s;
    dl_node_get_stats(L->n, &s);
    return s;
}

/* theta's fragment p equals the honest global at `version`. */
static int theta_is(learner *L, int p, uint64_t version)
{
    size_t k = dl_plan_fragment_numel(plan, p);
    float *a = calloc(k, sizeof(float)), *b = calloc(k, sizeof(float));
    dl_plan_gather(plan, p, L->theta, a);
    global_of(p, version, b);
    int same = memcmp(a, b, k * 4) == 0;
    free(a);
    free(b);
    return same;
}

/* Hello -> Welcome(must_fetch) -> Fetch all -> P honest updates -> every fragment held. */
static void join(fake *h, learner *L, welcome_args w)
{
    dl_wire_msg m;
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    dl_wire_msg_close(&m);
    w.must_fetch = 1;
    f_welcome(h, w);
    REQUIRE(f_expect_fetch(h, -1, "initial fetch"), "fetch");
    for (int p = 0; p < P; p++) f_update(h, w.epoch, p, w.version, HONEST);
    REQUIRE(WAIT_FOR((dl_node_poll(L->n), dl_node_holds_all(L->n))), "joined");
}

// ---------------------------------------------------------------------------
// the event log

/* Lines of event `name` in `path` from learner `id` (NULL: any) having every " k=v" of conds (NULL-terminated). */
static int ev_count_in(const char *path, const char *name, const char *id, va_list ap0)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4200], ev[80], who[100];
    snprintf(ev, sizeof ev, " event=%s ", name);
    snprintf(who, sizeof who, " learner=%s ", id ? id : "");
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = ' '; /* every field ends with a space */
        if (!strstr(line, ev) || (id && !strstr(line, who))) continue;
        int ok = 1;
        va_list ap;
        va_copy(ap, ap0);
        for (const char *c; ok && (c = va_arg(ap, const char *));) {
            char pat[200];
            snprintf(pat, sizeof pat, " %s ", c);
            ok = strstr(line, pat) != NULL;
        }
        va_end(ap);
        n += ok;
    }
    fclose(f);
    return n;
}

static int ev_count(const char *name, const char *id, ...)
{
    va_list ap;
    va_start(ap, id);
    int n = ev_count_in(evlog, name, id, ap);
    va_end(ap);
    return n;
}

static int ev_count_file(const char *path, const char *name, ...)
{
    va_list ap;
    va_start(ap, name);
    int n = ev_count_in(path, name, NULL, ap);
    va_end(ap);
    return n;
}

// ---------------------------------------------------------------------------
// (1) NaN in fetch replies and updates: refused, never adopted, fetched again
// with a backoff after DL_COMMS_REFETCH_FREE refusals in a row

static void test_nan(void)
{
    fake h;
    f_open(&h, "T1");
    learner L;
    l_start(&L, base_opts(&h));
    dl_wire_msg m;
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    CHECK(m.env->hello->batch == 7, "Hello.batch %u", m.env->hello->batch);
    dl_wire_msg_close(&m);
    f_welcome(&h, good_welcome(5, 1, 1));
    REQUIRE(f_expect_fetch(&h, -1, "initial fetch"), "fetch");
    f_update(&h, 5, 0, 1, NANS);
    for (int p = 1; p < P; p++) f_update(&h, 5, p, 1, HONEST);
    CHECK(f_expect_fetch(&h, 0, "fragment 0 fetched again after its NaN reply"), "refetch 0");
    dl_node_poll(L.n);
    CHECK(!dl_node_held(L.n, 0) && cst(&L).updates_refused == 1, "the NaN fetch reply never reached the node");
    f_update(&h, 5, 0, 1, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_holds_all(L.n))), "ready once the honest reply came");
    CHECK(theta_is(&L, 0, 1), "theta_0 = the honest global");
    printf("ok: NaN fetch reply refused and fetched again; the learner starts from the honest one\n");

    /* a merge result with a NaN, then every refetch answered with NaN */
    for (int r = 1; r <= 5; r++) {
        f_update(&h, 5, 1, 2, NANS);
        char what[64];
        snprintf(what, sizeof what, "refetch %d of fragment 1", r);
        if (!f_expect_fetch(&h, 1, what)) break;
        dl_node_poll(L.n);
        CHECK(dl_node_version(L.n, 1) == 1 && theta_is(&L, 1, 1), "%s: fragment 1 still at version 1", what);
    }
    f_update(&h, 5, 1, 2, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 1) == 2)), "the honest update adopted");
    CHECK(theta_is(&L, 1, 2), "theta_1 = honest v2");
    static const char *const delays[5] = {"delay_ms=0", "delay_ms=0", "delay_ms=0", "delay_ms=100", "delay_ms=200"};
    for (int r = 1; r <= 5; r++) {
        char k[32];
        snprintf(k, sizeof k, "refusals=%d", r);
        CHECK(ev_count("refetch", "T1", "fragment=1", k, delays[r - 1], NULL) == 1,
              "refetch event for refusal %d with %s", r, delays[r - 1]);
    }
    CHECK(ev_count("update_refused", "T1", "reason=nonfinite", NULL) == 6, "6 update_refused reason=nonfinite events");
    dl_comms_stats s = cst(&L);
    CHECK(s.updates_refused == 6 && s.refetches == 6 && s.fetches == 7, "refused %llu, refetches %llu, fetches %llu",
          (unsigned long long)s.updates_refused, (unsigned long long)s.refetches, (unsigned long long)s.fetches);
    CHECK(nst(&L).adopted == P + 1 && nst(&L).refused == 0, "adopted %llu: the 4 fetched + v2 only",
          (unsigned long long)nst(&L).adopted);
    printf("ok: NaN updates refused 5 times in a row: fetched again at once 3 times, then after 100 and 200 ms\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (2) finite but absurd values (1e38): refused by the node's ratio bound

static void test_huge(void)
{
    fake h;
    f_open(&h, "T2");
    learner L;
    l_start(&L, base_opts(&h));
    dl_wire_msg m;
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    dl_wire_msg_close(&m);
    f_welcome(&h, good_welcome(5, 1, 1));
    REQUIRE(f_expect_fetch(&h, -1, "initial fetch"), "fetch");
    for (int p = 0; p < P; p++) f_update(&h, 5, p, 1, p == 2 ? HUGE_VALUES : HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), nst(&L).refused == 1)), "the 1e38 fetch reply refused by the node");
    CHECK(!dl_node_held(L.n, 2), "and fragment 2 not held");
    CHECK(f_expect_fetch(&h, 2, "fragment 2 fetched again"), "refetch 2");
    f_update(&h, 5, 2, 1, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_holds_all(L.n))), "ready");
    CHECK(theta_is(&L, 2, 1), "theta_2 = honest global (the seeded init is within the bound of it)");

    f_update(&h, 5, 3, 2, HUGE_VALUES);
    CHECK(WAIT_FOR((dl_node_poll(L.n), nst(&L).refused == 2)), "the 1e38 merge result refused");
    CHECK(dl_node_version(L.n, 3) == 1 && theta_is(&L, 3, 1), "fragment 3 untouched");
    CHECK(f_expect_fetch(&h, 3, "fragment 3 fetched again"), "refetch 3");
    f_update(&h, 5, 3, 2, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 3) == 2)) && theta_is(&L, 3, 2), "honest v2 adopted");
    CHECK(ev_count("update_refused", NULL, "fragment=2", "reason=ratio", NULL) == 1 &&
              ev_count("update_refused", NULL, "fragment=3", "reason=ratio", NULL) == 1,
          "update_refused reason=ratio events for fragments 2 and 3");
    CHECK(cst(&L).updates_refused == 0, "finite values pass the comms thread: the node refuses them");
    printf("ok: 1e38 fetch reply and update refused by update_max_ratio, fetched again, honest ones adopted\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (3) an absurd epoch (2^63) on a Heartbeat and an Update: re-hello, the
// message is not used, and the genuine epoch still works afterwards

static void test_epoch(void)
{
    fake h;
    f_open(&h, "T3");
    learner L;
    l_start(&L, base_opts(&h));
    join(&h, &L, good_welcome(5, 1, 1));
    const uint64_t BIG = 1ull << 63;
    f_heartbeat(&h, BIG);
    dl_wire_msg m;
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "re-hello after epoch 2^63")) {
        CHECK(m.env->epoch == 5 && m.env->hello->n_held_versions == P, "the Hello keeps epoch %llu (held %zu)",
              (unsigned long long)m.env->epoch, m.env->hello->n_held_versions);
        dl_wire_msg_close(&m);
    }
    f_update(&h, BIG, 0, 2, HONEST);
    CHECK(WAIT_FOR(cst(&L).newer_epoch == 2), "both 2^63 messages counted as newer epoch");
    dl_node_poll(L.n);
    CHECK(dl_node_version(L.n, 0) == 1, "the Update of epoch 2^63 not adopted");
    CHECK(ev_count("rehello", "T3", NULL) == 1, "one rehello event");
    /* the genuine synchronizer (restarted: epoch 6) answers the Hello */
    f_welcome(&h, good_welcome(6, 1, 0));
    CHECK(WAIT_FOR(dl_comms_state(L.c, NULL, 0) == DL_COMMS_READY), "welcomed in epoch 6");
    CHECK(cst(&L).epoch == 6, "session epoch %llu", (unsigned long long)cst(&L).epoch);
    f_heartbeat(&h, 6);
    f_update(&h, 6, 0, 2, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 0) == 2)), "a genuine epoch-6 Update adopted");
    CHECK(WAIT_FOR(cst(&L).heartbeats_recv >= 1) && cst(&L).old_epoch == 0,
          "and nothing genuine looks older (old_epoch %llu)", (unsigned long long)cst(&L).old_epoch);
    printf("ok: epoch 2^63 -> re-hello in the welcomed epoch, message unused; the genuine epoch 6 works after\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (4) Welcomes with absurd timings: refused like an unanswered Hello, retried

static void test_welcome_bounds(void)
{
    fake h;
    f_open(&h, "T4");
    learner L;
    l_start(&L, base_opts(&h));
    welcome_args bad[5] = {good_welcome(5, 1, 1), good_welcome(5, 1, 1), good_welcome(5, 1, 1),
                           good_welcome(5, 1, 1), good_welcome(5, 1, 1)};
    bad[0].hb_ms = 0;        /* invalid for proto/wire.c already */
    bad[1].hb_ms = 1000000;  /* 17 minutes */
    bad[2].liveness = 1000000;
    bad[3].h = 0;            /* invalid for proto/wire.c */
    bad[4].h = 2000000;
    dl_wire_msg m;
    for (int i = 0; i < 5; i++) {
        char what[64];
        snprintf(what, sizeof what, "hello %d", i + 1);
        REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, what), "%s", what);
        dl_wire_msg_close(&m);
        f_welcome(&h, bad[i]);
    }
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello after 5 bad welcomes"), "hello 6");
    dl_wire_msg_close(&m);
    CHECK(dl_comms_state(L.c, NULL, 0) == DL_COMMS_HELLO && dl_comms_h(L.c) == 0, "still waiting for a Welcome");
    /* the sixth Hello may reach us before the comms thread counts it */
    (void)WAIT_FOR(cst(&L).hellos == 6);
    dl_comms_stats s = cst(&L);
    CHECK(s.welcomes_refused == 3 && s.bad_msgs == 2 && s.hellos == 6, "refused %llu, invalid %llu, hellos %llu",
          (unsigned long long)s.welcomes_refused, (unsigned long long)s.bad_msgs, (unsigned long long)s.hellos);
    CHECK(ev_count("welcome_refused", "T4", NULL) == 3, "3 welcome_refused events");
    f_welcome(&h, good_welcome(5, 1, 1));
    CHECK(f_expect_fetch(&h, -1, "fetch after the sane Welcome"), "fetch");
    CHECK(dl_comms_state(L.c, NULL, 0) == DL_COMMS_READY && dl_comms_h(L.c) == H && cst(&L).heartbeat_ms == 100,
          "H %u and heartbeat %u from the sane Welcome", dl_comms_h(L.c), cst(&L).heartbeat_ms);
    printf("ok: Welcomes with heartbeat_ms 0 / 1e6, liveness 1e6, h 0 / 2e6 refused and the Hello retried\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (5) versions: a jump beyond max_version_jump refused, an older one ignored

static void test_version_jump(void)
{
    fake h;
    f_open(&h, "T5");
    learner L;
    dl_comms_opts co = base_opts(&h);
    co.max_version_jump = 1000;
    l_start(&L, co);
    join(&h, &L, good_welcome(5, 1, 1));
    f_update(&h, 5, 1, 1 + (1ull << 62), HONEST);
    CHECK(f_expect_fetch(&h, 1, "fragment 1 fetched again after a version jump of 2^62"), "refetch");
    CHECK(dl_node_version(L.n, 1) == 1, "not adopted");
    CHECK(ev_count("update_refused", "T5", "fragment=1", "reason=version_jump", NULL) == 1, "update_refused event");
    f_update(&h, 5, 1, 2, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 1) == 2)), "the reply at version 2 adopted");
    /* the bound is exact: newest known 2, max jump 1000 */
    f_update(&h, 5, 1, 1002, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 1) == 1002)), "a jump of exactly 1000 adopted");
    f_update(&h, 5, 1, 2003, HONEST);
    CHECK(f_expect_fetch(&h, 1, "a jump of 1001 refused"), "refetch");
    f_update(&h, 5, 1, 1003, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 1) == 1003)), "reply adopted");
    /* below the held version: out of date, dropped before the mailbox */
    f_update(&h, 5, 1, 3, HONEST);
    CHECK(WAIT_FOR(cst(&L).updates_old == 1), "an Update older than the held version counted out of date");
    dl_node_poll(L.n);
    CHECK(dl_node_version(L.n, 1) == 1003 && nst(&L).ignored == 0, "and never reached the node");
    CHECK(cst(&L).updates_refused == 2, "2 refused");
    printf("ok: version jump 2^62 and 1001 > max_version_jump refused and fetched again; 1000 adopted; older "
           "dropped\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (6) a frame above the learner's ZMQ_MAXMSGSIZE (libzmq drops the connection
// and never reconnects by itself), then 3 undecodable headers: each time the
// learner opens a new connection, re-hellos and keeps working

static void test_oversized(void)
{
    fake h;
    f_open(&h, "T6");
    learner L;
    l_start(&L, base_opts(&h));
    join(&h, &L, good_welcome(5, 1, 1));
    CHECK(h.conns == 1, "one connection so far");
    size_t cap = dl_plan_max_fragment_numel(plan) * 4 + DL_WIRE_MAX_HEADER_BYTES;
    size_t big = cap + 64;
    char *junk = calloc(big, 1);
    f_update_raw(&h, 5, 0, 2, junk, big);
    free(junk);
    dl_wire_msg m;
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m,
                        "hello on a new connection after an oversized frame")) {
        CHECK(h.conns == 2 && m.env->epoch == 5 && m.env->hello->n_held_versions == P,
              "new connection (%d), epoch 5, held versions", h.conns);
        dl_wire_msg_close(&m);
    }
    CHECK(ev_count("socket_rebuild", "T6", "reason=disconnected", NULL) == 1, "socket_rebuild reason=disconnected");
    f_welcome(&h, good_welcome(5, 1, 0));
    CHECK(WAIT_FOR(dl_comms_state(L.c, NULL, 0) == DL_COMMS_READY), "welcomed again");
    f_update(&h, 5, 0, 2, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 0) == 2)), "and keeps working: v2 adopted");

    for (int i = 0; i < DL_COMMS_BAD_IN_ROW; i++) {
        REQUIRE(zmq_send(h.router, h.rid, h.rid_len, ZMQ_SNDMORE) >= 0, "send id");
        REQUIRE(zmq_send(h.router, "\x0a\xff\xff\xff", 4, 0) == 4, "send garbage");
    }
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m,
                        "hello on a new connection after 3 undecodable headers")) {
        CHECK(h.conns == 3, "a third connection (%d)", h.conns);
        dl_wire_msg_close(&m);
    }
    CHECK(ev_count("socket_rebuild", "T6", "reason=bad_messages", NULL) == 1, "socket_rebuild reason=bad_messages");
    f_welcome(&h, good_welcome(5, 2, 0));
    CHECK(WAIT_FOR(dl_comms_state(L.c, NULL, 0) == DL_COMMS_READY), "welcomed again");
    f_update(&h, 5, 0, 3, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), dl_node_version(L.n, 0) == 3)), "and keeps working: v3 adopted");
    dl_comms_stats s = cst(&L);
    CHECK(s.rebuilds == 2 && s.bad_msgs == 3, "rebuilds %llu, bad messages %llu", (unsigned long long)s.rebuilds,
          (unsigned long long)s.bad_msgs);
    printf("ok: oversized frame and 3 undecodable headers -> new connection, re-hello, updates adopted again\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (7) the fake synchronizer stops answering on the connection: after the
// silence limit the learner opens a new one; its first Welcome is taken even
// with a lower epoch (a new store), since nothing old can arrive on it

static void test_mute(void)
{
    fake h;
    f_open(&h, "T7");
    learner L;
    l_start(&L, base_opts(&h));
    welcome_args w = good_welcome(5, 1, 1);
    w.liveness = 2; /* silence limit max(400 ms, 2 x 100 ms) */
    join(&h, &L, w);
    dl_wire_msg m;
    /* a re-hello on the same connection first, then (silence_rebuild_ms) a new one */
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "re-hello on the same connection after silence")) {
        CHECK(h.conns == 1 && m.env->hello->n_held_versions == P, "same connection (%d) with held versions", h.conns);
        dl_wire_msg_close(&m);
    }
    for (int k = 0; k < 10 && h.conns < 2; k++)
        if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello on a new connection after more silence")) {
            CHECK(m.env->hello->n_held_versions == P, "with held versions");
            dl_wire_msg_close(&m);
        }
    CHECK(h.conns == 2, "new connection (%d) after the silence lasted", h.conns);
    CHECK(cst(&L).rebuilds == 1 && ev_count("socket_rebuild", "T7", "reason=silence", NULL) == 1,
          "one rebuild for silence");
    f_welcome(&h, good_welcome(3, 1, 1));
    CHECK(f_expect_fetch(&h, -1, "fetch after the epoch-3 Welcome on the new connection"), "fetch");
    CHECK(cst(&L).epoch == 3, "epoch 3 taken (%llu)", (unsigned long long)cst(&L).epoch);
    for (int p = 0; p < P; p++) f_update(&h, 3, p, 1, HONEST);
    CHECK(WAIT_FOR((dl_node_poll(L.n), nst(&L).adopted == 2 * P)), "the fetched fragments adopted in epoch 3");
    printf("ok: a mute synchronizer -> new connection and re-hello; its first Welcome taken even at a lower epoch\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (8) byzantine pushes (robustness benchmarks): the payload leaves corrupted,
// the learner's own state stays honest

static void test_byzantine(void)
{
    fake h;
    f_open(&h, "T8");
    learner L;
    dl_comms_opts co = base_opts(&h);
    co.byzantine = 1;
    co.byzantine_scale = -2.0;
    l_start(&L, co);
    join(&h, &L, good_welcome(5, 1, 1));
    for (size_t i = 0; i < total; i++) L.theta[i] += 0.125f;
    CHECK(dl_node_after_step(L.n, 1, H, TOK, 2.0, 0.0) == 1, "step 1: fragment 1 due");
    size_t k = dl_plan_fragment_numel(plan, 1);
    float *honest = calloc(k, sizeof(float)), *got = calloc(k, sizeof(float));
    dl_node_delta(L.n, 1, honest);
    dl_wire_msg m;
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, "push")) {
        memcpy(got, dl_wire_msg_payload(&m, 0), k * 4);
        int ok = m.env->push->fragment == 1;
        for (size_t i = 0; i < k && ok; i++) ok = got[i] == -2.0f * honest[i] && honest[i] != 0.0f;
        CHECK(ok, "the pushed delta is -2 x base - theta");
        dl_wire_msg_close(&m);
    }
    CHECK(nst(&L).pushes == 1 && dl_node_version(L.n, 1) == 1, "the node itself is untouched");
    free(honest);
    free(got);
    printf("ok: byzantine scale -2: the push leaves as -2 x the honest delta\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (9) text from the network never breaks a log line: a fatal Error's message
// reaches the state message (what dloco-learner prints) quoted and escaped

static void test_error_text(void)
{
    fake h;
    f_open(&h, "T9");
    learner L;
    l_start(&L, base_opts(&h));
    dl_wire_msg m;
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    dl_wire_msg_close(&m);
    Dloco__V1__Error e;
    dloco__v1__error__init(&e);
    e.kind = DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH;
    e.message = "say \"no\" \\ \xe2\x80\xae reversed";
    e.fatal = 1;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, "dloco", 1, h.id);
    dl_wire_set_error(&env, &e);
    fs_check_send(&h, NULL, &env, NULL, 0);
    CHECK(WAIT_FOR(dl_comms_state(L.c, NULL, 0) == DL_COMMS_REFUSED), "refused");
    char msg[640];
    dl_comms_state(L.c, msg, sizeof msg);
    CHECK(strstr(msg, "\"say \\\"no\\\" \\\\ \\xe2\\x80\\xae reversed\"") != NULL, "message quoted and escaped: %s",
          msg);
    printf("ok: a fatal Error's text is quoted, '\"' '\\' and non-ASCII bytes escaped\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (10) CURVE: a learner with the synchronizer's public key joins; one with a
// wrong server key never gets a message through: its failed handshakes
// rebuild the socket with a growing backoff, and the third in a row before
// any Welcome ends the session (REFUSED, `refused kind=handshake`: a wrong
// key cannot heal by retrying)

static void test_curve(void)
{
    if (!zmq_has("curve")) {
        printf("SKIP: CURVE: this libzmq has no CURVE\n");
        return;
    }
    dl_auth_keypair srv, cli, other;
    REQUIRE(zmq_curve_keypair(srv.public_z85, srv.secret_z85) == 0 &&
                zmq_curve_keypair(cli.public_z85, cli.secret_z85) == 0 &&
                zmq_curve_keypair(other.public_z85, other.secret_z85) == 0,
            "keypairs");
    fake h;
    f_open_curve(&h, "TC", &srv);
    learner L;
    dl_comms_opts co = base_opts(&h);
    memcpy(co.curve_server, srv.public_z85, 41);
    memcpy(co.curve_public, cli.public_z85, 41);
    memcpy(co.curve_secret, cli.secret_z85, 41);
    l_start(&L, co);
    join(&h, &L, good_welcome(5, 1, 1));
    CHECK(dl_comms_state(L.c, NULL, 0) == DL_COMMS_READY && cst(&L).rebuilds == 0, "joined over CURVE");
    l_stop(&L);
    f_close(&h);

    f_open_curve(&h, "TD", &srv);
    co = base_opts(&h);
    memcpy(co.curve_server, other.public_z85, 41); /* not the synchronizer's */
    memcpy(co.curve_public, cli.public_z85, 41);
    memcpy(co.curve_secret, cli.secret_z85, 41);
    l_start(&L, co);
    CHECK(WAIT_FOR(dl_comms_state(L.c, NULL, 0) == DL_COMMS_REFUSED), "refused after 3 failed handshakes");
    CHECK(ev_count("socket_rebuild", "TD", "rebuilds=1", "delay_ms=0", NULL) == 1 &&
              ev_count("socket_rebuild", "TD", "rebuilds=2", "delay_ms=20", NULL) == 1 &&
              ev_count("socket_rebuild", "TD", "rebuilds=3", NULL) == 0,
          "backoff 0, 20 ms, then no third rebuild");
    /* the comms thread sets the state before it writes the event */
    CHECK(WAIT_FOR(ev_count("refused", "TD", "kind=handshake", NULL) == 1), "refused kind=handshake");
    dl_wire_msg m;
    int got = fs_check_next(&h, &m, 50);
    CHECK(got < 0 && h.conns == 0, "nothing reached the synchronizer");
    if (got >= 0) dl_wire_msg_close(&m);
    printf("ok: CURVE: the right server key joins; a wrong one never connects, rebuilds with a backoff, and is "
           "refused at the third failed handshake\n");
    l_stop(&L);
    f_close(&h);
}

// ---------------------------------------------------------------------------
// (11) the dloco-learner binary: its rows (config errors), Hello.batch, the
// byzantine event, and a NaN fetch reply refused and fetched again


/* The first 64 KiB of a file ("" when missing), in a static buffer. */
static const char *slurp(const char *path)
{
    static char buf[1 << 16];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int file_has(const char *path, const char *needle) { return strstr(slurp(path), needle) != NULL; }

static void test_binary(const char *dir)
{
    char bin[600], corpus[700], out[700], err[700], events[700];
    const char *b = getenv("DLOCO_BIN");
    snprintf(bin, sizeof bin, "%s/learner/dloco-learner", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not found (set DLOCO_BIN)", bin);
        return;
    }
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(out, sizeof out, "%s/bin.out", dir);
    snprintf(err, sizeof err, "%s/bin.err", dir);
    snprintf(events, sizeof events, "%s/bin.events", dir);
    write_corpus(corpus);

    /* rows refused at start, before any data is read */
    char *bad1[] = {bin, "--server_key", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "--data", corpus, NULL};
    int st = reap(spawn(bad1, out, err));
    CHECK(st == 2 && file_has(err, "server_key and key_file go together"), "server_key alone: exit %d", st);
    char *bad2[] = {bin, "--byzantine", "scale:1e9", "--data", corpus, NULL};
    st = reap(spawn(bad2, out, err));
    CHECK(st == 2 && file_has(err, "option byzantine"), "byzantine scale:1e9: exit %d", st);
    char *bad3[] = {bin, "--update_max_ratio", "-1", "--data", corpus, NULL};
    st = reap(spawn(bad3, out, err));
    CHECK(st == 2, "update_max_ratio -1: exit %d", st);
    if (zmq_has("curve")) {
        char prefix[720], key[740], pub[740];
        snprintf(prefix, sizeof prefix, "%s/learner", dir);
        snprintf(key, sizeof key, "%s.key", prefix);
        snprintf(pub, sizeof pub, "%s.pub", prefix);
        REQUIRE(dl_auth_keygen(prefix, NULL) == 0, "keygen: %s", dl_errmsg());
        REQUIRE(chmod(key, 0644) == 0, "chmod");
        char *bad4[] = {bin, "--server_key", pub, "--key_file", key, "--data", corpus, NULL};
        st = reap(spawn(bad4, out, err));
        CHECK(st == 2 && file_has(err, "option key_file") && file_has(err, "chmod 600"),
              "a key file readable by others refused: exit %d: %s", st, slurp(err));
    }

    /* a run against the fake: the binary's own model */
    dl_model_config bc = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab = 256};
    REQUIRE(dl_model_config_check(&bc) == 0, "cfg");
    dl_plan *saved_plan = plan, *bp = NULL;
    float *saved_init = init_other;
    size_t saved_total = total;
    REQUIRE(dl_model_plan_open(&bc, P, &bp) == 0, "plan");
    plan = bp;
    total = dl_plan_total_numel(bp);
    init_other = calloc(total, sizeof(float));
    REQUIRE(dl_model_init_params(&bc, 2, init_other) == 0, "init");
    fake h;
    f_open(&h, "bin-trust");
    /* no recovery file: the build folder is shared by every run of this test */
    char *argv[] = {bin, "--recovery", "off",
                    "--connect", h.ep, "--id", "bin-trust", "--data", corpus, "--n_layer", "1", "--n_head", "2",
                    "--n_embd", "16", "--seq_len", "16", "--batch", "2", "--steps", "4", "--warmup", "1",
                    "--fragments", "4", "--threads", "1", "--flush_timeout_ms", "5000", "--connect_timeout_ms", "20000",
                    "--byzantine", "flip", "--events", events, NULL};
    pid_t pid = spawn(argv, out, err);
    const uint64_t E = 3;
    dl_wire_msg m;
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "binary hello")) {
        CHECK(m.env->hello->batch == 2, "Hello.batch = --batch (%u)", m.env->hello->batch);
        dl_wire_msg_close(&m);
    }
    f_welcome(&h, good_welcome(E, 0, 1));
    CHECK(f_expect_fetch(&h, -1, "binary fetch"), "fetch");
    for (int p = 0; p < P; p++) f_update(&h, E, p, 0, p == 0 ? NANS : HONEST);
    CHECK(f_expect_fetch(&h, 0, "the binary fetches fragment 0 again"), "refetch");
    f_update(&h, E, 0, 0, HONEST);
    uint64_t ver[P] = {0};
    int bye = 0, pushes = 0;
    while (!bye) {
        int body = fs_check_next(&h, &m, 20000);
        if (body < 0) {
            CHECK(0, "the binary went silent; stderr: %s", slurp(err));
            break;
        }
        if (body == DLOCO__V1__ENVELOPE__BODY_BYE) bye = 1;
        if (body == DLOCO__V1__ENVELOPE__BODY_PUSH) {
            int p = (int)m.env->push->fragment;
            uint64_t base = m.env->push->base_version;
            dl_wire_msg_close(&m);
            pushes++;
            f_merge(&h, E, p, base, ++ver[p]);
            continue;
        }
        dl_wire_msg_close(&m);
    }
    st = reap(pid);
    CHECK(st == 0 && pushes > 0, "the binary trained, pushed (%d) and exited 0 (%d)", pushes, st);
    CHECK(ev_count_file(events, "byzantine", "mode=flip", "scale=-1", NULL) == 1, "byzantine event");
    CHECK(file_has(err, "BYZANTINE MODE 'flip'"), "a loud warning");
    CHECK(ev_count_file(events, "update_refused", "fragment=0", "reason=nonfinite", NULL) == 1, "update_refused event");
    CHECK(ev_count_file(events, "learner_summary", "updates_refused=1", "exit_code=0", NULL) == 1,
          "the summary counts the refusal");
    printf("ok: dloco-learner: rows checked at start, Hello.batch, --byzantine flip announced, a NaN fetch reply "
           "refused and fetched again, training to the end\n");
    f_close(&h);

    /* a synchronizer that answers every Fetch with bad Updates (a payload shorter than its numel: 3 in a row
     * rebuild the connection; NaN values: refused) for longer than connect_timeout_ms, then good ones: the
     * binary keeps joining (bounded backoff) while it is answered, then trains to the end */
    fake j;
    f_open(&j, "bin-join");
    char jev[720];
    snprintf(jev, sizeof jev, "%s/join.events", dir);
    char *jargv[] = {bin, "--recovery", "off",
                     "--connect", j.ep, "--id", "bin-join", "--data", corpus, "--n_layer", "1", "--n_head", "2",
                     "--n_embd", "16", "--seq_len", "16", "--batch", "2", "--steps", "4", "--warmup", "1",
                     "--fragments", "4", "--threads", "1", "--flush_timeout_ms", "5000", "--connect_timeout_ms",
                     "1500", "--events", jev, NULL};
    pid = spawn(jargv, out, err);
    const int64_t lie_ns = 4000 * 1000000LL; /* bad answers for 4 s, longer than connect_timeout_ms */
    int64_t t_first = 0;
    int bad_sent = 0, hellos = 0, jpushes = 0, jbye = 0;
    uint64_t jver[P] = {0};
    int64_t t_heard = dl_clock_ns();
    while (!jbye) {
        int body = fs_check_next(&j, &m, 100);
        if (body < 0) { /* a synchronizer heartbeats while it has nothing else to say */
            if (dl_clock_ns() - t_heard > 20000 * 1000000LL) {
                CHECK(0, "the binary went silent while joining through bad updates; stderr: %s", slurp(err));
                break;
            }
            if (hellos) { /* to the connection heard last: it may be gone (the learner rebuilt it) */
                Dloco__V1__Heartbeat hb;
                dloco__v1__heartbeat__init(&hb);
                Dloco__V1__Envelope env;
                dl_wire_env_init(&env, "dloco", E, j.id);
                dl_wire_set_heartbeat(&env, &hb);
                (void)dl_wire_send(j.router, j.rid, j.rid_len, &env, NULL, NULL, 0, 0);
            }
            continue;
        }
        t_heard = dl_clock_ns();
        if (body == DLOCO__V1__ENVELOPE__BODY_HELLO) {
            hellos++;
            f_welcome(&j, good_welcome(E, 0, 1));
        } else if (body == DLOCO__V1__ENVELOPE__BODY_FETCH) {
            const Dloco__V1__Fetch *fe = m.env->fetch;
            if (!t_first) t_first = dl_clock_ns();
            int lying = dl_clock_ns() - t_first < lie_ns;
            for (int p = 0; p < P; p++) {
                int asked = fe->n_fragments == 0;
                for (size_t i = 0; i < fe->n_fragments; i++) asked |= (int)fe->fragments[i] == p;
                if (!asked) continue;
                if (!lying) {
                    f_update(&j, E, p, jver[p], HONEST);
                } else {
                    /* three short payloads in a row, then three NaN ones. The third short one makes the
                     * learner drop this connection (by design), possibly before the rest of this answer goes:
                     * a send that finds no peer is what the test provokes, not a failure (CI once aborted here) */
                    float *g = calloc(j.numel[p], sizeof(float));
                    size_t bytes = j.numel[p] * 4;
                    if (bad_sent % 6 < 3) bytes -= 4;
                    else global_of(p, jver[p], g), g[j.numel[p] / 3] = NAN;
                    if (fs_update_raw(&j, NULL, E, p, jver[p], g, bytes) == 0) bad_sent++;
                    free(g);
                }
            }
        } else if (body == DLOCO__V1__ENVELOPE__BODY_PUSH) {
            int p = (int)m.env->push->fragment;
            uint64_t base = m.env->push->base_version;
            jpushes++;
            f_merge(&j, E, p, base, ++jver[p]);
        } else if (body == DLOCO__V1__ENVELOPE__BODY_BYE) {
            jbye = 1;
        }
        dl_wire_msg_close(&m);
    }
    st = reap(pid);
    printf("joining through bad updates: %d bad updates sent over 4 s, %d Hellos (connections), then %d pushes; "
           "exit %d\n", bad_sent, hellos, jpushes, st);
    CHECK(st == 0 && jpushes > 0 && bad_sent >= 6, "the binary joined after %d bad updates, pushed %d, exit %d; %s",
          bad_sent, jpushes, st, slurp(err));
    CHECK(ev_count_file(jev, "socket_rebuild", "reason=bad_messages", NULL) >= 1, "short payloads rebuilt the socket");
    /* every push answered (pooled, merged): the final flush goes at once and waits for its own answers */
    CHECK(ev_count_file(jev, "push_hold_released", NULL) == 0, "no hold released: the final flush was answered");
    f_close(&j);
    free(init_other);
    dl_plan_close(&bp);
    plan = saved_plan;
    init_other = saved_init;
    total = saved_total;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    REQUIRE(dl_model_config_check(&CFG) == 0, "config");
    REQUIRE(dl_model_plan_open(&CFG, P, &plan) == 0, "plan: %s", dl_errmsg());
    total = dl_plan_total_numel(plan);
    init_other = calloc(total, sizeof(float));
    REQUIRE(dl_model_init_params(&CFG, 2, init_other) == 0, "init");
    char dir[] = "/tmp/dloco_trust.XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(evlog, sizeof evlog, "%s/events.log", dir);
    REQUIRE(dl_event_open(evlog, "learner") == 0, "event log: %s", dl_errmsg());

    test_nan();
    test_huge();
    test_epoch();
    test_welcome_bounds();
    test_version_jump();
    test_oversized();
    test_mute();
    test_byzantine();
    test_error_text();
    test_curve();
    test_binary(dir);

    dl_event_close();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(init_other);
    dl_plan_close(&plan);
    return CHECK_DONE("test_learner_trust");
}
