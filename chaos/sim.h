/* dloco-sim: a discrete-event simulation of a fleet of chips, grouped into
 * learners, that drives the synchronizer's REAL merge policy
 * (synchronizer/policy.c, the dl_policy library dloco-sync links) and round
 * assembly (synchronizer/round.c) with a simulated clock. docs/SIM.md.
 *
 * Three modes:
 *   DP        one SPMD job over every chip: an interruption anywhere stops
 *             every chip for recovery_s and loses the work since the last
 *             checkpoint (every ckpt_s of running; 0 = no loss). An
 *             interruption during a recovery is absorbed by it (the restart
 *             replaces every failed chip at once). No policy.
 *   ELASTIC   elastic data-parallel: one job over slices of slice_chips
 *             chips; an interruption drops its slice (down for repair_s) and
 *             the whole job pauses resize_s to reshard; the repaired slice's
 *             return pauses it resize_s again; a drop or return during a pause
 *             is absorbed by it (as DP's recovery absorbs interruptions).
 *             No lost work, no policy.
 *   DECOUPLED M learners of chips / M chips each, every one an elastic job
 *             as above (learner_fail = resize) or a process that restarts
 *             (learner_fail = restart: down for recovery_s, loses its
 *             unpushed progress). Learners step at their own step time
 *             (between-learner spread step_cv), push fragment f after step s
 *             when dl_plan_due(s, f, H, P) over their site's link (bytes of
 *             a fragment / bandwidth, serialised per site, plus rtt / 2),
 *             send a progress report right before every push (as dloco's
 *             learners send a Heartbeat), are declared dead after
 *             heartbeat_ms x liveness of silence and alive again when they
 *             resume. The policy decides every round; a closed round is
 *             assembled by dl_round_assemble, committed, and its Update
 *             reaches every live learner after the down transfer, which
 *             adopts it the way dloco-learner's default (adopt = keep) does.
 *
 * Accounting (the buckets of docs/CHAOS.md "Goodput, badput and the ledger",
 * in chip-seconds): provisioned = chips x horizon; down (a chip whose slice
 * or learner is down), startup (first start), recovery (a restart, a resize
 * pause, DP's recovery), idle_barrier (0: simulated learners never wait),
 * goodput (compute that was merged: the merged contributions' compute / P,
 * each push carrying its fragment's compute since the learner adopted that
 * fragment), dropped_stale (compute in pushes dropped as too stale / P),
 * wasted (the rest: lost at a restart, lost since a DP checkpoint, unpushed
 * or unmerged at the end). They sum to provisioned. DP and ELASTIC have no
 * pushes: their goodput is the work kept.
 *
 * Deterministic: the same cfg (seed included) gives the same result. */
#ifndef DL_CHAOS_SIM_H
#define DL_CHAOS_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "synchronizer/policy.h"

#define DL_SIM_MAX_SITES 16
#define DL_SIM_MAX_LEARNERS 4096
#define DL_SIM_MAX_KILLS 256
#define DL_SIM_MAX_FAILS 1024

typedef enum { DL_SIM_DP = 0, DL_SIM_ELASTIC = 1, DL_SIM_DECOUPLED = 2 } dl_sim_mode;
typedef enum { DL_SIM_FAIL_RESIZE = 0, DL_SIM_FAIL_RESTART = 1 } dl_sim_fail;

typedef struct {
    int learner;      /* index */
    double at_s, duration_s;
} dl_sim_kill;

