/* A learner's comms session: one DEALER to one synchronizer on its own thread (hello, fetch,
 * flow-controlled pushes, acks, updates, heartbeats, re-hello, bye), serving fragments of a mailbox. */
#include "learner/comms.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
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
#include "kernels/codec.h"
#include "learner/ef.h"
#include "proto/auth.h"
#include "proto/wire.h"

#define MS ((int64_t)1000000) /* ns per ms */
#define DL_COMMS_HANDSHAKE_TRIES 3 /* failed CURVE handshakes before a first Welcome that end the session */
#define NEVER INT64_MAX

/* Session-side state of one fragment; comms thread only. */
typedef struct {
    int served;         /* this session pushes, fetches and receives fragment p */
    int unacked;        /* a push waits for its immediate ack */
    int64_t unacked_ns; /* when it was sent */
    int fetch_pending;  /* the next Update of p is a fetch reply */
    int fetch_soft;     /* ... asked for only because the mirror missed a delta: theta is fine, so the
                         * reply is adopted as a normal update (no rebase, the residual stays) */
    int rebase_pending; /* the next Update of p is a rebase: 2 after a DROPPED_STALE, 1 after a REJECTED */
    int fetch_want;     /* a Fetch of p is to be sent at fetch_at (a Welcome, or a refused update) */
    int64_t fetch_at;
    int64_t fetch_sent; /* when the pending Fetch of p left (dl_clock_ns) */
    uint64_t known;     /* newest version of p known: held, announced by the last Welcome, or received */
    int64_t busy_until; /* the synchronizer's pool was full: no push of p before this (dl_clock_ns) */
    /* a chunked Update arriving: elements [0, rx_off) of version rx_version
     * are in rx (kept across a re-hello or a new connection: a Fetch resumes
     * from there); NULL when none */
    float *rx;
    uint64_t rx_version, rx_off;
    uint64_t gap_at;    /* rx_off + 1 when a resume Fetch was asked for that gap (0: none) */
    int64_t rx_t;       /* when the latest chunk of p's Update (fp32 or delta) arrived (dl_clock_ns) */
    /* push encoding: the encoded push of p (dl_codec_bytes of numel_p; NULL
     * until its first encoded push) and how many pushes of p were encoded
     * (the stochastic rounding seed's counter) */
    uint8_t *enc;
    uint64_t encodes;
    /* delta Updates (Welcome.update_codec != 0 only): mirror = the fp32
     * values of version mirror_version, the last version of p this session
     * handed to the update slot (a full Update's values, or mirror + delta);
     * stage = version stage_version being assembled, elements [0, stage_off)
     * decoded onto the mirror. NULL while there is none. */
    float *mirror, *stage;
    uint64_t mirror_version, stage_version, stage_off;
    int mirror_ok, stage_active;
} sfrag;

/* The chunked push leaving (one at a time): chunks [0, off) of the claimed
 * push of fragment p have been handed to libzmq. */
typedef struct {
    int active, p;
    dl_mailbox_claim cl;
    uint64_t transfer, off;
    const uint8_t *payload; /* the whole push as encoded (fp32: the delta's bytes) */
} ptx;

struct dl_comms {
    /* ---- immutable after open */
    dl_mailbox *mb;
    int link; /* our number in the mailbox */
    int adopt_keep; /* dl_comms_opts.adopt_keep */
    char endpoint[256];
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    char run_id[129];
    char device[129];
    int P;
    int shard, shards; /* the synchronizer shard we talk to (shards >= 1; 1 = unsharded) */
    int *served; /* [n_served] the fragments we serve, ascending */
    int n_served;
    uint64_t *numel; /* [P] floats per fragment: a uint64 array because dl_wire_limits borrows it */
    size_t maxn;     /* floats per swapped buffer */
    uint64_t fingerprint;
    uint32_t n_layer, n_head, n_embd, seq_len, vocab, batch;
    const struct dl_manifest *manifest; /* borrowed; NULL: a GPT-2 learner */
    uint64_t max_tokens_per_step;       /* Hello.max_tokens_per_step of a manifest learner */
    uint64_t instance;      /* Hello.instance */
    char curve_server[41], curve_public[41], curve_secret[41]; /* Z85; "" = plain */
    uint64_t max_jump;  /* max_version_jump */
    int byzantine;
    float byz_scale;
    dl_codec_enc penc;  /* push codec, rounding (the seed is set per push) */
    size_t maxmsg;      /* ZMQ_MAXMSGSIZE: largest served fragment's fp32 bytes + header */
    int silence_rebuild_ms;
    int hello_retry_ms, hello_retry_max_ms, hello_unsent_ms, connect_timeout_ms, poll_max_ms, silence_min_ms,
        ack_expiry_min_ms, bye_linger_ms, reconnect_ms, reconnect_max_ms;
    int efd; /* eventfd: training thread (through the mailbox) -> this thread */

    /* ---- guarded by mu (read by other threads: stats and state) */
    pthread_mutex_t mu;
    int stop_req;
    dl_comms_stats st;
    char msg[640];

