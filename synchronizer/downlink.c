/* The downlink: everything that leaves for a learner (envelopes, errors,
 * Acks, Updates chunk by chunk from owed fragments), Fetch, slow readers. */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

void dl_downlink_env(dl_sync *s, Dloco__V1__Envelope *env, const char *learner)
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

static void path_sent(const dl_registry_learner *l, outbound *x, uint64_t seq, size_t len, int64_t now);

/* Never block the loop: a learner whose queue is full loses this message
 * (it will get the next update; a lost Ack only leaves its log incomplete).
 * Nothing goes to a learner whose connection was cut off. The payload is
 * `blob`'s bytes when it is not NULL (sent without a copy), else len bytes
 * at payload (copied). */
static int send_env(dl_sync *s, dl_registry_learner *l, Dloco__V1__Envelope *env, const void *payload, size_t len,
                    dl_wire_blob *blob)
{
    if (!l->route_len) return DL_ENOTFOUND;
    const void *pl[1] = {payload};
    size_t lens[1] = {len};
    dl_wire_queue *q[2] = {s->outq, l->outq};
    int rc = blob ? dl_wire_send_blob_q(s->router, l->route, l->route_len, env, blob, ZMQ_DONTWAIT, q)
                  : dl_wire_send_q(s->router, l->route, l->route_len, env, payload ? pl : NULL,
                                   payload ? lens : NULL, payload ? 1 : 0, ZMQ_DONTWAIT, q);
    if (rc == 0) {
        outbound *x = &s->outx[l - dl_registry_cget(s->reg, 0)];
        if (!len) {
            /* a control message waits behind what libzmq holds for this connection: pacing bounds it */
            uint64_t ahead = dl_wire_queue_bytes(l->outq);
            if (ahead > x->ctl_ahead_max) x->ctl_ahead_max = ahead;
        } else {
            path_sent(l, x, env->seq, len, dl_clock_ns());
        }
        l->bytes_out += len + 64;
        s->met.bytes_out[dl_syncmet_kind(env->body_case)] += len + 64;
        s->met.msgs_out[dl_syncmet_kind(env->body_case)]++;
        if (len) {
            uint64_t q = dl_downlink_attached_bytes(s);
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

int dl_downlink_send(dl_sync *s, dl_registry_learner *l, Dloco__V1__Envelope *env, const void *payload, size_t len)
{
    return send_env(s, l, env, payload, len, NULL);
}

/* An Error to a connection. `learner` names the addressee when it is a
 * valid id (else the reply's learner_id is empty). */
void dl_downlink_error(dl_sync *s, const uint8_t *route, size_t rlen, const char *learner, int code, int fatal,
                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));
void dl_downlink_error(dl_sync *s, const uint8_t *route, size_t rlen, const char *learner, int code, int fatal,
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
    dl_downlink_env(s, &env, valid ? learner : "");
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

/* ---- pacing
 *
 * What is queued for a learner is bounded by what its connection drains
 * (libzmq frees a message once the kernel took it): about pace_ns of it at
 * the measured rate, at least one chunk, at most peer_outbound_bytes. Its
 * chunks shrink (powers of two, >= DL_WIRE_CHUNK_MIN) so that two fit in
 * that, and start at DL_PACE_PROBE_BYTES until a rate is measured. So an
 * Ack, a heartbeat or a Welcome, which queue behind Update bytes on the same
 * connection, wait about pace_ns whatever the link, and a thin learner is
 * never handed a backlog of versions it will not use: what is owed is
 * decided when there is room, at the newest version. */
#define DL_PACE_TAU_NS 1e9           /* the drain rate's memory: busy time older than ~1 s fades */
/* A rate is trusted after this much busy time, or bytes drained: a new
 * connection's first frees come as fast as the kernel's socket buffers fill,
 * not as the link drains, and must fade first */
#define DL_PACE_MIN_NS 3e8
#define DL_PACE_MIN_BYTES (64.0 * 1048576.0)
#define DL_PACE_PROBE_BYTES (64u << 10)

static int64_t pace_ns(const dl_sync *s)
{
    int64_t ms = s->cfg.outbound_ms;
    if (!ms) {
        ms = (int64_t)s->cfg.heartbeat_ms * s->cfg.liveness / 4;
        if (ms > 500) ms = 500;
    }
    return (ms > 0 ? ms : 1) * 1000000LL;
}

/* Update learner l's drain rate from its queue: the bytes freed over the
 * time the queue held bytes (from the first send into an empty queue, or the
 * last free counted, to the latest free). Called before and after every
 * send of serve_owed: a queue that empties stops the clock at its last free. */
static void measure(const dl_registry_learner *l, outbound *x, int64_t now)
{
    const dl_wire_queue *q = l->outq;
    int64_t dns = dl_wire_queue_drained_ns(q); /* the time first: the bytes then include every free up to it */
    uint64_t drained = dl_wire_queue_drained_bytes(q), queued = dl_wire_queue_bytes(q);
    if (x->mq != q || drained < x->m_drained) {
        x->mq = q;
        x->r_bytes = x->r_ns = x->rate = 0;
        x->m_drained = drained;
        x->m_ns = queued ? now : 0;
        return;
    }
    if (x->m_ns && drained > x->m_drained && dns > x->m_ns) {
        double dt = (double)(dns - x->m_ns), keep = exp(-dt / DL_PACE_TAU_NS);
        x->r_bytes = x->r_bytes * keep + (double)(drained - x->m_drained);
        x->r_ns = x->r_ns * keep + dt;
        if (x->r_ns >= DL_PACE_MIN_NS || x->r_bytes >= DL_PACE_MIN_BYTES) x->rate = x->r_bytes / x->r_ns * 1e9;
        x->m_drained = drained;
        x->m_ns = dns;
    }
    if (!queued) {
        x->m_ns = 0; /* idle: its next busy time starts with the next send */
        x->m_drained = drained;
    } else if (!x->m_ns) {
        x->m_ns = now;
        x->m_drained = drained;
    }
}

double dl_downlink_rate(const dl_sync *s, int slot) { return s->outx[slot].rate; }
uint64_t dl_downlink_ctl_ahead_max(const dl_sync *s, int slot) { return s->outx[slot].ctl_ahead_max; }

/* Elements of the largest Update chunk learner l takes (unpaced). */
static uint64_t chunk_elems_max(const dl_sync *s, const dl_registry_learner *l)
{
    return (s->cfg.chunk_bytes < l->max_chunk ? s->cfg.chunk_bytes : l->max_chunk) / sizeof(float);
}

/* Elements per Update chunk to learner l: the configured chunk, at most
 * what the learner said it takes, at most what pacing allows (above); 0 =
 * whole fragments (a learner from before chunking). */
static uint64_t chunk_elems(const dl_sync *s, const dl_registry_learner *l, const outbound *x)
{
    if (!l->max_chunk) return 0;
    uint64_t b = s->cfg.chunk_bytes < l->max_chunk ? s->cfg.chunk_bytes : l->max_chunk;
    double want = x->rate > 0 ? x->rate * (double)pace_ns(s) * 1e-9 / 2 : (double)DL_PACE_PROBE_BYTES;
    if (want < (double)b) {
        uint64_t c = DL_WIRE_CHUNK_MIN;
        while ((double)(2 * c) <= want) c *= 2;
        if (c < b) b = c;
    }
    return b / sizeof(float);
}

/* Payload bytes learner l may have queued: what drains in pace_ns, at
 * least two chunks before a rate is known, at most peer_outbound_bytes. */
static uint64_t window_bytes(const dl_sync *s, const outbound *x, uint64_t ce)
{
    double w = x->rate > 0 ? x->rate * (double)pace_ns(s) * 1e-9 : (double)(2 * ce * sizeof(float));
    return w < (double)s->cfg.peer_outbound_bytes ? (uint64_t)w : s->cfg.peer_outbound_bytes;
}

/* ---- the path's bound
 *
 * Pacing sees only libzmq's queue: bytes the kernel took have left it, but
 * the kernel's socket buffers and every buffer further on the path come on
 * top (a WAN router's; in dloco-chaos the datacenter's relay, up to 8 MiB
 * per direction). While a link is cut, or slower than the merges, those
 * take megabytes of Updates at once and hand them to the learner seconds
 * late: versions it will not use, ahead of its Welcome and Acks (a 15 s
 * partition of bench/wan.sh's thin datacenter left its learners 40-80
 * versions behind for the rest of the run, their pushes dropped stale). So
 * each Heartbeat of a learner names the newest message of ours it has
 * received (received_seq): the Update messages sent up to it have left the
 * path. Two bounds follow, over the window 2 x heartbeat_ms + the pacing
 * window (1.5 s with the defaults):
 * - time: while the oldest message it has not reported was sent more than
 *   the window ago, no more Update bytes go;
 * - bytes: once the time bound has held bytes back on a connection (its
 *   path is deeper than its link), the bytes it has not reported stay under
 *   what the path delivered in one window (the most of its latest
 *   DL_SYNC_PATH_SAMPLES delivery rates, each the bytes reported over at
 *   least 2 x heartbeat_ms; at least DL_SYNC_PATH_FLOOR, which is all
 *   until a rate is measured). The time bound
 *   alone let the first instant after a report fill the buffers: the
 *   kernel and the relay took a thin learner's owed versions at loopback
 *   speed, and bench/wan.sh's 3 Mbit/s learners got their Acks 3.5-3.9 s
 *   after their pushes (median; 1.6-1.8 s with it), some pushes dropped
 *   stale in a run without faults (2026-12-05).
 * The rest stays owed and is decided when a report comes, at the newest
 * version. So what waits on the path is at most about the window of its
 * link, however deep its buffers. A report comes within heartbeat_ms of
 * the message's arrival plus the round trip, so a learner on a fast path
 * never meets either bound, nor does one whose round trip is short of
 * heartbeat_ms + the pacing window (a longer one leaves the link idle part
 * of the time); the bytes bound lets the rate it measures grow (a window
 * is longer than the time a report takes), so a link that got faster is
 * followed; one that never reports (older ones) is not bounded this way; a
 * lost message is covered by the next one that arrives (seqs only grow;
 * the tick's heartbeat follows an empty queue). */
#define DL_SYNC_PATH_FLOOR (128u << 10) /* the bytes bound's least: two probe chunks */

static int64_t path_window_ns(const dl_sync *s) { return 2 * (int64_t)s->cfg.heartbeat_ms * 1000000LL + pace_ns(s); }

static void path_reset(const dl_registry_learner *l, outbound *x)
{
    x->eq = l->outq;
    x->e_known = 0;
    x->e_sent = x->e_acked = 0;
    x->e_head = x->e_n = 0;
    x->e_s_ns = 0;
    x->e_s_acked = 0;
    x->e_rate_n = x->e_rate_i = 0;
    x->e_deep = 0;
}

/* An Update message of len payload bytes left for learner l as message seq. */
static void path_sent(const dl_registry_learner *l, outbound *x, uint64_t seq, size_t len, int64_t now)
{
    if (x->eq != l->outq) path_reset(l, x);
    x->e_sent += len;
    int k;
    if (x->e_n < DL_SYNC_PATH_RING) {
        k = (x->e_head + x->e_n++) % DL_SYNC_PATH_RING;
        x->e_ring[k].ns = now;
    } else {
        k = (x->e_head + x->e_n - 1) % DL_SYNC_PATH_RING; /* the newest entry takes it too (sent at its time) */
    }
    x->e_ring[k].seq = seq;
    x->e_ring[k].cum = x->e_sent;
    if (x->e_sent - x->e_acked > x->e_inflight_max) x->e_inflight_max = x->e_sent - x->e_acked;
    if (x->e_deep && x->e_sent - x->e_acked > x->e_inflight_deep_max) x->e_inflight_deep_max = x->e_sent - x->e_acked;
}

/* What the path delivers, bytes per second: the most of its latest samples (0: none yet). */
static double path_rate(const outbound *x)
{
    double r = 0;
    for (int i = 0; i < x->e_rate_n; i++)
        if (x->e_rate[i] > r) r = x->e_rate[i];
    return r;
}

/* The bytes bound (above): what learner l's path may hold unreported; 0 = no bound. */
static uint64_t path_cap(const dl_sync *s, const outbound *x)
{
    if (!x->e_deep) return 0;
    double cap = path_rate(x) * (double)path_window_ns(s) * 1e-9; /* no sample yet: the floor */
    return cap > (double)DL_SYNC_PATH_FLOOR ? (uint64_t)cap : DL_SYNC_PATH_FLOOR;
}

/* Whether more Update bytes may go on learner l's path now (above). */
static int path_room(const dl_sync *s, const dl_registry_learner *l, outbound *x, int64_t now)
{
    if (!x->e_known || x->eq != l->outq || !x->e_n) return 1;
    if (now - x->e_ring[x->e_head].ns > path_window_ns(s)) {
        x->e_deep = 1;
        return 0;
    }
    uint64_t cap = path_cap(s, x);
    return !cap || x->e_sent - x->e_acked < cap;
}

static void serve_one(dl_sync *s, dl_registry_learner *l);

/* A Heartbeat of learner l says message seq is the newest of ours it has
 * received: the Update messages sent up to it are off the path (and count
 * as delivered in the path's rate). What is owed is served at once rather
 * than at the next tick. */
void dl_downlink_received(dl_sync *s, int slot, dl_registry_learner *l, uint64_t seq)
{
    outbound *x = &s->outx[slot];
    if (!seq || seq > s->seq) return; /* none yet, or not one of ours (another incarnation's) */
    if (x->eq != l->outq) path_reset(l, x);
    x->e_known = 1;
    int n = x->e_n;
    while (x->e_n && x->e_ring[x->e_head].seq <= seq) {
        x->e_acked = x->e_ring[x->e_head].cum;
        x->e_head = (x->e_head + 1) % DL_SYNC_PATH_RING;
        x->e_n--;
    }
    int64_t now = dl_clock_ns();
    if (!x->e_s_ns) {
        x->e_s_ns = now;
        x->e_s_acked = x->e_acked;
    } else if (now - x->e_s_ns >= 2 * (int64_t)s->cfg.heartbeat_ms * 1000000LL) {
        if (x->e_acked > x->e_s_acked) { /* a sample with nothing delivered says nothing of the path */
            x->e_rate[x->e_rate_i] = (double)(x->e_acked - x->e_s_acked) / ((double)(now - x->e_s_ns) * 1e-9);
            x->e_rate_i = (x->e_rate_i + 1) % DL_SYNC_PATH_SAMPLES;
            if (x->e_rate_n < DL_SYNC_PATH_SAMPLES) x->e_rate_n++;
        }
        x->e_s_ns = now;
        x->e_s_acked = x->e_acked;
    }
    if (x->e_n < n && l->n_owed && l->route_len && member(s, slot) == DL_POLICY_MEMBER_LIVE) serve_one(s, l);
}

uint64_t dl_downlink_path_inflight_max(const dl_sync *s, int slot) { return s->outx[slot].e_inflight_max; }

double dl_downlink_path_rate(const dl_sync *s, int slot, int *deep, uint64_t *deep_max)
{
    *deep = s->outx[slot].e_deep;
    *deep_max = s->outx[slot].e_inflight_deep_max;
    return path_rate(&s->outx[slot]);
}

/* ---- shared chunks
 *
 * Every learner owed a version gets the same chunks of it (pacing aside),
 * so an Update chunk is copied out of the store (or the kept delta) and
 * hashed once, into a blob that each learner's message references: libzmq
 * frees a message by dropping its reference (proto/wire.h). The chunks of
 * a fragment's newest fp32 version are kept until a newer one is sent
 * (s->fullc), a kept delta's with it (kept_delta.cs); a chunk of another
 * size (a paced learner's) is a chunk of its own. At most shared_max bytes
 * are kept in all (then a chunk is made for its one message, as before). */
#define DL_SYNC_SET_MAX 1024 /* chunks kept per fragment version */

static void set_clear(dl_sync *s, chunk_set *cs)
{
    for (int i = 0; i < cs->n; i++) dl_wire_blob_release(&cs->e[i].blob);
    s->shared_bytes -= cs->bytes;
    cs->n = 0;
    cs->bytes = 0;
}

static void set_free(dl_sync *s, chunk_set *cs)
{
    set_clear(s, cs);
    free(cs->e);
    *cs = (chunk_set){0};
}

void dl_downlink_close(dl_sync *s)
{
    for (int k = 0; s->kept && k < s->cfg.P * DL_SYNC_KEPT_DELTAS; k++) set_free(s, &s->kept[k].cs);
    for (int p = 0; s->fullc && p < s->cfg.P; p++) set_free(s, &s->fullc[p].cs);
}

/* The blob of elements [off, off + n) kept in cs (NULL: none kept), a
 * reference for the caller; NULL when there is none. */
static dl_wire_blob *chunk_find(const chunk_set *cs, uint64_t off, uint64_t n)
{
    for (int i = 0; cs && i < cs->n; i++)
        if (cs->e[i].offset == off && cs->e[i].n == n) return dl_wire_blob_ref(cs->e[i].blob);
    return NULL;
}

/* The blob of elements [off, off + n): the one kept in cs (*shared 1), else
 * one made of the `bytes` at data (kept in cs while the budget allows). A
 * reference for the caller; NULL when out of memory. */
static dl_wire_blob *chunk_blob(dl_sync *s, chunk_set *cs, uint64_t off, uint64_t n, const void *data, size_t bytes,
                                int *shared)
{
    dl_wire_blob *b = chunk_find(cs, off, n);
    *shared = b != NULL;
    if (b) return b;
    b = dl_wire_blob_try_new(data, bytes);
    if (!b || !cs || cs->n >= DL_SYNC_SET_MAX || s->shared_bytes + bytes > s->shared_max) return b;
    if (cs->n == cs->cap) {
        cs->cap = cs->cap ? 2 * cs->cap : 16;
        cs->e = dl_xrealloc(cs->e, (size_t)cs->cap * sizeof *cs->e);
    }
    cs->e[cs->n++] = (shared_chunk){.blob = dl_wire_blob_ref(b), .offset = off, .n = n};
    cs->bytes += bytes;
    s->shared_bytes += bytes;
    return b;
}

/* One Update message: elements [off, off + n) of version `version` of
 * fragment p (chunked when `chunked`, else the whole fragment), the blob's
 * bytes of payload in codec c: the values (fp32), or with `delta` the delta
 * from version - 1. */
static int send_update_chunk(dl_sync *s, dl_registry_learner *l, int p, uint64_t version, const dl_codec *c,
                             int delta, dl_wire_blob *blob, uint64_t off, uint64_t n, int chunked)
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
    u.checksum = dl_wire_blob_checksum(blob);
    dl_downlink_env(s, &env, l->id);
    dl_wire_set_update(&env, &u);
    int rc = send_env(s, l, &env, dl_wire_blob_data(blob), dl_wire_blob_len(blob), blob);
    if (rc == 0) s->chunks_out++;
    return rc;
}

/* Payload bytes libzmq holds for learners whose connection is attached. A
 * learner dropped for not reading (or revoked) is detached: what it pins no
 * longer holds the budget of those that read, and it is bounded anyway (its
 * id cannot get a new connection while the old one holds bytes, dl_admit_hello). */
uint64_t dl_downlink_attached_bytes(const dl_sync *s)
{
    uint64_t t = 0;
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        const dl_registry_learner *l = dl_registry_cget(s->reg, i);
        if (l->used && l->route_len) t += dl_wire_queue_bytes(l->outq);
    }
    return t;
}

/* Room for `bytes` more to learner l: within its own bound (`window`,
 * paced) and the global one. A learner with nothing queued always may (a
 * chunk, or a whole fragment to a learner from before chunking, goes one at
 * a time whatever its bound), and may use one fragment of overdraft above
 * the global bound, so learners that never read cannot starve it while they
 * hold the budget (until they are dropped): the attached total stays <=
 * max_outbound_bytes + the largest fragment. */
static int outbound_room(const dl_sync *s, const dl_registry_learner *l, size_t bytes, uint64_t window)
{
    uint64_t mine = dl_wire_queue_bytes(l->outq), all = dl_downlink_attached_bytes(s);
    if (mine == 0) return all + bytes <= s->cfg.max_outbound_bytes + s->max_frag_bytes;
    return mine + bytes <= window && all + bytes <= s->cfg.max_outbound_bytes;
}

/* outbound_room, and when there is none, the next message libzmq frees
 * wakes the loop (sync.c room_wake: one wake per wait, not one per freed
 * message). Armed before a second look, so a message freed between the two
 * is seen by one of them. */
static int room_or_wait(dl_sync *s, const dl_registry_learner *l, size_t bytes, uint64_t window)
{
    if (outbound_room(s, l, bytes, window)) return 1;
    atomic_store(&s->room_wait, 1);
    return outbound_room(s, l, bytes, window);
}

void dl_downlink_owe(dl_sync *s, dl_registry_learner *l, int p)
{
    if (l->owed[p]) return; /* one in progress ends at the newest version anyway (pump restarts it) */
    if (!l->n_owed) l->owed_since_ns = dl_clock_ns();
    l->owed[p] = 1;
    l->n_owed++;
    s->deferred_updates++;
}

static void ack_send(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d, uint64_t merged,
                     const char *reason, int rebase, uint32_t retry_after_ms, int again)
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
    a.chunk_bytes = l->push_chunk; /* its next pushes' chunk size (uplink.c push_chunk_resize) */
    a.again = again;
    dl_downlink_env(s, &env, l->id);
    dl_wire_set_ack(&env, &a);
    dl_downlink_send(s, l, &env, NULL, 0);
}

