/* A learner's comms session: one DEALER to one synchronizer on its own thread (hello, fetch,
 * flow-controlled pushes, acks, updates, heartbeats, re-hello, bye), serving fragments of a mailbox. */
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
#include "core/event.h"
#include "core/log.h"
#include "core/plan.h"
#include "proto/wire.h"

#define MS ((int64_t)1000000) /* ns per ms */

/* Session-side state of one fragment; comms thread only. */
typedef struct {
    int served;         /* this session pushes, fetches and receives fragment p */
    int unacked;        /* a push waits for its immediate ack */
    int64_t unacked_ns; /* when it was sent */
    int fetch_pending;  /* the next Update of p is a fetch reply */
    int rebase_pending; /* the next Update of p is the rebase after a DROPPED_STALE */
} sfrag;

struct dl_comms {
    /* ---- immutable after open */
    dl_mailbox *mb;
    int link; /* our number in the mailbox */
    char endpoint[256];
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    char run_id[129];
    char device[129];
    int P;
    int *served; /* [n_served] the fragments we serve, ascending */
    int n_served;
    uint64_t *numel; /* [P] floats per fragment: a uint64 array because dl_wire_limits borrows it */
    size_t maxn;     /* floats per swapped buffer */
    uint64_t fingerprint;
    uint32_t n_layer, n_head, n_embd, seq_len, vocab;
    int hello_retry_ms, hello_retry_max_ms, hello_unsent_ms, connect_timeout_ms, poll_max_ms, silence_min_ms,
        ack_expiry_min_ms, bye_linger_ms, reconnect_ms, reconnect_max_ms;
    int efd; /* eventfd: training thread (through the mailbox) -> this thread */

    /* ---- guarded by mu (read by other threads: stats and state) */
    pthread_mutex_t mu;
    int stop_req;
    dl_comms_stats st;
    char msg[640];

    /* ---- comms thread only */
    void *ctx, *sock;
    pthread_t thread;
    int started;
    dl_wire_limits lim;
    sfrag *f;               /* [P] */
    float *send_spare;      /* [maxn] */
    uint64_t *hv;           /* [P] held_versions being sent (contiguous: it goes on the wire as is) */
    uint32_t *fetch_list;   /* [P] fragments of the next Fetch (likewise) */
    uint64_t seq;
    uint64_t epoch;         /* newest epoch seen (mirror of st.epoch) */
    uint64_t hello_epoch;   /* epoch the last Hello carried */
    int state;              /* mirror of st.state */
    int ever_welcomed;
    int hello_wait_ms, hello_sent_once; /* current Hello retry period (backoff) */
    uint32_t hb_ms, liveness;
    int64_t t_start, t_hello, t_hb, t_recv, t_warn;
    int hello_unsent; /* the last Hello found no connection */
    int rr; /* round-robin start for fairness among fragments */
};

static void wake(dl_comms *c)
{
    uint64_t one = 1;
    /* EAGAIN only when the counter is saturated: the thread is already due to wake up */
    ssize_t n = write(c->efd, &one, sizeof one);
    (void)n;
}

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

#define DEF(v, d) ((v) > 0 ? (v) : (d))

