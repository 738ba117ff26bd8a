/* dloco-sync on a model it has never seen: a manifest run from a Llama-like safetensors init, raw-protocol
 * learners that Hello with the manifest, fetch, push and get merges, and every refusal a manifest brings. */
/* Real dloco-sync processes (this test's children, stopped by pid) and raw
 * DEALER sockets; every check reads a protocol answer, an event of the
 * synchronizer's --events file or its exit; every wait has a deadline.
 * Rows print "row: <what was sent> -> <what came back>".
 *
 * Environment: DLOCO_BIN (the build dir holding synchronizer/dloco-sync);
 * MANIFEST_RUN_OUT=DIR: leave the manifest run's store there after the test
 * (DIR/store), with DIR/manifest.json and DIR/global.bin (the global model as
 * the learner last fetched it, fp32 in the manifest's buffer layout), for
 * tests/test_manifest_tools.sh. */
#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/rng.h"
#include "proto/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"
#include "tests/peer_msgs.h"
#include "tests/syncproc.h"

enum { HB_MS = 100, P = 3, CLAIM = 1024, CAP = 4096 };
static const char *RUN = "dloco";
static char root[256];
static void *ctx;

static void row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void row(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("row: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, k;
    char *b = malloc(cap + 1);
    while ((k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
    }
    fclose(f);
    b[n] = 0;
    return b;
}

/* ------------------------------------------------------------------------ */
/* the model: a small Llama-like table the synchronizer has never heard of */

static dl_manifest *llama(int variant)
{
    dl_manifest *m;
    REQUIRE(dl_manifest_open(&m) == 0, "%s", dl_errmsg());
    const int C = 16, V = 64, L = 2;
    char nm[96];
#define ADD(role, ...)                                                                                          \
    do {                                                                                                        \
        int64_t sh_[] = {__VA_ARGS__};                                                                          \
        REQUIRE(dl_manifest_add(m, nm, (int)(sizeof sh_ / sizeof sh_[0]), sh_, role) == 0, "%s", dl_errmsg());  \
    } while (0)
    snprintf(nm, sizeof nm, "model.embed_tokens.weight");
    ADD(DL_TENSOR_EMBED, V, C);
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        ADD(DL_TENSOR_VECTOR, C);
        const char *pr[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s.weight", l, pr[k]);
            if (variant == 1 && l == 0 && k == 1) ADD(DL_TENSOR_MATRIX, C / 2, C);
            else ADD(DL_TENSOR_MATRIX, C, C);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(DL_TENSOR_VECTOR, C);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(DL_TENSOR_MATRIX, 2 * C, C);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(DL_TENSOR_MATRIX, 2 * C, C);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj.weight", l);
        ADD(DL_TENSOR_MATRIX, C, 2 * C);
    }
    snprintf(nm, sizeof nm, "model.norm.weight");
    ADD(DL_TENSOR_VECTOR, C);
    snprintf(nm, sizeof nm, "lm_head.weight");
    ADD(DL_TENSOR_MATRIX, V, C);
#undef ADD
    return m;
}

/* A safetensors file written here by hand (not by storage/tensorfile.c):
 * the tensors in manifest order, the manifest's JSON in __metadata__ when
 * with_manifest. */
static void write_init(const char *path, const dl_manifest *m, const float *x, int with_manifest)
{
    size_t cap = 1 << 20, n = 0;
    char *h = malloc(cap);
    n += (size_t)snprintf(h + n, cap - n, "{\"__metadata__\":{\"format\":\"pt\"");
    if (with_manifest) {
        char *js;
        REQUIRE(dl_manifest_to_json(m, &js, NULL) == 0, "%s", dl_errmsg());
        n += (size_t)snprintf(h + n, cap - n, ",\"dloco_manifest\":\"");
        for (const char *p = js; *p; p++) {
            if (*p == '"' || *p == '\\') h[n++] = '\\', h[n++] = *p;
            else if (*p == '\n') h[n++] = '\\', h[n++] = 'n';
            else h[n++] = *p;
        }
        h[n++] = '"';
        free(js);
    }
    h[n++] = '}';
    for (int i = 0; i < dl_manifest_ntensors(m); i++) {
        const dl_tensor *t = dl_manifest_tensor(m, i);
        n += (size_t)snprintf(h + n, cap - n, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", t->name);
        for (int d = 0; d < t->ndim; d++) n += (size_t)snprintf(h + n, cap - n, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        n += (size_t)snprintf(h + n, cap - n, "],\"data_offsets\":[%zu,%zu]}", t->offset * 4, (t->offset + t->numel) * 4);
    }
    h[n++] = '}';
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "create %s", path);
    unsigned char l8[8];
    for (int k = 0; k < 8; k++) l8[k] = (unsigned char)((uint64_t)n >> (8 * k));
    fwrite(l8, 1, 8, f);
    fwrite(h, 1, n, f);
    fwrite(x, 4, dl_manifest_numel(m), f);
    REQUIRE(fclose(f) == 0, "write %s", path);
    free(h);
}

/* ------------------------------------------------------------------------ */
/* synchronizer processes */

typedef struct {
    dl_syncproc proc; /* the process; its endpoint, epoch and resumed */
    char name[32], dir[300], log[340], events[340], store[340];
} syncd;

/* Start dloco-sync on dir's store with args (NULL-ended). 0 once its
 * sync_start event is written; -1 when it exited first (*status then its
 * exit status) or said nothing within 15 s. */
static int sync_start(syncd *s, const char *name, const char *const *args, int *status)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->dir, sizeof s->dir, "%s/%s", root, name);
    mkdir(s->dir, 0755);
    snprintf(s->log, sizeof s->log, "%s/sync.log", s->dir);
    snprintf(s->events, sizeof s->events, "%s/events.log", s->dir);
    snprintf(s->store, sizeof s->store, "%s/store", s->dir);
    static char hb[16];
    snprintf(hb, sizeof hb, "%d", HB_MS);
    const char *argv[64] = {"--store", s->store, "--bind", "tcp://127.0.0.1:0", "--events", s->events,
                            "--H", "4", "--heartbeat_ms", hb, "--liveness", "6", "--grace_cap_ms", "1000",
                            "--rebase_ms", "60000", "--staleness", "const", "--status_every_ms", "0",
                            "--metrics", "off", "--update_codec", "off" /* this fake reads fp32 Updates */};
    int argc = 0;
    while (argv[argc]) argc++;
    for (int i = 0; args && args[i] && argc < 62; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    return dl_syncproc_start(&s->proc, argv, s->log, 1, s->events, status);
}

static int sync_stop(syncd *s) { return dl_syncproc_stop(&s->proc); }

/* 1 when the instance's log contains needle. */
static int log_has(const syncd *s, const char *needle)
{
    char *b = slurp(s->log);
    int ok = b && strstr(b, needle);
    if (!ok) printf("  (log of %s: %s)\n", s->name, b ? b : "none");
    free(b);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* a raw learner: one DEALER */

typedef struct {
    void *s;
    const char *id;
    uint64_t epoch;
    int64_t last_hb;
} peer;

static void peer_open(peer *p, const syncd *sd, const char *id)
{
    memset(p, 0, sizeof *p);
    p->id = id;
    p->epoch = sd->proc.epoch;
    p->s = zmq_socket(ctx, ZMQ_DEALER);
    REQUIRE(dl_wire_sock_setup(p->s, 0, 64 << 20) == 0, "socket: %s", dl_errmsg());
    REQUIRE(zmq_connect(p->s, sd->proc.endpoint) == 0, "connect %s", sd->proc.endpoint);
}

static void peer_close(peer *p)
{
    if (p->s) zmq_close(p->s);
    p->s = NULL;
}

static void send_env(peer *p, Dloco__V1__Envelope *env, const void *payload, size_t len)
{
    const void *pl[1] = {payload};
    size_t lens[1] = {len};
    CHECK(dl_wire_send(p->s, NULL, 0, env, payload ? pl : NULL, payload ? lens : NULL, payload ? 1 : 0, 0) == 0,
          "send: %s", dl_errmsg());
}

/* A Hello: with manifest m (GPT fields 0) when m, else the GPT-2 fields of g. */
static void send_hello(peer *p, const dl_manifest *m, const dl_model_config *g, uint64_t fp, uint64_t claim)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    dl_wire_manifest_buf buf = {0};
    h.fingerprint = fp;
    h.num_fragments = P;
    h.device = "test";
    h.max_chunk_bytes = 1 << 20;
    h.instance = dl_hash64(p->id, strlen(p->id), 99);
    h.max_tokens_per_step = claim;
    if (m) {
        REQUIRE(dl_wire_hello_set_manifest(&h, m, &buf) == 0, "%s", dl_errmsg());
    } else {
        h.n_layer = (uint32_t)g->n_layer, h.n_head = (uint32_t)g->n_head, h.n_embd = (uint32_t)g->n_embd;
        h.seq_len = (uint32_t)g->seq_len, h.vocab = (uint32_t)g->vocab, h.batch = 4;
    }
    dl_wire_env_init(&env, RUN, 0, p->id);
    dl_wire_set_hello(&env, &h);
    send_env(p, &env, NULL, 0);
    dl_wire_manifest_buf_free(&buf);
}

static void heartbeat(peer *p)
{
    int64_t now = dl_clock_ns();
    if (now - p->last_hb < (int64_t)HB_MS * 900000LL) return;
    p->last_hb = now;
    Dloco__V1__Envelope env;
    Dloco__V1__Heartbeat hb;
    msg_heartbeat(&env, &hb, RUN, p->epoch, p->id);
    send_env(p, &env, NULL, 0);
}

/* Next message that is not a heartbeat within 5 s: 0, or DL_ETIMEDOUT. */
static int recv_msg(peer *p, dl_wire_msg *m)
{
    memset(m, 0, sizeof *m);
    zmq_pollitem_t it = {p->s, 0, ZMQ_POLLIN, 0};
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    while (dl_clock_ns() < deadline) {
        heartbeat(p);
        if (zmq_poll(&it, 1, 10) <= 0) continue;
        int rc = dl_wire_recv(p->s, 0, NULL, m, ZMQ_DONTWAIT);
        if (rc == DL_EAGAIN) continue;
        if (rc == 0 && m->env->body_case == DLOCO__V1__ENVELOPE__BODY_HEARTBEAT) {
            dl_wire_msg_close(m);
            continue;
        }
        return rc;
    }
    memset(m, 0, sizeof *m);
    return DL_ETIMEDOUT;
}

static const char *describe(int rc, const dl_wire_msg *m, char *buf, size_t cap)
{
    if (rc) snprintf(buf, cap, "%s", rc == DL_ETIMEDOUT ? "nothing within 5 s" : dl_errmsg());
    else if (m->env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR)
        snprintf(buf, cap, "Error %s %s \"%s\"", dl_wire_error_kind_name(dl_wire_error_kind(m->env->error)),
                 m->env->error->fatal ? "fatal" : "non-fatal", m->env->error->message);
    else if (m->env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME)
        snprintf(buf, cap, "Welcome (must_fetch %d)", m->env->welcome->must_fetch);
    else if (m->env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK)
        snprintf(buf, cap, "Ack decision %d \"%s\"", m->env->ack->decision, m->env->ack->reason);
    else snprintf(buf, cap, "%s", dl_wire_body_name(m->env->body_case));
    return buf;
}

static int expect_welcome(peer *p, char *got, size_t cap)
{
    dl_wire_msg m;
    int rc = recv_msg(p, &m);
    describe(rc, &m, got, cap);
    int ok = !rc && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME;
    if (ok) p->epoch = m.env->epoch;
    dl_wire_msg_close(&m);
    return ok;
}

static int expect_error(peer *p, int kind, const char *needle, char *got, size_t cap)
{
    dl_wire_msg m;
    int rc = recv_msg(p, &m);
    describe(rc, &m, got, cap);
    int ok = !rc && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
             (int)dl_wire_error_kind(m.env->error) == kind && m.env->error->fatal && strstr(m.env->error->message, needle);
    dl_wire_msg_close(&m);
    return ok;
}

/* Fetch fragment frag whole: payload into out, version into *v. 0 on success. */
static int fetch(peer *p, int frag, float *out, size_t n, uint64_t *v)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Fetch f;
    dloco__v1__fetch__init(&f);
    uint32_t fr = (uint32_t)frag;
    f.fragments = &fr;
    f.n_fragments = 1;
    dl_wire_env_init(&env, RUN, p->epoch, p->id);
    dl_wire_set_fetch(&env, &f);
    send_env(p, &env, NULL, 0);
    for (;;) {
        dl_wire_msg m;
        if (recv_msg(p, &m)) return -1;
        const Dloco__V1__Update *u = m.env->update;
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && (int)u->fragment == frag) {
            /* one frame: no chunking, or one chunk of it all */
            int whole = (!u->chunk_numel || (!u->chunk_offset && u->chunk_numel == n)) && !u->delta &&
                        dl_wire_msg_payload_len(&m, 0) == n * 4;
            if (whole) memcpy(out, dl_wire_msg_payload(&m, 0), n * 4);
            *v = u->version;
            dl_wire_msg_close(&m);
            return whole ? 0 : -1;
        }
        dl_wire_msg_close(&m);
    }
}