    /* ---- comms thread only */
    void *ctx, *sock;       /* sock NULL between a rebuild and its reopen (t_reopen) */
    void *mon;              /* PAIR reading the DEALER's socket monitor */
    unsigned mon_seq;       /* makes each monitor's inproc endpoint unique */
    pthread_t thread;
    int started;
    dl_wire_limits lim;
    sfrag *f;               /* [P] */
    float *send_spare;      /* [maxn] */
    float *byz_buf;         /* [maxn] byzantine only: the corrupted copy of a push's delta */
    int *refusals;          /* [n_served] scratch for dl_mailbox_take_refetches */
    uint64_t *hv;           /* [P] held_versions being sent (contiguous: it goes on the wire as is) */
    uint32_t *fetch_list;   /* [P] fragments of the next Fetch (likewise) */
    uint64_t *resume_v, *resume_o; /* [P] its resume points */
    uint64_t seq;
    uint64_t epoch;         /* epoch of the last Welcome taken (mirror of st.epoch) */
    int state;              /* mirror of st.state */
    int ever_welcomed;
    int hello_wait_ms, hello_sent_once; /* current Hello retry period (backoff) */
    uint32_t hb_ms, liveness;
    int64_t t_start, t_hello, t_hb, t_recv, t_warn;
    int64_t t_sock;         /* when the current socket was opened */
    double rx_ns_per_byte;  /* our downlink's pace between consecutive chunks of one Update, ns per payload byte
                             * (0: none seen; a moving mean): the synchronizer had the later chunk queued */
    int64_t t_reopen;       /* when a rebuilt socket opens (sock NULL until then) */
    int64_t t_fetch;        /* earliest fetch_at of a wanted Fetch, NEVER when none */
    int sent_on_sock;       /* a message left on the current socket */
    int any_epoch;          /* a new connection: its first Welcome is taken whatever its epoch */
    int rebuilds_row;       /* rebuilds in a row (their backoff): since the last Welcome, or after bad messages
                               since the last good Update or Ack (a Welcome alone does not prove the connection) */
    int rebuild_bad;        /* the latest rebuild was for bad messages */
    int64_t t_update_rx;    /* when the latest Update (or chunk of one) arrived, dl_clock_ns */
    int bad_row;            /* inbound messages rejected by proto/wire.c in a row */
    char conn_err[512];     /* the last connection problem, for the connect-timeout message */
    int auth_denied;        /* the synchronizer's ZAP refused this learner's key for good (status 400) */
    int hs_mismatch;        /* the last handshake failed on the security mechanism (CURVE on one side only) */
    int hs_failed;          /* CURVE handshakes failed in a row without a status (e.g. a wrong server_key);
                             * a handshake that succeeds resets it */
    int hello_unsent; /* the last Hello found no connection */
    int rr; /* round-robin start for fairness among fragments */
    dl_wire_queue *outq;    /* payload bytes of ours libzmq still holds (the push window) */
    uint64_t chunk;         /* push chunk, elements, from the last Welcome (0 = whole pushes) */
    uint64_t transfers;     /* transfer ids given out */
    ptx tx;                 /* the chunked push leaving */
    dl_ef *ef;              /* error feedback of encoded pushes (learner/ef.h) */
    uint32_t update_codec;  /* Welcome.update_codec of the last Welcome: delta Updates come (0: none) */
    uint64_t epoch_mirrors; /* the epoch whose versions the mirrors hold */
};

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
    c->reconnect_max_ms = DEF(o->reconnect_max_ms, 10000);
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
    c->resume_v = dl_try_calloc((size_t)P, sizeof *c->resume_v);
    c->resume_o = dl_try_calloc((size_t)P, sizeof *c->resume_o);
    c->outq = dl_wire_queue_try_new();
    /* residuals only for what an encoded push leaves out (fp32 leaves out nothing) */
    if (!c->served || !c->numel || !c->send_spare || (c->byzantine && !c->byz_buf) || !c->refusals || !c->hv ||
        !c->fetch_list || !c->resume_v || !c->resume_o || !c->outq ||
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

#define COUNT(field)                                                                                     \
    do {                                                                                                 \
        pthread_mutex_lock(&c->mu);                                                                      \
        c->st.field++;                                                                                   \
        pthread_mutex_unlock(&c->mu);                                                                    \
    } while (0)

/* A refusal that cannot heal by retrying (run id, model shape, fragment
 * count, key, duplicate id): the session stops, the learner exits 3 with the
 * reason (docs/PROTOCOL.md "Errors"). kind: the wire ErrorKind's name, or
 * "unauthorized" for a key its ZAP handler denied; text: the reason as logs
 * show it (quoted, escaped), raw: as received (dl_event_str escapes it). */
static void refuse(dl_comms *c, const char *kind, const char *text, const char *raw)
{
    set_state(c, DL_COMMS_REFUSED, "synchronizer at %s refused learner %s (%s): %s", c->endpoint, c->id, kind, text);
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
static const char *net_str(const char *s, char *buf, size_t cap)
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
#define NET_STR_CAP (4 * 1024 + 3) /* a max_text string, every byte escaped */

/* Send one message (at most one payload of len bytes). Never blocks: at the
 * high-water mark, or without a socket (between a rebuild and its reopen), it
 * returns DL_EAGAIN and the caller keeps the data for later. */
static int send_env(dl_comms *c, Dloco__V1__Envelope *env, const void *payload, size_t bytes_len)
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
    h.batch = c->batch;
    h.instance = c->instance;
    h.num_fragments = (uint32_t)c->P;
    h.device = c->device;
    /* any chunk up to our largest fragment (libzmq takes nothing bigger) */
    size_t mc = c->maxmsg - DL_WIRE_MAX_HEADER_BYTES;
    h.max_chunk_bytes = mc > DL_WIRE_CHUNK_MAX ? DL_WIRE_CHUNK_MAX : mc < DL_WIRE_CHUNK_MIN ? DL_WIRE_CHUNK_MIN : (uint32_t)mc;
    dl_wire_manifest_buf mbuf = {0};
    if (c->manifest) {
        if (dl_wire_hello_set_manifest(&h, c->manifest, &mbuf)) {
            DL_WARN("comms: hello not sent: %s", dl_errmsg()); /* out of memory: tried again as an unsent one */
            c->hello_unsent = 1;
            c->t_hello = dl_clock_ns();
            return;
        }
        h.max_tokens_per_step = c->max_tokens_per_step;
    }
    /* held_versions has all P entries; the synchronizer reads those of the
     * fragments it owns, ours (a shard's are not the others' business) */
    int all = 1;
    for (int p = 0; p < c->P; p++) {
        int held = dl_mailbox_held(c->mb, p, &c->hv[p]);
        if (!held) c->hv[p] = 0;
        if (c->f[p].served) all &= held;
        if (c->f[p].served) h.carried_tokens += dl_mailbox_carried(c->mb, p);
    }
    dl_mailbox_progress(c->mb, NULL, 0, &h.step, NULL, NULL, NULL);
    /* A learner that holds only some fragments is fresh for the protocol. */
    h.n_held_versions = all ? (size_t)c->P : 0;
    h.held_versions = all ? c->hv : NULL;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_hello(&env, &h);
    int rc = send_env(c, &env, NULL, 0);
    dl_wire_manifest_buf_free(&mbuf);
    /* Not connected yet (ZMQ_IMMEDIATE), or no socket: try again in
     * hello_unsent_ms, not after the full retry period. */
    c->hello_unsent = rc == DL_EAGAIN;
    c->t_hello = dl_clock_ns();
    if (rc) return;
    /* backoff: each unanswered Hello doubles the wait for the next, from
     * hello_retry_ms up to hello_retry_max_ms; a Welcome resets it */
    c->hello_wait_ms = c->hello_sent_once ? (c->hello_wait_ms < c->hello_retry_max_ms / 2 ? c->hello_wait_ms * 2
                                                                                          : c->hello_retry_max_ms)
                                          : c->hello_retry_ms;
    c->hello_sent_once = 1;
    COUNT(hellos);
    DL_DEBUG("comms: hello to %s (epoch %llu, %s)", c->endpoint, (unsigned long long)c->epoch,
             all ? "with held versions" : "fresh");
}

static void send_heartbeat(dl_comms *c)
{
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    dl_mailbox_progress(c->mb, c->served, c->n_served, &hb.step, &hb.tokens, &hb.steps_per_s, &hb.discarded_tokens);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_heartbeat(&env, &hb);
    c->t_hb = dl_clock_ns();
    if (send_env(c, &env, NULL, 0) == 0) COUNT(heartbeats_sent);
}

/* Send one Fetch of every wanted fragment whose time has come (a fragment
 * waiting for a fetch reply is asked again only after that reply); all P of
 * them as an empty list (= all), a subset by name. c->t_fetch = the next
 * time one is due. READY only. */
static void send_fetches(dl_comms *c, int64_t now)
{
    int n = 0;
    c->t_fetch = NEVER;
    for (int i = 0; i < c->n_served; i++) {
        sfrag *f = &c->f[c->served[i]];
        if (!f->fetch_want || f->fetch_pending) continue;
        if (f->fetch_at <= now) c->fetch_list[n++] = (uint32_t)c->served[i];
        else if (f->fetch_at < c->t_fetch) c->t_fetch = f->fetch_at;
    }
    if (!n) return;
    Dloco__V1__Fetch fm;
    dloco__v1__fetch__init(&fm);
    /* what arrived of a chunked Update is kept: the synchronizer goes on from
     * there while that version is still the global one */
    int resume = 0;
    for (int i = 0; i < n; i++) {
        const sfrag *f = &c->f[c->fetch_list[i]];
        c->resume_v[i] = f->rx ? f->rx_version : 0;
        c->resume_o[i] = f->rx ? f->rx_off : 0;
        resume |= f->rx && f->rx_off > 0;
    }
    if (n < c->P || resume) {
        fm.n_fragments = (size_t)n;
        fm.fragments = c->fetch_list;
    }
    if (resume) {
        fm.n_resume_versions = fm.n_resume_offsets = (size_t)n;
        fm.resume_versions = c->resume_v;
        fm.resume_offsets = c->resume_o;
    }
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_fetch(&env, &fm);
    if (send_env(c, &env, NULL, 0) != 0) {
        c->t_fetch = now + 10 * MS; /* no connection or a full queue: soon again */
        return;
    }
    for (int i = 0; i < n; i++) {
        sfrag *f = &c->f[c->fetch_list[i]];
        f->fetch_want = 0;
        f->fetch_pending = 1;
        f->fetch_sent = now;
    }
    COUNT(fetches);
}

/* Ask for a Fetch of p at `at` (merged with an earlier request). */
static void want_fetch(dl_comms *c, int p, int64_t at)
{
    sfrag *f = &c->f[p];
    if (!f->fetch_want || at < f->fetch_at) f->fetch_at = at;
    f->fetch_want = 1;
    f->fetch_soft = 0; /* any other reason to fetch makes the reply a rebase */
    if (f->fetch_at < c->t_fetch) c->t_fetch = f->fetch_at;
}

/* Fetches asked for through the mailbox (an update of a served fragment was
 * refused, here or by the node): the first DL_COMMS_REFETCH_FREE refusals
 * of a fragment in a row are fetched again at once, later ones after
 * hello_retry_ms doubling up to hello_retry_max_ms, so a synchronizer that
 * keeps sending garbage does not make the learner spin. */
static int64_t silence_ms(const dl_comms *c);

/* A Fetch whose reply never came (it was dropped as malformed, or lost with
 * a connection) while no Update at all arrived for a silence limit is
 * counted as a refused reply: p is fetched again with the refusals' backoff,
 * so a learner whose synchronizer answers with bad Updates keeps asking. */
static void fetch_timeouts(dl_comms *c, int64_t now)
{
    int64_t quiet = now - c->t_update_rx;
    if (quiet < silence_ms(c) * MS) return;
    for (int i = 0; i < c->n_served; i++) {
        int p = c->served[i];
        sfrag *f = &c->f[p];
        if (!f->fetch_pending || now - f->fetch_sent < silence_ms(c) * MS) continue;
        f->fetch_pending = f->fetch_soft = 0;
        int k = dl_mailbox_refuse_update(c->mb, p);
        DL_WARN("comms: no reply to the fetch of fragment %d for %lld ms: asked again (refusal %d in a row)", p,
                (long long)((now - f->fetch_sent) / MS), k);
        dl_event("update_refused", " learner=%s epoch=%llu fragment=%d version=0 reason=unanswered refusals=%d", c->id,
                 (unsigned long long)c->epoch, p, k);
    }
}

static void take_refetches(dl_comms *c, int64_t now)
{
    if (!dl_mailbox_take_refetches(c->mb, c->served, c->n_served, c->refusals)) return;
    for (int i = 0; i < c->n_served; i++) {
        int k = c->refusals[i], p = c->served[i];
        if (!k) continue;
        int64_t delay = 0;
        if (k > DL_COMMS_REFETCH_FREE) {
            delay = c->hello_retry_ms;
            for (int j = DL_COMMS_REFETCH_FREE + 1; j < k && delay < c->hello_retry_max_ms; j++) delay *= 2;
            if (delay > c->hello_retry_max_ms) delay = c->hello_retry_max_ms;
        }
        want_fetch(c, p, now + delay * MS);
        COUNT(refetches);
        DL_INFO("comms: fragment %d fetched again in %lld ms (refusal %d in a row)", p, (long long)delay, k);
        dl_event("refetch", " learner=%s epoch=%llu fragment=%d refusals=%d delay_ms=%lld", c->id,
                 (unsigned long long)c->epoch, p, k, (long long)delay);
    }
}

static void send_bye(dl_comms *c, const char *reason, uint64_t step)
{
    Dloco__V1__Bye b;
    dloco__v1__bye__init(&b);
    b.reason = (char *)reason;
    b.step = step;
    /* the final counts: the ledger closes this learner's account with them */
    dl_mailbox_progress(c->mb, c->served, c->n_served, NULL, &b.tokens, NULL, &b.discarded_tokens);
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_bye(&env, &b);
    send_env(c, &env, NULL, 0);
    /* Give the Bye a bounded chance to leave when the socket closes. */
    int linger = c->bye_linger_ms;
    if (c->sock) DL_ZMQ_LOG(zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger));
}

