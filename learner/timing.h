/* Sync timing: when each fragment's push is made (docs/SYNC_TIMING.md).
 *
 * A pure state machine: no I/O, no clock. The caller feeds it, once per
 * completed inner step, the pressure it observed and the training loss
 * (dl_timing_observe), then asks, per fragment, whether the fragment is due
 * (dl_timing_due). A push decision is final: the policy counts it as a push
 * at that step even when the node's hold rule then delays the push itself.
 *
 * Policies (dl_timing_kind):
 *   fixed           dl_plan_due(step, p, H, P): the staggered fixed-H schedule
 *                   (core/plan.h), bit for bit.
 *   wa              workload-aware: inside the corridor, push when the score
 *                   (below) is >= 0; never before H_min, always by H_max.
 *   wa_forecast     wa whose rate term uses max(observed rate, one-step
 *                   forecast of the rate) (below).
 *   matched_random  the control: exactly counts[p] pushes of fragment p,
 *                   placed uniformly at random among all feasible placements
 *                   (below) over steps 1..steps; seeded. Not deployable: it
 *                   needs the push counts of a run of the policy under test.
 *   oracle          the offline upper bound: exactly counts[p] pushes of p,
 *                   at the feasible placement whose total overlap with the
 *                   pressure trace is least (exact dynamic programme).
 *
 * Elapsed steps. e_p(step) = step - last_p, last_p the step of p's last push
 * decision. Before the first one, last_p = first_p - H, first_p the fixed
 * schedule's first push of p (offset_p = (p*H)/P, or H when offset_p is 0):
 * every policy starts from the same staggered phase, and at e = H pushes
 * where fixed does.
 *
 * Feasible placement of k pushes of fragment p over a run of S steps: steps
 * t_1 < ... < t_k in [1, S] with
 *   max(1, last_p + H_min) <= t_1 <= last_p + H_max   (first gap, clipped at step 1)
 *   H_min <= t_{i+1} - t_i <= H_max                   (consecutive pushes)
 *   S - t_k < H_max                                   (no forced push left undone at the end)
 * (last_p the initial value above). The wa policies' own decisions are
 * feasible by construction (never before H_min, always by H_max), so the
 * control and the oracle are drawn from the set the policy under test
 * chose from, with its count. When no feasible placement of counts[p]
 * pushes exists (the trace is not of this S, H_min, H_max), open fails.
 *
 * The score (wa, wa_forecast), at elapsed e with H_min <= e < H_max:
 *   progress = w_stale * (e - H) / (H_max - H_min)
 *            + w_loss  * (loss_at_last_push - loss_now) / loss_at_last_push
 *   pressure = w_rate * max(0, rate / rate_ref - 1) + w_link * link + w_ckpt * ckpt
 *            + w_queue * queue / queue_ref
 *   score    = progress - pressure
 * loss_now is an EWMA of the step losses (weight 0.1 on the newest), and the
 * loss term is 0 until p has a push decision with a known loss. With no
 * pressure and flat loss the score is 0 at e = H: a calm workload gets the
 * fixed period. The queue term is the serving backlog (queued or in service):
 * the arrival rate falls the moment a burst ends while the queue it left is
 * still draining, so the rate alone calls that moment calm. At most max_per_step unforced decisions are made per step
 * (default ceil(P/H), the fixed schedule's own peak), in fragment order; a
 * fragment over the quota waits for a later step (its score only grows).
 * Without the quota every fragment a burst held back would push at the same
 * step, the first calm one, exactly when the service drains its backlog. Falling loss pulls a push earlier (never before H_min),
 * pressure pushes it later (never past H_max). At e >= H_max the push is
 * forced. Pressure unknown (no good sample from the source,
 * learner/pressure.h): the pressure term is not used and the push is made at
 * e >= H (the fixed period), so a dead source never starves or floods.
 *
 * The forecast (wa_forecast): Holt's linear EWMA on the observed rate, one
 * step ahead: level' = a*x + (1-a)*(level + trend), trend' = b*(level' - level)
 * + (1-b)*trend, forecast = max(0, level' + trend'), a = fc_alpha, b = fc_beta.
 * The rate term uses max(x, forecast): a rise that is under way is avoided
 * before it peaks, and the tail of a burst (forecast still high) is avoided too.
 *
 * The oracle's cost of a push at step t: sum of trace[t .. t+window-1] (the
 * pressure the push's transfer would overlap; steps past the trace cost 0).
 * trace[s-1] is the pressure seen at step s (the score's pressure term, as a
 * wa run records it in its trace). Ties: the earliest placement. */
#ifndef DL_LEARNER_TIMING_H
#define DL_LEARNER_TIMING_H

#include <stdint.h>

typedef enum {
    DL_TIMING_FIXED = 0,
    DL_TIMING_WA = 1,
    DL_TIMING_WA_FORECAST = 2,
    DL_TIMING_MATCHED_RANDOM = 3,
    DL_TIMING_ORACLE = 4,
} dl_timing_kind;