/* Push a whole fp32 delta of fragment frag; the final Ack's decision (and
 * reason), and after ACCEPTED the Update that follows into upd. */
static int push(peer *p, int frag, uint64_t base, uint64_t steps, uint64_t tokens, const float *delta, size_t n,
                char *reason, size_t cap, float *upd, uint64_t *upd_v)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Push ph;
    msg_push_fp32(&ph, frag, base, steps, tokens, n, 0, 0, n, delta);
    dl_wire_env_init(&env, RUN, p->epoch, p->id);
    dl_wire_set_push(&env, &ph);
    send_env(p, &env, delta, n * 4);
    int decision = -1;
    for (;;) {
        dl_wire_msg m;
        if (recv_msg(p, &m)) return decision;
        const Dloco__V1__Envelope *e = m.env;
        if (decision < 0 && e->body_case == DLOCO__V1__ENVELOPE__BODY_ACK && (int)e->ack->fragment == frag &&
            e->ack->decision != DLOCO__V1__DECISION__DECISION_MERGED_PENDING) {
            decision = e->ack->decision;
            snprintf(reason, cap, "%s", e->ack->reason);
            dl_wire_msg_close(&m);
            if (decision != DLOCO__V1__DECISION__DECISION_ACCEPTED) return decision;
            continue;
        }
        if (decision >= 0 && e->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && (int)e->update->fragment == frag) {
            *upd_v = e->update->version;
            if (!e->update->delta && !e->update->chunk_offset && dl_wire_msg_payload_len(&m, 0) == n * 4)
                memcpy(upd, dl_wire_msg_payload(&m, 0), n * 4);
            dl_wire_msg_close(&m);
            return decision;
        }
        dl_wire_msg_close(&m);
    }
}

