/* The synchronizer's private header: the state one loop owns (struct dl_sync)
 * and the calls its files make to one another, in the order a push goes.
 *
 * What may live here: the shared state struct and the small types it embeds,
 * constants two files share, one-line accessors, and the prototypes of the
 * functions one file of the synchronizer calls in another. Nothing here is
 * for other folders (they use synchronizer/sync.h). The files, read in order:
 *   sync.c      the loop: dispatch, watchers, lifecycle
 *   admit.c     admission: Hello, reclaim, learner records, Bye, heartbeats
 *   uplink.c    a push arriving: chunks, decode, guards, the pool, the policy's verdict
 *   commit.c    rounds out to the worker, merges back
 *   downlink.c  what leaves: Acks, errors, Updates, owed fragments, Fetch, slow readers
 *   reload.c    SIGHUP: the allowlist and the reloadable options
 *   stats.c     the statistics snapshot and the operator view (/metrics, /status.json)
 *   eval.c      the global model's evaluation: periodic (evalthread.h) and final
 *   pool.c      the payload pool (its own handle, synchronizer/pool.h) */
#ifndef DL_SYNCHRONIZER_SYNC_INT_H
#define DL_SYNCHRONIZER_SYNC_INT_H

#include "core/codec.h"
#include "core/httpd.h"
#include "core/shard.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "storage/store.h"
#include "synchronizer/evalthread.h"
#include "synchronizer/metrics.h"
#include "synchronizer/pool.h"
#include "synchronizer/registry.h"
#include "synchronizer/sync.h"
#include "synchronizer/worker.h"

#include <ev.h>
#include <stdatomic.h>
#include <stdint.h>

/* Ids of reclaimed slots remembered (a ring): a learner that comes back
 * after its slot was reclaimed has lost its replay record here, so it must
 * fetch rather than push from what it holds. */
#define DL_SYNC_RECLAIMED_IDS 4096
/* A chunked push arriving from one learner (one at a time per connection:
 * docs/PROTOCOL.md "Chunked transfers"). What has arrived of it counts in the pool. */
typedef struct {
    int active;          /* chunks are arriving into buf */
    int refused;         /* its first chunk was refused (and answered): the rest are dropped unread */
    uint32_t fragment;
    uint64_t transfer, base_version, steps, tokens, numel;
    int codec;           /* the first chunk's codec, block size and topk: every chunk must match */
    uint32_t block, topk;
    uint64_t received;   /* elements so far, in order */
    uint64_t counted;    /* pool bytes counted for it: received x 4 (the pool keeps fp32) */
    uint64_t wire;       /* payload bytes of its chunks after the first, as they travelled (its uplink's rate) */
    int chunks;          /* chunks kept so far */
    int64_t first_ns;    /* monotonic ns of its first chunk */
    int64_t progress_ns; /* monotonic ns of its latest chunk: one that stops past dl_uplink_stall_ns is dropped */
    double compute_s;
    float *buf;          /* [numel], aligned */
} inbound;

/* The latest answer to a learner process's push of one fragment (downlink.c), for
 * Welcome.answered_bases and the Acks sent again after it: what a lost connection may have taken
 * (docs/PROTOCOL.md "Connections"). */
typedef struct {
    uint64_t base1;          /* 1 + the push's base_version; 0 = none */
    uint64_t merged;         /* ACCEPTED: merged_version */
    uint32_t retry_after_ms; /* REJECTED busy */
    uint8_t decision;        /* Dloco__V1__Decision */
} answered;

/* Update messages in flight to a learner told apart by the path's bound
 * (downlink.c); more coalesce into the newest entry, which then counts as
 * received with the last of them and sent with the first. */
#define DL_SYNC_PATH_RING 32
#define DL_SYNC_PATH_SAMPLES 4
/* The Update being sent to one learner, chunk by chunk (one fragment at a
 * time): version `version` of fragment p, elements [0, offset) sent. */