/* One pressure reading. known = 0: no good value (the fields are ignored). */
typedef struct {
    int known;
    double rate; /* requests per second, >= 0 */
    double link; /* link utilisation, [0, 1] */
    double ckpt; /* checkpoint activity, [0, 1] */
    double queue; /* serving requests queued or in service, >= 0 (0 when the source does not report it) */
} dl_pressure_sample;

typedef struct {
    dl_timing_kind kind;
    int P;              /* fragments, >= 1 */
    int H;              /* the nominal period (offset_p and the score's centre), >= 1 */
    int h_min, h_max;   /* corridor: 1 <= h_min <= H <= h_max (not fixed) */
    double w_stale, w_loss, w_rate, w_link, w_ckpt, w_queue; /* score weights, finite, >= 0 */
    double rate_ref;    /* requests/s that count as no pressure, > 0 */
    double queue_ref;   /* serving backlog (requests) that counts as pressure 1, > 0 */
    double fc_alpha, fc_beta; /* forecast smoothing, in (0, 1] */
    uint64_t seed;      /* matched_random */
    int64_t steps;      /* matched_random, oracle: the run's S, >= 1 */
    const int *counts;  /* matched_random, oracle: [P] pushes per fragment (copied) */
    const double *trace; /* oracle: [trace_len] pressure per step (copied); finite, >= 0 */
    int64_t trace_len;
    int window;         /* oracle: steps a push overlaps, >= 1 */
    int max_per_step;   /* wa: unforced push decisions per step at most this many, [0, P]; 0 = ceil(P/H) */
} dl_timing_cfg;

/* One due decision (dl_timing_due). */
typedef struct {
    int push;        /* 1: push p now */
    int forced;      /* the push is the H_max deadline (wa), 0 otherwise */
    int64_t elapsed; /* e_p at this step */
    double score;    /* wa: the score (NAN when not computed: e < H_min, or pressure unknown) */
    double pressure; /* wa: the pressure term used (NAN when unknown) */
} dl_timing_decision;

typedef struct dl_timing dl_timing;

/* Defaults for a policy and H: h_min = max(1, H/2), h_max = 2H, w_stale 1, w_loss 0.5, w_rate 1, w_link 1,
 * w_ckpt 1, w_queue 1, queue_ref 1, rate_ref 50, fc_alpha 0.5, fc_beta 0.3, window 1. */
void dl_timing_defaults(dl_timing_cfg *c, dl_timing_kind kind, int P, int H);
/* "fixed" | "wa" | "wa_forecast" | "matched_random" | "oracle"; parse returns 0 or DL_EINVAL. */
const char *dl_timing_name(dl_timing_kind k);
int dl_timing_parse(const char *s, dl_timing_kind *out);

/* Validates everything above (DL_EINVAL naming the field: a corridor not around H, a weight negative or not
 * finite, counts missing or negative, a trace value not finite or negative, a count with no feasible placement),
 * and for matched_random / oracle computes the whole placement now. */
int dl_timing_open(const dl_timing_cfg *c, dl_timing **out);
/* matched_random / oracle: bounds of one fragment's placement, refused (DL_EINVAL) above them: counts[p] x
 * (steps + 1) DP cells (8 bytes each), and those cells x the corridor width (h_max - h_min + 1) steps of work. */
#define DL_TIMING_PLAN_CELLS_MAX 2e7
#define DL_TIMING_PLAN_WORK_MAX 2e9
void dl_timing_close(dl_timing **t); /* safe on NULL and twice */

/* After completed step `step` (1-based, increasing), before the due calls of that step. `s` may be NULL
 * (unknown); `loss` non-finite is ignored. */
void dl_timing_observe(dl_timing *t, int64_t step, const dl_pressure_sample *s, double loss);
/* Is p due after step? Fills *d (may be NULL). A push decision sets last_p = step. `H` is the nominal period
 * the node was called with; fixed uses it (so a varying H works as before); the others use the configured
 * corridor. Call at most once per (step, p). */
int dl_timing_due(dl_timing *t, int64_t step, int p, int H, dl_timing_decision *d);

/* Pushes decided so far for p; the pressure term of the last observe (NAN when unknown); the forecast. */
int64_t dl_timing_pushes(const dl_timing *t, int p);
double dl_timing_pressure(const dl_timing *t);
double dl_timing_forecast(const dl_timing *t);
/* matched_random / oracle: the planned push steps of p (*n gets the count); NULL for the others. */
const int64_t *dl_timing_plan(const dl_timing *t, int p, int *n);
/* The oracle's cost of a placement (the sum described above), for tests and the bench. */
double dl_timing_cost(const double *trace, int64_t len, int window, const int64_t *steps, int n);

#endif
