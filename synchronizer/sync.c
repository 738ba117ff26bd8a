/* dloco-sync's loop: one libev loop owns the ROUTER socket and handles every
 * message; registry, policy, round assembly, ledger and worker do the rest. */
#include "synchronizer/sync.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/httpd.h"
#include "core/log.h"
#include "core/plan.h"
#include "core/codec.h"
#include "core/shard.h"
#include "kernels/codec.h"
#include "learner/gpt.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "storage/modelfile.h"
#include "storage/store.h"
#include "synchronizer/evalthread.h"
#include "synchronizer/metrics.h"
#include "synchronizer/registry.h"
#include "synchronizer/report.h"
#include "synchronizer/round.h"
#include "synchronizer/worker.h"

#include <assert.h>
#include <errno.h>
#include <ev.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ------------------------------------------------------------------------ */
/* state */

/* Ids of reclaimed slots remembered (a ring): a learner that comes back
 * after its slot was reclaimed has lost its replay record here, so it must
 * fetch rather than push from what it holds. */
#define DL_SYNC_RECLAIMED_IDS 4096
/* Ack.retry_after_ms of a push refused because the pool is full. */
#define DL_SYNC_BUSY_RETRY_MS 1000u
/* One drain reads at most this many messages, or this many payload bytes,
 * before timers, finished merges and sends get their turn (an ev_idle
 * watcher goes on with the rest). */
#define DL_SYNC_DRAIN_MSGS 64
#define DL_SYNC_DRAIN_BYTES (32u << 20)
/* The derived pool bound is at least this (small models never wait for room). */
#define DL_SYNC_POOL_MIN (64ull << 20)
/* /metrics and /status.json are re-rendered this often, seconds. */
#define DL_SYNC_PUBLISH_S 1.0
/* A learner whose counters moved gets a new store record at most this often. */
#define DL_SYNC_PUT_EVERY_NS (5 * 1000000000LL)
/* Default chunk_bytes. */
#define DL_SYNC_CHUNK_BYTES (1u << 20)

/* A pooled push: its payload waits for its round. */
typedef struct {
    int used;
    float *delta;      /* aligned copy of the payload */
    uint32_t learner;  /* registry slot */
    int fragment;
    uint64_t base_version, tokens;
    double compute_s;  /* the learner's training seconds behind the delta (Push.compute_s) */
} pending_push;

/* A chunked push arriving from one learner (one at a time per connection:
 * docs/PROTOCOL.md "Chunked transfers"). Its buffer counts in the pool. */
typedef struct {
    int active;          /* chunks are arriving into buf */
    int refused;         /* its first chunk was refused (and answered): the rest are dropped unread */
    uint32_t fragment;
    uint64_t transfer, base_version, steps, tokens, numel;
    int codec;           /* the first chunk's codec, block size and topk: every chunk must match */
    uint32_t block, topk;
    uint64_t received;   /* elements so far, in order */
    int64_t progress_ns; /* monotonic ns of its latest chunk: one that stops for slow_reader_ms is dropped */
    double compute_s;
    float *buf;          /* [numel], aligned */
} inbound;

/* The Update being sent to one learner, chunk by chunk (one fragment at a
 * time): version `version` of fragment p, elements [0, offset) sent. */
typedef struct {
    int p;               /* -1: none */
    int started;         /* version is set: [0, offset) of it has left */
    int delta;           /* started: the transfer is p's kept delta to `version` (else its fp32 values) */
    uint64_t version, offset;
} outbound;

/* Downlink codec on: the latest merge's delta of a fragment, encoded (the
 * payload that takes version - 1 to version, core/codec.h layout), sent to
 * the learners that hold version - 1 (serve_owed). */
typedef struct {
    uint8_t *buf;        /* NULL: none yet (none since the start: a restart forgets it) */
    size_t bytes;        /* dl_codec_bytes(&c, numel) */
    uint64_t version;
    dl_codec c;
} kept_delta;

struct dl_sync {
    dl_sync_cfg cfg;
    char endpoint[256];
    void *zctx, *router;
    struct ev_loop *loop;
    ev_io zio;
    ev_timer tick, deadline, status;
    ev_async wake;
    ev_signal sigint, sigterm, sighup;
    dl_sync_reload_fn reload;
    dl_sync_reload_done_fn reload_done;
    void *reload_ctx;
    int stopping;     /* SIGINT/SIGTERM seen: finish the jobs in flight */
    int final_ledger; /* the shutdown ledger write was submitted */

    dl_store *store;
    dl_plan *plan;
    dl_policy *policy;     /* rounds, and the one owner of liveness */
    dl_registry *reg;      /* ids -> slots, counters */
    dl_ledger *ledger;     /* token fates */
    dl_worker *worker;     /* merges and every LMDB write */
    dl_guard *guard;       /* counters, replays and values of pushes */
    dl_auth *auth;         /* CURVE: the ZAP handler and the allowlist; NULL without auth */
    dl_wire_queue *outq;   /* payload bytes queued in libzmq for every learner */
    double *param_norm;    /* [P] L2 norm of the committed global fragment */
    uint64_t max_frag_bytes; /* the largest fragment's fp32 bytes */
    double hello_tokens;   /* token bucket of Hellos from new ids */
    /* dynamic H (docs/HETEROGENEOUS.md): the median Heartbeat.steps_per_s of the live learners, recomputed at
     * every heartbeat, sent in every Ack (fleet_steps_per_s); rate_buf holds rate_cap doubles for the median */
    double fleet_sps;
    double *rate_buf;
    int rate_cap;
    uint64_t reclaimed_ids[DL_SYNC_RECLAIMED_IDS]; /* XXH64 of ids whose slot was reclaimed (a ring): */
    int n_reclaimed_ids;   /* such a learner must fetch when it comes back */
    int64_t errlog_ns;     /* error-reply log throttle: window start, lines, suppressed */
    uint64_t errlog_n, errlog_suppressed;
    int64_t hello_refill_ns;
    uint64_t fingerprint, epoch;
    uint64_t *numel;    /* [P] */
    float **params;     /* [P] committed global fragment (written by the worker after a commit) */
    float **momentum;   /* [P] */
    dl_wire_limits lim;

    pending_push *pend; /* pool, indexed by handle */
    size_t npend, cappend;
    dl_merge_contrib **aside; /* [P] dropped-stale pushes since the fragment's last merge */
    int *naside, *capaside;
    inbound *inb;        /* [max learners] chunked push arriving per slot */
    outbound *outx;      /* [max learners] Update being sent per slot */
    uint64_t *resume_v, *resume_o; /* [max learners * P] a Fetch's resume point per slot and fragment */
    kept_delta *kept;    /* [P] the latest delta per fragment (downlink codec on; memory only) */
    uint64_t pool_used;  /* bytes of pooled deltas + arriving chunked pushes (<= cfg.pool_bytes) */
    uint64_t pool_peak;
    ev_idle more;        /* the drain stopped at its budget with messages waiting */

    /* statistics (the snapshot formats them) */
    uint64_t merges, merged_contribs, stale_sum, dropped_stale, rejected, fetches;
    uint64_t refused_msgs, clipped, reclaimed, dropped_readers, deferred_updates, outbound_peak;
    uint64_t busy_refused, update_restarts, chunks_in, chunks_out, drain_yields, abandoned_in;
    uint64_t updates_full, updates_delta; /* Updates sent whole (all their chunks), by kind */
    uint64_t seq;
    int64_t started_ns, last_sync_ns;
    uint64_t *versions;               /* [P] snapshot buffer */
    dl_sync_learner_stats *lstats;    /* [max learners] snapshot buffer */
    struct owed_key *owed_order; /* [max learners] scratch of serve_all_owed */

    /* the operator view (docs/OPERATING.md): counters the loop feeds, and the
     * documents the HTTP thread serves, re-rendered by `publish` */
    dl_syncmet met;
    dl_httpd *httpd;         /* NULL: metrics = off */
    dl_httpd_pages *pages;
    ev_timer publish;
    dl_evalthread *evalt;    /* NULL: periodic evaluation off */
    ev_timer eval_timer;
    uint64_t known_learners; /* learner records in the store, counted at start and as new ids are put */
};

static int member(const dl_sync *s, int slot) { return (int)dl_policy_learner_state(s->policy, (uint32_t)slot); }
static int registered(const dl_sync *s, int slot)
{
    int m = member(s, slot);
    return m == DL_POLICY_MEMBER_LIVE || m == DL_POLICY_MEMBER_DEAD;
}

static void submit(dl_sync *s, dl_job *j) { dl_worker_submit(s->worker, j); }

/* 1 when this synchronizer (a shard, or the only one) owns fragment p. */
static int owns(const dl_sync *s, int p) { return dl_shard_owns(p, s->cfg.shard, s->cfg.shards); }

/* ------------------------------------------------------------------------ */
/* sending */

static void env_to(dl_sync *s, Dloco__V1__Envelope *env, const char *learner)
{
    dl_wire_env_init(env, s->cfg.run_id, s->epoch, learner);
    env->seq = ++s->seq;
}

/* A routing id as logs may show it: hex of its first bytes. Routing ids come
 * from libzmq (or from the peer): they are never printed raw. */
static const char *route_str(const uint8_t *r, size_t n, char buf[40])
{
    static const char hx[] = "0123456789abcdef";
    size_t k = 0, m = n < 16 ? n : 16;
    for (size_t i = 0; i < m; i++) {
        buf[k++] = hx[r[i] >> 4];
        buf[k++] = hx[r[i] & 15];
    }
    if (m < n) buf[k++] = '+';
    buf[k] = 0;
    return buf;
}

static uint64_t attached_bytes(const dl_sync *s);
static void serve_all_owed(dl_sync *s);

/* Never block the loop: a learner whose queue is full loses this message
 * (it will get the next update; a lost Ack only leaves its log incomplete).
 * Nothing goes to a learner whose connection was cut off. */
static int send_msg(dl_sync *s, dl_registry_learner *l, Dloco__V1__Envelope *env, const void *payload, size_t len)
{
    if (!l->route_len) return DL_ENOTFOUND;
    const void *pl[1] = {payload};
    size_t lens[1] = {len};
    dl_wire_queue *q[2] = {s->outq, l->outq};
    int rc = dl_wire_send_q(s->router, l->route, l->route_len, env, payload ? pl : NULL, payload ? lens : NULL,
                            payload ? 1 : 0, ZMQ_DONTWAIT, q);
    if (rc == 0) {
        l->bytes_out += len + 64;
        s->met.bytes_out[dl_syncmet_kind(env->body_case)] += len + 64;
        s->met.msgs_out[dl_syncmet_kind(env->body_case)]++;
        if (len) {
            uint64_t q = attached_bytes(s);
            if (q > s->outbound_peak) s->outbound_peak = q;
        }
    } else if (rc == DL_EAGAIN) {
        DL_WARN("learner %s: send queue full, %s dropped", l->id, dl_wire_body_name(env->body_case));
    } else if (rc == DL_ENOTFOUND) {
        DL_DEBUG("learner %s: not connected, %s dropped", l->id, dl_wire_body_name(env->body_case));
    } else {
        DL_WARN("send %s to %s: %s", dl_wire_body_name(env->body_case), l->id, dl_errmsg());
    }
    return rc;
}

/* An Error to a connection. `learner` names the addressee when it is a
 * valid id (else the reply's learner_id is empty). */
static void send_error(dl_sync *s, const uint8_t *route, size_t rlen, const char *learner, int code, int fatal,
                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void send_error(dl_sync *s, const uint8_t *route, size_t rlen, const char *learner, int code, int fatal,
                       const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int valid = dl_wire_id_ok(learner);
    Dloco__V1__Envelope env;
    Dloco__V1__Error e;
    dloco__v1__error__init(&e);
    e.kind = dl_wire_error_kind_of(code); /* DL_E* codes never travel */
    e.message = msg;
    e.fatal = fatal;
    env_to(s, &env, valid ? learner : "");
    dl_wire_set_error(&env, &e);
    int rc = rlen ? dl_wire_send(s->router, route, rlen, &env, NULL, NULL, 0, ZMQ_DONTWAIT) : DL_ENOTFOUND;
    char rb[40], mb[600];
    if (rc) DL_DEBUG("error reply to %s not sent: %s", valid ? learner : route_str(route, rlen, rb), dl_errmsg());
    /* at most 10 lines a second: refused peers must not flood the log */
    int64_t now = dl_clock_ns();
    if (now - s->errlog_ns >= 1000000000LL) {
        if (s->errlog_suppressed)
            DL_INFO("(%llu more error replies in the last second not logged)",
                    (unsigned long long)s->errlog_suppressed);
        s->errlog_ns = now;
        s->errlog_n = s->errlog_suppressed = 0;
    }
    if (s->errlog_n++ >= 10) {
        s->errlog_suppressed++;
        return;
    }
    /* msg may quote what a peer sent (ids are validated, the rest is escaped) */
    DL_INFO("%s %s: %s error: %s", valid ? "learner" : "connection", valid ? learner : route_str(route, rlen, rb),
            fatal ? "fatal" : "non-fatal", dl_event_str(msg, mb, sizeof mb));
}

/* Elements per Update chunk to learner l: the configured chunk, at most
 * what the learner said it takes; 0 = whole fragments (a learner from
 * before chunking). */
static uint64_t chunk_elems(const dl_sync *s, const dl_registry_learner *l)
{
    if (!l->max_chunk) return 0;
    uint64_t b = s->cfg.chunk_bytes < l->max_chunk ? s->cfg.chunk_bytes : l->max_chunk;
    return b / sizeof(float);
}

/* One Update message: elements [off, off + n) of version `version` of
 * fragment p (chunked when `chunked`, else the whole fragment), `bytes` of
 * payload in codec c: the values (fp32), or with `delta` the delta from
 * version - 1. */
static int send_update_chunk(dl_sync *s, dl_registry_learner *l, int p, uint64_t version, const dl_codec *c,
                             int delta, const void *data, size_t bytes, uint64_t off, uint64_t n, int chunked)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Update u;
    dloco__v1__update__init(&u);
    u.fragment = (uint32_t)p;
    u.version = version;
    u.codec = (Dloco__V1__Codec)c->id;
    u.block_size = c->block;
    u.topk = c->topk;
    u.delta = delta;
    u.numel = s->numel[p];
    u.chunk_offset = chunked ? off : 0;
    u.chunk_numel = chunked ? n : 0;
    u.checksum = dl_wire_checksum(data, bytes);
    env_to(s, &env, l->id);
    dl_wire_set_update(&env, &u);
    int rc = send_msg(s, l, &env, data, bytes);
    if (rc == 0) s->chunks_out++;
    return rc;
}

/* The outbound bounds: may `bytes` more be queued for learner l now? A
 * learner with nothing queued always may (a fragment above its own bound
 * still goes, one at a time). */
/* Payload bytes libzmq holds for learners whose connection is attached. A
 * learner dropped for not reading (or revoked) is detached: what it pins no
 * longer holds the budget of those that read, and it is bounded anyway (its
 * id cannot get a new connection while the old one holds bytes, on_hello). */
static uint64_t attached_bytes(const dl_sync *s)
{
    uint64_t t = 0;
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        const dl_registry_learner *l = dl_registry_cget(s->reg, i);
        if (l->used && l->route_len) t += dl_wire_queue_bytes(l->outq);
    }
    return t;
}

/* Room for `bytes` more to learner l: within its own bound and the global
 * one. A learner whose queue is empty (it reads) may also use one fragment
 * of overdraft above the global bound, so learners that never read cannot
 * starve it while they hold the budget (until they are dropped): the
 * attached total stays <= max_outbound_bytes + the largest fragment. */