typedef struct {
    int p;               /* -1: none */
    int last_p;          /* the fragment chosen last (-1: none): the next owed one after it goes next */
    int started;         /* version is set: [0, offset) of it has left */
    int delta;           /* started: the transfer is p's kept delta to `version` (else its fp32 values) */
    uint64_t version, offset;
    /* a full transfer's own read snapshot (downlink.c "pinned"): the version on its way stays readable when
     * the global one moves on, so a transfer slower than the merges still ends; NULL: read the pass's */
    struct dl_store_snap *pin;
    /* pacing (downlink.c): what the learner's connection drains, from its queue's freed bytes over the
     * time the queue held bytes; a new connection (a new queue) starts over */
    const dl_wire_queue *mq; /* the queue measured */
    uint64_t m_drained;  /* dl_wire_queue_drained_bytes(mq) at m_ns */
    int64_t m_ns;        /* monotonic ns from which the queue's busy time is not yet counted; 0: it was empty */
    double r_bytes, r_ns; /* drained bytes and busy ns, older ones fading (time constant DL_PACE_TAU_NS) */
    double rate;         /* r_bytes / r_ns, bytes per second; 0: not measured yet */
    uint64_t ctl_ahead_max; /* the most payload bytes queued ahead of a control message (Ack, heartbeat, Welcome) */
    /* the path's bound (downlink.c): Update bytes sent on this connection and the part sent up to the
     * newest message the learner reported received (Heartbeat.received_seq); a new connection starts over */
    const dl_wire_queue *eq; /* the connection (its queue) these count */
    int e_known;         /* it reported: the bound applies */
    uint64_t e_sent, e_acked; /* payload bytes */
    struct {
        uint64_t seq, cum; /* the last message of an entry and e_sent after it */
        int64_t ns;        /* monotonic ns it was sent */
    } e_ring[DL_SYNC_PATH_RING];
    int e_head, e_n;     /* the oldest entry not reported received, entries */
    uint64_t e_inflight_max; /* the most bytes in flight on the path, this process */
    uint64_t e_inflight_deep_max; /* the same once the path met the time bound (the bytes bound applies) */
    /* what the path delivers (reports over time: DL_SYNC_PATH_SAMPLES samples of at least 2 x heartbeat_ms),
     * and whether its time bound has held bytes back: a path deeper than its link has its bytes in flight
     * bounded by what it delivers in the window too (downlink.c "the path's bound") */
    int64_t e_s_ns;      /* the sample in progress began at this report (0: none) */
    uint64_t e_s_acked;  /* e_acked then */
    double e_rate[DL_SYNC_PATH_SAMPLES]; /* delivered bytes per second, the latest samples */
    int e_rate_n, e_rate_i;
    int e_deep;          /* the time bound held bytes back on this connection */
} outbound;

/* Downlink codec on: a merge's delta of a fragment, encoded (the payload
 * that takes version - 1 to version, core/codec.h layout), sent to the
 * learners that hold version - 1 (serve_owed). The latest
 * DL_SYNC_KEPT_DELTAS of each fragment are kept (a ring by version), at
 * most the fragment's fp32 bytes in all: a learner a few versions behind
 * gets the chain of deltas when it is smaller than the fragment. */
#define DL_SYNC_KEPT_DELTAS 8
/* Full transfers that may hold a read snapshot of their own at once (each is
 * one of LMDB's 256 reader slots, and keeps the pages of the version it sends
 * from being reused until it ends); the others restart at a newer version. */
#define DL_SYNC_MAX_PINS 64
/* Update chunks encoded once (downlink.c "shared chunks"): the bytes of
 * elements [offset, offset + n) of one version of a fragment, in a blob
 * that every learner's message references (proto/wire.h). */
typedef struct {
    dl_wire_blob *blob;
    uint64_t offset, n;
} shared_chunk;
typedef struct {
    shared_chunk *e;
    int n, cap;
    uint64_t bytes;      /* of the blobs held */
} chunk_set;

typedef struct {
    uint8_t *buf;        /* NULL: none yet (none since the start: a restart forgets it) */
    size_t bytes;        /* dl_codec_bytes(&c, numel) */
    uint64_t version;
    dl_codec c;
    chunk_set cs;        /* its chunks as sent (they go with it) */
} kept_delta;

/* The chunks of one fragment's newest fp32 version sent so far. */
typedef struct {
    uint64_t version;
    chunk_set cs;
} full_chunks;

/* Owed updates, fairly: first the learners that have read everything they
 * were sent (empty queue), then the others, each group oldest debt first. A
 * learner that does not read keeps its queue non-empty, so it never takes
 * the budget ahead of one that reads. */
