/* The synchronizer's worker thread: the only writer of LMDB. It runs jobs in
 * submission order -- merge a closed round (merge rule, outer step) and
 * commit it with its ledger changes in one transaction, registry records,
 * ledger writes, periodic fsync -- so the event loop never blocks on a
 * merge or an fsync. A store write that fails for a transient cause
 * (DL_EAGAIN: the map could not grow while snapshots stayed open; nothing
 * was written) is retried with backoff, up to 10 times over about 4 s plus
 * the store's grow waits, before the job fails; a merge is computed once
 * and only its commit is retried.
 *
 * Downlink codec (dl_worker_set_update_codec): a merge then commits not the
 * outer step's G' but G_new = G + decode(encode(G' - G + e_p)), the value
 * every learner that applies the delta Update holds bit for bit, and keeps
 * e_p (fragment p's error-feedback residual, memory only) for the next merge
 * of p; the payload comes back with the job. */
#ifndef DL_SYNCHRONIZER_WORKER_H
#define DL_SYNCHRONIZER_WORKER_H

#include <stdint.h>

#include "core/plan.h"
#include "kernels/codec.h"
#include "storage/store.h"
#include "synchronizer/merge.h"

typedef enum { DL_JOB_MERGE, DL_JOB_LEARNER_PUT, DL_JOB_LEDGER, DL_JOB_SYNC, DL_JOB_EVAL } dl_job_kind;

/* One job. The loop fills the inputs, submits, and reads the results when
 * the job comes back from dl_worker_done; between the two the worker owns it. */
typedef struct dl_job {
    dl_job_kind kind;
    struct dl_job *next; /* queue link, the worker's */
    /* DL_JOB_MERGE: merge m deltas of `fragment` onto `version`, commit version + 1 */
    int fragment;
    uint64_t version;
    dl_merge_opts mopts; /* merge settings at submission (SIGHUP may change the live ones) */
    double share;        /* the round's share of a full outer step, (0, 1] */
    int m;
    float **deltas;      /* [m] borrowed payloads (the loop's pool keeps them until the job is back) */
    const double **span_ss; /* [m] borrowed: each payload's sums of squares per span (dl_pool_push.span_ss) */
    double *w;           /* [m] weights */
    uint64_t *handles;   /* [m] the loop's pool handles */
    dl_merge_record rec; /* contrib owned by the job */
    /* DL_JOB_MERGE: persisted with the commit; DL_JOB_LEDGER: the delta to add */
    dl_store_ledger ledger;
    /* DL_JOB_LEARNER_PUT: one record, or (nlrecs > 0) the nlrecs of lrecs in one transaction */
    dl_store_learner lrec;
    dl_store_learner *lrecs; /* owned by the job */
    int nlrecs;
    /* DL_JOB_EVAL: the last periodic evaluation, for the store's meta */
    dl_store_eval erec;
    /* results */
    int rc;              /* 0 or the failing call's DL_E* code */
    int retries;         /* store writes retried after a transient failure (DL_EAGAIN) before rc */
    int store_failed;    /* merge: rc came from the store write (a disk fault), not from the merged values */
    double work_s;       /* seconds the worker spent on the job (merge: merge + outer step + commit, retries incl.) */
    double store_s;      /* of them in the store write (merge: the LMDB commit, retries and their waits incl.) */
    double norm;         /* merge: L2 norm of the merged delta */
    double param_abs_max; /* merge: the new global must be finite with |x| <= this (0 = finite only), else the
                           * commit is aborted (dl_guard_cfg.param_abs_max at submission) */
    double param_norm;   /* merge: L2 norm of the committed global fragment */
    uint64_t hash;       /* merge: dl_checksum64 of the committed global fragment's fp32 bytes */
    /* merge with a downlink codec: the delta from `version` to version + 1, encoded; owned by the job (a taker
     * sets it NULL); NULL without a downlink codec or when the merge failed */
    uint8_t *update;
    size_t update_bytes; /* dl_codec_bytes(&update_codec, numel) */
    dl_codec update_codec;
    char err[320];       /* detail of a failure */
} dl_job;

/* A zeroed job of `kind`; dl_job_free frees it and the arrays it owns. */
dl_job *dl_job_new(dl_job_kind kind);
void dl_job_free(dl_job *j);

typedef struct dl_worker dl_worker;

/* Start the worker over `store` (borrowed) and the committed global model
 * params[p] / momentum[p] (borrowed, [P] fragments of plan's sizes, each
 * buffer 64-byte aligned and of dl_plan_max_fragment_numel floats, freed
 * with free()): a successful merge of p replaces them after its commit, by
 * swapping the pointers with the worker's scratch buffers (no copy back),
 * so params[p] may point elsewhere after each merge of p. momentum[p] may be
 * NULL (zero): a merge whose outer momentum is 0 uses none and leaves it
 * NULL (freeing it if it was not), one with a momentum allocates it. The loop may read
 * fragment p's arrays whenever no merge job of p is in flight. `wake(ctx)`
 * is called from the worker thread after each finished job (ev_async_send). */
int dl_worker_open(dl_store *store, const dl_plan *plan, float **params, float **momentum,
                   void (*wake)(void *ctx), void *wake_ctx, dl_worker **out);
/* Encode every merge's version-to-version delta with e (copied; e->c.id 0 =
 * off, the default: the outer step's result is committed as it is). Call
 * before the first job; e->c must pass dl_codec_check. Stochastic rounding
 * draws from e->seed mixed with the fragment and the version. */
void dl_worker_set_update_codec(dl_worker *w, const dl_codec_enc *e);
/* Fragment p's downlink residual ([numel] floats), or NULL before its first
 * encoded merge; the caller reads it only while no merge of p is in flight. */
const float *dl_worker_residual(const dl_worker *w, int p);
/* Finish the queued jobs, stop the thread, free jobs never taken back. */
void dl_worker_close(dl_worker **w);

void dl_worker_submit(dl_worker *w, dl_job *j);
/* The oldest finished job, or NULL; the caller frees it. */
dl_job *dl_worker_done(dl_worker *w);
/* Jobs submitted and not yet taken back with dl_worker_done. */
int dl_worker_inflight(dl_worker *w);

#endif
