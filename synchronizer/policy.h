/* Merge-round policy of the synchronizer: when a fragment's pooled pushes are
 * merged, with which weights, and which pushes are dropped or rejected.
 *
 * Pure state machine with an injected clock: every time is an int64 ns value
 * the caller passes in (monotonic clock in dloco-sync, simulated time in
 * dloco-sim). No real clock, no sockets, no threads, no allocation after a
 * round's buffers have grown to their working size. Not thread-safe: one
 * owner (the synchronizer's loop thread) calls everything.
 *
 * Life of a push of fragment f by learner L:
 *   dl_policy_push()      -> verdict now: POOLED, DROPPED_STALE (rebase) or
 *                            REJECTED (reason). Pooled pushes wait in f's open
 *                            round. A second push by L on the SAME base version
 *                            into the same open round REPLACES the first (the
 *                            learner's pseudo-gradient and its steps/tokens
 *                            counters are cumulative since it adopted its base,
 *                            so the newer push contains the older progress); the
 *                            verdict returns the old handle so the caller can
 *                            free that payload. One on ANOTHER base (L adopted a
 *                            merge since; the newer push does not contain the
 *                            pooled progress) is REJECTED (POOLED_OTHER_BASE,
 *                            no rebase): the learner keeps its progress for its
 *                            next push (learner/node.h "Push fates"), which
 *                            pools once the round holding the older one closed.
 *   dl_policy_next_deadline() -> when to call dl_policy_poll() next.
 *   dl_policy_poll()      -> a closed round (contributions + weights + reasons).
 *                            The fragment is then "in flight": later pushes pool
 *                            into its next round, which cannot close until
 *   dl_policy_committed() (or dl_policy_abandon()) for that fragment.
 *
 * When a DECOUPLED round closes (DESIGN "Merge round"):
 *   - never before a quorum of K distinct learners has contributed
 *     (K_eff = min(K, max(1, live learners)), so a fleet that shrank below K
 *     still makes progress; a learner in its final flush counts only with a
 *     contribution in the round or a final push of f still to come,
 *     dl_policy_learner_final);
 *   - once quorum is reached at time q (the K-th distinct push, even while
 *     the previous round of f is in flight), a grace window waits for every
 *     EXPECTED learner WITHOUT a contribution in the round whose next push of
 *     f is PREDICTED before the cap deadline  cap = q + capdur. Expected =
 *     live learners that joined before the round opened; a dead learner
 *     leaves the set at once, but what it already pushed still counts. A
 *     contributor is never waited for: its learner holds its next push of f
 *     until the pooled one is decided (learner/node.h, the hold rule).
 *     capdur = min(grace_cap_ns, tau_steps * step) when H > 0 and the fleet
 *       step time `step` is known; else min(grace_cap_ns, gamma * slack) when
 *       slack is known; else grace_cap_ns. Products are truncated to ns.
 *       step = median over live learners with a rate of 1e9 / rate_L (ns per
 *       inner step, truncated); slack = median over live learners of med_L
 *       (below): the fleet's typical push period. (Not the measured interval
 *       between closes: that feeds back on itself -- a policy that closes
 *       rounds early measures a small slack and keeps closing early.)
 *     Prediction of L for f, by the SCHEDULE when H > 0 and L reported a
 *     rate > 0 (dl_policy_learner_progress), else by INTERVALS:
 *       schedule: learners push f after inner step s when dl_plan_due(s, f, H,
 *         P) (core/plan.h). r = L's reported step, t_r its time, rate_L its
 *         rate; a_f = the step of L's last push of f since it (re)joined: its
 *         step extrapolated to that push's arrival, r + floor((arrival - t_r)
 *         * rate_L), snapped down to the latest step <= it at which f was due
 *         (dloco's learners send a Heartbeat right before every Push, so that
 *         is the push's step even when it left a few steps late or was owed).
 *         next = the smallest s >= max(r, a_f + 1, 1) with dl_plan_due (no
 *         a_f: max(r, 1)); s >= r, not > r, so a push still on the wire after
 *         its Heartbeat is waited for.
 *         point = t_r + (next - r) * 1e9 / rate_L (truncated; it may lie
 *         before the evaluation time: overdue),
 *         margin_L = max(one step of L (1e9 / rate_L, truncated),
 *         mad_k * mad_L when L has an interval): a push leaves after its
 *         step completes, and the heartbeat's rate is a recent average.
 *         A learner with no push history IS predicted: its first push of f is
 *         at step offset_f (or H). With in-phase learners every push of f of
 *         a period is predicted inside the cap of that period's round, so each
 *         period's pushes of f make one round; a learner out of phase by more
 *         than tau_steps (predicted beyond the cap) is not waited for: its push
 *         opens or joins the next round of f and is merged with its staleness
 *         (and its share, below).
 *       intervals: point = last arrival of L's push of f + med_L,
 *         margin_L = max(mad_k * mad_L, med_L / 32) (the floor keeps perfectly
 *         periodic learners, MAD 0, from missing by a nanosecond of jitter);
 *         no interval or no earlier push of f: no prediction.
 *       med_L, mad_L: median and median absolute deviation (ns) of L's last
 *         DL_POLICY_HIST push intervals. An interval is the gap between two
 *         consecutive pushes of the SAME fragment by L; intervals of all
 *         fragments are pooled per learner, since every fragment has the same
 *         period (H inner steps). Medians of an even count are the floor of the
 *         mean of the two middle values.
 *       until = min(point + margin_L, cap).
 *     A learner is waited for iff it has a prediction, point <= cap and until
 *     >= the evaluation time (not already overdue). A learner without a
 *     prediction, or one that is slow (a 1/4-speed learner's point lies a whole
 *     long period ahead), is therefore NOT waited for; its push joins a later
 *     round of f with its staleness and token weight.
 *   - the round closes at max(until) over the waited-for learners
 *     (GRACE_EXPIRED, or CAP when that maximum is the cap); at once when
 *     nobody is waited for: ALL_IN if every expected learner has contributed
 *     (early close), else PREDICTED_NONE. Each push, progress report, death
 *     or join re-evaluates, so the round closes ALL_IN the moment the last
 *     awaited learner arrives or the awaited one dies.
 *   With H = 0 (unknown) progress reports change nothing: every rule above
 *   is the interval one, as before H existed.
 * SYNC: barrier over every REGISTERED learner, dead or alive (no elasticity:
 *   a dead learner stalls the fragment until it comes back or says bye; this
 *   is the baseline the goodput report compares against). SYNC_ELASTIC:
 *   barrier over LIVE learners. Neither uses K, predictions or caps. Learners
 *   that join after a round opened are expected from the next round on.
 *
 * Weights (computed at close): w = tokens^2 / steps * s(staleness),
 * staleness = version the round merges onto - base version of the push.
 * Weights are normalised within a round, so s() alone cannot scale a round
 * of one contribution: that is the share's job.
 *
 * Share (computed at close, any kind; docs/ARCHITECTURE.md "Outer step:
 * share scaling"): the fraction of a full outer step the round applies.
 *   Contributing learners: live learners whose latest POOLED push (before
 *   their first: their joining, which a rejoin of the same id does not move)
 *   is at most DL_POLICY_CONTRIB_PERIODS fleet push periods old (the median
 *   period of the live learners, or H x the fleet's step time; every live
 *   learner while neither is known). An id that registers and heartbeats but
 *   never pushes stops diluting the others' shares after that.
 *   expected = sum over contributing learners L of H * tps_L when H > 0, where tps_L =
 *     tokens / steps of L's latest POOLED push (any fragment; the caller
 *     calls dl_policy_push only for pushes its guards passed, and rejected or
 *     dropped pushes do not count), else L's reported tokens / step (a report
 *     with step > 0 and tokens > 0) but at most the largest pooled tps of a
 *     live learner (a Hello may claim any batch up to max_batch, so an idle
 *     learner's claims could otherwise shrink every share), else the mean tps
 *     of the contributing learners that have one (0 when none has);
 *     when H = 0: sum over contributing learners of the tokens of their latest POOLED
 *     push of f.
 *   share = min(1, sum over contributions of tokens * s(staleness) / expected),
 *     1 when expected is 0.
 *   So over a period in which every live learner contributes once with H
 *   steps' tokens at staleness 0 (const s), the shares of f's rounds sum to 1
 *   however the pushes split into rounds; a single contribution is scaled by
 *   s(its staleness) times its fraction of the fleet's tokens.
 *
 * A push is dropped (learner told to rebase) when its staleness against the
 * version it would be merged onto (current version, +1 while a round of f is
 * in flight) exceeds max_staleness. Versions advance by exactly 1 per merge.
 *
 * Times passed in must be non-decreasing; an earlier time is treated as the
 * latest time seen. Learner ids are caller-chosen stable numbers (the
 * synchronizer's registry index). */