/* ---- answers again
 *
 * Every answer to a push (MERGED_PENDING or a decision) is kept per learner
 * process (Hello.instance) and fragment, the latest only (s->ans). An Ack
 * lost with a connection (a cut link's, a rebuilt socket's) left the
 * learner's push undecided: it held the fragment's next push up to
 * push_decision_timeout_ms (30 s), and a push that never arrived was never
 * answered at all. So a Welcome to the same process names the latest
 * answered base of each fragment (Welcome.answered_bases: a push of a later
 * base never arrived, and the learner pushes its progress again), and the
 * answers follow it again (Ack.again). */
static void ack_keep(dl_sync *s, const dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                     uint64_t merged, uint32_t retry_after_ms)
{
    int slot = (int)(l - dl_registry_cget(s->reg, 0));
    size_t P = (size_t)s->cfg.P;
    if (!l->instance) return; /* an older learner: no Welcome will name it */
    if (s->ans_instance[slot] != l->instance) { /* another process of the slot: its answers are not this one's */
        memset(s->ans + (size_t)slot * P, 0, P * sizeof *s->ans);
        s->ans_instance[slot] = l->instance;
    }
    s->ans[(size_t)slot * P + (size_t)p] = (answered){.base1 = base + 1, .merged = merged,
                                                      .retry_after_ms = retry_after_ms, .decision = (uint8_t)d};
}