typedef struct owed_key {
    dl_registry_learner *l;
    int busy;        /* its queue held bytes when the pass began */
    int64_t since;   /* owed_since_ns */
} owed_key;

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
    int max_spans;         /* the most spans (core/plan.h) any fragment has */
    double *inb_ss;        /* [max_learners][max_spans] the sums of squares per span of the push arriving from a slot */
    float *dec_scratch;    /* [DL_SYNC_DECODE_SLICE, or a block of DL_CODEC_BLOCK_MAX] a push's slice, decoded */
    double *chunk_ss;      /* [max_spans] an fp32 chunk's span sums until its checksum holds (uplink.c) */
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

    dl_pool *pool;       /* pushes waiting for their rounds, and the room arriving chunked pushes take */
    int pool_auto;       /* pool_mb 0: the bound is cfg.pool_bytes or the fleet's need (dl_uplink_pool_bound) */
    uint64_t owned_bytes; /* fp32 bytes of the fragments this synchronizer owns */
    uint64_t pool_cap;   /* the most an automatic bound grows to: physical memory / DL_SYNC_POOL_MEM_DIV (0: unknown) */
    dl_merge_contrib **aside; /* [P] dropped-stale pushes since the fragment's last merge */
    int *naside, *capaside;
    inbound *inb;        /* [max learners] chunked push arriving per slot */
    outbound *outx;      /* [max learners] Update being sent per slot */
    uint64_t *resume_v, *resume_o; /* [max learners * P] a Fetch's resume point per slot and fragment */
    answered *ans;       /* [max learners * P] the latest answer to the slot's process's push of each fragment */
    uint64_t *ans_instance; /* [max learners] the Hello.instance those answers went to (0: none) */
    kept_delta *kept;    /* [P * DL_SYNC_KEPT_DELTAS] the latest deltas per fragment, version % DL_SYNC_KEPT_DELTAS
                            (downlink codec on; memory only) */
    full_chunks *fullc;  /* [P] the newest version's fp32 chunks as sent (shared by every learner) */
    uint64_t shared_bytes; /* bytes of every chunk_set's blobs, at most shared_max */
    uint64_t shared_max;
    uint64_t chunks_shared; /* Update chunks sent from a blob already made (no copy, no hash) */
    ev_idle more;        /* the drain stopped at its budget with messages waiting */
    int hb_pending;        /* heartbeats came since dl_admit_heartbeats_settle last ran */
    _Atomic int room_wait; /* 1: an Update waits for outbound room; the next message libzmq frees wakes the loop */

    /* statistics (the snapshot formats them) */
    uint64_t merges, merged_contribs, stale_sum, dropped_stale, rejected, fetches;
    uint64_t refused_msgs, clipped, reclaimed, dropped_readers, deferred_updates, outbound_peak;
    int pins;            /* outbound snapshots held (outbound.pin) */
    uint64_t busy_refused, update_restarts, chunks_in, chunks_out, drain_yields, abandoned_in;
    uint64_t updates_full, updates_delta; /* Updates sent whole (all their chunks), by kind */
    uint64_t seq;
    int64_t started_ns, last_sync_ns;
    int64_t tick_ns;                  /* monotonic ns of the latest tick (0: none yet): its gaps are the loop's stalls */
    uint64_t loop_stalls, loop_stall_ms; /* ticks that came a period or more late, and the time lost past the period */
    uint64_t *versions;               /* [P] snapshot buffer */
    dl_sync_learner_stats *lstats;    /* [max learners] snapshot buffer */
    owed_key *owed_order;     /* [max learners] scratch of dl_downlink_serve_owed */

    /* the operator view (docs/OPERATING.md): counters the loop feeds, and the
     * documents the HTTP thread serves, re-rendered by `publish` */
    dl_syncmet met;
    dl_httpd *httpd;         /* NULL: metrics = off */
    dl_httpd_pages *pages;
    ev_timer publish;
    dl_evalthread *evalt;    /* NULL: periodic evaluation off */
    dl_evaluate_opts eval_opts; /* its options (data = cfg.eval_data), for the final evaluation */
    ev_timer eval_timer;
    uint64_t known_learners; /* learner records in the store, counted at start and as new ids are put */

    /* commit back-off (commit.c): after a merge whose store commit failed, pushes are answered busy until
     * commit_until_ns, then one round probes the disk; the first commit that succeeds ends it */
    int commit_fails;          /* merge commits failed in a row (0: healthy) */
    uint32_t commit_backoff_ms; /* the back-off of the latest failure, ms (0: none) */
    int64_t commit_until_ns;   /* pushes are refused busy until then (dl_clock_ns) */
    int commit_probe;          /* 1 + the fragment of the probe round with the worker (0: none): no other round
                                  leaves until it is back */
};