/* ------------------------------------------------------------------------ */

static dl_manifest *M, *M2;
static dl_plan *plan;
static uint64_t fp;
static float *init; /* the init file's values, manifest layout */
static char init_path[340], man_path[340], man2_path[340];

static void setup(void)
{
    M = llama(0);
    M2 = llama(1);
    REQUIRE(dl_manifest_plan_open(M, P, &plan) == 0, "%s", dl_errmsg());
    fp = dl_manifest_fingerprint(M, plan);
    size_t n = dl_manifest_numel(M);
    init = malloc(n * sizeof *init);
    dl_rng r;
    dl_rng_seed(&r, 11);
    for (size_t i = 0; i < n; i++) init[i] = 0.02f * dl_rng_normal(&r);
    snprintf(init_path, sizeof init_path, "%s/init.safetensors", root);
    snprintf(man_path, sizeof man_path, "%s/manifest.json", root);
    snprintf(man2_path, sizeof man2_path, "%s/manifest2.json", root);
    write_init(init_path, M, init, 1);
    REQUIRE(dl_manifest_save(M, man_path) == 0 && dl_manifest_save(M2, man2_path) == 0, "%s", dl_errmsg());
    printf("model: %d tensors, %zu floats, P=%d, fingerprint %016llx\n", dl_manifest_ntensors(M), n, P,
           (unsigned long long)fp);
}