void dl_downlink_ack_busy(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                          uint64_t merged, const char *reason, int rebase, uint32_t retry_after_ms)
{
    ack_keep(s, l, p, base, d, merged, retry_after_ms);
    ack_send(s, l, p, base, d, merged, reason, rebase, retry_after_ms, 0);
}

void dl_downlink_ack(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                     uint64_t merged, const char *reason, int rebase)
{
    dl_downlink_ack_busy(s, l, p, base, d, merged, reason, rebase, 0);
}

int dl_downlink_answered(const dl_sync *s, int slot, uint64_t instance, uint64_t *bases)
{
    size_t P = (size_t)s->cfg.P;
    if (!instance || s->ans_instance[slot] != instance) return 0;
    for (size_t p = 0; p < P; p++) bases[p] = s->ans[(size_t)slot * P + p].base1;
    return 1;
}

void dl_downlink_answers_again(dl_sync *s, dl_registry_learner *l)
{
    int slot = (int)(l - dl_registry_cget(s->reg, 0));
    size_t P = (size_t)s->cfg.P;
    if (!l->instance || s->ans_instance[slot] != l->instance) return;
    for (size_t p = 0; p < P; p++) {
        const answered *a = &s->ans[(size_t)slot * P + p];
        if (!a->base1) continue;
        Dloco__V1__Decision d = (Dloco__V1__Decision)a->decision;
        /* an ACCEPTED push was pooled first: the learner takes the decision of a pooled push only */
        if (d == DLOCO__V1__DECISION__DECISION_ACCEPTED || d == DLOCO__V1__DECISION__DECISION_MERGED_PENDING)
            ack_send(s, l, (int)p, a->base1 - 1, DLOCO__V1__DECISION__DECISION_MERGED_PENDING, 0,
                     "answer sent again after the Welcome", 0, 0, 1);
        /* without rebase: the Welcome's fragment_versions have the learner adopt the newer ones anyway, and
         * the rebase Update the first answer announced may have been lost with it */
        if (d != DLOCO__V1__DECISION__DECISION_MERGED_PENDING)
            ack_send(s, l, (int)p, a->base1 - 1, d, a->merged, "answer sent again after the Welcome", 0,
                     a->retry_after_ms, 1);
    }
}

