/* The learner's comms thread: a DEALER session with the synchronizer (hello, fetch, flow-controlled
 * pushes, acks, updates, heartbeats, re-hello, bye) and the mailbox it shares with the training thread. */
#include "learner/comms.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "core/plan.h"
#include "proto/wire.h"

#define MS ((int64_t)1000000) /* ns per ms */
#define BYE_LINGER_MS 1000    /* how long close() lets a Bye leave */
#define ACK_EXPIRY_MIN_MS 5000
#define SILENCE_MIN_MS 1000
#define POLL_MAX_MS 100       /* timers are checked at least this often */
#define HELLO_UNSENT_MS 20    /* retry period of a Hello that found no connection */
#define HELLO_RETRY_MAX_MS 16000 /* cap of the Hello retry backoff */

enum { OPEN_NONE = 0, OPEN_SENT = 1, OPEN_POOLED = 2 };

typedef struct {
    dl_comms_push h;
    float *buf;
    int queued;
} push_slot;

typedef struct {
    uint64_t version;
    int forced;
    int have;
    float *buf;
} update_slot;

struct dl_comms {
    /* ---- immutable after open */
    char endpoint[256];
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    char run_id[129];
    char device[129];
    const dl_plan *plan;
    int P;
    uint64_t *numel; /* [P] floats per fragment (wire limits want uint64) */
    size_t maxn;     /* floats per swapped buffer */
    uint64_t fingerprint;
    uint32_t n_layer, n_head, n_embd, seq_len, vocab;
    int hello_retry_ms, connect_timeout_ms;
    int hello_wait_ms, hello_sent_once; /* current Hello retry period (backoff) */
    FILE *acklog;
    int efd; /* eventfd: training thread -> comms thread wake-ups */

    /* ---- guarded by mu */
    pthread_mutex_t mu;
    push_slot *push;  /* [P] */
    update_slot *upd; /* [P] */
    uint64_t *held;   /* [P] node's adopted versions */
    uint8_t *held_ok; /* [P] */
    /* Fate of the latest push of each fragment (OPEN_*). The synchronizer
     * replaces an earlier pooled push of ours with a newer one of the same
     * fragment without answering the earlier one, so only the latest push
     * is tracked. Flow control guarantees that the first immediate ack
     * (MERGED_PENDING / DROPPED_STALE / REJECTED) of p after the push was
     * sent is its own; once pooled, it is decided by an ACCEPTED or
     * REJECTED ack echoing its base_version (an earlier round's ACCEPTED
     * arrives before our MERGED_PENDING, or names an older base). */
    uint8_t *open;        /* [P] OPEN_* */
    uint64_t *open_base;  /* [P] base_version of the latest push */
    uint8_t *need_update; /* [P] an ACCEPTED ack came; its Update has not */
    uint64_t prog_step, prog_tokens;
    double prog_sps;
    int bye_req, stop_req;
    char bye_reason[128];
    uint64_t bye_step;
    dl_comms_stats st;
    char msg[640];

    /* ---- comms thread only */
    void *ctx, *sock;
    pthread_t thread;
    int started;
    dl_wire_limits lim;
    float *send_spare, *recv_spare; /* [maxn] */
    uint64_t *hv;                   /* [P] held_versions being sent */
    uint32_t *fetch_list;           /* [P] */
    uint8_t *unacked;               /* [P] a push waits for its immediate ack */
    int64_t *unacked_ns;            /* [P] when it was sent */
    uint8_t *fetch_pending;         /* [P] the next Update of p is a fetch reply */
    uint64_t seq;
    uint64_t epoch;                 /* newest epoch seen (mirror of st.epoch) */
    uint64_t hello_epoch;           /* epoch the last Hello carried */
    int state;                      /* mirror of st.state */
    int ever_welcomed;
    uint32_t hb_ms, liveness;
    int64_t t_start, t_hello, t_hb, t_recv, t_warn;
    int hello_unsent; /* the last Hello found no connection */
    int rr; /* round-robin start for fairness among fragments */
};

/* ------------------------------------------------------------------------- */
/* mailbox */

int dl_comms_id_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > DL_WIRE_LEARNER_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                 ch == '_' || ch == '-';
        if (!ok) return 0;
    }
    return 1;
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what)
{
    if (!src) src = "";
    if (strlen(src) >= cap) return dl_err(DL_EINVAL, "%s is %zu bytes, max %zu", what, strlen(src), cap - 1);
    memcpy(dst, src, strlen(src) + 1);
    return 0;
}

size_t dl_comms_buf_numel(const dl_comms *c) { return c->maxn; }

float *dl_comms_buf_alloc(const dl_comms *c) { return dl_xcalloc(c->maxn, sizeof(float)); }