static syncd A;
static float *global; /* the learner's view of the global model, manifest layout */

/* A manifest learner joins, fetches version 0 (the init file, bit for bit),
 * pushes and gets merges; its token bound is its claim. */
static void test_run(void)
{
    char cap[32];
    snprintf(cap, sizeof cap, "%d", CAP);
    const char *args[] = {"--init_from", init_path, "--fragments", "3", "--max_tokens_per_step", cap, NULL};
    int st = 0;
    REQUIRE(sync_start(&A, "run", args, &st) == 0, "dloco-sync --init_from a Llama-like file did not start (%d)", st);
    row("dloco-sync --init_from init.safetensors (the manifest in its metadata) -> listening, epoch %llu",
        (unsigned long long)A.proc.epoch);
    peer a;
    peer_open(&a, &A, "llama-0");
    send_hello(&a, M, NULL, fp, CLAIM);
    char got[600];
    CHECK(expect_welcome(&a, got, sizeof got), "manifest Hello -> %s", got);
    row("Hello with the manifest, GPT fields 0, max_tokens_per_step %d -> %s", CLAIM, got);
    global = malloc(dl_manifest_numel(M) * sizeof *global);
    float *frag = malloc(dl_plan_max_fragment_numel(plan) * 4), *want = malloc(dl_plan_max_fragment_numel(plan) * 4);
    for (int p = 0; p < P; p++) {
        size_t n = dl_plan_fragment_numel(plan, p);
        uint64_t v = 99;
        CHECK(fetch(&a, p, frag, n, &v) == 0 && v == 0, "fetch %d: version %llu", p, (unsigned long long)v);
        dl_plan_gather(plan, p, init, want);
        CHECK(memcmp(frag, want, n * 4) == 0, "fragment %d at version 0 is not the init file's", p);
        dl_plan_scatter(plan, p, frag, global);
    }
    row("Fetch of the %d fragments -> version 0, the init file's values bit for bit", P);

    /* pushes within the claim merge; one beyond it is rejected */
    float *delta = malloc(dl_plan_max_fragment_numel(plan) * 4);
    for (int p = 0; p < 2; p++) {
        size_t n = dl_plan_fragment_numel(plan, p);
        for (size_t i = 0; i < n; i++) delta[i] = 0.001f * (float)((int)(i % 5) - 2);
        char reason[400] = "";
        uint64_t uv = 0;
        int d = push(&a, p, 0, 4, 4 * CLAIM, delta, n, reason, sizeof reason, frag, &uv);
        CHECK(d == DLOCO__V1__DECISION__DECISION_ACCEPTED && uv == 1, "push %d: decision %d '%s', update v%llu", p, d,
              reason, (unsigned long long)uv);
        row("Push fragment %d, 4 steps, %d tokens (= 4 x the claim) -> decision %d, Update v%llu", p, 4 * CLAIM, d,
            (unsigned long long)uv);
        uint64_t v = 0;
        float *again = malloc(n * 4);
        CHECK(fetch(&a, p, again, n, &v) == 0 && v == 1 && !memcmp(again, frag, n * 4), "fetch %d after the merge", p);
        dl_plan_gather(plan, p, init, want);
        CHECK(memcmp(again, want, n * 4) != 0, "fragment %d did not move", p);
        dl_plan_scatter(plan, p, again, global);
        free(again);
    }
    size_t n2 = dl_plan_fragment_numel(plan, 2);
    char reason[400] = "";
    uint64_t uv = 0;
    int d = push(&a, 2, 0, 1, CLAIM + 1, delta, n2, reason, sizeof reason, frag, &uv);
    CHECK(d == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(reason, "max_tokens_per_step 1024"),
          "over the claim: decision %d '%s'", d, reason);
    row("Push fragment 2, 1 step, %d tokens -> decision %d \"%s\"", CLAIM + 1, d, reason);
    free(delta);
    free(frag);
    free(want);
    peer_close(&a);
}