int dl_comms_check_timeouts(const dl_comms_opts *o, int push_decision_timeout_ms)
{
    int poll = DEF(o->poll_max_ms, 100), retry = DEF(o->hello_retry_ms, 1000), cap = DEF(o->hello_retry_max_ms, 16000),
        unsent = DEF(o->hello_unsent_ms, 20), connect = DEF(o->connect_timeout_ms, 30000),
        silence = DEF(o->silence_min_ms, 1000), expiry = DEF(o->ack_expiry_min_ms, 5000),
        reconnect = DEF(o->reconnect_ms, 100), reconnect_max = DEF(o->reconnect_max_ms, 10000);
    /* Timers fire only when the loop wakes, at least every poll period: a
     * retry or a silence limit at or below it cannot be honoured. An unsent
     * Hello (no connection yet) is retried sooner than an unanswered one,
     * and the backoff starts below its cap. */
    if (!(unsent <= retry && poll < retry && retry <= cap))
        return dl_err(DL_EINVAL,
                      "comms timeouts must be ordered hello_unsent_ms <= hello_retry_ms, poll_max_ms < hello_retry_ms "
                      "<= hello_retry_max_ms, got %d, %d, %d, %d",
                      unsent, retry, poll, cap);
    if (!(poll < silence))
        return dl_err(DL_EINVAL, "comms timeouts must be ordered poll_max_ms < silence_min_ms, got %d < %d", poll,
                      silence);
    /* A lost connection is retried before the Hello that needs it, and the
     * reconnect backoff never outgrows the Hello backoff (a Hello retried on
     * a connection still backing off only finds no connection). */
    if (!(reconnect <= reconnect_max && reconnect < retry && reconnect_max <= cap))
        return dl_err(DL_EINVAL,
                      "comms timeouts must be ordered reconnect_ms <= reconnect_max_ms, reconnect_ms < hello_retry_ms, "
                      "reconnect_max_ms <= hello_retry_max_ms, got %d, %d, %d, %d",
                      reconnect, reconnect_max, retry, cap);
    /* at least one Hello retry before the first connection is given up */
    if (!(retry < connect))
        return dl_err(DL_EINVAL, "comms timeouts must be ordered hello_retry_ms < connect_timeout_ms, got %d < %d",
                      retry, connect);
    /* The node releases a held push after push_decision_timeout_ms; before
     * the session's flow control has given up on a lost immediate Ack the
     * released push would only wait behind it. */
    if (push_decision_timeout_ms >= 0 && !(expiry < push_decision_timeout_ms))
        return dl_err(DL_EINVAL,
                      "comms timeouts must be ordered ack_expiry_min_ms < push_decision_timeout_ms, got %d < %d",
                      expiry, push_decision_timeout_ms);
    return 0;
}

