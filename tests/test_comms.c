/* Tests for learner/comms.c + node.c against a fake synchronizer: a real ROUTER on
 * loopback that checks the exact message sequence of docs/PROTOCOL.md, then the dloco-learner binary end to end. */
#include "learner/comms.h"
#include "core/event.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/model.h"
#include "core/plan.h"
#include "kernels/codec.h"
#include "learner/node.h"
#include "proto/wire.h"
#include "tests/fakesync.h"

#include "tests/check.h"
#include "tests/fakesync_check.h"
#include "tests/proc.h"

// ---------------------------------------------------------------------------
// the fake synchronizer (tests/fakesync.h), with this test's checks and Welcome settings

typedef dl_fakesync harness;

static void h_open(harness *h, const dl_plan *plan) { fs_open(h, plan, NULL, NULL); }
static void h_close(harness *h) { fs_close(h); }

static uint32_t welcome_chunk_bytes = 0; /* Welcome.chunk_bytes (0: whole pushes) */
static uint32_t welcome_update_codec = 0; /* Welcome.update_codec (0: full Updates only) */
static uint32_t welcome_shard = 0, welcome_shards = 0; /* Welcome.shard, shards (0: unsharded) */
static int learner_silence_rebuild_ms = 1500; /* the learner's --silence_rebuild_ms (test_silence: a quick rebuild) */
static uint32_t welcome_liveness = 100; /* the most a learner accepts: no silence-based re-hello (5 s at 50 ms)
                                         * unless a test lowers it */

static void h_welcome(harness *h, const char *id, uint64_t epoch, uint64_t version, uint32_t H, uint32_t hb_ms,
                      int must_fetch)
{
    fs_welcome_args a = {.epoch = epoch, .version = version, .h = H, .hb_ms = hb_ms, .liveness = welcome_liveness,
                         .must_fetch = must_fetch, .chunk_bytes = welcome_chunk_bytes,
                         .update_codec = welcome_update_codec, .shard = welcome_shard, .shards = welcome_shards};
    REQUIRE(fs_welcome(h, id, &a) == 0, "harness welcome");
}

static void h_update(harness *h, const char *id, uint64_t epoch, int p, uint64_t version, const float *g)
{
    REQUIRE(fs_update(h, id, epoch, p, version, g) == 0, "harness update");
}

/* One chunk of an Update: elements [off, off + n) of g. */
static void h_update_chunk(harness *h, const char *id, uint64_t epoch, int p, uint64_t version, const float *g,
                           uint64_t off, uint64_t n)
{
    REQUIRE(fs_update_chunk(h, id, epoch, p, version, g, off, n) == 0, "harness update chunk");
}

/* A delta Update of p at `version` (= version - 1 + decode), elements [off,
 * off + n) in codec dc: payload holds the encoding of the whole fragment,
 * the chunk's bytes are its block-aligned slice. n == numel: one frame. */
static void h_update_delta(harness *h, const char *id, uint64_t epoch, int p, uint64_t version, const dl_codec *dc,
                           const uint8_t *payload, uint64_t off, uint64_t n)
{
    Dloco__V1__Update u;
    dloco__v1__update__init(&u);
    u.fragment = (uint32_t)p;
    u.version = version;
    u.delta = 1;
    u.codec = (Dloco__V1__Codec)dc->id;
    u.block_size = dc->block;
    u.topk = dc->topk;
    u.numel = h->numel[p];
    if (n < h->numel[p]) {
        u.chunk_offset = off;
        u.chunk_numel = n;
    }
    const uint8_t *from = payload + (off ? dl_codec_bytes(dc, off) : 0);
    size_t len = (size_t)dl_codec_bytes(dc, n);
    u.checksum = dl_wire_checksum(from, len);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h->run_id, epoch, id);
    dl_wire_set_update(&env, &u);
    const void *pl[1] = {from};
    REQUIRE(fs_send_frames(h, id, &env, pl, &len, 1) == 0, "harness send delta");
}

static void h_ack(harness *h, const char *id, uint64_t epoch, int p, uint64_t base, int decision, uint64_t merged)
{
    REQUIRE(fs_ack(h, id, epoch, p, base, decision, merged) == 0, "harness ack");
}

static void h_error(harness *h, const char *id, uint64_t epoch, int code, const char *msg, int fatal)
{
    REQUIRE(fs_error(h, id, epoch, code, msg, fatal) == 0, "harness error");
}

static void h_heartbeat(harness *h, const char *id, uint64_t epoch)
{
    REQUIRE(fs_heartbeat(h, id, epoch) == 0, "harness heartbeat");
}

// ---------------------------------------------------------------------------
// in-process learner: tiny GPT plan, a parameter buffer the test trains itself

#define P 4
#define TOK 32
static dl_model_config CFG = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16};
static dl_plan *plan;
static size_t total;

static void global_of(int p, uint64_t version, float *g)
{
    size_t n = dl_plan_fragment_numel(plan, p);
    for (size_t i = 0; i < n; i++) g[i] = (float)((long)(i * 13 + (size_t)p * 5 + version * 11) % 129 - 64) / 8.0f;
}

static void train_step(float *theta, int64_t step)
{
    for (size_t i = 0; i < total; i++) theta[i] += (float)((long)(i * 7 + (size_t)step * 3) % 5 - 2) / 8.0f;
}

static int due(int64_t step, int p, int H) { return step > 0 && (step - (p * H) / P) % H == 0; }

typedef struct {
    float *delta[P];     /* expected payload of the next push of p: base - theta at push time */
    uint64_t steps[P], tokens[P], base[P];
} expected;

/* Snapshot what a push of p made now must carry. */
static void expect_push(expected *e, dl_node *n, int p)
{
    size_t k = dl_plan_fragment_numel(plan, p);
    if (!e->delta[p]) e->delta[p] = calloc(k, sizeof(float));
    dl_node_delta(n, p, e->delta[p]);
    e->steps[p] = dl_node_steps(n, p);
    e->tokens[p] = dl_node_tokens(n, p);
    e->base[p] = dl_node_version(n, p);
}

/* Receive one push of `p` (-1: any) and check it against the snapshot. */
static int recv_push(harness *h, const expected *e, int p, uint64_t *base_out, const char *ctx)
{
    dl_wire_msg m;
    if (!fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, ctx)) return -1;
    const Dloco__V1__Push *u = m.env->push;
    int f = (int)u->fragment;
    CHECK(p < 0 || f == p, "%s: push of fragment %d, expected %d", ctx, f, p);
    if (p < 0) p = f; /* any fragment */
    if (f == p) {
        size_t k = dl_plan_fragment_numel(plan, p);
        float *d = malloc(k * sizeof(float));
        memcpy(d, dl_wire_msg_payload(&m, 0), k * sizeof(float));
        CHECK(memcmp(d, e->delta[p], k * sizeof(float)) == 0, "%s: payload of %d == base - theta", ctx, p);
        CHECK(u->steps == e->steps[p] && u->tokens == e->tokens[p] && u->base_version == e->base[p],
              "%s: push %d steps %llu tokens %llu base %llu, want %llu %llu %llu", ctx, p,
              (unsigned long long)u->steps, (unsigned long long)u->tokens, (unsigned long long)u->base_version,
              (unsigned long long)e->steps[p], (unsigned long long)e->tokens[p], (unsigned long long)e->base[p]);
        CHECK(u->codec == DLOCO__V1__CODEC__CODEC_FP32 && u->numel == k && u->block_size == 0, "%s: fp32 x numel", ctx);
        free(d);
    }
    if (base_out) *base_out = u->base_version;
    dl_wire_msg_close(&m);
    return f;
}

static int hold_ms = -1, hold_adopt = DL_ADOPT_OVERWRITE;
static dl_codec push_codec = {.id = DL_CODEC_FP32}; /* the learner's push encoding (test_codec) */
static int push_rounding = DL_ROUND_NEAREST;

static dl_comms *start_learner(harness *h, const char *id, float *theta, dl_mailbox **mb, dl_node **node)
{
    REQUIRE(dl_mailbox_open(plan, mb) == 0, "mailbox open: %s", dl_errmsg());
    dl_comms_opts co = {
        .mailbox = *mb,
        .endpoint = h->ep,
        .learner_id = id,
        .run_id = "dloco",
        .plan = plan,
        .fingerprint = dl_model_fingerprint(&CFG, plan),
        .n_layer = (uint32_t)CFG.n_layer,
        .n_head = (uint32_t)CFG.n_head,
        .n_embd = (uint32_t)CFG.n_embd,
        .seq_len = (uint32_t)CFG.seq_len,
        .vocab = (uint32_t)CFG.vocab,
        .device = "cpu",
        .connect_timeout_ms = 20000,
        .silence_rebuild_ms = learner_silence_rebuild_ms,
        .push_codec = push_codec,
        .push_rounding = push_rounding,
        .error_feedback = 1,
    };
    dl_comms *c = NULL;
    REQUIRE(dl_comms_open(&co, &c) == 0, "comms open: %s", dl_errmsg());
    /* These scenarios test the session message by message, with pushes made
     * while earlier ones are pooled: the hold rule (test_hold) is released at
     * once (push_decision_timeout_ms < 0) so every due push is made. */
    dl_node_opts no = {.plan = plan, .params = theta, .adopt = hold_adopt, .alpha = 0.5f,
                       .push_decision_timeout_ms = hold_ms};
    REQUIRE(dl_node_open(&no, *mb, node) == 0, "node open: %s", dl_errmsg());
    REQUIRE(dl_comms_start(c) == 0, "comms start: %s", dl_errmsg());
    return c;
}

static dl_comms_stats stats(dl_comms *c)
{
    dl_comms_stats s;
    dl_comms_get_stats(c, &s);
    return s;
}

/* The Hello a new session opens with (what it says is test_session's business). */
static void h_hello(harness *h)
{
    dl_wire_msg m;
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    dl_wire_msg_close(&m);
}

/* A must_fetch Welcome (every fragment at `version`) and the Fetch it brings. */
static void h_fetch_all(harness *h, const char *id, uint64_t epoch, uint64_t version, uint32_t H, uint32_t hb_ms)
{
    h_welcome(h, id, epoch, version, H, hb_ms, 1);
    dl_wire_msg m;
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch"), "fetch");
    dl_wire_msg_close(&m);
}

/* The join the scenarios start from once the Hello came: h_fetch_all, every fragment's full Update at
 * `version` (global_of), and the node ready. */
static void h_join(harness *h, const char *id, dl_node *n, uint64_t epoch, uint64_t version, uint32_t H,
                   uint32_t hb_ms)
{
    h_fetch_all(h, id, epoch, version, H, hb_ms);
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, version, g);
        h_update(h, id, epoch, p, version, g);
    }
    free(g);
    REQUIRE(dl_node_wait_ready(n, WAIT_MS, NULL) == 0, "ready: %s", dl_errmsg());
}

typedef struct {
    dl_node *node;
    uint64_t step;
    int left;
} finish_args;

static void *finish_thread(void *arg)
{
    finish_args *a = arg;
    a->left = dl_node_finish(a->node, WAIT_MS, a->step, "done");
    return NULL;
}

// ---------------------------------------------------------------------------
// scenario 1: the whole session of one learner, message by message