/* Learners the run refuses at Hello, each with a reason that names what differs. */
static void test_refusals(void)
{
    char got[600];
    peer b;
    /* a claim above the run's cap */
    peer_open(&b, &A, "greedy");
    send_hello(&b, M, NULL, fp, CAP + 1);
    CHECK(expect_error(&b, DLOCO__V1__ERROR_KIND__ERROR_KIND_INVALID, "max_tokens_per_step 4097 > the run's", got,
                       sizeof got),
          "claim above the cap -> %s", got);
    row("Hello claiming max_tokens_per_step %d (run cap %d) -> %s", CAP + 1, CAP, got);
    peer_close(&b);

    /* a manifest with one other shape: the tensor is named */
    dl_plan *p2;
    REQUIRE(dl_manifest_plan_open(M2, P, &p2) == 0, "%s", dl_errmsg());
    peer_open(&b, &A, "other-model");
    send_hello(&b, M2, NULL, dl_manifest_fingerprint(M2, p2), CLAIM);
    CHECK(expect_error(&b, DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH,
                       "tensor 'model.layers.0.self_attn.k_proj.weight' (3 of 21) has shape [16, 16] here, [8, 16] in "
                       "the learner's manifest",
                       got, sizeof got),
          "differing manifest -> %s", got);
    row("Hello with k_proj [8, 16] instead of [16, 16] -> %s", got);
    peer_close(&b);
    dl_plan_close(&p2);

    /* the run's manifest with another P: named as such */
    peer_open(&b, &A, "other-p");
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    dl_wire_manifest_buf buf;
    REQUIRE(dl_wire_hello_set_manifest(&h, M, &buf) == 0, "%s", dl_errmsg());
    dl_plan *p4;
    REQUIRE(dl_manifest_plan_open(M, 4, &p4) == 0, "%s", dl_errmsg());
    h.fingerprint = dl_manifest_fingerprint(M, p4);
    h.num_fragments = 4;
    h.max_chunk_bytes = 1 << 20;
    dl_wire_env_init(&env, RUN, 0, "other-p");
    dl_wire_set_hello(&env, &h);
    send_env(&b, &env, NULL, 0);
    CHECK(expect_error(&b, DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH, "P=4", got, sizeof got), "P=4 -> %s", got);
    row("Hello with the run's manifest but P=4 -> %s", got);
    dl_wire_manifest_buf_free(&buf);
    dl_plan_close(&p4);
    peer_close(&b);

    /* a GPT-2 learner (no manifest) */
    dl_model_config g = {.n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 64};
    dl_plan *gp;
    REQUIRE(dl_model_config_check(&g) == 0 && dl_model_plan_open(&g, P, &gp) == 0, "%s", dl_errmsg());
    peer_open(&b, &A, "gpt-learner");
    send_hello(&b, NULL, &g, dl_model_fingerprint(&g, gp), 0);
    CHECK(expect_error(&b, DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH, "GPT-2 learner", got, sizeof got),
          "GPT-2 Hello -> %s", got);
    row("GPT-2 Hello (n_layer..vocab, no manifest) -> %s", got);
    peer_close(&b);
    dl_plan_close(&gp);
}