int dl_comms_open(const dl_comms_opts *o, dl_comms **out)
{
    assert(o && out);
    *out = NULL;
    if (!o->plan) return dl_err(DL_EINVAL, "comms: no fragment plan");
    if (!o->mailbox) return dl_err(DL_EINVAL, "comms: no mailbox");
    if (!o->endpoint || !o->endpoint[0]) return dl_err(DL_EINVAL, "comms: no synchronizer endpoint");
    if (!dl_comms_id_ok(o->learner_id))
        return dl_err(DL_EINVAL, "learner id '%s' is not [A-Za-z0-9._-]{1,64}", o->learner_id ? o->learner_id : "");
    DL_TRY(dl_comms_check_timeouts(o, -1));
    int P = dl_plan_P(o->plan);
    if (P != dl_mailbox_P(o->mailbox)) return dl_err(DL_EINVAL, "comms: plan has %d fragments, mailbox %d", P,
                                                     dl_mailbox_P(o->mailbox));
    dl_comms *c = dl_xcalloc(1, sizeof *c);
    c->f = dl_xcalloc((size_t)P, sizeof *c->f);
    int rc = 0;
    if (o->fragments) {
        for (int i = 0; i < o->n_fragments && !rc; i++) {
            int p = o->fragments[i];
            if (p < 0 || p >= P || c->f[p].served)
                rc = dl_err(DL_EINVAL, "comms: fragment %d listed twice or not in [0, %d)", p, P);
            else c->f[p].served = 1;
        }
        if (!rc && o->n_fragments < 1) rc = dl_err(DL_EINVAL, "comms: empty fragment list");
    } else {
        for (int p = 0; p < P; p++) c->f[p].served = 1;
    }
    if (rc || (rc = copy_str(c->endpoint, sizeof c->endpoint, o->endpoint, "endpoint")) ||
        (rc = copy_str(c->id, sizeof c->id, o->learner_id, "learner id")) ||
        (rc = copy_str(c->run_id, sizeof c->run_id, o->run_id, "run id")) ||
        (rc = copy_str(c->device, sizeof c->device, o->device ? o->device : "cpu", "device"))) {
        free(c->f);
        free(c);
        return rc;
    }
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->efd < 0) {
        rc = dl_err(DL_EIO, "eventfd: %s", strerror(errno));
        free(c->f);
        free(c);
        return rc;
    }
    c->link = dl_mailbox_attach(o->mailbox, c->efd);
    if (c->link < 0) {
        rc = c->link;
        close(c->efd);
        free(c->f);
        free(c);
        return rc;
    }
    c->mb = o->mailbox;
    c->P = P;
    c->served = dl_xcalloc((size_t)P, sizeof *c->served);
    for (int p = 0; p < P; p++)
        if (c->f[p].served) c->served[c->n_served++] = p;
    c->fingerprint = o->fingerprint;
    c->n_layer = o->n_layer;
    c->n_head = o->n_head;
    c->n_embd = o->n_embd;
    c->seq_len = o->seq_len;
    c->vocab = o->vocab;
    c->hello_retry_ms = DEF(o->hello_retry_ms, 1000);
    c->hello_retry_max_ms = DEF(o->hello_retry_max_ms, 16000);
    c->hello_unsent_ms = DEF(o->hello_unsent_ms, 20);
    c->connect_timeout_ms = DEF(o->connect_timeout_ms, 30000);
    c->poll_max_ms = DEF(o->poll_max_ms, 100);
    c->silence_min_ms = DEF(o->silence_min_ms, 1000);
    c->ack_expiry_min_ms = DEF(o->ack_expiry_min_ms, 5000);
    c->bye_linger_ms = DEF(o->bye_linger_ms, 1000);
    c->reconnect_ms = DEF(o->reconnect_ms, 100);
    c->reconnect_max_ms = DEF(o->reconnect_max_ms, 10000);
    c->maxn = dl_mailbox_buf_numel(o->mailbox);
    c->numel = dl_xcalloc((size_t)P, sizeof *c->numel);
    for (int p = 0; p < P; p++) c->numel[p] = dl_plan_fragment_numel(o->plan, p);
    pthread_mutex_init(&c->mu, NULL);
    c->send_spare = dl_mailbox_buf_alloc(o->mailbox);
    c->hv = dl_xcalloc((size_t)P, sizeof *c->hv);
    c->fetch_list = dl_xcalloc((size_t)P, sizeof *c->fetch_list);
    c->state = c->st.state = DL_COMMS_IDLE;
    c->lim = dl_wire_limits_default();
    c->lim.num_fragments = (uint32_t)P;
    c->lim.fragment_numel = c->numel;
    *out = c;
    return 0;
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
    dl_mailbox_stats ms;
    dl_mailbox_get_stats(c->mb, &ms);
    out->coalesced = ms.coalesced;
    out->discarded = ms.discarded;
    out->superseded = ms.superseded;
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
    dl_mailbox_set_link(c->mb, c->link, state, 0, fmt ? c->msg : NULL);
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
    for (int p = 0; p < c->P; p++) all &= dl_mailbox_held(c->mb, p, &c->hv[p]);
    dl_mailbox_progress(c->mb, &h.step, NULL, NULL, NULL);
    /* A learner that holds only some fragments is fresh for the protocol. */
    h.n_held_versions = all ? (size_t)c->P : 0;
    h.held_versions = all ? c->hv : NULL;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_hello(&env, &h);
    c->hello_epoch = c->epoch;
    int rc = send_env(c, &env, NULL, 0);
    /* Not connected yet (ZMQ_IMMEDIATE): try again in hello_unsent_ms, not
     * after the full retry period. */
    c->hello_unsent = rc == DL_EAGAIN;
    c->t_hello = dl_clock_ns();
    if (rc) return;
    /* backoff: each unanswered Hello doubles the wait for the next, from
     * hello_retry_ms up to hello_retry_max_ms; a Welcome resets it */
    c->hello_wait_ms = c->hello_sent_once ? (c->hello_wait_ms < c->hello_retry_max_ms / 2 ? c->hello_wait_ms * 2
                                                                                          : c->hello_retry_max_ms)
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
    dl_mailbox_progress(c->mb, &hb.step, &hb.tokens, &hb.steps_per_s, &hb.discarded_tokens);
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