static void test_session(harness *h, const char *dir)
{
    const char *id = "L1";
    const int H = 4;
    char evlog[512];
    snprintf(evlog, sizeof evlog, "%s/events.log", dir);
    REQUIRE(dl_event_open(evlog, "test") == 0, "event log: %s", dl_errmsg());
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(h, id, theta, &mb, &n);
    dl_wire_msg m;
    uint64_t E = 7;

    /* Hello: fingerprint, P, model, empty held_versions; retried after 2 s */
    for (int attempt = 0; attempt < 2; attempt++) {
        REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello %d", attempt);
        const Dloco__V1__Hello *he = m.env->hello;
        CHECK(he->fingerprint == dl_model_fingerprint(&CFG, plan), "hello fingerprint");
        CHECK(he->num_fragments == P && he->n_held_versions == 0, "hello P=%u held %zu", he->num_fragments,
              he->n_held_versions);
        CHECK(he->n_layer == 1 && he->n_head == 2 && he->n_embd == 8 && he->seq_len == 4 && he->vocab == 16,
              "hello model summary");
        /* no ZMQ_ROUTING_ID: libzmq's own, 5 bytes starting with 0 */
        CHECK(!strcmp(m.env->learner_id, id) && m.id_len == 5 && m.id[0] == 0,
              "learner id %s, routing id of %zu bytes assigned by libzmq", m.env->learner_id, m.id_len);
        CHECK(!strcmp(m.env->run_id, "dloco") && m.env->epoch == 0, "run id and epoch 0 before any welcome");
        dl_wire_msg_close(&m);
    }
    CHECK(WAIT_FOR(stats(c).hellos == 2), "hello re-sent once without a welcome (%llu)",
          (unsigned long long)stats(c).hellos);
    printf("ok: hello (fingerprint, P, model, no held versions), re-sent after 2 s without welcome\n");

    /* Welcome must_fetch -> Fetch all -> P updates -> ready */
    h_welcome(h, id, E, 3, (uint32_t)H, 50, 1);
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch"), "fetch");
    CHECK(m.env->fetch->n_fragments == 0 && m.env->epoch == E, "fetch all (empty list) in epoch %llu",
          (unsigned long long)m.env->epoch);
    dl_wire_msg_close(&m);
    CHECK(!dl_node_holds_all(n), "not ready before the updates");
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int p = 0; p < P; p++) {
        global_of(p, 3, g);
        h_update(h, id, E, p, 3, g);
    }
    CHECK(dl_node_wait_ready(n, WAIT_MS, NULL) == 0, "initial fetch: %s", dl_errmsg());
    for (int p = 0; p < P; p++) {
        global_of(p, 3, g);
        CHECK(memcmp(dl_node_base(n, p), g, dl_plan_fragment_numel(plan, p) * 4) == 0 && dl_node_version(n, p) == 3,
              "fragment %d fetched at version 3", p);
    }
    CHECK(dl_comms_h(c) == (uint32_t)H, "H from welcome");
    printf("ok: welcome(must_fetch) -> fetch all -> %d updates -> training starts from the global model\n", P);

    /* pushes as scheduled; each acked MERGED_PENDING */
    expected e = {0};
    int64_t step = 0;
    for (; step < H; ) {
        step++;
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.0);
        for (int p = 0; p < P; p++) {
            if (!due(step, p, H)) continue;
            expect_push(&e, n, p);
            uint64_t b;
            if (recv_push(h, &e, p, &b, "scheduled push") == p)
                h_ack(h, id, E, p, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
        }
        dl_node_poll(n);
    }
    printf("ok: pushes of steps 1..%d arrive as dl_plan_due says, payload = base - theta, steps/tokens since adopt\n",
           H);

    /* ACCEPTED + Update: adopted only at the next step boundary */
    const int pa = 1; /* pushed at step 1 with base 3 */
    uint64_t upd0 = stats(c).updates;
    h_ack(h, id, E, pa, 3, DLOCO__V1__DECISION__DECISION_ACCEPTED, 4);
    global_of(pa, 4, g);
    h_update(h, id, E, pa, 4, g);
    CHECK(WAIT_FOR(stats(c).updates == upd0 + 1), "update received by the comms thread");
    CHECK(dl_node_version(n, pa) == 3, "not adopted before the step boundary");
    CHECK(dl_node_poll(n) == 1, "adopted at the step boundary");
    CHECK(dl_node_version(n, pa) == 4 && dl_node_steps(n, pa) == 0, "fragment %d at version 4, counters 0", pa);
    float *th = calloc(dl_plan_fragment_numel(plan, pa), sizeof(float));
    dl_plan_gather(plan, pa, theta, th);
    CHECK(memcmp(th, g, dl_plan_fragment_numel(plan, pa) * 4) == 0, "overwrite: theta_%d = new global", pa);
    free(th);
    dl_comms_stats s = stats(c);
    CHECK(s.accepted == 1 && s.acks_pending == (uint64_t)H && s.staleness_n == 1 && s.staleness_sum == 0,
          "accepted %llu pending %llu staleness %llu/%llu", (unsigned long long)s.accepted,
          (unsigned long long)s.acks_pending, (unsigned long long)s.staleness_sum, (unsigned long long)s.staleness_n);
    printf("ok: ack ACCEPTED + update v4 adopted at the step boundary (not before)\n");

    /* coalescing: the push of fragment 2 at step 6 is not acked, so its
     * pushes at steps 10 and 14 wait in the slot and collapse into one */
    const int pc = 2;
    for (; step < 14; ) {
        step++;
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.0);
        for (int p = 0; p < P; p++) {
            if (!due(step, p, H)) continue;
            expect_push(&e, n, p);
            if (p == pc && step > 6) continue; /* held back by flow control */
            uint64_t b;
            if (recv_push(h, &e, p, &b, "push during coalescing") == p && p != pc)
                h_ack(h, id, E, p, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
        }
        dl_node_poll(n);
    }
    s = stats(c);
    CHECK(s.coalesced == 1, "the step-10 push of %d was replaced by the step-14 one: coalesced %llu", pc,
          (unsigned long long)s.coalesced);
    h_ack(h, id, E, pc, 3, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    uint64_t b;
    CHECK(recv_push(h, &e, pc, &b, "coalesced push") == pc, "the queued push leaves after the ack");
    CHECK(e.steps[pc] == 14, "it is the newest: 14 steps since adopt");
    h_ack(h, id, E, pc, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    printf("ok: unacked push holds its fragment; 2 later pushes collapse into 1 carrying all 14 steps\n");

    /* heartbeats carry the training thread's progress */
    dl_mailbox_set_progress(mb, 777, 777 * TOK, 3.5);
    int hb0 = h->heartbeats;
    int64_t t0 = dl_clock_ns();
    while ((h->heartbeats < hb0 + 2 || h->hb_step != 777) && dl_clock_ns() - t0 < WAIT_MS * 1000000LL) {
        if (fs_check_next(h, &m, 20) >= 0) {
            CHECK(0, "unexpected %s while idle", dl_wire_body_name(m.env->body_case));
            dl_wire_msg_close(&m);
        }
    }
    CHECK(h->heartbeats >= hb0 + 2 && h->hb_step == 777, "heartbeats flow when idle (%d, last step %llu)",
          h->heartbeats - hb0, (unsigned long long)h->hb_step);
    printf("ok: heartbeats flow when idle and carry step/tokens\n");

    /* a message from an older epoch is ignored */
    global_of(3, 99, g);
    h_update(h, id, E - 1, 3, 99, g);
    CHECK(WAIT_FOR(stats(c).old_epoch == 1), "old-epoch update counted as ignored");
    CHECK(dl_node_poll(n) == 0 && dl_node_version(n, 3) == 3, "and not adopted");
    printf("ok: update from an older epoch ignored\n");

    /* DL_ENOTFOUND (non-fatal): re-hello with held versions; welcome without fetch */
    h_error(h, id, E, DL_ENOTFOUND, "unknown learner: send hello", 0);
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "re-hello after DL_ENOTFOUND"), "re-hello");
    {
        const Dloco__V1__Hello *he = m.env->hello;
        int ok = he->n_held_versions == P;
        for (int p = 0; ok && p < P; p++) ok = he->held_versions[p] == dl_node_version(n, p);
        CHECK(ok, "re-hello carries the held versions (%zu)", he->n_held_versions);
        CHECK(m.env->epoch == E && he->step == 777, "re-hello epoch %llu step %llu",
              (unsigned long long)m.env->epoch, (unsigned long long)he->step);
        dl_wire_msg_close(&m);
    }
    h_welcome(h, id, E, 3, (uint32_t)H, 50, 0);
    CHECK(WAIT_FOR(dl_comms_state(c, NULL, 0) == DL_COMMS_READY), "ready again");
    step++;
    train_step(theta, step); /* step 15: fragment 3 */
    dl_node_after_step(n, step, H, TOK, 2.5, 0.0);
    expect_push(&e, n, 3);
    if (recv_push(h, &e, 3, &b, "push after re-hello") == 3)
        h_ack(h, id, E, 3, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    CHECK(stats(c).rehellos == 1 && stats(c).fetches == 1, "1 re-hello, no new fetch");
    printf("ok: Error DL_ENOTFOUND -> re-hello with held versions -> welcome -> pushes resume\n");

    /* newer epoch: the synchronizer restarted; must_fetch -> every fragment rebased */
    h_heartbeat(h, id, E + 1);
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "re-hello after newer epoch"), "re-hello");
    /* the epoch of a message that is not a Welcome is never taken: the Hello carries the welcomed one */
    CHECK(m.env->epoch == E && m.env->hello->n_held_versions == P, "re-hello in epoch %llu with held versions",
          (unsigned long long)m.env->epoch);
    dl_wire_msg_close(&m);
    E++;
    h_welcome(h, id, E, 10, (uint32_t)H, 50, 1);
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch after must_fetch"), "fetch");
    CHECK(m.env->fetch->n_fragments == 0, "fetch all");
    dl_wire_msg_close(&m);
    for (int p = 0; p < P; p++) {
        global_of(p, 10, g);
        h_update(h, id, E, p, 10, g);
    }
    int all10 = WAIT_FOR((dl_node_poll(n), dl_node_version(n, 0) == 10 && dl_node_version(n, 1) == 10 &&
                                               dl_node_version(n, 2) == 10 && dl_node_version(n, 3) == 10));
    CHECK(all10, "all fragments rebased to version 10");
    for (int p = 0; p < P; p++) {
        global_of(p, 10, g);
        float *t = calloc(dl_plan_fragment_numel(plan, p), sizeof(float));
        dl_plan_gather(plan, p, theta, t);
        CHECK(memcmp(t, g, dl_plan_fragment_numel(plan, p) * 4) == 0 && dl_node_steps(n, p) == 0,
              "fragment %d rebased: theta = global v10, counters 0", p);
        free(t);
    }
    CHECK(stats(c).rehellos == 2 && stats(c).epoch == E, "2 re-hellos, epoch %llu", (unsigned long long)E);
    printf("ok: newer epoch -> re-hello -> welcome(must_fetch) -> fetch -> all fragments rebased\n");

    /* final flush: every fragment with progress, answered in all three ways, then Bye */
    for (int k = 0; k < 2; k++) {
        step++;
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.0);
        for (int p = 0; p < P; p++) {
            if (!due(step, p, H)) continue;
            expect_push(&e, n, p);
            if (recv_push(h, &e, p, &b, "push before flush") == p)
                h_ack(h, id, E, p, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
        }
    }
    for (int p = 0; p < P; p++) {
        CHECK(dl_node_steps(n, p) == 2, "fragment %d has 2 steps of progress", p);
        expect_push(&e, n, p); /* nothing changes theta any more */
    }
    finish_args fa = {.node = n, .step = (uint64_t)step, .left = -1};
    pthread_t th_fin;
    REQUIRE(pthread_create(&th_fin, NULL, finish_thread, &fa) == 0, "thread");
    int seen[P] = {0};
    for (int k = 0; k < P; k++) {
        int p = recv_push(h, &e, -1, NULL, "flush push"); /* payload and 2 steps checked against the snapshot */
        REQUIRE(p >= 0, "flush push %d", k);
        CHECK(!seen[p], "fragment %d flushed once", p);
        seen[p] = 1;
    }
    /* every push sent must get its final decision before Bye: fragment 0's
     * push of step 16 and its flush push are both merged into v11; fragment
     * 1's push of step 17 is merged, its flush push dropped as stale;
     * fragment 2's flush push is rejected; fragment 3's stays pending */
    h_ack(h, id, E, 0, 10, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    h_ack(h, id, E, 0, 10, DLOCO__V1__DECISION__DECISION_ACCEPTED, 11);
    h_ack(h, id, E, 0, 10, DLOCO__V1__DECISION__DECISION_ACCEPTED, 11);
    global_of(0, 11, g);
    h_update(h, id, E, 0, 11, g);
    h_ack(h, id, E, 1, 10, DLOCO__V1__DECISION__DECISION_ACCEPTED, 11);
    global_of(1, 11, g);
    h_update(h, id, E, 1, 11, g);
    h_ack(h, id, E, 1, 10, DLOCO__V1__DECISION__DECISION_DROPPED_STALE, 0);
    h_update(h, id, E, 1, 11, g); /* the rebase that follows every DROPPED_STALE */
    h_ack(h, id, E, 2, 10, DLOCO__V1__DECISION__DECISION_REJECTED, 0);
    /* a rejected push's progress is the learner's again (node.h "Push
     * fates"): the final flush sends it once more, and this time it merges */
    recv_push(h, &e, 2, NULL, "flush push of fragment 2 again after its rejection");
    h_ack(h, id, E, 2, 10, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    h_ack(h, id, E, 2, 10, DLOCO__V1__DECISION__DECISION_ACCEPTED, 11);
    global_of(2, 11, g);
    h_update(h, id, E, 2, 11, g);
    h_ack(h, id, E, 3, 10, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    /* fragment 3 is still pending: no Bye may come yet */
    CHECK(WAIT_FOR(dl_mailbox_flush_pending(mb) == 1), "flush waits for fragment 3 only (%d)", dl_mailbox_flush_pending(mb));
    int early = fs_check_next(h, &m, 300);
    CHECK(early < 0, "nothing but heartbeats before the last answer (got %s)",
          early < 0 ? "-" : dl_wire_body_name((Dloco__V1__Envelope__BodyCase)early));
    if (early >= 0) dl_wire_msg_close(&m);
    h_ack(h, id, E, 3, 10, DLOCO__V1__DECISION__DECISION_ACCEPTED, 11);
    global_of(3, 11, g);
    h_update(h, id, E, 3, 11, g);
    if (fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_BYE, &m, "bye")) {
        CHECK(m.env->bye->step == (uint64_t)step && !strcmp(m.env->bye->reason, "done"), "bye step %llu reason %s",
              (unsigned long long)m.env->bye->step, m.env->bye->reason);
        dl_wire_msg_close(&m);
    }
    pthread_join(th_fin, NULL);
    CHECK(fa.left == 0, "flush complete: %d unanswered", fa.left);
    CHECK(dl_node_version(n, 0) == 11 && dl_node_version(n, 1) == 11 && dl_node_version(n, 2) == 11 &&
              dl_node_version(n, 3) == 11,
          "flush updates adopted");
    dl_comms_stop(c);
    s = stats(c);
    CHECK(s.state == DL_COMMS_DONE, "comms done after bye (%d)", s.state);
    CHECK(s.dropped_stale == 1 && s.rejected == 1 && s.accepted == 6, "decisions counted: %llu %llu %llu",
          (unsigned long long)s.dropped_stale, (unsigned long long)s.rejected, (unsigned long long)s.accepted);
    CHECK(s.bytes_sent > s.push_bytes && s.push_bytes > 0 && s.bytes_recv > s.updates * 4, "bytes counted");
    printf("ok: final flush pushes all %d fragments, waits until every push sent has its update / dropped / "
           "rejected answer, then bye\n", P);

    /* the event log: one ack / update event per Ack / Update received */
    dl_event_close();
    FILE *f = fopen(evlog, "r");
    REQUIRE(f, "event log");
    char line[1024];
    int acks = 0, upds = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        acks += strstr(line, " event=ack learner=L1 ") != NULL;
        upds += strstr(line, " event=update learner=L1 ") != NULL;
        found += strstr(line, " event=ack learner=L1 epoch=7 fragment=1 base_version=3 decision=accepted "
                              "merged_version=4\n") != NULL;
    }
    fclose(f);
    uint64_t want_acks = s.acks_pending + s.accepted + s.dropped_stale + s.rejected;
    CHECK((uint64_t)acks == want_acks && (uint64_t)upds == s.updates, "ack log: %d acks (want %llu), %d updates (%llu)",
          acks, (unsigned long long)want_acks, upds, (unsigned long long)s.updates);
    CHECK(found == 1, "ack log has the accepted line of fragment 1");
    printf("ok: the event log has %d ack and %d update events\n", acks, upds);

    free(g);
    for (int p = 0; p < P; p++) free(e.delta[p]);
    dl_node_close(&n);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    free(theta);
}