/* The answers to pushes already sent will never come (another incarnation
 * of the synchronizer, or DL_ENOTFOUND: our recent pushes got Errors instead
 * of Acks): they stop holding their fragments and the final flush. */
/* Stop the chunked push leaving. With requeue the push goes back to its
 * slot (unless a newer one of the fragment came meanwhile) to be sent again
 * whole; without, its claim is undone and it is gone (its progress stays in
 * the parameters: the next push of the fragment carries it). decided: an
 * Ack already settled it (nothing to undo). */
static void tx_abort(dl_comms *c, int requeue, int decided, const char *why)
{
    ptx *t = &c->tx;
    if (!t->active) return;
    DL_DEBUG("comms: push of fragment %d stopped after %llu of %llu elements: %s", t->p, (unsigned long long)t->off,
             (unsigned long long)c->numel[t->p], why);
    dl_event("push_stopped", " learner=%s epoch=%llu fragment=%d sent=%llu numel=%llu requeue=%d reason=%s", c->id,
             (unsigned long long)c->epoch, t->p, (unsigned long long)t->off, (unsigned long long)c->numel[t->p],
             requeue, why);
    if (!decided) {
        dl_mailbox_unclaim_push(c->mb, t->p, &t->cl, &c->send_spare, requeue);
        dl_ef_forget(c->ef, t->p); /* it did not leave: encoded again from the committed residual */
    }
    c->f[t->p].unacked = 0;
    t->active = 0;
    COUNT(pushes_stopped);
}

static void forget_sent(dl_comms *c)
{
    tx_abort(c, 1, 0, "session_forgotten");
    dl_mailbox_forget_sent(c->mb, c->served, c->n_served);
    for (int p = 0; p < c->P; p++) {
        c->f[p].unacked = 0;
        dl_ef_forget(c->ef, p); /* no decision will come: the committed residual stays */
    }
}

/* A chunk of p's Update arrived (`bytes` of payload); `continues`: it
 * follows an earlier chunk of the same transfer, so the synchronizer had it
 * queued behind that one and the interval is our downlink's pace
 * (silence_ms). */
static void rx_chunk(dl_comms *c, sfrag *f, int continues, size_t bytes)
{
    int64_t now = dl_clock_ns();
    if (continues && bytes && f->rx_t && now > f->rx_t) {
        double pace = (double)(now - f->rx_t) / (double)bytes;
        c->rx_ns_per_byte = c->rx_ns_per_byte > 0 ? 0.75 * c->rx_ns_per_byte + 0.25 * pace : pace;
    }
    f->rx_t = now;
}

/* Start a new session: the synchronizer restarted, forgot us, went silent,
 * said bye, or the connection was rebuilt. With `forget` the pushes sent are
 * forgotten (forget_sent). Queued pushes wait in their slots either way.
 * While already waiting for a Welcome nothing more is sent: the Hello
 * retries (with their backoff) go on. */
