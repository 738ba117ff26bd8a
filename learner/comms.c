/* A learner's comms session: its lifecycle (open, start, stop, close), its DEALER socket (built, watched,
 * rebuilt) and its thread's loop, which hands what arrives to admission, the uplink or the downlink. */
#include "learner/comms_int.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/plan.h"
#include "core/shard.h"
#include "proto/auth.h"

#define DL_COMMS_HANDSHAKE_TRIES 3 /* failed CURVE handshakes before a first Welcome that end the session */

static void wake(dl_comms *c)
{
    uint64_t one = 1;
    /* EAGAIN only when the counter is saturated: the thread is already due to wake up */
    ssize_t n = write(c->efd, &one, sizeof one);
    (void)n;
}

/* libzmq freed a payload of ours (its I/O thread): the push window has room. */
static void queue_wake(void *ctx) { wake(ctx); }

/* ------------------------------------------------------------------------- */
/* mailbox */

int dl_comms_id_ok(const char *s) { return dl_wire_id_ok(s); }

uint64_t dl_comms_instance(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t inst;
    pthread_mutex_lock(&mu);
    while (!inst) {
        /* the kernel's randomness; the clock and pid only if it fails (never 0) */
        if (getrandom(&inst, sizeof inst, 0) != (ssize_t)sizeof inst)
            inst = dl_hash64(&(uint64_t[2]){(uint64_t)dl_clock_ns(), (uint64_t)getpid()}, 16, 0) | 1;
    }
    uint64_t v = inst;
    pthread_mutex_unlock(&mu);
    return v;
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what)
{
    if (!src) src = "";
    if (strlen(src) >= cap) return dl_err(DL_EINVAL, "%s is %zu bytes, max %zu", what, strlen(src), cap - 1);
    memcpy(dst, src, strlen(src) + 1);
    return 0;
}

#define DEF(v, d) ((v) > 0 ? (v) : (d))

/* The CURVE options: all three keys or none, each Z85, and a libzmq with CURVE. */
static int check_curve(const dl_comms_opts *o)
{
    const char *k[3] = {o->curve_server, o->curve_public, o->curve_secret};
    static const char *const name[3] = {"synchronizer public", "learner public", "learner secret"};
    int n = 0;
    for (int i = 0; i < 3; i++) n += k[i][0] != 0;
    if (n == 0) return 0;
    if (n != 3)
        return dl_err(DL_EINVAL, "comms: CURVE needs the synchronizer's public key and this learner's key pair "
                                 "(%d of the 3 keys given)", n);
    for (int i = 0; i < 3; i++)
        if (!dl_auth_z85_ok(k[i]))
            return dl_err(DL_EINVAL, "comms: the CURVE %s key is not 40 Z85 characters", name[i]);
    if (!zmq_has("curve")) return dl_err(DL_EINVAL, "comms: CURVE keys given, but this libzmq was built without CURVE");
    return 0;
}

