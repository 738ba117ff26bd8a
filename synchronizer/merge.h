/* The merge of one closed round: weighted pseudo-gradients of a fragment ->
 * one merged delta (weighted mean for embeddings, radial-directional averaging
 * per tensor for the rest), then the outer Nesterov step on the global fragment. */
#ifndef DL_SYNCHRONIZER_MERGE_H
#define DL_SYNCHRONIZER_MERGE_H

#include <stddef.h>

#include "core/plan.h"

typedef enum {
    DL_MERGE_RULE_RDA = 0,  /* RDA for non-embedding tensors, weighted mean for embeddings (default) */
    DL_MERGE_RULE_MEAN = 1  /* weighted mean everywhere */
} dl_merge_rule;

typedef struct {
    dl_merge_rule rule;
    float outer_lr;       /* Nesterov learning rate (DiLoCo: 0.7) */
    float outer_momentum; /* Nesterov momentum (DiLoCo: 0.9) */
    double clip_norm;     /* clip each contribution's norm to this first (0 = off) */
    int share_scaling;    /* scale a round's merged delta by its share of the fleet's tokens (see sync.c) */
} dl_merge_opts;

/* Merge m deltas of fragment p (each dl_plan_fragment_numel(p) floats, 4-byte
 * aligned) with weights w (> 0 sum) into `merged` (same size), multiply it by
 * `scale` (the round's share, in (0, 1]; 1 = unscaled), then
 * params -= outer step(merged) with momentum. Returns the L2 norm of the
 * merged delta. Non-finite input makes the result non-finite: the caller
 * rejects contributions with non-finite values before merging (see
 * dl_merge_finite). */
double dl_merge_apply(const dl_plan *plan, int p, const dl_merge_opts *o, float *const *deltas, const double *w,
                      int m, double scale, float *merged, float *params, float *momentum);

/* 1 if all n values are finite. */
int dl_merge_finite(const float *x, size_t n);

/* Parse "rda" | "mean". */
int dl_merge_rule_parse(const char *name, dl_merge_rule *out);

#endif
