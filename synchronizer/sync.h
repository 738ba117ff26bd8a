/* The synchronizer daemon: a libev loop around a ZeroMQ ROUTER and its
 * message handlers. The jobs it drives live in their own files: registry.c
 * (ids -> slots), policy.c (rounds, liveness), round.c (merge records,
 * share), ledger.c (token fates), worker.c (merges and every LMDB write),
 * report.c (status, summary, reload lines from one statistics snapshot). */
#ifndef DL_SYNCHRONIZER_SYNC_H
#define DL_SYNCHRONIZER_SYNC_H

#include <stdint.h>
#include <stdio.h>

#include "core/model.h"
#include "kernels/codec.h"
#include "synchronizer/guard.h"
#include "synchronizer/ledger.h"
#include "synchronizer/merge.h"
#include "synchronizer/policy.h"

typedef struct {
    char bind[256];        /* ZeroMQ endpoint to bind, e.g. tcp://127.0.0.1:5555 */
    char store[256];       /* LMDB store directory */
    char run_id[65];
    dl_model_config model;
    int P;                 /* fragments */
    int shard, shards;     /* shard `shard` of `shards` (core/shard.h): only the fragments p with p % shards == shard
                              are merged, persisted, held in memory and served here; shards 0 or 1 = unsharded */
    int H;                 /* inner steps between two pushes of one fragment */
    uint64_t seed;         /* init of a new run's global model */
    char init_from[256];   /* "" or a model file (storage/modelfile.h) a NEW run's global model starts from instead of
                              the seeded init; refused on a store that already holds a run. A manifest run's
                              is a safetensors file of the manifest's tensors (storage/tensorfile.h) */
    const struct dl_manifest *manifest; /* NULL: a GPT-2 run of `model`. Else the run's model (core/manifest.h, not
                              a GPT-2 one): its plan and fingerprint, version 0 from init_from (required for a new
                              run), the store records it; `model` is unused. The caller's, kept until
                              dl_sync_close */
    dl_policy_cfg policy;
    dl_merge_opts merge;
    int heartbeat_ms;      /* both directions */
    int rebase_ms;         /* a learner silent longer than this must fetch before pushing again */
    int liveness;          /* missed heartbeats before a learner is dead */
    int durability;        /* DL_STORE_SYNC | DL_STORE_PERIODIC */
    int sync_every_ms;     /* periodic durability: fsync interval */
    int status_every_ms;   /* progress line interval (0 = off) */
    uint64_t max_msg_bytes;  /* inbound message cap; 0 = min(largest fragment, push_chunk_max) + header cap */
    uint64_t chunk_bytes;    /* payload bytes of one chunk of an Update, and of the pushes a learner sends until its
                                uplink's rate is measured (Welcome.chunk_bytes); 0 = DL_DEF_CHUNK_KB */
    uint64_t push_chunk_max; /* push chunks grow from chunk_bytes, doubling, up to this as a learner's measured uplink
                                carries them in DL_SYNC_PUSH_CHUNK_MS (Ack.chunk_bytes); below chunk_bytes (0):
                                fixed at chunk_bytes */
    int unicast;             /* 1: a merge's Update goes only to its contributors (ablation of the broadcast;
                                default 0: every registered learner is owed every new version) */
    dl_codec_enc update;     /* the downlink: codec of the delta Updates sent to learners that hold the previous
                                version (docs/PROTOCOL.md "Updates"); update.c.id 0 = off, full fp32 Updates only.
                                On, a merge commits G + decode(its encoded delta), with error feedback
                                (synchronizer/worker.h) */
    uint64_t pool_bytes;     /* pushes pooled or arriving, bytes; a push finding no room is refused busy (under sync /
                                sync-elastic one an open round waits for may use as much again);
                                0 = max(2 x model, 4 x largest fragment, 64 MiB) */
    /* who may connect (docs/SECURITY.md) */
    int auth;                /* DL_SYNC_AUTH_*: resolved by dl_sync_open (AUTO -> CURVE unless bind is loopback) */
    char key_file[256];      /* CURVE: the synchronizer's key pair (dloco keygen) */
    char allowlist[256];     /* CURVE: learner id -> public key, re-read on SIGHUP */
    int max_new_hellos_per_s; /* Hellos from ids not registered: token bucket rate ... */
    int new_hello_burst;     /* ... and depth */
    int reclaim_ms;          /* a learner dead or gone this long gives its slot back */
    uint64_t max_outbound_bytes;  /* payload bytes queued in libzmq for all learners; 0 = derived */
    uint64_t peer_outbound_bytes; /* ... for one learner; 0 = 2 x chunk_bytes (a learner from before chunking
                                     gets one whole fragment at a time when its queue is empty) */
    int outbound_ms;         /* pacing: Update bytes queued for one learner are at most what its connection drained in
                                this many ms (its measured rate, at least one chunk, at most peer_outbound_bytes), and
                                its chunks shrink so two fit in that: an Ack or heartbeat waits about that long behind
                                Updates; 0 = min(500, heartbeat_ms x liveness / 4) */
    int slow_reader_ms;      /* a learner whose queue makes no progress this long is dropped */
    dl_guard_cfg guard;      /* counters, replays, value guards */
    /* periodic evaluation of the global model (synchronizer/evalthread.h); off with shards > 1 (a shard
       holds only its fragments) */
    int eval_every_s;        /* 0 = off */
    int eval_seqs;           /* validation sequences per evaluation */
    int eval_batch;          /* sequences per forward pass */
    int eval_threads;        /* OpenMP threads of the evaluation thread */
    int64_t eval_max_bytes;  /* the evaluation's model state + activations may not exceed this (else it is off) */
    double eval_val_frac;    /* the learners' validation fraction */
    char eval_data[256];     /* the run's data; one that cannot be read turns evaluation off with a warning;
                                recorded in the store at every start (dloco eval's default) */
    int eval_final_max_s;    /* the final evaluation at a clean stop runs at most this long; 0 = none */
    int eval_data_default;   /* eval_data is the built-in default, not the operator's: warn that it may not be the
                                learners' data */
    char metrics[256];       /* HTTP /metrics + /status.json: "HOST:PORT", "auto" (DL_SYNC_METRICS_DEFAULT, or an
                                ephemeral loopback port when that one is busy), "" or "off" = none */
    const char *config_text; /* the effective config text, recorded in the store as an audit record (nothing
                                parses it); NULL = none; the caller's, kept until dl_sync_close */
} dl_sync_cfg;

