/* Fragment plan: splits a model's tensor table into P fragments of near-equal bytes (whole tensors, big
 * ones cut into row blocks), the staggered push schedule, and the model fingerprint. */
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
 * Blocks. A fragment is a list of blocks; a block is a contiguous element
 * range [start, start + numel) of one tensor. Most tensors are one block (the
 * whole tensor); a tensor larger than the fragment target
 * ceil(total / P) floats, with at least two rows, may be split into row
 * blocks: rows [r0, r1) of a row-major [rows, cols] tensor are elements
 * [r0*cols, r1*cols), so every block of a 2-D tensor starts and ends on a row
 * boundary (a 1-D tensor's rows are its elements; a 3- or 4-D tensor's rows
 * are its shape[0] slices, cols the product of the other dimensions).
 *
 * Packing. First the whole-tensor plan (LPT): tensors sorted by numel
 * descending (ties: lower table index first), each assigned to the fragment
 * with the fewest floats so far (ties: lowest fragment index). When no tensor
 * exceeds the target that is the plan. Otherwise the split plan is built too:
 * the tensors up to the target are packed by the same LPT, then the big
 * tensors, concatenated in table order, are poured into the fragments like
 * water: fragment p gets max(0, level - fill_p) floats (the level is where the
 * quotas sum to the big tensors' floats exactly; the remainder goes one float
 * each to the lowest-index fragments at or under the level), fragments take
 * consecutive stretches of the stream in index order, and each cut is moved
 * to the nearest row boundary of the tensor it falls in. A fragment thus gets
 * at most one stretch, i.e. at most one block of each big tensor. The split
 * plan is kept only when its largest fragment is strictly smaller than the
 * whole-tensor plan's and no fragment is empty; otherwise the whole-tensor
 * plan stands. So a table that needs no split gets exactly the plan it got
 * before blocks existed.
 *
 * Order. Inside a fragment the blocks keep buffer order, so a fragment's
 * payload is its blocks concatenated in the order they sit in the parameter
 * buffer.
 *
 * What is per block. A merge works span by span (synchronizer/merge.c): an
 * EMBED span by weighted mean, which is element-wise, so a split embedding
 * merges exactly as a whole one; the other kinds by RDA, whose norms are then
 * those of the block, not of the tensor. The blocks of one tensor sit in
 * different fragments whose rounds close at different times with different
 * contributors and weights, so a norm across the blocks would need deltas
 * that are not in the round; per block is the only rule that keeps a merge a
 * function of its own fragment. For GPT-2 124M only wte (EMBED) is above the
 * target up to P = 52 (the MLP matrices pass it from P = 53 on), so there RDA
 * stays per tensor; a small model gets there sooner (L=2 C=64 V=100 splits
 * its MLP matrices at P = 8). Norm clipping and the push guards were per
 * fragment already. */
typedef struct dl_plan dl_plan;

/* One block's place in a fragment payload (all counts in floats). */
typedef struct {
    size_t offset; /* start inside the fragment payload */
    size_t src;    /* start inside the parameter buffer: the tensor's offset + start */
    size_t start;  /* first element inside the tensor: 0 for a whole tensor, a multiple of the row length */
    size_t numel;
    int kind;      /* DL_TENSOR_*: EMBED merges by weighted mean, the rest by RDA */
    int tensor;    /* index into the table */
    int fragment;  /* fragment that holds this block */
} dl_plan_span;

/* Build the plan for `ntensors` tensors in buffer order (offsets strictly
 * increasing, non-overlapping). Returns 0, or DL_EINVAL (dl_errmsg() says why)
 * when P < 1, P > ntensors, or the table is malformed (empty or unterminated
 * name, numel 0 or != product of shape, ndim not in [1, 4], unknown kind,
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
/* Blocks in the whole plan: ntensors plus one per extra block of a split tensor. */
int dl_plan_nblocks(const dl_plan *plan);
/* Spans of fragment p in payload (= buffer) order, one per block; *nspans
 * gets the count. */
const dl_plan_span *dl_plan_fragment_spans(const dl_plan *plan, int p, int *nspans);
/* Blocks of table entry `tensor`: 1 unless it is split. Block k (0 <= k <
 * dl_plan_tensor_nblocks) in element order; the blocks cover the tensor
 * exactly, each in one fragment (k-th block's ->fragment). */
int dl_plan_tensor_nblocks(const dl_plan *plan, int tensor);
const dl_plan_span *dl_plan_tensor_block(const dl_plan *plan, int tensor, int k);
/* Fragment that holds element `elem` (0 <= elem < numel) of table entry `tensor`. */
int dl_plan_fragment_of(const dl_plan *plan, int tensor, size_t elem);
/* 1 when fragment p holds at least one block of `kind` (DL_TENSOR_*). */
int dl_plan_fragment_has_kind(const dl_plan *plan, int p, int kind);

/* Copy fragment p's blocks out of the parameter buffer `params` into `out`
 * (dl_plan_fragment_numel(p) floats), concatenated in fragment order. */
void dl_plan_gather(const dl_plan *plan, int p, const float *params, float *out);
/* Inverse of gather: write the payload `in` back into fragment p's blocks
 * of `params`; no other element of `params` is touched. */
void dl_plan_scatter(const dl_plan *plan, int p, const float *in, float *params);

/* Model fingerprint: dl_hash64 over a versioned serialisation (fixed-width,
 * little-endian) of the model config bytes, P, and for every tensor its name,
 * ndim, shape, offset, numel, kind and fragment, and, when any tensor is
 * split, every block (see plan.c for the formats: a plan without split
 * tensors keeps format 1, so its fingerprint is what it was before blocks).
 * A table that formats 1 and 2 cannot hold (a name of 48 bytes or more, more
 * than 2 dimensions, a dimension above 2^32 - 1) gets format 3, which holds
 * any table. Any change in the model, the table or the plan changes it;
 * checked on every hello. */
uint64_t dl_plan_fingerprint(const dl_plan *plan, const void *model_cfg_bytes, size_t len);
/* Format 3 whatever the table (names length-prefixed, int64 shapes of 1-4
 * dimensions, every block): the fingerprint of a run described by a manifest
 * (core/manifest.h) rather than by a GPT-2 config. */
uint64_t dl_plan_fingerprint_v3(const dl_plan *plan, const void *model_cfg_bytes, size_t len);

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
