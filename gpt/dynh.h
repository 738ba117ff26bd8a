/* Dynamic local steps (--dynamic_h speed, docs/HETEROGENEOUS.md): each
 * learner scales its H by its step rate over the fleet's, and changes it only
 * at a push-cycle boundary so that no fragment's push is skipped or doubled.
 *
 * The rule: H_i = clamp(round(H * s_i / s_fleet), h_min, h_max), where H is
 * the Welcome's, s_i this learner's step rate (the EWMA its heartbeats send)
 * and s_fleet the synchronizer's median of the live learners' rates
 * (Ack.fleet_steps_per_s). A push of fragment p then leaves every H_i / s_i
 * = H / s_fleet seconds whatever the learner's speed: every learner pushes
 * at the fleet's cadence, so a slow learner's push is based on a version as
 * recent as a fast one's (about the same staleness: it lands in the round it
 * was trained for instead of being discounted or dropped as stale), and
 * carries fewer tokens, for which the token weighting already accounts. An
 * unknown rate (s_i or s_fleet 0: before the first heartbeat / Ack) keeps H.
 *
 * The schedule: with a constant H the node pushes fragment p after step s
 * when dl_plan_due(s, p, H, P): once per cycle [kH, (k+1)H), at kH + off_p,
 * off_p = p*H/P. Changing H between two steps would move the offsets and the
 * cycle, so fragment p could be due twice in a row or not at all. Here the
 * cycles are explicit: cycle k starts at real step b_k (b_0 = the step before
 * the first trained one), has length H_k, and b_{k+1} = b_k + H_k; H_{k+1} is
 * chosen at b_{k+1} (the rule above) and fixed for that whole cycle. For real
 * step s in cycle k the node gets the schedule step H_k + (s - b_k) with
 * H = H_k, which dl_plan_due makes due exactly for the p with off_p(H_k) =
 * s - b_k: every fragment is due exactly once per cycle. With a constant H
 * from step 0 the schedule step is congruent to s modulo H: the schedule is
 * the plain one, step for step.
 *
 * A pure state machine (no clock, no I/O): the caller passes the rates. */
#ifndef DL_LEARNER_DYNH_H
#define DL_LEARNER_DYNH_H

#include <stdint.h>

enum { DL_DYNH_OFF = 0, DL_DYNH_SPEED = 1 };

/* Upper bound of h_max and of any H this returns (= DL_COMMS_H_MAX). */
#define DL_DYNH_H_MAX 1000000

typedef struct {
    int mode;           /* DL_DYNH_* */
    int h_min, h_max;   /* bounds of H_i, 1 <= h_min; h_max 0 = 4 x the Welcome's H (then at least h_min) */
    int64_t start;      /* b_k: real step the current cycle starts at */
    int cur;            /* H_k; 0 = no cycle yet */
    uint64_t cycles;    /* cycles begun */
    uint64_t changes;   /* cycles whose H differed from the previous cycle's */
} dl_dynh;

/* Mode, bounds. DL_EINVAL (message names the option) for h_min < 1,
 * h_min or h_max above DL_DYNH_H_MAX, or 0 < h_max < h_min. */
int dl_dynh_init(dl_dynh *d, int mode, int h_min, int h_max);

/* The rule above for Welcome H `base` (>= 1), own rate `own` and fleet rate
 * `fleet` (steps/s; <= 0 or non-finite = unknown: base). Pure. */
int dl_dynh_rule(const dl_dynh *d, int base, double own, double fleet);

/* Real step `step` (>= 1; consecutive calls give consecutive steps, the first
 * any) was trained: returns the schedule step for dl_node_after_step and sets
 * *H to the H to pass with it. A new cycle starts when step reaches b_k + H_k;
 * its H is dl_dynh_rule(base, own, fleet) (mode off: base). *changed = 1
 * when a cycle started at this step with an H other than the previous one. */
int64_t dl_dynh_step(dl_dynh *d, int64_t step, int base, double own, double fleet, int *H, int *changed);

#endif