int dl_comms_open(const dl_comms_opts *o, dl_comms **out)
{
    assert(o && out);
    *out = NULL;
    if (!o->plan) return dl_err(DL_EINVAL, "comms: no fragment plan");
    if (!o->endpoint || !o->endpoint[0]) return dl_err(DL_EINVAL, "comms: no synchronizer endpoint");
    if (!dl_comms_id_ok(o->learner_id))
        return dl_err(DL_EINVAL, "learner id '%s' is not [A-Za-z0-9._-]{1,64}", o->learner_id ? o->learner_id : "");
    if (!o->run_id || !o->run_id[0]) return dl_err(DL_EINVAL, "comms: empty run id");
    int P = dl_plan_P(o->plan);
    if (P < 1 || (uint32_t)P > DL_WIRE_MAX_FRAGMENTS)
        return dl_err(DL_EINVAL, "comms: %d fragments, protocol max %u", P, DL_WIRE_MAX_FRAGMENTS);

    dl_comms *c = dl_xcalloc(1, sizeof *c);
    int rc = 0;
    if ((rc = copy_str(c->endpoint, sizeof c->endpoint, o->endpoint, "endpoint")) ||
        (rc = copy_str(c->id, sizeof c->id, o->learner_id, "learner id")) ||
        (rc = copy_str(c->run_id, sizeof c->run_id, o->run_id, "run id")) ||
        (rc = copy_str(c->device, sizeof c->device, o->device ? o->device : "cpu", "device"))) {
        free(c);
        return rc;
    }
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->efd < 0) {
        rc = dl_err(DL_EIO, "eventfd: %s", strerror(errno));
        free(c);
        return rc;
    }
    if (o->log_acks && o->log_acks[0] && !(c->acklog = fopen(o->log_acks, "a"))) {
        rc = dl_err(DL_EIO, "log_acks %s: %s", o->log_acks, strerror(errno));
        close(c->efd);
        free(c);
        return rc;
    }
    c->plan = o->plan;
    c->P = P;
    c->fingerprint = o->fingerprint;
    c->n_layer = o->n_layer;
    c->n_head = o->n_head;
    c->n_embd = o->n_embd;
    c->seq_len = o->seq_len;
    c->vocab = o->vocab;
    c->hello_retry_ms = o->hello_retry_ms > 0 ? o->hello_retry_ms : 1000;
    c->connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 30000;
    c->maxn = dl_plan_max_fragment_numel(o->plan);
    c->numel = dl_xcalloc((size_t)P, sizeof *c->numel);
    for (int p = 0; p < P; p++) c->numel[p] = dl_plan_fragment_numel(o->plan, p);

    pthread_mutex_init(&c->mu, NULL);
    c->push = dl_xcalloc((size_t)P, sizeof *c->push);
    c->upd = dl_xcalloc((size_t)P, sizeof *c->upd);
    for (int p = 0; p < P; p++) {
        c->push[p].buf = dl_comms_buf_alloc(c);
        c->upd[p].buf = dl_comms_buf_alloc(c);
    }
    c->held = dl_xcalloc((size_t)P, sizeof *c->held);
    c->held_ok = dl_xcalloc((size_t)P, 1);
    c->open = dl_xcalloc((size_t)P, 1);
    c->open_base = dl_xcalloc((size_t)P, sizeof *c->open_base);
    c->need_update = dl_xcalloc((size_t)P, 1);
    c->send_spare = dl_comms_buf_alloc(c);
    c->recv_spare = dl_comms_buf_alloc(c);
    c->hv = dl_xcalloc((size_t)P, sizeof *c->hv);
    c->fetch_list = dl_xcalloc((size_t)P, sizeof *c->fetch_list);
    c->unacked = dl_xcalloc((size_t)P, 1);
    c->unacked_ns = dl_xcalloc((size_t)P, sizeof *c->unacked_ns);
    c->fetch_pending = dl_xcalloc((size_t)P, 1);
    c->state = c->st.state = DL_COMMS_IDLE;

    c->lim = dl_wire_limits_default();
    c->lim.num_fragments = (uint32_t)P;
    c->lim.fragment_numel = c->numel;
    *out = c;
    return 0;
}

static void wake(dl_comms *c)
{
    uint64_t one = 1;
    /* EAGAIN only when the counter is saturated: the comms thread is
     * already due to wake up, so nothing is lost. */
    ssize_t n = write(c->efd, &one, sizeof one);
    (void)n;
}

int dl_comms_post_push(dl_comms *c, const dl_comms_push *h, float **delta)
{
    assert(c && h && delta && *delta && h->fragment >= 0 && h->fragment < c->P);
    assert(h->steps >= 1 && h->tokens >= h->steps);
    int p = h->fragment, replaced;
    pthread_mutex_lock(&c->mu);
    push_slot *s = &c->push[p];
    replaced = s->queued;
    float *t = s->buf;
    s->buf = *delta;
    *delta = t;
    s->h = *h;
    s->queued = 1;
    if (replaced) c->st.coalesced++;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return replaced;
}