/* Fetch the n fragments in c->fetch_list (n == P: an empty list = all). A
 * session serving a subset always names its fragments. */
static void send_fetch(dl_comms *c, int n)
{
    Dloco__V1__Fetch f;
    dloco__v1__fetch__init(&f);
    if (n < c->P) {
        f.n_fragments = (size_t)n;
        f.fragments = c->fetch_list;
    }
    for (int i = 0; i < n; i++) c->f[c->fetch_list[i]].fetch_pending = 1;
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
    /* the final counts: the ledger closes this learner's account with them */
    dl_mailbox_progress(c->mb, NULL, &b.tokens, NULL, &b.discarded_tokens);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_bye(&env, &b);
    send_env(c, &env, NULL, 0);
    /* Give the Bye a bounded chance to leave when the socket closes. */
    int linger = c->bye_linger_ms;
    DL_ZMQ_LOG(zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger));
}

/* Start a new session: the synchronizer restarted, forgot us, went silent or
 * said bye. With `forget` (a new epoch, or DL_ENOTFOUND: our recent pushes
 * got Errors instead of Acks) the answers to pushes already sent will never
 * come, so they stop holding their fragments and the final flush. Queued
 * pushes wait in their slots either way. */
static void forget_sent(dl_comms *c)
{
    dl_mailbox_forget_sent(c->mb, c->served, c->n_served);
    for (int p = 0; p < c->P; p++) c->f[p].unacked = 0;
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
    char ev[1400];
    dl_event("rehello", " learner=%s epoch=%llu reason=%s", c->id, (unsigned long long)c->epoch,
             dl_event_str(why, ev, sizeof ev));
    set_state(c, DL_COMMS_HELLO, NULL);
    pthread_mutex_lock(&c->mu);
    c->st.rehellos++;
    pthread_mutex_unlock(&c->mu);
    for (int p = 0; p < c->P; p++) c->f[p].fetch_pending = c->f[p].rebase_pending = 0;
    c->t_warn = dl_clock_ns();
    send_hello(c);
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
    for (int i = 0; i < c->n_served; i++) {
        int p = c->served[i];
        uint64_t v;
        if (w->must_fetch) {
            dl_mailbox_discard_queued(c->mb, p); /* relative to a base the synchronizer will not accept */
            c->fetch_list[n++] = (uint32_t)p;
        } else if (!dl_mailbox_held(c->mb, p, &v)) {
            c->fetch_list[n++] = (uint32_t)p; /* must_fetch=0 but we lack it: fetch anyway */
        }
    }
    pthread_mutex_lock(&c->mu);
    c->st.h = w->h;
    c->st.heartbeat_ms = w->heartbeat_ms;
    c->st.state = DL_COMMS_READY;
    c->msg[0] = 0;
    pthread_mutex_unlock(&c->mu);
    c->state = DL_COMMS_READY;
    dl_mailbox_set_link(c->mb, c->link, DL_COMMS_READY, w->h, "");
    c->hb_ms = w->heartbeat_ms;
    c->liveness = w->liveness;
    for (int p = 0; p < c->P; p++) c->f[p].unacked = c->f[p].fetch_pending = c->f[p].rebase_pending = 0;
    int64_t now = dl_clock_ns();
    c->t_hb = now;
    c->t_recv = now;
    c->ever_welcomed = 1;
    DL_INFO("comms: welcome from %s: epoch %llu, H %u, heartbeat %u ms x %u, policy %s, must_fetch %d (fetching %d)",
            c->endpoint, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
            w->policy && w->policy[0] ? w->policy : "?", (int)w->must_fetch, n);
    char pol[300];
    dl_event("welcome", " learner=%s epoch=%llu h=%u heartbeat_ms=%u liveness=%u policy=%s must_fetch=%d fetching=%d",
             c->id, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
             dl_event_str(w->policy ? w->policy : "", pol, sizeof pol), (int)w->must_fetch, n);
    /* all served fragments: an empty list, unless we serve a subset */
    if (n) send_fetch(c, n == c->P ? c->P : n);
}