static int slot_of(const dl_sync *s, const dl_registry_learner *l)
{
    return (int)(l - dl_registry_cget(s->reg, 0));
}

/* Forget the Update in progress to a learner (its connection changed or
 * went); what it owes stays owed. */
static void unpin(dl_sync *s, outbound *x)
{
    if (!x->pin) return;
    dl_store_snapshot_end(&x->pin);
    s->pins--;
}

/* Every pinned Update transfer is forgotten (what its learner owes stays owed). */
static void drop_pins(dl_sync *s)
{
    int n = 0;
    for (int i = 0; i < s->cfg.policy.max_learners && s->pins; i++)
        if (s->outx[i].pin) dl_downlink_reset(s, i), n++;
    DL_WARN("store busy (reopen or growth): %d pinned Update transfer(s) dropped; they start again", n);
    dl_event("update_pins_dropped", "n=%d", n);
}

void dl_downlink_reset(dl_sync *s, int slot)
{
    unpin(s, &s->outx[slot]);
    s->outx[slot].p = -1;
    s->outx[slot].started = 0;
    s->outx[slot].delta = 0;
}

/* Forget a slot's resume points (a new connection, a new learner in the slot). */
void dl_downlink_resume_clear(dl_sync *s, int slot)
{
    size_t P = (size_t)s->cfg.P;
    memset(s->resume_v + (size_t)slot * P, 0, P * sizeof *s->resume_v);
    memset(s->resume_o + (size_t)slot * P, 0, P * sizeof *s->resume_o);
}

