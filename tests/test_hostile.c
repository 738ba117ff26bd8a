/* dloco-sync against hostile peers, as a black box: real synchronizer processes
 * and raw DEALER sockets that lie, replay, flood, stall and impersonate.
 *
 * One function per row of the table in docs/SECURITY.md; each prints
 * "row: [tag] <what was sent> -> <what came back>" lines (the table's text) and
 * "row N <name>: PASS|FAIL". Every check reads a protocol answer (Error kind,
 * fatal, message; Ack decision, reason, rebase; Update payload) or a
 * machine-readable event of the synchronizer's --events file (parsed here);
 * row 7 reads the human log because its property is what that log contains.
 * Every wait is bounded by a deadline; no check depends on how long something
 * took. The synchronizers are this test's children: each is stopped by its pid
 * (SIGTERM, waitpid with a deadline, SIGKILL if it hangs).
 *
 * Environment: DLOCO_BIN (the build dir holding synchronizer/dloco-sync, as
 * test_sync), HOSTILE_ROWS=2,6 (run only those rows), HOSTILE_KEEP=1 (keep the
 * instances' sync.log and events.log; they are always kept after a failure). */
#include "core/clock.h"
#include "core/err.h"
#include "core/model.h"
#include "core/plan.h"
#include "proto/auth.h"
#include "proto/wire.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

/* a model and its fragment count */
typedef struct {
    dl_model_config m;
    int P;
} spec;
/* every row but the outbound one: 2 fragments of 3776 and 3760 floats (wte in two row blocks) */
static const spec SMALL = {{.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab = 256}, 2};
/* the outbound row: 8 fragments of up to 262144 floats (1 MiB); a Fetch of all is 7.4 MB, more than a
 * non-reading client's libzmq (RCVHWM 1: one message in the pipe, one in the decoder) and the loopback
 * socket buffers take in */
static const spec BIG = {{.n_layer = 2, .n_head = 2, .n_embd = 256, .seq_len = 8, .vocab = 1024}, 8};
enum { HB_MS = 100, MAX_P = 8 };
static const char *RUN = "dloco";

static char root[256];
static void *ctx;
/* Hello.max_chunk_bytes the peers announce (0: a peer from before chunking, served whole fragments) */
static uint32_t hello_max_chunk;
static uint64_t hello_instance; /* Hello.instance of send_hello (0: an older learner) */

static void row(const char *tag, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void row(const char *tag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("row: [%s] ", tag);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

static int verdict(int n, const char *name, int failures_before)
{
    int ok = failures == failures_before;
    printf("row %d %s: %s\n", n, name, ok ? "PASS" : "FAIL");
    fflush(stdout);
    return ok;
}

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* ------------------------------------------------------------------------ */
/* the events file (docs/EVENTS.md): logfmt lines, looked up by key */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    size_t k;
    while ((k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
    }
    fclose(f);
    b[n] = 0;
    if (len) *len = n;
    return b;
}

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* Value of `key` in one logfmt line (up to its '\n'), unquoted and unescaped. */
static int ev_field(const char *line, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    const char *p = line;
    while (*p && *p != '\n') {
        while (*p == ' ') p++;
        const char *k = p;
        while (*p && *p != '=' && *p != ' ' && *p != '\n') p++;
        size_t klen = (size_t)(p - k);
        if (*p != '=') continue;
        p++;
        char val[4200];
        size_t o = 0;
        if (*p == '"') {
            p++;
            while (*p && *p != '"' && *p != '\n') {
                int c = (unsigned char)*p++;
                if (c == '\\' && *p) {
                    c = (unsigned char)*p++;
                    if (c == 'n') c = '\n';
                    else if (c == 'r') c = '\r';
                    else if (c == 't') c = '\t';
                    else if (c == 'x' && isxdigit((unsigned char)p[0]) && isxdigit((unsigned char)p[1])) {
                        c = hexval(p[0]) * 16 + hexval(p[1]);
                        p += 2;
                    }
                }
                if (o + 1 < sizeof val) val[o++] = (char)c;
            }
            if (*p == '"') p++;
        } else {
            while (*p && *p != ' ' && *p != '\n')
                if (o + 1 < sizeof val) val[o++] = *p++;
                else p++;
        }
        val[o] = 0;
        if (klen == kl && !memcmp(k, key, kl)) {
            snprintf(out, cap, "%s", val);
            return 1;
        }
    }
    return 0;
}

/* A condition is "key=value" (the whole value) or "key~text" (value contains text). */
static int ev_match(const char *line, const char *event, const char *const *conds, int nc)
{
    char v[4200];
    if (!ev_field(line, "event", v, sizeof v) || strcmp(v, event)) return 0;
    for (int i = 0; i < nc; i++) {
        const char *c = conds[i];
        size_t kl = strcspn(c, "=~");
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kl, c);
        if (!ev_field(line, key, v, sizeof v)) return 0;
        if (c[kl] == '=' && strcmp(v, c + kl + 1)) return 0;
        if (c[kl] == '~' && !strstr(v, c + kl + 1)) return 0;
    }
    return 1;
}

static int collect(va_list ap, const char **conds)
{
    int n = 0;
    const char *c;
    while (n < 8 && (c = va_arg(ap, const char *))) conds[n++] = c;
    return n;
}

/* Matching lines of `event`; with key != NULL, *out gets that field of the
 * idx-th match (idx -1: the last). Conditions end with NULL. */
static int ev_scan(const char *path, const char *event, int idx, const char *key, char *out, size_t cap,
                   const char *const *conds, int nc)
{
    char *b = slurp(path, NULL);
    if (!b) return 0;
    int n = 0;
    for (char *line = b; *line;) {
        char *nl = strchr(line, '\n');
        if (ev_match(line, event, conds, nc)) {
            if (key && (idx < 0 || idx == n)) ev_field(line, key, out, cap);
            n++;
        }
        if (!nl) break;
        line = nl + 1;
    }
    free(b);
    return n;
}

static int ev_count(const char *path, const char *event, ...)
{
    const char *conds[8];
    va_list ap;
    va_start(ap, event);
    int nc = collect(ap, conds);
    va_end(ap);
    return ev_scan(path, event, 0, NULL, NULL, 0, conds, nc);
}

/* Field `key` of the idx-th matching event (-1 = last) into out ("" if none). */
static int ev_get(const char *path, const char *event, int idx, const char *key, char *out, size_t cap, ...)
{
    const char *conds[8];
    va_list ap;
    va_start(ap, cap);
    int nc = collect(ap, conds);
    va_end(ap);
    out[0] = 0;
    return ev_scan(path, event, idx, key, out, cap, conds, nc);
}

static void pump(void);

/* Poll until at least `min` matching events exist or timeout_ms passes; the count. */
static int ev_wait(const char *path, int min, int timeout_ms, const char *event, ...)
{
    const char *conds[8];
    va_list ap;
    va_start(ap, event);
    int nc = collect(ap, conds);
    va_end(ap);
    int64_t deadline = dl_clock_ns() + (int64_t)timeout_ms * 1000000LL;
    int n;
    while ((n = ev_scan(path, event, 0, NULL, NULL, 0, conds, nc)) < min && dl_clock_ns() < deadline) {
        pump();
        sleep_ms(20);
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* synchronizer processes */

typedef struct {
    dl_syncproc proc; /* the process; its endpoint, epoch and limits */
    char name[32], dir[300], log[340], events[340];
    dl_model_config model;
    int P;
    dl_plan *plan;
    uint64_t fp;
} syncd;

/* The last line of the instance's log, for a failure message. */
static const char *log_tail(const syncd *s, char *buf, size_t cap)
{
    buf[0] = 0;
    char *b = slurp(s->log, NULL);
    if (!b) return buf;
    size_t n = strlen(b);
    while (n && b[n - 1] == '\n') b[--n] = 0;
    char *last = strrchr(b, '\n');
    snprintf(buf, cap, "%s", last ? last + 1 : b);
    free(b);
    return buf;
}

/* Start dloco-sync with the common flags, the model and `extra` (NULL-ended);
 * returns 0 once its sync_start event is written, else -1 (it exited or
 * said nothing within 15 s; then it is stopped). */
static int sync_start(syncd *s, const char *name, const spec *sp, const char *const *extra)
{
    const dl_model_config *m = &sp->m;
    memset(s, 0, sizeof *s);
    s->P = sp->P;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->dir, sizeof s->dir, "%s/%s", root, name);
    mkdir(s->dir, 0755);
    snprintf(s->log, sizeof s->log, "%s/sync.log", s->dir);
    snprintf(s->events, sizeof s->events, "%s/events.log", s->dir);
    s->model = *m;
    static char store[340], nl[16], nh[16], ne[16], sl[16], vo[16], hb[16], fr[16];
    snprintf(store, sizeof store, "%s/store", s->dir);
    snprintf(nl, sizeof nl, "%d", m->n_layer);
    snprintf(nh, sizeof nh, "%d", m->n_head);
    snprintf(ne, sizeof ne, "%d", m->n_embd);
    snprintf(sl, sizeof sl, "%d", m->seq_len);
    snprintf(vo, sizeof vo, "%d", m->vocab);
    snprintf(hb, sizeof hb, "%d", HB_MS);
    snprintf(fr, sizeof fr, "%d", sp->P);
    /* heartbeat 100 < eviction 600 < grace cap 1000 < rebase 60000 ms; chunks
     * of 1 MiB: BIG's fragments (0.9 MB) fit one message, so the peers from
     * before chunking (Hello.max_chunk_bytes 0) that most rows use are let in */
    const char *argv[96] = {"--store", store, "--bind", "tcp://127.0.0.1:0", "--events", s->events,
                            "--n_layer", nl, "--n_head", nh, "--n_embd", ne, "--seq_len", sl, "--vocab", vo,
                            "--fragments", fr, "--H", "4", "--heartbeat_ms", hb, "--liveness", "6",
                            "--grace_cap_ms", "1000", "--rebase_ms", "60000", "--staleness", "const",
                            "--chunk_kb", "1024", "--status_every_ms", "0",
                            "--update_codec", "off" /* these fakes read fp32 Updates */};
    int argc = 0;
    while (argv[argc]) argc++;
    for (int i = 0; extra && extra[i] && argc < 94; i++) argv[argc++] = extra[i];
    argv[argc] = NULL;
    if (dl_syncproc_start(&s->proc, argv, s->log, 0, s->events, NULL)) return -1;
    dl_model_config mc = *m;
    dl_model_config_check(&mc);
    dl_model_plan_open(&mc, s->P, &s->plan);
    s->fp = dl_model_fingerprint(&mc, s->plan);
    return 0;
}

/* 1 while the instance's process has not exited. */
static int sync_alive(syncd *s) { return dl_syncproc_alive(&s->proc); }

/* SIGTERM, wait up to 10 s, SIGKILL. Returns the exit status (-1: killed or gone). */
static int sync_stop(syncd *s)
{
    int code = dl_syncproc_stop(&s->proc);
    dl_plan_close(&s->plan);
    return code;
}

/* ------------------------------------------------------------------------ */
/* peers: one DEALER each */

typedef struct {
    void *s;
    char id[80];    /* the learner id it speaks as by default */
    uint64_t epoch; /* from its Welcome (or the instance's, to speak without one) */
    syncd *sd;
    int64_t last_hb;
} peer;

/* peers that heartbeat while the test waits, as a live learner does */
static peer *keep[256];
static int nkeep;

static void keep_add(peer *p)
{
    if (nkeep < 256) keep[nkeep++] = p;
}

static void keep_del(peer *p)
{
    for (int i = 0; i < nkeep; i++)
        if (keep[i] == p) keep[i--] = keep[--nkeep];
}

typedef struct {
    const char *routing_id; /* NULL: none (libzmq picks one on the ROUTER side) */
    size_t routing_len;     /* 0: strlen(routing_id) */
    int rcvhwm;             /* 0: 10000, so unread heartbeats never fill it */
    int rcvbuf;             /* 0: the kernel's default */
    const dl_auth_keypair *key;
    const char *server_pub;
} peer_opts;

static void peer_open(peer *p, syncd *sd, const char *id, const peer_opts *o)
{
    static const peer_opts none;
    if (!o) o = &none;
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    p->sd = sd;
    p->epoch = sd->proc.epoch;
    p->s = zmq_socket(ctx, ZMQ_DEALER);
    CHECK(dl_wire_sock_setup(p->s, 0, 64 << 20) == 0, "socket setup: %s", dl_errmsg());
    int hwm = o->rcvhwm ? o->rcvhwm : 10000;
    zmq_setsockopt(p->s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (o->rcvbuf) zmq_setsockopt(p->s, ZMQ_RCVBUF, &o->rcvbuf, sizeof o->rcvbuf);
    if (o->routing_id)
        zmq_setsockopt(p->s, ZMQ_ROUTING_ID, o->routing_id, o->routing_len ? o->routing_len : strlen(o->routing_id));
    if (o->key) CHECK(dl_auth_client_sock(p->s, o->key, o->server_pub) == 0, "curve client: %s", dl_errmsg());
    CHECK(zmq_connect(p->s, sd->proc.endpoint) == 0, "connect %s", sd->proc.endpoint);
}

static void peer_close(peer *p)
{
    keep_del(p);
    if (p->s) zmq_close(p->s);
    p->s = NULL;
}

static int send_env(peer *p, Dloco__V1__Envelope *env, const void *payload, size_t len, int flags)
{
    const void *pl[1] = {payload};
    size_t lens[1] = {len};
    return dl_wire_send(p->s, NULL, 0, env, payload ? pl : NULL, payload ? lens : NULL, payload ? 1 : 0, flags);
}

static void send_hello_fp(peer *p, const char *as, uint32_t batch, uint64_t fp)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    const dl_model_config *m = &p->sd->model;
    h.fingerprint = fp;
    h.n_layer = (uint32_t)m->n_layer;
    h.n_head = (uint32_t)m->n_head;
    h.n_embd = (uint32_t)m->n_embd;
    h.seq_len = (uint32_t)m->seq_len;
    h.vocab = (uint32_t)m->vocab;
    h.num_fragments = (uint32_t)p->sd->P;
    h.device = "test";
    h.batch = batch;
    h.max_chunk_bytes = hello_max_chunk;
    h.instance = hello_instance;
    dl_wire_env_init(&env, RUN, 0, as ? as : p->id);
    dl_wire_set_hello(&env, &h);
    CHECK(send_env(p, &env, NULL, 0, 0) == 0, "send hello: %s", dl_errmsg());
}

static void send_hello(peer *p, const char *as, uint32_t batch) { send_hello_fp(p, as, batch, p->sd->fp); }

/* A Push in learner `as`'s name (NULL: the peer's own): with transfer 0 the
 * whole fragment, else its chunk of elements [off, off + n) of delta. */
static void push_msg(peer *p, const char *as, int frag, uint64_t base, uint64_t steps, uint64_t tokens,
                     uint64_t transfer, uint64_t off, uint64_t n, const float *delta)
{
    size_t numel = dl_plan_fragment_numel(p->sd->plan, frag);
    if (!transfer) off = 0, n = numel;
    Dloco__V1__Envelope env;
    Dloco__V1__Push ph;
    msg_push_fp32(&ph, frag, base, steps, tokens, numel, transfer, off, n, delta + off);
    dl_wire_env_init(&env, RUN, p->epoch, as ? as : p->id);
    dl_wire_set_push(&env, &ph);
    CHECK(send_env(p, &env, delta + off, n * 4, 0) == 0, "send push: %s", dl_errmsg());
}

static void send_push(peer *p, const char *as, int frag, uint64_t base, uint64_t steps, uint64_t tokens,
                      const float *delta)
{
    push_msg(p, as, frag, base, steps, tokens, 0, 0, 0, delta);
}

/* One chunk of a push: elements [off, off + n) of delta (the fragment's payload). */
static void send_push_chunk(peer *p, int frag, uint64_t base, uint64_t steps, uint64_t tokens, uint64_t transfer,
                            uint64_t off, uint64_t n, const float *delta)
{
    push_msg(p, NULL, frag, base, steps, tokens, transfer, off, n, delta);
}

static void send_fetch_resume(peer *p, uint32_t frag, uint64_t version, uint64_t offset)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Fetch f;
    dloco__v1__fetch__init(&f);
    f.fragments = &frag;
    f.n_fragments = 1;
    f.resume_versions = &version;
    f.resume_offsets = &offset;
    f.n_resume_versions = f.n_resume_offsets = 1;
    dl_wire_env_init(&env, RUN, p->epoch, p->id);
    dl_wire_set_fetch(&env, &f);
    CHECK(send_env(p, &env, NULL, 0, 0) == 0, "send fetch: %s", dl_errmsg());
}

static void send_fetch(peer *p, const uint32_t *frags, size_t nf)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Fetch f;
    dloco__v1__fetch__init(&f);
    f.fragments = (uint32_t *)frags;
    f.n_fragments = nf;
    dl_wire_env_init(&env, RUN, p->epoch, p->id);
    dl_wire_set_fetch(&env, &f);
    CHECK(send_env(p, &env, NULL, 0, 0) == 0, "send fetch: %s", dl_errmsg());
}

