/* Push guards of the synchronizer: the checks every push passes before any of
 * its numbers touch a merge weight or the model, and the check of a merged
 * fragment before it is committed.
 *
 * Pure: no sockets, no clock, no state beyond the handle; every time is passed
 * in (seconds). The O(n) passes use OpenMP like kernels/outer.c.
 * Not thread-safe: one owner (the synchronizer's loop thread) calls every
 * function that takes a dl_guard. dl_guard_norm and dl_guard_params_max read
 * only their arguments and may run on any thread (the merge worker).
 * Cost: dl_guard_norm, dl_guard_params and dl_guard_params_max are O(n) over a
 * fragment (one pass); dl_guard_accepted is O(norm_window); dl_guard_value,
 * dl_guard_median, the counter, batch and replay checks are O(1);
 * dl_guard_reconfigure is O(P x norm_window log norm_window). Memory:
 * 16 bytes x norm_window per fragment, plus 8 bytes per fragment for each
 * learner slot that has had a push merged.
 *
 * Threat model. The guards bound what a learner holding a VALID key can do to
 * the global model by lying; they do not make it harmless. Per check:
 *
 *   counters (dl_guard_counters, dl_guard_batch). A push's tokens become its
 *     merge weight (tokens^2 / steps) and the fleet's token ledger. Refused:
 *     tokens > steps x batch x seq_len, and steps > ceil(elapsed x
 *     max_step_rate) + step_slack. Still possible: claim the maximum every
 *     time, i.e. declare batch = max_batch at Hello (or none: the bound then
 *     uses max_batch) and report steps at max_step_rate, which outweighs an
 *     honest learner by up to (max_batch / its batch)^2 x (max_step_rate / its
 *     rate) in the weighted merge. The robust aggregators of merge.h ignore
 *     weights for this reason.
 *   norm (dl_guard_value). Pushes are compared per step, like with like: a
 *     delta's L2 norm above norm_k x sqrt(its steps) x the median over
 *     learners of each one's newest norm per sqrt(step) among the fragment's
 *     last norm_window pushes (whatever their fate), or above
 *     norm_param_ratio x the fragment's parameter norm, is clipped to the
 *     bound or rejected (norm_action). sqrt: a sum of s steps of noisy
 *     updates grows like sqrt(s), a steady drift like s), so a push that
 *     carries many steps after an outage, or a learner's first push after a
 *     long start, is judged against what the fleet does per step instead of
 *     being refused as an outlier; a push of few steps gets a tighter bound.
 *     The steps the bound grows with are capped at norm_k x what the median
 *     learner makes in a push, or, when more, in the time this push had since
 *     its base (elapsed_s, the counter check's, x the median of the
 *     learners' latest step rates), at most norm_k times that again: a liar
 *     claiming more steps than it made (within the counter check) buys at
 *     most sqrt(norm_k) times the bound an honest learner gets for the same
 *     time, and norm_k times the bound of its honest steps however long it
 *     waits; an honest push whose norm grew like a steady drift (s, not
 *     sqrt(s)) over more than ~norm_k^2 push periods can exceed it.
 *     Non-finite deltas are always rejected. The median follows the fleet, so
 *     honest growth (the warm-up: norms x10 within a few pushes) is not locked
 *     out, which a median of accepted norms only did (measured: every push of 4
 *     honest learners refused after the warm-up, bench/byzantine.sh). Still
 *     possible:
 *       - push a delta of norm just under the bound, every time: with the
 *         defaults up to 10 x the typical honest norm per push, in any
 *         direction (the guard bounds the length, never the direction);
 *       - with half the learners or more, raise the median by norm_k per push
 *         (norms are remembered at most at the bound; one vote per learner:
 *         a minority moves it little; with 1 or 2 learners the median is
 *         theirs), i.e. geometrically; then only the parameter-ratio bound
 *         holds, and since every merge may grow the parameter norm, that one
 *         relaxes too;
 *       - be among the first norm_min_history pushes of a fragment
 *         (at start, and after every synchronizer restart: history is not
 *         persisted), when only the parameter-ratio bound applies.
 *     Zero norms are not remembered (a median of 0 would refuse every later
 *     non-zero push), and the parameter-ratio bound is off for a fragment
 *     whose parameters are all zero.
 *   replays (dl_guard_replay). A push from a base version at or below one
 *     already merged for the same learner slot and fragment is refused, so a
 *     captured or re-sent push cannot be counted twice. Still possible: new
 *     pushes from the newest base, bounded by the checks above. A learner
 *     whose hold on a push was released after a lost decision (learner/node.c
 *     must_hold) re-pushes from a merged base and is refused too; the caller
 *     should tell it to rebase rather than treat it as hostile.
 *   parameters (dl_guard_params). A merged fragment with a non-finite value or
 *     a value beyond param_abs_max is not committed. It is the last line: it
 *     stops a blow-up, not a slow drift within the bound. */