static int outbound_room(const dl_sync *s, const dl_registry_learner *l, size_t bytes)
{
    uint64_t mine = dl_wire_queue_bytes(l->outq), all = attached_bytes(s);
    if (mine == 0) return all + bytes <= s->cfg.max_outbound_bytes + s->max_frag_bytes;
    return mine + bytes <= s->cfg.peer_outbound_bytes && all + bytes <= s->cfg.max_outbound_bytes;
}

static void owe(dl_sync *s, dl_registry_learner *l, int p)
{
    if (l->owed[p]) return; /* one in progress ends at the newest version anyway (pump restarts it) */
    if (!l->n_owed) l->owed_since_ns = dl_clock_ns();
    l->owed[p] = 1;
    l->n_owed++;
    s->deferred_updates++;
}

static void send_ack_busy(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                          uint64_t merged, const char *reason, int rebase, uint32_t retry_after_ms)
{
    Dloco__V1__Envelope env;
    Dloco__V1__Ack a;
    dloco__v1__ack__init(&a);
    a.fragment = (uint32_t)p;
    a.base_version = base;
    a.decision = d;
    a.merged_version = merged;
    a.reason = (char *)reason;
    a.rebase = rebase;
    a.busy = retry_after_ms > 0;
    a.retry_after_ms = retry_after_ms;
    a.fleet_steps_per_s = s->fleet_sps;
    env_to(s, &env, l->id);
    dl_wire_set_ack(&env, &a);
    send_msg(s, l, &env, NULL, 0);
}

static void send_ack(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                     uint64_t merged, const char *reason, int rebase)
{
    send_ack_busy(s, l, p, base, d, merged, reason, rebase, 0);
}

static int slot_of(const dl_sync *s, const dl_registry_learner *l)
{
    return (int)(l - dl_registry_cget(s->reg, 0));
}

/* Forget the Update in progress to a learner (its connection changed or
 * went); what it owes stays owed. */
static void outbound_reset(dl_sync *s, int slot)
{
    s->outx[slot].p = -1;
    s->outx[slot].started = 0;
    s->outx[slot].delta = 0;
}

/* Forget a slot's resume points (a new connection, a new learner in the slot). */
static void resume_clear(dl_sync *s, int slot)
{
    size_t P = (size_t)s->cfg.P;
    memset(s->resume_v + (size_t)slot * P, 0, P * sizeof *s->resume_v);
    memset(s->resume_o + (size_t)slot * P, 0, P * sizeof *s->resume_o);
}

/* Elements per chunk of a delta Update of codec c: the fp32 chunk's
 * elements (ce, 0 = whole fragments), down to whole blocks for a block
 * codec (a chunk starts on a block: proto/wire.c); 0 when not one block
 * fits. */
static uint64_t delta_chunk_elems(uint64_t ce, const dl_codec *c)
{
    return dl_codec_is_block(c->id) ? ce - ce % c->block : ce;
}

/* Version v of fragment p goes to learner `slot` as a delta iff the kept
 * delta is v's and the version it was last given whole (since its Hello,
 * and since a Fetch or rebase of p) is v - 1; else (missed versions, a
 * Fetch, a rebase, its first Update after a Hello, no delta kept) it gets
 * the full fp32 values. A chunked learner also needs a chunk to hold a
 * block. */
static int delta_for(const dl_sync *s, int slot, int p, uint64_t v, uint64_t ce)
{
    const kept_delta *kd = &s->kept[p];
    uint64_t given;
    if (!kd->buf || kd->version != v || v == 0) return 0;
    if (!dl_registry_given(s->reg, slot, p, &given) || given + 1 != v) return 0;
    return !ce || delta_chunk_elems(ce, &kd->c) > 0;
}

/* Send what a learner is owed, chunk by chunk, as far as the outbound
 * bounds allow (payload bytes, as they go on the wire), from an LMDB read
 * snapshot the caller holds briefly (*snap, begun on first use): never from
 * memory a merge may be writing, and never a version the loop has not seen
 * committed yet (merge_done serves it then), so a learner never pushes from
 * a base the policy does not know. A delta (delta_for) comes from the kept
 * payload in memory instead, which only merge_done replaces. One fragment
 * at a time per learner; a fragment whose global version moved on
 * mid-transfer starts again at the new version (from its first element),
 * decided afresh: an interrupted delta leaves the learner at v - 1, so the
 * newer version goes full. The rest stays owed; the queue's drain wakes the
 * loop to go on. */
static void serve_owed(dl_sync *s, dl_registry_learner *l, dl_store_snap **snap)
{
    int slot = slot_of(s, l);
    outbound *x = &s->outx[slot];
    uint64_t ce = chunk_elems(s, l);
    while (l->n_owed && l->route_len) {
        if (x->p < 0 || !l->owed[x->p]) {
            x->p = -1;
            for (int p = 0; p < s->cfg.P && x->p < 0; p++)
                if (l->owed[p]) x->p = p;
            x->version = x->offset = 0;
            x->started = x->delta = 0;
        }
        int p = x->p;
        if (!*snap && dl_store_snapshot_begin(s->store, snap)) {
            DL_ERROR("snapshot for %s: %s", l->id, dl_errmsg());
            *snap = NULL;
            return;
        }
        uint64_t v;
        size_t n;
        if (dl_store_snapshot_info(*snap, (uint32_t)p, &v, &n)) {
            DL_ERROR("snapshot fragment %d: %s", p, dl_errmsg());
            return; /* still owed: the next tick tries again */
        }
        if (v > dl_policy_version(s->policy, p)) return; /* committed, not yet seen by the loop: merge_done serves it */
        if (!ce && x->offset) x->started = 0; /* it said Hello again without chunks: whole fragments from now */
        const kept_delta *kd = &s->kept[p];
        if (!x->started || x->version != v || (x->delta && kd->version != v)) {
            if (x->started && x->offset) {
                s->update_restarts++;
                dl_event("update_restarted", "id=%s frag=%d from=%llu to=%llu sent=%llu delta=%d", l->id, p,
                         (unsigned long long)x->version, (unsigned long long)v, (unsigned long long)x->offset,
                         x->delta);
            }
            size_t r = (size_t)slot * (size_t)s->cfg.P + (size_t)p;
            x->started = 1;
            x->version = v;
            x->delta = delta_for(s, slot, p, v, ce);
            x->offset = !x->delta && ce && s->resume_v[r] == v && s->resume_o[r] < n ? s->resume_o[r] : 0;
            if (x->offset) dl_event("update_resumed", "id=%s frag=%d version=%llu offset=%llu", l->id, p,
                                    (unsigned long long)v, (unsigned long long)x->offset);
            s->resume_v[r] = s->resume_o[r] = 0;
        }
        uint64_t left = n - x->offset;
        if (x->delta) {
            uint64_t de = delta_chunk_elems(ce, &kd->c), cn = de && de < left ? de : left;
            size_t at = x->offset ? (size_t)dl_codec_bytes(&kd->c, x->offset) : 0;
            size_t bytes = (size_t)dl_codec_bytes(&kd->c, cn);
            assert(at + bytes <= kd->bytes);
            if (!outbound_room(s, l, bytes)) return;
            if (send_update_chunk(s, l, p, v, &kd->c, 1, kd->buf + at, bytes, x->offset, cn, ce != 0)) return;
            x->offset += cn;
        } else {
            uint64_t cn = ce && ce < left ? ce : left;
            if (!outbound_room(s, l, (size_t)cn * sizeof(float))) return;
            /* zero-copy from the map when the chunk lies in one stored block
             * (chunk_bytes divides the store's 1 MiB blocks); a whole fragment
             * for a learner from before chunking is copied once per snapshot */
            const float *pp;
            size_t got;
            uint64_t v2;
            int src = ce ? dl_store_snapshot_range(*snap, (uint32_t)p, x->offset, (size_t)cn, &v2, &pp, &got)
                         : dl_store_snapshot_fragment(*snap, (uint32_t)p, &v2, &pp, &got);
            if (src || got != cn) {
                DL_ERROR("snapshot fragment %d [%llu, +%llu): %s", p, (unsigned long long)x->offset,
                         (unsigned long long)cn, dl_errmsg());
                return;
            }
            static const dl_codec fp32 = {.id = DL_CODEC_FP32};
            int rc = send_update_chunk(s, l, p, v, &fp32, 0, pp, (size_t)cn * sizeof(float), x->offset, cn, ce != 0);
            if (rc) return; /* its queue is full (in messages), or it is gone: still owed */
            x->offset += cn;
        }
        if (x->offset < n) continue;
        /* all of version v is on its way: progress on it counts from now,
         * and a delta to v + 1 may follow */
        dl_registry_base_add(s->reg, slot, p, v, dl_clock_ns());
        dl_registry_given_set(s->reg, slot, p, v);
        if (x->delta) s->updates_delta++;
        else s->updates_full++;
        l->owed[p] = 0;
        l->n_owed--;
        x->p = -1;
    }
}

static void serve_one(dl_sync *s, dl_registry_learner *l)
{
    dl_store_snap *snap = NULL;
    serve_owed(s, l, &snap);
    dl_store_snapshot_end(&snap);
}

/* A Fetch or a rebase: the fragments (nf 0: all of this shard's) are owed
 * as full fp32 values, whatever the learner was given before (its copy of
 * them is not to be trusted for a delta any more). */
static void serve_fragments(dl_sync *s, dl_registry_learner *l, const uint32_t *frags, size_t nf)
{
    int slot = slot_of(s, l);
    outbound *x = &s->outx[slot];
    size_t count = nf ? nf : (size_t)s->cfg.P;
    for (size_t i = 0; i < count; i++) {
        int p = nf ? (int)frags[i] : (int)i; /* listed ones: checked by proto/wire.c */
        if (!nf && !owns(s, p)) continue;
        dl_registry_given_clear(s->reg, slot, p);
        if (x->p == p && x->delta) outbound_reset(s, slot);
        owe(s, l, p);
    }
    serve_one(s, l);
}

/* ------------------------------------------------------------------------ */
/* the pool */

/* Pool memory: a delta buffer of fragment p's size, counted in pool_used
 * (the caller checked the room). */
static float *pool_alloc(dl_sync *s, int p)
{
    s->pool_used += s->numel[p] * sizeof(float);
    if (s->pool_used > s->pool_peak) s->pool_peak = s->pool_used;
    return dl_xaligned(64, s->numel[p] * sizeof(float));
}

static void pool_free(dl_sync *s, int p, float *buf)
{
    if (!buf) return;
    assert(s->pool_used >= s->numel[p] * sizeof(float));
    s->pool_used -= s->numel[p] * sizeof(float);
    free(buf);
}

static void free_pending(dl_sync *s, uint64_t h)
{
    assert(h < s->npend && s->pend[h].used);
    pool_free(s, s->pend[h].fragment, s->pend[h].delta);
    s->pend[h].delta = NULL;
    s->pend[h].used = 0;
}

/* Drop the chunked push arriving from a slot, if any (its learner left,
 * changed connection, or broke the chunk order). */
static void inbound_drop(dl_sync *s, int slot, const char *why)
{
    inbound *in = &s->inb[slot];
    if (in->active) {
        s->abandoned_in++;
        dl_event("push_abandoned", "id=%s frag=%u base=%llu received=%llu numel=%llu reason=%s",
                 dl_registry_get(s->reg, slot)->id, in->fragment, (unsigned long long)in->base_version,
                 (unsigned long long)in->received, (unsigned long long)in->numel, why);
        pool_free(s, (int)in->fragment, in->buf);
    }
    memset(in, 0, sizeof *in);
}

static uint64_t alloc_pending(dl_sync *s)
{
    for (size_t i = 0; i < s->npend; i++)
        if (!s->pend[i].used) return i;
    if (s->npend == s->cappend) {
        s->cappend = s->cappend ? s->cappend * 2 : 64;
        s->pend = dl_xrealloc(s->pend, s->cappend * sizeof *s->pend);
    }
    memset(&s->pend[s->npend], 0, sizeof s->pend[0]);
    return s->npend++;
}

static void add_aside(dl_sync *s, int p, const dl_merge_contrib *c)
{
    for (int i = 0; i < s->naside[p]; i++)
        if (!strcmp(s->aside[p][i].learner_id, c->learner_id)) { /* the latest per learner: repeats cannot grow it */
            s->aside[p][i] = *c;
            return;
        }
    if (s->naside[p] == s->capaside[p]) {
        s->capaside[p] = s->capaside[p] ? 2 * s->capaside[p] : 8;
        s->aside[p] = dl_xrealloc(s->aside[p], (size_t)s->capaside[p] * sizeof **s->aside);
    }
    s->aside[p][s->naside[p]++] = *c;
}

/* ------------------------------------------------------------------------ */
/* rounds */

static const char *id_of_slot(void *ctx, uint32_t slot)
{
    dl_sync *s = ctx;
    return dl_registry_get(s->reg, (int)slot)->id;
}

static void submit_round(dl_sync *s, const dl_policy_round *r)
{
    int p = r->fragment;
    /* the share is the policy's (policy.h "Share"): per fragment, from pushes
     * that passed the guards */
    dl_round_in in = {.epoch = s->epoch,
                      .staleness_fn = dl_policy_sfn_name(s->cfg.policy.sfn),
                      .learner_id = id_of_slot,
                      .ctx = s,
                      .asides = s->aside[p],
                      .n_asides = s->naside[p]};
    dl_round_out out;
    dl_round_assemble(r, &in, &out);
    s->naside[p] = 0;

    dl_job *j = dl_job_new(DL_JOB_MERGE);
    j->mopts = s->cfg.merge;
    j->param_abs_max = s->cfg.guard.param_abs_max;
    j->fragment = p;
    j->version = r->version;
    j->share = out.share;
    j->rec = out.rec; /* the job owns the contributors now */
    j->m = r->n;
    j->deltas = dl_xcalloc((size_t)r->n, sizeof(float *));
    j->w = dl_xcalloc((size_t)r->n, sizeof(double));
    j->handles = dl_xcalloc((size_t)r->n, sizeof(uint64_t));
    for (int i = 0; i < r->n; i++) {
        j->handles[i] = r->contribs[i].handle;
        j->deltas[i] = s->pend[r->contribs[i].handle].delta;
        j->w[i] = r->contribs[i].weight;
    }
    /* the ledger's pending changes and this round's applied tokens commit
     * with the merge, in its transaction */
    dl_ledger_take(s->ledger, &j->ledger);
    j->ledger.tokens[DL_LEDGER_APPLIED] = out.applied_tokens;
    char line[512];
    dl_policy_round_format(r, line, sizeof line);
    dl_syncmet_round(&s->met, r);
    DL_DEBUG("round closed: %s", line);
    submit(s, j);
}

static void schedule(dl_sync *s)
{
    if (s->stopping) return;
    int64_t now = dl_clock_ns();
    dl_policy_round r;
    while (dl_policy_poll(s->policy, now, &r)) submit_round(s, &r);
    int64_t next = dl_policy_next_deadline(s->policy);
    ev_timer_stop(s->loop, &s->deadline);
    if (next != DL_POLICY_NEVER) {
        double after = (double)(next - now) * 1e-9;
        ev_timer_set(&s->deadline, after > 0 ? after + 1e-4 : 1e-4, 0.0);
        ev_timer_start(s->loop, &s->deadline);
    }
}