static void send_bye(peer *p, const char *as)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Bye b;
    dloco__v1__bye__init(&b);
    b.reason = "done";
    dl_wire_env_init(&env, RUN, p->epoch, as ? as : p->id);
    dl_wire_set_bye(&env, &b);
    CHECK(send_env(p, &env, NULL, 0, 0) == 0, "send bye: %s", dl_errmsg());
}

static void send_heartbeat(peer *p, uint64_t step, uint64_t tokens)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Heartbeat hb;
    msg_heartbeat(&env, &hb, RUN, p->epoch, p->id);
    hb.step = step;
    hb.tokens = tokens;
    CHECK(send_env(p, &env, NULL, 0, 0) == 0, "send heartbeat: %s", dl_errmsg());
}

/* An envelope packed by hand: what dl_wire_send would refuse to send (a bad learner_id, a control byte). */
static void send_raw_env(peer *p, Dloco__V1__Envelope *env)
{
    size_t n = dloco__v1__envelope__get_packed_size(env);
    uint8_t *b = malloc(n);
    dloco__v1__envelope__pack(env, b);
    CHECK(zmq_send(p->s, b, n, 0) == (int)n, "raw send");
    free(b);
}

static void pump(void)
{
    int64_t now = dl_clock_ns();
    for (int i = 0; i < nkeep; i++) {
        peer *p = keep[i];
        if (now - p->last_hb < (int64_t)HB_MS * 1000000LL * 9 / 10) continue;
        p->last_hb = now;
        Dloco__V1__Envelope env;
        Dloco__V1__Heartbeat hb;
        msg_heartbeat(&env, &hb, RUN, p->epoch, p->id);
        send_env(p, &env, NULL, 0, ZMQ_DONTWAIT);
    }
}

static void sleep_pump(int ms)
{
    int64_t deadline = dl_clock_ns() + (int64_t)ms * 1000000LL;
    while (dl_clock_ns() < deadline) {
        pump();
        sleep_ms(10);
    }
}

/* Next message on p within timeout_ms; heartbeats are skipped unless
 * any != 0. Returns 0, DL_ETIMEDOUT (m is then empty) or a receive error. */
static int recv_msg2(peer *p, int timeout_ms, dl_wire_msg *m, int any)
{
    memset(m, 0, sizeof *m);
    zmq_pollitem_t it = {p->s, 0, ZMQ_POLLIN, 0};
    int64_t deadline = dl_clock_ns() + (int64_t)timeout_ms * 1000000LL;
    while (dl_clock_ns() < deadline) {
        pump();
        if (zmq_poll(&it, 1, 10) <= 0) continue;
        int rc = dl_wire_recv(p->s, 0, NULL, m, ZMQ_DONTWAIT);
        if (rc == DL_EAGAIN) {
            dl_wire_msg_close(m);
            continue;
        }
        if (rc == 0 && !any && m->env->body_case == DLOCO__V1__ENVELOPE__BODY_HEARTBEAT) {
            dl_wire_msg_close(m);
            continue;
        }
        return rc;
    }
    memset(m, 0, sizeof *m);
    return DL_ETIMEDOUT;
}

static int recv_msg(peer *p, int timeout_ms, dl_wire_msg *m) { return recv_msg2(p, timeout_ms, m, 0); }

static const char *decision_name(int d)
{
    switch (d) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING: return "MERGED_PENDING";
    case DLOCO__V1__DECISION__DECISION_ACCEPTED: return "ACCEPTED";
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE: return "DROPPED_STALE";
    case DLOCO__V1__DECISION__DECISION_REJECTED: return "REJECTED";
    default: return "?";
    }
}

/* A received message (or rc) as the table shows it. */
static const char *describe(int rc, const dl_wire_msg *m, int timeout_ms, char *buf, size_t cap)
{
    if (rc == DL_ETIMEDOUT) {
        snprintf(buf, cap, "nothing within %d ms", timeout_ms);
        return buf;
    }
    if (rc) {
        snprintf(buf, cap, "an invalid message (%s)", dl_errmsg());
        return buf;
    }
    const Dloco__V1__Envelope *e = m->env;
    switch (e->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_WELCOME:
        snprintf(buf, cap, "Welcome (must_fetch %d)", e->welcome->must_fetch);
        break;
    case DLOCO__V1__ENVELOPE__BODY_ERROR:
        snprintf(buf, cap, "Error %s %s \"%s\"", dl_wire_error_kind_name(dl_wire_error_kind(e->error)),
                 e->error->fatal ? "fatal" : "non-fatal", e->error->message);
        break;
    case DLOCO__V1__ENVELOPE__BODY_ACK:
        snprintf(buf, cap, "Ack %s%s%s%s%s%s", decision_name(e->ack->decision), e->ack->reason[0] ? " \"" : "",
                 e->ack->reason, e->ack->reason[0] ? "\"" : "", e->ack->rebase ? " rebase" : "",
                 e->ack->busy ? " busy" : "");
        break;
    case DLOCO__V1__ENVELOPE__BODY_UPDATE:
        if (e->update->chunk_numel)
            snprintf(buf, cap, "Update frag %u v%llu chunk [%llu, +%llu)", e->update->fragment,
                     (unsigned long long)e->update->version, (unsigned long long)e->update->chunk_offset,
                     (unsigned long long)e->update->chunk_numel);
        else
            snprintf(buf, cap, "Update frag %u v%llu", e->update->fragment, (unsigned long long)e->update->version);
        break;
    default: snprintf(buf, cap, "%s", dl_wire_body_name(e->body_case)); break;
    }
    return buf;
}

/* Next non-heartbeat message must be a Welcome; sets p->epoch. got: what came. */
static int expect_welcome(peer *p, char *got, size_t cap)
{
    dl_wire_msg m;
    int rc = recv_msg(p, 5000, &m);
    describe(rc, &m, 5000, got, cap);
    int ok = rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME;
    if (ok) p->epoch = m.env->epoch;
    dl_wire_msg_close(&m);
    return ok;
}

/* Next non-heartbeat message must be an Error of `kind`, `fatal`, with needle in its message. */
static int expect_error(peer *p, int kind, int fatal, const char *needle, char *got, size_t cap)
{
    dl_wire_msg m;
    int rc = recv_msg(p, 5000, &m);
    describe(rc, &m, 5000, got, cap);
    int ok = rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
             (int)dl_wire_error_kind(m.env->error) == kind && m.env->error->fatal == fatal &&
             strstr(m.env->error->message, needle) != NULL;
    dl_wire_msg_close(&m);
    return ok;
}

/* Nothing at all (not even a heartbeat) within ms. */
static int expect_nothing(peer *p, int ms, char *got, size_t cap)
{
    dl_wire_msg m;
    int rc = recv_msg2(p, ms, &m, 1);
    describe(rc, &m, ms, got, cap);
    dl_wire_msg_close(&m);
    return rc == DL_ETIMEDOUT;
}

typedef struct {
    int decision, rebase, busy;
    uint32_t retry_after_ms;
    uint64_t merged;
    char reason[400];
    char got[600];       /* the decision as the table shows it */
    int updated;         /* an Update of the fragment followed (merge result or rebase) */
    uint64_t upd_version;
} decision;

/* Wait for the final Ack of (frag, base) (MERGED_PENDING skipped), nothing
 * after it consumed. 0 when it came. */
static int await_ack(peer *p, int frag, uint64_t base, decision *d, int64_t deadline)
{
    memset(d, 0, sizeof *d);
    for (;;) {
        int left = (int)((deadline - dl_clock_ns()) / 1000000);
        dl_wire_msg m;
        int rc = left > 0 ? recv_msg(p, left, &m) : DL_ETIMEDOUT;
        if (rc) {
            describe(rc, &m, 5000, d->got, sizeof d->got);
            dl_wire_msg_close(&m);
            return -1;
        }
        const Dloco__V1__Envelope *e = m.env;
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_ACK && (int)e->ack->fragment == frag &&
            e->ack->base_version == base && e->ack->decision != DLOCO__V1__DECISION__DECISION_MERGED_PENDING) {
            d->decision = e->ack->decision;
            d->rebase = e->ack->rebase;
            d->busy = e->ack->busy;
            d->retry_after_ms = e->ack->retry_after_ms;
            d->merged = e->ack->merged_version;
            snprintf(d->reason, sizeof d->reason, "%s", e->ack->reason);
            describe(0, &m, 0, d->got, sizeof d->got);
            dl_wire_msg_close(&m);
            return 0;
        }
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR) {
            describe(0, &m, 0, d->got, sizeof d->got);
            dl_wire_msg_close(&m);
            return -1;
        }
        dl_wire_msg_close(&m); /* a pending Ack, or something of another fragment */
    }
}

/* await_ack; after an ACCEPTED or a rebase, also take the Update of frag
 * that follows it, its payload into upd (n floats) when not NULL. 0 when an
 * Ack came. */