// ---------------------------------------------------------------------------
// scenario 2: a fatal Error stops the learner with the server's message

static void test_fatal(harness *h)
{
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(h, "L2", theta, &mb, &n);
    h_hello(h);
    h_error(h, "L2", 1, DL_EMISMATCH, "fingerprint mismatch: learner 0x1, synchronizer 0x2", 1);
    int rc = dl_node_wait_ready(n, WAIT_MS, NULL);
    CHECK(rc == DL_EPROTO, "wait_ready returns DL_EPROTO, got %d (%s)", rc, dl_errmsg());
    CHECK(strstr(dl_errmsg(), "fingerprint mismatch: learner 0x1, synchronizer 0x2") != NULL, "message: %s",
          dl_errmsg());
    char msg[640];
    CHECK(dl_comms_state(c, msg, sizeof msg) == DL_COMMS_REFUSED && strstr(msg, "refused learner L2"),
          "state refused: %s", msg);
    dl_node_close(&n);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    free(theta);
    printf("ok: fatal Error -> learner refused with the synchronizer's message\n");
}

// ---------------------------------------------------------------------------
// scenario 3: a synchronizer that goes silent (no heartbeats) gets a re-hello
// after max(1 s, liveness * heartbeat_ms)

static void test_silence(harness *h)
{
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(h, "L3", theta, &mb, &n);
    dl_wire_msg m;
    REQUIRE(fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    uint8_t rid0[DL_WIRE_ROUTING_ID_MAX + 1];
    size_t rid0_len = m.id_len;
    memcpy(rid0, m.id, m.id_len);
    dl_wire_msg_close(&m);
    welcome_liveness = 2;
    h_join(h, "L3", n, 5, 1, 4, 50);
    welcome_liveness = 100;
    /* from now on the harness only listens */
    int hb0 = h->heartbeats;
    /* first a re-hello on the same connection (a long transfer may be all
     * that keeps the synchronizer's messages away), then, as the silence
     * lasts, a new connection */
    if (fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "re-hello after silence")) {
        CHECK(m.env->hello->n_held_versions == P && m.env->epoch == 5, "re-hello with held versions in epoch 5");
        CHECK(m.id_len == rid0_len && memcmp(m.id, rid0, rid0_len) == 0, "the first re-hello on the same connection");
        dl_wire_msg_close(&m);
    }
    CHECK(h->heartbeats > hb0, "the learner kept sending heartbeats while the synchronizer was silent");
    CHECK(stats(c).rehellos == 1 && stats(c).rebuilds == 0, "one re-hello, no rebuild yet (%llu)",
          (unsigned long long)stats(c).rebuilds);
    int rebuilt = 0;
    for (int k = 0;
         k < 10 && !rebuilt && fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello after the rebuild"); k++) {
        rebuilt = m.id_len != rid0_len || memcmp(m.id, rid0, rid0_len) != 0;
        dl_wire_msg_close(&m);
    }
    CHECK(rebuilt, "a Hello on a new connection once the silence lasted");
    CHECK(stats(c).rebuilds == 1 && dl_comms_state(c, NULL, 0) == DL_COMMS_HELLO,
          "one rebuild (%llu), waiting for welcome", (unsigned long long)stats(c).rebuilds);
    dl_node_close(&n);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    free(theta);
    printf("ok: silent synchronizer (liveness x heartbeat) -> re-hello, then a new connection, with held versions\n");
}

// ---------------------------------------------------------------------------
// scenario 3b: Update chunks arriving at a thin link's pace are not silence.
// The synchronizer sends no heartbeat while a learner's queue holds payload,
// and zmq shows a chunk only once all of it arrived: the learner measures
// the pace between chunks of one Update and waits 3 chunk times.

static void test_slow_downlink(harness *h)
{
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    learner_silence_rebuild_ms = 30000; /* its cap on the stretched limit: not in the way here */
    dl_comms *c = start_learner(h, "L3b", theta, &mb, &n);
    learner_silence_rebuild_ms = 1500;
    h_hello(h);
    welcome_liveness = 2; /* 2 x 50 ms: the silence limit is its 1 s floor */
    h_fetch_all(h, "L3b", 6, 1, 4, 50);
    welcome_liveness = 100;
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    global_of(0, 1, g);
    uint64_t nel = h->numel[0], k = nel / 4;
    /* chunk 1 -> 2 in 0.7 s (within the 1 s limit): a chunk time of 0.7 s
     * is measured; chunk 3 comes 1.4 s later, past the 1 s limit and within
     * 3 x 0.7 s (these sleeps are the link's pace, the stimulus) */
    h_update_chunk(h, "L3b", 6, 0, 1, g, 0, k);
    usleep(700000);
    h_update_chunk(h, "L3b", 6, 0, 1, g, k, k);
    usleep(1400000);
    h_update_chunk(h, "L3b", 6, 0, 1, g, 2 * k, k);
    h_update_chunk(h, "L3b", 6, 0, 1, g, 3 * k, nel - 3 * k);
    for (int p = 1; p < P; p++) {
        global_of(p, 1, g);
        h_update(h, "L3b", 6, p, 1, g);
    }
    CHECK(dl_node_wait_ready(n, WAIT_MS, NULL) == 0, "ready: %s", dl_errmsg());
    CHECK(stats(c).rehellos == 0 && stats(c).rebuilds == 0,
          "no re-hello while Update chunks arrive at a thin link's pace (%llu re-hellos)",
          (unsigned long long)stats(c).rehellos);
    free(g);
    dl_node_close(&n);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    free(theta);
    printf("ok: Update chunks 1.4 s apart after a measured 0.7 s pace -> no re-hello (the limit is 3 chunk times)\n");
}