#ifndef DL_SYNCHRONIZER_POLICY_H
#define DL_SYNCHRONIZER_POLICY_H

#include <stddef.h>
#include <stdint.h>

#define DL_POLICY_HIST 16           /* intervals kept per learner and per fragment */
#define DL_POLICY_MAX_LEARNERS 65536 /* hard upper bound of cfg.max_learners */
#define DL_POLICY_NEVER INT64_MAX    /* "no deadline" */
/* fleet push periods without a pooled push after which a live learner stops counting in a share */
#define DL_POLICY_CONTRIB_PERIODS 3

typedef enum {
    DL_POLICY_DECOUPLED = 0,   /* quorum + adaptive grace window ("decoupled", alias "ddiloco") */
    DL_POLICY_SYNC = 1,        /* barrier over all registered learners ("sync") */
    DL_POLICY_SYNC_ELASTIC = 2 /* barrier over live learners ("sync-elastic") */
} dl_policy_kind;

typedef enum {
    DL_POLICY_SFN_CONST = 0, /* s = 1                                   ("const") */
    DL_POLICY_SFN_POLY = 1,  /* s = (1 + staleness)^-a                  ("poly")  */
    DL_POLICY_SFN_HINGE = 2  /* s = 1 if staleness <= b else 1/(a*(staleness-b)+1) ("hinge") */
} dl_policy_sfn;