static int await_decision(peer *p, int frag, uint64_t base, decision *d, float *upd)
{
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    if (await_ack(p, frag, base, d, deadline)) return -1;
    if (d->decision != DLOCO__V1__DECISION__DECISION_ACCEPTED && !d->rebase) return 0;
    for (;;) {
        int left = (int)((deadline - dl_clock_ns()) / 1000000);
        dl_wire_msg m;
        if ((left > 0 ? recv_msg(p, left, &m) : DL_ETIMEDOUT) != 0) {
            dl_wire_msg_close(&m);
            return 0;
        }
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && (int)m.env->update->fragment == frag) {
            d->updated = 1;
            d->upd_version = m.env->update->version;
            if (upd) memcpy(upd, dl_wire_msg_payload(&m, 0), dl_wire_msg_payload_len(&m, 0));
            dl_wire_msg_close(&m);
            return 0;
        }
        dl_wire_msg_close(&m);
    }
}

/* Fetch one fragment: its payload into out, version into *v. 0 on success. */
static int fetch_frag(peer *p, int frag, float *out, uint64_t *v)
{
    uint32_t f = (uint32_t)frag;
    send_fetch(p, &f, 1);
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    for (;;) {
        int left = (int)((deadline - dl_clock_ns()) / 1000000);
        dl_wire_msg m;
        if ((left > 0 ? recv_msg(p, left, &m) : DL_ETIMEDOUT) != 0) {
            dl_wire_msg_close(&m);
            return -1;
        }
        if (m.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && (int)m.env->update->fragment == frag) {
            *v = m.env->update->version;
            memcpy(out, dl_wire_msg_payload(&m, 0), dl_wire_msg_payload_len(&m, 0));
            dl_wire_msg_close(&m);
            return 0;
        }
        dl_wire_msg_close(&m);
    }
}

/* Hello + Welcome, then heartbeat while the test waits. */
static int join(peer *p, syncd *sd, const char *id, uint32_t batch, const peer_opts *o)
{
    peer_open(p, sd, id, o);
    send_hello(p, NULL, batch);
    char got[600];
    int ok = expect_welcome(p, got, sizeof got);
    CHECK(ok, "%s: hello of %s -> %s", sd->name, id, got);
    if (ok) keep_add(p);
    return ok;
}

static double norm2(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

static float *normal_delta(size_t n, float scale)
{
    float *d = malloc(n * 4);
    for (size_t i = 0; i < n; i++) d[i] = scale * 0.001f * (float)((int)(i % 7) - 3 + (i % 2 ? 4 : -4));
    return d;
}

static int start_or_fail(syncd *s, const char *name, const spec *m, const char *const *extra)
{
    if (sync_start(s, name, m, extra) == 0) return 1;
    char t[600];
    CHECK(0, "%s: dloco-sync did not start: %s", name, log_tail(s, t, sizeof t));
    return 0;
}

/* ------------------------------------------------------------------------ */
/* 1. identity */

static void row_identity(void)
{
    int f0 = failures;
    syncd S;
    if (!start_or_fail(&S, "identity", &SMALL, NULL)) goto out;
    size_t n0 = dl_plan_fragment_numel(S.plan, 0);
    float *delta = normal_delta(n0, 1);
    char got[600];
    peer R = {0}, H = {0}, S2 = {0}, I1 = {0}, I2 = {0}, I3 = {0};
    if (!join(&R, &S, "real-1", 0, NULL)) goto out_sync;

    /* a connection presenting the learner's id as its routing id, idle */
    peer_opts hop = {.routing_id = "real-1"};
    peer_open(&H, &S, "real-1", &hop);
    sleep_pump(500);
    decision d;
    send_push(&R, NULL, 0, 0, 4, 64, delta);
    int rc = await_decision(&R, 0, 0, &d, NULL);
    int dead = ev_count(S.events, "learner_dead", "id=real-1", NULL);
    row("1a identity", "a DEALER with ZMQ_ROUTING_ID \"real-1\" idle for 0.5 s while real-1 (no routing id) is live; "
        "real-1 pushes -> real-1 gets %s; learner_dead id=real-1 events: %d", d.got, dead);
    CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED, "real learner's push: %s", d.got);
    CHECK(dead == 0, "real-1 declared dead %d times", dead);

    /* the same routing-id connection speaking as real-1 */
    send_push(&H, "real-1", 0, 1, 4, 64, delta);
    int ok = expect_error(&H, DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER, 0, "not registered on this connection",
                          got, sizeof got);
    row("1b identity", "that routing-id connection sends a Push as real-1 -> %s", got);
    CHECK(ok, "push from the routing-id connection: %s", got);

    /* a second plain connection claiming the live id */
    peer_open(&S2, &S, "real-1", NULL);
    send_hello(&S2, NULL, 0);
    ok = expect_error(&S2, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 0, "is live on another connection", got,
                      sizeof got);
    int dup = ev_wait(S.events, 1, 2000, "learner_duplicate", "id=real-1", "action=refused", NULL);
    row("1c identity", "a second connection sends Hello as live real-1 -> %s; event learner_duplicate "
        "id=real-1 action=refused x%d", got, dup);
    CHECK(ok, "duplicate hello: %s", got);
    CHECK(dup == 1, "learner_duplicate action=refused events: %d", dup);

    send_push(&S2, "real-1", 0, 1, 4, 64, delta);
    ok = expect_error(&S2, DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER, 0, "is not registered on this connection",
                      got, sizeof got);
    row("1d identity", "the second connection sends a Push as real-1 -> %s", got);
    CHECK(ok, "push from a foreign connection: %s", got);
    CHECK(strstr(got, "send hello") != NULL, "the refusal says to send hello: %s", got);
    send_bye(&S2, "real-1");
    ok = expect_error(&S2, DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER, 0, "is not registered on this connection",
                      got, sizeof got);
    row("1e identity", "the second connection sends a Bye as real-1 -> %s", got);
    CHECK(ok, "bye from a foreign connection: %s", got);

    send_push(&R, NULL, 0, 1, 4, 64, delta);
    rc = await_decision(&R, 0, 1, &d, NULL);
    int byes = ev_count(S.events, "learner_bye", "id=real-1", NULL);
    dead = ev_count(S.events, "learner_dead", "id=real-1", NULL);
    row("1f identity", "then real-1 pushes again -> %s; learner_bye/learner_dead id=real-1 events: %d/%d", d.got, byes,
        dead);
    CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && d.merged == 2, "real-1 after: %s", d.got);
    CHECK(byes == 0 && dead == 0, "real-1 bye %d dead %d", byes, dead);

    /* the real learner's socket closes: the id may move */
    peer_close(&R);
    int refusals = 0, welcomed = 0;
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    while (!welcomed && dl_clock_ns() < deadline) {
        send_hello(&S2, NULL, 0);
        dl_wire_msg m;
        int r = recv_msg(&S2, 2000, &m);
        describe(r, &m, 2000, got, sizeof got);
        if (r == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME) welcomed = 1;
        else if (r == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
                 strstr(m.env->error->message, "live on another connection"))
            refusals++;
        dl_wire_msg_close(&m);
        if (!welcomed) sleep_pump(50);
    }
    int took = ev_wait(S.events, 1, 2000, "learner_duplicate", "id=real-1", "action=took_over_gone", NULL);
    row("1g identity", "real-1's socket closes; the second connection repeats its Hello -> %s (after %d refusal(s)); "
        "event learner_duplicate id=real-1 action=took_over_gone x%d", got, refusals, took);
    CHECK(welcomed, "hello after the real learner left: %s", got);
    CHECK(took == 1, "took_over_gone events: %d", took);

    /* Hello.instance (docs/PROTOCOL.md "Duplicate ids"): another live
     * process is refused for good; the same process on a new connection
     * takes over at once, its old connection still attached */
    hello_instance = 0xA11CE;
    if (!join(&I1, &S, "inst-1", 0, NULL)) goto out_sync;
    peer_open(&I2, &S, "inst-1", NULL);
    hello_instance = 0xB0B;
    send_hello(&I2, NULL, 0);
    ok = expect_error(&I2, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 1, "duplicate_id: learner id 'inst-1' is held",
                      got, sizeof got);
    dup = ev_wait(S.events, 1, 2000, "learner_duplicate", "id=inst-1", "action=duplicate_id", NULL);
    row("1h identity", "a Hello as live inst-1 from another instance -> %s; learner_duplicate action=duplicate_id x%d",
        got, dup);
    CHECK(ok && dup == 1, "second live process: %s (events %d)", got, dup);
    peer_open(&I3, &S, "inst-1", NULL);
    hello_instance = 0xA11CE;
    send_hello(&I3, NULL, 0);
    ok = expect_welcome(&I3, got, sizeof got);
    int rec = ev_wait(S.events, 1, 2000, "learner_duplicate", "id=inst-1", "action=reconnected", NULL);
    row("1i identity", "a Hello as inst-1 from its own instance on a new connection (old one attached) -> %s; "
        "learner_duplicate action=reconnected x%d", got, rec);
    CHECK(ok && rec == 1, "same instance, new connection: %s (events %d)", got, rec);
    hello_instance = 0;
out_sync:
    hello_instance = 0;
    peer_close(&I1);
    peer_close(&I2);
    peer_close(&I3);
    peer_close(&H);
    peer_close(&S2);
    peer_close(&R);
    free(delta);
    CHECK(sync_alive(&S), "identity: dloco-sync still running");
    CHECK(sync_stop(&S) == 0, "identity: dloco-sync exits 0");
out:
    verdict(1, "identity/hijack", f0);
}

/* ------------------------------------------------------------------------ */
/* 2. values */

/* Three normal pushes of fragment 0 from base v0.. merged; the last global into g. */
static int three_normal(peer *p, const float *delta, uint64_t v0, float *g, const char *name)
{
    for (uint64_t v = v0; v < v0 + 3; v++) {
        decision d;
        send_push(p, NULL, 0, v, 4, 64, delta);
        int rc = await_decision(p, 0, v, &d, g);
        CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && d.updated &&
                  d.upd_version == v + 1,
              "%s: normal push from v%llu: %s", name, (unsigned long long)v, d.got);
        if (rc || d.decision != DLOCO__V1__DECISION__DECISION_ACCEPTED) return -1;
    }
    return 0;
}

static void row_values(void)
{
    int f0 = failures;
    syncd S;
    if (!start_or_fail(&S, "values", &SMALL, NULL)) goto out;
    size_t n0 = dl_plan_fragment_numel(S.plan, 0);
    float *g0 = malloc(n0 * 4), *g1 = malloc(n0 * 4), *g3 = malloc(n0 * 4), *g4 = malloc(n0 * 4);
    float *big = malloc(n0 * 4), *normal = normal_delta(n0, 1), *huge = normal_delta(n0, 1e6f);
    for (size_t i = 0; i < n0; i++) big[i] = (i % 2 ? -1e38f : 1e38f);
    double nn = norm2(normal, n0);
    peer V = {0};
    if (!join(&V, &S, "val-1", 0, NULL)) goto out_sync;
    uint64_t v = 99;
    CHECK(fetch_frag(&V, 0, g0, &v) == 0 && v == 0, "fetch v0");

    decision d;
    send_push(&V, NULL, 0, 0, 4, 64, big);
    int rc = await_decision(&V, 0, 0, &d, NULL);
    uint64_t v1 = 99;
    int fr = fetch_frag(&V, 0, g1, &v1);
    int same = fr == 0 && v1 == 0 && !memcmp(g0, g1, n0 * 4);
    row("2a values", "Push of fragment 0 with every value +-1e38 (finite, norm %.3g) -> %s; Fetch after: v%llu, "
        "payload %s", norm2(big, n0), d.got, (unsigned long long)v1, same ? "identical to before" : "CHANGED");
    CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(d.reason, "norm") && d.rebase,
          "1e38 push: %s", d.got);
    CHECK(same, "global fragment 0 unchanged by the rejected push");

    if (three_normal(&V, normal, 0, g3, "values") == 0) {
        send_push(&V, NULL, 0, 3, 4, 64, huge);
        rc = await_decision(&V, 0, 3, &d, NULL);
        fr = fetch_frag(&V, 0, g1, &v1);
        same = fr == 0 && v1 == 3 && !memcmp(g1, g3, n0 * 4);
        row("2b values", "after 3 normal pushes merged (norm %.3g each), a Push of 1e6 x a normal one (norm %.3g) -> "
            "%s; Fetch after: v%llu, %s", nn, norm2(huge, n0), d.got, (unsigned long long)v1,
            same ? "identical to v3" : "CHANGED");
        CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(d.reason, "norm"),
              "1e6x push: %s", d.got);
        CHECK(same, "global fragment 0 unchanged by the rejected 1e6x push");
    }
    peer_close(&V);
    CHECK(sync_stop(&S) == 0, "values: dloco-sync exits 0");

    /* the same with norm_action clip */
    static const char *const clip[] = {"--norm_action", "clip", NULL};
    if (!start_or_fail(&S, "values-clip", &SMALL, clip)) goto out_free;
    if (!join(&V, &S, "val-1", 0, NULL)) goto out_sync;
    if (three_normal(&V, normal, 0, g3, "clip") == 0) {
        send_push(&V, NULL, 0, 3, 4, 64, huge);
        rc = await_decision(&V, 0, 3, &d, g4);
        int clipped = ev_wait(S.events, 1, 2000, "push_clipped", "id=val-1", "frag=0", NULL);
        char scale[64] = "";
        ev_get(S.events, "push_clipped", -1, "scale", scale, sizeof scale, "id=val-1", NULL);
        int finite = 1;
        double amax = 0;
        for (size_t i = 0; i < n0; i++) {
            finite &= isfinite(g4[i]);
            amax = fmax(amax, fabs(g4[i]));
        }
        float *diff = malloc(n0 * 4);
        for (size_t i = 0; i < n0; i++) diff[i] = g4[i] - g3[i];
        double change = norm2(diff, n0);
        free(diff);
        row("2c values", "--norm_action clip: the same 1e6x Push after 3 normal merges -> %s; event push_clipped "
            "scale=%s x%d; merged v%llu: finite %d, max |x| %.3g, |v4 - v3| %.3g (%.1f x a normal push's norm)",
            d.got, scale, clipped, (unsigned long long)d.upd_version, finite, amax, change, change / nn);
        CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && d.updated && d.upd_version == 4,
              "clipped push merged: %s", d.got);
        CHECK(clipped == 1, "push_clipped events: %d", clipped);
        /* clipped to 10 x the median norm; outer Nesterov (lr 0.7, momentum 0.9) moves by < 30 x that norm,
         * where the unclipped push would move the fragment by ~1.3e6 x */
        CHECK(finite && change < 30 * nn, "merged global after the clip: finite %d, change %.3g (normal %.3g)",
              finite, change, nn);
    }
    peer_close(&V);
    CHECK(sync_stop(&S) == 0, "values: dloco-sync exits 0");

    /* every value guard off but the last one: a merge whose result leaves
     * param_abs_max is not committed */
    static const char *const poison[] = {"--norm_k", "0", "--norm_param_ratio", "0", "--param_abs_max", "1", NULL};
    if (!start_or_fail(&S, "values-poison", &SMALL, poison)) goto out_free;
    if (!join(&V, &S, "val-1", 0, NULL)) goto out_sync;
    {
        float *boom = normal_delta(n0, 1e4f);
        uint64_t vb = 99;
        CHECK(fetch_frag(&V, 0, g0, &vb) == 0 && vb == 0, "poison: fetch v0");
        send_push(&V, NULL, 0, 0, 4, 64, boom);
        rc = await_decision(&V, 0, 0, &d, NULL);
        int failed = ev_wait(S.events, 1, 3000, "merge_failed", "frag=0", NULL);
        char reason[300] = "";
        ev_get(S.events, "merge_failed", -1, "reason", reason, sizeof reason, "frag=0", NULL);
        fr = fetch_frag(&V, 0, g1, &v1);
        same = fr == 0 && v1 == 0 && !memcmp(g0, g1, n0 * 4);
        row("2d values", "guards off but param_abs_max 1: a Push (norm %.3g) whose merge leaves the bound -> %s; event "
            "merge_failed x%d reason=%s; Fetch after: v%llu, %s", norm2(boom, n0), d.got, failed, reason,
            (unsigned long long)v1, same ? "identical to v0" : "CHANGED");
        CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_REJECTED, "poisoned merge: %s", d.got);
        CHECK(failed == 1 && strstr(reason, "param_abs_max"), "merge_failed naming the bound: %s", reason);
        CHECK(same, "the poisoned version was not committed");
        free(boom);
    }