/* The store keeps the manifest: a restart resumes with it, another one is
 * refused naming the tensor, a start without one is told what to give. */
static void test_restart(void)
{
    int code = sync_stop(&A);
    CHECK(code == 0, "stop: exit %d", code);
    int st = -2;
    syncd B;
    const char *other[] = {"--manifest", man2_path, "--fragments", "3", NULL};
    /* the same directory: sync_start names it by instance */
    CHECK(sync_start(&B, "run", other, &st) != 0 && st != 0, "a differing manifest on the store started");
    CHECK(log_has(&B, "model.layers.0.self_attn.k_proj.weight"), "the refusal names the tensor");
    row("restart with a manifest whose k_proj differs -> exit %d, the log names the tensor", st);
    const char *gpt[] = {"--fragments", "3", NULL};
    st = -2;
    CHECK(sync_start(&B, "run", gpt, &st) != 0 && st != 0, "a GPT start on the manifest store started");
    CHECK(log_has(&B, "--manifest"), "the refusal says to give the manifest");
    row("restart without a manifest (GPT-2 options) -> exit %d, told to give --manifest", st);
    const char *same[] = {"--manifest", man_path, "--fragments", "3", "--max_tokens_per_step", "4096", NULL};
    REQUIRE(sync_start(&A, "run", same, &st) == 0, "restart with the manifest did not start (%d)", st);
    CHECK(A.proc.resumed == 1 && A.proc.epoch == 2, "resumed %d epoch %llu", A.proc.resumed,
          (unsigned long long)A.proc.epoch);
    peer a;
    peer_open(&a, &A, "llama-0");
    send_hello(&a, M, NULL, fp, CLAIM);
    char got[600];
    CHECK(expect_welcome(&a, got, sizeof got), "rejoin -> %s", got);
    float *frag = malloc(dl_plan_max_fragment_numel(plan) * 4), *want = malloc(dl_plan_max_fragment_numel(plan) * 4);
    for (int p = 0; p < P; p++) {
        size_t n = dl_plan_fragment_numel(plan, p);
        uint64_t v = 99;
        CHECK(fetch(&a, p, frag, n, &v) == 0 && v == (p < 2 ? 1u : 0u), "fetch %d: v%llu", p, (unsigned long long)v);
        dl_plan_gather(plan, p, global, want);
        CHECK(memcmp(frag, want, n * 4) == 0, "fragment %d changed across the restart", p);
    }
    row("restart with the same manifest -> resumed, epoch %llu, versions 1 1 0 and the values kept",
        (unsigned long long)A.proc.epoch);
    free(frag);
    free(want);
    peer_close(&a);
    CHECK(sync_stop(&A) == 0, "stop");

    /* a new store with a manifest and no init file */
    const char *noinit[] = {"--manifest", man_path, "--fragments", "3", NULL};
    st = -2;
    CHECK(sync_start(&B, "noinit", noinit, &st) != 0 && st != 0, "a manifest run without an init file started");
    CHECK(log_has(&B, "init_from"), "the refusal names init_from");
    struct stat sb;
    CHECK(stat(B.store, &sb) != 0, "the refused start left a store behind");
    row("new store, --manifest without --init_from -> exit %d, told the init file is needed", st);
}