static void rehello(dl_comms *c, const char *why, int forget)
{
    if (forget) forget_sent(c);
    if (c->state == DL_COMMS_HELLO) return;
    DL_WARN("comms: %s; sending hello again", why);
    char ev[1400];
    dl_event("rehello", " learner=%s epoch=%llu reason=%s", c->id, (unsigned long long)c->epoch,
             dl_event_str(why, ev, sizeof ev));
    set_state(c, DL_COMMS_HELLO, NULL);
    COUNT(rehellos);
    int64_t now = dl_clock_ns();
    /* how far the global versions moved meanwhile (a partition, an outage) is
     * unknown until the Welcome: a keep learner holds its pushes till then
     * (dl_mailbox_set_behind; the Welcome replaces this with what it says) */
    for (int i = 0; i < c->n_served; i++) dl_mailbox_set_behind(c->mb, c->served[i], UINT64_MAX, now);
    for (int p = 0; p < c->P; p++) {
        /* a fetch reply that may never come on the new session is asked for again after its Welcome */
        if (c->f[p].fetch_pending) want_fetch(c, p, now);
        c->f[p].fetch_pending = c->f[p].rebase_pending = 0;
    }
    c->t_warn = now;
    send_hello(c);
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
    tx_abort(c, 1, 0, "connection_closed"); /* the synchronizer drops what came of it */
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
    if (c->rebuilds_row > 1) {
        delay = c->reconnect_ms;
        for (int i = 2; i < c->rebuilds_row && delay < c->reconnect_max_ms; i++) delay *= 2;
        if (delay > c->reconnect_max_ms) delay = c->reconnect_max_ms;
    }
    int64_t now = dl_clock_ns();
    c->t_reopen = now + delay * MS;
    c->any_epoch = 1; /* nothing of an earlier incarnation can arrive on the new connection */
    c->bad_row = 0;
    c->rebuild_bad = !strcmp(reason, "bad_messages");
    COUNT(rebuilds);
    snprintf(c->conn_err, sizeof c->conn_err, "%s", why);
    set_state(c, c->state, "last connection problem: %s", why); /* what a timed-out wait reports */
    DL_WARN("comms: %s; new connection to %s in %lld ms", why, c->endpoint, (long long)delay);
    char ev[400];
    dl_event("socket_rebuild", " learner=%s epoch=%llu reason=%s rebuilds=%d delay_ms=%lld detail=%s", c->id,
             (unsigned long long)c->epoch, reason, c->rebuilds_row, (long long)delay,
             dl_event_str(why, ev, sizeof ev));
    if (c->state == DL_COMMS_READY) {
        rehello(c, why, 0);
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

/* A Welcome's values outside the learner's bounds, or from another shard
 * than this session's: the reason into why, else "". */
static void welcome_bounds(const dl_comms *c, const Dloco__V1__Welcome *w, char *why, size_t cap)
{
    why[0] = 0;
    int ws = w->shards > 1 ? (int)w->shards : 1, wk = w->shards > 1 ? (int)w->shard : 0;
    if (ws != c->shards || wk != c->shard) {
        char a[48], b[48];
        snprintf(a, sizeof a, ws > 1 ? "shard %d of %d" : "an unsharded synchronizer", wk, ws);
        snprintf(b, sizeof b, c->shards > 1 ? "shard %d of %d" : "an unsharded synchronizer", c->shard, c->shards);
        snprintf(why, cap, "it is from %s, this session expects %s (the order of --connect is the shards' order)", a, b);
    } else if (w->h < DL_COMMS_H_MIN || w->h > DL_COMMS_H_MAX)
        snprintf(why, cap, "h %u outside [%u, %u]", w->h, DL_COMMS_H_MIN, DL_COMMS_H_MAX);
    else if (w->heartbeat_ms < DL_COMMS_HEARTBEAT_MIN_MS || w->heartbeat_ms > DL_COMMS_HEARTBEAT_MAX_MS)
        snprintf(why, cap, "heartbeat_ms %u outside [%u, %u]", w->heartbeat_ms, DL_COMMS_HEARTBEAT_MIN_MS,
                 DL_COMMS_HEARTBEAT_MAX_MS);
    else if (w->liveness < DL_COMMS_LIVENESS_MIN || w->liveness > DL_COMMS_LIVENESS_MAX)
        snprintf(why, cap, "liveness %u outside [%u, %u]", w->liveness, DL_COMMS_LIVENESS_MIN, DL_COMMS_LIVENESS_MAX);
}

/* A Welcome answering our Hello (state HELLO). */
static void on_welcome(dl_comms *c, uint64_t epoch, const Dloco__V1__Welcome *w)
{
    char why[200];
    welcome_bounds(c, w, why, sizeof why);
    if (why[0]) {
        /* as if the Hello had not been answered: its retry (with backoff) comes */
        COUNT(welcomes_refused);
        DL_WARN("comms: welcome from %s (epoch %llu) refused: %s; hello again in %d ms", c->endpoint,
                (unsigned long long)epoch, why, c->hello_wait_ms);
        char ev[300];
        dl_event("welcome_refused", " learner=%s epoch=%llu reason=%s", c->id, (unsigned long long)epoch,
                 dl_event_str(why, ev, sizeof ev));
        snprintf(c->conn_err, sizeof c->conn_err, "welcome refused: %s", why); /* for the connect timeout */
        return;
    }
    if (c->epoch && epoch != c->epoch) {
        forget_sent(c); /* another incarnation: what the old one pooled is gone */
        if (epoch < c->epoch)
            DL_WARN("comms: epoch goes back from %llu to %llu on a new connection (a new store?)",
                    (unsigned long long)c->epoch, (unsigned long long)epoch);
    }
    c->epoch = epoch;
    c->any_epoch = 0;
    if (!c->rebuild_bad) c->rebuilds_row = 0;
    c->chunk = w->chunk_bytes / sizeof(float);
    /* delta Updates: a mirror per fragment from its next full Update on; none without them */
    /* a new epoch (a restarted synchronizer, perhaps on another store) gives
     * version numbers a new meaning: every mirror waits for a full Update */
    int new_epoch = c->update_codec && epoch != c->epoch_mirrors;
    c->epoch_mirrors = epoch;
    c->update_codec = w->update_codec;
    if (new_epoch)
        for (int p = 0; p < c->P; p++) c->f[p].mirror_ok = c->f[p].stage_active = 0;
    if (!c->update_codec)
        for (int p = 0; p < c->P; p++) {
            sfrag *f = &c->f[p];
            free(f->mirror);
            free(f->stage);
            f->mirror = f->stage = NULL;
            f->mirror_ok = f->stage_active = 0;
        }
    if (c->tx.active && (w->must_fetch || c->chunk == 0)) tx_abort(c, !w->must_fetch, 0, "welcome");
    c->conn_err[0] = 0;
    c->hello_sent_once = 0; /* backoff starts over at the next re-hello */
    int64_t now = dl_clock_ns();
    int n = 0;
    for (int i = 0; i < c->n_served; i++) {
        int p = c->served[i];
        sfrag *f = &c->f[p];
        uint64_t v;
        int held = dl_mailbox_held(c->mb, p, &v);
        f->known = w->fragment_versions[p] > (held ? v : 0) ? w->fragment_versions[p] : (held ? v : 0);
        /* behind the global (an outage, a partition): a keep learner pushes what it
         * trained meanwhile once it has adopted that version, not on its old base */
        dl_mailbox_set_behind(c->mb, p, w->must_fetch ? 0 : w->fragment_versions[p], now);
        f->fetch_pending = f->rebase_pending = 0;
        f->busy_until = 0;
        if (!(c->tx.active && c->tx.p == p)) f->unacked = 0; /* a push still leaving keeps its slot */
        if (w->must_fetch || !held) {
            /* a queued push is relative to a base the synchronizer will not accept */
            if (w->must_fetch) dl_mailbox_discard_queued(c->mb, p);
            want_fetch(c, p, now);
            n++;
        } else if (w->fragment_versions[p] > v && !f->fetch_want && w->update_codec && f->mirror_ok &&
                   f->mirror_version >= v) {
            /* the synchronizer sends what p lacks from v, as deltas where it keeps them
             * (synchronizer/admit.c): nothing to fetch */
        } else if (w->fragment_versions[p] > v && !f->fetch_want) {
            /* the synchronizer holds a newer version than we do (merges whose
             * Updates a restart or a lost connection swallowed, perhaps the
             * merge of our own push): fetch it to adopt in the learner's mode,
             * so our next push is not on a base that merged progress of ours */
            want_fetch(c, p, now);
            f->fetch_soft = 1;
            n++;
        }
        /* a fetch still wanted after a refused update keeps its time */
    }
    pthread_mutex_lock(&c->mu);
    c->st.h = w->h;
    c->st.heartbeat_ms = w->heartbeat_ms;
    c->st.epoch = epoch;
    c->st.state = DL_COMMS_READY;
    c->msg[0] = 0;
    pthread_mutex_unlock(&c->mu);
    c->state = DL_COMMS_READY;
    /* before READY: a barrier policy holds the training thread from the first step */
    dl_mailbox_set_policy(c->mb, w->policy);
    dl_mailbox_set_link(c->mb, c->link, DL_COMMS_READY, w->h, "");
    c->hb_ms = w->heartbeat_ms;
    c->liveness = w->liveness;
    c->t_hb = now;
    c->t_recv = now;
    c->ever_welcomed = 1;
    c->hs_failed = 0;
    char pol[NET_STR_CAP];
    DL_INFO("comms: welcome from %s: epoch %llu, H %u, heartbeat %u ms x %u, policy %s, must_fetch %d (fetching %d)",
            c->endpoint, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
            net_str(w->policy, pol, sizeof pol), (int)w->must_fetch, n);
    dl_event("welcome",
             " learner=%s epoch=%llu h=%u heartbeat_ms=%u liveness=%u policy=%s must_fetch=%d fetching=%d shard=%d "
             "shards=%d",
             c->id, (unsigned long long)c->epoch, w->h, w->heartbeat_ms, w->liveness,
             dl_event_str(w->policy ? w->policy : "", pol, 300), (int)w->must_fetch, n, c->shard, c->shards);
    send_fetches(c, now);
}

/* 1 when p is ours; counts a bad message otherwise (a shard sent us another's fragment). */
static int served(dl_comms *c, int p, const char *what)
{
    if (p >= 0 && p < c->P && c->f[p].served) return 1;
    DL_WARN("comms: %s of fragment %d ignored: not served by this session", what, p);
    COUNT(bad_msgs);
    return 0;
}

/* 1 when all n fp32 values at (possibly unaligned) data are finite. */
static int all_finite(const void *data, size_t n)
{
    const unsigned char *b = data;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, b + 4 * i, 4);
        /* exponent all ones = inf or NaN */
        acc |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return !acc;
}

static void on_update_whole(dl_comms *c, const Dloco__V1__Update *u, int p, const void *payload);

/* A delta Update of p that the mirror cannot take (it does not hold version
 * - 1: versions missed, no mirror yet, a gap in its chunks): dropped, and
 * p fetched whole (the synchronizer answers a Fetch with fp32). The push
 * an ACCEPTED announced keeps waiting: for the fetch reply. */
static void delta_missed(dl_comms *c, int p, uint64_t version, const char *why)
{
    sfrag *f = &c->f[p];
    COUNT(updates_delta_missed);
    long long held = f->mirror_ok ? (long long)f->mirror_version : -1;
    DL_INFO("comms: delta update of fragment %d version %llu dropped (%s, mirror %s %lld); fetching the fragment", p,
            (unsigned long long)version, why, f->mirror_ok ? "holds" : "empty", held);
    dl_event("update_delta_missed", " learner=%s epoch=%llu fragment=%d version=%llu held=%lld", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)version, held);
    f->stage_active = 0;
    int fresh = !f->fetch_want && !f->fetch_pending;
    if (!f->fetch_pending) want_fetch(c, p, dl_clock_ns());
    if (fresh) f->fetch_soft = 1; /* only the mirror is behind: the reply refreshes it, not theta */
}