static void merge_done(dl_sync *s, dl_job *j)
{
    int p = j->fragment;
    int64_t now = dl_clock_ns();
    if (j->rc) {
        DL_ERROR("merge of fragment %d onto v%llu failed, round abandoned: %s", p, (unsigned long long)j->version,
                 j->err);
        char ebuf[400];
        dl_event("merge_failed", " frag=%d version=%llu reason=%s", p, (unsigned long long)j->version,
                 dl_event_str(j->err, ebuf, sizeof ebuf));
        dl_policy_abandon(s->policy, p, now);
        /* nothing of the job's ledger delta was persisted: the pending part
         * goes back, the applied part never happened */
        j->ledger.tokens[DL_LEDGER_APPLIED] = 0;
        dl_ledger_untake(s->ledger, &j->ledger);
        for (int i = 0; i < j->m; i++) {
            pending_push *pp = &s->pend[j->handles[i]];
            dl_registry_learner *l = dl_registry_get(s->reg, (int)pp->learner);
            dl_ledger_failed(s->ledger, (int)pp->learner, p, pp->base_version, pp->tokens);
            /* answered REJECTED below: counted as the learner counts it */
            l->rejected++;
            s->rejected++;
            s->met.push_rejected[DL_SM_REJ_MERGE_FAILED]++;
            /* no rebase: the pushed progress is still in the learner's
             * parameters (theta - base) and goes into its next push */
            send_ack(s, l, p, j->rec.contrib[i].base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0,
                     "merge failed on the synchronizer; the progress goes into your next push", 0);
            free_pending(s, j->handles[i]);
        }
        return;
    }
    uint64_t nv = j->version + 1;
    if (j->update) {
        /* the delta to nv replaces the one to nv - 1: who still needs that
         * one has missed nv and gets nv full (delta_for) */
        kept_delta *kd = &s->kept[p];
        free(kd->buf);
        kd->buf = j->update;
        kd->bytes = j->update_bytes;
        kd->version = nv;
        kd->c = j->update_codec;
        j->update = NULL;
    }
    double stale = 0, compute_s = 0;
    for (int i = 0; i < j->m; i++) {
        pending_push *pp = &s->pend[j->handles[i]];
        compute_s += pp->compute_s;
        dl_registry_learner *l = dl_registry_get(s->reg, (int)pp->learner);
        const dl_merge_contrib *mc = &j->rec.contrib[i];
        l->merged++;
        l->tokens_applied += mc->tokens;
        l->last_staleness = mc->staleness;
        dl_prom_hist_observe(&s->met.staleness, (double)mc->staleness);
        stale += (double)mc->staleness;
        s->stale_sum += mc->staleness;
        dl_ledger_merged(s->ledger, (int)pp->learner, p, pp->tokens);
        dl_guard_applied(s->guard, (int)pp->learner, p, pp->base_version);
        if (registered(s, (int)pp->learner)) {
            send_ack(s, l, p, mc->base_version, DLOCO__V1__DECISION__DECISION_ACCEPTED, nv, "", 0);
            owe(s, l, p); /* sent from a snapshot (on_wake serves it once the policy knows nv) */
        }
        /* one line per merged push, before the merge's own line: whose training
         * time (compute_s) went into which version, with its weight */
        char idbuf[4 * DL_STORE_ID_MAX + 8];
        dl_event("merge_contrib",
                 "frag=%d version=%llu id=%s base=%llu staleness=%llu tokens=%llu compute_s=%.6f weight=%.6g", p,
                 (unsigned long long)nv, dl_event_str(mc->learner_id, idbuf, sizeof idbuf),
                 (unsigned long long)mc->base_version, (unsigned long long)mc->staleness,
                 (unsigned long long)mc->tokens, pp->compute_s, mc->weight);
        free_pending(s, j->handles[i]);
    }
    /* every registered learner holds fragment p (a shard's learners hold
     * all of its fragments), contributor or not: it is owed nv, so nobody
     * stays behind. An Update it is owed and not yet sent ends at the newest
     * version anyway; a dead one is served when it is heard from again
     * (serve_all_owed serves live learners only), with whatever is newest
     * then. */
    for (int i = 0; i < dl_registry_count(s->reg) && !s->cfg.unicast; i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (l->used && registered(s, i)) owe(s, l, p);
    }
    s->param_norm[p] = j->param_norm;
    s->merges++;
    s->merged_contribs += (uint64_t)j->m;
    s->met.tokens_merged += j->ledger.tokens[DL_LEDGER_APPLIED];
    dl_syncmet_merged(&s->met, p, (uint32_t)j->m, j->work_s, j->store_s);
    dl_policy_committed(s->policy, p, nv, now);
    double share = j->mopts.share_scaling ? j->share : 1.0;
    DL_INFO("merge frag %d v%llu: %d learner(s), mean staleness %.2f, share %.2f, |delta| %.4g", p,
            (unsigned long long)nv, j->m, j->m ? stale / j->m : 0.0, share, j->norm);
    dl_event("merge",
             "frag=%d version=%llu n=%d staleness_mean=%.3f share=%.4f norm=%.6g tokens=%llu compute_s=%.6f "
             "retries=%d hash=%016llx",
             p, (unsigned long long)nv, j->m, j->m ? stale / j->m : 0.0, share, j->norm,
             (unsigned long long)j->ledger.tokens[DL_LEDGER_APPLIED], compute_s, j->retries,
             (unsigned long long)j->hash);
}

/* ------------------------------------------------------------------------ */
/* inbound messages */

/* Counters written to the store move this sum: the tick writes a record
 * again when it changed (DL_SYNC_PUT_EVERY_NS), so `dloco status STORE`
 * shows a live run's counters, not only the ones of learners that left. */
static uint64_t put_sig(const dl_registry_learner *l)
{
    return l->pushes + l->merged + l->dropped + l->rejected + l->tokens_applied + l->step + l->tokens;
}

/* The store record of l's counters now; l->put_* say it was written. */
static void learner_record(dl_registry_learner *l, dl_store_learner *r)
{
    l->put_ns = dl_clock_ns();
    snprintf(r->id, sizeof r->id, "%s", l->id);
    r->first_seen_ns = l->first_seen_wall;
    r->last_seen_ns = dl_wallclock_ns();
    r->pushes = l->pushes;
    r->merged = l->merged;
    r->dropped = l->dropped;
    r->tokens_applied = l->tokens_applied;
    r->bytes_in = l->bytes_in;
    r->bytes_out = l->bytes_out;
    r->rejected = l->rejected;
    r->step = l->step;
    r->tokens = l->tokens;
    l->put_sig = put_sig(l);
    l->put_dirty = 0;
}

static void learner_put_now(dl_sync *s, dl_registry_learner *l)
{
    dl_job *j = dl_job_new(DL_JOB_LEARNER_PUT);
    learner_record(l, &j->lrec);
    submit(s, j);
}

/* A learner this process meets for the first time: its counters go on from
 * the store's record (a restarted synchronizer keeps them), or it is a new
 * id of the run. A short read snapshot on the loop, like a Fetch. (A slot
 * reclaimed in this process and taken again before the worker wrote its
 * last record reads the record before that one: counters of at most a few
 * seconds are lost, never doubled.) */
static void restore_counters(dl_sync *s, dl_registry_learner *l)
{
    dl_store_learner r;
    int rc = dl_store_learner_get(s->store, l->id, &r);
    if (rc == DL_ENOTFOUND) s->known_learners++;
    if (rc) {
        if (rc != DL_ENOTFOUND) DL_WARN("learner %s: its stored counters cannot be read: %s", l->id, dl_errmsg());
        return;
    }
    l->first_seen_wall = r.first_seen_ns;
    l->pushes = r.pushes;
    l->merged = r.merged;
    l->dropped = r.dropped;
    l->rejected = r.rejected;
    l->tokens_applied = r.tokens_applied;
    l->bytes_in = r.bytes_in;
    l->bytes_out = r.bytes_out;
}

/* At most one registry record a second per learner: a peer repeating
 * Hellos cannot fill the worker's queue (the tick and shutdown write the
 * rest). */
static void learner_put(dl_sync *s, dl_registry_learner *l)
{
    if (l->put_ns && dl_clock_ns() - l->put_ns < 1000000000LL) {
        l->put_dirty = 1;
        return;
    }
    l->put_dirty = 0;
    learner_put_now(s, l);
}

/* 1 while the learner's connection is still attached on the ROUTER: a
 * header-only heartbeat to it is accepted (or would block), not
 * EHOSTUNREACH. */
static int route_connected(dl_sync *s, dl_registry_learner *l)
{
    if (!l->route_len) return 0;
    /* at most one probe per heartbeat period: Hellos repeated from another
     * connection must not flood the real learner's queue with probes */
    int64_t now = dl_clock_ns();
    if (l->probe_ns && now - l->probe_ns < (int64_t)s->cfg.heartbeat_ms * 1000000LL) return l->probe_ok;
    l->probe_ns = now;
    Dloco__V1__Envelope env;
    Dloco__V1__Heartbeat hb;
    dloco__v1__heartbeat__init(&hb);
    env_to(s, &env, l->id);
    dl_wire_set_heartbeat(&env, &hb);
    int rc = dl_wire_send(s->router, l->route, l->route_len, &env, NULL, NULL, 0, ZMQ_DONTWAIT);
    l->probe_ok = rc == 0 || rc == DL_EAGAIN;
    return l->probe_ok;
}

/* Token bucket of Hellos from ids the registry does not hold. */
static int new_hello_allowed(dl_sync *s, int64_t now)
{
    double rate = s->cfg.max_new_hellos_per_s, burst = s->cfg.new_hello_burst;
    s->hello_tokens += (double)(now - s->hello_refill_ns) * 1e-9 * rate;
    if (s->hello_tokens > burst) s->hello_tokens = burst;
    s->hello_refill_ns = now;
    if (s->hello_tokens < 1.0) return 0;
    s->hello_tokens -= 1.0;
    return 1;
}

/* A slot of a learner that left, or died (not under the `sync` policy,
 * whose barrier waits for the dead), more than reclaim_ms ago, with nothing
 * pooled and nothing queued: forget it everywhere so the number can be
 * reused. 1 when reclaimed. */
static int try_reclaim(dl_sync *s, int slot, int64_t now)
{
    dl_registry_learner *l = dl_registry_get(s->reg, slot);
    if (!l->used) return 0;
    int m = member(s, slot);
    if (m == DL_POLICY_MEMBER_LIVE) return 0;
    if (m == DL_POLICY_MEMBER_DEAD && s->cfg.policy.kind == DL_POLICY_SYNC) return 0;
    if (!l->left_ns || now - l->left_ns < (int64_t)s->cfg.reclaim_ms * 1000000LL) return 0;
    if (dl_wire_queue_bytes(l->outq) > 0) return 0;
    for (size_t i = 0; i < s->npend; i++)
        if (s->pend[i].used && s->pend[i].learner == (uint32_t)slot) return 0;
    if (dl_policy_learner_forget(s->policy, (uint32_t)slot)) return 0;
    learner_put_now(s, l); /* its counters stay in the store */
    dl_ledger_forget(s->ledger, slot);
    dl_guard_forget(s->guard, slot);
    s->reclaimed_ids[s->n_reclaimed_ids++ % DL_SYNC_RECLAIMED_IDS] = dl_hash64(l->id, strlen(l->id), 0);
    dl_event("learner_reclaimed", "id=%s slot=%d away_ms=%lld", l->id, slot, (long long)((now - l->left_ns) / 1000000));
    DL_INFO("learner %s: slot %d reclaimed after %.1f s away", l->id, slot, (double)(now - l->left_ns) * 1e-9);
    inbound_drop(s, slot, "reclaimed");
    outbound_reset(s, slot);
    resume_clear(s, slot);
    dl_registry_remove(s->reg, slot);
    s->reclaimed++;
    return 1;
}

static void mark_left(dl_sync *s, dl_registry_learner *l, int slot, int64_t now, dl_policy_leave why)
{
    dl_policy_learner_leave(s->policy, (uint32_t)slot, now, why);
    l->left_ns = now;
    inbound_drop(s, slot, why == DL_POLICY_LEAVE_BYE ? "bye" : "dead");
}