#define DL_SYNC_METRICS_DEFAULT "127.0.0.1:9470"

enum { DL_SYNC_AUTH_AUTO = 0, DL_SYNC_AUTH_CURVE = 1, DL_SYNC_AUTH_OFF = 2 };

typedef struct dl_sync dl_sync;

/* What SIGHUP may change at runtime (DESIGN: the merge hyper-parameters that
 * can safely change). */
typedef struct {
    dl_policy_cfg policy;
    dl_merge_opts merge;
    dl_guard_cfg guard;
} dl_sync_tunables;

/* Called on SIGHUP with the running values; fills *out with the candidate's
 * reloadable values (the whole candidate config already validated) and
 * *ignored with the number of restart-only options the file changes (kept
 * at their running values), and returns 0; or returns an error (dl_errmsg
 * says why) to keep the running values. `done` (may be NULL) then says
 * whether the candidate was applied (1) or refused by the synchronizer's own
 * checks (0), so the caller's running config follows what runs. */
typedef int (*dl_sync_reload_fn)(void *ctx, const dl_sync_tunables *cur, dl_sync_tunables *out, int *ignored);
typedef void (*dl_sync_reload_done_fn)(void *ctx, int applied);
void dl_sync_set_reload(dl_sync *s, dl_sync_reload_fn fn, dl_sync_reload_done_fn done, void *ctx);

/* Open the store (creating or resuming the run), bump the epoch and bind.
 * Errors carry a message: DL_EMISMATCH for a store of another run, DL_ENET
 * for a bind failure, ... */
int dl_sync_open(const dl_sync_cfg *cfg, dl_sync **out);
/* Run the loop until SIGINT/SIGTERM (or dl_sync_stop). Returns 0. */
int dl_sync_run(dl_sync *s);
/* After dl_sync_run returned (a clean stop): evaluate the final global model
 * on eval_data, unless the last evaluation already saw these versions, and
 * record it in the store, so the store's "global validation loss" is the
 * final model's. Periodic evaluation off: nothing. Returns 0, or the failure
 * (logged and in an eval_failed event). */