/* Elements per chunk of a delta Update of codec c: as many as a chunk's
 * payload bytes allow -- the fp32 chunk's bytes (ce elements; 0 = whole
 * fragments), what the learner takes and pacing allows -- in whole blocks
 * for a block codec (dl_codec_chunk_numel); 0 when not one block fits. An
 * int4 delta chunk of the fp32 chunk's element count was an eighth of its
 * bytes, eight times the messages (each costs the kernel and libzmq more
 * than its bytes do) for the same downlink. */
static uint64_t delta_chunk_elems(uint64_t ce, const dl_codec *c) { return dl_codec_chunk_numel(c, ce * sizeof(float)); }

/* Fragment p's kept delta to version v, NULL when it is not kept (any more). */
static const kept_delta *kept_of(const dl_sync *s, int p, uint64_t v)
{
    const kept_delta *kd = &s->kept[(size_t)p * DL_SYNC_KEPT_DELTAS + v % DL_SYNC_KEPT_DELTAS];
    return v && kd->buf && kd->version == v ? kd : NULL;
}

void dl_downlink_keep(dl_sync *s, int p, uint64_t v, uint8_t *buf, size_t bytes, dl_codec c)
{
    kept_delta *kd = &s->kept[(size_t)p * DL_SYNC_KEPT_DELTAS + v % DL_SYNC_KEPT_DELTAS];
    free(kd->buf);
    set_clear(s, &kd->cs);
    chunk_set cs = kd->cs;
    *kd = (kept_delta){.buf = buf, .bytes = bytes, .version = v, .c = c, .cs = cs};
    /* older ones only while the chain from them is smaller than the fp32 fragment (else it goes full) */
    size_t sum = bytes, full = (size_t)s->numel[p] * sizeof(float);
    for (uint64_t k = v - 1; k > 0 && k + DL_SYNC_KEPT_DELTAS > v; k--) {
        kept_delta *o = &s->kept[(size_t)p * DL_SYNC_KEPT_DELTAS + k % DL_SYNC_KEPT_DELTAS];
        if (!o->buf || o->version != k) break;
        sum += o->bytes;
        if (sum > full) {
            free(o->buf);
            o->buf = NULL;
            set_clear(s, &o->cs);
        }
    }
}