int dl_comms_check_timeouts(const dl_comms_opts *o, int push_decision_timeout_ms)
{
    int poll = DEF(o->poll_max_ms, 100), retry = DEF(o->hello_retry_ms, 1000), cap = DEF(o->hello_retry_max_ms, 16000),
        unsent = DEF(o->hello_unsent_ms, 20),
        connect = o->connect_timeout_ms < 0 ? -1 : DEF(o->connect_timeout_ms, 30000), /* < 0: no bound */
        silence = DEF(o->silence_min_ms, 1000), expiry = DEF(o->ack_expiry_min_ms, 5000),
        reconnect = DEF(o->reconnect_ms, 100), reconnect_max = DEF(o->reconnect_max_ms, 1000);
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
    if (connect > 0 && !(retry < connect))
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
    DL_TRY(check_curve(o));
    if (o->byzantine && !(isfinite(o->byzantine_scale) && fabs(o->byzantine_scale) <= 1e6))
        return dl_err(DL_EINVAL, "comms: byzantine scale %g is not finite in [-1e6, 1e6]", o->byzantine_scale);
    dl_codec pc = o->push_codec.id ? o->push_codec : (dl_codec){.id = DL_CODEC_FP32};
    char cwhy[160];
    if (dl_codec_check(&pc, cwhy, sizeof cwhy)) return dl_err(DL_EINVAL, "comms: push codec: %s", cwhy);
    if (o->push_rounding != DL_ROUND_NEAREST && o->push_rounding != DL_ROUND_STOCHASTIC)
        return dl_err(DL_EINVAL, "comms: push rounding %d is not nearest or stochastic", o->push_rounding);
    int P = dl_plan_P(o->plan);
    if (P != dl_mailbox_P(o->mailbox)) return dl_err(DL_EINVAL, "comms: plan has %d fragments, mailbox %d", P,
                                                     dl_mailbox_P(o->mailbox));
    if (dl_shard_check(P, o->shard, o->shards)) return dl_err(DL_EINVAL, "comms: shard layout: %s", dl_errmsg());
    dl_comms *c = dl_try_calloc(1, sizeof *c);
    if (!c || !(c->f = dl_try_calloc((size_t)P, sizeof *c->f))) {
        free(c);
        return dl_err(DL_ENOMEM, "comms: out of memory");
    }
    c->shard = o->shards > 1 ? o->shard : 0;
    c->shards = o->shards > 1 ? o->shards : 1;
    int rc = 0;
    if (o->fragments) {
        for (int i = 0; i < o->n_fragments && !rc; i++) {
            int p = o->fragments[i];
            if (p < 0 || p >= P || c->f[p].served)
                rc = dl_err(DL_EINVAL, "comms: fragment %d listed twice or not in [0, %d)", p, P);
            else if (!dl_shard_owns(p, c->shard, c->shards))
                rc = dl_err(DL_EINVAL, "comms: fragment %d belongs to shard %d, not to this session's shard %d of %d", p,
                            dl_shard_of(p, c->shards), c->shard, c->shards);
            else c->f[p].served = 1;
        }
        if (!rc && o->n_fragments < 1) rc = dl_err(DL_EINVAL, "comms: empty fragment list");
    } else {
        for (int p = 0; p < P; p++) c->f[p].served = dl_shard_owns(p, c->shard, c->shards);
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
    pthread_mutex_init(&c->mu, NULL);
    /* from here on dl_comms_close undoes a half-open session */
    c->served = dl_try_calloc((size_t)P, sizeof *c->served);
    for (int p = 0; c->served && p < P; p++)
        if (c->f[p].served) c->served[c->n_served++] = p;
    c->fingerprint = o->fingerprint;
    c->n_layer = o->n_layer;
    c->n_head = o->n_head;
    c->n_embd = o->n_embd;
    c->seq_len = o->seq_len;
    c->vocab = o->vocab;
    c->batch = o->batch;
    c->manifest = o->manifest;
    c->max_tokens_per_step = o->manifest ? o->max_tokens_per_step : 0;
    c->instance = o->instance ? o->instance : dl_comms_instance();
    memcpy(c->curve_server, o->curve_server, sizeof c->curve_server);
    memcpy(c->curve_public, o->curve_public, sizeof c->curve_public);
    memcpy(c->curve_secret, o->curve_secret, sizeof c->curve_secret);
    c->max_jump = o->max_version_jump ? o->max_version_jump : DL_COMMS_MAX_VERSION_JUMP;
    c->adopt_keep = o->adopt_keep != 0;
    c->byzantine = o->byzantine != 0;
    c->byz_scale = (float)o->byzantine_scale;
    c->penc = (dl_codec_enc){.c = pc, .rounding = (dl_codec_rounding)o->push_rounding};
    c->hello_retry_ms = DEF(o->hello_retry_ms, 1000);
    c->hello_retry_max_ms = DEF(o->hello_retry_max_ms, 16000);
    c->hello_unsent_ms = DEF(o->hello_unsent_ms, 20);
    c->connect_timeout_ms = o->connect_timeout_ms < 0 ? -1 : DEF(o->connect_timeout_ms, 30000);
    c->poll_max_ms = DEF(o->poll_max_ms, 100);
    c->silence_min_ms = DEF(o->silence_min_ms, 1000);
    c->silence_rebuild_ms = DEF(o->silence_rebuild_ms, 30000);
    c->ack_expiry_min_ms = DEF(o->ack_expiry_min_ms, 5000);
    c->bye_linger_ms = DEF(o->bye_linger_ms, 1000);
    c->reconnect_ms = DEF(o->reconnect_ms, 100);
    c->reconnect_max_ms = DEF(o->reconnect_max_ms, 1000);
    c->tcp_stall_ms = o->tcp_stall_ms < 0 ? -1 : DEF(o->tcp_stall_ms, 10000);
    c->maxn = dl_mailbox_buf_numel(o->mailbox);
    c->numel = dl_try_calloc((size_t)P, sizeof *c->numel);
    size_t maxserved = 0;
    for (int p = 0; c->numel && p < P; p++) {
        c->numel[p] = dl_plan_fragment_numel(o->plan, p);
        if (c->f[p].served && c->numel[p] > maxserved) maxserved = (size_t)c->numel[p];
    }
    /* No frame we accept is larger: libzmq drops the connection on one that
     * is. Every delta codec is at most the fp32 size except topk with k >
     * 2/3 of the block (6 bytes per entry): such a delta must come chunked
     * (Hello.max_chunk_bytes). */
    c->maxmsg = maxserved * sizeof(float) + DL_WIRE_MAX_HEADER_BYTES;
    c->send_spare = dl_mailbox_buf_alloc(o->mailbox);
    if (c->byzantine) c->byz_buf = dl_mailbox_buf_alloc(o->mailbox);
    c->refusals = dl_try_calloc((size_t)c->n_served, sizeof *c->refusals);
    c->t_fetch = NEVER;
    c->hv = dl_try_calloc((size_t)P, sizeof *c->hv);
    c->fetch_list = dl_try_calloc((size_t)P, sizeof *c->fetch_list);
    c->final_pending = dl_try_calloc((size_t)P, sizeof *c->final_pending);
    c->resume_v = dl_try_calloc((size_t)P, sizeof *c->resume_v);
    c->resume_o = dl_try_calloc((size_t)P, sizeof *c->resume_o);
    c->outq = dl_wire_queue_try_new();
    /* residuals only for what an encoded push leaves out (fp32 leaves out nothing) */
    if (!c->served || !c->numel || !c->send_spare || (c->byzantine && !c->byz_buf) || !c->refusals || !c->hv ||
        !c->fetch_list || !c->final_pending || !c->resume_v || !c->resume_o || !c->outq ||
        (rc = dl_ef_open(P, c->numel, o->error_feedback && pc.id != DL_CODEC_FP32, &c->ef))) {
        dl_comms_close(&c);
        return rc ? rc : dl_err(DL_ENOMEM, "comms: session buffers: out of memory");
    }
    dl_wire_queue_set_wake(c->outq, queue_wake, c);
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

/* The learner holds every fragment this session serves (a restored state, before any Welcome). */
static int holds_served(dl_comms *c)
{
    uint64_t v;
    for (int p = 0; p < c->P; p++)
        if (c->f[p].served && !dl_mailbox_held(c->mb, p, &v)) return 0;
    return 1;
}

dl_ef *dl_comms_ef(dl_comms *c, int p) { return p >= 0 && p < c->P && c->f[p].served ? c->ef : NULL; }

uint32_t dl_comms_h(dl_comms *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t h = c->st.h;
    pthread_mutex_unlock(&c->mu);
    return h;
}

double dl_comms_fleet_sps(dl_comms *c)
{
    pthread_mutex_lock(&c->mu);
    double r = c->st.fleet_steps_per_s;
    pthread_mutex_unlock(&c->mu);
    return r;
}

void dl_comms_stats_add(dl_comms_stats *acc, const dl_comms_stats *s)
{
    uint64_t *a[] = {&acc->pushes, &acc->push_bytes, &acc->acks_pending, &acc->accepted, &acc->dropped_stale,
                     &acc->rejected, &acc->updates, &acc->hellos, &acc->rehellos, &acc->fetches,
                     &acc->heartbeats_sent, &acc->heartbeats_recv, &acc->errors_recv, &acc->bad_msgs, &acc->old_epoch,
                     &acc->newer_epoch, &acc->updates_refused, &acc->updates_old, &acc->welcomes_refused,
                     &acc->refetches, &acc->rebuilds, &acc->bytes_sent, &acc->bytes_recv, &acc->chunks_sent,
                     &acc->chunks_recv, &acc->chunks_dropped, &acc->busy, &acc->pushes_stopped, &acc->staleness_sum,
                     &acc->staleness_n, &acc->updates_delta, &acc->updates_delta_missed};
    const uint64_t *b[] = {&s->pushes, &s->push_bytes, &s->acks_pending, &s->accepted, &s->dropped_stale,
                           &s->rejected, &s->updates, &s->hellos, &s->rehellos, &s->fetches,
                           &s->heartbeats_sent, &s->heartbeats_recv, &s->errors_recv, &s->bad_msgs, &s->old_epoch,
                           &s->newer_epoch, &s->updates_refused, &s->updates_old, &s->welcomes_refused,
                           &s->refetches, &s->rebuilds, &s->bytes_sent, &s->bytes_recv, &s->chunks_sent,
                           &s->chunks_recv, &s->chunks_dropped, &s->busy, &s->pushes_stopped, &s->staleness_sum,
                           &s->staleness_n, &s->updates_delta, &s->updates_delta_missed};
    _Static_assert(sizeof a == sizeof b, "the same counters");
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) *a[i] += *b[i];
    acc->coalesced = s->coalesced;
    acc->discarded = s->discarded;
    acc->superseded = s->superseded;
    if (s->h) acc->h = s->h;
    if (s->heartbeat_ms) acc->heartbeat_ms = s->heartbeat_ms;
    if (s->epoch > acc->epoch) acc->epoch = s->epoch;
    if (s->fleet_steps_per_s > 0) acc->fleet_steps_per_s = s->fleet_steps_per_s; /* the last session's that has one */
}

/* ------------------------------------------------------------------------- */
/* comms thread: helpers */

void dl_comms_set_state(dl_comms *c, int state, const char *fmt, ...)
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

/* A refusal that cannot heal by retrying (run id, model shape, fragment
 * count, key, duplicate id): the session stops, the learner exits 3 with the
 * reason (docs/PROTOCOL.md "Errors"). kind: the wire ErrorKind's name, or
 * "unauthorized" for a key its ZAP handler denied; text: the reason as logs
 * show it (quoted, escaped), raw: as received (dl_event_str escapes it). */
void dl_comms_refuse(dl_comms *c, const char *kind, const char *text, const char *raw)
{
    dl_comms_set_state(c, DL_COMMS_REFUSED, "synchronizer at %s refused learner %s (%s): %s", c->endpoint, c->id, kind,
                       text);
    DL_ERROR("comms: refused by the synchronizer (%s): %s", kind, text);
    char ev[1200];
    dl_event("refused", " learner=%s epoch=%llu kind=%s reason=%s", c->id, (unsigned long long)c->epoch, kind,
             dl_event_str(raw, ev, sizeof ev));
}

/* Text from the network (Error.message, Ack.reason, Welcome.policy, a run
 * id) for a log line: always quoted, '"' and '\' escaped, every byte outside
 * printable ASCII as \xHH, so no peer can break or forge a line (proto/wire.c
 * already refuses control bytes; this holds even if it did not). Cut to fit
 * cap (>= 3), never inside an escape. */
const char *dl_comms_net_str(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[n++] = '"';
    for (const unsigned char *q = (const unsigned char *)(s ? s : ""); *q; q++) {
        char esc[5];
        size_t len = 1;
        if (*q == '"' || *q == '\\') esc[0] = '\\', esc[1] = (char)*q, len = 2;
        else if (*q < 0x20 || *q >= 0x7f) len = (size_t)snprintf(esc, sizeof esc, "\\x%02x", *q);
        else esc[0] = (char)*q;
        if (n + len + 2 > cap) break;
        memcpy(buf + n, esc, len);
        n += len;
    }
    buf[n++] = '"';
    buf[n] = 0;
    return buf;
}

/* Send one message (at most one payload of len bytes). Never blocks: at the
 * high-water mark, or without a socket (between a rebuild and its reopen), it
 * returns DL_EAGAIN and the caller keeps the data for later. */
int dl_comms_send_env(dl_comms *c, Dloco__V1__Envelope *env, const void *payload, size_t bytes_len)
{
    if (!c->sock) return DL_EAGAIN;
    env->seq = ++c->seq;
    const void *pl[1] = {payload};
    size_t len[1] = {bytes_len};
    dl_wire_queue *q[2] = {c->outq, NULL};
    int rc = dl_wire_send_q(c->sock, NULL, 0, env, pl, len, payload ? 1 : 0, ZMQ_DONTWAIT, payload ? q : NULL);
    if (rc == 0) {
        c->sent_on_sock = 1;
        uint64_t bytes = dloco__v1__envelope__get_packed_size(env) + (payload ? len[0] : 0);
        pthread_mutex_lock(&c->mu);
        c->st.bytes_sent += bytes;
        pthread_mutex_unlock(&c->mu);
    } else if (rc == DL_ENET) {
        dl_comms_set_state(c, DL_COMMS_FAILED, "socket to %s failed: %s", c->endpoint, dl_errmsg());
    } else if (rc != DL_EAGAIN) {
        DL_ERROR("comms: could not send %s: %s", dl_wire_body_name(env->body_case), dl_errmsg());
    }
    return rc;
}

/* ------------------------------------------------------------------------- */
/* comms thread: the socket */

/* DEALER, its options, its monitor, connect. Returns 0 or the DL_E* code
 * (what was made is closed again). */
static int open_socket_(dl_comms *c)
{
    DL_ZMQ_PTR(c->sock, zmq_socket(c->ctx, ZMQ_DEALER));
    DL_TRY(dl_wire_sock_setup(c->sock, 0, c->maxmsg));
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL, &c->reconnect_ms, sizeof c->reconnect_ms));
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL_MAX, &c->reconnect_max_ms, sizeof c->reconnect_max_ms));
    /* After an outage TCP retransmits with exponential backoff: a connection
     * whose bytes sat unacknowledged through a 15 s partition resent them
     * only 21.5 s after the link was back (bench/wan.sh, 2026-12-05), and a
     * SYN sent during it waits 1, 2, 4, ... s the same way. So a connection
     * stalled tcp_stall_ms is dropped by the kernel (the monitor's
     * DISCONNECTED rebuilds the socket), and a connect attempt is made again
     * after at most DL_COMMS_CONNECT_ATTEMPT_MS: the new connection comes up
     * within about that and reconnect_max_ms of the link's return. */
    if (c->tcp_stall_ms > 0) {
        int attempt = c->tcp_stall_ms < DL_COMMS_CONNECT_ATTEMPT_MS ? c->tcp_stall_ms : DL_COMMS_CONNECT_ATTEMPT_MS;
        DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_TCP_MAXRT, &c->tcp_stall_ms, sizeof c->tcp_stall_ms));
        DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_CONNECT_TIMEOUT, &attempt, sizeof attempt));
    }
    /* Queue nothing while disconnected: sends fail with EAGAIN instead, so
     * pushes wait (and coalesce) in their slots, and Hellos retried during
     * an outage do not pile up to be answered all at once on reconnect. */
    int one = 1;
    DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one));
    if (c->curve_server[0]) {
        DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, c->curve_server, 40));
        DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, c->curve_public, 40));
        DL_ZMQ_CALL(zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, c->curve_secret, 40));
    }
    /* The monitor tells a dead connection: libzmq does not reconnect after
     * an oversized frame or a failed handshake, so the session rebuilds. */
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://dloco-comms-monitor-%p-%u", (void *)c, ++c->mon_seq);
    DL_ZMQ_CALL(zmq_socket_monitor(c->sock, ep,
                                   ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH));
    DL_ZMQ_PTR(c->mon, zmq_socket(c->ctx, ZMQ_PAIR));
    int zero = 0;
    DL_ZMQ_CALL(zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero));
    DL_ZMQ_CALL(zmq_connect(c->mon, ep));
    DL_ZMQ_CALL(zmq_connect(c->sock, c->endpoint));
    return 0;
}