static void on_hello(dl_sync *s, dl_wire_msg *msg, const Dloco__V1__Envelope *env, const Dloco__V1__Hello *h)
{
    const uint8_t *route = msg->id;
    size_t rlen = msg->id_len;
    const char *id = env->learner_id;
    if (strcmp(env->run_id, s->cfg.run_id)) {
        send_error(s, route, rlen, id, DL_EMISMATCH, 1, "run id '%s' is not this synchronizer's run '%s'",
                   env->run_id, s->cfg.run_id);
        return;
    }
    const dl_model_config *m = &s->cfg.model;
    if (h->fingerprint != s->fingerprint || h->num_fragments != (uint32_t)s->cfg.P) {
        send_error(s, route, rlen, id, DL_EMISMATCH, 1,
                   "model fingerprint %016llx (L=%u NH=%u C=%u T=%u V=%u P=%u) does not match the run's %016llx "
                   "(L=%d NH=%d C=%d T=%d V=%d P=%d)",
                   (unsigned long long)h->fingerprint, h->n_layer, h->n_head, h->n_embd, h->seq_len, h->vocab,
                   h->num_fragments, (unsigned long long)s->fingerprint, m->n_layer, m->n_head, m->n_embd,
                   m->seq_len, m->vocab, s->cfg.P);
        return;
    }
    char why[256];
    if (dl_guard_batch(s->guard, h->batch, why, sizeof why)) {
        send_error(s, route, rlen, id, DL_EINVAL, 1, "%s", why);
        return;
    }
    if (!h->max_chunk_bytes && s->max_frag_bytes + DL_WIRE_MAX_HEADER_BYTES > s->cfg.max_msg_bytes) {
        /* its whole pushes would exceed the message cap: libzmq would drop
         * its connection on each one, silently */
        send_error(s, route, rlen, id, DL_EMISMATCH, 1,
                   "this learner sends whole fragments (no Hello.max_chunk_bytes) of up to %llu bytes, but this "
                   "synchronizer takes messages of at most %llu bytes: use a learner that chunks its pushes",
                   (unsigned long long)s->max_frag_bytes, (unsigned long long)s->cfg.max_msg_bytes);
        return;
    }
    int64_t now = dl_clock_ns();
    int slot = dl_registry_find(s->reg, id);
    if (slot >= 0 && registered(s, slot) && !dl_registry_route_is(s->reg, slot, route, rlen) && h->instance) {
        /* a second live process with a registered id: refused for good
         * (below: the same process on a new connection, or a holder gone) */
        dl_registry_learner *l = dl_registry_get(s->reg, slot);
        int64_t live_ns = (int64_t)s->cfg.heartbeat_ms * s->cfg.liveness * 1000000LL;
        int other = l->instance && h->instance != l->instance;
        int64_t quiet_ms = (now - l->last_seen_ns) / 1000000;
        if (other && l->route_len && now - l->last_seen_ns <= live_ns && route_connected(s, l)) {
            send_error(s, route, rlen, id, DL_EPROTO, 1,
                       "duplicate_id: learner id '%s' is held by another live learner process (heard from %lld ms "
                       "ago on another connection): give this one another --id", id, (long long)quiet_ms);
            dl_event("learner_duplicate", "id=%s action=duplicate_id", id);
            DL_WARN("learner %s: a Hello from a second process with this id refused (duplicate_id)", id);
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_DUPLICATE]++;
            return;
        }
    }
    if (slot >= 0 && !dl_registry_route_is(s->reg, slot, route, rlen) &&
        dl_wire_queue_bytes(dl_registry_get(s->reg, slot)->outq) > 0) {
        /* what libzmq holds for the id's previous connection is bounded per
         * learner only if a new connection waits until it is gone */
        send_error(s, route, rlen, id, DL_EAGAIN, 0,
                   "learner '%s' has %llu bytes still queued on its previous connection: retry when it is closed", id,
                   (unsigned long long)dl_wire_queue_bytes(dl_registry_get(s->reg, slot)->outq));
        dl_event("learner_duplicate", "id=%s action=busy_previous", id);
        s->refused_msgs++;
        s->met.msg_refused[DL_SM_MSG_DUPLICATE]++;
        return;
    }
    if (slot >= 0 && registered(s, slot) && !dl_registry_route_is(s->reg, slot, route, rlen)) {
        /* the id is registered on another connection. Hello.instance tells
         * the same process on a new connection (it takes over at once) from
         * another process: refused for good while the holder is attached and
         * heard from within liveness, else it takes over (docs/PROTOCOL.md
         * "Duplicate ids") */
        dl_registry_learner *l = dl_registry_get(s->reg, slot);
        int same = h->instance && h->instance == l->instance;
        int other = h->instance && l->instance && h->instance != l->instance;
        int64_t quiet_ms = (now - l->last_seen_ns) / 1000000;
        if (same) {
            dl_event("learner_duplicate", "id=%s action=reconnected", id);
        } else if (other && l->route_len && route_connected(s, l)) {
            /* attached but silent past liveness (above): the new process
             * takes the id; the old one, should it wake up, is told */
            send_error(s, l->route, l->route_len, id, DL_EPROTO, 1,
                       "duplicate_id: learner id '%s' was taken over by another learner process after %lld ms of "
                       "silence: this one is closed", id, (long long)quiet_ms);
            dl_event("learner_duplicate", "id=%s action=took_over_silent silent_ms=%lld", id, (long long)quiet_ms);
            DL_WARN("learner %s: another process took the id over after %.1f s of silence", id, (double)quiet_ms * 1e-3);
        } else if (other) {
            dl_event("learner_duplicate", "id=%s action=took_over_gone", id);
        } else if (l->route_len && route_connected(s, l)) {
            /* an older learner (no instance): the id alone decides */
            if (!s->auth) {
                send_error(s, route, rlen, id, DL_EPROTO, 0,
                           "learner id '%s' is live on another connection: refused (retry when it is gone)", id);
                dl_event("learner_duplicate", "id=%s action=refused", id);
                s->refused_msgs++;
                s->met.msg_refused[DL_SM_MSG_DUPLICATE]++;
                return;
            }
            /* with CURVE the key proves the identity: the newer connection
             * wins, the old one is told and cut off */
            send_error(s, l->route, l->route_len, id, DL_EPROTO, 1,
                       "learner id '%s' connected again from another connection: this one is closed", id);
            dl_event("learner_duplicate", "id=%s action=replaced", id);
            DL_WARN("learner %s: a new connection with its key replaces the old one", id);
        } else if (l->route_len) {
            dl_event("learner_duplicate", "id=%s action=took_over_gone", id);
        }
    }
    if (slot < 0) {
        if (!new_hello_allowed(s, now)) {
            send_error(s, route, rlen, id, DL_EAGAIN, 0, "too many new learners joining: retry in a second");
            dl_event("hello_limited", "id=%s", id);
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_LIMITS]++;
            return;
        }
        slot = dl_registry_add(s->reg, id, dl_wallclock_ns());
        if (slot < 0) {
            /* a slot of one long gone may be free now */
            for (int i = 0; i < dl_registry_count(s->reg) && slot < 0; i++)
                if (try_reclaim(s, i, now)) slot = dl_registry_add(s->reg, id, dl_wallclock_ns());
        }
        if (slot < 0) {
            send_error(s, route, rlen, id, DL_ERANGE, 0, "%s; retry later", dl_errmsg());
            dl_event("hello_full", "id=%s max=%d", id, dl_registry_max(s->reg));
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_LIMITS]++;
            return;
        }
    }
    dl_registry_learner *l = dl_registry_get(s->reg, slot);
    if (!dl_registry_route_is(s->reg, slot, route, rlen)) {
        /* a new connection: nothing in flight on the old one arrives any more */
        inbound_drop(s, slot, "new_connection");
        outbound_reset(s, slot);
        resume_clear(s, slot);
        dl_registry_set_route(s->reg, slot, route, rlen, msg->user_id);
    }
    int was = member(s, slot) == DL_POLICY_MEMBER_LIVE;
    int rc = dl_policy_learner_join(s->policy, (uint32_t)slot, now);
    if (rc) {
        send_error(s, route, rlen, id, rc, 0, "cannot register: %s", dl_errmsg());
        return;
    }
    /* away longer than rebase_ms: its fragments are too old to push onto;
     * back after its slot was reclaimed: what was merged from it is forgotten */
    int away_long = l->hellos > 0 && now - l->last_seen_ns > (int64_t)s->cfg.rebase_ms * 1000000LL;
    if (l->hellos == 0) {
        restore_counters(s, l);
        uint64_t hid = dl_hash64(id, strlen(id), 0);
        int n = s->n_reclaimed_ids < DL_SYNC_RECLAIMED_IDS ? s->n_reclaimed_ids : DL_SYNC_RECLAIMED_IDS;
        for (int i = 0; i < n && !away_long; i++) away_long = s->reclaimed_ids[i] == hid;
    }
    l->last_seen_ns = now;
    l->hello_ns = now;
    l->left_ns = 0;
    l->hellos++;
    l->batch = h->batch;
    l->instance = h->instance;
    l->max_chunk = h->max_chunk_bytes & ~3u;
    /* whatever it holds, its first Update of each fragment from now is full */
    dl_registry_given_clear(s->reg, slot, -1);
    if (s->outx[slot].delta) outbound_reset(s, slot);
    dl_ledger_hello(s->ledger, slot, h->step);
    int must_fetch = h->n_held_versions == 0 || away_long;
    uint64_t *vers = dl_xcalloc((size_t)s->cfg.P, sizeof(uint64_t));
    for (int p = 0; p < s->cfg.P; p++) {
        vers[p] = dl_policy_version(s->policy, p); /* 0 for another shard's: never served here */
        if (h->n_held_versions && owns(s, p)) {
            uint64_t held = h->held_versions[p];
            if (held > vers[p] || vers[p] - held > (uint64_t)s->cfg.policy.max_staleness) must_fetch = 1;
        }
    }
    /* the held versions: progress on them can be as old as the longest
     * absence that keeps fragments (rebase_ms) */
    for (int p = 0; !must_fetch && p < s->cfg.P; p++)
        if (owns(s, p))
            dl_registry_base_add(s->reg, slot, p, h->held_versions[p], now - (int64_t)s->cfg.rebase_ms * 1000000LL);
    Dloco__V1__Envelope out;
    Dloco__V1__Welcome w;
    dloco__v1__welcome__init(&w);
    w.num_fragments = (uint32_t)s->cfg.P;
    w.n_fragment_versions = (size_t)s->cfg.P;
    w.fragment_versions = vers;
    w.h = (uint32_t)s->cfg.H;
    w.heartbeat_ms = (uint32_t)s->cfg.heartbeat_ms;
    w.liveness = (uint32_t)s->cfg.liveness;
    w.policy = (char *)dl_policy_kind_name(s->cfg.policy.kind);
    w.must_fetch = must_fetch;
    w.chunk_bytes = (uint32_t)s->cfg.chunk_bytes;
    w.shard = s->cfg.shards > 1 ? (uint32_t)s->cfg.shard : 0;
    w.shards = s->cfg.shards > 1 ? (uint32_t)s->cfg.shards : 0;
    w.update_codec = (uint32_t)s->cfg.update.c.id; /* 0: full Updates only */
    env_to(s, &out, l->id);
    dl_wire_set_welcome(&out, &w);
    send_msg(s, l, &out, NULL, 0);
    free(vers);
    char dev[160];
    DL_INFO("learner %s %s (device %s, step %llu, %s)", id, was ? "said hello again" : "joined",
            dl_event_str(h->device[0] ? h->device : "?", dev, sizeof dev), (unsigned long long)h->step,
            must_fetch ? "will fetch the global model" : "keeps its fragments");
    dl_event("learner_join", "id=%s device=%s again=%d must_fetch=%d step=%llu batch=%u auth=%d", id,
             dl_event_str(h->device, dev, sizeof dev), was, must_fetch, (unsigned long long)h->step, h->batch,
             s->auth ? 1 : 0);
    learner_put(s, l);
    schedule(s);
}

static void push_event(const dl_registry_learner *l, const Dloco__V1__Push *ph, const char *decision,
                       const char *reason)
{
    char rb[300];
    dl_event("push", "id=%s frag=%u base=%llu steps=%llu tokens=%llu compute_s=%.6f decision=%s reason=%s", l->id,
             ph->fragment, (unsigned long long)ph->base_version, (unsigned long long)ph->steps,
             (unsigned long long)ph->tokens, ph->compute_s, decision, dl_event_str(reason, rb, sizeof rb));
}

/* Refused on arrival: the learner keeps the progress, its next push of the
 * fragment carries it on (or, with rebase, it fetches the global fragment).
 * `tokens` is what the ledger may believe of the push (at most what the
 * counter check found plausible). */
static void refuse_push(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, uint64_t tokens,
                        int rebase, dl_sm_reject kind, const char *why)
{
    int p = (int)ph->fragment;
    l->rejected++;
    s->rejected++;
    s->met.push_rejected[kind]++;
    s->met.tokens_received += tokens;
    dl_ledger_arrived(s->ledger, slot, p, ph->base_version, tokens);
    dl_ledger_refused(s->ledger, slot, p, ph->base_version, tokens);
    send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, rebase);
    if (rebase) serve_fragments(s, l, (const uint32_t[]){(uint32_t)p}, 1);
    push_event(l, ph, "rejected", why);
    char rb[300];
    DL_INFO("learner %s: push of fragment %d rejected (%s)", l->id, p, dl_event_str(why, rb, sizeof rb));
}

/* Refused for want of room (the pool is full): nothing of it counted, its
 * progress stays with the learner (CARRIED), which pushes again later. */
static void refuse_busy(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, const char *why)
{
    int p = (int)ph->fragment;
    s->busy_refused++;
    s->met.push_rejected[DL_SM_REJ_BUSY]++;
    l->rejected++; /* the learner counts the REJECTED ack (and busy) */
    dl_ledger_arrived(s->ledger, slot, p, ph->base_version, ph->tokens);
    dl_ledger_refused(s->ledger, slot, p, ph->base_version, ph->tokens);
    push_event(l, ph, "busy", why);
    send_ack_busy(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, 0, DL_SYNC_BUSY_RETRY_MS);
}

/* 1 under a barrier policy (sync, sync-elastic) when fragment p's open
 * round holds pushes of other learners and none of this one: the round
 * cannot close without it, so a full pool must not refuse it. (Decoupled
 * rounds close at their grace deadline whatever comes: no exception.) */
static int round_waits_for(const dl_sync *s, int slot, int p)
{
    if (s->cfg.policy.kind == DL_POLICY_DECOUPLED) return 0;
    int others = 0;
    for (size_t i = 0; i < s->npend; i++) {
        const pending_push *q = &s->pend[i];
        if (!q->used || q->fragment != p) continue;
        if (q->learner == (uint32_t)slot) return 0;
        others = 1;
    }
    return others;
}

/* What a push's header must pass before any of its payload is kept:
 * counters, replays, room in the pool (any codec: its payload is decoded
 * into fp32 as it arrives, and the pool holds fp32). 0 = go on; -1 = refused (and
 * answered). */
static int push_head(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, int64_t now)
{
    int p = (int)ph->fragment;
    char why[320];
    /* 1. counters: nothing the push claims is believed beyond what its
     * learner can have done since it got the base version */
    int found = 0;
    int64_t since = dl_registry_base_ns(s->reg, slot, p, ph->base_version, &found);
    if (!since) since = l->hello_ns - (int64_t)s->cfg.rebase_ms * 1000000LL;
    double elapsed = (double)(now - since) * 1e-9;
    if (elapsed < 0) elapsed = 0;
    uint64_t batch = l->batch ? l->batch : s->cfg.guard.max_batch;
    uint64_t steps_max = (uint64_t)ceil(elapsed * s->cfg.guard.max_step_rate) + s->cfg.guard.step_slack;
    uint64_t plausible = ph->tokens;
    if (dl_guard_counters(s->guard, l->batch, (uint32_t)s->cfg.model.seq_len, ph->steps, ph->tokens, elapsed, why,
                          sizeof why)) {
        unsigned __int128 cap = (unsigned __int128)(ph->steps < steps_max ? ph->steps : steps_max) * batch *
                                (uint64_t)s->cfg.model.seq_len;
        if (cap < plausible) plausible = (uint64_t)cap;
        refuse_push(s, slot, l, ph, plausible, 1, DL_SM_REJ_COUNTERS, why);
        return -1;
    }
    /* 2. replays (a push too stale to pool is dropped below either way) */
    uint64_t cur = dl_policy_version(s->policy, p);
    int poolable = ph->base_version <= cur && cur - ph->base_version <= (uint64_t)s->cfg.policy.max_staleness;
    if (poolable && dl_guard_replay(s->guard, slot, p, ph->base_version, why, sizeof why)) {
        refuse_push(s, slot, l, ph, 0, 1, DL_SM_REJ_REPLAY, why);
        return -1;
    }
    uint64_t need = s->numel[p] * sizeof(float);
    if (s->pool_used + need > s->cfg.pool_bytes &&
        !(round_waits_for(s, slot, p) && s->pool_used + need <= 2 * s->cfg.pool_bytes)) {
        snprintf(why, sizeof why, "pool full (%llu of %llu bytes hold pushes waiting for their rounds): push again later",
                 (unsigned long long)s->pool_used, (unsigned long long)s->cfg.pool_bytes);
        refuse_busy(s, slot, l, ph, why);
        return -1;
    }
    return 0;
}

/* The rest of a push whose payload is complete in `delta` (fragment-sized,
 * from pool_alloc: this takes it): replays again (a merge may have come
 * while it arrived), values, then the policy. */
