/* dloco-sync as a black box: a real synchronizer process and a raw DEALER
 * speaking the wire protocol. Checks every answer the protocol promises,
 * including the error each bad message gets, the numbers of one merge
 * (outer Nesterov on the pushed delta), drop-stale + rebase, and the LMDB
 * record the merge leaves behind; pushes in every codec (encoded here with
 * kernels/codec.h) are decoded and merged, every live learner gets each new
 * version, and with a downlink codec a learner that holds v - 1 gets the
 * delta (and rebuilds the stored fragment bit for bit) while one that missed
 * a version gets the full fp32 values. */
#include "core/clock.h"
#include "core/err.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/hash.h"
#include "kernels/codec.h"
#include "kernels/outer.h"
#include "proto/wire.h"
#include "storage/store.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/check.h"

static const dl_model_config MODEL = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 256};
enum { P = 2 };
static char dir[256], endpoint[256];
static pid_t sync_pid;
static void *ctx;
static dl_plan *plan;
static uint64_t fingerprint, epoch;

/* Start dloco-sync on store dir/<name> (log dir/<name>.log) with P = 2,
 * as shard `shard` of `shards` when shards is not NULL; the bound endpoint
 * into ep (empty when it did not start within 10 s). */
static pid_t spawn_sync_x(const char *name, const char *shard, const char *shards, const char *const *extra, char *ep,
                          size_t cap)
{
    char logp[300], evp[300];
    snprintf(logp, sizeof logp, "%s/%s.log", dir, name);
    snprintf(evp, sizeof evp, "%s/%s.events", dir, name);
    unlink(evp); /* a fresh file: the endpoint below is this start's */
    fflush(stdout); /* the child's freopen would print what is buffered a second time */
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(logp, "w", stdout);
        (void)f;
        dup2(1, 2);
        const char *bin = getenv("DLOCO_BIN");
        char exe[512], store[300];
        snprintf(exe, sizeof exe, "%s/synchronizer/dloco-sync", bin ? bin : "build");
        snprintf(store, sizeof store, "%s/%s", dir, name);
        /* update_codec off: these fakes read fp32 Updates (test_delta_downlink asks for int4: a later flag wins) */
        char *argv[64] = {exe, "--store", store, "--bind", "tcp://127.0.0.1:0", "--n_layer", "1", "--n_head", "2",
                          "--n_embd", "16", "--seq_len", "8", "--vocab", "256", "--fragments", "2", "--H", "4",
                          "--heartbeat_ms", "100", "--max_staleness", "1", "--staleness", "const",
                          "--status_every_ms", "0", "--outer_lr", "0.7", "--outer_momentum", "0.9",
                          "--events", evp, "--update_codec", "off"};
        int n = 0;
        while (argv[n]) n++;
        if (shards) {
            argv[n++] = "--shard", argv[n++] = (char *)shard;
            argv[n++] = "--shards", argv[n++] = (char *)shards;
        }
        for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = (char *)extra[i];
        execv(exe, argv);
        _exit(127);
    }
    ep[0] = 0;
    for (int i = 0; i < 100 && !ep[0]; i++) {
        usleep(100000);
        /* the sync_start event's endpoint (docs/EVENTS.md), not the human log */
        FILE *f = fopen(evp, "r");
        char line[2048];
        while (f && fgets(line, sizeof line, f)) {
            const char *e = strstr(line, " endpoint=");
            if (strstr(line, " event=sync_start ") && e) {
                snprintf(ep, cap, "%.200s", e + 10);
                ep[strcspn(ep, " \n")] = 0;
            }
        }
        if (f) fclose(f);
        int st;
        if (!ep[0] && waitpid(pid, &st, WNOHANG) == pid) return -1; /* it exited */
    }
    return pid;
}

static pid_t spawn_sync(const char *name, const char *shard, const char *shards, char *ep, size_t cap)
{
    return spawn_sync_x(name, shard, shards, NULL, ep, cap);
}

static void start_sync(void) { sync_pid = spawn_sync("store", NULL, NULL, endpoint, sizeof endpoint); }

static void *dealer(const char *id)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    dl_wire_sock_setup(d, 0, 64 << 20);
    zmq_setsockopt(d, ZMQ_ROUTING_ID, id, strlen(id));
    zmq_connect(d, endpoint);
    return d;
}

static uint64_t last_seq; /* Envelope.seq of the newest message any recv_msg took (heartbeats too) */

/* next message that is not a heartbeat, within ms */
static int recv_msg_within(void *d, dl_wire_msg *m, int64_t ms)
{
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    int64_t deadline = dl_clock_ns() + ms * 1000000LL;
    while (dl_clock_ns() < deadline) {
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        int rc = dl_wire_recv(d, 0, NULL, m, ZMQ_DONTWAIT);
        if (rc == 0) last_seq = m->env->seq;
        if (rc == 0 && m->env->body_case == DLOCO__V1__ENVELOPE__BODY_HEARTBEAT) {
            dl_wire_msg_close(m);
            continue;
        }
        return rc;
    }
    return DL_ETIMEDOUT;
}

/* next message that is not a heartbeat, within 5 s */
static int recv_msg(void *d, dl_wire_msg *m) { return recv_msg_within(d, m, 5000); }

static uint32_t hello_embd = 16; /* the model Hellos describe: MODEL, or test_paced_downlink's wider one */

/* A Hello of this test's model (n_embd as given) and fingerprint, P fragments, device "test". */
static void hello_base(Dloco__V1__Hello *h, uint64_t fp, uint32_t n_embd)
{
    dloco__v1__hello__init(h);
    h->fingerprint = fp;
    h->n_layer = 1; h->n_head = 2; h->n_embd = n_embd; h->seq_len = 8; h->vocab = 256;
    h->num_fragments = P;
    h->device = "test";
}

static void send_hello_c(void *d, const char *id, const char *run, uint64_t fp, uint32_t max_chunk)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    hello_base(&h, fp, hello_embd);
    h.max_chunk_bytes = max_chunk;
    dl_wire_env_init(&env, run, 0, id);
    dl_wire_set_hello(&env, &h);
    CHECK(dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0) == 0, "send hello");
}

static void send_hello(void *d, const char *id, const char *run, uint64_t fp) { send_hello_c(d, id, run, fp, 0); }

/* A Hello of a learner restarted from a saved state at `step`, carrying `carried` fragment-tokens:
 * 1 when a Welcome answers, 0 when a fatal Error naming carried_tokens does, -1 otherwise. */
static int hello_carried(void *d, const char *id, const uint64_t *held, uint64_t step, uint64_t carried)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    hello_base(&h, fingerprint, 16);
    h.batch = 2;
    h.step = step;
    h.instance = 0x5eed;
    h.carried_tokens = carried;
    h.n_held_versions = held ? P : 0;
    h.held_versions = (uint64_t *)held;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_hello(&env, &h);
    CHECK(dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0) == 0, "send hello with carried tokens");
    dl_wire_msg w;
    int res = -1;
    for (int k = 0; k < 8 && res < 0; k++) {
        if (recv_msg(d, &w) != 0) break;
        if (w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME) res = 1;
        if (w.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR) {
            printf("carried_tokens %llu at step %llu: %s\n", (unsigned long long)carried, (unsigned long long)step,
                   w.env->error->message);
            res = w.env->error->fatal && strstr(w.env->error->message, "carried_tokens") ? 0 : -2;
        }
        dl_wire_msg_close(&w);
    }
    return res;
}

/* A Hello of a learner that trained: it holds version held[p] of each fragment. */
static void send_hello_held(void *d, const char *id, const uint64_t *held)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    hello_base(&h, fingerprint, 16);
    h.n_held_versions = P;
    h.held_versions = (uint64_t *)held;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_hello(&env, &h);
    CHECK(dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0) == 0, "send hello with held versions");
}

/* The Welcome's must_fetch for a Hello with held versions (-1: no Welcome). */
static int welcome_must_fetch(void *d, const char *id, const uint64_t *held)
{
    send_hello_held(d, id, held);
    dl_wire_msg w;
    int mf = -1;
    for (int k = 0; k < 8 && mf < 0; k++) {
        if (recv_msg(d, &w) != 0) break;
        if (w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME) mf = w.env->welcome->must_fetch;
        dl_wire_msg_close(&w);
    }
    return mf;
}

static void send_push(void *d, const char *id, int p, uint64_t base, const float *delta, size_t n)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Push ph;
    dloco__v1__push__init(&ph);
    ph.fragment = (uint32_t)p;
    ph.base_version = base;
    ph.steps = 4;
    ph.tokens = 64;
    ph.codec = DLOCO__V1__CODEC__CODEC_FP32;
    ph.numel = n;
    ph.checksum = dl_wire_checksum(delta, n * 4);
    ph.loss = 3.0;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_push(&env, &ph);
    const void *pl[1] = {delta};
    size_t lens[1] = {n * 4};
    CHECK(dl_wire_send(d, NULL, 0, &env, pl, lens, 1, 0) == 0, "send push");
}

static void expect_error(void *d, const char *what, int code, int fatal, const char *needle)
{
    dl_wire_msg m;
    int rc = recv_msg(d, &m);
    int ok = rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR && m.env->error->kind == dl_wire_error_kind_of(code) && m.env->error->code == 0 &&
             m.env->error->fatal == fatal && strstr(m.env->error->message, needle);
    printf("%-28s -> %s\n", what, rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR ? m.env->error->message : "(no error)");
    CHECK(ok, "%s: expected %s error %d containing '%s'", what, fatal ? "fatal" : "non-fatal", code, needle);
    dl_wire_msg_close(&m);
}

static void send_fetch(void *d, const char *id, const uint32_t *frags, size_t n)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Fetch f;
    dloco__v1__fetch__init(&f);
    f.fragments = (uint32_t *)frags;
    f.n_fragments = n;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_fetch(&env, &f);
    CHECK(dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0) == 0, "send fetch");
}

/* Shard 1 of 2 (P = 2: it owns fragment 1 only): its Welcome says so, it
 * serves and merges fragment 1 only, refuses a push or fetch of fragment 0
 * with an Error naming the owner, and its store keeps the layout: another
 * layout on it does not start. */