static void drop_socket(dl_comms *c)
{
    dl_comms_uplink_abort(c, 1, 0, "connection_closed"); /* the synchronizer drops what came of it */
    if (c->sock && c->mon) DL_ZMQ_LOG(zmq_socket_monitor(c->sock, NULL, 0));
    if (c->mon) DL_ZMQ_LOG(zmq_close(c->mon));
    if (c->sock) DL_ZMQ_LOG(zmq_close(c->sock));
    c->mon = c->sock = NULL;
    c->sent_on_sock = 0;
}

static int open_socket(dl_comms *c)
{
    int rc = open_socket_(c);
    if (rc) drop_socket(c);
    else c->t_sock = dl_clock_ns();
    return rc;
}

/* Close the DEALER and open a new one (a new connection, a new routing id):
 * at once the first time in a row, else after reconnect_ms doubling up to
 * reconnect_max_ms. A welcomed session re-hellos (a waiting one keeps
 * retrying its Hello, which leaves as soon as the new socket connects).
 * `reason` is the event's word, `why` the log line's. */
static void rebuild(dl_comms *c, const char *reason, const char *why)
{
    drop_socket(c);
    c->rebuilds_row++;
    int64_t delay = 0;
    /* a learner without keys whose handshakes fail before any Welcome is most likely talking to a
     * CURVE synchronizer, but libzmq says so (the mechanism mismatch that ends the session) only
     * when the greeting is read before the close; on a loaded machine most attempts end in a bare
     * EPIPE, so it tries again at reconnect_ms instead of backing off to reconnect_max_ms */
    int keyless_hs = !c->curve_server[0] && !c->ever_welcomed && !strcmp(reason, "handshake_failed");
    if (c->rebuilds_row > 1) {
        delay = c->reconnect_ms;
        for (int i = 2; i < c->rebuilds_row && delay < c->reconnect_max_ms && !keyless_hs; i++) delay *= 2;
        if (delay > c->reconnect_max_ms) delay = c->reconnect_max_ms;
    }
    int64_t now = dl_clock_ns();
    c->t_reopen = now + delay * MS;
    c->any_epoch = 1; /* nothing of an earlier incarnation can arrive on the new connection */
    c->bad_row = 0;
    c->rebuild_bad = !strcmp(reason, "bad_messages");
    COUNT(rebuilds);
    snprintf(c->conn_err, sizeof c->conn_err, "%s", why);
    dl_comms_set_state(c, c->state, "last connection problem: %s", why); /* what a timed-out wait reports */
    DL_WARN("comms: %s; new connection to %s in %lld ms", why, c->endpoint, (long long)delay);
    char ev[400];
    dl_event("socket_rebuild", " learner=%s epoch=%llu reason=%s rebuilds=%d delay_ms=%lld detail=%s", c->id,
             (unsigned long long)c->epoch, reason, c->rebuilds_row, (long long)delay,
             dl_event_str(why, ev, sizeof ev));
    if (c->state == DL_COMMS_READY) {
        dl_comms_admit_rehello(c, why, 0);
    } else {
        c->hello_unsent = 1; /* Hello again as soon as the new socket is connected */
        c->t_hello = now;
    }
}