static void push_body(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Push *ph, float *delta,
                      int64_t now)
{
    int p = (int)ph->fragment;
    char why[320];
    uint64_t cur = dl_policy_version(s->policy, p);
    int poolable = ph->base_version <= cur && cur - ph->base_version <= (uint64_t)s->cfg.policy.max_staleness;
    if (poolable && dl_guard_replay(s->guard, slot, p, ph->base_version, why, sizeof why)) {
        pool_free(s, p, delta);
        refuse_push(s, slot, l, ph, 0, 1, DL_SM_REJ_REPLAY, why);
        return;
    }
    /* 3. values */
    size_t n = s->numel[p];
    int finite = 0;
    double norm = dl_guard_norm(delta, n, &finite);
    if (!finite) {
        pool_free(s, p, delta);
        refuse_push(s, slot, l, ph, ph->tokens, 0, DL_SM_REJ_NONFINITE, "non-finite values in push");
        return;
    }
    double scale = 1.0;
    int g = dl_guard_value(s->guard, p, norm, s->param_norm[p], &scale, why, sizeof why);
    dl_guard_observe(s->guard, p, slot, norm); /* what the fleet pushes now, whatever this push's fate */
    if (g == DL_GUARD_REJECTED) {
        pool_free(s, p, delta);
        refuse_push(s, slot, l, ph, ph->tokens, 1, DL_SM_REJ_NORM, why);
        return;
    }
    if (g == DL_GUARD_CLIPPED) {
        for (size_t i = 0; i < n; i++) delta[i] = (float)(delta[i] * scale);
        s->clipped++;
        char rb[400];
        dl_event("push_clipped", "id=%s frag=%d scale=%.6g reason=%s", l->id, p, scale, dl_event_str(why, rb, sizeof rb));
    }
    /* passed every check: now its numbers count */
    l->last_push_tokens = ph->tokens;
    dl_ledger_arrived(s->ledger, slot, p, ph->base_version, ph->tokens);
    uint64_t h = alloc_pending(s);
    dl_policy_verdict v;
    int rc = dl_policy_push(s->policy, p, (uint32_t)slot, ph->base_version, (int64_t)ph->steps, (int64_t)ph->tokens,
                            now, h, &v);
    if (rc) DL_PANIC("merge policy: %s", dl_errmsg());
    if (v.decision == DL_POLICY_POOLED) {
        pending_push *pp = &s->pend[h];
        pp->used = 1;
        pp->delta = delta;
        pp->learner = (uint32_t)slot;
        pp->fragment = p;
        pp->base_version = ph->base_version;
        pp->tokens = ph->tokens;
        pp->compute_s = ph->compute_s;
        uint64_t replaced_tokens = 0;
        if (v.replaced) {
            replaced_tokens = s->pend[v.replaced_handle].tokens;
            free_pending(s, v.replaced_handle);
        }
        dl_ledger_pooled(s->ledger, slot, p, ph->tokens, replaced_tokens);
        s->met.tokens_received += ph->tokens;
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0, "", 0);
        push_event(l, ph, v.replaced ? "pooled_replacing" : "pooled", g == DL_GUARD_CLIPPED ? why : "");
        schedule(s);
        return;
    }
    pool_free(s, p, delta);
    if (v.decision == DL_POLICY_DROPPED_STALE) {
        l->dropped++;
        s->dropped_stale++;
        s->met.tokens_received += ph->tokens;
        dl_ledger_dropped_stale(s->ledger, slot, p, ph->tokens);
        char reason[96];
        snprintf(reason, sizeof reason, "staleness %lld > max %lld", (long long)v.staleness,
                 (long long)s->cfg.policy.max_staleness);
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_DROPPED_STALE, 0, reason, 1);
        serve_fragments(s, l, (const uint32_t[]){(uint32_t)p}, 1); /* rebase */
        dl_merge_contrib c;
        memset(&c, 0, sizeof c);
        snprintf(c.learner_id, sizeof c.learner_id, "%s", l->id);
        c.base_version = ph->base_version;
        c.staleness = (uint64_t)v.staleness;
        c.steps = ph->steps;
        c.tokens = ph->tokens;
        c.decision = DL_MERGE_DROPPED_STALE;
        snprintf(c.reason, sizeof c.reason, "%.*s", (int)sizeof c.reason - 1, reason);
        add_aside(s, p, &c);
        push_event(l, ph, "dropped_stale", reason);
        DL_INFO("learner %s: push of fragment %d dropped (%s), told to rebase", l->id, p, reason);
    } else {
        /* the policy's own refusal (a base newer than global, ...): undo the
         * arrival's settlement by refusing through the ledger as well */
        l->rejected++;
        s->rejected++;
        s->met.push_rejected[DL_SM_REJ_POLICY]++;
        s->met.tokens_received += ph->tokens;
        dl_ledger_refused(s->ledger, slot, p, ph->base_version, ph->tokens);
        const char *r = dl_policy_reason_name(v.reason);
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, r, 0);
        push_event(l, ph, "rejected", r);
        DL_INFO("learner %s: push of fragment %d rejected (%s)", l->id, p, r);
    }
}

/* 1 when a chunk carries the same push as the one arriving. */
static int same_push(const inbound *in, const Dloco__V1__Push *ph)
{
    return in->transfer == ph->transfer && in->fragment == ph->fragment && in->base_version == ph->base_version &&
           in->steps == ph->steps && in->tokens == ph->tokens && in->compute_s == ph->compute_s &&
           in->codec == (int)ph->codec && in->block == ph->block_size && in->topk == ph->topk &&
           in->numel == ph->numel;
}

/* A frame's payload, len bytes of elements [first, first + n) of the push in
 * its codec (proto/wire.c checked len, and that a block codec's frame starts
 * on a block), into out[0, n): fp32 is copied as it is (the value guard
 * refuses non-finite values), the others are decoded, which refuses what no
 * encoder makes (a scale not finite or negative, a non-finite value, a topk
 * index out of its block or out of order). 0, or -1 with the reason in why. */
static int push_decode(const Dloco__V1__Push *ph, const void *data, size_t len, uint64_t first, uint64_t n, float *out,
                       char *why, size_t cap)
{
    if (ph->codec == DLOCO__V1__CODEC__CODEC_FP32) {
        memcpy(out, data, (size_t)n * sizeof(float));
        return 0;
    }
    dl_codec c = {.id = (dl_codec_id)ph->codec, .block = ph->block_size, .topk = ph->topk};
    if (dl_codec_decode(&c, data, len, n, out) == 0) return 0;
    snprintf(why, cap, "%s payload refused (elements from %llu): %s", dl_codec_name(c.id), (unsigned long long)first,
             dl_errmsg());
    return -1;
}

/* Start the slot's record of a chunked push from its header (nothing kept yet). */
static void inbound_header(inbound *in, const Dloco__V1__Push *ph, int64_t now)
{
    memset(in, 0, sizeof *in);
    in->fragment = ph->fragment;
    in->transfer = ph->transfer;
    in->base_version = ph->base_version;
    in->steps = ph->steps;
    in->tokens = ph->tokens;
    in->compute_s = ph->compute_s;
    in->codec = (int)ph->codec;
    in->block = ph->block_size;
    in->topk = ph->topk;
    in->numel = ph->numel;
    in->progress_ns = now;
}

/* A Push message: a whole push, or one chunk of one (docs/PROTOCOL.md
 * "Chunked transfers"). The header checks run on the first chunk, before
 * any room is taken; values and the policy once the last has come. */
static void on_push(dl_sync *s, int slot, dl_registry_learner *l, dl_wire_msg *msg, const Dloco__V1__Push *ph)
{
    int p = (int)ph->fragment;
    int64_t now = dl_clock_ns();
    inbound *in = &s->inb[slot];
    const void *data = dl_wire_msg_payload(msg, 0); /* may be unaligned */
    size_t len = dl_wire_msg_payload_len(msg, 0);
    char why[400];
    if (!ph->chunk_numel) {
        if (in->active) inbound_drop(s, slot, "whole_push_before_end");
        l->pushes++;
        if (push_head(s, slot, l, ph, now)) return;
        float *delta = pool_alloc(s, p);
        if (push_decode(ph, data, len, 0, s->numel[p], delta, why, sizeof why)) {
            pool_free(s, p, delta);
            refuse_push(s, slot, l, ph, ph->tokens, 0, DL_SM_REJ_CODEC, why);
            return;
        }
        push_body(s, slot, l, ph, delta, now);
        return;
    }
    s->chunks_in++;
    if (ph->chunk_offset == 0) {
        if (in->active) inbound_drop(s, slot, "new_push_before_end");
        l->pushes++;
        inbound_header(in, ph, now);
        if (push_head(s, slot, l, ph, now)) {
            in->refused = 1; /* its other chunks are dropped unread */
            return;
        }
        in->active = 1;
        in->buf = pool_alloc(s, p);
    } else if (!in->active && in->refused && same_push(in, ph)) {
        return; /* the rest of a refused push: answered at its first chunk */
    } else if (!in->active || !same_push(in, ph) || ph->chunk_offset != in->received) {
        if (!in->active)
            snprintf(why, sizeof why, "chunk at %llu of fragment %d without its first chunk",
                     (unsigned long long)ph->chunk_offset, p);
        else if (!same_push(in, ph))
            snprintf(why, sizeof why, "chunk of another push (fragment %d transfer %llu) before push %llu ended", p,
                     (unsigned long long)ph->transfer, (unsigned long long)in->transfer);
        else
            snprintf(why, sizeof why, "chunk at %llu, expected %llu: chunks must come in order",
                     (unsigned long long)ph->chunk_offset, (unsigned long long)in->received);
        inbound_drop(s, slot, "chunk_out_of_order");
        /* nothing of it was counted: the learner keeps its progress */
        send_ack(s, l, p, ph->base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0, why, 0);
        push_event(l, ph, "rejected", why);
        s->refused_msgs++;
        l->rejected++; /* answered REJECTED: the learner counts it */
        s->rejected++;
        s->met.push_rejected[DL_SM_REJ_CHUNK_ORDER]++;
        inbound_header(in, ph, now);
        in->refused = 1; /* the rest of this transfer is dropped unread */
        return;
    }
    /* same_push: the codec of its first chunk; proto/wire.c checked the frame's size and alignment */
    in->progress_ns = now;
    if (push_decode(ph, data, len, ph->chunk_offset, ph->chunk_numel, in->buf + ph->chunk_offset, why, sizeof why)) {
        /* refused whole: nothing of it was counted yet; the rest of its chunks are dropped unread */
        pool_free(s, p, in->buf);
        inbound_header(in, ph, now);
        in->refused = 1;
        refuse_push(s, slot, l, ph, ph->tokens, 0, DL_SM_REJ_CODEC, why);
        return;
    }
    in->received += ph->chunk_numel;
    if (in->received < in->numel) return;
    float *delta = in->buf;
    memset(in, 0, sizeof *in);
    push_body(s, slot, l, ph, delta, now);
}

/* A Fetch: the fragments are owed (again); a resume point is used when its
 * version is still the global one as the transfer starts (serve_owed). */
static void on_fetch(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Fetch *f)
{
    s->fetches++;
    size_t P = (size_t)s->cfg.P;
    for (size_t i = 0; i < f->n_fragments; i++) {
        size_t p = f->fragments[i], r = (size_t)slot * P + p;
        s->resume_v[r] = i < f->n_resume_versions ? f->resume_versions[i] : 0;
        s->resume_o[r] = i < f->n_resume_offsets ? f->resume_offsets[i] : 0;
        outbound *x = &s->outx[slot];
        if (x->p != (int)p) continue;
        if (x->started && !x->delta && i < f->n_resume_versions && x->version == s->resume_v[r]) {
            /* the version on its way: nothing on this connection is lost, so
             * what is past the learner's point is in flight; skip ahead only */
            if (x->offset < s->resume_o[r]) x->offset = s->resume_o[r];
            s->resume_v[r] = s->resume_o[r] = 0;
        } else {
            outbound_reset(s, slot); /* asked again (a delta in flight too): from the resume point, or at 0 */
        }
    }
    if (!f->n_fragments) outbound_reset(s, slot);
    serve_fragments(s, l, f->fragments, f->n_fragments);
}

static void on_bye(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Bye *b, int64_t now)
{
    mark_left(s, l, slot, now, DL_POLICY_LEAVE_BYE);
    l->step = b->step > l->step ? b->step : l->step;
    l->tokens = b->tokens > l->tokens ? b->tokens : l->tokens; /* a Bye from before Bye.tokens reports 0 */
    dl_ledger_bye(s->ledger, slot, l->step, l->tokens, b->discarded_tokens);
    char rb[300];
    DL_INFO("learner %s said bye at step %llu (%s)", l->id, (unsigned long long)b->step,
            dl_event_str(b->reason[0] ? b->reason : "no reason", rb, sizeof rb));
    dl_event("learner_bye", "id=%s reason=%s step=%llu", l->id, dl_event_str(b->reason, rb, sizeof rb),
             (unsigned long long)b->step);
    learner_put_now(s, l);
    schedule(s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* s->fleet_sps = the median step rate of the live learners that reported a
 * finite one in (0, DL_WIRE_FLEET_SPS_MAX] (the mean of the two middle ones
 * for an even count); 0 when none has, or when the buffer cannot grow (then
 * Acks say "unknown" and dynamic-H learners keep their H). */
static void update_fleet_rate(dl_sync *s)
{
    int n = dl_registry_count(s->reg), k = 0;
    if (n > s->rate_cap) {
        double *b = realloc(s->rate_buf, (size_t)n * sizeof *b);
        if (!b) {
            s->fleet_sps = 0;
            return;
        }
        s->rate_buf = b;
        s->rate_cap = n;
    }
    for (int i = 0; i < n; i++) {
        const dl_registry_learner *l = dl_registry_cget(s->reg, i);
        double r = l->steps_per_s;
        if (l->used && member(s, i) == DL_POLICY_MEMBER_LIVE && isfinite(r) && r > 0 && r <= DL_WIRE_FLEET_SPS_MAX)
            s->rate_buf[k++] = r;
    }
    if (!k) {
        s->fleet_sps = 0;
        return;
    }
    qsort(s->rate_buf, (size_t)k, sizeof *s->rate_buf, cmp_double);
    s->fleet_sps = k % 2 ? s->rate_buf[k / 2] : 0.5 * (s->rate_buf[k / 2 - 1] + s->rate_buf[k / 2]);
}

/* Heartbeat counters: a learner cannot have stepped faster than
 * max_step_rate since its Hello; a claim beyond is ignored (not stored). */
static void on_heartbeat(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Heartbeat *hb, int64_t now)
{
    (void)slot;
    double since = (double)(now - l->hello_ns) * 1e-9 + (double)s->cfg.rebase_ms * 1e-3;
    uint64_t cap = l->step + (uint64_t)ceil(since * s->cfg.guard.max_step_rate) + s->cfg.guard.step_slack;
    uint64_t batch = l->batch ? l->batch : s->cfg.guard.max_batch;
    unsigned __int128 tok_cap = (unsigned __int128)(hb->step + 1) * batch * (uint64_t)s->cfg.model.seq_len;
    if ((hb->step > cap && hb->step > l->step) || (unsigned __int128)hb->tokens > tok_cap) {
        dl_event("heartbeat_ignored", "id=%s step=%llu tokens=%llu plausible=%llu", l->id,
                 (unsigned long long)hb->step, (unsigned long long)hb->tokens, (unsigned long long)cap);
        return;
    }
    l->step = hb->step;
    l->tokens = hb->tokens;
    l->steps_per_s = hb->steps_per_s;
    dl_ledger_progress(s->ledger, slot, l->step, l->tokens, hb->discarded_tokens);
    /* the schedule prediction and the share's tokens per step (policy.h) */
    dl_policy_learner_progress(s->policy, (uint32_t)slot, l->step, l->tokens, l->steps_per_s, now);
    update_fleet_rate(s);
    schedule(s);
}

static void on_message(dl_sync *s, dl_wire_msg *msg)
{
    const Dloco__V1__Envelope *env = msg->env;
    const char *id = env->learner_id; /* validated: [A-Za-z0-9._-]{1,64} */
    if (s->auth && !dl_auth_user_ok(s->auth, msg->user_id, id)) {
        char owner[DL_WIRE_LEARNER_ID_MAX + 1] = "";
        dl_auth_user_id(msg->user_id, owner);
        if (!owner[0])
            send_error(s, msg->id, msg->id_len, id, DL_EPERM, 1, "this connection has no allowed key");
        else if (!strcmp(owner, id))
            send_error(s, msg->id, msg->id_len, id, DL_EPERM, 1,
                       "the key of learner '%s' was revoked or given to another id: reconnect with a current key", id);
        else
            send_error(s, msg->id, msg->id_len, id, DL_EPERM, 1,
                       "this connection's key belongs to learner '%s', not '%s'", owner, id);
        dl_event("auth_refused", "id=%s key_owner=%s body=%s", id, owner[0] ? owner : "-",
                 dl_wire_body_name(env->body_case));
        s->refused_msgs++;
        s->met.msg_refused[DL_SM_MSG_UNAUTHORIZED]++;
        return;
    }
    size_t bytes = 64;
    for (int i = 0; i < msg->npayload; i++) bytes += dl_wire_msg_payload_len(msg, i);
    s->met.bytes_in[dl_syncmet_kind(env->body_case)] += bytes;
    s->met.msgs_in[dl_syncmet_kind(env->body_case)]++;
    if (env->body_case == DLOCO__V1__ENVELOPE__BODY_HELLO) {
        on_hello(s, msg, env, env->hello);
        int slot = dl_registry_find(s->reg, id);
        if (slot >= 0) dl_registry_get(s->reg, slot)->bytes_in += bytes;
        return;
    }
    int slot = dl_registry_find(s->reg, id);
    if (slot < 0 || !registered(s, slot) || env->epoch != s->epoch ||
        !dl_registry_route_is(s->reg, slot, msg->id, msg->id_len)) {
        /* unknown, or another connection than the one this id said Hello
         * on: nothing of it is believed; a genuine learner re-hellos */
        send_error(s, msg->id, msg->id_len, id, DL_ENOTFOUND, 0,
                   "learner '%s' is not registered on this connection in epoch %llu: send hello", id,
                   (unsigned long long)s->epoch);
        s->refused_msgs++;
        s->met.msg_refused[DL_SM_MSG_NOT_REGISTERED]++;
        return;
    }
    dl_registry_learner *l = dl_registry_get(s->reg, slot);
    int64_t now = dl_clock_ns();
    l->last_seen_ns = now;
    l->bytes_in += bytes;
    if (member(s, slot) == DL_POLICY_MEMBER_DEAD) {
        dl_policy_learner_alive(s->policy, (uint32_t)slot, now);
        l->left_ns = 0;
        DL_INFO("learner %s is alive again", l->id);
        dl_event("learner_alive", "id=%s", l->id);
    }
    switch (env->body_case) {
    case DLOCO__V1__ENVELOPE__BODY_HEARTBEAT: on_heartbeat(s, slot, l, env->heartbeat, now); break;
    case DLOCO__V1__ENVELOPE__BODY_PUSH: on_push(s, slot, l, msg, env->push); break;
    case DLOCO__V1__ENVELOPE__BODY_FETCH: on_fetch(s, slot, l, env->fetch); break;
    case DLOCO__V1__ENVELOPE__BODY_BYE: on_bye(s, slot, l, env->bye, now); break;
    default:
        send_error(s, msg->id, msg->id_len, id, DL_EPROTO, 0, "%s is not a learner-to-synchronizer message",
                   dl_wire_body_name(env->body_case));
        break;
    }
}

/* ZMQ_FD is edge-triggered: read until ZMQ_EVENTS has no POLLIN, after every
 * wake-up and after every send. */
static void drain(dl_sync *s)
{
    /* Stopping: nothing more is read, so the ledger's last write covers every
     * push this process answered; later messages are for the next epoch. */
    if (s->stopping) return;
    size_t bytes = 0;
    for (int budget = 0;; budget++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(s->router, ZMQ_EVENTS, &ev, &sz) != 0) {
            dl_wire_zmq_warn("zmq_getsockopt(ZMQ_EVENTS)", __FILE__, __LINE__);
            return;
        }
        if (!(ev & ZMQ_POLLIN)) return;
        if (budget >= DL_SYNC_DRAIN_MSGS || bytes >= DL_SYNC_DRAIN_BYTES) {
            /* the rest after the timers, finished merges and sends that are due */
            s->drain_yields++;
            if (!ev_is_active(&s->more)) ev_idle_start(s->loop, &s->more);
            return;
        }
        dl_wire_msg msg;
        dl_err_clear();
        int rc = dl_wire_recv(s->router, 1, &s->lim, &msg, ZMQ_DONTWAIT);
        if (rc == 0) {
            for (int i = 0; i < msg.npayload; i++) bytes += dl_wire_msg_payload_len(&msg, i);
            on_message(s, &msg);
        } else if (rc == DL_EPROTO) {
            char why[400];
            snprintf(why, sizeof why, "%s", dl_errmsg());
            s->refused_msgs++;
            s->met.msg_refused[DL_SM_MSG_INVALID]++;
            s->met.msgs_in[0]++;
            if (msg.id_len) send_error(s, msg.id, msg.id_len, NULL, DL_EPROTO, 0, "rejected message: %s", why);
            else DL_WARN("rejected message: %s", why);
        } else if (rc != DL_EAGAIN) {
            DL_ERROR("receive: %s", dl_errmsg());
        }
        dl_wire_msg_close(&msg);
    }
}

/* ------------------------------------------------------------------------ */
/* watchers */

static void on_zmq(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    drain(w->data);
}

static void on_more(struct ev_loop *loop, ev_idle *w, int revents)
{
    (void)revents;
    ev_idle_stop(loop, w);
    drain(w->data);
}

static int live_cb(void *ctx, int slot) { return member(ctx, slot) == DL_POLICY_MEMBER_LIVE; }

/* The last store write of a run: what the ledger still holds becomes
 * OUTSTANDING (or LOST for learners that are dead now). */
static void submit_final_ledger(dl_sync *s)
{
    s->final_ledger = 1;
    dl_ledger_shutdown(s->ledger, live_cb, s);
    dl_job *j = dl_job_new(DL_JOB_LEDGER);
    if (dl_ledger_take(s->ledger, &j->ledger)) submit(s, j);
    else dl_job_free(j);
}

static void maybe_finish(dl_sync *s)
{
    if (!s->stopping || dl_worker_inflight(s->worker)) return;
    if (!s->final_ledger) submit_final_ledger(s);
    if (dl_worker_inflight(s->worker) == 0) ev_break(s->loop, EVBREAK_ALL);
}

static void wake_loop(void *ctx);

/* A finished periodic evaluation: event, metric, and the store's record. */
static void eval_poll(dl_sync *s)
{
    dl_store_eval r;
    int ok = 0;
    char err[320];
    if (!s->evalt || !dl_evalthread_take(s->evalt, &r, &ok, err, sizeof err)) return;
    if (!ok) {
        char eb[400];
        DL_WARN("periodic evaluation failed: %s", err);
        dl_event("eval_failed", "reason=%s", dl_event_str(err, eb, sizeof eb));
        return;
    }
    s->met.has_eval = 1;
    s->met.evals++;
    s->met.eval_version = r.version;
    s->met.eval_loss = r.loss;
    s->met.eval_seqs = (int)r.seqs;
    s->met.eval_wall = r.wallclock_ns;
    DL_INFO("global model at total version %llu: val loss %.4f (%u sequences)", (unsigned long long)r.version, r.loss,
            r.seqs);
    dl_event("eval", "version=%llu loss=%.6f seqs=%u", (unsigned long long)r.version, r.loss, r.seqs);
    if (s->stopping) return;
    dl_job *j = dl_job_new(DL_JOB_EVAL);
    j->erec = r;
    submit(s, j);
}

static void on_eval_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (!s->stopping && dl_evalthread_request(s->evalt))
        DL_DEBUG("periodic evaluation still running: this one skipped");
}