static void test_shard(void)
{
    char ep[256];
    pid_t pid = spawn_sync("shard1", "1", "2", ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "shard 1 of 2 starts");
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    void *d = dealer("shard-l");
    send_hello(d, "shard-l", "dloco", fingerprint);
    dl_wire_msg w;
    REQUIRE(recv_msg(d, &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "welcome from the shard");
    epoch = w.env->epoch;
    CHECK(w.env->welcome->shard == 1 && w.env->welcome->shards == 2 && w.env->welcome->n_fragment_versions == P,
          "welcome: shard %u of %u", w.env->welcome->shard, w.env->welcome->shards);
    dl_wire_msg_close(&w);
    /* fetch of all: only fragment 1 comes */
    send_fetch(d, "shard-l", NULL, 0);
    dl_wire_msg u;
    int rc = recv_msg(d, &u);
    CHECK(rc == 0 && u.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && u.env->update->fragment == 1,
          "a fetch of all gets the shard's fragment 1");
    dl_wire_msg_close(&u);
    uint32_t zero = 0;
    send_fetch(d, "shard-l", &zero, 1);
    expect_error(d, "fetch of another shard's", DL_EPROTO, 0, "fetch: fragment 0 belongs to shard 0 of 2");
    size_t n0 = dl_plan_fragment_numel(plan, 0), n1 = dl_plan_fragment_numel(plan, 1);
    float *delta = calloc(n0 > n1 ? n0 : n1, sizeof(float));
    for (size_t i = 0; i < n1; i++) delta[i] = 0.001f;
    send_push(d, "shard-l", 0, 0, delta, n0);
    expect_error(d, "push of another shard's", DL_EPROTO, 0,
                 "push: fragment 0 belongs to shard 0 of 2 (p % shards), this synchronizer is shard 1");
    send_push(d, "shard-l", 1, 0, delta, n1);
    int pending = 0, accepted = 0;
    for (int k = 0; k < 3; k++) {
        dl_wire_msg r;
        if (recv_msg(d, &r) != 0) break;
        if (r.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK && r.env->ack->fragment == 1) {
            pending |= r.env->ack->decision == DLOCO__V1__DECISION__DECISION_MERGED_PENDING;
            accepted |= r.env->ack->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED;
        }
        dl_wire_msg_close(&r);
    }
    CHECK(pending && accepted, "the shard merges its own fragment: pending %d accepted %d", pending, accepted);
    zmq_close(d);
    free(delta);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the shard exits 0 on SIGTERM");
    char store[300];
    snprintf(store, sizeof store, "%s/shard1", dir);
    CHECK(dl_store_check(store, NULL) == 0, "shard store check: %s", dl_errmsg());
    dl_store_opts so = dl_store_opts_default();
    so.read_only = 1;
    dl_store *st = NULL;
    if (dl_store_open(store, &so, &st) == 0) {
        dl_store_shard lay = {9, 9};
        uint64_t v0 = 9, v1 = 9;
        dl_store_get_shard(st, &lay);
        dl_store_read_fragment(st, 0, &v0, NULL, NULL);
        dl_store_read_fragment(st, 1, &v1, NULL, NULL);
        CHECK(lay.shard == 1 && lay.shards == 2 && v0 == 0 && v1 == 1, "store: shard %u of %u, versions %llu %llu",
              lay.shard, lay.shards, (unsigned long long)v0, (unsigned long long)v1);
        dl_store_close(&st);
    }
    /* another layout on this store does not start */
    const char *other[][2] = {{"0", "2"}, {NULL, NULL}};
    for (int i = 0; i < 2; i++) {
        pid_t q = spawn_sync("shard1", other[i][0], other[i][1], ep, sizeof ep);
        if (q > 0) {
            kill(q, SIGKILL);
            waitpid(q, NULL, 0);
        }
        char logp[300];
        snprintf(logp, sizeof logp, "%s/shard1.log", dir);
        FILE *f = fopen(logp, "r");
        char line[1024], found = 0;
        while (f && fgets(line, sizeof line, f)) found |= strstr(line, "holds shard 1 of 2 of run 'dloco'") != NULL;
        if (f) fclose(f);
        CHECK(q < 0 && found, "%s on shard 1's store is refused", i ? "an unsharded dloco-sync" : "shard 0 of 2");
    }
    printf("ok: shard 1 of 2 welcomes with its layout, serves and merges only its fragment, refuses the other's push "
           "and fetch, and its store refuses another layout\n");
}

/* ---- codecs: pushes in every codec, the broadcast, the delta downlink */

/* A Heartbeat saying the newest message of the synchronizer's received was `received` (0: none). */
static void send_heartbeat_seq(void *d, const char *id, uint64_t received)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    hb.received_seq = received;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_heartbeat(&env, &hb);
    CHECK(dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0) == 0, "send heartbeat");
}

static void send_heartbeat(void *d, const char *id) { send_heartbeat_seq(d, id, 0); }

static uint64_t ck_flip; /* XORed into the checksum push_codec sends (0: the payload's own) */

/* A push of fragment p on `base` in codec c: `bytes` of payload holding elements [off, off + cn) (cn 0: the
 * whole fragment; transfer names a chunked push). */
static void push_codec(void *d, const char *id, int p, uint64_t base, const dl_codec *c, const void *pl, size_t bytes,
                       uint64_t off, uint64_t cn, uint64_t transfer)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Push ph;
    dloco__v1__push__init(&ph);
    ph.fragment = (uint32_t)p;
    ph.base_version = base;
    ph.steps = 4;
    ph.tokens = 64;
    ph.codec = (Dloco__V1__Codec)c->id;
    ph.block_size = c->block;
    ph.topk = c->topk;
    ph.numel = dl_plan_fragment_numel(plan, p);
    ph.chunk_offset = off;
    ph.chunk_numel = cn;
    ph.transfer = transfer;
    ph.checksum = dl_wire_checksum(pl, bytes) ^ ck_flip;
    ph.loss = 3.0;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_push(&env, &ph);
    const void *pls[1] = {pl};
    size_t lens[1] = {bytes};
    CHECK(dl_wire_send(d, NULL, 0, &env, pls, lens, 1, 0) == 0, "send %s push", dl_codec_name(c->id));
}

/* The same, packed by hand: what dl_wire_send refuses to send (a payload of the wrong length). */
static void push_raw(void *d, const char *id, int p, uint64_t base, const dl_codec *c, const void *pl, size_t bytes)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Push ph;
    dloco__v1__push__init(&ph);
    ph.fragment = (uint32_t)p;
    ph.base_version = base;
    ph.steps = 4;
    ph.tokens = 64;
    ph.codec = (Dloco__V1__Codec)c->id;
    ph.block_size = c->block;
    ph.topk = c->topk;
    ph.numel = dl_plan_fragment_numel(plan, p);
    ph.checksum = dl_wire_checksum(pl, bytes);
    ph.loss = 3.0;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_push(&env, &ph);
    size_t n = dloco__v1__envelope__get_packed_size(&env);
    uint8_t *b = malloc(n);
    dloco__v1__envelope__pack(&env, b);
    CHECK(zmq_send(d, b, n, ZMQ_SNDMORE) == (int)n && zmq_send(d, pl, bytes, 0) == (int)bytes, "raw push");
    free(b);
}

static int acks[5]; /* Acks take_update passed over, by decision */
static char last_reason[512];
static uint32_t last_ack_chunk; /* Ack.chunk_bytes of the latest Ack take_update passed over */

/* Messages until one whole Update of fragment p has come, its chunks in
 * order; it is applied to held ([numel]): full values replace it, a delta is
 * added (dl_codec_decode_add, as a learner applies it). Acks on the way are
 * counted in acks[]. 0 with the Update's version, kind and codec, or -1. */
static int take_update(void *d, int p, float *held, uint64_t *version, int *delta, dl_codec *codec)
{
    size_t n = dl_plan_fragment_numel(plan, p);
    uint64_t next = 0;
    for (int k = 0; k < 64; k++) {
        dl_wire_msg m;
        if (recv_msg(d, &m)) return -1;
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK) {
            if ((unsigned)m.env->ack->decision < 5) acks[m.env->ack->decision]++;
            snprintf(last_reason, sizeof last_reason, "%s", m.env->ack->reason);
            last_ack_chunk = m.env->ack->chunk_bytes;
        }
        if (m.env->body_case != DLOCO__V1__ENVELOPE__BODY_UPDATE || m.env->update->fragment != (uint32_t)p) {
            dl_wire_msg_close(&m);
            continue;
        }
        const Dloco__V1__Update *u = m.env->update;
        uint64_t off = u->chunk_offset, cn = u->chunk_numel ? u->chunk_numel : n;
        dl_codec c = {.id = (dl_codec_id)u->codec, .block = u->block_size, .topk = u->topk};
        const uint8_t *pl = dl_wire_msg_payload(&m, 0);
        size_t len = dl_wire_msg_payload_len(&m, 0);
        int rc = off != next ? DL_EPROTO
                 : u->delta  ? dl_codec_decode_add(&c, pl, len, cn, held + off, held + off)
                             : dl_codec_decode(&c, pl, len, cn, held + off);
        *version = u->version;
        *delta = u->delta;
        *codec = c;
        dl_wire_msg_close(&m);
        if (rc) {
            printf("update of fragment %d at %llu (expected %llu): %s\n", p, (unsigned long long)off,
                   (unsigned long long)next, dl_errmsg());
            return -1;
        }
        next = off + cn;
        if (next == n) return 0;
    }
    return -1;
}

/* GET /metrics of the synchronizer whose log is dir/<name>.log into buf. */
static int get_metrics(const char *name, char *buf, size_t cap)
{
    char logp[300], line[512], addr[128] = "";
    snprintf(logp, sizeof logp, "%s/%s.log", dir, name);
    FILE *f = fopen(logp, "r");
    while (f && fgets(line, sizeof line, f)) {
        char *at = strstr(line, "metrics: http://");
        if (at) sscanf(at + 16, "%127[^/]", addr);
    }
    if (f) fclose(f);
    char *colon = strrchr(addr, ':');
    if (!colon) return -1;
    *colon = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    const char *req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, req, strlen(req)) < 0) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(fd, buf + got, cap - 1 - got)) > 0) got += (size_t)r;
    buf[got] = 0;
    close(fd);
    return 0;
}

/* /metrics of synchronizer NAME is re-rendered every second: scrape it until
 * every string of want (NULL-terminated) is in it, at most timeout_ms.
 * 0 when they all appeared, -1 when not (buf keeps the last scrape). */
static int wait_metrics(const char *name, char *buf, size_t cap, const char *const *want, int timeout_ms)
{
    for (int64_t end = dl_clock_ns() + (int64_t)timeout_ms * 1000000;; usleep(50000)) {
        int ok = get_metrics(name, buf, cap) == 0;
        for (int i = 0; ok && want[i]; i++) ok = strstr(buf, want[i]) != NULL;
        if (ok) return 0;
        if (dl_clock_ns() > end) return -1;
    }
}

/* 1 when the events file path has a line of event name with the field text
 * fields (" k=v" pairs, NULL: any). */
static int has_event(const char *path, const char *name, const char *fields)
{
    FILE *f = fopen(path, "r");
    char line[2048], ev[96];
    snprintf(ev, sizeof ev, "event=%s ", name);
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char *at = strstr(line, ev);
        found = at && (!fields || strstr(at, fields));
    }
    if (f) fclose(f);
    return found;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - (double)b[i]));
    return w;
}