/* One delta Update (or chunk of one) of p: version v = version v - 1 +
 * decode(payload), element by element in fp32 (dl_codec_decode_add onto the
 * mirror, into the stage). Its first chunk (offset 0) needs the mirror at v - 1;
 * the chunks go in order; the last one hands the stage over as a full
 * update (on_update_whole), which makes it the mirror. A payload the decoder
 * refuses is a bad message: the stage is dropped and p fetched again (with
 * the refusals' backoff). */
static void on_update_delta(dl_comms *c, const Dloco__V1__Update *u, int p, const void *payload, size_t len)
{
    sfrag *f = &c->f[p];
    uint64_t off = u->chunk_numel ? u->chunk_offset : 0, n = u->chunk_numel ? u->chunk_numel : u->numel;
    if (off == 0) {
        /* a version the mirror holds already (a rejoin's chain starts at the adopted
         * version; an Update after it may have come and wait to be adopted): skip it */
        if (f->mirror_ok && u->version <= f->mirror_version) {
            COUNT(chunks_dropped);
            return;
        }
        f->stage_active = 0;
        if (!c->update_codec) {
            delta_missed(c, p, u->version, "no update_codec in the Welcome");
            return;
        }
        if (!f->mirror_ok || f->mirror_version != u->version - 1) {
            delta_missed(c, p, u->version, "version - 1 not held");
            return;
        }
        if (!f->stage && !(f->stage = dl_try_malloc((size_t)u->numel * sizeof(float)))) {
            delta_missed(c, p, u->version, "out of memory for the staging copy");
            return;
        }
        f->stage_active = 1;
        f->stage_version = u->version;
        f->stage_off = 0;
    } else if (!f->stage_active || f->stage_version != u->version || off + n <= f->stage_off) {
        COUNT(chunks_dropped); /* the rest of a delta missed, replaced or finished, or a repeat */
        return;
    } else if (off != f->stage_off) {
        COUNT(chunks_dropped);
        delta_missed(c, p, u->version, "a gap in its chunks");
        return;
    }
    dl_codec dc = {.id = (dl_codec_id)u->codec, .block = u->block_size, .topk = u->topk};
    if (dl_codec_decode_add(&dc, payload, len, n, f->mirror + off, f->stage + off)) {
        f->stage_active = 0;
        COUNT(bad_msgs);
        int k = dl_mailbox_refuse_update(c->mb, p);
        DL_WARN("comms: delta update of fragment %d version %llu refused: %s (refusal %d in a row)", p,
                (unsigned long long)u->version, dl_errmsg(), k);
        dl_event("update_refused", " learner=%s epoch=%llu fragment=%d version=%llu reason=decode refusals=%d", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)u->version, k);
        return;
    }
    f->stage_off = off + n;
    if (u->chunk_numel) {
        COUNT(chunks_recv);
        rx_chunk(c, f, off > 0, len);
    }
    if (f->stage_off < u->numel) return;
    f->stage_active = 0;
    on_update_whole(c, u, p, f->stage);
}