/* What learner `slot` gets next of fragment p, whose newest version is v:
 * the kept delta to given + 1, where given is the version it was last given
 * whole (since its Hello, and since a Fetch or rebase of p), when every
 * delta from there to v is kept and together they are no bigger than the
 * fp32 fragment (n elements): a learner a few versions behind catches up by
 * the chain, and applies each in turn onto its mirror. Else (a Fetch, a
 * rebase, its first Update after a Hello, too far behind) 0: the full fp32
 * values of v. A chunked learner (ce_max: its largest chunk, elements) also
 * needs a chunk to hold a block. */
static uint64_t delta_next(const dl_sync *s, int slot, int p, uint64_t v, uint64_t n, uint64_t ce_max)
{
    uint64_t given;
    if (!dl_registry_given(s->reg, slot, p, &given) || given >= v) return 0;
    size_t sum = 0;
    for (uint64_t k = given + 1; k <= v; k++) {
        const kept_delta *kd = kept_of(s, p, k);
        if (!kd || (ce_max && !delta_chunk_elems(ce_max, &kd->c))) return 0;
        sum += kd->bytes;
    }
    return sum <= n * sizeof(float) ? given + 1 : 0;
}

/* Send what a learner is owed, chunk by chunk, as far as the outbound
 * bounds allow (payload bytes, as they go on the wire), from an LMDB read
 * snapshot the caller holds briefly (*snap, begun on first use): never from
 * memory a merge may be writing, and never a version the loop has not seen
 * committed yet (dl_commit_merge_done serves it then), so a learner never pushes from
 * a base the policy does not know. A delta (delta_next) comes from the kept
 * payloads in memory instead. One fragment at a time per learner; a full
 * transfer whose fragment's global version moved on mid-transfer starts
 * again at the new version (from its first element), decided afresh; a
 * delta goes on while it is kept (the chain continues from it). A fragment
 * stays owed until its newest version is sent; the rest waits; the queue's
 * drain wakes the loop to go on. */