out_sync:
    peer_close(&V);
    CHECK(sync_stop(&S) == 0, "values: dloco-sync exits 0");
out_free:
    free(g0);
    free(g1);
    free(g3);
    free(g4);
    free(big);
    free(normal);
    free(huge);
out:
    verdict(2, "values", f0);
}

/* ------------------------------------------------------------------------ */
/* 3. counters */

static void row_counters(void)
{
    int f0 = failures;
    syncd S;
    char got[600];
    static const char *const extra[] = {"--max_batch", "64", NULL};
    if (!start_or_fail(&S, "counters", &SMALL, extra)) goto out;
    size_t n0 = dl_plan_fragment_numel(S.plan, 0), n1 = dl_plan_fragment_numel(S.plan, 1);
    float *d0 = normal_delta(n0, 1), *d1 = normal_delta(n1, 1);
    peer L = {0}, Hn = {0}, B = {0};
    if (!join(&L, &S, "liar-1", 4, NULL) || !join(&Hn, &S, "honest-1", 4, NULL)) goto out_sync;
    decision d;
    send_push(&L, NULL, 0, 0, 4, 1ull << 62, d0);
    int rc = await_decision(&L, 0, 0, &d, NULL);
    row("3a counters", "liar-1 (Hello batch 4, seq_len 8) pushes steps 4, tokens 2^62 -> %s", d.got);
    CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(d.reason, "tokens") && d.rebase,
          "tokens claim: %s", d.got);
    send_push(&L, NULL, 0, 0, 1ull << 40, 1ull << 40, d0);
    rc = await_decision(&L, 0, 0, &d, NULL);
    row("3b counters", "liar-1 pushes steps 2^40, tokens 2^40 (just after it got v0) -> %s", d.got);
    CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(d.reason, "steps") && d.rebase,
          "steps claim: %s", d.got);

    peer_open(&B, &S, "batch-1", NULL);
    send_hello(&B, NULL, 65);
    int ok = expect_error(&B, DLOCO__V1__ERROR_KIND__ERROR_KIND_INVALID, 1, "65", got, sizeof got);
    row("3c counters", "Hello with batch 65 (--max_batch 64) -> %s", got);
    CHECK(ok, "batch above max_batch: %s", got);
    CHECK(ev_count(S.events, "learner_join", "id=batch-1", NULL) == 0, "batch-1 not registered");
    peer_close(&B);

    /* honest pushes while the liar stays live: the fleet's tokens are the honest ones only */
    int merges_ok = 1;
    struct {
        int frag;
        uint64_t base;
        const float *d;
    } seq[] = {{0, 0, d0}, {1, 0, d1}, {0, 1, d0}};
    for (int i = 0; i < 3; i++) {
        send_push(&Hn, NULL, seq[i].frag, seq[i].base, 4, 128, seq[i].d);
        rc = await_decision(&Hn, seq[i].frag, seq[i].base, &d, NULL);
        merges_ok &= rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED;
        CHECK(rc == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED, "honest push %d: %s", i, d.got);
    }
    int nm = ev_wait(S.events, 3, 2000, "merge", NULL);
    char shares[200] = "";
    size_t o = 0;
    double minshare = 1e9;
    for (int i = 0; i < nm && o < sizeof shares - 16; i++) {
        char sh[64] = "", fr[16] = "";
        ev_get(S.events, "merge", i, "share", sh, sizeof sh, NULL);
        ev_get(S.events, "merge", i, "frag", fr, sizeof fr, NULL);
        o += (size_t)snprintf(shares + o, sizeof shares - o, "%sfrag %s %s", i ? ", " : "", fr, sh);
        minshare = fmin(minshare, atof(sh));
    }
    int live_liar = ev_count(S.events, "learner_dead", "id=liar-1", NULL) == 0;
    row("3d counters", "then honest-1 (batch 4) pushes tokens 128 x3 while liar-1 stays live -> %d merges, share [%s]",
        nm, shares);
    CHECK(merges_ok && nm == 3, "honest merges: %d", nm);
    /* the live liar is expected at the fleet's rate (it has no pooled push: the
     * others' mean tokens per step), so a full period is 2 learners and each
     * honest round is half of it; its refused 2^62 tokens count for nothing
     * (they would push the share to ~0) */
    CHECK(minshare > 0.49 && minshare <= 1.0, "merge shares about 0.5 or more: %s", shares);
    CHECK(live_liar, "liar-1 stayed live through the merges");

    send_heartbeat(&L, 1ull << 50, 1ull << 52);
    int ign = ev_wait(S.events, 1, 2000, "heartbeat_ignored", "id=liar-1", NULL);
    char plaus[64] = "";
    ev_get(S.events, "heartbeat_ignored", -1, "plausible", plaus, sizeof plaus, "id=liar-1", NULL);
    row("3e counters", "liar-1 sends a Heartbeat claiming step 2^50 -> ignored: event heartbeat_ignored x%d "
        "(plausible step %s)", ign, plaus);
    CHECK(ign == 1, "implausible heartbeat ignored: %d", ign);
out_sync:
    peer_close(&L);
    peer_close(&Hn);
    CHECK(sync_stop(&S) == 0, "counters: dloco-sync exits 0");
    free(d0);
    free(d1);
out:
    verdict(3, "counters", f0);
}

/* ------------------------------------------------------------------------ */
/* 4. replay */

static void row_replay(void)
{
    int f0 = failures;
    syncd S;
    if (!start_or_fail(&S, "replay", &SMALL, NULL)) goto out;
    size_t n0 = dl_plan_fragment_numel(S.plan, 0);
    float *d0 = normal_delta(n0, 1);
    peer R = {0};
    if (!join(&R, &S, "rep-1", 0, NULL)) goto out_sync;
    decision a, b, c;
    send_push(&R, NULL, 0, 0, 4, 64, d0);
    int ra = await_decision(&R, 0, 0, &a, NULL);
    send_push(&R, NULL, 0, 0, 4, 64, d0);
    int rb = await_decision(&R, 0, 0, &b, NULL);
    send_push(&R, NULL, 0, 1, 4, 64, d0);
    int rcc = await_decision(&R, 0, 1, &c, NULL);
    int nm = ev_wait(S.events, 2, 2000, "merge", "frag=0", NULL);
    char v0[16] = "", v1[16] = "", n0s[16] = "", n1s[16] = "";
    ev_get(S.events, "merge", 0, "version", v0, sizeof v0, "frag=0", NULL);
    ev_get(S.events, "merge", 1, "version", v1, sizeof v1, "frag=0", NULL);
    ev_get(S.events, "merge", 0, "n", n0s, sizeof n0s, "frag=0", NULL);
    ev_get(S.events, "merge", 1, "n", n1s, sizeof n1s, "frag=0", NULL);
    int rej = ev_count(S.events, "push", "id=rep-1", "decision=rejected", NULL);
    row("4a replay", "Push frag 0 base 0 -> %s; the identical Push re-sent -> %s; then a Push from base 1 -> %s", a.got,
        b.got, c.got);
    CHECK(ra == 0 && a.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && a.merged == 1, "first: %s", a.got);
    CHECK(rb == 0 && b.decision == DLOCO__V1__DECISION__DECISION_REJECTED && b.rebase &&
              strstr(b.reason, "already merged"),
          "replay: %s", b.got);
    CHECK(rcc == 0 && c.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && c.merged == 2, "next: %s", c.got);
    peer_close(&R);
    CHECK(sync_stop(&S) == 0, "replay: dloco-sync exits 0");
    char merges[32] = "", contribs[32] = "", applied[32] = "", rejected[32] = "";
    ev_get(S.events, "sync_summary", -1, "merges", merges, sizeof merges, NULL);
    ev_get(S.events, "sync_summary", -1, "contributions", contribs, sizeof contribs, NULL);
    ev_get(S.events, "ledger", -1, "applied", applied, sizeof applied, NULL);
    ev_get(S.events, "ledger", -1, "rejected", rejected, sizeof rejected, NULL);
    nm = ev_count(S.events, "merge", "frag=0", NULL);
    row("4b replay", "events: merge frag=0 x%d (versions %s n=%s, %s n=%s), push decision=rejected x%d; at exit "
        "sync_summary merges=%s contributions=%s, ledger applied=%s rejected=%s (fragment-tokens)", nm, v0, n0s, v1,
        n1s, rej, merges, contribs, applied, rejected);
    CHECK(nm == 2 && !strcmp(v0, "1") && !strcmp(v1, "2") && !strcmp(n0s, "1") && !strcmp(n1s, "1"),
          "merge events of fragment 0");
    CHECK(rej == 1, "one rejected push event: %d", rej);
    CHECK(!strcmp(merges, "2") && !strcmp(contribs, "2") && !strcmp(applied, "128"),
          "summary merges %s contributions %s ledger applied %s", merges, contribs, applied);

    /* 4c: the same push twice back to back: the copy arrives while the first is pooled or being merged */
    syncd D;
    peer Q = {0};
    if (!start_or_fail(&D, "duplicate", &SMALL, NULL)) goto out_free;
    if (!join(&Q, &D, "dup-1", 0, NULL)) {
        sync_stop(&D);
        goto out_free;
    }
    send_push(&Q, NULL, 0, 0, 4, 64, d0);
    send_push(&Q, NULL, 0, 0, 4, 64, d0);
    int accepted = 0, dup = 0, other = 0;
    char gots[2][600] = {"", ""};
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    while (accepted + dup + other < 2 && dl_clock_ns() < deadline) {
        dl_wire_msg m;
        int left = (int)((deadline - dl_clock_ns()) / 1000000);
        if (recv_msg(&Q, left > 0 ? left : 1, &m) != 0) {
            dl_wire_msg_close(&m);
            break;
        }
        const Dloco__V1__Envelope *e = m.env;
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_ACK &&
            e->ack->decision != DLOCO__V1__DECISION__DECISION_MERGED_PENDING) {
            int k = accepted + dup + other;
            describe(0, &m, 0, gots[k], sizeof gots[k]);
            if (e->ack->decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && e->ack->merged_version == 1) accepted++;
            else if (e->ack->decision == DLOCO__V1__DECISION__DECISION_REJECTED && e->ack->busy && !e->ack->rebase &&
                     strstr(e->ack->reason, "duplicate"))
                dup++;
            else other++;
        }
        dl_wire_msg_close(&m);
    }
    peer_close(&Q);
    CHECK(sync_stop(&D) == 0, "duplicate: dloco-sync exits 0");
    int dm = ev_count(D.events, "merge", "frag=0", NULL);
    char dmerges[32] = "", dapplied[32] = "";
    ev_get(D.events, "sync_summary", -1, "merges", dmerges, sizeof dmerges, NULL);
    ev_get(D.events, "ledger", -1, "applied", dapplied, sizeof dapplied, NULL);
    row("4c replay", "the same Push frag 0 base 0 sent twice back to back -> %s; %s; events: merge frag=0 x%d; at exit "
        "sync_summary merges=%s, ledger applied=%s (fragment-tokens)", gots[0], gots[1], dm, dmerges, dapplied);
    CHECK(accepted == 1 && dup == 1 && other == 0, "one accepted (%d), one refused as a duplicate (%d), other %d",
          accepted, dup, other);
    CHECK(dm == 1 && !strcmp(dmerges, "1") && !strcmp(dapplied, "64"), "merged once: merges %d/%s, applied %s", dm,
          dmerges, dapplied);