// ---------------------------------------------------------------------------
// scenario 3b: the hold rule. A push of p made while the previous one is
// undecided would carry its progress again; the node holds it until the
// decision and the update came, then pushes only what is new (keep mode).

static void test_hold(harness *h)
{
    const char *id = "L4";
    const int H = 4;
    hold_ms = 30000;
    hold_adopt = DL_ADOPT_KEEP;
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(h, id, theta, &mb, &n);
    hold_ms = -1;
    hold_adopt = DL_ADOPT_OVERWRITE;
    dl_wire_msg m;
    const uint64_t E = 2;
    h_hello(h);
    h_join(h, id, n, E, 1, (uint32_t)H, 50);
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    expected e = {0};
    uint64_t b;
    for (int64_t step = 1; step <= 4; step++) { /* fragments 1, 2, 3, 0: pushed and pooled */
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.25);
        int p = (int)((step % 4) == 0 ? 0 : step);
        expect_push(&e, n, p);
        if (recv_push(h, &e, p, &b, "first push") == p)
            h_ack(h, id, E, p, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    }
    CHECK(WAIT_FOR(stats(c).acks_pending == 4), "4 pushes pooled");
    train_step(theta, 5);
    CHECK(dl_node_after_step(n, 5, H, TOK, 2.5, 0.25) == 0 && dl_node_owes(n, 1), "step 5: fragment 1 due but held");
    int got = fs_check_next(h, &m, 300);
    CHECK(got < 0, "nothing is posted while the push of step 1 is undecided (got %s)",
          got < 0 ? "-" : dl_wire_body_name((Dloco__V1__Envelope__BodyCase)got));
    if (got >= 0) dl_wire_msg_close(&m);
    dl_node_stats ns;
    dl_node_get_stats(n, &ns);
    CHECK(ns.held == 1 && ns.pushes == 4 && stats(c).pushes == 4, "held %llu, pushes %llu",
          (unsigned long long)ns.held, (unsigned long long)ns.pushes);
    /* decide it: ACCEPTED + Update v2, adopted (keep) at the step boundary */
    h_ack(h, id, E, 1, 1, DLOCO__V1__DECISION__DECISION_ACCEPTED, 2);
    global_of(1, 2, g);
    h_update(h, id, E, 1, 2, g);
    CHECK(WAIT_FOR(stats(c).updates == P + 1), "update received");
    CHECK(dl_node_poll(n) == 1 && dl_node_version(n, 1) == 2, "adopted v2");
    CHECK(dl_node_steps(n, 1) == 4 && dl_node_tokens(n, 1) == 4 * TOK, "keep: counters since the first push (%llu)",
          (unsigned long long)dl_node_steps(n, 1));
    train_step(theta, 6);
    CHECK(dl_node_after_step(n, 6, H, TOK, 2.5, 0.25) == 1 && !dl_node_owes(n, 1), "step 6: the owed push is made");
    expect_push(&e, n, 1);
    CHECK(e.steps[1] == 5 && e.tokens[1] == 5 * TOK && e.base[1] == 2,
          "it carries only steps 2..6 (%llu steps, %llu tokens) on base 2", (unsigned long long)e.steps[1],
          (unsigned long long)e.tokens[1]);
    CHECK(fabs(dl_node_compute_s(n, 1) - 5 * 0.25) < 1e-9, "compute_s since the first push: %g",
          dl_node_compute_s(n, 1));
    dl_wire_msg pm;
    if (fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_PUSH, &pm, "owed push")) {
        const Dloco__V1__Push *u = pm.env->push;
        size_t k = dl_plan_fragment_numel(plan, 1);
        CHECK(u->fragment == 1 && u->steps == 5 && u->tokens == 5 * TOK && u->base_version == 2 &&
                  fabs(u->compute_s - 1.25) < 1e-9 &&
                  !memcmp(dl_wire_msg_payload(&pm, 0), e.delta[1], k * sizeof(float)),
              "owed push: fragment %u steps %llu base %llu compute_s %g, payload = base - theta", u->fragment,
              (unsigned long long)u->steps, (unsigned long long)u->base_version, u->compute_s);
        dl_wire_msg_close(&pm);
    }
    printf("ok: hold rule: a push due while the previous one is undecided waits; after ACCEPTED + Update it "
           "carries only the new progress\n");
    free(g);
    for (int p = 0; p < P; p++) free(e.delta[p]);
    dl_node_close(&n);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    free(theta);
}

/* scenario 2b: answers again (docs/PROTOCOL.md "Connections"). A keep learner
 * (a 30 s hold) pushes fragments 1, 2, 3, 0 on base 1; only fragment 1's is
 * answered (MERGED_PENDING), as if the others and every later answer had
 * gone with a connection. The synchronizer says Bye, the learner says Hello
 * again, and the Welcome names answered_bases {0, 2, 0, 0} (1 + base 1 of
 * fragment 1, nothing of the others): the pushes of fragments 2, 3 and 0
 * were never answered, so they are forgotten and their fragments push again
 * when due, where the hold kept them 30 s; fragment 1's stays held. An
 * answer sent again for another base of fragment 1 decides and counts
 * nothing; the one for base 1 (MERGED_PENDING, ACCEPTED) decides it, counted
 * once. Without the Welcome's answers (the code before) the three pushes of
 * the next round would not leave. */
static void test_answers_again(harness *h)
{
    const char *id = "L6";
    const int H = 4;
    hold_ms = 30000;
    hold_adopt = DL_ADOPT_KEEP;
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(h, id, theta, &mb, &n);
    hold_ms = -1;
    hold_adopt = DL_ADOPT_OVERWRITE;
    const uint64_t E = 2;
    h_hello(h);
    h_join(h, id, n, E, 1, (uint32_t)H, 50);
    expected e = {0};
    uint64_t b;
    for (int64_t step = 1; step <= 4; step++) { /* fragments 1, 2, 3, 0; only 1 answered */
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.25);
        int p = (int)(step % 4);
        expect_push(&e, n, p);
        if (recv_push(h, &e, p, &b, "push before the Bye") == 1)
            h_ack(h, id, E, 1, b, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
    }
    CHECK(WAIT_FOR(stats(c).acks_pending == 1), "fragment 1's push pooled");
    Dloco__V1__Bye bye;
    dloco__v1__bye__init(&bye);
    bye.reason = "restart";
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, "dloco", E, id);
    dl_wire_set_bye(&env, &bye);
    REQUIRE(fs_send(h, id, &env, NULL, 0) == 0, "the synchronizer's Bye");
    h_hello(h);
    const uint64_t answered[P] = {0, 2, 0, 0};
    fs_welcome_args wa = {.epoch = E, .version = 1, .h = (uint32_t)H, .hb_ms = 50, .liveness = welcome_liveness,
                          .answered = answered};
    REQUIRE(fs_welcome(h, id, &wa) == 0, "the Welcome with answered_bases");
    CHECK(WAIT_FOR(dl_comms_state(c, NULL, 0) == DL_COMMS_READY), "ready again");
    dl_wire_msg m;
    int again_pushed = 0;
    for (int64_t step = 5; step <= 8; step++) { /* fragment 1 held; 2, 3, 0 push again */
        train_step(theta, step);
        int posted = dl_node_after_step(n, step, H, TOK, 2.5, 0.25);
        int p = (int)(step % 4);
        if (p == 1) {
            CHECK(posted == 0 && dl_node_owes(n, 1), "step 5: fragment 1 is due but held (its push answered, "
                  "undecided)");
            continue;
        }
        CHECK(posted == 1, "step %lld: fragment %d's push leaves (its last one was never answered)",
              (long long)step, p);
        if (posted != 1) continue;
        expect_push(&e, n, p);
        again_pushed += recv_push(h, &e, p, &b, "push after the answers") == p;
    }
    CHECK(again_pushed == 3, "fragments 2, 3 and 0 pushed again (%d of 3)", again_pushed);
    int got = fs_check_next(h, &m, 300);
    CHECK(got < 0, "nothing of fragment 1 leaves while its answered push is undecided (got %s)",
          got < 0 ? "-" : dl_wire_body_name((Dloco__V1__Envelope__BodyCase)got));
    if (got >= 0) dl_wire_msg_close(&m);
    uint64_t acc = stats(c).accepted;
    REQUIRE(fs_ack_again(h, id, E, 1, 0, DLOCO__V1__DECISION__DECISION_ACCEPTED, 2) == 0, "an answer again of base 0");
    REQUIRE(fs_ack_again(h, id, E, 1, 1, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0) == 0, "again pending");
    REQUIRE(fs_ack_again(h, id, E, 1, 1, DLOCO__V1__DECISION__DECISION_ACCEPTED, 2) == 0, "again accepted");
    CHECK(WAIT_FOR(stats(c).accepted == acc + 1), "the answer again of base 1 decides fragment 1's push (accepted "
          "%llu -> %llu)", (unsigned long long)acc, (unsigned long long)stats(c).accepted);
    CHECK(stats(c).accepted == acc + 1 && stats(c).acks_pending == 1,
          "the answer of base 0 counted nothing, nor did the pending one sent again (accepted +%llu, pending %llu)",
          (unsigned long long)(stats(c).accepted - acc), (unsigned long long)stats(c).acks_pending);
    printf("ok: a Welcome's answered_bases forgets the pushes never answered; an answer sent again decides only "
           "the push it names\n");
    for (int p = 0; p < P; p++) free(e.delta[p]);
    dl_node_close(&n);
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    free(theta);
}

// ---------------------------------------------------------------------------
// scenario 3c: two sessions over one mailbox, each serving half the fragments
// against its own ROUTER (a sharded synchronizer), do not interfere