typedef struct {
    dl_sim_mode mode;
    uint64_t seed;
    double horizon_s;      /* simulated time, s, > 0 */
    int64_t chips;         /* every chip of the fleet, >= 1 */
    int learners;          /* M (DECOUPLED), [1, DL_SIM_MAX_LEARNERS], <= chips */
    double mtbi_s;         /* mean time between interruptions of ONE chip, s; 0 = none */
    /* DP */
    double recovery_s;     /* DP: every chip stops this long; restart learners: down this long */
    double ckpt_s;         /* DP: checkpoint every this many s of running; 0 = nothing is lost */
    /* ELASTIC and resize learners */
    int64_t slice_chips;   /* chips dropped and re-added together, >= 1 */
    double resize_s;       /* pause of the whole job (learner) per drop and per return */
    double repair_s;       /* a dropped slice is back after this */
    /* DECOUPLED learners */
    dl_sim_fail learner_fail;
    double startup_s;      /* first start of every learner (startup bucket) */
    double restart_s;      /* a restarted learner's start after its down time (recovery bucket) */
    double step_s;         /* median inner step time, s, > 0 */
    double step_cv;        /* between-learner spread: step time = step_s * exp(step_cv * N(0,1)), [0, 2] */
    int H, P;              /* schedule: inner steps per period, fragments */
    double params;         /* model parameters */
    double bytes_per_param;
    int n_sites;
    double bandwidth_mbit[DL_SIM_MAX_SITES]; /* per site, each direction; 0 = unlimited */
    double rtt_ms[DL_SIM_MAX_SITES];
    int site_of[DL_SIM_MAX_LEARNERS];        /* learner -> site; -1 = round robin */
    double speed[DL_SIM_MAX_LEARNERS];       /* learner's fraction of full speed (step_s / speed); 0 = 1 */
    int adopt_overwrite[DL_SIM_MAX_LEARNERS]; /* 1: an Update drops the progress since the push (adopt =
                                                 overwrite); 0: keeps it (adopt = keep, dloco-learner's default) */
    double step_overhead_s; /* wall time per step outside the step's compute (the loop's pushes and adopts):
                               running, but not in a push's compute (so wasted, as dloco-chaos counts it) */
    double update_s;        /* an Update's apply time at the learner, after its transfer */
    double heartbeat_ms;   /* liveness: dead after heartbeat_ms * liveness of silence */
    int liveness;
    double merge_s;        /* from a round's close to its commit */
    dl_policy_cfg policy;  /* kind must be DECOUPLED; max_learners, H are set from above */
    dl_sim_kill kill[DL_SIM_MAX_KILLS]; /* scheduled learner kills (restart after duration_s) */
    int n_kill;
    double fail_at[DL_SIM_MAX_FAILS];   /* tests: DP interruptions at these times instead of random ones */
    int n_fail_at;
    int progress;          /* 1: a progress line on stderr every 10% of the horizon */
} dl_sim_cfg;

typedef struct {
    /* chip-seconds per bucket (docs/CHAOS.md); they sum to provisioned */
    double provisioned, down, startup, recovery, idle_barrier, goodput, dropped_stale, wasted;
    double goodput_frac;      /* goodput / provisioned */
    double compute;           /* chip-seconds of training (all chips that ran) */
    uint64_t interruptions;   /* chip interruptions drawn (or injected) */
    uint64_t steps, pushes, merges, contributions, dropped, deaths, events;
    double mean_staleness;    /* over merged contributions, compute-weighted */
    double mean_contrib;      /* contributions per merge */
    double quality;           /* quality proxy (docs/SIM.md): compute-weighted mean of (1 + staleness)^-1/2 */
    double credit_excess;     /* (merged + dropped compute) / compute - 1 before the skew rule scaled them down to
                                 compute (docs/SIM.md "Goodput and badput"); 0 when nothing was scaled. Not 0:
                                 merged or dropped pushes credited more compute than was run */
    dl_policy_stats pstats;   /* the real policy's counters */
} dl_sim_result;

/* Defaults: the paper study's fixed assumptions (docs/SIM.md), DECOUPLED. */
void dl_sim_cfg_default(dl_sim_cfg *c);
/* 0, or DL_EINVAL / DL_ERANGE naming the field and its bounds. */
int dl_sim_cfg_check(const dl_sim_cfg *c);
/* Run it. 0, or an error (a bad cfg, the policy refusing its cfg). */
int dl_sim_run(const dl_sim_cfg *c, dl_sim_result *out);
/* JSON object of a result (one line, with the cfg's mode, chips, M, seed). */
void dl_sim_result_json(const dl_sim_cfg *c, const dl_sim_result *r, FILE *f);
const char *dl_sim_mode_name(dl_sim_mode m);

#endif
