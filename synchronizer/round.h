/* Round assembly: a closed merge-policy round -> the merge record to commit
 * and the round's share of a full outer step. Pure (no I/O, no clock, no
 * globals), so the simulator assembles rounds exactly as dloco-sync does. */
#ifndef DL_SYNCHRONIZER_ROUND_H
#define DL_SYNCHRONIZER_ROUND_H

#include <stdint.h>

#include "storage/store.h"
#include "synchronizer/policy.h"

typedef struct {
    uint64_t epoch;           /* synchronizer epoch, recorded */
    const char *staleness_fn; /* name of the staleness weighting, recorded */
    /* Learner number (the policy's id) -> learner id text. */
    const char *(*learner_id)(void *ctx, uint32_t learner);
    void *ctx;
    /* Dropped-stale pushes of this fragment since its last merge: recorded
     * after the merged contributors (audit; their tokens are ledgered when
     * they were dropped). */
    const dl_merge_contrib *asides;
    int n_asides;
} dl_round_in;

typedef struct {
    dl_merge_record rec;     /* contrib malloc'd, [round n + n_asides] */
    double share;            /* the round's share (dl_policy_round.share), in (0, 1] */
    uint64_t applied_tokens; /* tokens of the merged contributors (the commit's ledger APPLIED) */
} dl_round_out;

/* Share scaling (docs/ARCHITECTURE.md "Outer step: share scaling"): a round
 * that merges only some of the live learners moves the global fragment by
 * that share of a full outer step; without it M learners whose pushes land in
 * separate rounds would apply M full outer steps per push period. The share
 * is the policy's (policy.h "Share": tokens x s(staleness) of the round over
 * the expected tokens of a full period of the fragment, from validated pushes
 * only), copied as it is. Weights in the record are normalised to sum to 1
 * over the merged contributors. */
void dl_round_assemble(const dl_policy_round *r, const dl_round_in *in, dl_round_out *out);
void dl_round_out_free(dl_round_out *o); /* safe twice */

#endif