static void test_two_sessions(void)
{
    harness ha, hb;
    h_open(&ha, plan);
    h_open(&hb, plan);
    const char *id = "L5";
    float *theta = calloc(total, sizeof(float));
    dl_mailbox *mb = NULL;
    REQUIRE(dl_mailbox_open(plan, &mb) == 0, "mailbox");
    int fa[2] = {0, 1}, fb[2] = {2, 3};
    dl_comms *cs[2] = {NULL, NULL};
    harness *hs[2] = {&ha, &hb};
    for (int i = 0; i < 2; i++) {
        dl_comms_opts co = {.mailbox = mb, .endpoint = hs[i]->ep, .learner_id = id, .run_id = "dloco", .plan = plan,
                            .fragments = i ? fb : fa, .n_fragments = 2,
                            .fingerprint = dl_model_fingerprint(&CFG, plan), .device = "cpu", .n_layer = 1, .n_head = 2,
                            .n_embd = 8, .seq_len = 4, .vocab = 16,
                            .connect_timeout_ms = 20000};
        REQUIRE(dl_comms_open(&co, &cs[i]) == 0, "session %d: %s", i, dl_errmsg());
    }
    dl_node *n = NULL;
    dl_node_opts no = {.plan = plan, .params = theta, .adopt = DL_ADOPT_OVERWRITE};
    REQUIRE(dl_node_open(&no, mb, &n) == 0, "node");
    for (int i = 0; i < 2; i++) REQUIRE(dl_comms_start(cs[i]) == 0, "start %d", i);
    dl_wire_msg m;
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    for (int i = 0; i < 2; i++) {
        REQUIRE(fs_check_expect(hs[i], DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello %d", i);
        dl_wire_msg_close(&m);
        h_welcome(hs[i], id, 1, 1, 4, 50, 1);
        REQUIRE(fs_check_expect(hs[i], DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch"), "fetch %d", i);
        const Dloco__V1__Fetch *f = m.env->fetch;
        CHECK(f->n_fragments == 2 && (int)f->fragments[0] == 2 * i && (int)f->fragments[1] == 2 * i + 1,
              "session %d fetches only its fragments", i);
        dl_wire_msg_close(&m);
        for (int p = 2 * i; p < 2 * i + 2; p++) {
            global_of(p, 1, g);
            h_update(hs[i], id, 1, p, 1, g);
        }
    }
    CHECK(dl_node_wait_ready(n, WAIT_MS, NULL) == 0, "ready from two sessions: %s", dl_errmsg());
    /* an update of a fragment the session does not serve is refused */
    global_of(3, 9, g);
    h_update(&ha, id, 1, 3, 9, g);
    CHECK(WAIT_FOR(stats(cs[0]).bad_msgs == 1), "session A refuses fragment 3");
    CHECK(dl_node_poll(n) == 0 && dl_node_version(n, 3) == 1, "and nothing is adopted");
    for (int64_t step = 1; step <= 2; step++) {
        train_step(theta, step);
        dl_node_after_step(n, step, 4, TOK, 2.5, 0.1);
        int p = (int)step, mine = p < 2 ? 0 : 1; /* fragment 1 at step 1 (A), 2 at step 2 (B) */
        if (fs_check_expect(hs[mine], DLOCO__V1__ENVELOPE__BODY_PUSH, &m, "push")) {
            CHECK((int)m.env->push->fragment == p, "push of %d on its own session", p);
            dl_wire_msg_close(&m);
        }
        int other = fs_check_next(hs[1 - mine], &m, 200);
        CHECK(other < 0, "nothing on the other session");
        if (other >= 0) dl_wire_msg_close(&m);
    }
    CHECK(stats(cs[0]).pushes == 1 && stats(cs[1]).pushes == 1, "one push each");
    dl_mailbox_bye(mb, "done", 2);
    for (int i = 0; i < 2; i++) {
        if (fs_check_expect(hs[i], DLOCO__V1__ENVELOPE__BODY_BYE, &m, "bye")) dl_wire_msg_close(&m);
        dl_comms_close(&cs[i]);
    }
    printf("ok: two sessions over one mailbox serve their own fragments on their own sockets\n");
    free(g);
    dl_node_close(&n);
    dl_mailbox_close(&mb);
    free(theta);
    h_close(&ha);
    h_close(&hb);
}

/* A session for shard 1 of 2 serves fragments 1 and 3 (fragments NULL: the
 * shard's) and takes only a Welcome of that layout: one of shard 0, or of an
 * unsharded synchronizer, is refused (welcome_refused) and the Hello
 * retried; an unsharded session refuses a shard's Welcome. */
static void test_shard_welcome(void)
{
    harness h;
    h_open(&h, plan);
    const char *id = "L6";
    dl_mailbox *mb = NULL;
    REQUIRE(dl_mailbox_open(plan, &mb) == 0, "mailbox");
    dl_comms_opts co = {.mailbox = mb, .endpoint = h.ep, .learner_id = id, .run_id = "dloco", .plan = plan,
                        .shard = 1, .shards = 2, .fingerprint = dl_model_fingerprint(&CFG, plan), .device = "cpu",
                        .n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab = 16,
                        .hello_retry_ms = 200, .connect_timeout_ms = 20000};
    dl_comms *c = NULL;
    int bad[1] = {2};
    co.fragments = bad, co.n_fragments = 1;
    CHECK(dl_comms_open(&co, &c) == DL_EINVAL && strstr(dl_errmsg(), "fragment 2 belongs to shard 0"),
          "a fragment of another shard is refused at open: %s", dl_errmsg());
    co.fragments = NULL, co.n_fragments = 0;
    REQUIRE(dl_comms_open(&co, &c) == 0, "session: %s", dl_errmsg());
    REQUIRE(dl_comms_start(c) == 0, "start");
    dl_wire_msg m;
    const uint32_t lay[][2] = {{0, 2}, {0, 0}};
    for (int i = 0; i < 2; i++) {
        REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello %d", i);
        dl_wire_msg_close(&m);
        welcome_shard = lay[i][0], welcome_shards = lay[i][1];
        h_welcome(&h, id, 1, 1, 4, 50, 1);
        CHECK(WAIT_FOR(stats(c).welcomes_refused == (uint64_t)i + 1), "welcome of %s refused",
              i ? "an unsharded synchronizer" : "shard 0 of 2");
    }
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello again");
    dl_wire_msg_close(&m);
    welcome_shard = 1, welcome_shards = 2;
    h_welcome(&h, id, 1, 1, 4, 50, 1);
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch"), "fetch after the right welcome");
    CHECK(m.env->fetch->n_fragments == 2 && m.env->fetch->fragments[0] == 1 && m.env->fetch->fragments[1] == 3,
          "the session fetches its shard's fragments 1 and 3");
    dl_wire_msg_close(&m);
    dl_comms_close(&c);
    /* an unsharded session refuses a shard's Welcome */
    co.shard = 0, co.shards = 0;
    REQUIRE(dl_comms_open(&co, &c) == 0 && dl_comms_start(c) == 0, "unsharded session");
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    dl_wire_msg_close(&m);
    h_welcome(&h, id, 2, 1, 4, 50, 1);
    CHECK(WAIT_FOR(stats(c).welcomes_refused == 1), "an unsharded session refuses shard 1 of 2");
    welcome_shard = welcome_shards = 0;
    dl_comms_close(&c);
    dl_mailbox_close(&mb);
    h_close(&h);
    printf("ok: a session takes only a Welcome of its shard layout\n");
}

// ---------------------------------------------------------------------------
// scenario 4: the dloco-learner binary against the fake synchronizer

static char bin[600], corpus[600];


static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

static long long field(const char *summary, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *s = strstr(summary, pat);
    return s ? atoll(s + strlen(pat)) : -1;
}

static void test_binary(const char *dir, int sigterm)
{
    dl_model_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab = 256};
    REQUIRE(dl_model_config_check(&cfg) == 0, "cfg");
    dl_plan *bp = NULL;
    REQUIRE(dl_model_plan_open(&cfg, P, &bp) == 0, "plan");
    harness h;
    h_open(&h, bp);
    const char *id = sigterm ? "bin-term" : "bin-run";
    char out[700], err[700], events[700];
    snprintf(out, sizeof out, "%s/%s.out", dir, id);
    snprintf(err, sizeof err, "%s/%s.err", dir, id);
    snprintf(events, sizeof events, "%s/%s.events", dir, id);
    /* no recovery file: the build folder is shared by every run of this test */
    char *argv[] = {bin, "--recovery", "off",
                    "--connect", h.ep, "--id", (char *)id, "--data", corpus, "--n_layer", "1", "--n_head", "2",
                    "--n_embd", "16", "--seq_len", "16", "--batch", "2", "--steps", sigterm ? "1000000" : "12",
                    "--warmup", "2", "--fragments", "4", "--log_every", "4", "--threads", "1",
                    "--flush_timeout_ms", "5000", "--connect_timeout_ms", "20000", "--events", events, NULL};
    pid_t pid = spawn(argv, out, err);
    const uint64_t E = 3;
    dl_wire_msg m;
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "binary hello"), "hello; stderr: %s", slurp(err));
    CHECK(m.env->hello->fingerprint == dl_model_fingerprint(&cfg, bp), "binary fingerprint matches the harness's plan");
    dl_wire_msg_close(&m);
    h_welcome(&h, id, E, 0, 4, 100, 1);
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "binary fetch"), "fetch");
    dl_wire_msg_close(&m);
    size_t N = dl_plan_total_numel(bp);
    float *params = calloc(N, sizeof(float));
    REQUIRE(dl_model_init_params(&cfg, 42, params) == 0, "init");
    /* shift the global away from any init the learner could make itself */
    for (size_t i = 0; i < N; i++) params[i] += 0.25f;
    float *glob[P];
    uint64_t ver[P];
    for (int p = 0; p < P; p++) {
        glob[p] = calloc(dl_plan_fragment_numel(bp, p), sizeof(float));
        dl_plan_gather(bp, p, params, glob[p]);
        ver[p] = 0;
        h_update(&h, id, E, p, 0, glob[p]);
    }
    /* serve: ack every push, merge it (global -= delta: one learner, outer lr 1), until Bye */
    int pushes = 0, updates = 0, bye = 0, acks_sent = 0;
    double max_rate = 0; /* max |delta_i| / steps over all pushes */
    float *d = calloc(dl_plan_max_fragment_numel(bp), sizeof(float));
    while (!bye) {
        int body = fs_check_next(&h, &m, 20000);
        if (body < 0) {
            CHECK(0, "binary went silent; stderr: %s", slurp(err));
            break;
        }
        if (body == DLOCO__V1__ENVELOPE__BODY_BYE) {
            CHECK(!strcmp(m.env->bye->reason, sigterm ? "signal" : "done"), "bye reason %s", m.env->bye->reason);
            bye = 1;
        } else if (body == DLOCO__V1__ENVELOPE__BODY_PUSH) {
            const Dloco__V1__Push *u = m.env->push;
            int p = (int)u->fragment;
            size_t k = dl_plan_fragment_numel(bp, p);
            memcpy(d, dl_wire_msg_payload(&m, 0), k * 4);
            CHECK(u->base_version <= ver[p] && u->steps >= 1 && u->tokens == u->steps * 32,
                  "binary push %d: base %llu steps %llu tokens %llu", p, (unsigned long long)u->base_version,
                  (unsigned long long)u->steps, (unsigned long long)u->tokens);
            for (size_t i = 0; i < k; i++) {
                double r = fabs(d[i]) / (double)(u->steps ? u->steps : 1);
                if (r > max_rate) max_rate = r;
                glob[p][i] -= d[i];
            }
            pushes++;
            h_ack(&h, id, E, p, u->base_version, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
            h_ack(&h, id, E, p, u->base_version, DLOCO__V1__DECISION__DECISION_ACCEPTED, ver[p] + 1);
            acks_sent += 2;
            ver[p]++;
            h_update(&h, id, E, p, ver[p], glob[p]);
            updates++;
            if (sigterm && pushes == 6) kill(pid, SIGTERM);
        } else {
            CHECK(0, "binary sent %s", dl_wire_body_name((Dloco__V1__Envelope__BodyCase)body));
        }
        dl_wire_msg_close(&m);
    }
    int status = reap(pid);
    char *o = slurp(out), *er = slurp(err);
    CHECK(status == 0, "binary exit status %d; stderr: %s", status, er);
    /* AdamW moves a parameter by about lr (3e-3) per step; a learner that
     * trained from its own init instead of the fetched global (shifted by
     * 0.25) would push deltas near 0.25 */
    CHECK(max_rate > 0 && max_rate < 0.01, "deltas are AdamW steps from the fetched global (max %g per step)",
          max_rate);
    const char *sum = strstr(o, "learner-summary:");
    CHECK(sum != NULL, "summary line printed: %s", o);
    if (sum) {
        CHECK(field(sum, "pushes") == pushes && field(sum, "accepted") == pushes &&
                  field(sum, "acks_pending") == pushes,
              "summary pushes/accepted/acks_pending = %d: %s", pushes, sum);
        /* an update replaced in its slot by a newer one before the step boundary is never adopted */
        CHECK(field(sum, "updates_adopted") + field(sum, "updates_superseded") == updates,
              "summary updates_adopted + superseded = %d: %s", updates, sum);
        CHECK(field(sum, "dropped_stale") == 0 && field(sum, "rejected") == 0 && field(sum, "undecided") == 0,
              "nothing dropped, rejected or undecided");
        CHECK(field(sum, "flush_unanswered") == 0, "final flush answered");
        long long steps = field(sum, "steps");
        if (sigterm) CHECK(steps >= 6 && steps < 1000000, "stopped by SIGTERM at step %lld", steps);
        else CHECK(steps == 12 && field(sum, "tokens") == 12 * 32, "12 steps, 384 tokens: %s", sum);
        /* 12 scheduled pushes at least (plus the flush): sent, replaced by a
         * newer one, or folded into a push held for its predecessor's decision */
        if (!sigterm)
            CHECK(field(sum, "pushes") + field(sum, "coalesced") + field(sum, "held_due") >= 12,
                  "every scheduled push sent, coalesced or held: %s", sum);
        CHECK(field(sum, "bytes_sent") > (long long)pushes * 4 * 100 && field(sum, "bytes_received") > 0, "bytes");
        CHECK(!strncmp(sum, "learner-summary: id=", 20), "summary starts with the id");
    }
    char *al = slurp(events);
    int lines = 0;
    for (char *q = al; (q = strstr(q, " event=")); q++)
        lines += !strncmp(q, " event=ack ", 11) || !strncmp(q, " event=update ", 14);
    CHECK(lines == acks_sent + updates + P, "ack + update events %d = acks %d + updates %d + fetch %d", lines,
          acks_sent, updates, P);
    printf("ok: dloco-learner %s: %d pushes, all acked and adopted, bye, exit 0, summary agrees\n",
           sigterm ? "stopped by SIGTERM (final flush)" : "12 steps", pushes);
    free(al);
    free(o);
    free(er);
    free(d);
    for (int p = 0; p < P; p++) free(glob[p]);
    free(params);
    h_close(&h);
    dl_plan_close(&bp);
}