typedef struct {
    dl_policy_kind kind;
    int quorum;            /* K: distinct learners before a DECOUPLED round may close, [1, max_learners] */
    int64_t grace_cap_ns;  /* absolute cap of the grace window, ns, > 0 */
    double gamma;          /* grace window cap as a fraction of slack, (0, 10] */
    double mad_k;          /* prediction margin in MADs, [0, 100] */
    int64_t max_staleness; /* versions; a staler push is dropped and told to rebase, [0, 1e9] */
    dl_policy_sfn sfn;     /* staleness factor */
    double sfn_a, sfn_b;   /* its parameters: poly a in [0, 64]; hinge a in [0, 1e6], b in [0, 1e9] */
    int max_learners;      /* learner slots (memory bound), [1, DL_POLICY_MAX_LEARNERS] */
    int H;                 /* inner steps per period (push schedule, core/plan.h), [0, 1e6]; 0 = unknown: the
                              interval rules only. Cannot change at runtime */
    double tau_steps;      /* grace slack in inner steps (config row grace_steps), (0, 1e6] */
} dl_policy_cfg;

/* Immediate fate of one push. */
typedef enum {
    DL_POLICY_POOLED = 1,        /* waits in the fragment's open round */
    DL_POLICY_DROPPED_STALE = 2, /* too stale: not merged, learner must rebase */
    DL_POLICY_REJECTED = 3,      /* invalid: see reason */
    DL_POLICY_MERGED = 4         /* (in a closed round) merged with its weight */
} dl_policy_decision;

typedef enum {
    DL_POLICY_OK = 0,
    DL_POLICY_R_STALE = 1,          /* staleness > max_staleness */
    DL_POLICY_R_BAD_STEPS = 2,      /* steps <= 0 */
    DL_POLICY_R_BAD_TOKENS = 3,     /* tokens <= 0 */
    DL_POLICY_R_FUTURE_VERSION = 4, /* base version newer than the global version */
    DL_POLICY_R_NOT_MEMBER = 5,     /* learner unknown or said bye */
    DL_POLICY_R_BAD_FRAGMENT = 6,   /* fragment index out of range */
    DL_POLICY_R_POOLED_OTHER_BASE = 7 /* the learner's pooled push of the fragment is on another base version */
} dl_policy_reason;