static void on_update(dl_comms *c, const Dloco__V1__Update *u, dl_wire_msg *m)
{
    int p = (int)u->fragment;
    c->t_update_rx = dl_clock_ns();
    if (u->delta) {
        if (served(c, p, "update"))
            on_update_delta(c, u, p, dl_wire_msg_payload(m, 0), dl_wire_msg_payload_len(m, 0));
        return;
    }
    if (u->codec != DLOCO__V1__CODEC__CODEC_FP32) {
        DL_WARN("comms: update of fragment %d in codec %s ignored: this learner only reads fp32", p,
                dl_wire_codec_name(u->codec));
        COUNT(bad_msgs);
        return;
    }
    if (!served(c, p, "update")) return;
    sfrag *f = &c->f[p];
    const void *payload = dl_wire_msg_payload(m, 0);
    if (u->chunk_numel) {
        /* one chunk. Of the version being assembled: what we hold already is
         * skipped (the synchronizer started it again, e.g. on a new
         * connection, before our resume point reached it), the rest
         * appended; a gap asks for the rest (once per point). Of another
         * version: offset 0 starts it, anything else is a leftover of a
         * transfer replaced or finished, dropped. */
        uint64_t off = u->chunk_offset, end = off + u->chunk_numel;
        if (f->rx && u->version == f->rx_version) {
            if (end <= f->rx_off) {
                COUNT(chunks_dropped);
                return;
            }
            if (off > f->rx_off) {
                COUNT(chunks_dropped);
                DL_DEBUG("comms: chunk of fragment %d v%llu at %llu: a gap after %llu", p,
                         (unsigned long long)u->version, (unsigned long long)off, (unsigned long long)f->rx_off);
                if (f->gap_at != f->rx_off + 1) {
                    f->gap_at = f->rx_off + 1;
                    f->fetch_pending = 0; /* the reply it waited for has a hole: asked again (send_fetches sets it) */
                    want_fetch(c, p, dl_clock_ns());
                }
                return;
            }
        } else if (off == 0) {
            if (!f->rx && !(f->rx = dl_try_malloc((size_t)u->numel * sizeof(float)))) {
                COUNT(chunks_dropped); /* out of memory: the fetch of the fragment comes later */
                return;
            }
            f->rx_version = u->version;
            f->rx_off = 0;
        } else {
            COUNT(chunks_dropped);
            return;
        }
        const char *from = (const char *)payload + (f->rx_off - off) * sizeof(float);
        memcpy(f->rx + f->rx_off, from, (size_t)(end - f->rx_off) * sizeof(float));
        rx_chunk(c, f, f->rx_off > 0, dl_wire_msg_payload_len(m, 0));
        f->rx_off = end;
        f->gap_at = 0;
        COUNT(chunks_recv);
        if (f->rx_off < u->numel) return;
        payload = f->rx; /* complete: checked and handed over below, then freed */
    }
    on_update_whole(c, u, p, payload);
    if (payload == f->rx) {
        free(f->rx);
        f->rx = NULL;
        f->rx_off = f->rx_version = 0;
    }
}

/* A complete Update of p (payload: numel floats, possibly unaligned). */
static void on_update_whole(dl_comms *c, const Dloco__V1__Update *u, int p, const void *payload)
{
    sfrag *f = &c->f[p];
    int forced = f->fetch_pending && !f->fetch_soft ? DL_UPDATE_FETCHED
                 : f->rebase_pending == 2            ? DL_UPDATE_STALE
                 : f->rebase_pending                 ? DL_UPDATE_REBASE
                                                     : DL_UPDATE_NORMAL;
    uint64_t held;
    int is_held = dl_mailbox_held(c->mb, p, &held);
    if (forced == DL_UPDATE_NORMAL && is_held && u->version < held) {
        /* out of date: the learner already holds a newer global */
        COUNT(updates_old);
        dl_mailbox_update_seen(c->mb, p);
        DL_DEBUG("comms: update of fragment %d version %llu ignored: holding %llu", p, (unsigned long long)u->version,
                 (unsigned long long)held);
        return;
    }
    const char *reason = NULL;
    char why[160];
    if (u->version > f->known && u->version - f->known > c->max_jump) {
        reason = "version_jump";
        snprintf(why, sizeof why, "version %llu is more than %llu above the newest known %llu",
                 (unsigned long long)u->version, (unsigned long long)c->max_jump, (unsigned long long)f->known);
    } else if (!all_finite(payload, (size_t)u->numel)) { /* a decoded delta too: a sum may overflow */
        reason = "nonfinite";
        snprintf(why, sizeof why, "it holds non-finite values");
    }
    f->rebase_pending = 0;
    f->fetch_pending = f->fetch_soft = 0;
    if (reason) {
        /* never adopted; a fresh fetch of p is asked for (take_refetches backs off) */
        COUNT(updates_refused);
        int k = dl_mailbox_refuse_update(c->mb, p);
        DL_WARN("comms: update of fragment %d version %llu refused: %s (refusal %d in a row)", p,
                (unsigned long long)u->version, why, k);
        dl_event("update_refused", " learner=%s epoch=%llu fragment=%d version=%llu reason=%s refusals=%d", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)u->version, reason, k);
        return;
    }
    if (u->version > f->known) f->known = u->version;
    c->rebuilds_row = c->rebuild_bad = 0; /* the connection serves: a later rebuild starts its backoff over */
    /* a good one came: a fetch still waiting for its backoff after a refused
     * update is not needed any more (the node asks again if it refuses this one) */
    f->fetch_want = 0;
    /* a forced adopt overwrites theta_p: the progress the residual was owed to is gone (learner/ef.h) */
    if (forced != DL_UPDATE_NORMAL && !(forced == DL_UPDATE_STALE && c->adopt_keep)) dl_ef_reset(c->ef, p);
    size_t bytes = (size_t)u->numel * sizeof(float);
    int stored = dl_mailbox_put_update(c->mb, p, u->version, forced, payload, (size_t)u->numel);
    if (stored && c->update_codec) {
        /* what the slot got is the mirror now: the next delta applies to it */
        if (payload == f->stage) {
            float *t = f->mirror;
            f->mirror = f->stage;
            f->stage = t;
        } else {
            if (!f->mirror) f->mirror = dl_try_malloc(bytes);
            if (f->mirror) memcpy(f->mirror, payload, bytes);
        }
        f->mirror_version = u->version;
        f->mirror_ok = f->mirror != NULL; /* out of memory: no mirror, the next delta is missed and fetched */
        /* a delta half assembled goes on only when it is the next version of this one */
        if (f->stage_active && f->stage_version != u->version + 1) f->stage_active = 0;
    }
    COUNT(updates);
    if (u->delta) COUNT(updates_delta);
    dl_event("update", " learner=%s epoch=%llu fragment=%d version=%llu forced=%d", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)u->version, forced);
    /* the synchronizer's merge event carries the same hash of what it committed */
    if (stored)
        dl_event("update_base", " learner=%s epoch=%llu fragment=%d version=%llu delta=%d hash=%016llx", c->id,
                 (unsigned long long)c->epoch, p, (unsigned long long)u->version, (int)u->delta,
                 (unsigned long long)dl_checksum64(payload, bytes));
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
    /* refused at its first chunk: the rest of it need not go */
    if (c->tx.active && c->tx.p == p && c->tx.cl.h.base_version == a->base_version && d != DL_DECIDE_PENDING &&
        d != DL_DECIDE_ACCEPTED)
        tx_abort(c, 0, 1, a->busy ? "busy" : "refused");
    /* rebase (docs/PROTOCOL.md section 5, "Errors"): after a DROPPED_STALE, or a REJECTED whose base is
     * unusable, the synchronizer sends the global fragment, and the learner rebases onto it */
    int rebase = a->rebase && (d == DL_DECIDE_DROPPED || d == DL_DECIDE_REJECTED);
    int decided = dl_mailbox_decide(c->mb, p, d, a->base_version, d == DL_DECIDE_ACCEPTED || rebase);
    if (decided && d == DL_DECIDE_ACCEPTED) dl_mailbox_await_version(c->mb, p, a->merged_version);
    /* error feedback follows the decision of the push it encoded (learner/ef.h) */
    if (decided && d == DL_DECIDE_DROPPED && c->adopt_keep) dl_ef_forget(c->ef, p); /* theta is not overwritten */
    else if (decided) dl_ef_decided(c->ef, p, d, rebase, a->base_version);
    if (a->busy) {
        /* the pool was full: nothing counted, the progress stays here; the
         * fragment's next push (coalesced meanwhile) waits at least this */
        c->f[p].busy_until = dl_clock_ns() + (int64_t)a->retry_after_ms * MS;
        COUNT(busy);
    }
    if (decided && rebase) c->f[p].rebase_pending = d == DL_DECIDE_DROPPED ? 2 : 1;
    /* any immediate answer frees the fragment for flow control */
    if (d != DL_DECIDE_ACCEPTED) c->f[p].unacked = 0;
    pthread_mutex_lock(&c->mu);
    /* the fleet's step rate for --dynamic_h (finite, in [0, 1e9]: dl_wire_validate); 0 = the synchronizer
     * does not know one (or is older): keep the last one */
    if (a->fleet_steps_per_s > 0) c->st.fleet_steps_per_s = a->fleet_steps_per_s;
    switch (d) {
    case DL_DECIDE_PENDING: c->st.acks_pending++; break;
    case DL_DECIDE_ACCEPTED:
        c->st.accepted++;
        /* an absurd merged_version never reaches the staleness mean */
        if (a->merged_version > a->base_version && a->merged_version - a->base_version <= c->max_jump) {
            c->st.staleness_sum += a->merged_version - 1 - a->base_version;
            c->st.staleness_n++;
        }
        break;
    case DL_DECIDE_DROPPED: c->st.dropped_stale++; break;
    default: c->st.rejected++; break;
    }
    pthread_mutex_unlock(&c->mu);
    if (d == DL_DECIDE_REJECTED && !a->busy) {
        char r[NET_STR_CAP];
        DL_WARN("comms: push of fragment %d (base version %llu) rejected: %s", p, (unsigned long long)a->base_version,
                net_str(a->reason, r, sizeof r));
    }
    dl_event("ack", " learner=%s epoch=%llu fragment=%d base_version=%llu decision=%s merged_version=%llu", c->id,
             (unsigned long long)c->epoch, p, (unsigned long long)a->base_version, decision_name(a->decision),
             (unsigned long long)a->merged_version);
}