static inline int member(const dl_sync *s, int slot) { return (int)dl_policy_learner_state(s->policy, (uint32_t)slot); }
static inline int registered(const dl_sync *s, int slot)
{
    int m = member(s, slot);
    return m == DL_POLICY_MEMBER_LIVE || m == DL_POLICY_MEMBER_DEAD;
}

static inline void submit(dl_sync *s, dl_job *j) { dl_worker_submit(s->worker, j); }

/* 1 when this synchronizer (a shard, or the only one) owns fragment p. */
static inline int owns(const dl_sync *s, int p) { return dl_shard_owns(p, s->cfg.shard, s->cfg.shards); }

/* admit.c: admission */
void dl_admit_hello(dl_sync *s, dl_wire_msg *msg, const Dloco__V1__Envelope *env, const Dloco__V1__Hello *h);
void dl_admit_heartbeat(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Heartbeat *hb, int64_t now);
/* after a run of heartbeats (before any other message, and when the drain ends): the fleet's step rate and the
 * rounds' schedule, once for the run instead of once per heartbeat (each is O(learners)) */
void dl_admit_heartbeats_settle(dl_sync *s);
void dl_admit_bye(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Bye *b, int64_t now);
/* l leaves the policy's live set (a Bye, or dead); its arriving push is dropped */
void dl_admit_mark_left(dl_sync *s, dl_registry_learner *l, int slot, int64_t now, dl_policy_leave why);
/* learner records: the sum whose change makes the tick write one, the record, a write now */
uint64_t dl_admit_put_sig(const dl_registry_learner *l);
void dl_admit_record(dl_registry_learner *l, dl_store_learner *r);
void dl_admit_put_now(dl_sync *s, dl_registry_learner *l);

/* admit.c: liveness. A learner's latest sign of life (a message, or bytes of its queue drained), monotonic ns */
int64_t dl_admit_last_sign(const dl_registry_learner *l);
/* how long a learner may be silent before it is dead, ns (liveness x heartbeat_ms, longer on a busy slow uplink) */
int64_t dl_admit_dead_after(const dl_sync *s, int slot, const dl_registry_learner *l);
/* the loop did not run for stall_ns beyond its tick: every learner's clocks move on by it */
void dl_admit_loop_stalled(dl_sync *s, int64_t stall_ns, int64_t now);

/* An automatic pool bound grows to at most this fraction of physical memory. */
#define DL_SYNC_POOL_MEM_DIV 4
/* Elements a coded push chunk is decoded by at a time (uplink.c; 128 KiB of fp32: in the cache still when copied on) */
#define DL_SYNC_DECODE_SLICE 32768u
/* An fp32 push chunk is hashed and copied this many elements at a time (uplink.c): the copy reads from L1
 * what the checksum just read. */
#define DL_SYNC_HASH_SLICE 4096u
/* uplink.c: the pool's bound now: pool_mb's, or with pool_mb 0 the larger of
 * its default and what the live learners can have waiting (each at most one
 * push of every fragment: live x the owned fragments' bytes), at most pool_cap */
uint64_t dl_uplink_pool_bound(const dl_sync *s);
/* uplink.c: a Push message (whole, or one chunk) up to the policy's verdict */
void dl_uplink_push(dl_sync *s, int slot, dl_registry_learner *l, dl_wire_msg *msg, const Dloco__V1__Push *ph);
/* drop the chunked push arriving from a slot, if any */
void dl_uplink_drop(dl_sync *s, int slot, const char *why);
/* how long the chunked push arriving from a slot may go without a chunk before it is dropped, ns */
int64_t dl_uplink_stall_ns(const dl_sync *s, int slot);