typedef enum {
    DL_POLICY_CLOSE_NONE = 0,
    DL_POLICY_CLOSE_ALL_IN = 1,         /* every expected learner contributed (early close / barrier) */
    DL_POLICY_CLOSE_PREDICTED_NONE = 2, /* quorum, and no missing learner predicted before the cap */
    DL_POLICY_CLOSE_GRACE_EXPIRED = 3,  /* predicted learner(s) overdue past their margin */
    DL_POLICY_CLOSE_CAP = 4             /* grace window reached its cap */
} dl_policy_close_reason;

typedef enum {
    DL_POLICY_LEAVE_DEAD = 1, /* liveness lost: stays registered (SYNC keeps waiting for it) */
    DL_POLICY_LEAVE_BYE = 2   /* orderly leave: unregistered */
} dl_policy_leave;

typedef struct {
    dl_policy_decision decision; /* POOLED, DROPPED_STALE or REJECTED */
    dl_policy_reason reason;
    int64_t staleness;   /* against the version it would merge onto; 0 if rejected */
    int rebase;          /* 1: tell the learner to fetch and adopt the global fragment */
    int replaced;        /* 1: replaced this learner's earlier push in the same open round */
    uint64_t replaced_handle; /* handle of that earlier push (caller frees its payload) */
} dl_policy_verdict;

/* One contribution of a closed round; every field goes to the merge record. */
typedef struct {
    uint32_t learner;
    uint64_t handle;        /* caller's handle of the payload */
    int64_t arrival_ns;     /* arrival of the (latest) push */
    uint64_t base_version;  /* global version the delta is relative to */
    int64_t steps, tokens;  /* inner steps / tokens since the learner adopted base_version */
    int64_t staleness;      /* round version - base_version */
    double sfactor;         /* s(staleness) */
    double weight;          /* tokens^2 / steps * sfactor */
    dl_policy_decision decision; /* DL_POLICY_MERGED */
    dl_policy_reason reason;     /* DL_POLICY_OK */
    int n_replaced;         /* earlier pushes of this learner this one superseded in the round */
    int learner_dead;       /* learner was dead (or gone) at close; its push still counts */
} dl_policy_contrib;

typedef struct {
    int fragment;
    uint64_t version;       /* version the merge applies to; commit must produce version + 1 */
    int n;                  /* contributions (distinct learners) */
    const dl_policy_contrib *contribs; /* [n]; valid until committed/abandon for this fragment */
    double weight_sum;
    dl_policy_close_reason reason;
    int64_t opened_ns;      /* first push of the round */
    int64_t quorum_ns;      /* quorum reached (DECOUPLED), else = deadline_ns */
    int64_t cap_ns;         /* cap deadline (DECOUPLED), else DL_POLICY_NEVER */
    int64_t deadline_ns;    /* when the round was due */
    int64_t closed_ns;      /* the poll time that closed it (>= deadline_ns) */
    int n_missing;          /* expected learners that did not contribute */
    /* Share of a full outer step (see "Share" above), computed at close. */
    double scaled_tokens;   /* sum over contributions of tokens * sfactor */
    double expected_tokens; /* expected tokens of a full period of the fragment, 0 when nothing is known */
    double share;           /* min(1, scaled_tokens / expected_tokens); 1 when expected_tokens is 0 */
} dl_policy_round;

typedef struct {
    uint64_t pushes, pooled, replaced, dropped_stale, rejected;
    uint64_t rounds, merged;   /* closed rounds, contributions in them */
    uint64_t close[5];         /* rounds per dl_policy_close_reason */
} dl_policy_stats;

typedef struct dl_policy dl_policy;

/* ---- configuration */
/* Defaults: DECOUPLED, K 1, grace cap 5 s, gamma 0.5, mad_k 3, max_staleness 8,
 * poly a 0.5, 1024 learners, H 0 (unknown), tau_steps 4. */