static void serve_owed(dl_sync *s, dl_registry_learner *l, dl_store_snap **snap)
{
    int slot = slot_of(s, l);
    outbound *x = &s->outx[slot];
    measure(l, x, dl_clock_ns());
    while (l->n_owed && l->route_len) {
        uint64_t ce = chunk_elems(s, l, x), window = window_bytes(s, x, ce);
        if (x->p < 0 || !l->owed[x->p]) {
            unpin(s, x);
            x->p = -1;
            /* round robin from the one chosen last: a fragment that stays
             * owed because it moved on while it was sent (merges faster
             * than the link) does not starve the others -- a thin learner's
             * first fetch never ended with the lowest fragment sent again
             * and again */
            for (int k = 1; k <= s->cfg.P && x->p < 0; k++) {
                int p = (x->last_p + k) % s->cfg.P; /* last_p >= -1, k >= 1 */
                if (l->owed[p]) x->p = p;
            }
            if (x->p >= 0) x->last_p = x->p;
            x->version = x->offset = 0;
            x->started = x->delta = 0;
        }
        int p = x->p;
        int src = *snap ? 0 : dl_store_snapshot_begin(s->store, snap);
        if (src) {
            DL_ERROR("snapshot for %s: %s", l->id, dl_errmsg());
            *snap = NULL;
            /* the store waits for every transaction and snapshot of this process to end (the reopen after a
             * failed write, or a map growth): the pinned ones are ours, and would never end while the store
             * refuses the reads that move their transfers on. They end now; their Updates stay owed and start
             * again (the worker's commit stalled 10 s a retry behind three of them in test_chaos) */
            if (src == DL_EAGAIN && s->pins) drop_pins(s);
            return;
        }
        uint64_t v;
        size_t n;
        if (dl_store_snapshot_info(*snap, (uint32_t)p, &v, &n)) {
            DL_ERROR("snapshot fragment %d: %s", p, dl_errmsg());
            return; /* still owed: the next tick tries again */
        }
        /* committed, not yet seen by the loop: dl_commit_merge_done serves it */
        if (v > dl_policy_version(s->policy, p)) return;
        if (!ce && x->offset) x->started = 0; /* it said Hello again without chunks: whole fragments from now */
        const kept_delta *kd = x->delta ? kept_of(s, p, x->version) : NULL;
        /* a pinned full transfer goes on at its version (its snapshot holds it) */
        if (!x->started || (x->delta ? !kd : x->version != v && !x->pin)) {
            unpin(s, x);
            if (x->started && x->offset) {
                s->update_restarts++;
                dl_event("update_restarted", "id=%s frag=%d from=%llu to=%llu sent=%llu delta=%d", l->id, p,
                         (unsigned long long)x->version, (unsigned long long)v, (unsigned long long)x->offset,
                         x->delta);
            }
            size_t r = (size_t)slot * (size_t)s->cfg.P + (size_t)p;
            uint64_t dv = delta_next(s, slot, p, v, n, l->max_chunk ? chunk_elems_max(s, l) : 0);
            x->started = 1;
            x->version = dv ? dv : v;
            x->delta = dv != 0;
            kd = x->delta ? kept_of(s, p, dv) : NULL;
            x->offset = !x->delta && ce && s->resume_v[r] == v && s->resume_o[r] < n ? s->resume_o[r] : 0;
            if (x->offset) dl_event("update_resumed", "id=%s frag=%d version=%llu offset=%llu", l->id, p,
                                    (unsigned long long)v, (unsigned long long)x->offset);
            s->resume_v[r] = s->resume_o[r] = 0;
            /* Pinned: a full transfer of more than one window may take
             * longer than the merges of p (a thin link: 1 MB at 3 Mbit/s is
             * ~3 s), and restarting it at each new version would never end
             * it; its own snapshot keeps this version readable, and the
             * delta chain from it follows. Only a snapshot of this very
             * version will do (a commit the loop has not seen may be in it). */
            uint64_t pv;
            size_t pn;
            if (!x->delta && ce && (n - x->offset) * sizeof(float) > window && s->pins < DL_SYNC_MAX_PINS &&
                dl_store_snapshot_begin(s->store, &x->pin) == 0) {
                s->pins++;
                if (dl_store_snapshot_info(x->pin, (uint32_t)p, &pv, &pn) || pv != v) unpin(s, x);
            }
        }
        uint64_t left = n - x->offset;
        if (x->delta) {
            uint64_t de = delta_chunk_elems(ce, &kd->c);
            if (ce && !de) de = kd->c.block; /* paced below a block: one block (it fits the learner's chunk) */
            uint64_t cn = de && de < left ? de : left;
            size_t at = x->offset ? (size_t)dl_codec_bytes(&kd->c, x->offset) : 0;
            size_t bytes = (size_t)dl_codec_bytes(&kd->c, cn);
            assert(at + bytes <= kd->bytes);
            if (!path_room(s, l, x, dl_clock_ns()) || !room_or_wait(s, l, bytes, window)) return;
            /* kept_of's delta is the synchronizer's own (const only for delta_next) */
            int shared = 0;
            dl_wire_blob *b = chunk_blob(s, &((kept_delta *)kd)->cs, x->offset, cn, kd->buf + at, bytes, &shared);
            if (!b) {
                DL_ERROR("update for %s: %s", l->id, dl_errmsg());
                return;
            }
            int rc = send_update_chunk(s, l, p, x->version, &kd->c, 1, b, x->offset, cn, ce != 0);
            dl_wire_blob_release(&b);
            if (rc == 0 && shared) s->chunks_shared++;
            if (rc == DL_EAGAIN) atomic_store(&s->room_wait, 1); /* its pipe is full: its next free wakes the loop */
            if (rc) return;
            measure(l, x, dl_clock_ns());
            x->offset += cn;
        } else {
            uint64_t cn = ce && ce < left ? ce : left;
            if (!path_room(s, l, x, dl_clock_ns()) || !room_or_wait(s, l, (size_t)cn * sizeof(float), window)) return;
            /* zero-copy from the map when the chunk lies in one stored block
             * (chunk_bytes divides the store's 1 MiB blocks); a whole fragment
             * for a learner from before chunking is copied once per snapshot */
            full_chunks *fc = &s->fullc[p];
            if (x->version > fc->version) { /* the first chunk of a newer version: the older ones go */
                set_clear(s, &fc->cs);
                fc->version = x->version;
            }
            chunk_set *cs = x->version == fc->version ? &fc->cs : NULL; /* a pinned older one: not kept */
            dl_wire_blob *b = chunk_find(cs, x->offset, cn);
            int shared = b != NULL;
            if (!b) {
                const float *pp;
                size_t got;
                uint64_t v2;
                dl_store_snap *from = x->pin ? x->pin : *snap;
                int src = ce ? dl_store_snapshot_range(from, (uint32_t)p, x->offset, (size_t)cn, &v2, &pp, &got)
                             : dl_store_snapshot_fragment(from, (uint32_t)p, &v2, &pp, &got);
                if (src || got != cn) {
                    DL_ERROR("snapshot fragment %d [%llu, +%llu): %s", p, (unsigned long long)x->offset,
                             (unsigned long long)cn, dl_errmsg());
                    return;
                }
                if (!(b = chunk_blob(s, cs, x->offset, cn, pp, (size_t)cn * sizeof(float), &shared))) {
                    DL_ERROR("update for %s: %s", l->id, dl_errmsg());
                    return;
                }
            }
            static const dl_codec fp32 = {.id = DL_CODEC_FP32};
            int rc = send_update_chunk(s, l, p, x->version, &fp32, 0, b, x->offset, cn, ce != 0);
            dl_wire_blob_release(&b);
            if (rc == 0 && shared) s->chunks_shared++;
            if (rc == DL_EAGAIN) atomic_store(&s->room_wait, 1); /* its pipe is full: its next free wakes the loop */
            if (rc) return; /* its queue is full (in messages), or it is gone: still owed */
            measure(l, x, dl_clock_ns());
            x->offset += cn;
        }
        if (x->offset < n) continue;
        /* all of version x->version is on its way: progress on it counts
         * from now, and a delta to the next may follow */
        dl_registry_base_add(s->reg, slot, p, x->version, dl_clock_ns());
        dl_registry_given_set(s->reg, slot, p, x->version);
        if (x->delta) s->updates_delta++;
        else s->updates_full++;
        unpin(s, x);
        if (x->version >= v) {
            l->owed[p] = 0;
            l->n_owed--;
        }
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
void dl_downlink_serve_fragments(dl_sync *s, dl_registry_learner *l, const uint32_t *frags, size_t nf)
{
    int slot = slot_of(s, l);
    outbound *x = &s->outx[slot];
    size_t count = nf ? nf : (size_t)s->cfg.P;
    for (size_t i = 0; i < count; i++) {
        int p = nf ? (int)frags[i] : (int)i; /* listed ones: checked by proto/wire.c */
        if (!nf && !owns(s, p)) continue;
        dl_registry_given_clear(s->reg, slot, p);
        if (x->p == p && x->delta) dl_downlink_reset(s, slot);
        dl_downlink_owe(s, l, p);
    }
    serve_one(s, l);
}

/* A Fetch: the fragments are owed (again); a resume point is used when its
 * version is still the global one as the transfer starts (serve_owed). */
void dl_downlink_fetch(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Fetch *f)
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
            dl_downlink_reset(s, slot); /* asked again (a delta in flight too): from the resume point, or at 0 */
        }
    }
    if (!f->n_fragments) dl_downlink_reset(s, slot);
    dl_downlink_serve_fragments(s, l, f->fragments, f->n_fragments);
}