/* Drain the monitor. Returns 1 when the connection died (c->conn_err says how). */
static int monitor_lost(dl_comms *c)
{
    int lost = 0, handshake = 0; /* a handshake failure says more than the disconnect that follows it */
    for (;;) {
        zmq_msg_t a;
        zmq_msg_init(&a);
        if (zmq_msg_recv(&a, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            break;
        }
        uint16_t ev = 0;
        uint32_t val = 0;
        if (zmq_msg_size(&a) >= 6) {
            memcpy(&ev, zmq_msg_data(&a), 2);
            memcpy(&val, (const char *)zmq_msg_data(&a) + 2, 4);
        }
        int more = zmq_msg_more(&a);
        zmq_msg_close(&a);
        while (more) { /* the endpoint frame */
            zmq_msg_t b;
            zmq_msg_init(&b);
            more = zmq_msg_recv(&b, c->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&b);
            zmq_msg_close(&b);
        }
        if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            c->hs_failed = 0; /* the server key is right: later failures are the network's */
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            if (!handshake) snprintf(c->conn_err, sizeof c->conn_err, "connection to %s lost", c->endpoint);
            lost = 1;
        } else if (ev & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
            int auth = ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
            /* one side speaks CURVE and the other not: a setting, never the network */
            int mismatch = ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH;
            if (auth && val == 400) c->auth_denied = 1; /* ZAP's permanent "no": 300/500 are temporary */
            if (!auth) c->hs_failed++;
            c->hs_mismatch = mismatch;
            if (mismatch && !c->curve_server[0])
                snprintf(c->conn_err, sizeof c->conn_err,
                         "the synchronizer at %s requires CURVE keys and this learner has none: give --server_key (the "
                         "synchronizer's .pub) and --key_file (this learner's .key from dloco keygen, its public key in "
                         "the synchronizer's allowlist; docs/SECURITY.md)", c->endpoint);
            else if (mismatch)
                snprintf(c->conn_err, sizeof c->conn_err,
                         "the synchronizer at %s does not use CURVE but this learner has --server_key: start it with "
                         "--key_file and --allowlist, or drop --server_key and --key_file (docs/SECURITY.md)", c->endpoint);
            else if (auth && c->curve_server[0])
                snprintf(c->conn_err, sizeof c->conn_err,
                         "handshake with %s failed (authentication, code %u): the synchronizer refused this learner's "
                         "key %s: add '<learner id> %s' to its allowlist and kill -HUP it", c->endpoint, val,
                         c->curve_public, c->curve_public);
            else
                snprintf(c->conn_err, sizeof c->conn_err, "handshake with %s failed (%s, code %u%s)", c->endpoint,
                         auth ? "authentication" : ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol" : "no detail",
                         val, c->curve_server[0] ? "; is server_key the synchronizer's public key?" : "");
            lost = handshake = 1;
        }
    }
    return lost;
}

