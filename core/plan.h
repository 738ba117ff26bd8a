/* Fragment plan: splits a model's tensor table into P fragments of near-equal
 * bytes (whole tensors, greedy LPT packing), the staggered push schedule, and the model fingerprint. */
#ifndef DL_CORE_PLAN_H
#define DL_CORE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

/* A plan is a pure, deterministic function of (tensor table, P): the same
 * table and P give the same fragments on every machine, so learners and the
 * synchronizer can each build it and compare fingerprints instead of
 * shipping it. The plan keeps its own copy of the table.
 *
 * Packing (LPT): tensors sorted by numel descending (ties: lower table index
 * first), each assigned to the fragment with the fewest floats so far (ties:
 * lowest fragment index). Inside a fragment the tensors keep table order,
 * which is buffer order, so a fragment's payload is its tensors concatenated
 * in the order they sit in the parameter buffer. */
typedef struct dl_plan dl_plan;

/* One tensor's place inside a fragment payload (all counts in floats). */
typedef struct {
    size_t offset; /* start inside the fragment payload */
    size_t numel;
    int kind;      /* DL_TENSOR_*: EMBED merges by weighted mean, the rest by RDA */
    int tensor;    /* index into the table */
} dl_plan_span;

/* Build the plan for `ntensors` tensors in buffer order (offsets strictly
 * increasing, non-overlapping). Returns 0, or DL_EINVAL (dl_errmsg() says why)
 * when P < 1, P > ntensors, or the table is malformed (empty or unterminated
 * name, numel 0 or != product of shape, ndim not 1 or 2, unknown kind,
 * overlapping or out-of-order offsets). *out is NULL on failure. */
int dl_plan_build(const dl_tensor *t, int ntensors, int P, dl_plan **out);
/* Free the plan and NULL the pointer; safe on NULL and twice. */
void dl_plan_close(dl_plan **plan);

int dl_plan_P(const dl_plan *plan);
int dl_plan_ntensors(const dl_plan *plan);
const dl_tensor *dl_plan_tensor(const dl_plan *plan, int i); /* the plan's copy of table entry i */
size_t dl_plan_total_numel(const dl_plan *plan);             /* sum of all tensors' numel */
size_t dl_plan_max_fragment_numel(const dl_plan *plan);      /* for sizing one payload buffer */
size_t dl_plan_fragment_numel(const dl_plan *plan, int p);
int dl_plan_fragment_ntensors(const dl_plan *plan, int p);
/* Table indices of fragment p in buffer order; dl_plan_fragment_ntensors() entries. */
const int *dl_plan_fragment_tensors(const dl_plan *plan, int p);
/* Spans of fragment p in payload order (one per tensor); *nspans gets the count. */
const dl_plan_span *dl_plan_fragment_spans(const dl_plan *plan, int p, int *nspans);
/* Fragment that holds table entry `tensor`. */
int dl_plan_fragment_of(const dl_plan *plan, int tensor);
/* 1 when fragment p holds at least one tensor of `kind` (DL_TENSOR_*). */
int dl_plan_fragment_has_kind(const dl_plan *plan, int p, int kind);

/* Copy fragment p's tensors out of the parameter buffer `params` into `out`
 * (dl_plan_fragment_numel(p) floats), concatenated in fragment order. */
void dl_plan_gather(const dl_plan *plan, int p, const float *params, float *out);
/* Inverse of gather: write the payload `in` back into fragment p's tensors
 * of `params`; no other element of `params` is touched. */
void dl_plan_scatter(const dl_plan *plan, int p, const float *in, float *params);

/* Model fingerprint: dl_hash64 over a versioned serialisation (fixed-width,
 * little-endian) of the model config bytes, P, and for every tensor its name,
 * ndim, shape, offset, numel, kind and fragment. Any change in the model,
 * the table or the plan changes it; checked on every hello. */
uint64_t dl_plan_fingerprint(const dl_plan *plan, const void *model_cfg_bytes, size_t len);

/* max fragment bytes / mean fragment bytes (1.0 is perfect balance). */
double dl_plan_imbalance(const dl_plan *plan);

/* Staggered schedule: 1 when fragment p (0 <= p < P) is due after completed
 * training step `step` (1-based), i.e. step > 0 and (step - offset_p) % H == 0
 * with offset_p = (p*H)/P (integer division, 0 <= offset_p < H). One fragment
 * leaves every H/P steps and each fragment once per H steps; at most
 * ceil(P/H) fragments are due at any step. The first push of fragment p is at
 * step offset_p (or at step H when offset_p is 0): steps before that simply
 * do not push yet. Requires H >= 1 and P >= 1 (asserted). */
int dl_plan_due(int64_t step, int p, int H, int P);

#endif