void dl_policy_cfg_default(dl_policy_cfg *out);
/* 0, or DL_EINVAL with a one-line reason in why (and dl_errmsg()). */
int dl_policy_cfg_check(const dl_policy_cfg *cfg, char *why, size_t cap);
/* Names <-> enums. Unknown names: DL_EINVAL, dl_errmsg() lists the valid ones. */
int dl_policy_kind_parse(const char *name, dl_policy_kind *out);
int dl_policy_sfn_parse(const char *name, dl_policy_sfn *out);
const char *dl_policy_kind_name(dl_policy_kind k);
const char *dl_policy_sfn_name(dl_policy_sfn s);
const char *dl_policy_decision_name(dl_policy_decision d);
const char *dl_policy_reason_name(dl_policy_reason r);
const char *dl_policy_close_name(dl_policy_close_reason c);

/* ---- pure weight functions (staleness >= 0) */
double dl_policy_sfactor(const dl_policy_cfg *cfg, int64_t staleness);
/* tokens^2 / steps * s(staleness); steps, tokens > 0. */
double dl_policy_weight(const dl_policy_cfg *cfg, int64_t steps, int64_t tokens, int64_t staleness);

/* ---- lifetime. cfg is copied; it must pass dl_policy_cfg_check (else DL_EINVAL).
 * All fragments start at version 0. */
int dl_policy_open(const dl_policy_cfg *cfg, int num_fragments, dl_policy **out);
void dl_policy_close(dl_policy **p);
/* Runtime reload (SIGHUP): replace the hyper-parameters that can safely
 * change (quorum, grace cap, gamma, mad_k, tau_steps, max_staleness,
 * staleness function and its parameters). DL_EINVAL (running values
 * untouched) if cfg fails dl_policy_cfg_check or changes kind, max_learners
 * or H. */
int dl_policy_reconfigure(dl_policy *p, const dl_policy_cfg *cfg);
const dl_policy_cfg *dl_policy_get_cfg(const dl_policy *p);

/* Resume: set a fragment's committed version (only while it has no pooled or
 * in-flight round). */
void dl_policy_set_version(dl_policy *p, int fragment, uint64_t version);
uint64_t dl_policy_version(const dl_policy *p, int fragment);

/* ---- membership. join: register (or re-register after bye) and mark live;
 * joining again while registered just marks it live. DL_ERANGE when all
 * max_learners slots hold registered learners (slots of learners that said bye
 * and have nothing pooled are reused). alive/leave: DL_ENOTFOUND for an id that
 * is not registered. A learner that comes back (join/alive after dead) forgets
 * its last arrival times so the outage is not mistaken for a push interval. */
int dl_policy_learner_join(dl_policy *p, uint32_t id, int64_t now);
int dl_policy_learner_alive(dl_policy *p, uint32_t id, int64_t now);
int dl_policy_learner_leave(dl_policy *p, uint32_t id, int64_t now, dl_policy_leave reason);
/* Forget a learner that is dead or left, so its number can be given to a
 * new learner: 0 (also for an unknown id); DL_EINVAL while it is live;
 * DL_EAGAIN while it has pooled pushes (try again after they merged). */
int dl_policy_learner_forget(dl_policy *p, uint32_t id);
/* Progress report of learner id (dloco-sync: every plausible Heartbeat; a
 * learner sends one right before every Push): its latest completed inner
 * step, cumulative tokens, and step rate in steps/s (<= 0, NaN or >= 1e12 =
 * unknown). Feeds the schedule prediction and, capped, the share's tokens
 * per step ("Share");
 * re-evaluates every open round. A step lower than the previous report's (a
 * learner that restarted its count) forgets the steps of its last pushes
 * (a_f above). DL_ENOTFOUND for an id not registered. Does not change
 * liveness. */
int dl_policy_learner_progress(dl_policy *p, uint32_t id, uint64_t step, uint64_t tokens, double steps_per_s,
                               int64_t now);
/* What every Heartbeat did before progress reports were settled lazily: the
 * fleet's step time and every fragment's deadline recomputed now (at the
 * latest time seen). A check for tests: the lazy state must equal it. */