/* commit.c: rounds out to the worker, merges back */
void dl_commit_schedule(dl_sync *s);
void dl_commit_merge_done(dl_sync *s, dl_job *j);
/* a dropped-stale push, recorded with fragment p's next merge */
void dl_commit_aside(dl_sync *s, int p, const dl_merge_contrib *c);
/* ms of commit back-off left at `now` (> 0: a push is answered busy with this retry_after_ms), else 0 */
uint32_t dl_commit_backoff_left_ms(const dl_sync *s, int64_t now);

/* downlink.c: everything that leaves */
void dl_downlink_env(dl_sync *s, Dloco__V1__Envelope *env, const char *learner);
int dl_downlink_send(dl_sync *s, dl_registry_learner *l, Dloco__V1__Envelope *env, const void *payload, size_t len);
void dl_downlink_error(dl_sync *s, const uint8_t *route, size_t rlen, const char *learner, int code, int fatal,
                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));
void dl_downlink_ack(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                     uint64_t merged, const char *reason, int rebase);
void dl_downlink_ack_busy(dl_sync *s, dl_registry_learner *l, int p, uint64_t base, Dloco__V1__Decision d,
                          uint64_t merged, const char *reason, int rebase, uint32_t retry_after_ms);
/* Welcome.answered_bases of learner slot's process `instance` into bases[P] (1 + the latest answered base per
 * fragment, 0 = none); 0 when its answers are not known (another process, none since this start). */
int dl_downlink_answered(const dl_sync *s, int slot, uint64_t instance, uint64_t *bases);
/* The answers named by the Welcome just sent to l, again (Ack.again): an ACCEPTED one as MERGED_PENDING and
 * ACCEPTED, any other as it was. */
void dl_downlink_answers_again(dl_sync *s, dl_registry_learner *l);
uint64_t dl_downlink_attached_bytes(const dl_sync *s);
/* learner `slot`'s measured drain rate (bytes/s, 0 = not yet) and the most payload bytes an Ack, heartbeat or
 * Welcome found queued ahead of it */
double dl_downlink_rate(const dl_sync *s, int slot);
uint64_t dl_downlink_ctl_ahead_max(const dl_sync *s, int slot);
uint64_t dl_downlink_path_inflight_max(const dl_sync *s, int slot);
/* What learner slot's path delivers, bytes/s (0: not measured); *deep: its bytes bound applies; *deep_max: the
 * most Update bytes it held unreported since then. */
double dl_downlink_path_rate(const dl_sync *s, int slot, int *deep, uint64_t *deep_max);
void dl_downlink_received(dl_sync *s, int slot, dl_registry_learner *l, uint64_t seq);
void dl_downlink_owe(dl_sync *s, dl_registry_learner *l, int p);
/* keep fragment p's delta to version v (buf: malloc'd, now the synchronizer's) for the learners that hold v - 1 */
void dl_downlink_keep(dl_sync *s, int p, uint64_t v, uint8_t *buf, size_t bytes, dl_codec c);
void dl_downlink_reset(dl_sync *s, int slot);
/* release every shared chunk (at close) */
void dl_downlink_close(dl_sync *s);
void dl_downlink_resume_clear(dl_sync *s, int slot);
void dl_downlink_serve_fragments(dl_sync *s, dl_registry_learner *l, const uint32_t *frags, size_t nf);
void dl_downlink_serve_owed(dl_sync *s);
void dl_downlink_fetch(dl_sync *s, int slot, dl_registry_learner *l, const Dloco__V1__Fetch *f);
void dl_downlink_check_reader(dl_sync *s, int slot, dl_registry_learner *l, int64_t now);

/* reload.c: SIGHUP */
void dl_reload_on_hup(struct ev_loop *loop, ev_signal *w, int revents);

/* stats.c: the operator view */
int dl_stats_bind_metrics(dl_sync *s);
void dl_stats_start_metrics(dl_sync *s);

/* sync.c: read what is waiting on the socket (within the drain's budget) */
void dl_sync_drain(dl_sync *s);
/* sync.c: wake the loop from another thread (the worker, the evaluation thread, the outbound queue) */
void dl_sync_wake(void *ctx);

/* eval.c: the evaluation thread and its timer (eval_every_s), at open; a finished evaluation, from on_wake */
void dl_eval_open(dl_sync *s);
void dl_eval_poll(dl_sync *s);

#endif