/* ------------------------------------------------------------------------- */
/* comms thread: inbound */

/* Handle one validated message. Returns 1 when the thread must stop. */
static int handle(dl_comms *c, dl_wire_msg *m)
{
    Dloco__V1__Envelope *env = m->env;
    uint64_t bytes = dloco__v1__envelope__get_packed_size(env);
    for (int i = 0; i < m->npayload; i++) bytes += dl_wire_msg_payload_len(m, i);
    pthread_mutex_lock(&c->mu);
    c->st.bytes_recv += bytes;
    pthread_mutex_unlock(&c->mu);
    Dloco__V1__Envelope__BodyCase body = env->body_case;

    if (strcmp(env->run_id ? env->run_id : "", c->run_id) != 0 ||
        strcmp(env->learner_id ? env->learner_id : "", c->id) != 0) {
        /* Error may carry an empty learner_id (proto/wire.h). */
        int is_err = body == DLOCO__V1__ENVELOPE__BODY_ERROR;
        int for_us = !(env->learner_id && env->learner_id[0]) || !strcmp(env->learner_id, c->id);
        int anon_error = is_err && !(env->learner_id && env->learner_id[0]) &&
                         !strcmp(env->run_id ? env->run_id : "", c->run_id);
        /* the answer to our Hello from a synchronizer of another run carries
         * that run's id: its fatal MISMATCH is the reason we will never get in */
        int run_refusal = is_err && for_us && c->state == DL_COMMS_HELLO && env->error->fatal &&
                          dl_wire_error_kind(env->error) == DLOCO__V1__ERROR_KIND__ERROR_KIND_MISMATCH;
        if (!anon_error && !run_refusal) {
            char r[NET_STR_CAP];
            DL_WARN("comms: %s for run %s learner '%s' ignored (this is run '%s' learner '%s')",
                    dl_wire_body_name(body), dl_comms_net_str(env->run_id, r, sizeof r), env->learner_id, c->run_id, c->id);
            COUNT(bad_msgs);
            return 0;
        }
    }
    /* Only a Welcome answering our Hello sets the epoch (on a new connection
     * whatever it is); Errors are read whatever their epoch (a restarted
     * synchronizer answers with its own). */
    int answer = body == DLOCO__V1__ENVELOPE__BODY_WELCOME && c->state == DL_COMMS_HELLO;
    int is_error = body == DLOCO__V1__ENVELOPE__BODY_ERROR;
    if (!c->ever_welcomed && !answer && !is_error) {
        DL_WARN("comms: %s before any welcome ignored", dl_wire_body_name(body));
        COUNT(bad_msgs);
        return 0;
    }
    if (env->epoch < c->epoch && !(answer && c->any_epoch)) {
        COUNT(old_epoch);
        DL_DEBUG("comms: %s from epoch %llu ignored (session epoch %llu)", dl_wire_body_name(body),
                 (unsigned long long)env->epoch, (unsigned long long)c->epoch);
        return 0;
    }
    if (env->epoch > c->epoch && !answer && !is_error) {
        /* "the synchronizer restarted": hello again, but the epoch stays
         * the welcomed one, so one absurd epoch cannot make later genuine
         * messages look older; the message itself is not used */
        COUNT(newer_epoch);
        char why[160];
        snprintf(why, sizeof why, "%s of epoch %llu, newer than the session's %llu (synchronizer restarted?)",
                 dl_wire_body_name(body), (unsigned long long)env->epoch, (unsigned long long)c->epoch);
        dl_comms_admit_rehello(c, why, 1);
        return 0;
    }
    c->t_recv = dl_clock_ns();
    /* what has reached us: the synchronizer bounds the Update bytes in flight by it (a new epoch's counter
     * starts with its Welcome) */
    if (answer || env->epoch == c->epoch) c->sync_seq = env->seq;
    dl_mailbox_heard(c->mb); /* the synchronizer answers: the initial fetch is waited for (dl_node_wait_ready) */

    switch (body) {
    case DLOCO__V1__ENVELOPE__BODY_WELCOME:
        /* a late duplicate (from a retried Hello) is ignored */
        if (answer) dl_comms_admit_welcome(c, env->epoch, env->welcome);
        else DL_DEBUG("comms: duplicate welcome ignored");
        return 0;
    case DLOCO__V1__ENVELOPE__BODY_UPDATE: dl_comms_downlink_update(c, env->update, m); return 0;
    case DLOCO__V1__ENVELOPE__BODY_ACK: dl_comms_uplink_ack(c, env->ack); return 0;
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT: COUNT(heartbeats_recv); return 0;
    case DLOCO__V1__ENVELOPE__BODY_ERROR: return dl_comms_admit_error(c, env->error);
    case DLOCO__V1__ENVELOPE__BODY_BYE:
        if (c->state == DL_COMMS_READY) dl_comms_admit_rehello(c, "synchronizer said bye", 0);
        return 0;
    default:
        DL_WARN("comms: unexpected %s from the synchronizer ignored", dl_wire_body_name(body));
        COUNT(bad_msgs);
        return 0;
    }
}