int dl_sync_final_eval(dl_sync *s);
/* One statistics snapshot: what the status line, the shutdown summary and
 * (later) the metrics endpoint all format from. Pointers point into the
 * synchronizer and stay valid until its next loop iteration. */
typedef struct {
    char id[65];
    int state;             /* dl_policy_member */
    uint64_t pushes, merged, dropped, rejected, tokens_applied, bytes_in, bytes_out;
    uint64_t step, tokens; /* from its latest Heartbeat */
    double steps_per_s;
    double train_loss;       /* its latest push's training loss (NaN: none yet) */
    uint64_t last_staleness; /* of its latest merged push, versions */
    double drain_bps;        /* what its connection drains, bytes/s (downlink pacing; 0 = not measured yet) */
    uint64_t ctl_ahead_max;  /* the most Update payload bytes an Ack, heartbeat or Welcome found queued ahead of it */
    uint64_t path_inflight_max; /* the most Update payload bytes sent to it and not yet reported received */
    double path_bps;         /* what its path delivers, bytes/s, from its reports (0 = not measured) */
    int path_deep;           /* its path held Updates past the window: the bytes bound applies (downlink.c) */
    uint64_t path_inflight_deep_max; /* path_inflight_max counted since then */
} dl_sync_learner_stats;

typedef struct {
    uint64_t epoch;
    double wall_s;           /* since dl_sync_open */
    int P;
    const uint64_t *versions; /* [P] committed version per fragment */
    int live, dead, left;    /* learners by membership */
    int n_learners;
    const dl_sync_learner_stats *learners; /* [n_learners], registry order */
    uint64_t merges, merged_contribs, stale_sum, dropped_stale, rejected, fetches;
    uint64_t refused_msgs;     /* messages refused before any handler: unauthorized, foreign connection, limits */
    uint64_t clipped;          /* pushes scaled down by the value guard */
    uint64_t reclaimed;        /* learner slots given back */
    uint64_t dropped_readers;  /* learners dropped for not reading */
    uint64_t deferred_updates; /* Updates held back by the outbound bounds (sent later) */
    uint64_t outbound_bytes;    /* payload bytes queued in libzmq now, for every connection */
    uint64_t outbound_attached; /* ... of them for learners still attached (the bounded part) */
    uint64_t outbound_peak, outbound_max; /* the most attached bytes seen after a send, and their bound */
    uint64_t pool_bytes, pool_peak, pool_max; /* pushes pooled or arriving: now, the most seen, the bound */
    uint64_t pool_reused, pool_fresh, pool_spare; /* push buffers taken from the spares, newly allocated; spare bytes */
    uint64_t busy_refused;     /* pushes refused busy (pool full) */
    uint64_t update_restarts;  /* Updates restarted because the fragment's version moved on mid-transfer */
    uint64_t chunks_in, chunks_out; /* Push chunks received, Update messages sent */
    uint64_t chunks_shared;         /* of those, sent from a chunk already copied and hashed for another learner */
    uint64_t updates_full, updates_delta; /* Updates sent whole (every chunk): fp32 values, and deltas */
    uint64_t drain_yields;     /* drains that stopped at their budget with messages waiting */
    uint64_t loop_stalls, loop_stall_ms; /* the loop's own stalls (a tick a period or more late), their ms */
    uint64_t abandoned_pushes; /* chunked pushes dropped unfinished (learner gone, new connection, order) */
    uint64_t store_file_bytes, store_live_bytes, store_free_bytes; /* LMDB: data.mdb, used - free, freelist */
    int jobs_inflight;
    int commit_fails;          /* merge commits failed in a row (0: commits succeed) */
    uint32_t commit_backoff_ms; /* the commit back-off in force after the latest failure, ms (0: none) */
    uint64_t known_learners;   /* learner records in the store: every id this run has seen, in any process */
    dl_ledger_totals ledger;
} dl_sync_stats;

void dl_sync_get_stats(dl_sync *s, dl_sync_stats *out);
/* Print the end-of-run summary (merges, staleness, per-learner bytes). */
void dl_sync_summary(dl_sync *s, FILE *f);
void dl_sync_close(dl_sync **s);
/* The endpoint actually bound (resolves tcp://...:* ports). */
const char *dl_sync_endpoint(const dl_sync *s);

#endif