/* eval_every_s > 0: the evaluation thread over this store; a data file that
 * cannot be read is a warning (the default is on), not a start-up error. */
static void open_eval(dl_sync *s)
{
    dl_store_eval last;
    if (dl_store_get_eval(s->store, &last) == 0) {
        s->met.has_eval = 1;
        s->met.eval_version = last.version;
        s->met.eval_loss = last.loss;
        s->met.eval_seqs = (int)last.seqs;
        s->met.eval_wall = last.wallclock_ns;
    }
    if (s->cfg.eval_every_s <= 0) return;
    if (s->cfg.shards > 1) {
        DL_INFO("periodic evaluation off: shard %d of %d holds only its own fragments", s->cfg.shard, s->cfg.shards);
        return;
    }
    dl_evaluate_opts o = {.data = s->cfg.eval_data,
                          .val_frac = s->cfg.eval_val_frac,
                          .batch = s->cfg.eval_batch > 0 ? s->cfg.eval_batch : 8,
                          .seqs = s->cfg.eval_seqs > 0 ? s->cfg.eval_seqs : 256};
    size_t need = dl_gpt_open_bytes(&s->cfg.model, o.batch);
    if (s->cfg.eval_max_bytes > 0 && need > (uint64_t)s->cfg.eval_max_bytes) {
        char eb[400], msg[300];
        snprintf(msg, sizeof msg, "it would hold %.0f MiB (model state + activations of eval_batch %d), more than "
                 "eval_max_mb %lld: lower eval_batch or raise eval_max_mb", (double)need / 1048576.0, o.batch,
                 (long long)(s->cfg.eval_max_bytes >> 20));
        DL_WARN("periodic evaluation off: %s", msg);
        dl_event("eval_failed", "reason=%s", dl_event_str(msg, eb, sizeof eb));
        return;
    }
    if (dl_evalthread_open(&s->cfg.model, s->plan, s->store, &o, s->cfg.eval_threads, wake_loop, s, &s->evalt)) {
        char eb[400];
        DL_WARN("periodic evaluation off: %s (option eval_data)", dl_errmsg());
        dl_event("eval_failed", "reason=%s", dl_event_str(dl_errmsg(), eb, sizeof eb));
        return;
    }
    ev_timer_init(&s->eval_timer, on_eval_timer, s->cfg.eval_every_s, s->cfg.eval_every_s);
    s->eval_timer.data = s;
    ev_timer_start(s->loop, &s->eval_timer);
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    dl_job *j;
    while ((j = dl_worker_done(s->worker))) {
        if (j->kind == DL_JOB_MERGE) {
            merge_done(s, j);
        } else if (j->rc) {
            DL_ERROR("store write failed: %s", j->err);
            if (j->kind == DL_JOB_LEDGER && !s->final_ledger) dl_ledger_untake(s->ledger, &j->ledger);
        }
        dl_job_free(j);
    }
    eval_poll(s);
    schedule(s);
    serve_all_owed(s); /* what merges made owed, and what drained queues have room for now */
    drain(s);
    maybe_finish(s);
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    schedule(s);
    drain(s);
}

/* A learner whose queued bytes made no progress for slow_reader_ms does not
 * read: it is dropped (dead, its connection cut off, owed updates
 * forgotten), so it cannot hold the outbound budget of those that read:
 * what libzmq already holds for it stays in its own counter (detached) until
 * its connection closes, and its id gets no new connection before. */
static void check_reader(dl_sync *s, int slot, dl_registry_learner *l, int64_t now)
{
    uint64_t q = dl_wire_queue_bytes(l->outq);
    if (!q) {
        l->outq_busy_ns = 0;
        return;
    }
    if (!l->outq_busy_ns) l->outq_busy_ns = now;
    int64_t progress = dl_wire_queue_drained_ns(l->outq);
    if (progress < l->outq_busy_ns) progress = l->outq_busy_ns;
    if (now - progress < (int64_t)s->cfg.slow_reader_ms * 1000000LL) return;
    DL_WARN("learner %s reads nothing: %llu bytes queued for it without progress for %lld ms; dropped", l->id,
            (unsigned long long)q, (long long)((now - progress) / 1000000));
    dl_event("learner_dropped", "id=%s reason=not_reading queued_bytes=%llu stalled_ms=%lld", l->id,
             (unsigned long long)q, (long long)((now - progress) / 1000000));
    send_error(s, l->route, l->route_len, l->id, DL_EAGAIN, 0,
               "you did not read for %d ms: dropped (reconnect and say hello)", s->cfg.slow_reader_ms);
    mark_left(s, l, slot, now, DL_POLICY_LEAVE_DEAD);
    dl_registry_clear_route(s->reg, slot);
    outbound_reset(s, slot);
    resume_clear(s, slot);
    memset(l->owed, 0, (size_t)s->cfg.P);
    l->n_owed = 0;
    s->dropped_readers++;
}

/* Owed updates, fairly: first the learners that have read everything they
 * were sent (empty queue), then the others, each group oldest debt first. A
 * learner that does not read keeps its queue non-empty, so it never takes
 * the budget ahead of one that reads. */
typedef struct owed_key {
    dl_registry_learner *l;
    int busy;        /* its queue held bytes when the pass began */
    int64_t since;   /* owed_since_ns */
} owed_key;

static int owed_cmp(const void *a, const void *b)
{
    const owed_key *x = a, *y = b;
    if (x->busy != y->busy) return x->busy - y->busy;
    return (x->since > y->since) - (x->since < y->since);
}

static void serve_all_owed(dl_sync *s)
{
    /* keys are read once: the queue counters move under libzmq's I/O thread */
    int n = 0;
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (l->used && l->n_owed && l->route_len && member(s, i) == DL_POLICY_MEMBER_LIVE)
            s->owed_order[n++] = (owed_key){l, dl_wire_queue_bytes(l->outq) > 0, l->owed_since_ns};
    }
    if (n > 1) qsort(s->owed_order, (size_t)n, sizeof *s->owed_order, owed_cmp);
    dl_store_snap *snap = NULL; /* one short snapshot for the pass */
    for (int k = 0; k < n; k++) serve_owed(s, s->owed_order[k].l, &snap);
    dl_store_snapshot_end(&snap);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    int64_t now = dl_clock_ns();
    int64_t dead_after = (int64_t)s->cfg.liveness * s->cfg.heartbeat_ms * 1000000LL;
    /* the records due go in one job, one transaction: at any fleet size the
     * tick costs the worker one commit, not one per learner */
    dl_job *puts = NULL;
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (!l->used) continue;
        if ((l->put_dirty && now - l->put_ns >= 1000000000LL) ||
            (l->put_sig != put_sig(l) && now - l->put_ns >= DL_SYNC_PUT_EVERY_NS)) {
            if (!puts) {
                puts = dl_job_new(DL_JOB_LEARNER_PUT);
                puts->lrecs = dl_xcalloc((size_t)dl_registry_count(s->reg), sizeof *puts->lrecs);
            }
            learner_record(l, &puts->lrecs[puts->nlrecs++]);
        }
        /* a chunked push whose chunks stopped holds pool room: not for ever */
        if (s->inb[i].active && now - s->inb[i].progress_ns > (int64_t)s->cfg.slow_reader_ms * 1000000LL)
            inbound_drop(s, i, "stalled");
        /* slots are reclaimed only when a new learner needs one (on_hello) */
        if (member(s, i) != DL_POLICY_MEMBER_LIVE) continue;
        if (now - l->last_seen_ns > dead_after) {
            mark_left(s, l, i, now, DL_POLICY_LEAVE_DEAD);
            double silent = (double)(now - l->last_seen_ns) * 1e-9;
            DL_WARN("learner %s declared dead after %.1f s of silence", l->id, silent);
            dl_event("learner_dead", "id=%s silent_ms=%lld", l->id, (long long)((now - l->last_seen_ns) / 1000000));
            continue;
        }
        check_reader(s, i, l, now);
        if (member(s, i) != DL_POLICY_MEMBER_LIVE) continue;
        /* a queue that holds payload is proof enough that we talk to it: a
         * heartbeat would only take one of its DL_WIRE_HWM message slots */
        if (dl_wire_queue_bytes(l->outq) > 0) continue;
        Dloco__V1__Envelope env;
        Dloco__V1__Heartbeat hb;
        dloco__v1__heartbeat__init(&hb);
        env_to(s, &env, l->id);
        dl_wire_set_heartbeat(&env, &hb);
        send_msg(s, l, &env, NULL, 0);
    }
    if (puts) submit(s, puts);
    serve_all_owed(s);
    if (s->cfg.durability == DL_STORE_PERIODIC && now - s->last_sync_ns >= (int64_t)s->cfg.sync_every_ms * 1000000LL) {
        s->last_sync_ns = now;
        submit(s, dl_job_new(DL_JOB_SYNC));
    }
    schedule(s);
    drain(s);
}

static void on_status(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    dl_sync_stats st;
    dl_sync_get_stats(s, &st);
    char line[1024];
    dl_report_status(&st, line, sizeof line);
    DL_INFO("status: %s", line);
    dl_event("sync_status",
             "live=%d dead=%d left=%d merges=%llu pool_bytes=%llu pool_max_bytes=%llu busy_refused=%llu "
             "outbound_bytes=%llu jobs=%d drain_yields=%llu store_file_bytes=%llu store_live_bytes=%llu known=%llu",
             st.live, st.dead, st.left, (unsigned long long)st.merges, (unsigned long long)st.pool_bytes,
             (unsigned long long)st.pool_max, (unsigned long long)st.busy_refused,
             (unsigned long long)st.outbound_attached, st.jobs_inflight, (unsigned long long)st.drain_yields,
             (unsigned long long)st.store_file_bytes, (unsigned long long)st.store_live_bytes,
             (unsigned long long)st.known_learners);
}