int dl_comms_take_push(dl_comms *c, int p, dl_comms_push *h, float **delta)
{
    assert(c && h && delta && *delta && p >= 0 && p < c->P);
    pthread_mutex_lock(&c->mu);
    push_slot *s = &c->push[p];
    int got = s->queued;
    if (got) {
        float *t = s->buf;
        s->buf = *delta;
        *delta = t;
        *h = s->h;
        s->queued = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}

int dl_comms_put_update(dl_comms *c, int p, uint64_t version, int forced, const void *data, size_t numel)
{
    assert(c && data && p >= 0 && p < c->P && numel == c->numel[p]);
    /* Copy outside the lock (the payload may be unaligned inside libzmq's buffer). */
    memcpy(c->recv_spare, data, numel * sizeof(float));
    pthread_mutex_lock(&c->mu);
    update_slot *s = &c->upd[p];
    int store = !s->have || forced || version > s->version;
    if (!store) c->st.superseded++; /* the waiting one is newer */
    if (store) {
        if (s->have) c->st.superseded++;
        float *t = s->buf;
        s->buf = c->recv_spare;
        c->recv_spare = t;
        /* A forced update stays forced even when a newer merge replaces it:
         * the learner still has to rebase, now onto the newer global. */
        s->forced = forced || (s->have && s->forced);
        s->version = version;
        s->have = 1;
    }
    pthread_mutex_unlock(&c->mu);
    return store;
}

int dl_comms_take_update(dl_comms *c, int p, float **buf, dl_comms_update *u)
{
    assert(c && buf && *buf && u && p >= 0 && p < c->P);
    pthread_mutex_lock(&c->mu);
    update_slot *s = &c->upd[p];
    int got = s->have;
    if (got) {
        float *t = s->buf;
        s->buf = *buf;
        *buf = t;
        u->fragment = p;
        u->version = s->version;
        u->forced = s->forced;
        if (s->forced && c->push[p].queued) {
            /* queued relative to a base the rebase throws away */
            c->push[p].queued = 0;
            c->st.discarded++;
        }
        s->have = 0;
        s->forced = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}

void dl_comms_set_held(dl_comms *c, int p, uint64_t version)
{
    assert(c && p >= 0 && p < c->P);
    pthread_mutex_lock(&c->mu);
    c->held[p] = version;
    c->held_ok[p] = 1;
    pthread_mutex_unlock(&c->mu);
}

void dl_comms_set_progress(dl_comms *c, uint64_t step, uint64_t tokens, double steps_per_s)
{
    pthread_mutex_lock(&c->mu);
    c->prog_step = step;
    c->prog_tokens = tokens;
    c->prog_sps = steps_per_s >= 0 && steps_per_s < 1e300 ? steps_per_s : 0.0;
    pthread_mutex_unlock(&c->mu);
}

int dl_comms_flush_pending(dl_comms *c)
{
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (int p = 0; p < c->P; p++) n += c->push[p].queued || c->open[p] || c->need_update[p];
    pthread_mutex_unlock(&c->mu);
    return n;
}

void dl_comms_bye(dl_comms *c, const char *reason, uint64_t step)
{
    pthread_mutex_lock(&c->mu);
    c->bye_req = 1;
    snprintf(c->bye_reason, sizeof c->bye_reason, "%s", reason ? reason : "done");
    c->bye_step = step;
    pthread_mutex_unlock(&c->mu);
    wake(c);
}

int dl_comms_state(dl_comms *c, char *msg, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    int s = c->st.state;
    if (msg && cap) snprintf(msg, cap, "%s", c->msg);
    pthread_mutex_unlock(&c->mu);
    return s;
}

void dl_comms_get_stats(dl_comms *c, dl_comms_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}

uint32_t dl_comms_h(dl_comms *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t h = c->st.h;
    pthread_mutex_unlock(&c->mu);
    return h;
}

/* ------------------------------------------------------------------------- */
/* comms thread: helpers */

static void set_state(dl_comms *c, int state, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_state(dl_comms *c, int state, const char *fmt, ...)
{
    pthread_mutex_lock(&c->mu);
    c->st.state = state;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof c->msg, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&c->mu);
    c->state = state;
}

/* Send one message (at most one fp32 payload). Never blocks: at the high-water
 * mark it returns DL_EAGAIN and the caller keeps the data for later. */
static int send_env(dl_comms *c, Dloco__V1__Envelope *env, const float *payload, size_t numel)
{
    env->seq = ++c->seq;
    const void *pl[1] = {payload};
    size_t len[1] = {numel * sizeof(float)};
    int rc = dl_wire_send(c->sock, NULL, 0, env, pl, len, payload ? 1 : 0, ZMQ_DONTWAIT);
    if (rc == 0) {
        uint64_t bytes = dloco__v1__envelope__get_packed_size(env) + (payload ? len[0] : 0);
        pthread_mutex_lock(&c->mu);
        c->st.bytes_sent += bytes;
        pthread_mutex_unlock(&c->mu);
    } else if (rc == DL_ENET) {
        set_state(c, DL_COMMS_FAILED, "socket to %s failed: %s", c->endpoint, dl_errmsg());
    } else if (rc != DL_EAGAIN) {
        DL_ERROR("comms: could not send %s: %s", dl_wire_body_name(env->body_case), dl_errmsg());
    }
    return rc;
}

static void send_hello(dl_comms *c)
{
    Dloco__V1__Hello h;
    dloco__v1__hello__init(&h);
    h.fingerprint = c->fingerprint;
    h.n_layer = c->n_layer;
    h.n_head = c->n_head;
    h.n_embd = c->n_embd;
    h.seq_len = c->seq_len;
    h.vocab = c->vocab;
    h.num_fragments = (uint32_t)c->P;
    h.device = c->device;
    int all = 1;
    pthread_mutex_lock(&c->mu);
    for (int p = 0; p < c->P; p++) {
        all &= c->held_ok[p];
        c->hv[p] = c->held[p];
    }
    h.step = c->prog_step;
    pthread_mutex_unlock(&c->mu);
    /* A learner that holds only some fragments is fresh for the protocol. */
    h.n_held_versions = all ? (size_t)c->P : 0;
    h.held_versions = all ? c->hv : NULL;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_hello(&env, &h);
    c->hello_epoch = c->epoch;
    int rc = send_env(c, &env, NULL, 0);
    /* Not connected yet (ZMQ_IMMEDIATE): try again in HELLO_UNSENT_MS, not
     * after the full retry period. */
    c->hello_unsent = rc == DL_EAGAIN;
    c->t_hello = dl_clock_ns();
    if (rc) return;
    /* backoff: each unanswered Hello doubles the wait for the next, from
     * hello_retry_ms up to HELLO_RETRY_MAX_MS; a Welcome resets it */
    c->hello_wait_ms = c->hello_sent_once ? (c->hello_wait_ms * 2 < HELLO_RETRY_MAX_MS ? c->hello_wait_ms * 2
                                                                                       : HELLO_RETRY_MAX_MS)
                                          : c->hello_retry_ms;
    c->hello_sent_once = 1;
    pthread_mutex_lock(&c->mu);
    c->st.hellos++;
    pthread_mutex_unlock(&c->mu);
    DL_DEBUG("comms: hello to %s (epoch %llu, %s)", c->endpoint, (unsigned long long)c->epoch,
             all ? "with held versions" : "fresh");
}

static void send_heartbeat(dl_comms *c)
{
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    pthread_mutex_lock(&c->mu);
    hb.step = c->prog_step;
    hb.tokens = c->prog_tokens;
    hb.steps_per_s = c->prog_sps;
    pthread_mutex_unlock(&c->mu);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_heartbeat(&env, &hb);
    c->t_hb = dl_clock_ns();
    if (send_env(c, &env, NULL, 0) == 0) {
        pthread_mutex_lock(&c->mu);
        c->st.heartbeats_sent++;
        pthread_mutex_unlock(&c->mu);
    }
}

/* Fetch the n fragments in c->fetch_list (n == P: an empty list = all). */
static void send_fetch(dl_comms *c, int n)
{
    Dloco__V1__Fetch f;
    dloco__v1__fetch__init(&f);
    if (n < c->P) {
        f.n_fragments = (size_t)n;
        f.fragments = c->fetch_list;
    }
    for (int i = 0; i < n; i++) c->fetch_pending[c->fetch_list[i]] = 1;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_fetch(&env, &f);
    if (send_env(c, &env, NULL, 0) == 0) {
        pthread_mutex_lock(&c->mu);
        c->st.fetches++;
        pthread_mutex_unlock(&c->mu);
    }
}

static void send_bye(dl_comms *c, const char *reason, uint64_t step)
{
    Dloco__V1__Bye b;
    dloco__v1__bye__init(&b);
    b.reason = (char *)reason;
    b.step = step;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_bye(&env, &b);
    send_env(c, &env, NULL, 0);
    /* Give the Bye a bounded chance to leave when the socket closes. */
    int linger = BYE_LINGER_MS;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
}

/* Start a new session: the synchronizer restarted, forgot us, went silent or
 * said bye. With `forget` (a new epoch, or DL_ENOTFOUND: our recent pushes
 * got Errors instead of Acks) the answers to pushes already sent will never
 * come, so they stop holding their fragments and the final flush. Queued
 * pushes wait in their slots either way. */
static void forget_sent(dl_comms *c)
{
    pthread_mutex_lock(&c->mu);
    memset(c->open, 0, (size_t)c->P);
    memset(c->need_update, 0, (size_t)c->P);
    pthread_mutex_unlock(&c->mu);
    memset(c->unacked, 0, (size_t)c->P);
}

static void rehello(dl_comms *c, const char *why, int forget)
{
    if (forget) forget_sent(c);
    if (c->state == DL_COMMS_HELLO) {
        /* Already waiting for a Welcome; re-send only if the epoch moved. */
        if (c->hello_epoch != c->epoch) send_hello(c);
        return;
    }
    DL_WARN("comms: %s; sending hello again", why);
    set_state(c, DL_COMMS_HELLO, NULL);
    pthread_mutex_lock(&c->mu);
    c->st.rehellos++;
    pthread_mutex_unlock(&c->mu);
    memset(c->fetch_pending, 0, (size_t)c->P);
    c->t_warn = dl_clock_ns();
    send_hello(c);
}

static void log_line(dl_comms *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(dl_comms *c, const char *fmt, ...)
{
    if (!c->acklog) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(c->acklog, fmt, ap);
    va_end(ap);
    fflush(c->acklog);
}

static const char *decision_name(Dloco__V1__Decision d)
{
    switch (d) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING: return "merged_pending";
    case DLOCO__V1__DECISION__DECISION_ACCEPTED: return "accepted";
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE: return "dropped_stale";
    case DLOCO__V1__DECISION__DECISION_REJECTED: return "rejected";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------------- */
/* comms thread: inbound */

static void on_welcome(dl_comms *c, const Dloco__V1__Welcome *w)
{
    c->hello_sent_once = 0; /* backoff starts over at the next re-hello */
    int n = 0;
    pthread_mutex_lock(&c->mu);
    c->st.h = w->h;
    c->st.heartbeat_ms = w->heartbeat_ms;
    c->st.state = DL_COMMS_READY;
    c->msg[0] = 0;
    for (int p = 0; p < c->P; p++) {
        if (w->must_fetch) {
            if (c->push[p].queued) {
                c->push[p].queued = 0; /* relative to a base the synchronizer will not accept */
                c->st.discarded++;
            }
            c->fetch_list[n++] = (uint32_t)p;
        } else if (!c->held_ok[p]) {
            c->fetch_list[n++] = (uint32_t)p; /* must_fetch=0 but we lack it: fetch anyway */
        }
    }
    pthread_mutex_unlock(&c->mu);
    c->state = DL_COMMS_READY;
    c->hb_ms = w->heartbeat_ms;
    c->liveness = w->liveness;
    memset(c->unacked, 0, (size_t)c->P);
    memset(c->fetch_pending, 0, (size_t)c->P);
    int64_t now = dl_clock_ns();
    c->t_hb = now;
    c->t_recv = now;
    c->ever_welcomed = 1;
    DL_INFO("comms: welcome from %s: epoch %llu, H %u, heartbeat %u ms x %u, policy %s, must_fetch %d (fetching %d)",
            c->endpoint, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
            w->policy && w->policy[0] ? w->policy : "?", (int)w->must_fetch, n);
    if (n) send_fetch(c, n);
}

static void on_update(dl_comms *c, const Dloco__V1__Update *u, dl_wire_msg *m)
{
    int p = (int)u->fragment;
    if (u->codec != DLOCO__V1__CODEC__CODEC_FP32) {
        DL_WARN("comms: update of fragment %d in codec %s ignored: this learner only reads fp32", p,
                dl_wire_codec_name(u->codec));
        pthread_mutex_lock(&c->mu);
        c->st.bad_msgs++;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    int forced = c->fetch_pending[p];
    c->fetch_pending[p] = 0;
    dl_comms_put_update(c, p, u->version, forced, dl_wire_msg_payload(m, 0), (size_t)u->numel);
    pthread_mutex_lock(&c->mu);
    c->st.updates++;
    c->need_update[p] = 0;
    pthread_mutex_unlock(&c->mu);
    log_line(c, "update learner=%s epoch=%llu fragment=%d version=%llu forced=%d\n", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)u->version, forced);
}

static void on_ack(dl_comms *c, const Dloco__V1__Ack *a)
{
    int p = (int)a->fragment;
    pthread_mutex_lock(&c->mu);
    int same = a->base_version == c->open_base[p], decides = 0;
    switch (a->decision) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING:
        if (c->open[p] == OPEN_SENT) c->open[p] = OPEN_POOLED;
        break;
    case DLOCO__V1__DECISION__DECISION_ACCEPTED: decides = c->open[p] == OPEN_POOLED && same; break;
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE: decides = c->open[p] == OPEN_SENT && same; break;
    case DLOCO__V1__DECISION__DECISION_REJECTED: decides = c->open[p] != OPEN_NONE && same; break;
    default: break;
    }
    if (decides) c->open[p] = OPEN_NONE;
    switch (a->decision) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING:
        c->st.acks_pending++;
        c->unacked[p] = 0;
        break;
    case DLOCO__V1__DECISION__DECISION_ACCEPTED:
        c->st.accepted++;
        if (decides) c->need_update[p] = 1; /* the Update follows */
        if (a->merged_version > a->base_version) {
            c->st.staleness_sum += a->merged_version - 1 - a->base_version;
            c->st.staleness_n++;
        }
        break;
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE:
        c->st.dropped_stale++;
        c->unacked[p] = 0;
        break;
    case DLOCO__V1__DECISION__DECISION_REJECTED:
        c->st.rejected++;
        c->unacked[p] = 0;
        break;
    default: break; /* unknown decisions never pass dl_wire_validate */
    }
    pthread_mutex_unlock(&c->mu);
    if (a->decision == DLOCO__V1__DECISION__DECISION_REJECTED)
        DL_WARN("comms: push of fragment %d (base version %llu) rejected: %s", p,
                (unsigned long long)a->base_version, a->reason ? a->reason : "");
    log_line(c, "ack learner=%s epoch=%llu fragment=%d base_version=%llu decision=%s merged_version=%llu\n", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)a->base_version, decision_name(a->decision),
             (unsigned long long)a->merged_version);
}

/* Returns 1 when the thread must stop (fatal error). */
static int on_error(dl_comms *c, const Dloco__V1__Error *e)
{
    pthread_mutex_lock(&c->mu);
    c->st.errors_recv++;
    pthread_mutex_unlock(&c->mu);
    const char *text = e->message ? e->message : "";
    if (e->fatal) {
        set_state(c, DL_COMMS_REFUSED, "synchronizer at %s refused learner %s (error %d, %s): %s", c->endpoint, c->id,
                  e->code, dl_strerror(e->code), text);
        DL_ERROR("comms: fatal error from synchronizer (%d, %s): %s", e->code, dl_strerror(e->code), text);
        return 1;
    }
    if (e->code == DL_ENOTFOUND) {
        char why[1200];
        snprintf(why, sizeof why, "synchronizer does not know this learner (%s)", text);
        rehello(c, why, 1);
    } else {
        DL_WARN("comms: error from synchronizer (%d, %s): %s", e->code, dl_strerror(e->code), text);
    }
    return 0;
}

/* Handle one validated message. Returns 1 when the thread must stop. */
static int handle(dl_comms *c, dl_wire_msg *m)
{
    Dloco__V1__Envelope *env = m->env;
    uint64_t bytes = dloco__v1__envelope__get_packed_size(env);
    for (int i = 0; i < m->npayload; i++) bytes += dl_wire_msg_payload_len(m, i);
    pthread_mutex_lock(&c->mu);
    c->st.bytes_recv += bytes;
    pthread_mutex_unlock(&c->mu);

    if (strcmp(env->run_id ? env->run_id : "", c->run_id) != 0 ||
        strcmp(env->learner_id ? env->learner_id : "", c->id) != 0) {
        /* Error may carry an empty learner_id (proto/wire.h). */
        int anon_error = env->body_case == DLOCO__V1__ENVELOPE__BODY_ERROR &&
                         !(env->learner_id && env->learner_id[0]) &&
                         !strcmp(env->run_id ? env->run_id : "", c->run_id);
        if (!anon_error) {
            DL_WARN("comms: %s for run '%s' learner '%s' ignored (this is run '%s' learner '%s')",
                    dl_wire_body_name(env->body_case), env->run_id, env->learner_id, c->run_id, c->id);
            pthread_mutex_lock(&c->mu);
            c->st.bad_msgs++;
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    if (env->epoch < c->epoch) {
        pthread_mutex_lock(&c->mu);
        c->st.old_epoch++;
        pthread_mutex_unlock(&c->mu);
        DL_DEBUG("comms: %s from epoch %llu ignored (newest is %llu)", dl_wire_body_name(env->body_case),
                 (unsigned long long)env->epoch, (unsigned long long)c->epoch);
        return 0;
    }
    c->t_recv = dl_clock_ns();
    int newer = c->epoch != 0 && env->epoch > c->epoch;
    uint64_t old = c->epoch;
    if (env->epoch > c->epoch) {
        c->epoch = env->epoch;
        pthread_mutex_lock(&c->mu);
        c->st.epoch = env->epoch;
        pthread_mutex_unlock(&c->mu);
    }
    if (newer) forget_sent(c); /* the old incarnation took our pending pushes with it */
    if (newer && env->body_case != DLOCO__V1__ENVELOPE__BODY_WELCOME) {
        char why[128];
        snprintf(why, sizeof why, "synchronizer restarted (epoch %llu -> %llu)", (unsigned long long)old,
                 (unsigned long long)env->epoch);
        rehello(c, why, 1);
    }

    switch (env->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_WELCOME:
        /* Answer to our Hello; a late duplicate (from a retried Hello) is
         * ignored unless it comes from a newer incarnation. */
        if (c->state == DL_COMMS_HELLO || newer) on_welcome(c, env->welcome);
        else DL_DEBUG("comms: duplicate welcome ignored");
        return 0;
    case DLOCO__V1__ENVELOPE__BODY_UPDATE: on_update(c, env->update, m); return 0;
    case DLOCO__V1__ENVELOPE__BODY_ACK: on_ack(c, env->ack); return 0;
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT:
        pthread_mutex_lock(&c->mu);
        c->st.heartbeats_recv++;
        pthread_mutex_unlock(&c->mu);
        return 0;
    case DLOCO__V1__ENVELOPE__BODY_ERROR: return on_error(c, env->error);
    case DLOCO__V1__ENVELOPE__BODY_BYE:
        if (c->state == DL_COMMS_READY) rehello(c, "synchronizer said bye", 0);
        return 0;
    default:
        DL_WARN("comms: unexpected %s from the synchronizer ignored", dl_wire_body_name(env->body_case));
        pthread_mutex_lock(&c->mu);
        c->st.bad_msgs++;
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
}

/* Drain the socket. Returns 1 when the thread must stop. */
static int recv_all(dl_comms *c)
{
    for (;;) {
        dl_wire_msg m;
        int rc = dl_wire_recv(c->sock, 0, &c->lim, &m, ZMQ_DONTWAIT);
        int stop = 0;
        if (rc == 0) {
            stop = handle(c, &m);
        } else if (rc == DL_EPROTO) {
            DL_WARN("comms: bad message from synchronizer dropped: %s", dl_errmsg());
            pthread_mutex_lock(&c->mu);
            c->st.bad_msgs++;
            pthread_mutex_unlock(&c->mu);
        } else if (rc == DL_EAGAIN) {
            dl_wire_msg_close(&m);
            return 0;
        } else {
            set_state(c, DL_COMMS_FAILED, "receiving from %s: %s", c->endpoint, dl_errmsg());
            stop = 1;
        }
        dl_wire_msg_close(&m);
        if (stop) return 1;
    }
}

/* ------------------------------------------------------------------------- */
/* comms thread: outbound pushes */

/* Send queued pushes allowed by flow control. Returns 1 when the socket is
 * full (retry soon), 0 otherwise. */
static int send_pushes(dl_comms *c, int64_t now)
{
    int64_t expiry = (int64_t)c->liveness * c->hb_ms;
    if (expiry < ACK_EXPIRY_MIN_MS) expiry = ACK_EXPIRY_MIN_MS;
    for (int k = 0; k < c->P; k++) {
        int p = (c->rr + k) % c->P;
        if (c->fetch_pending[p]) continue;
        if (c->unacked[p] && now - c->unacked_ns[p] < expiry * MS) continue;
        dl_comms_push h;
        uint8_t prev_open = 0;
        uint64_t prev_base = 0;
        pthread_mutex_lock(&c->mu);
        int go = c->push[p].queued && !(c->upd[p].have && c->upd[p].forced);
        if (go) {
            push_slot *s = &c->push[p];
            float *t = s->buf;
            s->buf = c->send_spare;
            c->send_spare = t;
            h = s->h;
            s->queued = 0;
            /* the latest push from here on, so dl_comms_flush_pending never
             * misses a push between its slot and the socket */
            prev_open = c->open[p];
            prev_base = c->open_base[p];
            c->open[p] = OPEN_SENT;
            c->open_base[p] = h.base_version;
        }
        pthread_mutex_unlock(&c->mu);
        if (!go) continue;

        size_t n = (size_t)c->numel[p];
        Dloco__V1__Push m;
        dloco__v1__push__init(&m);
        m.fragment = (uint32_t)p;
        m.base_version = h.base_version;
        m.steps = h.steps;
        m.tokens = h.tokens;
        m.codec = DLOCO__V1__CODEC__CODEC_FP32;
        m.numel = n;
        m.block_size = 0;
        m.checksum = dl_wire_checksum(c->send_spare, n * sizeof(float));
        m.loss = h.loss;
        Dloco__V1__Envelope env;
        dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
        dl_wire_set_push(&env, &m);
        int rc = send_env(c, &env, c->send_spare, n);
        if (rc == DL_EAGAIN) {
            /* Put it back unless a newer push of p arrived meanwhile. */
            pthread_mutex_lock(&c->mu);
            c->open[p] = prev_open;
            c->open_base[p] = prev_base;
            push_slot *s = &c->push[p];
            if (!s->queued) {
                float *t = s->buf;
                s->buf = c->send_spare;
                c->send_spare = t;
                s->h = h;
                s->queued = 1;
            } else {
                c->st.coalesced++;
            }
            pthread_mutex_unlock(&c->mu);
            return 1;
        }
        if (rc < 0) {
            pthread_mutex_lock(&c->mu);
            c->open[p] = prev_open;
            c->open_base[p] = prev_base;
            pthread_mutex_unlock(&c->mu);
            if (rc == DL_ENET) return 0;
            continue; /* refused locally (e.g. a NaN loss): dropped, logged by send_env */
        }
        c->unacked[p] = 1;
        c->unacked_ns[p] = now;
        pthread_mutex_lock(&c->mu);
        c->st.pushes++;
        c->st.push_bytes += n * sizeof(float);
        pthread_mutex_unlock(&c->mu);
        DL_DEBUG("comms: push fragment %d base %llu steps %llu tokens %llu%s", p, (unsigned long long)h.base_version,
                 (unsigned long long)h.steps, (unsigned long long)h.tokens, h.final ? " (final flush)" : "");
    }
    c->rr = (c->rr + 1) % c->P;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* comms thread: main loop */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void *comms_main(void *arg)
{
    dl_comms *c = arg;
    /* Signals belong to the training thread (it finishes the step and flushes). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);

    c->t_start = c->t_warn = dl_clock_ns();
    send_hello(c);
    int blocked = 0;
    while (c->state == DL_COMMS_HELLO || c->state == DL_COMMS_READY) {
        int64_t now = dl_clock_ns();
        int64_t wait = POLL_MAX_MS;
        if (c->state == DL_COMMS_HELLO)
            wait = min64(wait, (c->t_hello + (c->hello_unsent ? HELLO_UNSENT_MS : c->hello_wait_ms) * MS - now) / MS);
        if (c->state == DL_COMMS_READY) wait = min64(wait, (c->t_hb + c->hb_ms * MS - now) / MS);
        if (blocked) wait = min64(wait, 10);
        if (wait < 0) wait = 0;
        zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {NULL, c->efd, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, (long)wait) < 0 && zmq_errno() != EINTR) {
            set_state(c, DL_COMMS_FAILED, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        uint64_t cnt;
        while (read(c->efd, &cnt, sizeof cnt) == (ssize_t)sizeof cnt) {
        }

        pthread_mutex_lock(&c->mu);
        int stop = c->stop_req, bye = c->bye_req;
        char reason[128];
        snprintf(reason, sizeof reason, "%s", c->bye_reason);
        uint64_t bye_step = c->bye_step;
        pthread_mutex_unlock(&c->mu);
        if (stop && !bye) {
            set_state(c, DL_COMMS_DONE, NULL);
            break;
        }
        if (recv_all(c)) break;

        now = dl_clock_ns();
        if (c->state == DL_COMMS_HELLO) {
            if (!c->ever_welcomed && now - c->t_start >= c->connect_timeout_ms * MS) {
                set_state(c, DL_COMMS_FAILED,
                          "no Welcome from %s within %d ms (is dloco-sync running there with run_id '%s'?)",
                          c->endpoint, c->connect_timeout_ms, c->run_id);
                break;
            }
            if (c->ever_welcomed && now - c->t_warn >= c->connect_timeout_ms * MS) {
                DL_WARN("comms: still no Welcome from %s after %d ms; training goes on, retrying", c->endpoint,
                        c->connect_timeout_ms);
                c->t_warn = now;
            }
            if (now - c->t_hello >= (c->hello_unsent ? HELLO_UNSENT_MS : c->hello_wait_ms) * MS) send_hello(c);
        } else if (c->state == DL_COMMS_READY) {
            int64_t silence = (int64_t)c->liveness * c->hb_ms;
            if (silence < SILENCE_MIN_MS) silence = SILENCE_MIN_MS;
            if (now - c->t_recv >= silence * MS) {
                char why[96];
                snprintf(why, sizeof why, "no message from the synchronizer for %lld ms", (long long)silence);
                rehello(c, why, 0);
            } else if (now - c->t_hb >= c->hb_ms * MS) {
                send_heartbeat(c);
            }
        }
        blocked = 0;
        if (c->state == DL_COMMS_READY) blocked = send_pushes(c, now);
        if (bye) {
            if (c->ever_welcomed && (c->state == DL_COMMS_READY || c->state == DL_COMMS_HELLO)) {
                send_bye(c, reason, bye_step);
                DL_INFO("comms: bye sent (%s, step %llu)", reason, (unsigned long long)bye_step);
            }
            if (c->state == DL_COMMS_READY || c->state == DL_COMMS_HELLO) set_state(c, DL_COMMS_DONE, NULL);
            break;
        }
    }
    zmq_close(c->sock);
    c->sock = NULL;
    return NULL;
}

int dl_comms_start(dl_comms *c)
{
    assert(c && !c->started);
    c->ctx = zmq_ctx_new();
    if (!c->ctx) return dl_err(DL_ENET, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) {
        int rc = dl_err(DL_ENET, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        zmq_ctx_term(c->ctx);
        c->ctx = NULL;
        return rc;
    }
    size_t maxmsg = c->maxn * sizeof(float) + DL_WIRE_MAX_HEADER_BYTES;
    int rc = dl_wire_sock_setup(c->sock, 0, maxmsg);
    if (!rc && zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, c->id, strlen(c->id)) != 0)
        rc = dl_err(DL_ENET, "setsockopt ZMQ_ROUTING_ID: %s", zmq_strerror(zmq_errno()));
    /* Queue nothing while disconnected: sends fail with EAGAIN instead, so
     * pushes wait (and coalesce) in their slots, and Hellos retried during
     * an outage do not pile up to be answered all at once on reconnect. */
    int one = 1;
    if (!rc && zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one) != 0)
        rc = dl_err(DL_ENET, "setsockopt ZMQ_IMMEDIATE: %s", zmq_strerror(zmq_errno()));
    if (!rc && zmq_connect(c->sock, c->endpoint) != 0)
        rc = dl_err(DL_ENET, "connect %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
    if (!rc) set_state(c, DL_COMMS_HELLO, NULL);
    if (!rc && pthread_create(&c->thread, NULL, comms_main, c) != 0)
        rc = dl_err(DL_ENET, "cannot start the comms thread");
    if (rc) {
        set_state(c, DL_COMMS_FAILED, "%s", dl_errmsg());
        zmq_close(c->sock);
        c->sock = NULL;
        zmq_ctx_term(c->ctx);
        c->ctx = NULL;
        return rc;
    }
    c->started = 1;
    return 0;
}

void dl_comms_stop(dl_comms *c)
{
    if (!c || !c->started) return;
    pthread_mutex_lock(&c->mu);
    c->stop_req = 1;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    pthread_join(c->thread, NULL);
    zmq_ctx_term(c->ctx); /* waits at most the Bye linger */
    c->ctx = NULL;
    c->started = 0;
}

void dl_comms_close(dl_comms **cp)
{
    if (!cp || !*cp) return;
    dl_comms *c = *cp;
    dl_comms_stop(c);
    for (int p = 0; p < c->P; p++) {
        free(c->push[p].buf);
        free(c->upd[p].buf);
    }
    free(c->push);
    free(c->upd);
    free(c->held);
    free(c->held_ok);
    free(c->open);
    free(c->open_base);
    free(c->need_update);
    free(c->send_spare);
    free(c->recv_spare);
    free(c->hv);
    free(c->fetch_list);
    free(c->unacked);
    free(c->unacked_ns);
    free(c->fetch_pending);
    free(c->numel);
    if (c->acklog) fclose(c->acklog);
    close(c->efd);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *cp = NULL;
}