static void test_binary_refused(const char *dir)
{
    dl_model_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab = 256};
    dl_model_config_check(&cfg);
    dl_plan *bp = NULL;
    REQUIRE(dl_model_plan_open(&cfg, P, &bp) == 0, "plan");
    harness h;
    h_open(&h, bp);
    char out[700], err[700];
    snprintf(out, sizeof out, "%s/refused.out", dir);
    snprintf(err, sizeof err, "%s/refused.err", dir);
    /* no recovery file: the build folder is shared by every run of this test */
    char *argv[] = {bin, "--recovery", "off",
                    "--connect", h.ep, "--id", "bin-refused", "--data", corpus, "--n_layer", "1", "--n_head", "2",
                    "--n_embd", "16", "--seq_len", "16", "--batch", "2", "--steps", "5", "--threads", "1", NULL};
    pid_t pid = spawn(argv, out, err);
    dl_wire_msg m;
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello")) dl_wire_msg_close(&m);
    h_error(&h, "bin-refused", 1, DL_EMISMATCH, "fragments: learner 4, synchronizer 8", 1);
    int status = reap(pid);
    char *er = slurp(err);
    CHECK(status == 3, "fatal error -> exit 3, got %d", status);
    CHECK(strstr(er, "fragments: learner 4, synchronizer 8") != NULL, "stderr has the server's message: %s", er);
    printf("ok: dloco-learner exits 3 with the synchronizer's message on a fatal Error\n");
    free(er);
    h_close(&h);
    dl_plan_close(&bp);
}

// ---------------------------------------------------------------------------
// chunked transfers: Updates in chunks, a fetch resumed after a re-hello and
// after a gap, pushes in chunks, a busy refusal (docs/PROTOCOL.md)

static dl_model_config CFG_CHUNK = {.n_layer = 1, .n_head = 2, .n_embd = 32, .seq_len = 8, .vocab = 256};

static void test_chunks(void)
{
    const char *id = "L9";
    const uint64_t E = 9, C = 1024; /* 4 KiB chunks */
    dl_model_config keep_cfg = CFG;
    dl_plan *keep_plan = plan;
    size_t keep_total = total;
    dl_plan *p2 = NULL;
    REQUIRE(dl_model_config_check(&CFG_CHUNK) == 0 && dl_model_plan_open(&CFG_CHUNK, P, &p2) == 0, "plan");
    CFG = CFG_CHUNK, plan = p2, total = dl_plan_total_numel(p2);
    size_t n0 = dl_plan_fragment_numel(plan, 0), n1 = dl_plan_fragment_numel(plan, 1);
    REQUIRE(n0 > 3 * C && n1 > 2 * C, "fragments of %zu and %zu floats", n0, n1);
    harness h;
    h_open(&h, plan);
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(&h, id, theta, &mb, &n);
    dl_wire_msg m;
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    CHECK(m.env->hello->max_chunk_bytes >= n0 * 4, "hello max_chunk_bytes %u (the largest fragment is %zu bytes)",
          m.env->hello->max_chunk_bytes, n0 * 4);
    dl_wire_msg_close(&m);
    welcome_chunk_bytes = (uint32_t)(C * 4);
    h_fetch_all(&h, id, E, 5, 4, 50);

    /* fragment 0 v5: two chunks, then the synchronizer forgets us */
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    global_of(0, 5, g);
    h_update_chunk(&h, id, E, 0, 5, g, 0, C);
    h_update_chunk(&h, id, E, 0, 5, g, C, C);
    CHECK(WAIT_FOR(stats(c).chunks_recv == 2), "two chunks taken (%llu)", (unsigned long long)stats(c).chunks_recv);
    h_error(&h, id, E, DL_ENOTFOUND, "who are you", 0);
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "re-hello"), "re-hello");
    dl_wire_msg_close(&m);
    h_welcome(&h, id, E, 5, 4, 50, 1);
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch after the re-hello"), "fetch 2");
    const Dloco__V1__Fetch *f = m.env->fetch;
    int at = -1;
    for (size_t i = 0; i < f->n_fragments; i++)
        if (f->fragments[i] == 0) at = (int)i;
    CHECK(f->n_fragments == P && f->n_resume_offsets == P && at >= 0 && f->resume_versions[at] == 5 &&
              f->resume_offsets[at] == 2 * C,
          "the fetch after the re-hello resumes fragment 0 at v5 element %llu (%zu fragments, %zu resume points)",
          at >= 0 && f->n_resume_offsets ? (unsigned long long)f->resume_offsets[at] : 0ULL, f->n_fragments,
          f->n_resume_offsets);
    dl_wire_msg_close(&m);
    printf("ok: a re-hello keeps the chunks of an Update that arrived; the next Fetch resumes from element %llu\n",
           (unsigned long long)(2 * C));

    /* the synchronizer starts fragment 0 again from 0 (as after a new connection): what the learner holds is
     * skipped, the rest appended, no Fetch; then fragment 1 with a gap -> one resume Fetch of it */
    h_update_chunk(&h, id, E, 0, 5, g, 0, C);
    h_update_chunk(&h, id, E, 0, 5, g, C, C);
    for (uint64_t off = 2 * C; off < n0; off += C) h_update_chunk(&h, id, E, 0, 5, g, off, n0 - off < C ? n0 - off : C);
    CHECK(WAIT_FOR(stats(c).chunks_dropped == 2), "the two chunks held already were skipped (%llu)",
          (unsigned long long)stats(c).chunks_dropped);
    global_of(1, 5, g);
    h_update_chunk(&h, id, E, 1, 5, g, 0, C);
    h_update_chunk(&h, id, E, 1, 5, g, 2 * C, C);
    h_update_chunk(&h, id, E, 1, 5, g, 3 * C < n1 ? 3 * C : 2 * C, C < n1 - 2 * C ? C : n1 - 2 * C); /* same gap */
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch after a gap"), "fetch 3");
    f = m.env->fetch;
    CHECK(f->n_fragments == 1 && f->fragments[0] == 1 && f->n_resume_offsets == 1 && f->resume_versions[0] == 5 &&
              f->resume_offsets[0] == C,
          "a gap in fragment 1's chunks asks for the rest from element 1024 of v5");
    dl_wire_msg_close(&m);
    /* the Fetch may reach us before the comms thread counts it: wait for both */
    CHECK(WAIT_FOR(stats(c).chunks_dropped == 4 && stats(c).fetches == 3),
          "the gap's chunks dropped (%llu), one resume Fetch for the gap (fetches %llu)",
          (unsigned long long)stats(c).chunks_dropped, (unsigned long long)stats(c).fetches);
    for (uint64_t off = C; off < n1; off += C) h_update_chunk(&h, id, E, 1, 5, g, off, n1 - off < C ? n1 - off : C);
    for (int p = 2; p < P; p++) {
        size_t k = dl_plan_fragment_numel(plan, p);
        global_of(p, 5, g);
        for (uint64_t off = 0; off < k; off += C) h_update_chunk(&h, id, E, p, 5, g, off, k - off < C ? k - off : C);
    }
    CHECK(dl_node_wait_ready(n, WAIT_MS, NULL) == 0, "ready after chunked fetches: %s", dl_errmsg());
    int same = 1;
    for (int p = 0; p < P; p++) {
        global_of(p, 5, g);
        same &= memcmp(dl_node_base(n, p), g, dl_plan_fragment_numel(plan, p) * 4) == 0 && dl_node_version(n, p) == 5;
    }
    CHECK(same, "every fragment assembled from its chunks equals the global v5");
    printf("ok: a gap in an Update's chunks asks for the rest (resume Fetch); assembled fragments equal the global\n");

    /* a due push leaves in chunks of one transfer, in order; refused busy */
    expected e = {0};
    int64_t step = 0;
    int pushed = -1;
    while (pushed < 0 && step < 8) {
        step++;
        train_step(theta, step);
        dl_node_after_step(n, step, 4, TOK, 2.5, 0.0);
        for (int p = 0; p < P && pushed < 0; p++)
            if (due(step, p, 4)) pushed = p, expect_push(&e, n, p);
    }
    REQUIRE(pushed >= 0, "a push was due");
    size_t k = dl_plan_fragment_numel(plan, pushed);
    float *got = calloc(k, sizeof(float));
    uint64_t next = 0, transfer = 0;
    int chunks = 0, in_order = 1;
    while (next < k && fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, "push chunk")) {
        const Dloco__V1__Push *u = m.env->push;
        if ((int)u->fragment != pushed || u->chunk_numel == 0 || u->chunk_offset != next ||
            (transfer && u->transfer != transfer) || u->chunk_numel > C) {
            in_order = 0;
            dl_wire_msg_close(&m);
            break;
        }
        transfer = u->transfer;
        memcpy(got + next, dl_wire_msg_payload(&m, 0), u->chunk_numel * 4);
        next += u->chunk_numel;
        chunks++;
        dl_wire_msg_close(&m);
    }
    CHECK(in_order && next == k && chunks == (int)((k + C - 1) / C), "push of fragment %d in %d chunks of transfer %llu",
          pushed, chunks, (unsigned long long)transfer);
    CHECK(memcmp(got, e.delta[pushed], k * 4) == 0, "the chunks carry base - theta");
    Dloco__V1__Ack a;
    dloco__v1__ack__init(&a);
    a.fragment = (uint32_t)pushed;
    a.base_version = 5;
    a.decision = DLOCO__V1__DECISION__DECISION_REJECTED;
    a.reason = "pool full";
    a.busy = 1;
    a.retry_after_ms = 200;
    a.chunk_bytes = (uint32_t)(2 * C * 4); /* our pushes' chunk size from now: 8 KiB */
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, h.run_id, E, id);
    dl_wire_set_ack(&env, &a);
    fs_check_send(&h, id, &env, NULL, 0);
    CHECK(WAIT_FOR(stats(c).busy == 1), "busy counted (%llu)", (unsigned long long)stats(c).busy);
    CHECK(stats(c).chunks_sent == (uint64_t)chunks && stats(c).pushes == 1, "chunks_sent %llu pushes %llu",
          (unsigned long long)stats(c).chunks_sent, (unsigned long long)stats(c).pushes);
    printf("ok: a push leaves as %d chunks of one transfer, in order; a busy refusal is counted\n", chunks);

    /* Ack.chunk_bytes: the pushes that start after it leave in chunks of 2C (none bigger); one that started
     * before keeps its own size to its end */
    for (int64_t until = step + 8; step < until;) {
        step++;
        train_step(theta, step);
        dl_node_after_step(n, step, 4, TOK, 2.5, 0.0);
    }
    int resized = 0, over = 0, all_2c = 0;
    uint64_t tr = 0;
    for (int i = 0; i < 64 && !resized && fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, "push chunk"); i++) {
        const Dloco__V1__Push *u = m.env->push;
        over += u->chunk_numel > 2 * C;
        if (u->chunk_numel && u->chunk_offset == 0) tr = u->transfer, all_2c = 1;
        if (u->chunk_numel && u->transfer == tr) {
            int last = u->chunk_offset + u->chunk_numel == u->numel;
            if (!last && u->chunk_numel != 2 * C) all_2c = 0;
            if (last && all_2c && u->chunk_offset > 0) resized = 1;
        }
        dl_wire_msg_close(&m);
    }
    CHECK(resized && !over, "after Ack.chunk_bytes %u a push left in chunks of %llu elements (%d chunks bigger)",
          a.chunk_bytes, (unsigned long long)(2 * C), over);
    printf("ok: Ack.chunk_bytes resizes the chunks of the pushes that start after it\n");

    dl_comms_close(&c);
    dl_node_close(&n);
    dl_mailbox_close(&mb);
    h_close(&h);
    for (int p = 0; p < P; p++) free(e.delta[p]);
    free(got);
    free(g);
    free(theta);
    welcome_chunk_bytes = 0;
    CFG = keep_cfg, plan = keep_plan, total = keep_total;
    dl_plan_close(&p2);
}