/* 1 when p is ours; counts a bad message otherwise (a shard sent us another's fragment). */
static int served(dl_comms *c, int p, const char *what)
{
    if (p >= 0 && p < c->P && c->f[p].served) return 1;
    DL_WARN("comms: %s of fragment %d ignored: not served by this session", what, p);
    pthread_mutex_lock(&c->mu);
    c->st.bad_msgs++;
    pthread_mutex_unlock(&c->mu);
    return 0;
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
    if (!served(c, p, "update")) return;
    int forced = c->f[p].fetch_pending ? DL_UPDATE_FETCHED
                 : c->f[p].rebase_pending ? DL_UPDATE_REBASE
                                          : DL_UPDATE_NORMAL;
    c->f[p].rebase_pending = 0;
    c->f[p].fetch_pending = 0;
    dl_mailbox_put_update(c->mb, p, u->version, forced, dl_wire_msg_payload(m, 0), (size_t)u->numel);
    pthread_mutex_lock(&c->mu);
    c->st.updates++;
    pthread_mutex_unlock(&c->mu);
    dl_event("update", " learner=%s epoch=%llu fragment=%d version=%llu forced=%d", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)u->version, forced);
}

static void on_ack(dl_comms *c, const Dloco__V1__Ack *a)
{
    int p = (int)a->fragment;
    if (!served(c, p, "ack")) return;
    int d = 0;
    switch (a->decision) {
    case DLOCO__V1__DECISION__DECISION_MERGED_PENDING: d = DL_DECIDE_PENDING; break;
    case DLOCO__V1__DECISION__DECISION_ACCEPTED: d = DL_DECIDE_ACCEPTED; break;
    case DLOCO__V1__DECISION__DECISION_DROPPED_STALE: d = DL_DECIDE_DROPPED; break;
    case DLOCO__V1__DECISION__DECISION_REJECTED: d = DL_DECIDE_REJECTED; break;
    default: return; /* unknown decisions never pass dl_wire_validate */
    }
    int decided = dl_mailbox_decide(c->mb, p, d, a->base_version,
                                    d == DL_DECIDE_ACCEPTED || (d == DL_DECIDE_DROPPED && a->rebase));
    if (decided && d == DL_DECIDE_DROPPED && a->rebase) c->f[p].rebase_pending = 1;
    /* any immediate answer frees the fragment for flow control */
    if (d != DL_DECIDE_ACCEPTED) c->f[p].unacked = 0;
    pthread_mutex_lock(&c->mu);
    switch (d) {
    case DL_DECIDE_PENDING: c->st.acks_pending++; break;
    case DL_DECIDE_ACCEPTED:
        c->st.accepted++;
        if (a->merged_version > a->base_version) {
            c->st.staleness_sum += a->merged_version - 1 - a->base_version;
            c->st.staleness_n++;
        }
        break;
    case DL_DECIDE_DROPPED: c->st.dropped_stale++; break;
    default: c->st.rejected++; break;
    }
    pthread_mutex_unlock(&c->mu);
    if (d == DL_DECIDE_REJECTED)
        DL_WARN("comms: push of fragment %d (base version %llu) rejected: %s", p,
                (unsigned long long)a->base_version, a->reason ? a->reason : "");
    dl_event("ack", " learner=%s epoch=%llu fragment=%d base_version=%llu decision=%s merged_version=%llu", c->id,
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
    Dloco__V1__ErrorKind k = dl_wire_error_kind(e);
    const char *kind = dl_wire_error_kind_name(k);
    if (e->fatal) {
        set_state(c, DL_COMMS_REFUSED, "synchronizer at %s refused learner %s (%s): %s", c->endpoint, c->id, kind, text);
        DL_ERROR("comms: fatal error from synchronizer (%s): %s", kind, text);
        return 1;
    }
    if (k == DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER) {
        char why[1200];
        snprintf(why, sizeof why, "synchronizer does not know this learner (%s)", text);
        rehello(c, why, 1);
    } else {
        DL_WARN("comms: error from synchronizer (%s): %s", kind, text);
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
    if (expiry < c->ack_expiry_min_ms) expiry = c->ack_expiry_min_ms;
    int hb_first = 0;
    for (int k = 0; k < c->n_served; k++) {
        int p = c->served[(c->rr + k) % c->n_served];
        sfrag *f = &c->f[p];
        if (f->fetch_pending) continue;
        if (f->unacked && now - f->unacked_ns < expiry * MS) continue;
        dl_mailbox_claim cl;
        if (!dl_mailbox_claim_push(c->mb, p, now, &cl, &c->send_spare)) continue;
        const dl_mailbox_push *h = &cl.h;
        /* A Heartbeat first, so the synchronizer's record of the tokens this
         * learner processed covers every token the push reports (the
         * ledger's balance holds even if the learner dies right after). */
        if (!hb_first) {
            send_heartbeat(c);
            hb_first = 1;
        }

        size_t n = (size_t)c->numel[p];
        Dloco__V1__Push m;
        dloco__v1__push__init(&m);
        m.fragment = (uint32_t)p;
        m.base_version = h->base_version;
        m.steps = h->steps;
        m.tokens = h->tokens;
        m.codec = DLOCO__V1__CODEC__CODEC_FP32;
        m.numel = n;
        m.block_size = 0;
        m.checksum = dl_wire_checksum(c->send_spare, n * sizeof(float));
        m.loss = h->loss;
        m.compute_s = h->compute_s;
        Dloco__V1__Envelope env;
        dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
        dl_wire_set_push(&env, &m);
        int rc = send_env(c, &env, c->send_spare, n);
        if (rc == DL_EAGAIN) {
            /* put it back unless a newer push of p arrived meanwhile */
            dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 1);
            return 1;
        }
        if (rc < 0) {
            dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 0);
            if (rc == DL_ENET) return 0;
            continue; /* refused locally (e.g. a NaN loss): dropped, logged by send_env */
        }
        f->unacked = 1;
        f->unacked_ns = now;
        pthread_mutex_lock(&c->mu);
        c->st.pushes++;
        c->st.push_bytes += n * sizeof(float);
        pthread_mutex_unlock(&c->mu);
        DL_DEBUG("comms: push fragment %d base %llu steps %llu tokens %llu%s", p, (unsigned long long)h->base_version,
                 (unsigned long long)h->steps, (unsigned long long)h->tokens, h->final ? " (final flush)" : "");
        dl_event("push", " learner=%s epoch=%llu fragment=%d base_version=%llu steps=%llu tokens=%llu compute_s=%.6f "
                 "final=%d held=%d",
                 c->id, (unsigned long long)c->epoch, p, (unsigned long long)h->base_version,
                 (unsigned long long)h->steps, (unsigned long long)h->tokens, h->compute_s, h->final, h->held);
    }
    c->rr = (c->rr + 1) % c->n_served;
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
        int64_t wait = c->poll_max_ms;
        if (c->state == DL_COMMS_HELLO)
            wait = min64(wait, (c->t_hello + (c->hello_unsent ? c->hello_unsent_ms : c->hello_wait_ms) * MS - now) / MS);
        if (c->state == DL_COMMS_READY) wait = min64(wait, (c->t_hb + c->hb_ms * MS - now) / MS);
        if (blocked) wait = min64(wait, 10);
        if (wait < 0) wait = 0;
        zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {NULL, c->efd, ZMQ_POLLIN, 0}};
        int prc = DL_ZMQ_RC(zmq_poll(items, 2, (long)wait));
        if (prc < 0 && prc != DL_EAGAIN) { /* DL_EAGAIN: EINTR */
            set_state(c, DL_COMMS_FAILED, "%s", dl_errmsg());
            break;
        }
        uint64_t cnt;
        while (read(c->efd, &cnt, sizeof cnt) == (ssize_t)sizeof cnt) {
        }

        pthread_mutex_lock(&c->mu);
        int stop = c->stop_req;
        pthread_mutex_unlock(&c->mu);
        char reason[128] = "";
        uint64_t bye_step = 0;
        int bye = dl_mailbox_bye_asked(c->mb, reason, sizeof reason, &bye_step);
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
            if (now - c->t_hello >= (c->hello_unsent ? c->hello_unsent_ms : c->hello_wait_ms) * MS) send_hello(c);
        } else if (c->state == DL_COMMS_READY) {
            int64_t silence = (int64_t)c->liveness * c->hb_ms;
            if (silence < c->silence_min_ms) silence = c->silence_min_ms;
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
    DL_ZMQ_LOG(zmq_close(c->sock));
    c->sock = NULL;
    return NULL;
}