#ifndef DL_SYNCHRONIZER_GUARD_H
#define DL_SYNCHRONIZER_GUARD_H

#include <stddef.h>
#include <stdint.h>

#define DL_GUARD_MAX_WINDOW 1024       /* upper bound of cfg.norm_window */
#define DL_GUARD_MAX_LEARNERS 65536    /* upper bound of max_learners (as the merge policy's) */
#define DL_GUARD_MAX_FRAGMENTS (1 << 20)

/* What the norm rule does to a delta above its bound. */
typedef enum {
    DL_GUARD_REJECT = 0, /* refuse the push ("reject") */
    DL_GUARD_CLIP = 1    /* scale the delta down to the bound and merge it ("clip") */
} dl_guard_action;

typedef struct {
    double norm_k;            /* a delta whose L2 norm exceeds norm_k x the median of the fragment's recent accepted
                                 norms is clipped to that bound or rejected (norm_action); 0 = off, else [1, 1e6];
                                 default 10 */
    int norm_window;          /* learners whose latest push norm is remembered per fragment (the most recent
                                 pushers), [1, DL_GUARD_MAX_WINDOW]; default 32 */
    int norm_min_history;     /* the median rule applies once this many learners' norms are remembered,
                                 [1, norm_window]; default 1: from the first push on (a single learner is
                                 compared with its own previous push) */
    double norm_param_ratio;  /* history-free bound: norm <= ratio x the fragment's global parameter norm; 0 = off,
                                 else (0, 1e9]; default 10 */
    dl_guard_action norm_action; /* applies to both norm bounds; default DL_GUARD_REJECT */
    double param_abs_max;     /* after a merge every global parameter must be finite with |x| <= this; 0 = off
                                 (finite is still checked), else finite > 0; default 1000 */
    double max_step_rate;     /* inner steps per second a learner can plausibly make, (0, 1e9]; default 10000 */
    uint64_t step_slack;      /* steps allowed on top of max_step_rate x elapsed (any value); default 64 */
    uint32_t max_batch;       /* sequences per step a learner may declare at Hello (and the bound used for a Hello
                                 without a batch), >= 1; default 65536 */
    uint64_t max_tokens_per_step; /* manifest learners (docs/PROTOCOL.md "Manifests"): the most tokens per step
                                 one may claim at Hello (and the bound of one that claims none), [1, 2^40];
                                 default 2^24 */
} dl_guard_cfg;

/* Outcomes of dl_guard_value. */
enum { DL_GUARD_OK = 0, DL_GUARD_CLIPPED = 1, DL_GUARD_REJECTED = 2 };

typedef struct dl_guard dl_guard;

/* ---- configuration */
dl_guard_cfg dl_guard_cfg_default(void);
/* 0, or DL_EINVAL with dl_errmsg() naming the bad field and its value. */
int dl_guard_cfg_check(const dl_guard_cfg *c);
/* "reject" | "clip"; unknown names: DL_EINVAL listing the valid ones. */
int dl_guard_action_parse(const char *name, dl_guard_action *out);
const char *dl_guard_action_name(dl_guard_action a);

/* ---- lifetime. c is copied and must pass dl_guard_cfg_check; n_fragments in
 * [1, DL_GUARD_MAX_FRAGMENTS], max_learners in [1, DL_GUARD_MAX_LEARNERS]
 * (else DL_EINVAL). Learner slots are the caller's indices in [0, max_learners). */