out_free:
    free(d0);
    goto out;
out_sync:
    peer_close(&R);
    sync_stop(&S);
out:
    verdict(4, "replay", f0);
}

/* ------------------------------------------------------------------------ */
/* 5. registry */

static void registry_flood(syncd *S, int max_learners)
{
    char got[600];
    peer F;
    peer_open(&F, S, "fake-00", NULL);
    enum { N = 60 };
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "fake-%02d", i);
        send_hello(&F, id, 0);
    }
    int welcome = 0, full = 0, busy = 0, other = 0;
    char other_got[600] = "";
    int64_t deadline = dl_clock_ns() + 10000000000LL;
    while (welcome + full + busy + other < N && dl_clock_ns() < deadline) {
        dl_wire_msg m;
        int rc = recv_msg(&F, 2000, &m);
        if (rc == DL_ETIMEDOUT) break;
        if (rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME) welcome++;
        else if (rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
                 dl_wire_error_kind(m.env->error) == DLOCO__V1__ERROR_KIND__ERROR_KIND_FULL && !m.env->error->fatal)
            full++;
        else if (rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
                 dl_wire_error_kind(m.env->error) == DLOCO__V1__ERROR_KIND__ERROR_KIND_BUSY && !m.env->error->fatal)
            busy++;
        else {
            other++;
            describe(rc, &m, 2000, other_got, sizeof other_got);
        }
        dl_wire_msg_close(&m);
    }
    /* the synchronizer writes each refusal's event after sending it: wait for as many as came back */
    int ev_full = ev_wait(S->events, full, 5000, "hello_full", NULL);
    int ev_busy = ev_wait(S->events, busy, 5000, "hello_limited", NULL);
    row("5a registry", "60 Hellos with made-up ids from one connection, as fast as it can (max_learners %d, burst 48, "
        "2/s) -> %d Welcome, %d Error FULL non-fatal, %d Error BUSY non-fatal, %d other%s%s; events hello_full x%d, "
        "hello_limited x%d", max_learners, welcome, full, busy, other, other ? ": " : "", other_got, ev_full, ev_busy);
    CHECK(welcome == 32 && full >= 1 && busy >= 1 && welcome + full + busy == N && other == 0,
          "welcome %d full %d busy %d other %d", welcome, full, busy, other);
    CHECK(ev_full == full && ev_busy == busy, "events full %d busy %d", ev_full, ev_busy);

    /* the fakes say nothing more: dead after 600 ms; a slot is reclaimed
     * (reclaim_ms 500 after the death) only when a new learner needs one */
    int dead = ev_wait(S->events, welcome, 10000, "learner_dead", "id~fake-", NULL);
    int recl0 = ev_count(S->events, "learner_reclaimed", NULL);
    sleep_pump(800);
    peer G;
    peer_open(&G, S, "genuine-1", NULL);
    int ok = 0;
    for (int attempt = 0; attempt < 5 && !ok; attempt++) { /* the new-Hello bucket refills at 2/s */
        send_hello(&G, NULL, 0);
        ok = expect_welcome(&G, got, sizeof got);
        if (!ok) sleep_pump(600);
    }
    int recl = ev_count(S->events, "learner_reclaimed", NULL);
    row("5b registry", "the fakes stay silent -> learner_dead x%d, learner_reclaimed x%d while no one needs a slot; "
        "then a new id genuine-1 says Hello -> %s, learner_reclaimed x%d", dead, recl0, got, recl);
    CHECK(dead == welcome && recl0 == 0 && recl == 1, "dead %d reclaimed %d then %d of %d", dead, recl0, recl,
          welcome);
    CHECK(ok, "genuine learner after the flood: %s", got);
    /* the fake whose slot went comes back claiming it holds the model: it must fetch */
    char rid[64] = "";
    ev_get(S->events, "learner_reclaimed", -1, "id", rid, sizeof rid, NULL);
    peer R;
    peer_open(&R, S, rid[0] ? rid : "fake-00", NULL);
    {
        Dloco__V1__Envelope env;
        Dloco__V1__Hello h;
        dloco__v1__hello__init(&h);
        const dl_model_config *m = &S->model;
        uint64_t held[8] = {0};
        h.fingerprint = S->fp;
        h.n_layer = (uint32_t)m->n_layer, h.n_head = (uint32_t)m->n_head, h.n_embd = (uint32_t)m->n_embd;
        h.seq_len = (uint32_t)m->seq_len, h.vocab = (uint32_t)m->vocab;
        h.num_fragments = (uint32_t)S->P;
        h.n_held_versions = (size_t)S->P;
        h.held_versions = held;
        h.device = "test";
        dl_wire_env_init(&env, RUN, 0, R.id);
        dl_wire_set_hello(&env, &h);
        CHECK(send_env(&R, &env, NULL, 0, 0) == 0, "send hello with held versions");
    }
    dl_wire_msg wm;
    int must_fetch = -1;
    for (int attempt = 0; attempt < 5 && must_fetch < 0; attempt++) {
        if (recv_msg(&R, 2000, &wm) == 0 && wm.env->body_case == DLOCO__V1__ENVELOPE__BODY_WELCOME)
            must_fetch = wm.env->welcome->must_fetch;
        dl_wire_msg_close(&wm);
    }
    row("5c registry", "%s, whose slot was reclaimed, comes back with held versions (all current) -> Welcome "
        "must_fetch %d", R.id, must_fetch);
    CHECK(must_fetch == 1, "a learner back after its slot was reclaimed must fetch: %d", must_fetch);
    peer_close(&R);
    peer_close(&G);
    peer_close(&F);
}

static void row_registry(void)
{
    int f0 = failures;
    syncd S;
    static const char *const extra[] = {"--max_learners", "32", "--new_hello_burst", "48", "--max_new_hellos_per_s",
                                        "2", "--reclaim_ms", "500", NULL};
    if (start_or_fail(&S, "registry", &SMALL, extra)) {
        registry_flood(&S, 32);
        CHECK(sync_stop(&S) == 0, "registry: dloco-sync exits 0");
    }
    verdict(5, "registry", f0);
}

/* ------------------------------------------------------------------------ */
/* 6. memory */

static void row_memory(void)
{
    int f0 = failures;
    char got[600];
    syncd S;
    if (!start_or_fail(&S, "memory", &SMALL, NULL)) goto big;
    uint64_t want = (uint64_t)dl_plan_max_fragment_numel(S.plan) * 4 + DL_WIRE_MAX_HEADER_BYTES;
    row("6a memory", "sync_start max_msg_bytes=%llu (largest fragment %zu floats x 4 + %u)",
        (unsigned long long)S.proc.max_msg_bytes, dl_plan_max_fragment_numel(S.plan), DL_WIRE_MAX_HEADER_BYTES);
    CHECK(S.proc.max_msg_bytes == want, "max_msg_bytes %llu, want %llu", (unsigned long long)S.proc.max_msg_bytes,
          (unsigned long long)want);
    {
        peer X, G;
        peer_open(&X, &S, "big-frame", NULL);
        size_t n = (size_t)S.proc.max_msg_bytes + (1u << 20);
        char *b = calloc(1, n);
        CHECK(zmq_send(X.s, b, n, 0) == (int)n, "send big frame");
        free(b);
        int nothing = expect_nothing(&X, 1000, got, sizeof got);
        int alive = sync_alive(&S);
        peer_open(&G, &S, "after-big", NULL);
        send_hello(&G, NULL, 0);
        char got2[600];
        int ok = expect_welcome(&G, got2, sizeof got2);
        row("6b memory", "one frame of max_msg_bytes + 1 MiB (%zu bytes) -> %s; dloco-sync running %d; Hello on a "
            "new connection -> %s", n, got, alive, got2);
        CHECK(nothing, "oversize frame answered: %s", got);
        CHECK(alive && ok, "after the oversize frame: alive %d, %s", alive, got2);
        peer_close(&X);
        peer_close(&G);
    }
    CHECK(sync_stop(&S) == 0, "memory: dloco-sync exits 0");

big:;
    /* outbound: non-readers cannot hold the queue */
    static const char *const extra[] = {"--max_outbound_mb", "2", "--slow_reader_ms", "1000", NULL};
    if (!start_or_fail(&S, "outbound", &BIG, extra)) goto out;
    enum { NS = 8 };
    uint64_t frag_bytes = (uint64_t)dl_plan_max_fragment_numel(S.plan) * 4;
    peer slow[NS];
    int joined = 0;
    peer_opts so = {.rcvhwm = 1, .rcvbuf = 4096};
    for (int i = 0; i < NS; i++) {
        char id[32];
        snprintf(id, sizeof id, "slow-%d", i);
        joined += join(&slow[i], &S, id, 0, &so);
        send_fetch(&slow[i], NULL, 0);
    }
    int first = ev_wait(S.events, 1, 5000, "learner_dropped", "id~slow-", "reason=not_reading", NULL);
    CHECK(first >= 1, "no not_reading drop within 5 s");

    /* a learner that reads joins while non-readers still hold the queue */
    peer G;
    int got_all = 0, drops_before = 0, drops_served = -1;
    char what[600] = "";
    if (join(&G, &S, "reader-1", 0, NULL)) {
        drops_before = ev_count(S.events, "learner_dropped", "reason=not_reading", NULL);
        send_fetch(&G, NULL, 0);
        int seen[MAX_P] = {0};
        int64_t deadline = dl_clock_ns() + 30000000000LL;
        while (got_all < S.P && dl_clock_ns() < deadline) {
            dl_wire_msg m;
            int rc = recv_msg(&G, (int)((deadline - dl_clock_ns()) / 1000000) + 1, &m);
            describe(rc, &m, 30000, what, sizeof what);
            if (rc == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE &&
                m.env->update->fragment < (uint32_t)S.P && !seen[m.env->update->fragment]) {
                seen[m.env->update->fragment] = 1;
                got_all++;
            }
            dl_wire_msg_close(&m);
            if (rc == DL_ETIMEDOUT) break;
        }
        if (got_all == S.P) drops_served = ev_count(S.events, "learner_dropped", "reason=not_reading", NULL);
    }
    int dropped = ev_wait(S.events, NS, 30000, "learner_dropped", "id~slow-", "reason=not_reading", NULL);
    int reader_dropped = ev_count(S.events, "learner_dropped", "id=reader-1", NULL);
    uint64_t maxq = 0;
    for (int i = 0; i < dropped; i++) {
        char q[32] = "";
        ev_get(S.events, "learner_dropped", i, "queued_bytes", q, sizeof q, "id~slow-", NULL);
        uint64_t v = strtoull(q, NULL, 10);
        if (v > maxq) maxq = v;
    }
    row("6c memory", "--max_outbound_mb 2 --slow_reader_ms 1000, %d fragments of up to %zu bytes: %d connections "
        "(RCVHWM 1, RCVBUF 4096) each Hello + Fetch all, then heartbeat and never read -> learner_dropped "
        "reason=not_reading for %d of them (largest queued_bytes %llu)", S.P, (size_t)frag_bytes, joined, dropped,
        (unsigned long long)maxq);
    CHECK(joined == NS, "slow readers joined: %d", joined);
    CHECK(dropped == NS, "not_reading drops: %d of %d", dropped, NS);
    row("6d memory", "reader-1 joins after %d of them were dropped, Fetch all, reads -> %d of %d Updates%s%s%s; "
        "it was served once %d of the %d non-readers had been dropped; reader-1 dropped: %d", drops_before, got_all,
        S.P, got_all < S.P ? " within 30 s; last: " : "", got_all < S.P ? what : "", "", drops_served, NS,
        reader_dropped);
    CHECK(got_all == S.P, "the reading learner got %d of %d fragments", got_all, S.P);
    CHECK(reader_dropped == 0, "the reading learner was dropped");
    peer_close(&G);
    for (int i = 0; i < NS; i++) peer_close(&slow[i]);
    CHECK(sync_alive(&S), "outbound: dloco-sync still running");
    CHECK(sync_stop(&S) == 0, "outbound: dloco-sync exits 0");
    char peak[32] = "", omax[32] = "", readers[32] = "", deferred[32] = "";
    ev_get(S.events, "sync_summary", -1, "outbound_peak_bytes", peak, sizeof peak, NULL);
    ev_get(S.events, "sync_summary", -1, "outbound_max_bytes", omax, sizeof omax, NULL);
    ev_get(S.events, "sync_summary", -1, "dropped_readers", readers, sizeof readers, NULL);
    ev_get(S.events, "sync_summary", -1, "deferred_updates", deferred, sizeof deferred, NULL);
    row("6e memory", "sync_summary at exit: outbound_peak_bytes=%s outbound_max_bytes=%s dropped_readers=%s "
        "deferred_updates=%s", peak, omax, readers, deferred);
    /* the bound: max_outbound_bytes plus one fragment of overdraft for a learner that reads */
    uint64_t bound = strtoull(omax, NULL, 10) + frag_bytes;
    CHECK(peak[0] && strtoull(peak, NULL, 10) <= bound, "peak %s within the bound %llu", peak,
          (unsigned long long)bound);
out:
    verdict(6, "memory", f0);
}