/* Returns 1 when the thread must stop (fatal error). */
static int on_error(dl_comms *c, const Dloco__V1__Error *e)
{
    COUNT(errors_recv);
    char text[NET_STR_CAP];
    net_str(e->message, text, sizeof text);
    Dloco__V1__ErrorKind k = dl_wire_error_kind(e);
    const char *kind = dl_wire_error_kind_name(k);
    if (e->fatal) {
        refuse(c, kind, text, e->message ? e->message : "");
        return 1;
    }
    if (k == DLOCO__V1__ERROR_KIND__ERROR_KIND_UNKNOWN_LEARNER) {
        char why[NET_STR_CAP + 64];
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
                    dl_wire_body_name(body), net_str(env->run_id, r, sizeof r), env->learner_id, c->run_id, c->id);
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
        rehello(c, why, 1);
        return 0;
    }
    c->t_recv = dl_clock_ns();
    dl_mailbox_heard(c->mb); /* the synchronizer answers: the initial fetch is waited for (dl_node_wait_ready) */

    switch (body) {
    case DLOCO__V1__ENVELOPE__BODY_WELCOME:
        /* a late duplicate (from a retried Hello) is ignored */
        if (answer) on_welcome(c, env->epoch, env->welcome);
        else DL_DEBUG("comms: duplicate welcome ignored");
        return 0;
    case DLOCO__V1__ENVELOPE__BODY_UPDATE: on_update(c, env->update, m); return 0;
    case DLOCO__V1__ENVELOPE__BODY_ACK: on_ack(c, env->ack); return 0;
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT: COUNT(heartbeats_recv); return 0;
    case DLOCO__V1__ENVELOPE__BODY_ERROR: return on_error(c, env->error);
    case DLOCO__V1__ENVELOPE__BODY_BYE:
        if (c->state == DL_COMMS_READY) rehello(c, "synchronizer said bye", 0);
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
            set_state(c, DL_COMMS_FAILED, "receiving from %s: %s", c->endpoint, dl_errmsg());
            stop = 1;
        }
        dl_wire_msg_close(&m);
        if (stop) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* comms thread: outbound pushes */

/* The push window: payload bytes of ours libzmq may hold (two chunks keep
 * the link busy; a heartbeat waits behind at most that). */
static uint64_t push_window(const dl_comms *c) { return 2 * c->chunk * sizeof(float); }

/* Payload bytes of elements [0, n) of a push in the push codec (n a
 * multiple of the block for block codecs, or the whole fragment): a
 * block-aligned range of a payload is the payload of that range
 * (core/codec.h), so the bytes of [off, off + n) start at enc_bytes(off). */
static uint64_t enc_bytes(const dl_comms *c, uint64_t n) { return n ? dl_codec_bytes(&c->penc.c, n) : 0; }

/* Elements per chunk of a chunked push: the chunk's fp32 element count
 * (Welcome.chunk_bytes / 4), for block codecs rounded down to whole blocks
 * (at least one), so every chunk but the fragment's last holds whole blocks
 * and an encoded chunk is smaller than the fp32 chunk it stands for (as the
 * synchronizer chunks delta Updates). */
static uint64_t push_chunk_numel(const dl_comms *c)
{
    const dl_codec *pc = &c->penc.c;
    if (!dl_codec_is_block(pc->id)) return c->chunk;
    uint64_t blocks = c->chunk / pc->block;
    return (blocks ? blocks : 1) * pc->block;
}

/* Encode the claimed push of p (x: numel_p floats) into f->enc with the
 * fragment's error feedback (learner/ef.h). Stochastic rounding draws from a
 * seed that is a pure function of (learner instance, fragment, push counter). */
static int encode_push(dl_comms *c, int p, const float *x, uint64_t base_version)
{
    sfrag *f = &c->f[p];
    if (!f->enc && !(f->enc = dl_try_malloc((size_t)enc_bytes(c, c->numel[p]))))
        return dl_err(DL_ENOMEM, "encoded push of fragment %d: out of memory", p);
    dl_codec_enc e = c->penc;
    uint64_t key[3] = {c->instance, (uint64_t)p, ++f->encodes};
    e.seed = dl_hash64(key, sizeof key, 0);
    return dl_ef_encode(c->ef, &e, p, x, base_version, f->enc);
}

static void push_sent(dl_comms *c, int p, const dl_mailbox_push *h, uint64_t n)
{
    uint64_t bytes = enc_bytes(c, n);
    pthread_mutex_lock(&c->mu);
    c->st.pushes++;
    c->st.push_bytes += bytes;
    pthread_mutex_unlock(&c->mu);
    DL_DEBUG("comms: push fragment %d base %llu steps %llu tokens %llu%s", p, (unsigned long long)h->base_version,
             (unsigned long long)h->steps, (unsigned long long)h->tokens, h->final ? " (final flush)" : "");
    dl_event("push", " learner=%s epoch=%llu fragment=%d base_version=%llu steps=%llu tokens=%llu compute_s=%.6f "
             "final=%d held=%d codec=%s bytes=%llu",
             c->id, (unsigned long long)c->epoch, p, (unsigned long long)h->base_version,
             (unsigned long long)h->steps, (unsigned long long)h->tokens, h->compute_s, h->final, h->held,
             dl_codec_name(c->penc.c.id), (unsigned long long)bytes);
}

/* One Push message: elements [off, off + n) of the claimed push of p
 * (chunked when transfer != 0, else the whole fragment); payload is the
 * whole push as encoded. */
static int send_push_msg(dl_comms *c, int p, const dl_mailbox_push *h, const uint8_t *payload, uint64_t transfer,
                         uint64_t off, uint64_t n)
{
    const dl_codec *pc = &c->penc.c;
    Dloco__V1__Push m;
    dloco__v1__push__init(&m);
    m.fragment = (uint32_t)p;
    m.base_version = h->base_version;
    m.steps = h->steps;
    m.tokens = h->tokens;
    m.codec = (Dloco__V1__Codec)pc->id;
    m.numel = c->numel[p];
    m.block_size = pc->block;
    m.topk = pc->topk;
    m.chunk_offset = transfer ? off : 0;
    m.chunk_numel = transfer ? n : 0;
    m.transfer = transfer;
    const uint8_t *from = payload + enc_bytes(c, off);
    size_t len = (size_t)enc_bytes(c, n);
    m.checksum = dl_wire_checksum(from, len);
    m.loss = h->loss;
    m.compute_s = h->compute_s;
    m.final = h->final != 0;
    Dloco__V1__Envelope env;
    dl_wire_env_init(&env, c->run_id, c->epoch, c->id);
    dl_wire_set_push(&env, &m);
    return send_env(c, &env, from, len);
}