void dl_policy_recompute(dl_policy *p);
/* The head of a push of learner id's final flush came (Push.final, its
 * first frame; whatever its fate), of fragment `frag`, naming in `pending`
 * (ascending, n_pending entries; entries >= P are ignored) the fragments
 * with a push of it still to come (Push.final_pending): its training ended,
 * so no scheduled push of it follows, only those (a fragment it pushed at
 * its last step has none). Until it rejoins or counts its steps again from
 * a lower one (a restart), it is expected in a fragment's rounds, and counts
 * in that fragment's K_eff, only while the fragment is pending -- named in
 * the latest call's list (its pushes arrive in order), or `frag` itself
 * until dl_policy_push of it (a chunked push's body arrives over several
 * loop turns; a round closed in between would miss it) -- or with a
 * contribution in the open round:
 *   K_eff(f) = min(K, max(1, live learners not finishing + finishing ones
 *              that contributed to f's open round or have f pending)).
 * Without it, one learner's last push of f, made after the others had
 * pushed f for the last time, opened a round that waited for them, while
 * they waited, live, for their own last rounds: every flush ran into its
 * timeout (learners out of phase at the end: one restarted mid-run, one
 * whose push was refused or dropped). Without the pending list (older
 * learners send none) a flush's first push made its learner absent from
 * the rounds its later final pushes were bound for: they closed without
 * it, and its last progress of those fragments went in rounds of its own
 * on stale bases (bench/bandwidth.sh at H=64: 2.647 against 2.473).
 * DL_ENOTFOUND for an id not registered. */
int dl_policy_learner_final(dl_policy *p, uint32_t id, int frag, const uint32_t *pending, size_t n_pending,
                            int64_t now);
int dl_policy_live_count(const dl_policy *p);
/* Membership of learner id: the one record of who is live, dead or gone
 * (the synchronizer's registry keeps counters and times, never a copy). */
typedef enum {
    DL_POLICY_MEMBER_NONE = 0, /* never joined (or its slot was reused) */
    DL_POLICY_MEMBER_LIVE = 1,
    DL_POLICY_MEMBER_DEAD = 2, /* liveness lost; still registered */
    DL_POLICY_MEMBER_LEFT = 3  /* said bye */
} dl_policy_member;
dl_policy_member dl_policy_learner_state(const dl_policy *p, uint32_t id);

/* ---- pushes. Returns 0 with *out filled (any decision).
 * A push from a learner marked dead revives it (a push is proof of life). */
int dl_policy_push(dl_policy *p, int fragment, uint32_t id, uint64_t base_version, int64_t steps, int64_t tokens,
                   int64_t now, uint64_t handle, dl_policy_verdict *out);

/* ---- rounds. Earliest time a round is due (<= the time of the last event if
 * one is due already), or DL_POLICY_NEVER. Fragments in flight do not count. */
int64_t dl_policy_next_deadline(const dl_policy *p);
/* 1 and *out filled with the most overdue due round (ties: lowest fragment),
 * or 0 if none is due at `now`. Call it until it returns 0 after every event. */
int dl_policy_poll(dl_policy *p, int64_t now, dl_policy_round *out);
/* The in-flight round of fragment was committed as new_version (= version + 1). */
void dl_policy_committed(dl_policy *p, int fragment, uint64_t new_version, int64_t now);
/* The in-flight round of fragment was not committed (merge or store failed):
 * its contributions are discarded, the version is unchanged. */
void dl_policy_abandon(dl_policy *p, int fragment, int64_t now);

/* ---- introspection (status page, tests) */
/* Prediction of learner id's next push of fragment: 0 with point/margin in ns
 * (either rule above; point may lie before the latest time seen: overdue),
 * DL_ENOTFOUND when there is none (unknown learner; under the interval rule
 * no interval or no earlier push). */
int dl_policy_prediction(const dl_policy *p, uint32_t id, int fragment, int64_t *point_ns, int64_t *margin_ns);
/* Slack in ns (definition above; the same for every fragment), 0 when unknown. */
int64_t dl_policy_slack_ns(const dl_policy *p);
/* Fleet step time in ns (definition above), 0 when unknown or H is 0. */
int64_t dl_policy_step_ns(const dl_policy *p);
void dl_policy_get_stats(const dl_policy *p, dl_policy_stats *out);
/* One line: "frag 3 v12->13 close=all-in n=4 missing=0 wsum=... share=... [id:stale:w ...]". */
void dl_policy_round_format(const dl_policy_round *r, char *buf, size_t cap);

#endif