int dl_guard_open(const dl_guard_cfg *c, int n_fragments, int max_learners, dl_guard **out);
void dl_guard_close(dl_guard **g); /* safe on NULL and twice; sets *g = NULL */
/* SIGHUP: replace every setting. Norm histories and replay state are kept; a
 * smaller norm_window keeps each fragment's newest norms. DL_EINVAL (running
 * values untouched) if c fails dl_guard_cfg_check. */
int dl_guard_reconfigure(dl_guard *g, const dl_guard_cfg *c);
const dl_guard_cfg *dl_guard_get_cfg(const dl_guard *g);

/* ---- counters. 0, or DL_ERANGE with the reason in why (and dl_errmsg()) when
 * a push claims more than its learner can have done:
 *   "tokens 4611686018427387904 > steps 4 x batch 16 x seq_len 64 = 4096"
 *   "steps 1000000 > 1064 plausible in 1 s (max_step_rate 1000/s + step_slack 64)"
 * Rules: tokens <= steps x batch x seq_len (batch 0 = not declared: max_batch
 * is used; exact for every 64-bit input, no overflow), and steps <=
 * ceil(elapsed_s x max_step_rate) + step_slack (saturating at 2^64 - 1).
 * elapsed_s >= 0 (asserted) is the time since the learner could have started
 * accumulating these steps; the caller computes it (e.g. since it adopted the
 * push's base version, or since its Hello if it has not adopted since). */
int dl_guard_counters(const dl_guard *g, uint32_t batch, uint32_t seq_len, uint64_t steps, uint64_t tokens,
                      double elapsed_s, char *why, size_t cap);
/* The same rules for a manifest learner: tokens <= steps x tokens_per_step,
 * the learner's bound (dl_guard_tokens_bound): "tokens 9000 > steps 2 x
 * max_tokens_per_step 4096 = 8192". */
int dl_guard_counters_tps(const dl_guard *g, uint64_t tokens_per_step, uint64_t steps, uint64_t tokens,
                          double elapsed_s, char *why, size_t cap);
/* A manifest learner's tokens-per-step bound from its Hello claim
 * (Hello.max_tokens_per_step; 0 = none: the run's max_tokens_per_step). 0
 * with *bound set, or DL_ERANGE with the reason in why when the claim is
 * above the run's max_tokens_per_step. */
int dl_guard_tokens_bound(const dl_guard *g, uint64_t claim, uint64_t *bound, char *why, size_t cap);
/* Batch declared at Hello: 0 when acceptable (0 = not declared), DL_ERANGE
 * with the reason in why when > max_batch. */
int dl_guard_batch(const dl_guard *g, uint32_t batch, char *why, size_t cap);

/* ---- values. One pass over a delta of n floats: returns its L2 norm,
 * accumulated in double, and sets *finite to 1 iff every value is finite. A
 * double sum of squares of finite floats cannot overflow (each is below 2^256),
 * so the norm is finite exactly when the delta is: an inf or nan value makes
 * it inf or nan, never a finite-looking number. The result is bit-identical
 * whatever the thread count (fixed chunking, as kernels/outer.c). */
double dl_guard_norm(const float *x, size_t n, int *finite);
/* The sum of squares of n values (in double), for a norm built piece by
 * piece: sqrt of the pieces' sum is the norm, finite exactly when every
 * value is (as dl_guard_norm). dl_guard_copy_sumsq also copies the n fp32
 * values at src (any alignment: a received frame) to dst, in the same pass. */
double dl_guard_sumsq(const float *x, size_t n);
/* One pass over a merged fragment before its commit, block by block while
 * each is in cache: dl_guard_params_max (0, or its DL_ECORRUPT and reason,
 * with the outputs unset), and its L2 norm (*norm, summed block by block),
 * its checksum (*hash: dl_checksum64 of all n values) and each block's
 * (sums[b]: dl_checksum64 of values [b x block, + block), the last one
 * shorter; the store's block sums when block is DL_STORE_BLOCK_FLOATS). */
int dl_guard_params_scan(double param_abs_max, int p, const float *x, size_t n, size_t block, double *norm,
                         uint64_t *hash, uint64_t *sums, char *why, size_t cap);