/* ------------------------------------------------------------------------ */
/* 7. logs */

/* Lines of a file that start with `prefix`. */
static int lines_starting(const char *path, const char *prefix)
{
    char *b = slurp(path, NULL);
    if (!b) return 0;
    int n = 0;
    size_t pl = strlen(prefix);
    for (char *line = b; *line;) {
        if (!strncmp(line, prefix, pl)) n++;
        char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    free(b);
    return n;
}

static void row_logs(void)
{
    int f0 = failures;
    syncd S;
    char got[600], got2[600], got3[600];
    if (!start_or_fail(&S, "logs", &SMALL, NULL)) goto out;
    static const char evil[] = "evil\nFAKE-LINE level=error";
    peer_opts eo = {.routing_id = evil};
    peer E;
    peer_open(&E, &S, "evil-1", &eo);
    CHECK(zmq_send(E.s, "garbage\n\nFAKE-LINE x", 20, 0) == 20, "send garbage");
    int ok1 = expect_error(&E, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 0, "undecodable", got, sizeof got);

    /* Hellos that dl_wire_send would refuse: packed by hand */
    Dloco__V1__Envelope env;
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    h.fingerprint = S.fp;
    h.n_layer = (uint32_t)S.model.n_layer;
    h.n_head = (uint32_t)S.model.n_head;
    h.n_embd = (uint32_t)S.model.n_embd;
    h.seq_len = (uint32_t)S.model.seq_len;
    h.vocab = (uint32_t)S.model.vocab;
    h.num_fragments = (uint32_t)S.P;
    h.device = "test";
    dl_wire_env_init(&env, RUN, 0, "x\nFAKE-LINE level=error id=x");
    dl_wire_set_hello(&env, &h);
    send_raw_env(&E, &env);
    int ok2 = expect_error(&E, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 0, "", got2, sizeof got2);
    h.device = "cpu\nFAKE-LINE level=error device";
    dl_wire_env_init(&env, RUN, 0, "evil-1");
    dl_wire_set_hello(&env, &h);
    send_raw_env(&E, &env);
    int ok3 = expect_error(&E, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 0, "", got3, sizeof got3);
    /* a peer of protocol version 1 (XXH64 checksums): refused, both versions named */
    h.device = "cpu";
    dl_wire_env_init(&env, RUN, 0, "old-1");
    env.protocol_version = 1;
    dl_wire_set_hello(&env, &h);
    send_raw_env(&E, &env);
    char got5[600];
    int ok5 = expect_error(&E, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 0,
                           "protocol_version 1 not supported (this build speaks 3)", got5, sizeof got5);
    /* and a valid Hello from that connection, so its join is logged too */
    send_hello(&E, NULL, 0);
    char got4[600];
    int ok4 = expect_welcome(&E, got4, sizeof got4);
    peer_close(&E);
    CHECK(sync_stop(&S) == 0, "logs: dloco-sync exits 0");
    int fake_log = lines_starting(S.log, "FAKE-LINE"), fake_ev = lines_starting(S.events, "FAKE-LINE");
    char *logtext = slurp(S.log, NULL);
    int hex = logtext && strstr(logtext, "6576696c0a46414b45") != NULL; /* "evil\nFAKE" as hex */
    free(logtext);
    row("7 logs", "a connection with routing id \"evil\\nFAKE-LINE level=error\" sends an undecodable frame -> %s; "
        "a Hello with learner_id \"x\\nFAKE-LINE level=error id=x\" -> %s; a Hello with device "
        "\"cpu\\nFAKE-LINE ...\" -> %s; a valid Hello -> %s; log lines starting FAKE-LINE: %d (events file: %d); "
        "routing id logged as hex: %s", got, got2, got3, got4, fake_log, fake_ev, hex ? "yes" : "no");
    CHECK(ok1, "garbage from the evil routing id: %s", got);
    CHECK(ok2, "bad learner id: %s", got2);
    CHECK(ok3, "control byte in device: %s", got3);
    CHECK(ok4, "valid hello from the evil routing id: %s", got4);
    row("7b version", "a Hello of protocol version 1 (the XXH64 checksums) -> %s", got5);
    CHECK(ok5, "an old peer is refused naming both versions: %s", got5);
    CHECK(fake_log == 0 && fake_ev == 0, "forged lines: log %d events %d", fake_log, fake_ev);
out:
    verdict(7, "logs", f0);
}

/* ------------------------------------------------------------------------ */
/* 8. CURVE */

static int write_allowlist(const char *path, const char *text)
{
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    chmod(tmp, 0644);
    return rename(tmp, path);
}

static void row_curve(void)
{
    int f0 = failures;
    char cdir[300], pre[340], keyfile[360], allow[360], text[400];
    snprintf(cdir, sizeof cdir, "%s/keys", root);
    mkdir(cdir, 0700);
    dl_auth_keypair srv, k0, k1, kx;
    snprintf(pre, sizeof pre, "%s/server", cdir);
    int kg = dl_auth_keygen(pre, &srv);
    snprintf(pre, sizeof pre, "%s/k0", cdir);
    kg |= dl_auth_keygen(pre, &k0);
    snprintf(pre, sizeof pre, "%s/k1", cdir);
    kg |= dl_auth_keygen(pre, &k1);
    snprintf(pre, sizeof pre, "%s/kx", cdir);
    kg |= dl_auth_keygen(pre, &kx);
    if (kg) {
        CHECK(0, "keygen: %s", dl_errmsg());
        verdict(8, "curve", f0);
        return;
    }
    snprintf(keyfile, sizeof keyfile, "%s/server.key", cdir);
    snprintf(allow, sizeof allow, "%s/allowlist", cdir);
    snprintf(text, sizeof text, "k0 %s\nk1 %s\n", k0.public_z85, k1.public_z85);
    CHECK(write_allowlist(allow, text) == 0, "allowlist");
    const char *extra[] = {"--auth", "curve", "--key_file", keyfile, "--allowlist", allow, NULL};
    syncd S;
    char got[600];
    if (!start_or_fail(&S, "curve", &SMALL, extra)) goto out;
    char auth[32] = "";
    ev_get(S.events, "sync_start", -1, "auth", auth, sizeof auth, NULL);
    CHECK(!strcmp(auth, "curve"), "sync_start auth=%s", auth);

    peer A = {0}, B = {0}, C = {0}, D = {0}, E = {0}, F2 = {0}, G = {0};
    peer_opts ok0 = {.key = &k0, .server_pub = srv.public_z85};
    peer_opts unk = {.key = &kx, .server_pub = srv.public_z85};
    peer_opts wrongsrv = {.key = &k0, .server_pub = kx.public_z85};
    int a = join(&A, &S, "k0", 0, &ok0);
    row("8a curve", "allowlisted key of k0, Hello as k0 -> %s", a ? "Welcome" : "no Welcome");

    peer_open(&B, &S, "kx", &unk);
    send_hello(&B, NULL, 0);
    int b = expect_nothing(&B, 1000, got, sizeof got);
    row("8b curve", "a key not in the allowlist, Hello -> %s", got);
    CHECK(b, "unknown key: %s", got);

    peer_open(&C, &S, "k0", NULL);
    send_hello(&C, NULL, 0);
    int c = expect_nothing(&C, 1000, got, sizeof got);
    row("8c curve", "no CURVE (NULL mechanism), Hello as k0 -> %s", got);
    CHECK(c, "no curve: %s", got);

    peer_open(&D, &S, "k0", &wrongsrv);
    send_hello(&D, NULL, 0);
    int dd = expect_nothing(&D, 1000, got, sizeof got);
    row("8d curve", "k0's key but a wrong server public key, Hello as k0 -> %s", got);
    CHECK(dd, "wrong server key: %s", got);
    int denied = ev_count(S.events, "auth_denied", NULL);
    row("8bcd curve", "events auth_denied x%d (rate-limited to one line a second; reason=%s)", denied,
        (ev_get(S.events, "auth_denied", 0, "reason", got, sizeof got, NULL), got));

    peer_open(&E, &S, "k1", &ok0);
    send_hello(&E, "k1", 0);
    int e = expect_error(&E, DLOCO__V1__ERROR_KIND__ERROR_KIND_UNAUTHORIZED, 1, "k0", got, sizeof got);
    int refused = ev_wait(S.events, 1, 2000, "auth_refused", "id=k1", "key_owner=k0", NULL);
    int k1join = ev_count(S.events, "learner_join", "id=k1", NULL);
    row("8e curve", "k0's key, Hello as k1 (allowlisted with another key) -> %s; event auth_refused id=k1 "
        "key_owner=k0 x%d; learner_join id=k1 x%d", got, refused, k1join);
    CHECK(e && refused == 1 && k1join == 0, "k0 as k1: %s, auth_refused %d, join %d", got, refused, k1join);

    int f = join(&F2, &S, "k0", 0, &ok0);
    keep_del(&A);
    int fa =
        a && expect_error(&A, DLOCO__V1__ERROR_KIND__ERROR_KIND_PROTOCOL, 1, "another connection", got, sizeof got);
    int repl = ev_wait(S.events, 1, 2000, "learner_duplicate", "id=k0", "action=replaced", NULL);
    row("8f curve", "a second connection with k0's key, Hello as k0 -> %s; the first connection gets %s; event "
        "learner_duplicate id=k0 action=replaced x%d", f ? "Welcome" : "no Welcome", got, repl);
    CHECK(f && fa && repl == 1, "replace: welcome %d, first got %s, events %d", f, got, repl);

    /* revoke k0 */
    snprintf(text, sizeof text, "k1 %s\n", k1.public_z85);
    CHECK(write_allowlist(allow, text) == 0, "allowlist rewrite");
    keep_del(&F2);
    kill(S.proc.pid, SIGHUP);
    int g1 = expect_error(&F2, DLOCO__V1__ERROR_KIND__ERROR_KIND_UNAUTHORIZED, 1, "revoked", got, sizeof got);
    int revoked = ev_wait(S.events, 1, 2000, "learner_revoked", "id=k0", NULL);
    int reload = ev_wait(S.events, 1, 2000, "allowlist_reload", "refused=0", NULL);
    char rk[16] = "";
    ev_get(S.events, "allowlist_reload", -1, "revoked", rk, sizeof rk, NULL);
    row("8g curve", "allowlist rewritten without k0, SIGHUP -> the live k0 connection gets %s; events "
        "learner_revoked id=k0 x%d, allowlist_reload refused=0 x%d (revoked=%s)", got, revoked, reload, rk);
    CHECK(g1 && revoked == 1 && reload == 1 && !strcmp(rk, "1"), "revoke: %s, events %d %d", got, revoked, reload);

    size_t n0 = dl_plan_fragment_numel(S.plan, 0);
    float *d0 = normal_delta(n0, 1);
    send_push(&F2, NULL, 0, 0, 4, 64, d0);
    free(d0);
    int g2 = expect_error(&F2, DLOCO__V1__ERROR_KIND__ERROR_KIND_UNAUTHORIZED, 1, "", got, sizeof got);
    int pushref = ev_wait(S.events, 1, 2000, "auth_refused", "id=k0", "body=push", NULL);
    int pushes = ev_count(S.events, "push", "id=k0", NULL);
    row("8h curve", "then k0 (revoked) sends a Push on that connection -> %s; event auth_refused id=k0 body=push "
        "x%d; push events id=k0 x%d", got, pushref, pushes);
    CHECK(g2 && pushref == 1 && pushes == 0, "push after revoke: %s, auth_refused %d, push events %d", got, pushref,
          pushes);

    peer_open(&G, &S, "k0", &ok0);
    send_hello(&G, NULL, 0);
    int g3 = expect_nothing(&G, 1000, got, sizeof got);
    row("8i curve", "a new connection with k0's (revoked) key, Hello as k0 -> %s", got);
    CHECK(g3, "revoked key on a new connection: %s", got);

    peer_close(&A);
    peer_close(&B);
    peer_close(&C);
    peer_close(&D);
    peer_close(&E);
    peer_close(&F2);
    peer_close(&G);
    CHECK(sync_alive(&S), "curve: dloco-sync still running");
    CHECK(sync_stop(&S) == 0, "curve: dloco-sync exits 0");
out:
    memset(&srv, 0, sizeof srv);
    memset(&k0, 0, sizeof k0);
    memset(&k1, 0, sizeof k1);
    memset(&kx, 0, sizeof kx);
    verdict(8, "curve", f0);
}

/* ------------------------------------------------------------------------ */
/* 9. chunked transfers and the pool bound */

/* Receive the chunked Update of frag that follows (any version), into out
 * (n floats); *v its version, *first the offset of its first chunk, *chunks
 * how many. 0 when all of it came in order. */
static int recv_chunked(peer *p, int frag, size_t n, float *out, uint64_t *v, uint64_t *first, int *chunks)
{
    int64_t deadline = dl_clock_ns() + 5000000000LL;
    uint64_t next = UINT64_MAX;
    *chunks = 0;
    for (;;) {
        int left = (int)((deadline - dl_clock_ns()) / 1000000);
        dl_wire_msg m;
        if ((left > 0 ? recv_msg(p, left, &m) : DL_ETIMEDOUT) != 0) {
            dl_wire_msg_close(&m);
            return -1;
        }
        const Dloco__V1__Envelope *e = m.env;
        if (e->body_case == DLOCO__V1__ENVELOPE__BODY_UPDATE && (int)e->update->fragment == frag) {
            const Dloco__V1__Update *u = e->update;
            if (!u->chunk_numel || (next != UINT64_MAX && (u->chunk_offset != next || u->version != *v))) {
                dl_wire_msg_close(&m);
                return -1;
            }
            if (next == UINT64_MAX) *first = u->chunk_offset, *v = u->version;
            memcpy(out + u->chunk_offset, dl_wire_msg_payload(&m, 0), u->chunk_numel * 4);
            next = u->chunk_offset + u->chunk_numel;
            (*chunks)++;
            dl_wire_msg_close(&m);
            if (next == n) return 0;
            continue;
        }
        dl_wire_msg_close(&m);
    }
}

static void row_chunks(void)
{
    int f0 = failures;
    syncd S;
    /* 4 KiB chunks: fragment 0 (3776 floats) travels in 4 */
    static const char *const extra[] = {"--chunk_kb", "4", NULL};
    hello_max_chunk = 1 << 20;
    float *d = NULL, *g = NULL, *h = NULL;
    peer C = {0};
    if (!start_or_fail(&S, "chunks", &SMALL, extra)) goto out;
    size_t n = dl_plan_fragment_numel(S.plan, 0), c = 1024;
    CHECK(n > 3 * c && n <= 4 * c, "fragment 0 has %zu floats: 4 chunks of 1024", n);
    d = normal_delta(n, 1);
    g = calloc(n, 4);
    h = calloc(n, 4);
    if (!join(&C, &S, "chunky", 0, NULL)) goto out_sync;
    decision a;
    char got[600];

    /* 9a: a gap in the chunks */
    send_push_chunk(&C, 0, 0, 4, 64, 1, 0, c, d);
    send_push_chunk(&C, 0, 0, 4, 64, 1, 2 * c, c, d);
    int ra = await_decision(&C, 0, 0, &a, NULL);
    send_push_chunk(&C, 0, 0, 4, 64, 1, 3 * c, n - 3 * c, d); /* the rest of the broken push */
    int quiet = ev_wait(S.events, 1, 2000, "push_abandoned", "id=chunky", "reason=chunk_out_of_order", NULL);
    row("9a chunks", "Push frag 0 chunk [0, +1024) then [2048, +1024) -> %s; its next chunk -> dropped unread; "
        "events: push_abandoned reason=chunk_out_of_order x%d", a.got, quiet);
    CHECK(ra == 0 && a.decision == DLOCO__V1__DECISION__DECISION_REJECTED && !a.rebase &&
              strstr(a.reason, "chunks must come in order"),
          "gap: %s", a.got);
    CHECK(quiet == 1, "push_abandoned events: %d", quiet);

    /* 9b: a chunk without its first, and a chunk of another push in the middle of one */
    send_push_chunk(&C, 0, 0, 4, 64, 2, c, c, d);
    int rb = await_decision(&C, 0, 0, &a, NULL);
    char b1[600];
    snprintf(b1, sizeof b1, "%s", a.got);
    int ok_b1 = rb == 0 && a.decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(a.reason, "without its first");
    send_push_chunk(&C, 0, 0, 4, 64, 3, 0, c, d);
    send_push_chunk(&C, 0, 0, 4, 64, 4, c, c, d);
    rb = await_decision(&C, 0, 0, &a, NULL);
    row("9b chunks", "a chunk at 1024 of a new transfer -> %s; transfer 3's first chunk, then transfer 4's second -> %s",
        b1, a.got);
    CHECK(ok_b1, "no first chunk: %s", b1);
    CHECK(rb == 0 && a.decision == DLOCO__V1__DECISION__DECISION_REJECTED && strstr(a.reason, "another push"),
          "interleaved: %s", a.got);

    /* 9c: an honest chunked push is merged; the Update comes in chunks and equals a fetch */
    for (uint64_t off = 0; off < n; off += c) send_push_chunk(&C, 0, 0, 4, 64, 5, off, n - off < c ? n - off : c, d);
    int rc9 = await_ack(&C, 0, 0, &a, dl_clock_ns() + 5000000000LL);
    uint64_t v = 0, first = 0;
    int chunks = 0;
    int ru = rc9 == 0 && a.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED ? recv_chunked(&C, 0, n, g, &v, &first, &chunks)
                                                                               : -1;
    row("9c chunks", "4 chunks of transfer 5 in order -> %s; its Update: v%llu in %d chunks from %llu", a.got,
        (unsigned long long)v, chunks, (unsigned long long)first);
    CHECK(rc9 == 0 && a.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED && a.merged == 1, "honest: %s", a.got);
    CHECK(ru == 0 && v == 1 && chunks == 4 && first == 0, "chunked update v%llu chunks %d", (unsigned long long)v,
          chunks);

    /* 9d: a Fetch resuming at element 2048 of v1 gets only the rest; one naming an old version gets all of v1 */
    send_fetch_resume(&C, 0, 1, 2 * c);
    memcpy(h, g, n * 4);
    memset(h + 2 * c, 0, (n - 2 * c) * 4);
    int rr = recv_chunked(&C, 0, n, h, &v, &first, &chunks);
    int same = rr == 0 && !memcmp(g, h, n * 4);
    int c1 = chunks;
    uint64_t first1 = first;
    send_fetch_resume(&C, 0, 0, 2 * c);
    int rr2 = recv_chunked(&C, 0, n, h, &v, &first, &chunks);
    row("9d chunks", "Fetch frag 0 resume v1 at 2048 -> %d chunks from %llu (the whole equals the Update: %s); resume "
        "v0 at 2048 -> v%llu in %d chunks from %llu", c1, (unsigned long long)first1, same ? "yes" : "no",
        (unsigned long long)v, chunks, (unsigned long long)first);
    CHECK(same && c1 == 2 && first1 == 2 * c, "resume: %d chunks from %llu", c1, (unsigned long long)first1);
    CHECK(rr2 == 0 && v == 1 && chunks == 4 && first == 0, "resume of an old version: from %llu",
          (unsigned long long)first);
    /* fragment 1 was never merged: a resume at version 0 works too (a new run's initial fetch) */
    size_t n1 = dl_plan_fragment_numel(S.plan, 1);
    float *g1 = calloc(n1, 4);
    send_fetch_resume(&C, 1, 0, c);
    int rr3 = recv_chunked(&C, 1, n1, g1, &v, &first, &chunks);
    row("9d chunks", "Fetch frag 1 (never merged) resume v0 at 1024 -> v%llu in %d chunks from %llu",
        (unsigned long long)v, chunks, (unsigned long long)first);
    CHECK(rr3 == 0 && v == 0 && first == c && chunks == (int)((n1 - c + c - 1) / c), "resume at v0: from %llu",
          (unsigned long long)first);
    free(g1);
    (void)got;
    peer_close(&C);
    CHECK(sync_stop(&S) == 0, "chunks: dloco-sync exits 0");
    char ab[32] = "";
    ev_get(S.events, "sync_summary", -1, "abandoned_pushes", ab, sizeof ab, NULL);
    CHECK(!strcmp(ab, "2"), "sync_summary abandoned_pushes=%s (the gap and the interleaved transfer)", ab);

    /* 9e: the pool bound. sync policy (a round waits for every live
     * learner), 2 MiB of pool, 1 MiB fragments: A's pushes wait for B until
     * the pool is full; then a push is refused busy, nothing of it counted */
    {
        syncd T;
        static const char *const pextra[] = {"--policy", "sync", "--pool_mb", "2", "--grace_cap_ms", "30000", NULL};
        hello_max_chunk = 0;
        if (!start_or_fail(&T, "pool", &BIG, pextra)) goto out;
        peer A = {0}, B = {0};
        int joined = join(&A, &T, "pool-a", 0, NULL) && join(&B, &T, "pool-b", 0, NULL);
        char pb[32] = "";
        ev_get(T.events, "sync_start", -1, "pool_bytes", pb, sizeof pb, NULL);
        int busy_at = -1, pooled = 0;
        decision e = {0};
        float *big = NULL;
        if (joined) {
            big = normal_delta(dl_plan_max_fragment_numel(T.plan), 1);
            for (int f = 0; f < T.P && busy_at < 0; f++) {
                send_push(&A, NULL, f, 0, 4, 64, big);
                /* a pooled push gets MERGED_PENDING first: read it here */
                dl_wire_msg m;
                if (recv_msg(&A, 5000, &m) == 0 && m.env->body_case == DLOCO__V1__ENVELOPE__BODY_ACK) {
                    if (m.env->ack->decision == DLOCO__V1__DECISION__DECISION_MERGED_PENDING) pooled++;
                    else if (m.env->ack->busy) {
                        busy_at = f;
                        e.retry_after_ms = m.env->ack->retry_after_ms;
                        describe(0, &m, 0, e.got, sizeof e.got);
                    }
                }
                dl_wire_msg_close(&m);
            }
        }
        int nbusy = ev_wait(T.events, 1, 2000, "push", "id=pool-a", "decision=busy", NULL);
        row("9e pool", "pool_bytes=%s; pushes of 1 MiB fragments from one learner while the round waits for the other: "
            "%d pooled, then frag %d -> %s (retry_after_ms %u); events: push decision=busy x%d", pb, pooled, busy_at,
            e.got, e.retry_after_ms, nbusy);
        CHECK(joined && !strcmp(pb, "2097152"), "pool bound 2 MiB: %s", pb);
        CHECK(busy_at >= 1 && pooled == busy_at && e.retry_after_ms > 0 && strstr(e.got, "pool full"),
              "busy: %s", e.got);
        CHECK(nbusy == 1, "busy events %d", nbusy);
        /* the round of fragment 0 waits for B (sync): its push is admitted past the full pool, and closes it */
        decision fb = {0};
        int rfb = -1;
        if (joined && busy_at >= 1) {
            send_push(&B, NULL, 0, 0, 4, 64, big);
            rfb = await_decision(&B, 0, 0, &fb, NULL);
        }
        row("9e pool", "with the pool full, the other learner's push of fragment 0 (its round waits for it) -> %s",
            fb.got);
        CHECK(rfb == 0 && fb.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED, "round-closing push: %s", fb.got);
        peer_close(&A);
        peer_close(&B);
        CHECK(sync_stop(&T) == 0, "pool: dloco-sync exits 0");
        char out[32] = "", lost[32] = "", rej[32] = "";
        ev_get(T.events, "ledger", -1, "outstanding", out, sizeof out, NULL);
        ev_get(T.events, "ledger", -1, "lost", lost, sizeof lost, NULL);
        ev_get(T.events, "ledger", -1, "rejected", rej, sizeof rej, NULL);
        row("9f pool", "at exit (both still connected): ledger outstanding=%s rejected=%s lost=%s fragment-tokens: A's "
            "pooled push of fragment 1 (fragment 0 merged; the busy one came back to A: its unpushed progress, counted "
            "from A's own progress reports, which this raw client does not send)", out, rej, lost);
        char peak[32] = "";
        ev_get(T.events, "sync_summary", -1, "pool_peak_bytes", peak, sizeof peak, NULL);
        row("9f pool", "pool_peak_bytes=%s (a round-closing push may go past pool_mb, never past twice it)", peak);
        CHECK(strtoull(peak, NULL, 10) <= 2 * 2097152ull && strtoull(peak, NULL, 10) > 2097152ull, "pool peak %s", peak);
        CHECK(!strcmp(out, "64") && !strcmp(rej, "0") && !strcmp(lost, "0"), "ledger outstanding %s rejected %s lost %s",
              out, rej, lost);
        free(big);
    }
    goto out;
out_sync:
    peer_close(&C);
    sync_stop(&S);
out:
    hello_max_chunk = 0;
    free(d);
    free(g);
    free(h);
    verdict(9, "chunks", f0);
}

/* ------------------------------------------------------------------------ */
/* 10. routing ids: a peer presenting the routing id libzmq gives the next
 * connection without one ("0x00 + a 32-bit counter") made libzmq 4.3 abort
 * the synchronizer (an assertion on the collision) when that connection came.
 * The counter's start came from an unseeded rand(): the same in every run,
 * so an attacker could present the next values. */

/* The routing id libzmq 4.3 gives the first connection without one to a ROUTER created after `before` other
 * router-based sockets (a ZAP handler's REP is one) in a process whose rand() was never seeded (glibc's seed
 * 1): each such socket draws its counter's start as rand2 << 31 | rand1; the id is 0x00 + it, big-endian. */
static uint32_t predicted_first_routing_id(int before)
{
    srand(1);
    uint32_t v = 0;
    for (int i = 0; i <= before; i++) {
        uint32_t lo = (uint32_t)rand(), hi = (uint32_t)rand();
        v = (hi << 31) | lo;
    }
    return v;
}

/* N connections presenting the predicted ids after the first (which the honest learner took), each made to
 * speak once so that it is attached before the test goes on; then one more connection without a routing
 * id says Hello as `victim_id`. Returns the number of attack connections attached (answered). */
static int routing_attack(syncd *S, const peer_opts *base, int n, const char *victim_id, peer *V, int *welcomed)
{
    uint32_t first = predicted_first_routing_id(base->key ? 1 : 0); /* under CURVE the ZAP handler's REP came first */
    peer *A = calloc((size_t)n, sizeof *A);
    for (int i = 0; i < n; i++) {
        char rid[5];
        uint32_t v = first + 1 + (uint32_t)i;
        rid[0] = 0, rid[1] = (char)(v >> 24), rid[2] = (char)(v >> 16), rid[3] = (char)(v >> 8), rid[4] = (char)v;
        peer_opts o = *base;
        o.routing_id = rid;
        o.routing_len = sizeof rid;
        peer_open(&A[i], S, base->key ? "k1" : "att", &o);
        send_heartbeat(&A[i], 0, 0);
    }
    int attached = 0;
    int64_t deadline = dl_clock_ns() + 60000000000LL;
    for (int i = 0; i < n && dl_clock_ns() < deadline; i++) {
        dl_wire_msg m;
        int left = (int)((deadline - dl_clock_ns()) / 1000000);
        if (recv_msg2(&A[i], left > 0 ? left : 1, &m, 1) == 0) attached++;
        dl_wire_msg_close(&m);
    }
    peer_opts vo = *base;
    peer_open(V, S, victim_id, &vo);
    send_hello(V, NULL, 0);
    char got[600];
    *welcomed = expect_welcome(V, got, sizeof got);
    for (int i = 0; i < n; i++) peer_close(&A[i]);
    free(A);
    return attached;
}

/* attack connections: the next id alone would do (the test predicts it exactly); more cover a few
 * connections without an id that might come first */
enum { NATT = 100 };

static void routing_case(const char *tag, const char *name, const char *const *extra, const peer_opts *honest,
                         const peer_opts *attacker, const char *honest_id, const char *victim_id)
{
    syncd S;
    peer R = {0}, V = {0};
    float *delta = NULL;
    if (!start_or_fail(&S, name, &SMALL, extra)) return;
    delta = normal_delta(dl_plan_fragment_numel(S.plan, 0), 1);
    if (!join(&R, &S, honest_id, 0, honest)) goto out;
    decision d;
    send_push(&R, NULL, 0, 0, 4, 64, delta);
    CHECK(await_decision(&R, 0, 0, &d, NULL) == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED,
          "%s: the honest learner's first push: %s", tag, d.got);
    int welcomed = 0;
    int attached = routing_attack(&S, attacker, NATT, victim_id, &V, &welcomed);
    int alive = sync_alive(&S);
    int merges = 0;
    for (uint64_t base = 1; alive && base <= 3; base++) {
        send_push(&R, NULL, 0, base, 4, 64, delta);
        if (await_decision(&R, 0, base, &d, NULL) == 0 && d.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED)
            merges++;
    }
    row(tag, "%d connections presenting the routing ids libzmq would give the next connections (%d answered), "
        "then one without a routing id says Hello -> %s; the synchronizer is %s; the honest learner's next 3 "
        "pushes -> %d merged", NATT, attached, welcomed ? "Welcome" : "no Welcome", alive ? "alive" : "gone", merges);
    CHECK(attached == NATT, "%s: %d of %d attack connections attached", tag, attached, NATT);
    CHECK(alive && welcomed, "%s: the synchronizer survived (%d) and welcomed the next connection (%d)", tag, alive,
          welcomed);
    CHECK(merges == 3, "%s: honest merges after the attack: %d of 3", tag, merges);
    peer_close(&V);
out:
    peer_close(&R);
    free(delta);
    sync_stop(&S);
}

static void row_routing(void)
{
    int f0 = failures;
    routing_case("10a routing", "routing_null", NULL, NULL, &(peer_opts){0}, "honest", "victim");
    if (zmq_has("curve")) {
        char cdir[300], pre[340], keyfile[360], allow[360], text[400];
        snprintf(cdir, sizeof cdir, "%s/rkeys", root);
        mkdir(cdir, 0700);
        dl_auth_keypair srv, k0, k1;
        snprintf(pre, sizeof pre, "%s/server", cdir);
        int kg = dl_auth_keygen(pre, &srv);
        snprintf(pre, sizeof pre, "%s/k0", cdir);
        kg |= dl_auth_keygen(pre, &k0);
        snprintf(pre, sizeof pre, "%s/k1", cdir);
        kg |= dl_auth_keygen(pre, &k1);
        CHECK(kg == 0, "keygen: %s", dl_errmsg());
        snprintf(keyfile, sizeof keyfile, "%s/server.key", cdir);
        snprintf(allow, sizeof allow, "%s/allowlist", cdir);
        snprintf(text, sizeof text, "k0 %s\nk1 %s\n", k0.public_z85, k1.public_z85);
        CHECK(write_allowlist(allow, text) == 0, "allowlist");
        const char *extra[] = {"--auth", "curve", "--key_file", keyfile, "--allowlist", allow, NULL};
        peer_opts honest = {.key = &k0, .server_pub = srv.public_z85};
        peer_opts attacker = {.key = &k1, .server_pub = srv.public_z85};
        if (!kg) routing_case("10b routing", "routing_curve", extra, &honest, &attacker, "k0", "k1");
    }
    verdict(10, "routing", f0);
}

/* ------------------------------------------------------------------------ */
/* 11. pool starvation: ids that start chunked pushes and never finish them */

static void row_starvation(void)
{
    int f0 = failures;
    syncd S;
    /* a 1 MiB pool, 4 KiB chunks: fragment 0 (3776 floats) travels in 4 */
    static const char *const extra[] = {"--pool_mb", "1", "--chunk_kb", "4", "--new_hello_burst", "200", NULL};
    uint32_t saved_chunk = hello_max_chunk;
    hello_max_chunk = 1 << 20;
    enum { NA = 90, C = 1024 };
    peer H = {0};
    peer *A = calloc(NA, sizeof *A);
    float *d = NULL;
    if (!start_or_fail(&S, "starvation", &SMALL, extra)) goto out;
    size_t n = dl_plan_fragment_numel(S.plan, 0);
    d = normal_delta(n, 1);
    if (!join(&H, &S, "honest", 0, NULL)) goto out_sync;
    /* one whole chunked push merged: the honest learner has proven it pushes */
    uint64_t v = 0, tr = 1;
    decision dd;
    for (uint64_t o = 0; o < n; o += C) send_push_chunk(&H, 0, v, 4, 64, tr, o, o + C <= n ? C : n - o, d);
    CHECK(await_decision(&H, 0, v, &dd, NULL) == 0 && dd.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED,
          "honest first push: %s", dd.got);
    v++, tr++;
    int joined = 0;
    for (int i = 0; i < NA; i++) {
        char id[32];
        snprintf(id, sizeof id, "starve-%02d", i);
        if (!join(&A[i], &S, id, 0, NULL)) break;
        joined++;
    }
    /* then, all at once, the first chunk of a push each, and only heartbeats (pump) after */
    for (int i = 0; i < joined; i++) send_push_chunk(&A[i], 0, v, 4, 64, 1, 0, C, d);
    int merges = 0, busy = 0;
    for (int k = 0; k < 5; k++, tr++) {
        for (uint64_t o = 0; o < n; o += C) send_push_chunk(&H, 0, v, 4, 64, tr, o, o + C <= n ? C : n - o, d);
        if (await_decision(&H, 0, v, &dd, NULL) == 0 && dd.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED) {
            merges++;
            v++;
        } else if (dd.busy) {
            busy++;
        }
    }
    int refused = ev_count(S.events, "push", "decision=busy", "reason~without a merged push", NULL);
    int stalled = ev_wait(S.events, NA - refused, 10000, "push_abandoned", "reason=stalled", NULL);
    row("11 starvation", "%d new ids each send the first 4 KiB chunk of a push and heartbeat (pool 1 MiB); the honest "
        "learner's next 5 chunked pushes -> %d merged, %d refused busy; %d of the ids' pushes refused busy (\"pool "
        "room for learners without a merged push is full\"), the others dropped as stalled: push_abandoned "
        "reason=stalled x%d",
        joined, merges, busy, refused, stalled);
    CHECK(joined == NA, "ids joined: %d", joined);
    CHECK(merges == 5, "honest merges during the attack: %d of 5", merges);
    CHECK(refused + stalled == NA, "every id's push refused busy (%d) or dropped as stalled (%d)", refused, stalled);
out_sync:
    for (int i = 0; i < NA; i++) peer_close(&A[i]);
    peer_close(&H);
    sync_stop(&S);
out:
    free(A);
    free(d);
    hello_max_chunk = saved_chunk;
    verdict(11, "starvation", f0);
}

/* ------------------------------------------------------------------------ */
/* 12. presence: ids that register and heartbeat but never push */

static void row_presence(void)
{
    int f0 = failures;
    syncd S;
    static const char *const extra[] = {"--new_hello_burst", "200", NULL};
    enum { NS = 64 };
    peer H = {0};
    peer *Q = calloc(NS, sizeof *Q);
    float *d = NULL;
    if (!start_or_fail(&S, "presence", &SMALL, extra)) goto out;
    d = normal_delta(dl_plan_fragment_numel(S.plan, 0), 1);
    if (!join(&H, &S, "honest", 0, NULL)) goto out_sync;
    int joined = 0;
    for (int i = 0; i < NS; i++) {
        char id[32];
        snprintf(id, sizeof id, "silent-%02d", i);
        joined += join(&Q[i], &S, id, 0, NULL);
    }
    /* the honest learner pushes every ~200 ms (its period); the ids heartbeat (pump) and never push */
    decision dd;
    int merged = 0;
    for (uint64_t v = 0; v < 12; v++) {
        send_push(&H, NULL, 0, v, 4, 64, d);
        merged += await_decision(&H, 0, v, &dd, NULL) == 0 && dd.decision == DLOCO__V1__DECISION__DECISION_ACCEPTED;
        sleep_pump(200);
    }
    char first[32] = "", last[32] = "", prev[32] = "";
    ev_get(S.events, "merge", 0, "share", first, sizeof first, "frag=0", NULL);
    int nm = ev_count(S.events, "merge", "frag=0", NULL);
    ev_get(S.events, "merge", nm - 2, "share", prev, sizeof prev, "frag=0", NULL);
    ev_get(S.events, "merge", -1, "share", last, sizeof last, "frag=0", NULL);
    row("12 presence", "%d ids register and heartbeat but never push; the honest learner pushes 12 times, one every "
        "~200 ms -> %d merged; merge shares: first %s, last two %s %s", joined, merged, first, prev, last);
    CHECK(joined == NS && merged == 12, "joined %d, merged %d", joined, merged);
    CHECK(atof(prev) == 1.0 && atof(last) == 1.0, "the honest merges keep share 1 once the ids were silent for "
          "3 periods: %s %s", prev, last);
out_sync:
    for (int i = 0; i < NS; i++) peer_close(&Q[i]);
    peer_close(&H);
    sync_stop(&S);
out:
    free(Q);
    free(d);
    verdict(12, "presence", f0);
}

int main(void)
{
    umask(022);
    snprintf(root, sizeof root, "/tmp/dloco_test_hostile_%d", (int)getpid());
    mkdir(root, 0755);
    ctx = zmq_ctx_new();
    int64_t t0 = dl_clock_ns();
    /* HOSTILE_ROWS=2,6 runs a subset (while working on one row) */
    void (*rows[])(void) = {row_identity, row_values, row_counters, row_replay, row_registry,
                            row_memory,   row_logs,   row_curve,    row_chunks, row_routing,
                            row_starvation, row_presence};
    const char *only = getenv("HOSTILE_ROWS");
    for (int i = 0; i < (int)(sizeof rows / sizeof *rows); i++) {
        char k[8];
        snprintf(k, sizeof k, ",%d,", i + 1);
        char list[128];
        snprintf(list, sizeof list, ",%s,", only ? only : "");
        if (!only || strstr(list, k)) rows[i]();
    }
    zmq_ctx_term(ctx);
    printf("test_hostile: %.1f s\n", (double)(dl_clock_ns() - t0) * 1e-9);
    if (!failures && !getenv("HOSTILE_KEEP")) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        if (system(cmd) != 0) printf("note: could not remove %s\n", root);
    } else {
        printf("kept %s (sync.log and events.log of every instance)\n", root);
    }
    return CHECK_DONE("test_hostile");
}
