/* The synchronizer's operator view: the counters and histograms the loop
 * feeds that dl_sync_stats does not keep (staleness, round timings, commit
 * latency, refusals by reason, bytes by message kind, per-fragment merge
 * times, the last evaluation), and the rendering of /metrics (Prometheus
 * text, docs/OPERATING.md "Metrics") and /status.json ("Status") from one
 * statistics snapshot. Loop thread only; the HTTP thread serves copies. */
#ifndef DL_SYNCHRONIZER_METRICS_H
#define DL_SYNCHRONIZER_METRICS_H

#include <stdint.h>

#include "core/prom.h"
#include "synchronizer/policy.h"
#include "synchronizer/sync.h"

/* Why a push was refused: the label `reason` of
 * dloco_sync_pushes_rejected_total (a fixed set: the detail is in the push
 * event). */
typedef enum {
    DL_SM_REJ_COUNTERS = 0, /* steps/tokens beyond what the learner can have done (guard) */
    DL_SM_REJ_REPLAY,       /* a base the learner already pushed and got merged (guard), or a copy of its push
                               pooled or being merged (policy: duplicate) */
    DL_SM_REJ_CODEC,        /* a payload its codec's decoder refuses (a bad scale, a non-finite value, a topk index) */
    DL_SM_REJ_NONFINITE,    /* NaN/Inf in the payload */
    DL_SM_REJ_NORM,         /* value guard: norm bound */
    DL_SM_REJ_POLICY,       /* the policy's own refusal (base newer than global, bad counters, ...) */
    DL_SM_REJ_BUSY,         /* pool full: refused busy, to be pushed again */
    DL_SM_REJ_MERGE_FAILED, /* pooled, but its round's merge or commit failed (disk full, bound) */
    DL_SM_REJ_CHUNK_ORDER,  /* a chunk out of order or of another transfer (nothing of it counted) */
    DL_SM_REJ_N
} dl_sm_reject;

/* Why a message was refused before any handler: label `reason` of
 * dloco_sync_messages_refused_total. */
typedef enum {
    DL_SM_MSG_INVALID = 0,  /* proto/wire.c refused it (size, fields, limits) */
    DL_SM_MSG_NOT_REGISTERED, /* no Hello on this connection (or another epoch) */
    DL_SM_MSG_UNAUTHORIZED, /* its connection's key does not own the learner id */
    DL_SM_MSG_DUPLICATE,    /* a Hello for an id live on another connection */
    DL_SM_MSG_LIMITS,       /* Hello rate limit or full table */
    DL_SM_MSG_N
} dl_sm_msg;

/* Message kinds for bytes/messages by kind: Envelope body cases 10..18
 * (hello .. error) and 0 = unparsed. */
#define DL_SM_KINDS 10

typedef struct {
    int P;
    dl_prom_hist staleness;     /* versions, per merged contribution */
    dl_prom_hist quorum_wait_s; /* a round's first push -> quorum reached */
    dl_prom_hist grace_s;       /* quorum reached -> round closed (the grace window it got) */
    dl_prom_hist commit_s;      /* the LMDB commit of one merge (retries incl.), on the worker */
    dl_prom_hist merge_job_s;   /* the whole merge job: merge + outer step + commit */
    uint64_t push_rejected[DL_SM_REJ_N];
    uint64_t msg_refused[DL_SM_MSG_N];
    uint64_t bytes_in[DL_SM_KINDS], bytes_out[DL_SM_KINDS]; /* frames incl. headers */
    uint64_t msgs_in[DL_SM_KINDS], msgs_out[DL_SM_KINDS];
    uint64_t tokens_received;   /* fragment-tokens of pushes decided (pooled, stale or rejected; not busy) */
    uint64_t tokens_merged;     /* fragment-tokens merged into versions this process committed */
    uint64_t *frag_merges;      /* [P] merges committed by this process */
    int64_t *frag_merge_wall;   /* [P] wallclock ns of the last one (0 = none since start) */
    uint32_t *frag_contributors; /* [P] contributions in the last one */
    /* the last periodic evaluation (synchronizer/evaluator.c) */
    int has_eval;
    uint64_t eval_version;      /* sum of the fragment versions it evaluated */
    double eval_loss;
    int eval_seqs;
    int64_t eval_wall;          /* wallclock ns it finished */
    uint64_t evals;
} dl_syncmet;

void dl_syncmet_init(dl_syncmet *m, int P);
void dl_syncmet_free(dl_syncmet *m);
/* Index of an Envelope body case (DLOCO__V1__ENVELOPE__BODY_*) in the
 * by-kind arrays. */
int dl_syncmet_kind(int body_case);
/* A round closed: quorum wait and grace window. */
void dl_syncmet_round(dl_syncmet *m, const dl_policy_round *r);
/* Fragment p committed with n contributions; the worker's times: the whole
 * job and its LMDB commit. */
void dl_syncmet_merged(dl_syncmet *m, int p, uint32_t n, double job_s, double commit_s);

/* What the renderers read besides the snapshot. */
typedef struct {
    const char *run_id;
    const char *endpoint;
    uint64_t fingerprint;
    const dl_sync_tunables *tun;   /* running reloadable values */
    const dl_policy_stats *policy; /* rounds by close reason */
    int shard, shards;
    const char *eval_data; /* the data the evaluation reads (the eval record's "data") */
} dl_syncmet_ctx;

/* /metrics: every family documented in docs/OPERATING.md "Metrics". */
void dl_syncmet_render_metrics(const dl_syncmet *m, const dl_sync_stats *st, const dl_syncmet_ctx *c, dl_prom *out);
/* /status.json: the schema of docs/OPERATING.md "Status" (source "live"). */
void dl_syncmet_render_status(const dl_syncmet *m, const dl_sync_stats *st, const dl_syncmet_ctx *c, dl_prom *out);

#endif