/* Drain the socket. Returns 1 when the thread must stop. */
static int recv_all(dl_comms *c)
{
    while (c->sock) {
        dl_wire_msg m;
        int rc = dl_wire_recv(c->sock, 0, &c->lim, &m, ZMQ_DONTWAIT);
        int stop = 0;
        if (rc == 0) {
            c->bad_row = 0;
            stop = handle(c, &m);
        } else if (rc == DL_EPROTO) {
            DL_WARN("comms: bad message from synchronizer dropped: %s", dl_errmsg());
            COUNT(bad_msgs);
            if (++c->bad_row >= DL_COMMS_BAD_IN_ROW) {
                char why[96];
                snprintf(why, sizeof why, "%d bad messages in a row from the synchronizer", c->bad_row);
                dl_wire_msg_close(&m);
                rebuild(c, "bad_messages", why);
                return 0;
            }
        } else if (rc == DL_EAGAIN) {
            dl_wire_msg_close(&m);
            return 0;
        } else {
            dl_comms_set_state(c, DL_COMMS_FAILED, "receiving from %s: %s", c->endpoint, dl_errmsg());
            stop = 1;
        }
        dl_wire_msg_close(&m);
        if (stop) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* comms thread: main loop */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The silence limit: max(silence_min_ms, liveness * heartbeat_ms of the last
 * Welcome, DL_COMMS_RX_CHUNKS chunk times of our downlink), ms. zmq shows a
 * message only once all of it arrived, and the synchronizer's heartbeats
 * travel behind the Update chunks it queued for us (up to two, plus its
 * kernel's buffer): on a thin link (a 1 MiB chunk takes 2.8 s at 3 Mbit/s)
 * a busy downlink is not a silent one, and a Hello sent then would wait
 * behind the same chunks. A chunk's time is measured (rx_chunk); before
 * the first measure, while a Fetch reply or the rest of an Update is owed
 * to us, it is a chunk at DL_COMMS_RX_FLOOR_BPS. At most
 * silence_rebuild_ms: after a slow spell a dead synchronizer is only
 * noticed later. */
#define DL_COMMS_RX_CHUNKS 3
#define DL_COMMS_RX_FLOOR_BPS (128 << 10)
int64_t dl_comms_silence_ms(const dl_comms *c)
{
    int64_t s = (int64_t)c->liveness * c->hb_ms;
    size_t chunk = c->chunk && c->chunk * sizeof(float) < c->maxmsg ? c->chunk * sizeof(float) : c->maxmsg;
    double chunk_ns = (double)chunk * c->rx_ns_per_byte;
    if (chunk_ns <= 0) {
        int owed = 0;
        for (int i = 0; i < c->n_served && !owed; i++) {
            const sfrag *f = &c->f[c->served[i]];
            owed = f->fetch_pending || (f->rx && f->rx_off > 0) || f->stage_active;
        }
        if (owed) chunk_ns = (double)chunk / DL_COMMS_RX_FLOOR_BPS * 1e9;
    }
    int64_t busy = (int64_t)(DL_COMMS_RX_CHUNKS * chunk_ns / MS);
    if (busy > c->silence_rebuild_ms) busy = c->silence_rebuild_ms;
    if (s < busy) s = busy;
    return s < c->silence_min_ms ? c->silence_min_ms : s;
}

/* The socket is rebuilt only after a longer silence: max(silence_rebuild_ms,
 * 4 x the silence limit). Until then silence re-hellos on the same socket,
 * because a single large Update (or the learner's own large push ahead of a
 * heartbeat) can take many seconds on a thin link, and closing the socket
 * would throw that transfer away and start it again, forever. */
static int64_t rebuild_silence_ms(const dl_comms *c)
{
    int64_t s = 4 * dl_comms_silence_ms(c);
    return s < c->silence_rebuild_ms ? c->silence_rebuild_ms : s;
}

/* Since when the current connection has been silent: its last message, or its opening. */
static int64_t heard(const dl_comms *c) { return c->t_recv > c->t_sock ? c->t_recv : c->t_sock; }

static void *comms_main(void *arg)
{
    dl_comms *c = arg;
    /* Signals belong to the training thread (it finishes the step and flushes). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);

    c->t_start = c->t_warn = c->t_recv = dl_clock_ns();
    dl_comms_admit_hello(c);
    int blocked = 0;
    while (c->state == DL_COMMS_HELLO || c->state == DL_COMMS_READY) {
        int64_t now = dl_clock_ns();
        int64_t wait = c->poll_max_ms;
        if (c->state == DL_COMMS_HELLO)
            wait = min64(wait, (c->t_hello + (c->hello_unsent ? c->hello_unsent_ms : c->hello_wait_ms) * MS - now) / MS);
        if (c->state == DL_COMMS_READY) {
            wait = min64(wait, (c->t_hb + c->hb_ms * MS - now) / MS);
            if (c->t_fetch != NEVER) wait = min64(wait, (c->t_fetch - now) / MS + 1);
        }
        if (!c->sock) wait = min64(wait, (c->t_reopen - now) / MS + 1);
        if (blocked) wait = min64(wait, 10);
        if (wait < 0) wait = 0;
        zmq_pollitem_t items[3] = {{NULL, c->efd, ZMQ_POLLIN, 0}};
        int nitems = 1;
        if (c->sock) items[nitems++] = (zmq_pollitem_t){c->sock, 0, ZMQ_POLLIN, 0};
        if (c->mon) items[nitems++] = (zmq_pollitem_t){c->mon, 0, ZMQ_POLLIN, 0};
        int prc = DL_ZMQ_RC(zmq_poll(items, nitems, (long)wait));
        if (prc < 0 && prc != DL_EAGAIN) { /* DL_EAGAIN: EINTR */
            dl_comms_set_state(c, DL_COMMS_FAILED, "%s", dl_errmsg());
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
            dl_comms_set_state(c, DL_COMMS_DONE, NULL);
            break;
        }
        /* what arrived before a connection died is still read */
        if (recv_all(c)) break;
        if (c->mon && monitor_lost(c)) {
            char why[sizeof c->conn_err];
            snprintf(why, sizeof why, "%s", c->conn_err);
            if (c->auth_denied) {
                dl_comms_refuse(c, "unauthorized", why, why);
                break;
            }
            /* a CURVE client whose server_key is not the synchronizer's
             * fails every handshake without a status; before any Welcome,
             * DL_COMMS_HANDSHAKE_TRIES in a row with none succeeding between
             * (a synchronizer that restarts or resets connections completes
             * handshakes too) are taken as that */
            if ((c->curve_server[0] || c->hs_mismatch) && !c->ever_welcomed && c->hs_failed >= DL_COMMS_HANDSHAKE_TRIES) {
                char r[sizeof why + 64];
                snprintf(r, sizeof r, "%s (%d handshakes in a row, none ever welcomed)", why, c->hs_failed);
                dl_comms_refuse(c, "handshake", r, r);
                break;
            }
            rebuild(c, strstr(why, "handshake") ? "handshake_failed" : "disconnected", why);
        }

        now = dl_clock_ns();
        if (!c->sock && now >= c->t_reopen && open_socket(c)) {
            dl_comms_set_state(c, DL_COMMS_FAILED, "reconnecting to %s: %s", c->endpoint, dl_errmsg());
            break;
        }
        if (c->state == DL_COMMS_READY) dl_comms_downlink_timeouts(c, now);
        dl_comms_downlink_refetches(c, now);
        if (c->state == DL_COMMS_HELLO) {
            /* the bound is on joining: a learner that holds its fragments (restored from its state) trains,
             * and keeps trying as a learner without a bound does */
            if (!c->ever_welcomed && c->connect_timeout_ms > 0 && now - c->t_start >= c->connect_timeout_ms * MS &&
                !holds_served(c)) {
                dl_comms_set_state(c, DL_COMMS_FAILED,
                          "no Welcome from %s within %d ms (is dloco-sync running there with run_id '%s'?%s%s)",
                          c->endpoint, c->connect_timeout_ms, c->run_id, c->conn_err[0] ? " last problem: " : "",
                          c->conn_err);
                break;
            }
            if (!c->ever_welcomed && (c->connect_timeout_ms < 0 || holds_served(c)) &&
                now - c->t_warn >= DL_COMMS_WAIT_NOTE_MS * MS) {
                /* no bound: a learner started while its synchronizer is down or out of reach waits for it */
                long long s = (long long)((now - c->t_start) / (1000 * MS));
                DL_WARN("still no Welcome from %s after %lld s; retrying (is dloco-sync running there with run_id "
                        "'%s'?%s%s)", c->endpoint, s, c->run_id, c->conn_err[0] ? " last problem: " : "", c->conn_err);
                char ev_ep[300];
                dl_event("connect_waiting", " learner=%s endpoint=%s waited_s=%lld", c->id,
                         dl_event_str(c->endpoint, ev_ep, sizeof ev_ep), s);
                c->t_warn = now;
            }
            int64_t note_ms = c->connect_timeout_ms > 0 ? c->connect_timeout_ms : DL_COMMS_WAIT_NOTE_MS;
            if (c->ever_welcomed && now - c->t_warn >= note_ms * MS) {
                DL_WARN("comms: still no Welcome from %s after %lld ms; training goes on, retrying", c->endpoint,
                        (long long)note_ms);
                c->t_warn = now;
            }
            if (now - c->t_hello >= (c->hello_unsent ? c->hello_unsent_ms : c->hello_wait_ms) * MS) {
                /* An unanswered Hello on a connection silent for the whole
                 * silence limit: the synchronizer may have stopped reading it
                 * (or a peer displaced it); a new connection, then the retry. */
                if (!c->hello_unsent && c->sent_on_sock && now - heard(c) >= rebuild_silence_ms(c) * MS) {
                    char why[128];
                    snprintf(why, sizeof why, "no answer from the synchronizer for %lld ms",
                             (long long)((now - heard(c)) / MS));
                    rebuild(c, "silence", why);
                } else {
                    dl_comms_admit_hello(c);
                }
            }
        } else if (c->state == DL_COMMS_READY) {
            if (now - heard(c) >= dl_comms_silence_ms(c) * MS) {
                /* the same socket first: a rebuild follows if the silence lasts */
                char why[96];
                snprintf(why, sizeof why, "no message from the synchronizer for %lld ms",
                         (long long)dl_comms_silence_ms(c));
                dl_comms_admit_rehello(c, why, 0);
            } else if (now - c->t_hb >= c->hb_ms * MS) {
                dl_comms_admit_heartbeat(c);
            }
        }
        blocked = 0;
        if (c->state == DL_COMMS_READY) {
            if (c->t_fetch <= now) dl_comms_downlink_fetch(c, now);
            blocked = dl_comms_uplink_send(c, now);
        }
        if (bye) {
            if (c->ever_welcomed && (c->state == DL_COMMS_READY || c->state == DL_COMMS_HELLO)) {
                dl_comms_admit_bye(c, reason, bye_step);
                DL_INFO("comms: bye sent (%s, step %llu)", reason, (unsigned long long)bye_step);
            }
            if (c->state == DL_COMMS_READY || c->state == DL_COMMS_HELLO) dl_comms_set_state(c, DL_COMMS_DONE, NULL);
            break;
        }
    }
    drop_socket(c);
    return NULL;
}

static void close_socket(dl_comms *c)
{
    drop_socket(c);
    if (c->outq) dl_wire_queue_set_wake(c->outq, NULL, NULL);
    if (c->ctx) DL_ZMQ_LOG(zmq_ctx_term(c->ctx)); /* waits at most the Bye linger */
    c->ctx = NULL;
}

int dl_comms_start(dl_comms *c)
{
    assert(c && !c->started);
    int rc = 0;
    if (!(c->ctx = zmq_ctx_new())) rc = dl_wire_zmq_fail("zmq_ctx_new()", __FILE__, __LINE__);
    if (!rc) rc = open_socket(c);
    if (rc) rc = dl_err(DL_ENET, "connecting to %s: %s", c->endpoint, dl_errmsg());
    if (!rc) dl_comms_set_state(c, DL_COMMS_HELLO, NULL);
    if (!rc) {
        /* fragments held before any Welcome (restored from a saved state): how far the global
         * moved while the learner was down is unknown until the Welcome, so a keep learner holds
         * its pushes till then and then until it has adopted what the Welcome names, as after a
         * re-hello; pushed at once, the progress on the old bases went stale (dl_mailbox_set_behind
         * leaves fragments not held alone) */
        int64_t now = dl_clock_ns();
        for (int i = 0; i < c->n_served; i++) dl_mailbox_set_behind(c->mb, c->served[i], UINT64_MAX, now);
    }
    if (!rc && pthread_create(&c->thread, NULL, comms_main, c) != 0)
        rc = dl_err(DL_ENET, "cannot start the comms thread");
    if (rc) {
        dl_comms_set_state(c, DL_COMMS_FAILED, "%s", dl_errmsg());
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
    for (int p = 0; c->f && p < c->P; p++) {
        free(c->f[p].rx);
        free(c->f[p].enc);
        free(c->f[p].mirror);
        free(c->f[p].stage);
    }
    dl_ef_close(&c->ef);
    free(c->f);
    free(c->served);
    free(c->send_spare);
    free(c->byz_buf);
    free(c->refusals);
    free(c->hv);
    free(c->fetch_list);
    free(c->final_pending);
    free(c->resume_v);
    free(c->resume_o);
    dl_wire_queue_release(&c->outq);
    free(c->numel);
    close(c->efd);
    memset(c->curve_secret, 0, sizeof c->curve_secret);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *cp = NULL;
}