/* Go on with the chunked push leaving, as far as the window allows.
 * Returns 1 when the socket is full (retry soon), 0 otherwise. */
static int tx_continue(dl_comms *c)
{
    ptx *t = &c->tx;
    uint64_t n = c->numel[t->p], chunk = push_chunk_numel(c);
    while (t->active && t->off < n) {
        uint64_t cn = n - t->off < chunk ? n - t->off : chunk;
        /* the first chunk always goes; later ones while the window has room
         * (the queue's drain wakes the thread) */
        if (t->off && dl_wire_queue_bytes(c->outq) + enc_bytes(c, cn) > push_window(c)) return 0;
        int rc = send_push_msg(c, t->p, &t->cl.h, t->payload, t->transfer, t->off, cn);
        if (rc == DL_EAGAIN) {
            if (t->off == 0) { /* nothing left yet: back to its slot, sent again later */
                tx_abort(c, 1, 0, "queue_full");
                return 1;
            }
            return 1;
        }
        if (rc < 0) {
            tx_abort(c, 0, 0, "send_failed");
            return 0;
        }
        t->off += cn;
        COUNT(chunks_sent);
    }
    if (t->active) {
        t->active = 0;
        int64_t now = dl_clock_ns();
        c->f[t->p].unacked_ns = now; /* its Ack is due from now, */
        dl_mailbox_push_left(c->mb, t->p, t->cl.h.base_version, now); /* and the node's hold counts from now */
        push_sent(c, t->p, &t->cl.h, n);
    }
    return 0;
}

/* Send queued pushes allowed by flow control: at most one chunked push
 * leaves at a time (its chunks interleave with heartbeats and fetches), a
 * fragment waits for the Ack of its previous push, and one refused busy
 * waits its retry_after. Returns 1 when the socket is full (retry soon), 0
 * otherwise. */
static int send_pushes(dl_comms *c, int64_t now)
{
    if (c->tx.active) {
        int blocked = tx_continue(c);
        if (blocked || c->tx.active) return blocked;
    }
    int64_t expiry = (int64_t)c->liveness * c->hb_ms;
    if (expiry < c->ack_expiry_min_ms) expiry = c->ack_expiry_min_ms;
    int hb_first = 0;
    for (int k = 0; k < c->n_served && !c->tx.active; k++) {
        int p = c->served[(c->rr + k) % c->n_served];
        sfrag *f = &c->f[p];
        if (f->fetch_pending || f->fetch_want) continue; /* the base is being replaced */
        if (f->unacked && now - f->unacked_ns < expiry * MS) continue;
        if (f->busy_until > now) continue;
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
        const float *x = c->send_spare;
        if (c->byzantine) {
            /* benchmarks only: corrupt what leaves, on a copy (the slot's
             * buffer may go back to the mailbox unsent and be sent again) */
            for (size_t i = 0; i < n; i++) c->byz_buf[i] = c->send_spare[i] * c->byz_scale;
            x = c->byz_buf;
        }
        /* encoded here, once per claim: the mailbox keeps fp32 deltas (and
         * coalesces them); every chunk is a block-aligned slice of this one encoding */
        const uint8_t *payload = (const uint8_t *)x;
        if (c->penc.c.id != DL_CODEC_FP32) {
            if (encode_push(c, p, x, h->base_version)) {
                DL_ERROR("comms: push of fragment %d not sent: encoding it as %s failed: %s", p,
                         dl_codec_name(c->penc.c.id), dl_errmsg());
                dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 0);
                continue; /* dropped like a push refused locally; its progress stays in theta */
            }
            payload = c->f[p].enc;
        }
        f->unacked = 1;
        f->unacked_ns = now;
        if (c->chunk && n > push_chunk_numel(c)) {
            c->tx = (ptx){.active = 1, .p = p, .cl = cl, .transfer = ++c->transfers, .off = 0, .payload = payload};
            int blocked = tx_continue(c);
            if (blocked) return 1;
            continue; /* leaving (or refused locally): the next one after it */
        }
        int rc = send_push_msg(c, p, h, payload, 0, 0, n);
        if (rc == DL_EAGAIN) {
            /* put it back unless a newer push of p arrived meanwhile */
            f->unacked = 0;
            dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 1);
            dl_ef_forget(c->ef, p);
            return 1;
        }
        if (rc < 0) {
            f->unacked = 0;
            dl_mailbox_unclaim_push(c->mb, p, &cl, &c->send_spare, 0);
            dl_ef_forget(c->ef, p);
            if (rc == DL_ENET) return 0;
            continue; /* refused locally (e.g. a NaN loss): dropped, logged by send_env */
        }
        push_sent(c, p, h, n);
    }
    c->rr = (c->rr + 1) % c->n_served;
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
static int64_t silence_ms(const dl_comms *c)
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
    int64_t s = 4 * silence_ms(c);
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
    send_hello(c);
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
        /* what arrived before a connection died is still read */
        if (recv_all(c)) break;
        if (c->mon && monitor_lost(c)) {
            char why[sizeof c->conn_err];
            snprintf(why, sizeof why, "%s", c->conn_err);
            if (c->auth_denied) {
                refuse(c, "unauthorized", why, why);
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
                refuse(c, "handshake", r, r);
                break;
            }
            rebuild(c, strstr(why, "handshake") ? "handshake_failed" : "disconnected", why);
        }

        now = dl_clock_ns();
        if (!c->sock && now >= c->t_reopen && open_socket(c)) {
            set_state(c, DL_COMMS_FAILED, "reconnecting to %s: %s", c->endpoint, dl_errmsg());
            break;
        }
        if (c->state == DL_COMMS_READY) fetch_timeouts(c, now);
        take_refetches(c, now);
        if (c->state == DL_COMMS_HELLO) {
            /* the bound is on joining: a learner that holds its fragments (restored from its state) trains,
             * and keeps trying as a learner without a bound does */
            if (!c->ever_welcomed && c->connect_timeout_ms > 0 && now - c->t_start >= c->connect_timeout_ms * MS &&
                !holds_served(c)) {
                set_state(c, DL_COMMS_FAILED,
                          "no Welcome from %s within %d ms (is dloco-sync running there with run_id '%s'?%s%s)",
                          c->endpoint, c->connect_timeout_ms, c->run_id, c->conn_err[0] ? " last problem: " : "",
                          c->conn_err);
                break;
            }
            if (!c->ever_welcomed && now - c->t_warn >= DL_COMMS_WAIT_NOTE_MS * MS &&
                (c->connect_timeout_ms < 0 || holds_served(c))) {
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
                    send_hello(c);
                }
            }
        } else if (c->state == DL_COMMS_READY) {
            if (now - heard(c) >= silence_ms(c) * MS) {
                /* the same socket first: a rebuild follows if the silence lasts */
                char why[96];
                snprintf(why, sizeof why, "no message from the synchronizer for %lld ms", (long long)silence_ms(c));
                rehello(c, why, 0);
            } else if (now - c->t_hb >= c->hb_ms * MS) {
                send_heartbeat(c);
            }
        }
        blocked = 0;
        if (c->state == DL_COMMS_READY) {
            if (c->t_fetch <= now) send_fetches(c, now);
            blocked = send_pushes(c, now);
        }
        if (bye) {
            if (c->ever_welcomed && (c->state == DL_COMMS_READY || c->state == DL_COMMS_HELLO)) {
                send_bye(c, reason, bye_step);
                DL_INFO("comms: bye sent (%s, step %llu)", reason, (unsigned long long)bye_step);
            }
            if (c->state == DL_COMMS_READY || c->state == DL_COMMS_HELLO) set_state(c, DL_COMMS_DONE, NULL);
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