static void on_stop(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (s->stopping) return;
    DL_INFO("signal %d: finishing %d store job(s) in flight, then stopping", w->signum,
            dl_worker_inflight(s->worker));
    s->stopping = 1;
    ev_io_stop(s->loop, &s->zio);
    /* persist the registry counters on the way out */
    for (int i = 0; i < dl_registry_count(s->reg); i++)
        if (dl_registry_get(s->reg, i)->used) learner_put_now(s, dl_registry_get(s->reg, i));
    maybe_finish(s);
}

/* SIGHUP with CURVE: re-read the allowlist; every registered learner whose
 * connection's key no longer owns its id is cut off (dead, connection
 * detached, told so). Its later messages on that connection are refused by
 * on_message, and a new connection with the removed key fails ZAP. */
static void reload_allowlist(dl_sync *s)
{
    int n = 0;
    if (dl_auth_reload(s->auth, &n)) {
        char rb[600];
        DL_ERROR("allowlist reload refused, the running list stays: %s", dl_errmsg());
        dl_event("allowlist_reload", "refused=1 reason=%s", dl_event_str(dl_errmsg(), rb, sizeof rb));
        return;
    }
    int revoked = 0;
    int64_t now = dl_clock_ns();
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (!l->used || !l->route_len || dl_auth_user_ok(s->auth, l->user, l->id)) continue;
        send_error(s, l->route, l->route_len, l->id, DL_EPERM, 1, "the key of learner '%s' was revoked", l->id);
        if (member(s, i) == DL_POLICY_MEMBER_LIVE) mark_left(s, l, i, now, DL_POLICY_LEAVE_DEAD);
        dl_registry_clear_route(s->reg, i);
        memset(l->owed, 0, (size_t)s->cfg.P);
        l->n_owed = 0;
        dl_event("learner_revoked", "id=%s", l->id);
        DL_WARN("learner %s: its key left the allowlist; cut off", l->id);
        revoked++;
    }
    DL_INFO("allowlist reloaded: %d key(s), %d learner(s) cut off", n, revoked);
    dl_event("allowlist_reload", "refused=0 keys=%d revoked=%d", n, revoked);
    schedule(s);
}

static void on_hup(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (s->auth) reload_allowlist(s);
    if (!s->reload) {
        DL_WARN("SIGHUP: no config file to reload");
        dl_event("reload", "refused=1 reason=no_config_file");
        return;
    }
    /* the candidate is validated whole (the callback checks the full config,
     * the guard and policy checks here) before anything applies */
    dl_sync_tunables cur = {.policy = *dl_policy_get_cfg(s->policy), .merge = s->cfg.merge, .guard = s->cfg.guard},
                     nt = cur;
    int ignored = 0, rc;
    dl_err_clear();
    if ((rc = s->reload(s->reload_ctx, &cur, &nt, &ignored)) == 0) {
        rc = dl_guard_cfg_check(&nt.guard);
        if (!rc) rc = dl_policy_reconfigure(s->policy, &nt.policy);
        if (s->reload_done) s->reload_done(s->reload_ctx, rc == 0);
    }
    if (rc) {
        DL_ERROR("reload refused, running values unchanged: %s", dl_errmsg());
        char rb[600];
        dl_event("reload", "refused=1 reason=%s", dl_event_str(dl_errmsg(), rb, sizeof rb));
        return;
    }
    char diff[1024], db[1100];
    int n = dl_report_tunables_diff(&cur, &nt, diff, sizeof diff);
    s->cfg.merge = nt.merge;
    s->cfg.policy = nt.policy;
    s->cfg.guard = nt.guard;
    dl_guard_reconfigure(s->guard, &nt.guard);
    DL_INFO("reload applied:%s; %d restart-only option(s) of the file ignored, kept as they run",
            n ? diff : " no reloadable value changed", ignored);
    dl_event("reload", "refused=0 changes=%d changed=%s ignored=%d", n, dl_event_str(n ? diff + 1 : "", db, sizeof db),
             ignored);
    schedule(s);
    drain(s);
}

void dl_sync_set_reload(dl_sync *s, dl_sync_reload_fn fn, dl_sync_reload_done_fn done, void *ctx)
{
    s->reload = fn;
    s->reload_done = done;
    s->reload_ctx = ctx;
}

/* ------------------------------------------------------------------------ */
/* statistics */

void dl_sync_get_stats(dl_sync *s, dl_sync_stats *out)
{
    memset(out, 0, sizeof *out);
    out->epoch = s->epoch;
    out->wall_s = (double)(dl_clock_ns() - s->started_ns) * 1e-9;
    out->P = s->cfg.P;
    for (int p = 0; p < s->cfg.P; p++) s->versions[p] = dl_policy_version(s->policy, p);
    out->versions = s->versions;
    int n = dl_registry_count(s->reg);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const dl_registry_learner *l = dl_registry_cget(s->reg, i);
        if (!l->used) continue;
        dl_sync_learner_stats *o = &s->lstats[k++];
        snprintf(o->id, sizeof o->id, "%s", l->id);
        o->state = member(s, i);
        o->pushes = l->pushes;
        o->merged = l->merged;
        o->dropped = l->dropped;
        o->rejected = l->rejected;
        o->tokens_applied = l->tokens_applied;
        o->bytes_in = l->bytes_in;
        o->bytes_out = l->bytes_out;
        o->step = l->step;
        o->tokens = l->tokens;
        o->steps_per_s = l->steps_per_s;
        o->last_staleness = l->last_staleness;
        out->live += o->state == DL_POLICY_MEMBER_LIVE;
        out->dead += o->state == DL_POLICY_MEMBER_DEAD;
        out->left += o->state == DL_POLICY_MEMBER_LEFT;
    }
    out->n_learners = k;
    out->learners = s->lstats;
    out->refused_msgs = s->refused_msgs;
    out->clipped = s->clipped;
    out->reclaimed = s->reclaimed;
    out->dropped_readers = s->dropped_readers;
    out->deferred_updates = s->deferred_updates;
    out->outbound_bytes = dl_wire_queue_bytes(s->outq);
    out->outbound_attached = attached_bytes(s);
    out->outbound_peak = s->outbound_peak;
    out->outbound_max = s->cfg.max_outbound_bytes;
    out->pool_bytes = s->pool_used;
    out->pool_peak = s->pool_peak;
    out->pool_max = s->cfg.pool_bytes;
    out->busy_refused = s->busy_refused;
    out->update_restarts = s->update_restarts;
    out->chunks_in = s->chunks_in;
    out->chunks_out = s->chunks_out;
    out->updates_full = s->updates_full;
    out->updates_delta = s->updates_delta;
    out->drain_yields = s->drain_yields;
    out->abandoned_pushes = s->abandoned_in;
    out->merges = s->merges;
    out->merged_contribs = s->merged_contribs;
    out->stale_sum = s->stale_sum;
    out->dropped_stale = s->dropped_stale;
    out->rejected = s->rejected;
    out->fetches = s->fetches;
    out->jobs_inflight = dl_worker_inflight(s->worker);
    out->known_learners = s->known_learners;
    dl_ledger_get_totals(s->ledger, &out->ledger);
    dl_store_stats ss;
    if (dl_store_get_stats(s->store, &ss) == 0) {
        out->store_file_bytes = ss.file_bytes;
        out->store_live_bytes = ss.live_bytes;
        out->store_free_bytes = ss.free_bytes;
    }
}

void dl_sync_summary(dl_sync *s, FILE *f)
{
    dl_sync_stats st;
    dl_sync_get_stats(s, &st);
    dl_report_summary(&st, f);
    dl_report_summary_events(&st);
}

/* ------------------------------------------------------------------------ */
/* the operator view: /metrics and /status.json, rendered on the loop from one
 * statistics snapshot and swapped in for the HTTP thread, which never reads
 * the loop's state */

static void publish_now(dl_sync *s)
{
    if (!s->pages) return;
    dl_sync_stats st;
    dl_sync_get_stats(s, &st);
    dl_policy_stats ps;
    dl_policy_get_stats(s->policy, &ps);
    dl_sync_tunables t = {.policy = *dl_policy_get_cfg(s->policy), .merge = s->cfg.merge, .guard = s->cfg.guard};
    dl_syncmet_ctx c = {.run_id = s->cfg.run_id,
                        .endpoint = s->endpoint,
                        .fingerprint = s->fingerprint,
                        .tun = &t,
                        .policy = &ps,
                        .shard = s->cfg.shard,
                        .shards = s->cfg.shards};
    dl_prom doc;
    dl_prom_init(&doc);
    dl_syncmet_render_metrics(&s->met, &st, &c, &doc);
    dl_httpd_pages_set(s->pages, "/metrics", "text/plain; version=0.0.4; charset=utf-8", doc.buf, doc.len);
    doc.len = 0;
    dl_syncmet_render_status(&s->met, &st, &c, &doc);
    dl_httpd_pages_set(s->pages, "/status.json", "application/json", doc.buf, doc.len);
    dl_prom_free(&doc);
}

static void on_publish(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    publish_now(w->data);
}

static int count_learner(const dl_store_learner *r, void *ctx)
{
    (void)r;
    ++*(uint64_t *)ctx;
    return 0;
}

/* --init_from onto a store: only one without a run. */
static int init_from_refuse_run(dl_sync *s)
{
    dl_store_run have;
    if (dl_store_get_run(s->store, &have) == 0)
        return dl_err(DL_EINVAL, "--init_from %s: the store %s already holds run %s; init_from applies only to a new "
                      "(empty) store: drop --init_from to resume it, or start with another store", s->cfg.init_from,
                      s->cfg.store, have.run_id);
    return 0;
}

/* The metrics server's port, bound with the ZeroMQ endpoint before the store
 * is opened: a busy or malformed --metrics leaves no store behind. An
 * explicit address that cannot be bound is an error naming the option; the
 * default one ("auto") falls back to an ephemeral loopback port, so several
 * synchronizers on one host all start. */
static int bind_metrics(dl_sync *s)
{
    if (!s->cfg.metrics[0] || !strcmp(s->cfg.metrics, "off")) return 0;
    int fallback = !strcmp(s->cfg.metrics, "auto");
    const char *addr = fallback ? DL_SYNC_METRICS_DEFAULT : s->cfg.metrics;
    s->pages = dl_httpd_pages_new();
    int rc = dl_httpd_open(addr, dl_httpd_pages_handler, s->pages, &s->httpd);
    if (rc && fallback) {
        DL_WARN("metrics: %s; serving on an ephemeral loopback port instead", dl_errmsg());
        rc = dl_httpd_open("127.0.0.1:0", dl_httpd_pages_handler, s->pages, &s->httpd);
        if (rc) {
            /* the default must never keep a synchronizer from starting */
            DL_WARN("metrics off: %s", dl_errmsg());
            dl_httpd_pages_free(&s->pages);
            return 0;
        }
    }
    if (rc) return dl_err(rc, "option metrics: %s", dl_errmsg());
    return 0;
}

/* Once the loop and the store are up: the documents it serves, every second. */
static void start_metrics(dl_sync *s)
{
    if (!s->httpd) return;
    DL_INFO("metrics: http://%s/metrics and /status.json", dl_httpd_addr(s->httpd));
    dl_event("metrics_listen", "addr=%s", dl_httpd_addr(s->httpd));
    ev_timer_init(&s->publish, on_publish, DL_SYNC_PUBLISH_S, DL_SYNC_PUBLISH_S);
    s->publish.data = s;
    ev_timer_start(s->loop, &s->publish);
    publish_now(s);
}

/* ------------------------------------------------------------------------ */
/* lifecycle */

static void wake_loop(void *ctx)
{
    dl_sync *s = ctx;
    ev_async_send(s->loop, &s->wake);
}

/* 1 when the endpoint only accepts connections from this host. */
static int loopback_endpoint(const char *ep)
{
    return !strncmp(ep, "tcp://127.", 10) || !strncmp(ep, "tcp://localhost:", 16) || !strncmp(ep, "tcp://[::1]:", 12) ||
           !strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9);
}

/* A tcp:// bind's port must be `*` or 0..65535: libzmq takes 99999 and
 * binds it modulo 65536 (34463), a typo that would otherwise run. */
static int check_bind_port(const char *ep)
{
    if (strncmp(ep, "tcp://", 6)) return 0;
    const char *colon = strrchr(ep + 6, ':');
    if (!colon || !colon[1]) return dl_err(DL_EINVAL, "bind %s: no port (tcp://HOST:PORT)", ep);
    if (!strcmp(colon + 1, "*")) return 0;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (*end || errno || port < 0 || port > 65535)
        return dl_err(DL_EINVAL, "bind %s: port '%s' is not * or 0..65535", ep, colon + 1);
    return 0;
}

static int open_router(dl_sync *s)
{
    DL_TRY(check_bind_port(s->cfg.bind));
    DL_ZMQ_PTR(s->zctx, zmq_ctx_new());
    if (s->cfg.auth == DL_SYNC_AUTH_CURVE) {
        /* the ZAP handler must be bound before the CURVE socket is */
        dl_auth_keypair kp;
        DL_TRY(dl_auth_load_keypair(s->cfg.key_file, &kp));
        DL_TRY(dl_auth_start(s->zctx, s->cfg.allowlist, &s->auth));
        DL_ZMQ_PTR(s->router, zmq_socket(s->zctx, ZMQ_ROUTER));
        DL_TRY(dl_auth_server_sock(s->router, &kp));
        memset(&kp, 0, sizeof kp);
    } else {
        DL_ZMQ_PTR(s->router, zmq_socket(s->zctx, ZMQ_ROUTER));
    }
    DL_TRY(dl_wire_sock_setup(s->router, 1, (size_t)s->cfg.max_msg_bytes));
    if (zmq_bind(s->router, s->cfg.bind) != 0)
        return dl_err(DL_ENET, "bind %s: %s", s->cfg.bind, zmq_strerror(zmq_errno()));
    size_t elen = sizeof s->endpoint;
    DL_ZMQ_CALL(zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &elen));
    return 0;
}

/* A new run's global model from a model file instead of the seed, read
 * before the store is opened (a bad file leaves no store behind); the store
 * must then hold no run (init_from_refuse_run): a resumed run's model is the
 * store's. */
static int init_from_file(dl_sync *s, float *full)
{
    dl_modelfile_info info;
    int rc = dl_modelfile_read(s->cfg.init_from, &s->cfg.model, full, &info);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        return dl_err(rc, "--init_from %s", why);
    }
    DL_INFO("new run %s: global model from %s (%s, %s)", s->cfg.run_id, s->cfg.init_from, info.kind, info.dtype);
    return 0;
}