/* Context, DEALER and its options, connect. Returns 0 or the DL_E* code;
 * the caller closes what was made. */
static int open_socket(dl_comms *c)
{
    DL_ZMQ_PTR(c->ctx, zmq_ctx_new());
    DL_ZMQ_PTR(c->sock, zmq_socket(c->ctx, ZMQ_DEALER));
    size_t maxmsg = c->maxn * sizeof(float) + DL_WIRE_MAX_HEADER_BYTES;
    DL_TRY(dl_wire_sock_setup(c->sock, 0, maxmsg));
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, c->id, strlen(c->id)));
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL, &c->reconnect_ms, sizeof c->reconnect_ms));
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL_MAX, &c->reconnect_max_ms, sizeof c->reconnect_max_ms));
    /* Queue nothing while disconnected: sends fail with EAGAIN instead, so
     * pushes wait (and coalesce) in their slots, and Hellos retried during
     * an outage do not pile up to be answered all at once on reconnect. */
    int one = 1;
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one));
    DL_ZMQ_CALL(zmq_connect(c->sock, c->endpoint));
    return 0;
}

static void close_socket(dl_comms *c)
{
    if (c->sock) DL_ZMQ_LOG(zmq_close(c->sock));
    c->sock = NULL;
    if (c->ctx) DL_ZMQ_LOG(zmq_ctx_term(c->ctx)); /* waits at most the Bye linger */
    c->ctx = NULL;
}

int dl_comms_start(dl_comms *c)
{
    assert(c && !c->started);
    int rc = open_socket(c);
    if (rc) rc = dl_err(DL_ENET, "connecting to %s: %s", c->endpoint, dl_errmsg());
    if (!rc) set_state(c, DL_COMMS_HELLO, NULL);
    if (!rc && pthread_create(&c->thread, NULL, comms_main, c) != 0)
        rc = dl_err(DL_ENET, "cannot start the comms thread");
    if (rc) {
        set_state(c, DL_COMMS_FAILED, "%s", dl_errmsg());
        close_socket(c);
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
    close_socket(c);
    c->started = 0;
}

void dl_comms_close(dl_comms **cp)
{
    if (!cp || !*cp) return;
    dl_comms *c = *cp;
    dl_comms_stop(c);
    dl_mailbox_detach(c->mb, c->link);
    free(c->f);
    free(c->served);
    free(c->send_spare);
    free(c->hv);
    free(c->fetch_list);
    free(c->numel);
    close(c->efd);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *cp = NULL;
}