/* A learner whose queued bytes made no progress for slow_reader_ms does not
 * read: it is dropped (dead, its connection cut off, owed updates
 * forgotten), so it cannot hold the outbound budget of those that read:
 * what libzmq already holds for it stays in its own counter (detached) until
 * its connection closes, and its id gets no new connection before. */
void dl_downlink_check_reader(dl_sync *s, int slot, dl_registry_learner *l, int64_t now)
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
    dl_downlink_error(s, l->route, l->route_len, l->id, DL_EAGAIN, 0,
                      "you did not read for %d ms: dropped (reconnect and say hello)", s->cfg.slow_reader_ms);
    dl_admit_mark_left(s, l, slot, now, DL_POLICY_LEAVE_DEAD);
    dl_registry_clear_route(s->reg, slot);
    dl_downlink_reset(s, slot);
    dl_downlink_resume_clear(s, slot);
    memset(l->owed, 0, (size_t)s->cfg.P);
    l->n_owed = 0;
    s->dropped_readers++;
}

static int owed_cmp(const void *a, const void *b)
{
    const owed_key *x = a, *y = b;
    if (x->busy != y->busy) return x->busy - y->busy;
    return (x->since > y->since) - (x->since < y->since);
}

void dl_downlink_serve_owed(dl_sync *s)
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
