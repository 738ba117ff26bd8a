/* The merge of one closed round: weighted pseudo-gradients of a fragment ->
 * one merged delta (weighted mean for embeddings, radial-directional averaging
 * per span -- a tensor, or a row block of a split one -- for the rest; or a robust
 * coordinate-wise trimmed mean / median), then the outer Nesterov step on the global fragment. */
#ifndef DL_SYNCHRONIZER_MERGE_H
#define DL_SYNCHRONIZER_MERGE_H

#include <stddef.h>

#include "core/plan.h"

typedef enum {
    DL_MERGE_RULE_RDA = 0,  /* RDA for non-embedding tensors, weighted mean for embeddings (default) */
    DL_MERGE_RULE_MEAN = 1  /* weighted mean everywhere */
} dl_merge_rule;

/* How the contributions are combined. The robust aggregators are
 * coordinate-wise over the whole fragment (every span, embeddings included;
 * `rule` does not apply) and UNWEIGHTED: each contribution counts once,
 * whatever its token weight, because a weight is the learner's own claim
 * (tokens^2 / steps) and a weighted median or trimmed mean would let one
 * learner that claims many tokens dominate the result, the failure they are
 * there to prevent. With m < 3 contributions there is nothing to trim and no
 * majority to take the median of, so both are the unweighted mean (for m 1
 * or 2 the median is that mean anyway). Cost: a sort of m values per
 * coordinate, against one multiply-add per value for the weighted mean. */
typedef enum {
    DL_MERGE_AGG_WEIGHTED = 0,     /* token-weighted `rule` (default, "weighted") */
    DL_MERGE_AGG_TRIMMED_MEAN = 1, /* per coordinate, drop the k largest and k smallest, mean of the rest
                                    * ("trimmed_mean"); k = dl_merge_trim_count(trim, m) */
    DL_MERGE_AGG_MEDIAN = 2        /* per coordinate median, mean of the middle two for even m ("median") */
} dl_merge_aggregate;

#define DL_MERGE_TRIM_DEFAULT 0.25

typedef struct {
    dl_merge_rule rule;   /* used by DL_MERGE_AGG_WEIGHTED */
    float outer_lr;       /* Nesterov learning rate (DiLoCo: 0.7) */
    float outer_momentum; /* Nesterov momentum (DiLoCo: 0.9) */
    double clip_norm;     /* clip each contribution's norm to this first (0 = off) */
    int share_scaling;    /* scale a round's merged delta by its share of the fleet's tokens (see commit.c) */
    dl_merge_aggregate aggregate; /* default (0) DL_MERGE_AGG_WEIGHTED */
    double trim;          /* fraction trimmed from EACH side by DL_MERGE_AGG_TRIMMED_MEAN, [0, 0.5);
                           * DL_MERGE_TRIM_DEFAULT is 0.25 (a zeroed struct has 0: the plain mean) */
} dl_merge_opts;

/* Merge m deltas of fragment p (each dl_plan_fragment_numel(p) floats, 4-byte
 * aligned) with weights w (> 0 sum; ignored by the robust aggregators) into
 * `merged` (same size), after clipping each (in place) to clip_norm when > 0,
 * multiply it by `scale` (the round's share, in (0, 1]; 1 = unscaled), then
 * params -= outer step(merged) with momentum. Returns the L2 norm of the
 * merged delta. Non-finite input makes the result non-finite: the caller
 * rejects contributions with non-finite values before merging (see
 * dl_merge_finite). o must pass dl_merge_opts_check (asserted for trim). */
double dl_merge_apply(const dl_plan *plan, int p, const dl_merge_opts *o, float *const *deltas, const double *w,
                      int m, double scale, float *merged, float *params, float *momentum);
/* dl_merge_apply with the outer step out of place: params_out / momentum_out
 * = the step from params / momentum (unchanged; the outputs may be them),
 * the same values bit for bit; span_ss (NULL: computed here) gives each
 * delta's sums of squares per span of the fragment (dl_plan_fragment_spans),
 * RDA's norms without a pass over the deltas (not used with clip_norm, which
 * changes the deltas first). */
double dl_merge_apply_to(const dl_plan *plan, int p, const dl_merge_opts *o, float *const *deltas, const double *w,
                         const double *const *span_ss, int m, double scale, float *merged, const float *params,
                         const float *momentum, float *params_out, float *momentum_out);

/* 1 if all n values are finite. */
int dl_merge_finite(const float *x, size_t n);

/* Parse "rda" | "mean". */
int dl_merge_rule_parse(const char *name, dl_merge_rule *out);
/* Parse "weighted" | "trimmed_mean" | "median"; anything else (or NULL):
 * DL_EINVAL listing the valid names. */
int dl_merge_aggregate_parse(const char *name, dl_merge_aggregate *out);
const char *dl_merge_aggregate_name(dl_merge_aggregate a); /* "?" when out of range */
/* 0, or DL_EINVAL naming the bad field: rule, aggregate, trim outside
 * [0, 0.5), clip_norm negative or not finite. */
int dl_merge_opts_check(const dl_merge_opts *o);
/* Contributions trimmed from each side by the trimmed mean of m: floor(trim x m)
 * (with 1e-9 of slack so that 0.29 x 100 is 29, not 28), 0 when m < 3, and
 * always < m / 2. With the default 0.25 nothing is trimmed below m = 4. */
int dl_merge_trim_count(double trim, int m);

#endif