double dl_guard_copy_sumsq(float *dst, const void *src, size_t n);

/* Norm guard for a delta of fragment p with L2 norm `norm` (from
 * dl_guard_norm) made in `steps` inner steps (Push.steps; 0 counts as 1);
 * param_norm is the fragment's current global parameter norm. The bound is
 * the smaller of the active rules:
 *   norm_k x sqrt(s) x the median over learners of each one's newest
 *   remembered norm per sqrt(step) of the fragment (once norm_min_history
 *   norms are remembered; norm_k > 0), s = steps capped at norm_k x the
 *   median of their latest steps or, when more, at norm_k x their median
 *   step rate x elapsed_s (the seconds the push's learner had for it, as
 *   the counter check measures them; 0 = unknown), at most norm_k^2 x the
 *   median steps, and
 *   norm_param_ratio x param_norm
 *   (norm_param_ratio > 0 and param_norm finite and > 0).
 * Returns DL_GUARD_OK (*scale = 1), DL_GUARD_CLIPPED (norm_action CLIP: *scale
 * in (0, 1) is the factor that brings the delta to the bound) or
 * DL_GUARD_REJECTED (*scale = 0), with a reason in why for the last two:
 *   "norm 3.2e+05 > 10 x median 1.1 of 4 learner(s)' latest pushes (per sqrt(step), x sqrt(16 steps))"
 *   (the median shown is scaled to this push's steps)
 *   "norm 5e+37 > 10 x parameter norm 12.5"
 * A non-finite norm is always rejected. why may be NULL. */
int dl_guard_value(const dl_guard *g, int p, double norm, uint64_t steps, double elapsed_s, double param_norm,
                   double *scale, char *why, size_t cap);
/* Remember the norm (finite, >= 0; asserted) and steps of a push of fragment
 * p by learner `slot` (and its step rate, steps / elapsed_s, when elapsed_s >
 * 0), as its norm per sqrt(step), whatever its fate, capped
 * at the median bound in force (so one
 * push moves the median by at most norm_k): the median rule compares a push
 * with what the fleet pushes now, so it follows honest growth (a warm-up, a
 * loss spike) instead of locking out every learner whose norms grew beyond
 * the history of accepted ones. Zero norms are not remembered. */
void dl_guard_observe(dl_guard *g, int p, int slot, double norm, uint64_t steps, double elapsed_s);
/* Median over learners of the newest remembered norm per sqrt(step) of each (mean of the
 * two middle ones for an even count; 0 when none) and, if count is not NULL,
 * how many norms are remembered (one per learner: a learner's new record
 * replaces its old one, so however often it pushes it is one vote and never
 * evicts the others). */
double dl_guard_median(const dl_guard *g, int p, int *count);

/* ---- replays. A push is a replay when learner `slot` already had a push of
 * fragment p from a base version >= base merged. dl_guard_replay returns 1
 * with a reason in why for such a push ("base version 4 of fragment 2 is not
 * newer than 5, already merged from this learner"), else 0. dl_guard_applied
 * records a merged push's base (base < UINT64_MAX; asserted); dl_guard_forget
 * clears a learner slot (its slot is being reused by another learner). */
int dl_guard_replay(const dl_guard *g, int slot, int p, uint64_t base, char *why, size_t cap);
void dl_guard_applied(dl_guard *g, int slot, int p, uint64_t base);
void dl_guard_forget(dl_guard *g, int slot);

/* ---- parameters. After a merge, before the commit: 0 when all n parameters
 * of fragment p are finite and within param_abs_max (when > 0); else
 * DL_ECORRUPT with the first offending index in why (and dl_errmsg()):
 *   "parameter 1234 of fragment 3 is nan"
 *   "parameter 7 of fragment 0 is 3.1e+05 > param_abs_max 1000"
 * dl_guard_params_max is the same check with the bound passed in, for a merge
 * worker thread that holds a snapshot of the config instead of the guard. */
int dl_guard_params(const dl_guard *g, int p, const float *x, size_t n, char *why, size_t cap);
int dl_guard_params_max(double param_abs_max, int p, const float *x, size_t n, char *why, size_t cap);

#endif