int dl_sync_open(const dl_sync_cfg *cfg, dl_sync **out)
{
    *out = NULL;
    char why[256];
    if (dl_policy_cfg_check(&cfg->policy, why, sizeof why)) return DL_EINVAL;
    dl_sync *s = dl_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    dl_syncmet_init(&s->met, cfg->P > 0 ? cfg->P : 1);
    int rc = 0;
    float *full = NULL;
    if ((rc = dl_model_config_check(&s->cfg.model))) goto fail;
    if ((rc = dl_model_plan_open(&s->cfg.model, s->cfg.P, &s->plan))) goto fail;
    s->fingerprint = dl_model_fingerprint(&s->cfg.model, s->plan);
    int P = s->cfg.P;
    if ((rc = dl_shard_check(P, s->cfg.shard, s->cfg.shards))) goto fail;
    if (s->cfg.shards <= 1) s->cfg.shard = 0, s->cfg.shards = 1;
    int owned = dl_shard_count(P, s->cfg.shard, s->cfg.shards);
    s->numel = dl_xcalloc((size_t)P, sizeof(uint64_t));
    s->params = dl_xcalloc((size_t)P, sizeof(float *));
    s->momentum = dl_xcalloc((size_t)P, sizeof(float *));
    s->aside = dl_xcalloc((size_t)P, sizeof *s->aside);
    s->naside = dl_xcalloc((size_t)P, sizeof(int));
    s->capaside = dl_xcalloc((size_t)P, sizeof(int));
    s->versions = dl_xcalloc((size_t)P, sizeof(uint64_t));
    s->param_norm = dl_xcalloc((size_t)P, sizeof(double));
    s->outq = dl_wire_queue_new();
    dl_wire_queue_set_wake(s->outq, wake_loop, s); /* room again: go on sending */
    for (int p = 0; p < P; p++) {
        s->numel[p] = dl_plan_fragment_numel(s->plan, p);
        s->params[p] = dl_xaligned(64, s->numel[p] * sizeof(float)); /* another shard's: only until init_run */
        if (owns(s, p)) s->momentum[p] = dl_xaligned(64, s->numel[p] * sizeof(float));
    }

    /* every check that needs no store, and the bind, come first: a typo'd
     * bind or a bad option leaves no new store directory behind */
    if ((rc = dl_guard_cfg_check(&s->cfg.guard))) goto fail;
    if (s->cfg.update.c.id && dl_codec_check(&s->cfg.update.c, why, sizeof why)) {
        rc = dl_err(DL_EINVAL, "update_codec %s: %s", dl_codec_name(s->cfg.update.c.id), why);
        goto fail;
    }
    /* a delta chunk must fit the frames a learner takes (the fp32 chunk): topk
     * costs 6 bytes per entry */
    if (s->cfg.update.c.id == DL_CODEC_TOPK && 2 * s->cfg.update.c.topk > s->cfg.update.c.block) {
        rc = dl_err(DL_EINVAL, "update_topk %u is more than half of update_block %u", s->cfg.update.c.topk,
                    s->cfg.update.c.block);
        goto fail;
    }
    /* bounds that follow from the model (a shard: its own fragments) unless set */
    uint64_t model_bytes = 0, frag_bytes = 0;
    for (int p = 0; p < P; p++) {
        if (!owns(s, p)) continue;
        uint64_t b = s->numel[p] * sizeof(float);
        model_bytes += b;
        if (b > frag_bytes) frag_bytes = b;
    }
    s->max_frag_bytes = frag_bytes;
    if (!s->cfg.chunk_bytes) s->cfg.chunk_bytes = DL_SYNC_CHUNK_BYTES;
    if (s->cfg.chunk_bytes < DL_WIRE_CHUNK_MIN || s->cfg.chunk_bytes > DL_WIRE_CHUNK_MAX || s->cfg.chunk_bytes % 4) {
        rc = dl_err(DL_EINVAL, "chunk_bytes %llu is not a multiple of 4 in [%u, %u]",
                    (unsigned long long)s->cfg.chunk_bytes, DL_WIRE_CHUNK_MIN, DL_WIRE_CHUNK_MAX);
        goto fail;
    }
    /* chunked pushes: nothing bigger than a chunk (or a small whole fragment) is a valid message */
    uint64_t unit = frag_bytes < s->cfg.chunk_bytes ? frag_bytes : s->cfg.chunk_bytes;
    if (!s->cfg.max_msg_bytes) s->cfg.max_msg_bytes = unit + DL_WIRE_MAX_HEADER_BYTES;
    /* a learner's window: two chunks in flight keep a link busy, and a
     * heartbeat or Ack waits behind at most that */
    if (!s->cfg.peer_outbound_bytes) s->cfg.peer_outbound_bytes = 2 * s->cfg.chunk_bytes;
    if (!s->cfg.pool_bytes) {
        uint64_t two = 2 * model_bytes, floor = 4 * frag_bytes;
        s->cfg.pool_bytes = two > floor ? two : floor;
        if (s->cfg.pool_bytes < DL_SYNC_POOL_MIN) s->cfg.pool_bytes = DL_SYNC_POOL_MIN;
    }
    if (s->cfg.pool_bytes < frag_bytes) {
        rc = dl_err(DL_EINVAL, "pool_mb holds %llu bytes, less than the largest fragment (%llu bytes): no push could wait",
                    (unsigned long long)s->cfg.pool_bytes, (unsigned long long)frag_bytes);
        goto fail;
    }
    if (!s->cfg.max_outbound_bytes) {
        uint64_t four = 4 * model_bytes, floor = 256ull << 20;
        s->cfg.max_outbound_bytes = four > floor ? four : floor;
    }
    if (s->cfg.auth == DL_SYNC_AUTH_AUTO)
        s->cfg.auth = loopback_endpoint(s->cfg.bind) ? DL_SYNC_AUTH_OFF : DL_SYNC_AUTH_CURVE;
    if (s->cfg.auth == DL_SYNC_AUTH_CURVE && (!s->cfg.key_file[0] || !s->cfg.allowlist[0])) {
        rc = dl_err(DL_EINVAL,
                    "bind %s is not loopback, so CURVE authentication is on: set key_file (the synchronizer's key "
                    "pair: dloco keygen PREFIX) and allowlist (a file of 'learner_id public_key' lines), or auth = "
                    "off to accept anyone who can reach the port",
                    s->cfg.bind);
        goto fail;
    }
    s->hello_tokens = s->cfg.new_hello_burst;
    s->hello_refill_ns = dl_clock_ns();
    s->lim = dl_wire_limits_default();
    s->lim.num_fragments = (uint32_t)P;
    s->lim.fragment_numel = s->numel;
    s->lim.max_frames = 2;
    s->lim.shard = (uint32_t)s->cfg.shard; /* pushes and fetches of another shard's fragments are refused */
    s->lim.shards = (uint32_t)s->cfg.shards;
    if ((rc = open_router(s)) || (rc = bind_metrics(s))) goto fail;

    /* the store: a fresh run starts from the seeded init, a resumed one from LMDB */
    dl_store_opts so = dl_store_opts_default();
    so.durability = s->cfg.durability;
    full = dl_xmalloc(dl_plan_total_numel(s->plan) * sizeof(float));
    if (s->cfg.init_from[0]) {
        if ((rc = init_from_file(s, full))) goto fail;
    } else if ((rc = dl_model_init_params(&s->cfg.model, s->cfg.seed, full))) {
        goto fail;
    }
    if ((rc = dl_store_open(s->cfg.store, &so, &s->store))) goto fail;
    if (s->cfg.init_from[0] && (rc = init_from_refuse_run(s))) goto fail;
    for (int p = 0; p < P; p++) dl_plan_gather(s->plan, p, full, s->params[p]);
    dl_store_run run = {.run_id = s->cfg.run_id,
                        .fingerprint = s->fingerprint,
                        .config_text = s->cfg.config_text,
                        .model = s->cfg.model,
                        .seed = s->cfg.seed,
                        .n_fragments = (uint32_t)P,
                        .numel = s->numel};
    dl_store_shard layout = {(uint32_t)s->cfg.shard, (uint32_t)s->cfg.shards};
    if ((rc = dl_store_init_run_shard(s->store, &run, &layout, (const float *const *)s->params))) goto fail;
    for (int p = 0; p < P; p++)
        if (!owns(s, p)) {
            free(s->params[p]); /* a new store's version 0 of it is written; nothing else here needs it */
            s->params[p] = NULL;
        }
    if ((rc = dl_store_bump_epoch(s->store, &s->epoch))) goto fail;
    if ((rc = dl_policy_open(&s->cfg.policy, P, &s->policy))) goto fail;
    if ((rc = dl_guard_open(&s->cfg.guard, P, s->cfg.policy.max_learners, &s->guard))) goto fail;
    uint64_t total_v = 0;
    for (int p = 0; p < P; p++) {
        uint64_t v;
        if (!owns(s, p)) continue; /* stays at version 0 in the policy: no round of it ever opens */
        if ((rc = dl_store_read_fragment(s->store, (uint32_t)p, &v, s->params[p], s->momentum[p]))) goto fail;
        dl_policy_set_version(s->policy, p, v);
        total_v += v;
        int fin = 0;
        s->param_norm[p] = dl_guard_norm(s->params[p], s->numel[p], &fin);
    }
    dl_registry_open(s->cfg.policy.max_learners, P, &s->reg);
    dl_ledger_open(s->cfg.policy.max_learners, P, &s->ledger);
    dl_ledger_set_fragments(s->ledger, owned);
    s->lstats = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->lstats);
    s->inb = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->inb);
    s->outx = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->outx);
    for (int i = 0; i < s->cfg.policy.max_learners; i++) s->outx[i].p = -1;
    s->resume_v = dl_xcalloc((size_t)s->cfg.policy.max_learners * (size_t)P, sizeof(uint64_t));
    s->resume_o = dl_xcalloc((size_t)s->cfg.policy.max_learners * (size_t)P, sizeof(uint64_t));
    s->owed_order = dl_xcalloc((size_t)s->cfg.policy.max_learners, sizeof *s->owed_order);


    s->loop = ev_loop_new(EVFLAG_AUTO);
    dl_worker_open(s->store, s->plan, s->params, s->momentum, wake_loop, s, &s->worker);
    dl_worker_set_update_codec(s->worker, &s->cfg.update);
    s->kept = dl_xcalloc((size_t)P, sizeof *s->kept);
    int fd;
    size_t fl = sizeof fd;
    if (zmq_getsockopt(s->router, ZMQ_FD, &fd, &fl) != 0) {
        rc = dl_wire_zmq_fail("zmq_getsockopt(ZMQ_FD)", __FILE__, __LINE__);
        goto fail;
    }
    ev_io_init(&s->zio, on_zmq, fd, EV_READ);
    s->zio.data = s;
    ev_io_start(s->loop, &s->zio);
    ev_async_init(&s->wake, on_wake);
    s->wake.data = s;
    ev_async_start(s->loop, &s->wake);
    ev_idle_init(&s->more, on_more);
    s->more.data = s;
    ev_timer_init(&s->deadline, on_deadline, 1.0, 0.0);
    s->deadline.data = s;
    double hb = s->cfg.heartbeat_ms * 1e-3;
    ev_timer_init(&s->tick, on_tick, hb, hb);
    s->tick.data = s;
    ev_timer_start(s->loop, &s->tick);
    if (s->cfg.status_every_ms > 0) {
        double st = s->cfg.status_every_ms * 1e-3;
        ev_timer_init(&s->status, on_status, st, st);
        s->status.data = s;
        ev_timer_start(s->loop, &s->status);
    }
    ev_signal_init(&s->sigint, on_stop, SIGINT);
    s->sigint.data = s;
    ev_signal_start(s->loop, &s->sigint);
    ev_signal_init(&s->sigterm, on_stop, SIGTERM);
    s->sigterm.data = s;
    ev_signal_start(s->loop, &s->sigterm);
    ev_signal_init(&s->sighup, on_hup, SIGHUP);
    s->sighup.data = s;
    ev_signal_start(s->loop, &s->sighup);

    s->started_ns = s->last_sync_ns = dl_clock_ns();
    dl_store_foreach_learner(s->store, count_learner, &s->known_learners);
    open_eval(s);
    start_metrics(s);
    DL_INFO("run '%s' epoch %llu: %s (%d fragments, %zu params, fingerprint %016llx), listening on %s",
            s->cfg.run_id, (unsigned long long)s->epoch, total_v ? "resumed" : "new run", P,
            dl_plan_total_numel(s->plan), (unsigned long long)s->fingerprint, s->endpoint);
    if (s->cfg.shards > 1)
        DL_INFO("shard %d of %d: the %d fragments p with p %% %d == %d are merged, stored and served here", s->cfg.shard,
                s->cfg.shards, owned, s->cfg.shards, s->cfg.shard);
    DL_INFO("limits: messages <= %llu bytes, chunks of %llu bytes, pool <= %llu bytes, outbound queue <= %llu bytes "
            "(%llu per learner), %s",
            (unsigned long long)s->cfg.max_msg_bytes, (unsigned long long)s->cfg.chunk_bytes,
            (unsigned long long)s->cfg.pool_bytes, (unsigned long long)s->cfg.max_outbound_bytes,
            (unsigned long long)s->cfg.peer_outbound_bytes,
            s->auth ? "CURVE: only allowlisted keys connect" : "no authentication (loopback or auth = off)");
    if (!s->auth && !loopback_endpoint(s->cfg.bind))
        DL_WARN("bind %s is not loopback and auth = off: anyone who reaches the port can join and push", s->cfg.bind);
    dl_event("sync_start",
             "epoch=%llu resumed=%d fragments=%d params=%zu fingerprint=%016llx endpoint=%s auth=%s max_msg_bytes=%llu "
             "max_outbound_bytes=%llu chunk_bytes=%llu pool_bytes=%llu peer_outbound_bytes=%llu shard=%d shards=%d "
             "owned=%d update_codec=%s update_block=%u update_topk=%u",
             (unsigned long long)s->epoch, total_v ? 1 : 0, P, dl_plan_total_numel(s->plan),
             (unsigned long long)s->fingerprint, s->endpoint, s->auth ? "curve" : "off",
             (unsigned long long)s->cfg.max_msg_bytes, (unsigned long long)s->cfg.max_outbound_bytes,
             (unsigned long long)s->cfg.chunk_bytes, (unsigned long long)s->cfg.pool_bytes,
             (unsigned long long)s->cfg.peer_outbound_bytes, s->cfg.shard, s->cfg.shards, owned,
             s->cfg.update.c.id ? dl_codec_name(s->cfg.update.c.id) : "off", s->cfg.update.c.block,
             s->cfg.update.c.topk);
    free(full);
    *out = s;
    return 0;
fail:
    free(full);
    {
        /* keep the failing call's message across cleanup */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        dl_sync_close(&s);
        dl_err(rc, "%s", msg);
    }
    return rc;
}

int dl_sync_run(dl_sync *s)
{
    drain(s);
    ev_run(s->loop, 0);
    return 0;
}

const char *dl_sync_endpoint(const dl_sync *s) { return s->endpoint; }

void dl_sync_close(dl_sync **sp)
{
    if (!sp || !*sp) return;
    dl_sync *s = *sp;
    dl_evalthread_close(&s->evalt); /* before the store and the loop it reads and wakes */
    dl_httpd_close(&s->httpd); /* its thread reads only the pages */
    dl_httpd_pages_free(&s->pages);
    dl_syncmet_free(&s->met);
    if (s->outq) dl_wire_queue_set_wake(s->outq, NULL, NULL); /* libzmq frees what it holds below */
    dl_worker_close(&s->worker); /* before the loop it wakes */
    if (s->router) DL_ZMQ_LOG(zmq_close(s->router));
    dl_auth_stop(&s->auth);
    if (s->zctx) DL_ZMQ_LOG(zmq_ctx_term(s->zctx));
    /* after libzmq's threads: a free callback in flight may still wake the loop */
    if (s->loop) ev_loop_destroy(s->loop);
    /* libzmq has freed every queued message now: the counters can go */
    dl_wire_queue_release(&s->outq);
    dl_guard_close(&s->guard);
    free(s->param_norm);
    free(s->rate_buf);
    dl_policy_close(&s->policy);
    dl_registry_close(&s->reg);
    dl_ledger_close(&s->ledger);
    dl_store_close(&s->store);
    dl_plan_close(&s->plan);
    for (int p = 0; s->params && p < s->cfg.P; p++) {
        free(s->params[p]);
        free(s->momentum[p]);
        free(s->aside[p]);
    }
    for (size_t i = 0; i < s->npend; i++) free(s->pend[i].delta);
    free(s->pend);
    for (int i = 0; s->inb && i < s->cfg.policy.max_learners; i++) free(s->inb[i].buf);
    free(s->inb);
    free(s->outx);
    for (int p = 0; s->kept && p < s->cfg.P; p++) free(s->kept[p].buf);
    free(s->kept);
    free(s->resume_v);
    free(s->resume_o);
    free(s->params);
    free(s->momentum);
    free(s->aside);
    free(s->naside);
    free(s->capaside);
    free(s->numel);
    free(s->versions);
    free(s->lstats);
    free(s->owed_order);
    free(s);
    *sp = NULL;
}