static void stop_sync(pid_t pid, const char *what)
{
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s exits 0 on SIGTERM", what);
}

/* A delta in fragment 1's shape, different for each k. */
static void make_delta(float *x, size_t n, int k)
{
    for (size_t i = 0; i < n; i++) x[i] = 0.01f * sinf(0.173f * (float)i + (float)k) + 0.002f * (float)((i + k) % 3);
}

/* (a) + (c): learner ca pushes fragment 1 in each codec (a whole push, then
 * a chunked int4 one and two chunked fp32 ones); each is decoded, merged (weighted mean of one, no
 * share scaling: G -= outer Nesterov(decode(payload))), and ca and cb, which
 * never pushes, both get every new version. A push whose payload does not
 * match its codec and fragment size gets an Error naming both numbers; an
 * int4 push with a NaN scale is REJECTED, counted under reason codec. */
static void test_codec_pushes(void)
{
    static const char *const args[] = {"--merge", "mean", "--share_scaling", "false", NULL};
    char ep[256];
    pid_t pid = spawn_sync_x("codecs", NULL, NULL, args, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the codecs synchronizer starts");
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    const int p = 1;
    size_t n = dl_plan_fragment_numel(plan, p);
    void *a = dealer("ca"), *b = dealer("cb");
    float *ga = malloc(n * 4), *gb = malloc(n * 4), *gref = malloc(n * 4), *mom = calloc(n, 4);
    float *x = malloc(n * 4), *dec = malloc(n * 4);
    uint8_t *pl = malloc(n * 4 + 64);
    const uint32_t one = 1;
    uint64_t ver = 0;
    int isd = 0;
    dl_codec uc;
    for (int i = 0; i < 2; i++) {
        void *d = i ? b : a;
        const char *id = i ? "cb" : "ca";
        send_hello(d, id, "dloco", fingerprint);
        dl_wire_msg w;
        REQUIRE(recv_msg(d, &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "welcome %s", id);
        epoch = w.env->epoch;
        CHECK(w.env->welcome->update_codec == 0, "update_codec off: Welcome.update_codec 0, got %u",
              w.env->welcome->update_codec);
        dl_wire_msg_close(&w);
        send_fetch(d, id, &one, 1);
        REQUIRE(take_update(d, p, i ? gb : ga, &ver, &isd, &uc) == 0 && ver == 0 && !isd, "%s fetched v0", id);
    }
    memcpy(gref, ga, n * 4);
    static const dl_codec codecs[] = {{DL_CODEC_FP32, 0, 0},  {DL_CODEC_BF16, 0, 0},  {DL_CODEC_INT8, 16, 0},
                                      {DL_CODEC_INT4, 16, 0}, {DL_CODEC_E3M0, 16, 0}, {DL_CODEC_TOPK, 16, 4},
                                      {DL_CODEC_INT4, 16, 0}, {DL_CODEC_FP32, 0, 0},  {DL_CODEC_FP32, 0, 0}};
    /* elements per chunk (0: a whole push): int4 in chunks of 64 blocks; fp32 in 4 KiB chunks (each checked
     * while it is copied into the pool buffer) and in 1 KiB ones, smaller than any learner sends */
    static const uint64_t chunk[] = {0, 0, 0, 0, 0, 0, 1024, 1024, 256};
    int nc = (int)(sizeof codecs / sizeof codecs[0]);
    uint64_t v = 0;
    for (int k = 0; k < nc; k++, v++) {
        const dl_codec *c = &codecs[k];
        uint64_t cs = chunk[k];
        int chunked = cs > 0;
        make_delta(x, n, k);
        dl_codec_enc enc = {.c = *c, .rounding = DL_ROUND_NEAREST};
        size_t bytes = (size_t)dl_codec_bytes(c, n);
        REQUIRE(dl_codec_encode(&enc, x, NULL, n, 0, pl) == 0, "encode %s: %s", dl_codec_name(c->id), dl_errmsg());
        REQUIRE(dl_codec_decode(c, pl, bytes, n, dec) == 0, "decode %s", dl_codec_name(c->id));
        dl_cpu_nesterov(gref, mom, dec, n, 0.7f, 0.9f);
        send_heartbeat(b, "cb");
        if (!chunked) {
            push_codec(a, "ca", p, v, c, pl, bytes, 0, 0, 0);
        } else {
            REQUIRE(n > 2 * cs, "fragment %d (%zu elements) is more than two chunks of %llu", p, n,
                    (unsigned long long)cs);
            for (uint64_t off = 0; off < n; off += cs) {
                uint64_t cn = n - off < cs ? n - off : cs;
                size_t at = off ? (size_t)dl_codec_bytes(c, off) : 0;
                push_codec(a, "ca", p, v, c, pl + at, (size_t)dl_codec_bytes(c, cn), off, cn, 77);
            }
        }
        memset(acks, 0, sizeof acks);
        int ra = take_update(a, p, ga, &ver, &isd, &uc);
        CHECK(ra == 0 && ver == v + 1 && !isd && uc.id == DL_CODEC_FP32, "%s%s push: the pusher gets v%llu full",
              chunked ? "chunked " : "", dl_codec_name(c->id), (unsigned long long)v + 1);
        CHECK(acks[DLOCO__V1__DECISION__DECISION_ACCEPTED] == 1, "%s push accepted (acks: pending %d accepted %d "
              "rejected %d: %s)", dl_codec_name(c->id), acks[1], acks[2], acks[4], last_reason);
        double worst = max_diff(ga, gref, n);
        printf("%s%s push (%zu bytes, %.2f bits/element): max |global - (G - outer(decode(payload)))| = %.2e\n",
               chunked ? "chunked " : "", dl_codec_name(c->id), bytes, 8.0 * (double)bytes / (double)n, worst);
        CHECK(worst < 1e-6, "%s push: merged global off by %.3e", dl_codec_name(c->id), worst);
        int rb = take_update(b, p, gb, &ver, &isd, &uc);
        CHECK(rb == 0 && ver == v + 1 && memcmp(ga, gb, n * 4) == 0,
              "the non-contributor cb also gets v%llu (rc %d, version %llu)", (unsigned long long)v + 1, rb,
              (unsigned long long)ver);
        memcpy(gref, ga, n * 4); /* the next step starts from what was committed */
    }
    printf("ok: pushes in fp32, bf16, int8, int4, e3m0, topk, a chunked int4 push and chunked fp32 pushes (4 KiB and "
           "1 KiB chunks) were decoded and merged; the learner that never pushed got every version\n");

    /* a payload one byte short of what int4 x n (block 16) needs */
    dl_codec c4 = {DL_CODEC_INT4, 16, 0};
    size_t need = (size_t)dl_codec_bytes(&c4, n);
    char needle[160];
    snprintf(needle, sizeof needle, "payload is %zu bytes, int4 x %zu (block 16) needs %zu", need - 1, n, need);
    push_raw(a, "ca", p, v, &c4, pl, need - 1);
    expect_error(a, "int4 push one byte short", DL_EPROTO, 0, needle);

    /* a hostile int4 push: its first block's scale is NaN */
    make_delta(x, n, 99);
    dl_codec_enc e4 = {.c = c4, .rounding = DL_ROUND_NEAREST};
    REQUIRE(dl_codec_encode(&e4, x, NULL, n, 0, pl) == 0, "encode int4");
    float nan = NAN;
    memcpy(pl, &nan, 4);
    push_codec(a, "ca", p, v, &c4, pl, need, 0, 0, 0);
    {
        dl_wire_msg r;
        int rc = recv_msg(a, &r);
        CHECK(rc == 0 && r.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK &&
                  r.env->ack->decision == DLOCO__V1__DECISION__DECISION_REJECTED &&
                  strstr(r.env->ack->reason, "int4 payload refused"),
              "an int4 push with a NaN scale is rejected by the decoder");
        if (rc == 0 && r.env->ack) printf("int4 push with a NaN scale -> rejected: %s\n", r.env->ack->reason);
        if (rc == 0) dl_wire_msg_close(&r);
    }
    char *met = malloc(1 << 20);
    const char *want_codec[] = {"dloco_sync_pushes_rejected_total{reason=\"codec\"} 1", NULL};
    CHECK(wait_metrics("codecs", met, 1 << 20, want_codec, 10000) == 0,
          "the NaN-scale push counts under reason codec");
    free(met);
    zmq_close(a);
    zmq_close(b);
    stop_sync(pid, "the codecs synchronizer");
    free(ga), free(gb), free(gref), free(mom), free(x), free(dec), free(pl);
}

/* dloco-sync started as `name` (store and files dir/<name>*) with extra args; the endpoint the fakes
 * connect to is set to it, and evp (cap bytes) to its events file. */
static pid_t spawn_named(const char *name, const char *const *args, char *evp, size_t cap)
{
    char ep[256];
    pid_t pid = spawn_sync_x(name, NULL, NULL, args, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the %s synchronizer starts", name);
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    snprintf(evp, cap, "%s/%s.events", dir, name);
    return pid;
}

/* Learner `id` on a new DEALER: Hello, its Welcome (the epoch; Welcome.chunk_bytes into *chunk_bytes when
 * not NULL), and fragment p fetched into g at v0. Returns the DEALER. */
static void *join_fetch(const char *id, int p, float *g, uint32_t *chunk_bytes)
{
    void *d = dealer(id);
    send_hello(d, id, "dloco", fingerprint);
    dl_wire_msg w;
    REQUIRE(recv_msg(d, &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "welcome %s", id);
    epoch = w.env->epoch;
    if (chunk_bytes) *chunk_bytes = w.env->welcome->chunk_bytes;
    dl_wire_msg_close(&w);
    const uint32_t frag = (uint32_t)p;
    uint64_t ver = 1;
    int isd = 0;
    dl_codec uc;
    send_fetch(d, id, &frag, 1);
    REQUIRE(take_update(d, p, g, &ver, &isd, &uc) == 0 && ver == 0, "%s fetched v0", id);
    return d;
}

/* A learner's push chunk size follows its uplink (Ack.chunk_bytes, docs/PROTOCOL.md "Chunked transfers"):
 * with --chunk_kb 4 --push_chunk_max_kb 16 the Welcome says 4 KiB; a push whose 4 KiB chunks come back to
 * back on loopback (at least four: fewer never grow) gets an Ack saying 8 KiB (one doubling per push), the
 * next one 16 KiB (the bound), the next one too (no event); one whose chunks come 100 ms apart (about
 * 40 KB/s: a 4 KiB chunk takes 100 ms, twice the 50 ms target) gets 4 KiB again at once, and each change is
 * a push_chunk event. Every push is merged whatever size its chunks have. */
static void test_push_chunk_resize(void)
{
    static const char *const args[] = {"--chunk_kb", "4", "--push_chunk_max_kb", "16", NULL};
    char evp[300];
    pid_t pid = spawn_named("resize", args, evp, sizeof evp);
    const int p = 0;
    const uint64_t cn = 1024; /* 4 KiB of fp32 */
    size_t n = dl_plan_fragment_numel(plan, p);
    REQUIRE(n > 3 * cn, "fragment %d holds at least four 4 KiB chunks, the fewest a push grows on (%zu elements)", p,
            n);
    float *g = malloc(n * 4), *x = malloc(n * 4);
    uint32_t welcome_chunk = 0;
    void *d = join_fetch("rz", p, g, &welcome_chunk);
    CHECK(welcome_chunk == 4096, "Welcome.chunk_bytes is chunk_kb: %u", welcome_chunk);
    uint64_t ver = 0;
    int isd = 0;
    dl_codec uc, fp32 = {DL_CODEC_FP32, 0, 0};
    static const uint32_t want_of[4] = {8192, 16384, 16384, 4096}; /* after each push */
    for (int k = 0; k < 4; k++) {
        int slow = k == 3;
        make_delta(x, n, 40 + k);
        send_heartbeat(d, "rz");
        for (uint64_t off = 0; off < n; off += cn) {
            if (slow && off) usleep(100000);
            uint64_t c = n - off < cn ? n - off : cn;
            push_codec(d, "rz", p, ver, &fp32, x + off, (size_t)c * 4, off, c, 100 + (uint64_t)k);
        }
        memset(acks, 0, sizeof acks);
        last_ack_chunk = 0;
        uint64_t before = ver;
        int rc = take_update(d, p, g, &ver, &isd, &uc);
        uint32_t want = want_of[k], was = k ? want_of[k - 1] : 4096;
        CHECK(rc == 0 && ver == before + 1 && acks[DLOCO__V1__DECISION__DECISION_ACCEPTED] == 1,
              "%s chunked push merged (rc %d, v%llu, accepted %d: %s)", slow ? "the slow" : "the fast", rc,
              (unsigned long long)ver, acks[DLOCO__V1__DECISION__DECISION_ACCEPTED], last_reason);
        CHECK(last_ack_chunk == want, "after push %d (%s) Ack.chunk_bytes is %u, expected %u", k,
              slow ? "slow" : "fast", last_ack_chunk, want);
        char fields[96];
        snprintf(fields, sizeof fields, "id=rz bytes=%u was=%u ", want, was);
        if (want != was) CHECK(has_event(evp, "push_chunk", fields), "event push_chunk %s", fields);
        else CHECK(!has_event(evp, "push_chunk", fields), "no event push_chunk %s (unchanged)", fields);
        printf("%s push (4 KiB chunks%s): Ack.chunk_bytes %u\n", slow ? "slow" : "fast",
               slow ? ", 100 ms apart" : ", back to back", last_ack_chunk);
    }
    printf("ok: push chunks grow one doubling per push to push_chunk_max_kb on loopback and fall back to chunk_kb "
           "on a slow uplink\n");
    zmq_close(d);
    stop_sync(pid, "the resize synchronizer");
    free(g), free(x);
}

/* The push chunk bound and the message cap (sync_start's fields): on a model whose fragments exceed 2 MiB,
 * --push_chunk_max_kb 2048 alone raises the derived message cap to 2 MiB + the 64 KiB header cap; with
 * --max_msg_mb 1 set by hand the bound falls to what fits beside the header cap (1 MiB - 64 KiB), since
 * libzmq would drop the connection of a learner sending a larger chunk. */
static void test_push_chunk_cap(void)
{
    static const char *const derived[] = {"--vocab", "65536", "--push_chunk_max_kb", "2048", NULL};
    static const char *const capped[] = {"--vocab", "65536", "--push_chunk_max_kb", "2048", "--max_msg_mb", "1", NULL};
    const char *const *args[2] = {derived, capped};
    const char *name[2] = {"cap-derived", "cap-capped"};
    const char *want[2] = {"max_msg_bytes=2162688 ", "max_msg_bytes=1048576 "};
    const char *want2[2] = {"push_chunk_max=2097152 ", "push_chunk_max=983040 "};
    for (int k = 0; k < 2; k++) {
        char evp[300];
        pid_t pid = spawn_named(name[k], args[k], evp, sizeof evp);
        CHECK(has_event(evp, "sync_start", want[k]) && has_event(evp, "sync_start", want2[k]),
              "%s: sync_start has %s and %s", name[k], want[k], want2[k]);
        stop_sync(pid, name[k]);
    }
    printf("ok: a message cap set by hand bounds the push chunks (1 MiB - 64 KiB under --max_msg_mb 1)\n");
}

/* Push checksums (the uplink checks them; an fp32 chunk's while it is copied): a payload that does not
 * match its checksum gets an Error (non-fatal, "checksum ... does not match payload") and changes nothing,
 * whether it is a whole push, a chunked push's first chunk, a later fp32 chunk or a later int4 chunk; the
 * chunk after a refused one breaks the order (Ack REJECTED, push_abandoned), and a push sent again intact
 * merges. */
static void test_push_checksum(void)
{
    static const char *const args[] = {"--chunk_kb", "4", NULL};
    char evp[300];
    pid_t pid = spawn_named("checksum", args, evp, sizeof evp);
    const int p = 0;
    const uint64_t cn = 1024;
    size_t n = dl_plan_fragment_numel(plan, p);
    REQUIRE(n > 2 * cn, "fragment %d holds at least three 4 KiB chunks (%zu elements)", p, n);
    float *g = malloc(n * 4), *x = malloc(n * 4);
    uint8_t *q4 = malloc(n * 4);
    void *d = join_fetch("ck", p, g, NULL);
    uint64_t ver = 0;
    int isd = 0;
    dl_codec uc, fp32 = {DL_CODEC_FP32, 0, 0}, i4 = {DL_CODEC_INT4, 16, 0};
    make_delta(x, n, 7);
    const char *needle = "does not match payload";

    /* a whole push */
    ck_flip = 1;
    push_codec(d, "ck", p, ver, &fp32, x, n * 4, 0, 0, 0);
    ck_flip = 0;
    expect_error(d, "whole push, bad checksum", DL_EPROTO, 0, needle);
    /* chunked: a bad first chunk, then a bad later fp32 chunk, then a bad later int4 chunk */
    for (int k = 0; k < 3; k++) {
        const dl_codec *c = k == 2 ? &i4 : &fp32;
        const uint8_t *pl = (const uint8_t *)x;
        if (k == 2) {
            dl_codec_enc e = {.c = i4, .rounding = DL_ROUND_NEAREST};
            REQUIRE(dl_codec_encode(&e, x, NULL, n, 0, q4) == 0, "encode int4");
            pl = q4;
        }
        uint64_t bad = k == 0 ? 0 : cn, t = 200 + (uint64_t)k;
        for (uint64_t off = 0; off <= bad + cn; off += cn) {
            size_t at = off ? (size_t)dl_codec_bytes(c, off) : 0, len = (size_t)dl_codec_bytes(c, cn);
            ck_flip = off == bad;
            push_codec(d, "ck", p, ver, c, pl + at, len, off, cn, t);
            ck_flip = 0;
        }
        char what[64];
        snprintf(what, sizeof what, "%s chunk at %llu, bad checksum", dl_codec_name(c->id), (unsigned long long)bad);
        expect_error(d, what, DL_EPROTO, 0, needle);
        /* the chunk after it: no first chunk (k 0), or a gap */
        dl_wire_msg m;
        int rc = recv_msg(d, &m);
        CHECK(rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK &&
                  m.env->ack->decision == DLOCO__V1__DECISION__DECISION_REJECTED &&
                  strstr(m.env->ack->reason, k == 0 ? "without its first chunk" : "expected"),
              "%s: the next chunk is refused (%s)", what,
              rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK ? m.env->ack->reason : "no Ack");
        if (rc == 0) dl_wire_msg_close(&m);
    }
    CHECK(has_event(evp, "push_abandoned", "reason=chunk_out_of_order"), "the broken pushes were abandoned");
    /* intact, in chunks: merged into v1 */
    for (uint64_t off = 0; off < n; off += cn) {
        uint64_t c = n - off < cn ? n - off : cn;
        push_codec(d, "ck", p, ver, &fp32, x + off, (size_t)c * 4, off, c, 300);
    }
    memset(acks, 0, sizeof acks);
    int rc = take_update(d, p, g, &ver, &isd, &uc);
    CHECK(rc == 0 && ver == 1 && acks[DLOCO__V1__DECISION__DECISION_ACCEPTED] == 1,
          "the intact chunked push merged into v1 (rc %d, v%llu: %s)", rc, (unsigned long long)ver, last_reason);
    char *met = malloc(1 << 20);
    const char *want[] = {"dloco_sync_messages_refused_total{reason=\"invalid\"} 4", NULL};
    CHECK(wait_metrics("checksum", met, 1 << 20, want, 10000) == 0, "four refusals counted as invalid messages");
    free(met);
    printf("ok: pushes whose payload does not match their checksum are refused with an Error, whole or any chunk\n");
    zmq_close(d);
    stop_sync(pid, "the checksum synchronizer");
    free(g), free(x), free(q4);
}

/* The merge event's hash= of fragment p at version v in events file path (0 = none). */
static uint64_t merge_hash(const char *path, int p, uint64_t v)
{
    FILE *f = fopen(path, "r");
    char line[2048], want[64];
    snprintf(want, sizeof want, " frag=%d version=%llu ", p, (unsigned long long)v);
    uint64_t h = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *at = strstr(line, "event=merge ");
        char *hs = strstr(line, " hash=");
        if (at && strstr(at, want) && hs) h = strtoull(hs + 6, NULL, 16);
    }
    if (f) fclose(f);
    return h;
}

/* (d) update_codec int4 (block 16): da pushes fragment 1; db, which always
 * holds v - 1, gets each version as an int4 delta (chunked: it takes 4 KiB, and the
 * delta's 2,820 bytes make one chunk; the learner side of chunked deltas: test_comms, test_codec_cluster)
 * and its copy stays the stored fragment bit for bit (the merge event's hash);
 * dc gets v1 as a delta, then is dead while v2 and v3 merge: heard from
 * again, it is served the chain from what it holds: v2 and v3 as deltas
 * (together smaller than the fp32 fragment), and holds v3 bit for bit. */
static void test_delta_downlink(void)
{
    char evp[300];
    snprintf(evp, sizeof evp, "%s/delta.events", dir);
    const char *args[] = {"--merge", "mean", "--share_scaling", "false", "--update_codec", "int4", "--update_block",
                          "16", "--events", evp, NULL};
    char ep[256];
    pid_t pid = spawn_sync_x("delta", NULL, NULL, args, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the delta synchronizer starts");
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    const int p = 1;
    const uint32_t one = 1;
    size_t n = dl_plan_fragment_numel(plan, p);
    const char *ids[3] = {"da", "db", "dc"};
    void *d[3];
    float *g[3], *x = malloc(n * 4);
    uint8_t *pl = malloc(n * 4);
    uint64_t ver = 0;
    int isd = 0;
    dl_codec uc;
    for (int i = 0; i < 3; i++) {
        d[i] = dealer(ids[i]);
        g[i] = malloc(n * 4);
        send_hello_c(d[i], ids[i], "dloco", fingerprint, i == 1 ? 4096 : 0);
        dl_wire_msg w;
        REQUIRE(recv_msg(d[i], &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "welcome %s",
                ids[i]);
        epoch = w.env->epoch;
        CHECK(w.env->welcome->update_codec == DLOCO__V1__CODEC__CODEC_INT4, "Welcome.update_codec %u (int4 is 4)",
              w.env->welcome->update_codec);
        dl_wire_msg_close(&w);
        send_fetch(d[i], ids[i], &one, 1);
        REQUIRE(take_update(d[i], p, g[i], &ver, &isd, &uc) == 0 && ver == 0 && !isd, "%s: a Fetch is answered full",
                ids[i]);
    }
    dl_codec fp32 = {DL_CODEC_FP32, 0, 0};
    for (uint64_t v = 0; v < 3; v++) {
        if (v == 1) {
            /* dc falls silent past liveness (heartbeat_ms 100 x 6) while da and db
             * keep talking: dead (its learner_dead event) before v2 merges */
            int64_t end = dl_clock_ns() + 20 * (int64_t)1000000000;
            while (!has_event(evp, "learner_dead", " id=dc ") && dl_clock_ns() < end) {
                send_heartbeat(d[0], "da");
                send_heartbeat(d[1], "db");
                usleep(50000);
            }
            CHECK(has_event(evp, "learner_dead", " id=dc "), "dc, silent, is declared dead (learner_dead)");
        }
        send_heartbeat(d[1], "db");
        make_delta(x, n, (int)v);
        push_codec(d[0], "da", p, v, &fp32, x, n * 4, 0, 0, 0);
        memset(acks, 0, sizeof acks);
        int ra = take_update(d[0], p, g[0], &ver, &isd, &uc);
        CHECK(ra == 0 && ver == v + 1 && acks[DLOCO__V1__DECISION__DECISION_ACCEPTED] == 1,
              "da's push merged into v%llu", (unsigned long long)v + 1);
        int rb = take_update(d[1], p, g[1], &ver, &isd, &uc);
        CHECK(rb == 0 && ver == v + 1 && isd && uc.id == DL_CODEC_INT4 && uc.block == 16,
              "db, given v%llu, gets v%llu as an int4 delta (rc %d, delta %d, codec %s)", (unsigned long long)v,
              (unsigned long long)v + 1, rb, isd, dl_codec_name(uc.id));
        CHECK(memcmp(g[1], g[0], n * 4) == 0, "db's v%llu (v%llu + decode(delta)) is bit for bit da's",
              (unsigned long long)v + 1, (unsigned long long)v);
        /* the merge event is written by the worker, maybe after the Update went out */
        uint64_t want = 0, have = dl_checksum64(g[1], n * 4);
        for (int64_t end = dl_clock_ns() + 10 * (int64_t)1000000000; !want && dl_clock_ns() < end; usleep(20000))
            want = merge_hash(evp, p, v + 1);
        CHECK(want && want == have, "v%llu: merge event hash=%016llx, db's copy hashes %016llx",
              (unsigned long long)v + 1, (unsigned long long)want, (unsigned long long)have);
        if (v == 0) {
            int rc = take_update(d[2], p, g[2], &ver, &isd, &uc);
            CHECK(rc == 0 && ver == 1 && isd, "dc, given v0, gets v1 as a delta too");
        }
        if (v == 2) {
            send_heartbeat(d[2], "dc"); /* alive again: what it is owed comes now */
            int rc = take_update(d[2], p, g[2], &ver, &isd, &uc);
            CHECK(rc == 0 && ver == 2 && isd, "dc, dead through v2 and v3, gets the chain: v2 as a delta first (rc %d, "
                  "version %llu, delta %d)", rc, (unsigned long long)ver, isd);
            rc = take_update(d[2], p, g[2], &ver, &isd, &uc);
            CHECK(rc == 0 && ver == 3 && isd && memcmp(g[2], g[1], n * 4) == 0,
                  "... then v3 as a delta (rc %d, version %llu, delta %d), bit for bit as db rebuilt it", rc,
                  (unsigned long long)ver, isd);
        }
    }
    printf("ok: with update_codec int4 a learner given v-1 gets chunked int4 deltas and holds the stored fragment "
           "bit for bit (merge hash); one that missed versions gets the chain of deltas from what it holds\n");
    /* 3 fetch replies went full; da's and db's three and dc's v1, v2, v3 went as deltas */
    char *met = malloc(1 << 20);
    const char *want_sent[] = {"dloco_sync_updates_sent_total{kind=\"full\"} 3",
                               "dloco_sync_updates_sent_total{kind=\"delta\"} 9", NULL};
    CHECK(wait_metrics("delta", met, 1 << 20, want_sent, 10000) == 0, "metrics: 3 full and 9 delta Updates sent");
    free(met);
    for (int i = 0; i < 3; i++) {
        zmq_close(d[i]);
        free(g[i]);
    }
    stop_sync(pid, "the delta synchronizer");
    free(x), free(pl);
}


/* Fragment p's numel in test_paced_downlink's model (n_embd 128), set there. */
static size_t wide_numel[P];
static volatile int wide_stop;
static const char *wide_ep;

/* test_paced_downlink's fast learner: pushes fragment 0 again as soon as its
 * previous push was merged, reading everything it is sent, until wide_stop:
 * fragment 0 moves on much faster than the slow learner reads. */
static void *fast_pusher(void *arg)
{
    void *f = zmq_socket(ctx, ZMQ_DEALER);
    dl_wire_sock_setup(f, 0, 64 << 20);
    zmq_setsockopt(f, ZMQ_ROUTING_ID, "pf", 2);
    zmq_connect(f, wide_ep);
    send_hello_c(f, "pf", "dloco", *(const uint64_t *)arg, 1 << 20);
    float *delta = calloc(wide_numel[0], 4);
    for (size_t i = 0; i < wide_numel[0]; i++) delta[i] = 1e-4f;
    uint64_t base = 0;
    int pending = 0;
    while (!wide_stop) {
        if (!pending) {
            send_push(f, "pf", 0, base, delta, wide_numel[0]);
            pending = 1;
        }
        dl_wire_msg m;
        zmq_pollitem_t it = {f, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0 || dl_wire_recv(f, 0, NULL, &m, ZMQ_DONTWAIT)) continue;
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK && m.env->ack->fragment == 0 &&
            m.env->ack->decision != DLOCO__V1__DECISION__DECISION_MERGED_PENDING) {
            if (m.env->ack->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED) base = m.env->ack->merged_version;
            pending = 0;
        }
        dl_wire_msg_close(&m);
    }
    free(delta);
    zmq_close(f);
    return NULL;
}

/* (e) Pacing (docs/ARCHITECTURE.md "Downlink pacing"): a learner whose
 * connection drains slowly (it reads about 2 MB/s through a small socket
 * buffer) while another learner makes fragment 0 move on as fast as
 * merges go, with whole fragments of 460 KB and 1 MiB chunks and the
 * default window: each of its own pushes' first Ack comes after at most a small
 * number of Update bytes queued ahead of it (before pacing: up to two whole
 * fragments, 920 KB, plus what the kernel holds), and it gets only the
 * newest version of fragment 0, never one version twice. */
static void test_paced_downlink(void)
{
    /* 1 MiB chunks: the fakes push whole 460 KB fragments, more than the default chunk allows unchunked */
    static const char *const args[] = {"--n_embd", "128", "--max_staleness", "1000", "--outbound_ms", "50",
                                       "--chunk_kb", "1024", NULL};
    char ep[256];
    pid_t pid = spawn_sync_x("paced", NULL, NULL, args, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the paced synchronizer starts");
    dl_model_config m = MODEL;
    m.n_embd = 128;
    dl_model_config_check(&m);
    dl_plan *wplan;
    dl_model_plan_open(&m, P, &wplan);
    uint64_t wfp = dl_model_fingerprint(&m, wplan);
    for (int p = 0; p < P; p++) wide_numel[p] = dl_plan_fragment_numel(wplan, p);
    hello_embd = 128;
    wide_ep = ep;

    void *sl = zmq_socket(ctx, ZMQ_DEALER);
    dl_wire_sock_setup(sl, 0, 64 << 20);
    int one = 1, small = 16384;
    zmq_setsockopt(sl, ZMQ_RCVHWM, &one, sizeof one); /* libzmq reads ahead of us only a message or so */
    zmq_setsockopt(sl, ZMQ_RCVBUF, &small, sizeof small);
    zmq_setsockopt(sl, ZMQ_ROUTING_ID, "ps", 2);
    zmq_connect(sl, ep);
    send_hello_c(sl, "ps", "dloco", wfp, 1 << 20);
    dl_wire_msg w;
    REQUIRE(recv_msg(sl, &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "paced: welcome");
    epoch = w.env->epoch;
    dl_wire_msg_close(&w);
    pthread_t th;
    wide_stop = 0;
    REQUIRE(pthread_create(&th, NULL, fast_pusher, &wfp) == 0, "paced: the fast learner starts");

    float *delta = calloc(wide_numel[1], 4);
    for (size_t i = 0; i < wide_numel[1]; i++) delta[i] = 1e-4f;
    uint64_t base1 = 0, ahead_max = 0, v0_max = 0, v0_seen[4096] = {0};
    int v0_versions = 0, v0_twice = 0, acks_seen = 0;
    for (int k = 0; k < 6; k++) {
        send_push(sl, "ps", 1, base1, delta, wide_numel[1]);
        uint64_t ahead = 0;
        int acked = 0;
        for (int64_t end = dl_clock_ns() + 20000000000LL; dl_clock_ns() < end && acked < 2;) {
            dl_wire_msg u;
            if (recv_msg(sl, &u)) break;
            size_t got_b = u.npayload ? dl_wire_msg_payload_len(&u, 0) : 0;
            usleep(1000 + (useconds_t)(got_b / 2)); /* the slow reader: ~2 MB/s */
            if (u.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE) {
                const Dloco__V1__Update *up = u.env->update;
                if (!acked) ahead += got_b;
                if (up->fragment == 0 && up->chunk_offset == 0 && up->version < 4096) {
                    v0_twice += v0_seen[up->version]++ > 0;
                    v0_versions++;
                    if (up->version > v0_max) v0_max = up->version;
                }
            } else if (u.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK && u.env->ack->fragment == 1) {
                if (!acked++) acks_seen++;
                if (u.env->ack->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED) {
                    base1 = u.env->ack->merged_version;
                    acked = 2;
                } else if (u.env->ack->decision != DLOCO__V1__DECISION__DECISION_MERGED_PENDING) {
                    acked = 2;
                }
            }
            dl_wire_msg_close(&u);
        }
        if (ahead > ahead_max) ahead_max = ahead;
    }
    wide_stop = 1;
    pthread_join(th, NULL);
    char buf[1 << 16];
    int got = get_metrics("paced", buf, sizeof buf);
    const char *g = got == 0 ? strstr(buf, "dloco_sync_learner_control_behind_max_bytes{") : NULL;
    printf("paced: slow learner's pushes acked %d of 6, at most %llu Update bytes received before an Ack; it got %d "
           "versions of fragment 0 (newest v%llu); %.120s\n",
           acks_seen, (unsigned long long)ahead_max, v0_versions, (unsigned long long)v0_max, g ? g : "(no metrics)");
    CHECK(acks_seen == 6, "paced: every push of the slow learner acked (%d of 6)", acks_seen);
    /* what pacing bounds is what libzmq holds (the kernel's socket buffers, here MBs on loopback, come on top:
     * ahead_max is printed, not bounded) */
    unsigned long long behind = 0;
    CHECK(g && sscanf(strchr(g, '}') + 1, "%llu", &behind) == 1, "paced: control_behind_max_bytes in /metrics");
    CHECK(behind <= 512 * 1024, "paced: an Ack or heartbeat found %llu Update bytes queued ahead of it (bound 512 KiB: "
          "the window is what 50 ms drains, and the chunks shrink to it; before pacing 2 x 1 MiB)", behind);
    CHECK(v0_versions > 0 && v0_versions < (int)v0_max, "paced: %d versions of fragment 0 sent while it reached v%llu "
          "(the slow learner skips what it would not use)", v0_versions, (unsigned long long)v0_max);
    CHECK(v0_twice == 0, "paced: a version of fragment 0 started %d more times than once", v0_twice);
    free(delta);
    zmq_close(sl);
    hello_embd = 16;
    dl_plan_close(&wplan);
    stop_sync(pid, "paced");
}

/* (e) The path's bound (docs/ARCHITECTURE.md "Downlink pacing"): pb reports
 * what it received (Heartbeat.received_seq), gets v1, then stops reporting,
 * as a learner behind a cut link would; once v1 has waited unreported past
 * 2 x heartbeat_ms + outbound_ms (350 ms here) no Update goes to pb while
 * v2 and v3 merge, although its connection drains (the fake reads at once,
 * as a relay or a router buffer would). A received_seq above any seq sent
 * releases nothing; its true report brings the newest version, v3, whole
 * (fp32 Updates), not v2 first. Before the bound pb got v2 and v3 as they
 * merged. */
static void test_path_bound(void)
{
    char ep[256];
    pid_t pid = spawn_sync_x("path", NULL, NULL, NULL, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the path synchronizer starts");
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    const int p = 1;
    const uint32_t one = 1;
    size_t n = dl_plan_fragment_numel(plan, p);
    const char *ids[2] = {"pa", "pb"};
    void *d[2];
    float *g[2], *x = malloc(n * 4);
    uint64_t ver = 0;
    int isd = 0;
    dl_codec uc, fp32 = {DL_CODEC_FP32, 0, 0};
    for (int i = 0; i < 2; i++) {
        d[i] = dealer(ids[i]);
        g[i] = malloc(n * 4);
        send_hello(d[i], ids[i], "dloco", fingerprint);
        dl_wire_msg w;
        REQUIRE(recv_msg(d[i], &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "welcome %s",
                ids[i]);
        epoch = w.env->epoch;
        dl_wire_msg_close(&w);
        send_fetch(d[i], ids[i], &one, 1);
        REQUIRE(take_update(d[i], p, g[i], &ver, &isd, &uc) == 0 && ver == 0, "%s: v0 fetched", ids[i]);
    }
    send_heartbeat_seq(d[1], "pb", last_seq); /* pb reports: the bound applies to it */
    for (uint64_t v = 0; v < 3; v++) {
        make_delta(x, n, (int)v);
        push_codec(d[0], "pa", p, v, &fp32, x, n * 4, 0, 0, 0);
        REQUIRE(take_update(d[0], p, g[0], &ver, &isd, &uc) == 0 && ver == v + 1, "pa's push merged into v%llu",
                (unsigned long long)v + 1);
        if (v == 0) {
            CHECK(take_update(d[1], p, g[1], &ver, &isd, &uc) == 0 && ver == 1, "pb gets v1");
            usleep(600000); /* the stimulus: v1 waits unreported past the bound */
        }
    }
    dl_wire_msg m;
    int rc = recv_msg_within(d[1], &m, 1000);
    CHECK(rc == DL_ETIMEDOUT, "pb, silent about v1 for longer than the bound, is sent nothing more while v2 and v3 "
          "merge (got %s)", rc ? "nothing" : dl_wire_body_name(m.env->body_case));
    if (rc == 0) dl_wire_msg_close(&m);
    send_heartbeat_seq(d[1], "pb", UINT64_MAX);
    rc = recv_msg_within(d[1], &m, 500);
    CHECK(rc == DL_ETIMEDOUT, "a received_seq above any seq sent releases nothing (got %s)",
          rc ? "nothing" : dl_wire_body_name(m.env->body_case));
    if (rc == 0) dl_wire_msg_close(&m);
    send_heartbeat_seq(d[1], "pb", last_seq);
    rc = take_update(d[1], p, g[1], &ver, &isd, &uc);
    CHECK(rc == 0 && ver == 3 && !isd && memcmp(g[1], g[0], n * 4) == 0,
          "pb's report brings the newest version, v3, whole (rc %d, version %llu, delta %d), as pa holds it", rc,
          (unsigned long long)ver, isd);
    printf("ok: a learner that stops reporting what it received is sent no more Updates past the bound; its report "
           "brings the newest version\n");
    for (int i = 0; i < 2; i++) {
        zmq_close(d[i]);
        free(g[i]);
    }
    free(x);
    stop_sync(pid, "the path synchronizer");
}

/* A Hello of process `instance` holding `held` ([P], NULL: none) from the DEALER d (its routing id its own);
 * the Welcome into *w (closed by the caller), or -1. */
static int hello_inst(void *d, const char *id, uint64_t instance, const uint64_t *held, dl_wire_msg *w)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    hello_base(&h, fingerprint, 16);
    h.instance = instance;
    h.n_held_versions = held ? P : 0;
    h.held_versions = (uint64_t *)held;
    dl_wire_env_init(&env, "dloco", epoch, id);
    dl_wire_set_hello(&env, &h);
    CHECK(dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0) == 0, "send hello of an instance");
    for (int k = 0; k < 8; k++) {
        if (recv_msg(d, w) != 0) return -1;
        if (w->env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME) return 0;
        if (w->env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR) printf("hello_inst: %s\n", w->env->error->message);
        dl_wire_msg_close(w);
    }
    return -1;
}

/* The answers again (docs/PROTOCOL.md "Connections"): a learner process
 * (Hello.instance 77) whose push of fragment 0 was merged says Hello again
 * on a new connection, as after a cut link: its Welcome names the latest
 * answered base of each fragment (answered_bases {1, 0}: base 0 of fragment
 * 0, nothing of fragment 1) and the answers follow again, marked `again`:
 * MERGED_PENDING and ACCEPTED (merged version 1) of base 0. Another process
 * of the same id (instance 88) gets neither: those answers were not its. */
static void test_answers_again(void)
{
    char ep[256];
    pid_t pid = spawn_sync_x("answers", NULL, NULL, NULL, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the answers synchronizer starts");
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    const int p = 0;
    const uint32_t frag = 0;
    size_t n = dl_plan_fragment_numel(plan, p);
    float *g = malloc(n * 4), *x = malloc(n * 4);
    uint64_t ver = 0;
    int isd = 0;
    dl_codec uc;
    void *d = dealer("an-1");
    dl_wire_msg w;
    REQUIRE(hello_inst(d, "an", 77, NULL, &w) == 0, "answers: welcome of a fresh process");
    epoch = w.env->epoch;
    CHECK(w.env->welcome->n_answered_bases == 0, "a fresh process's Welcome names no answers (%zu)",
          w.env->welcome->n_answered_bases);
    dl_wire_msg_close(&w);
    send_fetch(d, "an", &frag, 1);
    REQUIRE(take_update(d, p, g, &ver, &isd, &uc) == 0 && ver == 0, "answers: v0 fetched");
    make_delta(x, n, 5);
    memset(acks, 0, sizeof acks);
    send_push(d, "an", p, 0, x, n);
    REQUIRE(take_update(d, p, g, &ver, &isd, &uc) == 0 && ver == 1 &&
                acks[DLOCO__V1__DECISION__DECISION_ACCEPTED] == 1,
            "answers: the push merged into v1, ACCEPTED");
    zmq_close(d); /* the connection goes, as a cut link's would be dropped */
    usleep(200000);
    d = dealer("an-2");
    uint64_t held[P] = {1, 0};
    REQUIRE(hello_inst(d, "an", 77, held, &w) == 0, "answers: welcome of the same process on a new connection");
    const Dloco__V1__Welcome *wl = w.env->welcome;
    CHECK(!wl->must_fetch && wl->n_answered_bases == P && wl->answered_bases[0] == 1 && wl->answered_bases[1] == 0,
          "the Welcome names the latest answered base of each fragment: %zu entries, {%llu, %llu} (want {1, 0})",
          wl->n_answered_bases, (unsigned long long)(wl->n_answered_bases ? wl->answered_bases[0] : 0),
          (unsigned long long)(wl->n_answered_bases > 1 ? wl->answered_bases[1] : 0));
    dl_wire_msg_close(&w);
    int pending = 0, accepted = 0, other = 0;
    for (int k = 0; k < 8; k++) {
        dl_wire_msg m;
        if (recv_msg_within(d, &m, 1000)) break;
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK) {
            const Dloco__V1__Ack *a = m.env->ack;
            if (a->again && a->fragment == 0 && a->base_version == 0 &&
                a->decision == DLOCO__V1__DECISION__DECISION_MERGED_PENDING)
                pending++;
            else if (a->again && a->fragment == 0 && a->base_version == 0 &&
                     a->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && a->merged_version == 1 && pending)
                accepted++;
            else
                other++;
        }
        dl_wire_msg_close(&m);
    }
    CHECK(pending == 1 && accepted == 1 && other == 0,
          "the answers follow again: MERGED_PENDING then ACCEPTED (v1) of base 0, marked again (%d, %d, %d others)",
          pending, accepted, other);
    zmq_close(d);
    usleep(200000);
    d = dealer("an-3");
    REQUIRE(hello_inst(d, "an", 88, held, &w) == 0, "answers: welcome of another process of the id");
    CHECK(w.env->welcome->n_answered_bases == 0, "another process's Welcome names no answers (%zu)",
          w.env->welcome->n_answered_bases);
    dl_wire_msg_close(&w);
    int acks_again = 0;
    for (int k = 0; k < 4; k++) {
        dl_wire_msg m;
        if (recv_msg_within(d, &m, 500)) break;
        acks_again += m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK && m.env->ack->again;
        dl_wire_msg_close(&m);
    }
    CHECK(acks_again == 0, "another process gets no answers again (%d)", acks_again);
    printf("ok: a process back on a new connection is told which of its pushes were answered, and the answers "
           "again\n");
    zmq_close(d);
    free(g), free(x);
    stop_sync(pid, "the answers synchronizer");
}

/* (e) The path's bytes bound (docs/ARCHITECTURE.md "Downlink pacing"): once
 * a path has held Updates past the window, the bytes its learner has not
 * reported stay under what its reports say it delivered in one window.
 * pb (test_paced_downlink's 460 KB fragments, 64 KiB Update chunks) reports
 * at T0, gets v1 of fragment 0, and then reports nothing for 2 s (its
 * Heartbeats carry received_seq 0, "none", as if every report were lost):
 * pa's next push merges v2 while v1 waits unreported past the window
 * (2 x 100 ms + 150 ms), so the time bound holds v2 back and the path is
 * deep. pb's report of v1 at T1 says the path delivered 460 KB in at least
 * 2 s: at most 230 KB/s, a bound of max(80 KB, the 128 KiB floor). So what
 * comes in the next 400 ms without a report is two chunks (at most three
 * here), not all of v2: the time bound alone let it all go at once (it
 * holds bytes back only once the oldest has waited the window, and
 * loopback takes them at once). Reports bring the rest of v2, equal to
 * what pa holds. */
static void path_hb(void *d, const char *id, uint64_t seq, int64_t *next_ns)
{
    if (dl_clock_ns() < *next_ns) return;
    send_heartbeat_seq(d, id, seq);
    *next_ns = dl_clock_ns() + 100000000LL;
}

/* One message for pb within 20 ms (*seq: its seq): an fp32 chunk of fragment 0's v2 that continues it is
 * applied to held at *next. Returns the payload bytes of an Update of fragment 0, -1 for anything else. */
static long pathb_recv(void *d, float *held, size_t n, uint64_t *next, uint64_t *seq)
{
    dl_wire_msg m;
    if (recv_msg_within(d, &m, 20)) return -1;
    *seq = m.env->seq;
    long got = -1;
    if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && m.env->update->fragment == 0) {
        const Dloco__V1__Update *u = m.env->update;
        uint64_t cn = u->chunk_numel ? u->chunk_numel : n;
        if (u->version == 2 && !u->delta && u->chunk_offset == *next &&
            dl_codec_decode(&(dl_codec){.id = DL_CODEC_FP32}, dl_wire_msg_payload(&m, 0), dl_wire_msg_payload_len(&m, 0),
                            cn, held + *next) == 0)
            *next += cn;
        got = (long)dl_wire_msg_payload_len(&m, 0);
    }
    dl_wire_msg_close(&m);
    return got;
}

static void test_path_bytes_bound(void)
{
    static const char *const args[] = {"--n_embd", "128", "--max_staleness", "1000", NULL};
    char ep[256];
    pid_t pid = spawn_sync_x("pathb", NULL, NULL, args, ep, sizeof ep);
    REQUIRE(pid > 0 && ep[0], "the pathb synchronizer starts");
    dl_model_config m = MODEL;
    m.n_embd = 128;
    dl_model_config_check(&m);
    dl_plan *wplan, *was_plan = plan;
    dl_model_plan_open(&m, P, &wplan);
    uint64_t wfp = dl_model_fingerprint(&m, wplan);
    plan = wplan; /* take_update reads the global plan */
    hello_embd = 128;
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    const int p = 0;
    const uint32_t frag = 0;
    size_t n = dl_plan_fragment_numel(plan, p);
    const char *ids[2] = {"pa", "pb"};
    void *d[2];
    float *g[2], *x = malloc(n * 4);
    uint64_t ver = 0, seq_b = 0;
    int isd = 0;
    dl_codec uc;
    for (int i = 0; i < 2; i++) {
        d[i] = dealer(ids[i]);
        g[i] = malloc(n * 4);
        send_hello_c(d[i], ids[i], "dloco", wfp, 1 << 20);
        dl_wire_msg w;
        REQUIRE(recv_msg(d[i], &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "pathb: welcome %s",
                ids[i]);
        epoch = w.env->epoch;
        dl_wire_msg_close(&w);
        send_fetch(d[i], ids[i], &frag, 1);
        REQUIRE(take_update(d[i], p, g[i], &ver, &isd, &uc) == 0 && ver == 0, "pathb: %s fetched v0", ids[i]);
        if (i == 1) seq_b = last_seq;
    }
    send_heartbeat_seq(d[1], "pb", seq_b); /* T0: pb reports; the path's first delivery sample starts */
    int64_t t0 = dl_clock_ns(), hb_next = t0 + 100000000LL;
    make_delta(x, n, 1);
    send_push(d[0], "pa", p, 0, x, n);
    REQUIRE(take_update(d[0], p, g[0], &ver, &isd, &uc) == 0 && ver == 1, "pathb: pa's push merged into v1");
    REQUIRE(take_update(d[1], p, g[1], &ver, &isd, &uc) == 0 && ver == 1, "pathb: pb gets v1");
    uint64_t seq_v1 = last_seq;
    while (dl_clock_ns() - t0 < 500000000LL) {
        path_hb(d[1], "pb", 0, &hb_next);
        usleep(10000);
    }
    make_delta(x, n, 2);
    send_push(d[0], "pa", p, 1, x, n);
    REQUIRE(take_update(d[0], p, g[0], &ver, &isd, &uc) == 0 && ver == 2, "pathb: pa's push merged into v2");
    dl_wire_msg mm;
    int early = 0;
    while (dl_clock_ns() - t0 < 2000000000LL) { /* nothing comes: the time bound holds v2 back */
        path_hb(d[1], "pb", 0, &hb_next);
        if (recv_msg_within(d[1], &mm, 20) == 0) {
            early += mm.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE;
            dl_wire_msg_close(&mm);
        }
    }
    CHECK(early == 0, "pathb: no Update came while v1 waited unreported past the window (%d came)", early);
    send_heartbeat_seq(d[1], "pb", seq_v1); /* T1: 460 KB delivered in >= 2 s */
    uint64_t got = 0, next = 0, seq_last = seq_v1;
    int chunks = 0;
    float *held = g[1];
    int64_t t1 = dl_clock_ns();
    hb_next = t1 + 100000000LL;
    while (dl_clock_ns() - t1 < 400000000LL) {
        path_hb(d[1], "pb", 0, &hb_next);
        long b = pathb_recv(d[1], held, n, &next, &seq_last);
        if (b >= 0) got += (uint64_t)b, chunks++;
    }
    printf("pathb: after the report of v1 (460 KB in %.1f s), %llu bytes of v2 came in %d chunks in 400 ms without a "
           "report (v2: %zu bytes)\n", (double)(t1 - t0) / 1e9, (unsigned long long)got, chunks, n * 4);
    CHECK(got > 0 && got <= 3 * 65536, "pathb: at most the bound (128 KiB) and a chunk of v2 went unreported: %llu "
          "bytes in %d chunks", (unsigned long long)got, chunks);
    /* reports bring the rest */
    for (int64_t end = dl_clock_ns() + 10000000000LL; next < n && dl_clock_ns() < end;) {
        path_hb(d[1], "pb", seq_last, &hb_next);
        pathb_recv(d[1], held, n, &next, &seq_last);
    }
    CHECK(next == n && memcmp(g[1], g[0], n * 4) == 0, "pathb: reports brought the rest of v2 (%llu of %zu elements), "
          "as pa holds it", (unsigned long long)next, n);
    printf("ok: a path that held Updates past the window has its unreported bytes bounded by what it delivered\n");
    for (int i = 0; i < 2; i++) {
        zmq_close(d[i]);
        free(g[i]);
    }
    free(x);
    plan = was_plan;
    hello_embd = 16;
    dl_plan_close(&wplan);
    stop_sync(pid, "the pathb synchronizer");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dloco_test_sync_%d", (int)getpid());
    mkdir(dir, 0755);
    start_sync();
    if (!endpoint[0]) {
        printf("FAIL: dloco-sync did not start\n");
        return 1;
    }
    ctx = zmq_ctx_new();
    dl_model_config m = MODEL;
    dl_model_config_check(&m);
    dl_model_plan_open(&m, P, &plan);
    fingerprint = dl_model_fingerprint(&m, plan);

    /* bad hellos and messages before hello */
    void *d = dealer("bad-1");
    send_hello(d, "bad-1", "other-run", fingerprint);
    expect_error(d, "hello with another run id", DL_EMISMATCH, 1, "run id 'other-run'");
    send_hello(d, "bad-1", "dloco", fingerprint ^ 1);
    expect_error(d, "hello with another model", DL_EMISMATCH, 1, "fingerprint");
    float z[4] = {0};
    {
        size_t nz = dl_plan_fragment_numel(plan, 0);
        float *zz = calloc(nz, 4);
        send_push(d, "bad-1", 0, 0, zz, nz);
        expect_error(d, "push before hello", DL_ENOTFOUND, 0, "send hello");
        free(zz);
    }
    /* (a routing id is not an identity any more: a learner is its learner_id on the connection it said
     * Hello on; test_hostile covers other connections speaking in its name) */
    zmq_send(d, "garbage", 7, 0);
    expect_error(d, "undecodable header", DL_EPROTO, 0, "undecodable");
    zmq_close(d);

    /* a good session */
    d = dealer("good-1");
    send_hello(d, "good-1", "dloco", fingerprint);
    dl_wire_msg w;
    CHECK(recv_msg(d, &w) == 0 && w.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME, "welcome");
    if (w.env && w.env->welcome) {
        epoch = w.env->epoch;
        CHECK(w.env->welcome->must_fetch && w.env->welcome->h == 4 && w.env->welcome->heartbeat_ms == 100 &&
                  w.env->welcome->n_fragment_versions == P && w.env->welcome->fragment_versions[0] == 0,
              "welcome fields");
        printf("welcome: epoch %llu, H %u, heartbeat %u ms, must_fetch %d\n", (unsigned long long)epoch,
               w.env->welcome->h, w.env->welcome->heartbeat_ms, w.env->welcome->must_fetch);
    }
    dl_wire_msg_close(&w);
    send_push(d, "good-1", 0, 0, z, 4);

    /* fetch: the global model equals the seeded init */
    size_t total = dl_plan_total_numel(plan);
    float *init = malloc(total * 4), *frag = malloc(total * 4);
    dl_model_init_params(&m, 1337, init);
    {
        expect_error(d, "push with a wrong numel", DL_EPROTO, 0, "numel");
        Dloco__V1__Envelope env;
        Dloco__V1__Fetch f;
        dloco__v1__fetch__init(&f);
        dl_wire_env_init(&env, "dloco", epoch, "good-1");
        dl_wire_set_fetch(&env, &f);
        dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0);
        for (int i = 0; i < P; i++) {
            dl_wire_msg u;
            int rc = recv_msg(d, &u);
            CHECK(rc == 0 && u.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE, "fetch update %d", i);
            if (rc == 0 && u.env->update) {
                int p = (int)u.env->update->fragment;
                size_t n = dl_plan_fragment_numel(plan, p);
                dl_plan_gather(plan, p, init, frag);
                CHECK(u.env->update->version == 0 && u.env->update->numel == n &&
                          !memcmp(dl_wire_msg_payload(&u, 0), frag, n * 4),
                      "fragment %d is the seeded init at version 0", p);
            }
            dl_wire_msg_close(&u);
        }
    }

    /* one push -> pending, then merged: global = init - 0.7*(1 + 0.9)*delta */
    size_t n0 = dl_plan_fragment_numel(plan, 0);
    float *delta = malloc(n0 * 4);
    for (size_t i = 0; i < n0; i++) delta[i] = 0.01f * (float)((i % 7) + 1);
    send_push(d, "good-1", 0, 0, delta, n0);
    int got_pending = 0, got_accepted = 0, got_update = 0;
    for (int k = 0; k < 3; k++) {
        dl_wire_msg r;
        if (recv_msg(d, &r) != 0) break;
        if (r.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK) {
            if (r.env->ack->decision == DLOCO__V1__DECISION__DECISION_MERGED_PENDING) got_pending = 1;
            if (r.env->ack->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && r.env->ack->merged_version == 1)
                got_accepted = 1;
        } else if (r.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE) {
            got_update = r.env->update->version == 1;
            dl_plan_gather(plan, 0, init, frag);
            double worst = 0;
            const float *g = dl_wire_msg_payload(&r, 0);
            for (size_t i = 0; i < n0; i++) {
                float gi;
                memcpy(&gi, g + i, 4);
                double want = (double)frag[i] - 0.7 * 1.9 * delta[i];
                worst = fmax(worst, fabs(gi - want));
            }
            printf("merge of one push: max |global - (init - 0.7*1.9*delta)| = %.2e\n", worst);
            CHECK(worst < 1e-6, "merged global fragment off by %.3e", worst);
        }
        dl_wire_msg_close(&r);
    }
    CHECK(got_pending && got_accepted && got_update, "pending %d accepted %d update v1 %d", got_pending, got_accepted,
          got_update);

    /* non-finite payload -> rejected */
    delta[3] = NAN;
    send_push(d, "good-1", 0, 1, delta, n0);
    {
        dl_wire_msg r;
        int rc = recv_msg(d, &r);
        CHECK(rc == 0 && r.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK &&
                  r.env->ack->decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(r.env->ack->reason, "non-finite"),
              "NaN push rejected");
        if (rc == 0 && r.env->ack) printf("push with a NaN            -> rejected: %s\n", r.env->ack->reason);
        dl_wire_msg_close(&r);
    }
    delta[3] = 0.01f;

    /* make fragment 0 reach version 3, then a push on base 0 is 3 > max 1 stale */
    for (uint64_t v = 1; v < 3; v++) {
        send_push(d, "good-1", 0, v, delta, n0);
        for (int k = 0; k < 3; k++) {
            dl_wire_msg r;
            if (recv_msg(d, &r) != 0) break;
            dl_wire_msg_close(&r);
        }
    }
    send_push(d, "good-1", 0, 0, delta, n0);
    {
        int dropped = 0, rebase_update = 0;
        for (int k = 0; k < 2; k++) {
            dl_wire_msg r;
            if (recv_msg(d, &r) != 0) break;
            if (r.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK &&
                r.env->ack->decision == DLOCO__V1__DECISION__DECISION_DROPPED_STALE && r.env->ack->rebase) {
                dropped = 1;
                printf("push 3 versions stale      -> dropped: %s (rebase)\n", r.env->ack->reason);
            }
            if (r.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && r.env->update->version == 3) rebase_update = 1;
            dl_wire_msg_close(&r);
        }
        CHECK(dropped && rebase_update, "stale push: dropped %d, rebase update to v3 %d", dropped, rebase_update);
    }

    /* Rejoin without refetch: a learner that kept its state comes back (a
     * new connection, as after a rebuild) holding fragment 0 at version 0,
     * 3 versions behind (max_staleness is 1): what it holds is of this
     * store's timeline, so it keeps it and fetches fragment 0 alone (the
     * Welcome's fragment_versions say so), not the whole model. A held
     * version newer than the global one is another timeline's: must_fetch. */
    {
        void *r = dealer("rejoin-1");
        uint64_t behind[P] = {0, 0}, ahead[P] = {4, 0};
        int mf = welcome_must_fetch(r, "rejoin-1", behind);
        printf("hello holding versions 3 behind -> must_fetch %d\n", mf);
        CHECK(mf == 0, "a learner holding older versions of this run keeps them (must_fetch %d)", mf);
        zmq_close(r);
        r = dealer("rejoin-2");
        mf = welcome_must_fetch(r, "rejoin-2", ahead);
        printf("hello holding a version ahead  -> must_fetch %d\n", mf);
        CHECK(mf == 1, "a learner holding a version newer than the global one fetches (must_fetch %d)", mf);
        zmq_close(r);
        /* Hello.carried_tokens: at most fragments x step x batch x seq_len (here 2 x 10 x 2 x 8 = 320);
         * more, or a carry without held versions, is refused naming it */
        r = dealer("carry-1");
        CHECK(hello_carried(r, "carry-1", behind, 10, 320) == 1, "a restarted learner carrying 320 tokens welcomed");
        zmq_close(r);
        r = dealer("carry-2");
        CHECK(hello_carried(r, "carry-2", behind, 10, 321) == 0, "carried_tokens beyond what 10 steps can train refused");
        zmq_close(r);
        r = dealer("carry-3");
        CHECK(hello_carried(r, "carry-3", NULL, 10, 5) == 0, "carried_tokens without held versions refused");
        zmq_close(r);
        r = dealer("carry-4");
        CHECK(hello_carried(r, "carry-4", behind, 0, 1) == 0, "carried_tokens at step 0 refused");
        zmq_close(r);
    }

    /* A NaN push of fragment 1 and then bye: nothing carries it on, so its
     * tokens end REJECTED. (The NaN push of fragment 0 above was carried on
     * by the next push on the same base, which was merged: a learner's
     * counters are cumulative, so that push reported those tokens again.) */
    delta[3] = NAN;
    send_push(d, "good-1", 1, 0, delta, dl_plan_fragment_numel(plan, 1));
    {
        dl_wire_msg r;
        int rc = recv_msg(d, &r);
        CHECK(rc == 0 && r.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK &&
                  r.env->ack->decision == DLOCO__V1__DECISION__DECISION_REJECTED,
              "NaN push of fragment 1 rejected");
        dl_wire_msg_close(&r);
    }
    delta[3] = 0.01f;

    /* bye, then the learner is unknown */
    {
        Dloco__V1__Envelope env;
        Dloco__V1__Bye b;
        dloco__v1__bye__init(&b);
        b.reason = "done";
        dl_wire_env_init(&env, "dloco", epoch, "good-1");
        dl_wire_set_bye(&env, &b);
        dl_wire_send(d, NULL, 0, &env, NULL, NULL, 0, 0);
        send_push(d, "good-1", 1, 0, delta, dl_plan_fragment_numel(plan, 1));
        expect_error(d, "push after bye", DL_ENOTFOUND, 0, "send hello");
    }
    zmq_close(d);

    kill(sync_pid, SIGTERM);
    int status = 0;
    waitpid(sync_pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "dloco-sync exits 0 on SIGTERM");

    /* the store: 3 merge records of fragment 0, the last also records the dropped push */
    char store[300];
    snprintf(store, sizeof store, "%s/store", dir);
    CHECK(dl_store_check(store, NULL) == 0, "store check: %s", dl_errmsg());
    dl_store_opts so = dl_store_opts_default();
    so.read_only = 1;
    dl_store *st = NULL;
    if (dl_store_open(store, &so, &st) == 0) {
        uint64_t v = 0;
        dl_store_read_fragment(st, 0, &v, NULL, NULL);
        CHECK(v == 3, "fragment 0 at version 3, got %llu", (unsigned long long)v);
        dl_merge_record rec;
        if (dl_store_get_merge(st, 0, 1, &rec) == 0) {
            CHECK(rec.n_contrib == 1 && !strcmp(rec.contrib[0].learner_id, "good-1") && rec.contrib[0].tokens == 64 &&
                      fabs(rec.contrib[0].weight - 1.0) < 1e-12 && rec.contrib[0].decision == DL_MERGE_MERGED,
                  "merge record 1");
            dl_merge_record_free(&rec);
        }
        dl_store_ledger led;
        dl_store_ledger_get(st, &led);
        printf("ledger: applied %llu rejected %llu\n", (unsigned long long)led.tokens[DL_LEDGER_APPLIED],
               (unsigned long long)led.tokens[DL_LEDGER_REJECTED]);
        CHECK(led.tokens[DL_LEDGER_APPLIED] == 3 * 64, "applied tokens");
        /* the NaN push was refused without rebase: its progress came back to
         * the learner (CARRIED), which never pushed fragment 1 again: at the
         * account's end it is unpushed progress, counted (LOST / OUTSTANDING)
         * from the learner's own reports -- none from this raw client */
        CHECK(led.tokens[DL_LEDGER_REJECTED] == 0, "no rejected tokens (the NaN push of fragment 1 is carried)");
        CHECK(led.tokens[DL_LEDGER_DROPPED_STALE] == 64, "dropped-stale tokens (the stale push)");
        dl_store_close(&st);
    }
    free(init);
    free(frag);
    free(delta);
    test_shard();
    test_codec_pushes();
    test_push_chunk_resize();
    test_push_chunk_cap();
    test_push_checksum();
    test_delta_downlink();
    test_path_bound();
    test_path_bytes_bound();
    test_answers_again();
    test_paced_downlink();
    dl_plan_close(&plan);
    zmq_ctx_term(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (getenv("KEEP_W")) printf("kept %s\n", dir);
    else if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    printf("%s\n", failures ? "test_sync: FAILED" : "test_sync: all checks passed");
    return failures ? 1 : 0;
}