// ---------------------------------------------------------------------------
// scenario: encoded pushes with error feedback, delta Updates onto the mirror,
// Ack.rebase honoured (docs/ARCHITECTURE.md "The networked learner")

static dl_model_config CFG_CODEC = {.n_layer = 1, .n_head = 2, .n_embd = 32, .seq_len = 8, .vocab = 1024};

/* The learner's residuals as the rules say they must be (learner/ef.h):
 * committed per fragment (NULL = zero), and that of the push in flight. */
typedef struct {
    float *committed[P], *pending[P];
    int chunked;     /* pushes seen in more than one chunk */
    int pushes;
} ef_model;

/* Elements of a 4096-byte int4 push chunk with blocks of 16: as many whole
 * blocks (12 bytes each) as fill the bytes, 341 (docs/PROTOCOL.md "Chunked
 * transfers"), not the fp32 chunk's 1024 elements. */
#define INT4_CHUNK_EL 5456

/* Receive the push of p (all its chunks) and check it: int4 header (codec,
 * block, topk 0), chunks of one transfer on block boundaries, whole blocks
 * but the last, as many as fill the chunk's bytes, and the bytes = encode(delta + committed_p) exactly; the
 * residual of that encode becomes pending_p. */
static void recv_int4_push(harness *h, ef_model *em, const expected *e, int p, const char *ctx)
{
    const dl_codec *pc = &push_codec;
    size_t k = dl_plan_fragment_numel(plan, p);
    size_t bytes = (size_t)dl_codec_bytes(pc, k);
    uint8_t *got = calloc(bytes, 1), *want = malloc(bytes);
    uint64_t next = 0, transfer = 0;
    int chunks = 0, header_ok = 1, aligned = 1;
    dl_wire_msg m;
    while (next < k && fs_check_expect(h, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, ctx)) {
        const Dloco__V1__Push *u = m.env->push;
        if ((int)u->fragment != p) {
            CHECK(0, "%s: push of fragment %d, expected %d", ctx, (int)u->fragment, p);
            dl_wire_msg_close(&m);
            break;
        }
        header_ok &= u->codec == DLOCO__V1__CODEC__CODEC_INT4 && u->block_size == pc->block && u->topk == 0 &&
                     u->numel == k && u->base_version == e->base[p] && u->steps == e->steps[p] &&
                     u->tokens == e->tokens[p];
        uint64_t off = u->chunk_numel ? u->chunk_offset : 0, n = u->chunk_numel ? u->chunk_numel : k;
        aligned &= off == next && off % pc->block == 0 && (off + n == k || n == INT4_CHUNK_EL) &&
                   (!u->chunk_numel || (u->transfer && (!transfer || u->transfer == transfer)));
        transfer = u->transfer;
        uint64_t b0 = off ? dl_codec_bytes(pc, off) : 0, len = dl_codec_bytes(pc, n);
        aligned &= dl_wire_msg_payload_len(&m, 0) == len && b0 + len <= bytes;
        if (aligned) memcpy(got + b0, dl_wire_msg_payload(&m, 0), len);
        next = off + n;
        chunks++;
        dl_wire_msg_close(&m);
        if (!aligned) break;
    }
    CHECK(header_ok, "%s: int4 header (codec, block %u, topk 0, numel, base, steps, tokens)", ctx, pc->block);
    CHECK(aligned && next == k, "%s: %d chunks on block boundaries cover the %zu elements", ctx, chunks, k);
    if (!em->pending[p]) em->pending[p] = malloc(k * sizeof(float));
    if (em->committed[p]) memcpy(em->pending[p], em->committed[p], k * sizeof(float));
    else memset(em->pending[p], 0, k * sizeof(float));
    dl_codec_enc enc = {.c = *pc, .rounding = DL_ROUND_NEAREST};
    REQUIRE(dl_codec_encode(&enc, e->delta[p], em->pending[p], k, 0, want) == 0, "reference encode");
    CHECK(memcmp(got, want, bytes) == 0, "%s: payload = encode(delta + committed residual of fragment %d)%s", ctx, p,
          em->committed[p] ? "" : " (zero)");
    em->chunked += chunks > 1;
    em->pushes++;
    free(got);
    free(want);
}

static void ef_commit(ef_model *em, int p)
{
    float *t = em->committed[p];
    em->committed[p] = em->pending[p];
    em->pending[p] = t;
}

static void ef_zero(ef_model *em, int p)
{
    free(em->committed[p]);
    em->committed[p] = NULL;
}

static uint64_t node_rebased(dl_node *n)
{
    dl_node_stats st;
    dl_node_get_stats(n, &st);
    return st.rebased;
}

/* The update_base event of fragment p at version v: its hash, or 0 when absent. */
static uint64_t base_hash_logged(const char *evlog, const char *id, int p, uint64_t v, int delta)
{
    FILE *f = fopen(evlog, "r");
    if (!f) return 0;
    char line[1024], key[160];
    snprintf(key, sizeof key, " event=update_base learner=%s ", id);
    char tail[96];
    snprintf(tail, sizeof tail, " fragment=%d version=%llu delta=%d hash=", p, (unsigned long long)v, delta);
    unsigned long long hsh = 0;
    while (fgets(line, sizeof line, f)) {
        const char *a = strstr(line, key), *b = a ? strstr(a, tail) : NULL;
        if (b) hsh = strtoull(b + strlen(tail), NULL, 16);
    }
    fclose(f);
    return hsh;
}