/* A GPT-2 run refuses a manifest learner at once. */
static void test_gpt_run(void)
{
    syncd G;
    const char *args[] = {"--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--seq_len", "8", "--vocab", "64",
                          "--fragments", "3", NULL};
    int st = 0;
    REQUIRE(sync_start(&G, "gpt", args, &st) == 0, "GPT run did not start (%d)", st);
    peer b;
    peer_open(&b, &G, "llama-x");
    send_hello(&b, M, NULL, fp, CLAIM);
    char got[600];
    CHECK(expect_error(&b, DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH, "GPT-2 run", got, sizeof got),
          "manifest Hello on a GPT run -> %s", got);
    row("manifest Hello on a GPT-2 run -> %s", got);
    peer_close(&b);
    /* dloco's GPT-2 described by its tensors (and its config): joins */
    dl_model_config g = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 64};
    dl_manifest *gm;
    dl_plan *gp;
    REQUIRE(dl_manifest_from_gpt(&g, &gm) == 0 && dl_manifest_plan_open(gm, P, &gp) == 0, "%s", dl_errmsg());
    peer_open(&b, &G, "nanogpt");
    send_hello(&b, gm, NULL, dl_manifest_fingerprint(gm, gp), 0);
    CHECK(expect_welcome(&b, got, sizeof got), "GPT-2 manifest Hello on its GPT-2 run -> %s", got);
    row("Hello with the run's GPT-2 table as a manifest, GPT fields set -> %s", got);
    peer_close(&b);
    dl_plan_close(&gp);
    dl_manifest_close(&gm);
    CHECK(sync_stop(&G) == 0, "stop");
}

/* Leave the run for tests/test_manifest_tools.sh. */
static void leave_out(const char *out)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/store' && cp -a '%s' '%s/store' && cp '%s' '%s/manifest.json'", out, A.store,
             out, man_path, out);
    CHECK(system(cmd) == 0, "%s", cmd);
    char path[600];
    snprintf(path, sizeof path, "%s/global.bin", out);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(global, 4, dl_manifest_numel(M), f) == dl_manifest_numel(M) && fclose(f) == 0, "%s", path);
    printf("left the run in %s (store, manifest.json, global.bin)\n", out);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/test_manifest_run.%d", (int)getpid());
    REQUIRE(mkdir(root, 0755) == 0, "mkdir %s", root);
    ctx = zmq_ctx_new();
    setup();
    test_run();
    if (A.proc.pid) {
        test_refusals();
        test_restart();
    }
    test_gpt_run();
    const char *out = getenv("MANIFEST_RUN_OUT");
    if (out && out[0]) leave_out(out);
    zmq_ctx_term(ctx);
    int rc = CHECK_DONE("test_manifest_run");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (!failures && system(cmd) != 0) printf("could not remove %s\n", root);
    if (failures) printf("kept %s\n", root);
    dl_plan_close(&plan);
    dl_manifest_close(&M);
    dl_manifest_close(&M2);
    free(init);
    free(global);
    return rc;
}