static void test_codec(const char *dir)
{
    const char *id = "LC";
    const uint64_t E = 11;
    const int H = 4, q = 1; /* fragment 1 is due at steps 1, 5, 9, 13 */
    dl_model_config keep_cfg = CFG;
    dl_plan *keep_plan = plan;
    size_t keep_total = total;
    dl_plan *p2 = NULL;
    REQUIRE(dl_model_config_check(&CFG_CODEC) == 0 && dl_model_plan_open(&CFG_CODEC, P, &p2) == 0, "plan");
    CFG = CFG_CODEC, plan = p2, total = dl_plan_total_numel(p2);
    char evlog[512];
    snprintf(evlog, sizeof evlog, "%s/events-codec.log", dir);
    REQUIRE(dl_event_open(evlog, "test") == 0, "event log: %s", dl_errmsg());
    push_codec = (dl_codec){.id = DL_CODEC_INT4, .block = 16};
    hold_adopt = DL_ADOPT_MIX; /* a rebase (theta = g) differs from an adopt in the mode */
    /* 4096-byte chunks, filled: 341 whole blocks of 16 (12 bytes each), 5456 elements in 4092 bytes of int4 */
    const uint64_t chunk_el = INT4_CHUNK_EL;
    size_t nmax = dl_plan_max_fragment_numel(plan), kq = dl_plan_fragment_numel(plan, q);
    REQUIRE(nmax > 2 * chunk_el && kq > 2 * chunk_el, "fragments: largest %zu (chunk %llu), fragment 1 %zu", nmax,
            (unsigned long long)chunk_el, kq);
    harness h;
    h_open(&h, plan);
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(&h, id, theta, &mb, &n);
    dl_wire_msg m;
    h_hello(&h);
    welcome_chunk_bytes = 4096;
    welcome_update_codec = DL_CODEC_INT8;
    h_join(&h, id, n, E, 5, (uint32_t)H, 50);
    float *g = calloc(nmax, sizeof(float)), *base6 = calloc(nmax, sizeof(float)), *th = calloc(nmax, sizeof(float));

    /* A delta in int8 (block 16) for fragment q, version 6 = 5 + decode(d). */
    dl_codec dc = {.id = DL_CODEC_INT8, .block = 16};
    size_t dbytes = (size_t)dl_codec_bytes(&dc, kq);
    uint8_t *dpay = malloc(dbytes);
    for (size_t i = 0; i < kq; i++) th[i] = (float)((long)(i * 29 % 61) - 30) / 256.0f;
    REQUIRE(dl_codec_encode(&(dl_codec_enc){.c = dc}, th, NULL, kq, 0, dpay) == 0, "delta encode");
    global_of(q, 5, g);
    REQUIRE(dl_codec_decode_add(&dc, dpay, dbytes, kq, g, base6) == 0, "reference decode_add");

    ef_model em = {0};
    expected e = {0};
    for (int64_t step = 1; step <= 13; step++) {
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.0);
        for (int p = 0; p < P; p++) {
            if (!due(step, p, H)) continue;
            expect_push(&e, n, p);
            char ctx[64];
            snprintf(ctx, sizeof ctx, "push of fragment %d at step %lld", p, (long long)step);
            recv_int4_push(&h, &em, &e, p, ctx);
            if (p != q) {
                /* the others: refused, the residual stays committed (zero) */
                h_ack(&h, id, E, p, e.base[p], DLOCO__V1__DECISION__DECISION_REJECTED, 0);
                continue;
            }
            if (step == 1) {
                /* ACCEPTED, then the delta Update of version 6 in chunks of 1024 */
                h_ack(&h, id, E, q, 5, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0);
                h_ack(&h, id, E, q, 5, DLOCO__V1__DECISION__DECISION_ACCEPTED, 6);
                ef_commit(&em, q);
                for (uint64_t off = 0; off < kq; off += 1024)
                    h_update_delta(&h, id, E, q, 6, &dc, dpay, off, kq - off < 1024 ? kq - off : 1024);
                CHECK(WAIT_FOR((dl_node_poll(n), dl_node_version(n, q) == 6)), "delta v6 adopted");
                CHECK(memcmp(dl_node_base(n, q), base6, kq * sizeof(float)) == 0,
                      "base of fragment %d v6 = mirror v5 + decode(delta), bit for bit", q);
                CHECK(stats(c).updates_delta == 1, "one delta update applied (%llu)",
                      (unsigned long long)stats(c).updates_delta);
            } else if (step == 5) {
                h_ack(&h, id, E, q, 6, DLOCO__V1__DECISION__DECISION_REJECTED, 0); /* committed unchanged */
            } else if (step == 9) {
                /* DROPPED_STALE with rebase, and the rebase Update: v6 again, not newer; mix mode */
                uint64_t rb = node_rebased(n);
                h_ack(&h, id, E, q, 6, DLOCO__V1__DECISION__DECISION_DROPPED_STALE, 0);
                ef_zero(&em, q);
                h_update(&h, id, E, q, 6, base6);
                CHECK(WAIT_FOR((dl_node_poll(n), node_rebased(n) == rb + 1)), "the rebase Update is adopted");
                dl_plan_gather(plan, q, theta, th);
                CHECK(memcmp(th, base6, kq * sizeof(float)) == 0 && dl_node_steps(n, q) == 0 &&
                          dl_node_version(n, q) == 6,
                      "Ack.rebase honoured: theta = g (not mixed), counters 0, even though v6 is not newer");
            } else {
                h_ack(&h, id, E, q, 6, DLOCO__V1__DECISION__DECISION_REJECTED, 0);
            }
        }
    }
    CHECK(em.pushes == 13 && em.chunked > 0, "13 int4 pushes checked byte for byte, %d of them chunked", em.chunked);
    printf("ok: int4 pushes (block 16) in block-aligned chunks carry encode(delta + residual); ACCEPTED commits the "
           "residual, REJECTED keeps it, DROPPED_STALE zeroes it\n");
    printf("ok: a chunked int8 delta Update gives base = mirror + decode bit for bit; Ack.rebase rebases in mix mode\n");

    /* a delta for a version the mirror does not hold (v8 onto v6): dropped, fragment fetched */
    h_update_delta(&h, id, E, q, 8, &dc, dpay, 0, kq);
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch after a missed delta")) {
        CHECK(m.env->fetch->n_fragments == 1 && m.env->fetch->fragments[0] == (uint32_t)q,
              "the missed delta fetches fragment %d alone", q);
        dl_wire_msg_close(&m);
    }
    CHECK(WAIT_FOR(stats(c).updates_delta_missed == 1), "missed delta counted (%llu)",
          (unsigned long long)stats(c).updates_delta_missed);
    global_of(q, 8, g);
    h_update(&h, id, E, q, 8, g);
    CHECK(WAIT_FOR((dl_node_poll(n), dl_node_version(n, q) == 8)), "the fetch reply (full fp32 v8) is adopted");

    /* a delta the decoder refuses (a NaN scale): a bad message, fragment fetched again */
    uint64_t bad = stats(c).bad_msgs;
    float nan = NAN;
    memcpy(dpay, &nan, 4);
    h_update_delta(&h, id, E, q, 9, &dc, dpay, 0, kq);
    if (fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_FETCH, &m, "fetch after an undecodable delta")) {
        CHECK(m.env->fetch->n_fragments == 1 && m.env->fetch->fragments[0] == (uint32_t)q, "refetch of %d", q);
        dl_wire_msg_close(&m);
    }
    CHECK(stats(c).bad_msgs == bad + 1 && dl_node_version(n, q) == 8, "undecodable delta: bad message, not adopted");
    printf("ok: a delta for a version not held, and an undecodable one, fetch the fragment instead\n");

    dl_comms_close(&c);
    dl_node_close(&n);
    dl_mailbox_close(&mb);
    h_close(&h);
    dl_event_close();
    global_of(0, 5, g);
    CHECK(base_hash_logged(evlog, id, 0, 5, 0) == dl_checksum64(g, dl_plan_fragment_numel(plan, 0) * 4),
          "update_base of a full update: the hash of its values");
    CHECK(base_hash_logged(evlog, id, q, 6, 1) == dl_checksum64(base6, kq * 4),
          "update_base of the delta v6: the hash of mirror + decode");
    global_of(q, 8, g);
    CHECK(base_hash_logged(evlog, id, q, 8, 0) == dl_checksum64(g, kq * 4), "update_base of the fetch reply v8");
    printf("ok: update_base events carry dl_checksum64 of the values handed to the update slot\n");

    for (int p = 0; p < P; p++) {
        free(e.delta[p]);
        free(em.committed[p]);
        free(em.pending[p]);
    }
    free(g);
    free(base6);
    free(th);
    free(dpay);
    free(theta);
    welcome_chunk_bytes = 0;
    welcome_update_codec = 0;
    push_codec = (dl_codec){.id = DL_CODEC_FP32};
    hold_adopt = DL_ADOPT_OVERWRITE;
    CFG = keep_cfg, plan = keep_plan, total = keep_total;
    dl_plan_close(&p2);
}

/* Stochastic rounding: each push draws from dl_hash64({Hello.instance, fragment, n}) where n counts the
 * fragment's encoded pushes (1, 2, ...), so a push is reproducible from what the synchronizer knows. */
static void test_stochastic(void)
{
    const char *id = "LS";
    const uint64_t E = 12;
    const int H = 4, q = 1; /* due at steps 1 and 5 */
    push_codec = (dl_codec){.id = DL_CODEC_INT4, .block = 16};
    push_rounding = DL_ROUND_STOCHASTIC;
    harness h;
    h_open(&h, plan);
    float *theta = calloc(total, sizeof(float));
    dl_node *n = NULL;
    dl_mailbox *mb = NULL;
    dl_comms *c = start_learner(&h, id, theta, &mb, &n);
    dl_wire_msg m;
    REQUIRE(fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_HELLO, &m, "hello"), "hello");
    uint64_t instance = m.env->hello->instance;
    dl_wire_msg_close(&m);
    h_join(&h, id, n, E, 5, (uint32_t)H, 50);
    size_t k = dl_plan_fragment_numel(plan, q), bytes = (size_t)dl_codec_bytes(&push_codec, k);
    float *g = calloc(dl_plan_max_fragment_numel(plan), sizeof(float)), *r = calloc(k, sizeof(float));
    uint8_t *want = malloc(bytes), *other = malloc(bytes);
    expected e = {0};
    int pushes = 0, same_seed = 0, differs = 0;
    for (int64_t step = 1; step <= 5; step++) {
        train_step(theta, step);
        dl_node_after_step(n, step, H, TOK, 2.5, 0.0);
        for (int p = 0; p < P; p++) {
            if (!due(step, p, H)) continue;
            expect_push(&e, n, p);
            if (!fs_check_expect(&h, DLOCO__V1__ENVELOPE__BODY_PUSH, &m, "stochastic push")) continue;
            if (p == q) {
                /* residual zero: every push of q is REJECTED, the committed residual stays 0 */
                dl_codec_enc enc = {.c = push_codec, .rounding = DL_ROUND_STOCHASTIC};
                uint64_t key[3] = {instance, (uint64_t)q, (uint64_t)++pushes};
                enc.seed = dl_hash64(key, sizeof key, 0);
                memset(r, 0, k * sizeof(float));
                REQUIRE(dl_codec_encode(&enc, e.delta[q], r, k, 0, want) == 0, "reference encode");
                same_seed += dl_wire_msg_payload_len(&m, 0) == bytes &&
                             memcmp(dl_wire_msg_payload(&m, 0), want, bytes) == 0;
                enc.seed = dl_hash64((uint64_t[3]){instance, (uint64_t)q, (uint64_t)pushes + 1}, 24, 0);
                memset(r, 0, k * sizeof(float));
                REQUIRE(dl_codec_encode(&enc, e.delta[q], r, k, 0, other) == 0, "reference encode");
                differs += memcmp(other, want, bytes) != 0;
            }
            dl_wire_msg_close(&m);
            h_ack(&h, id, E, p, 5, DLOCO__V1__DECISION__DECISION_REJECTED, 0);
        }
    }
    /* (the push of step 5 is all zeros: train_step's increments over 5 steps cancel; no draw matters there) */
    CHECK(pushes == 2 && same_seed == 2 && differs >= 1,
          "stochastic int4 pushes of fragment %d = encode with seed hash(instance, fragment, push n) (%d of %d; "
          "another n draws differently: %d)", q, same_seed, pushes, differs);
    printf("ok: stochastic rounding draws from (learner instance, fragment, push counter)\n");
    dl_comms_close(&c);
    dl_node_close(&n);
    dl_mailbox_close(&mb);
    h_close(&h);
    for (int p = 0; p < P; p++) free(e.delta[p]);
    free(g);
    free(r);
    free(want);
    free(other);
    free(theta);
    push_codec = (dl_codec){.id = DL_CODEC_FP32};
    push_rounding = DL_ROUND_NEAREST;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    REQUIRE(dl_model_config_check(&CFG) == 0, "config");
    REQUIRE(dl_model_plan_open(&CFG, P, &plan) == 0, "plan: %s", dl_errmsg());
    total = dl_plan_total_numel(plan);
    char dir[] = "/tmp/dloco_comms.XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");

    harness h;
    h_open(&h, plan);
    test_session(&h, dir);
    test_fatal(&h);
    test_silence(&h);
    test_slow_downlink(&h);
    test_hold(&h);
    test_answers_again(&h);
    h_close(&h);
    test_two_sessions();
    test_shard_welcome();
    test_chunks();
    test_codec(dir);
    test_stochastic();

    const char *b = getenv("DLOCO_BIN");
    snprintf(bin, sizeof bin, "%s/learner/dloco-learner", b ? b : "build");
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    write_corpus(corpus);
    if (access(bin, X_OK) == 0) {
        test_binary(dir, 0);
        test_binary(dir, 1);
        test_binary_refused(dir);
    } else {
        CHECK(0, "%s not found (set DLOCO_BIN)", bin);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);

    dl_plan_close(&plan);
    printf("test_comms: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
