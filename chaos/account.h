/* The accounting of one chaos run (docs/CHAOS.md "Goodput, badput and the
 * ledger"): a run directory's event logs and timeline.tsv in, learner time
 * in buckets, the token ledger, merges, losses, faults and links out.
 *
 * Inputs (docs/CHAOS.md "A run directory"): events-chaos.log (required: its
 * run_start is time 0), events-sync.log, every events-<id>.log, timeline.tsv.
 * All times below are seconds since run_start's ts.
 *
 * ---- Learner time (learner-seconds)
 * A slot is provisioned from its slot_begin to its slot_end (a graceful
 * leave, or the run's end; a slot without slot_end closes at the run's end).
 * Every provisioned second is exactly one of, the first that applies:
 *   down          no process of the slot runs (before its first proc_start,
 *                 between a proc_exit and the next proc_start), or the
 *                 slot's state is `hung` (SIGSTOP)
 *   startup       the slot's first incarnation, from proc_start until that
 *                 pid's `ready` (or its exit when it never got ready)
 *   recovery      the same for every later incarnation
 *   idle_barrier  inside a `barrier_wait` of a running pid ([ts - waited_ms, ts])
 *   compute       the rest, split by what became of it:
 *     goodput        sum of the synchronizer's merge_contrib compute_s of
 *                    the slot's id, / P (each push reports the training
 *                    seconds behind one fragment's delta: P fragments count
 *                    every second P times)
 *     dropped_stale  sum of push compute_s with decision=dropped_stale, / P
 *                    (a rejected push is not counted: the learner keeps the
 *                    progress and its next push reports it again)
 *     wasted         compute - goodput - dropped_stale: killed before
 *                    pushing, discarded by an adopt, lost with a crashed
 *                    synchronizer, unpushed at the end
 * The wasted bucket by cause (wasted_s[], summing to it; estimates from the
 * learners' own events, scaled down together when they exceed it):
 *     killed     per incarnation ended by a signal: for each fragment, the
 *                time from its last push (or the incarnation's ready) to
 *                the exit, / P: trained and never pushed
 *     discarded  fragment-tokens its adopts threw away (learner_summary
 *                discarded_tokens; a killed incarnation's push_returned
 *                discarded_tokens) x the slot's compute seconds per
 *                fragment-token (compute / (P x tokens processed))
 *     unpushed   the same tail as `killed` for incarnations that ended
 *                cleanly or ran past the end: unpushed at the end
 *     other      the rest: pushed but never merged (rejected for good,
 *                lost with a crashed synchronizer or on the wire)
 * A slot is flagged low_goodput when its goodput share is below
 * DL_ACCT_LOW_GOODPUT x the median share of the fleet's slots.
 * Merges after the slot's end (the final flush) still count. When goodput +
 * dropped_stale exceed compute (clocks of different processes, or a push
 * reporting time from before the window), both are scaled down so the
 * buckets still sum to provisioned, and the excess is skew_s.
 * frac[b] = bucket_s[b] / provisioned_s, summing to 1 (checked to 1e-9);
 * availability_bound = (provisioned - down) / provisioned; goodput_over_bound
 * = frac[goodput] / availability_bound. NaN where a denominator is 0.
 *
 * ---- Tokens (fragment-tokens, docs/FAILURE_MODEL.md "The push ledger")
 * From the synchronizer's `ledger` events, one per incarnation that exited
 * cleanly; a SIGKILLed incarnation writes none and its ledger is not
 * recoverable (sync_crashes counts them). Totals sum the ledger events. A
 * ledger balances when applied + dropped_stale + rejected + lost + discarded
 * + outstanding == processed + carried_in, pooled == carried == 0 and
 * overclaim == 0; ledger_balanced is 1 when every ledger event balances, 0
 * at the first that does not (ledger_mismatch says which and how), -1 when
 * there is no ledger event to check. token_goodput = applied / the sum of
 * the six persisted states. When the run directory has check.out (`dloco
 * check` on the store after the run), store_tokens[] holds the store's
 * ledger (the six states in that order) and store_token_goodput its applied
 * share: it covers every synchronizer incarnation, a SIGKILLed one up to its
 * last commit, which the ledger events miss.
 *
 * Not a hot path: runs once per run, after it. */
#ifndef DL_CHAOS_ACCOUNT_H
#define DL_CHAOS_ACCOUNT_H

#include <stdint.h>

/* Time buckets, in priority order for the first four. */
enum {
    DL_ACCT_DOWN,
    DL_ACCT_STARTUP,
    DL_ACCT_RECOVERY,
    DL_ACCT_IDLE_BARRIER,
    DL_ACCT_GOODPUT,
    DL_ACCT_DROPPED_STALE,
    DL_ACCT_WASTED,
    DL_ACCT_NBUCKETS
};
/* "down", "startup", "recovery", "idle_barrier", "goodput", "dropped_stale", "wasted". */
const char *dl_account_bucket_name(int bucket);

/* Causes of the wasted bucket (the header comment). */
enum { DL_ACCT_WASTE_KILLED, DL_ACCT_WASTE_DISCARDED, DL_ACCT_WASTE_UNPUSHED, DL_ACCT_WASTE_OTHER, DL_ACCT_NWASTE };
/* "killed", "discarded", "unpushed", "other". */
const char *dl_account_waste_name(int cause);

/* Pushes the synchronizer did not pool, by its push event's decision and,
 * for `rejected`, the reason's kind. */
enum {
    DL_ACCT_REF_STALE,    /* decision=dropped_stale */
    DL_ACCT_REF_BUSY,     /* decision=busy: pool full, commits backing off */
    DL_ACCT_REF_DUPLICATE,
    DL_ACCT_REF_NORM,     /* rejected: the norm guard ("norm ...") */
    DL_ACCT_REF_COUNTERS, /* rejected: implausible counters ("tokens ..." / "steps ...") */
    DL_ACCT_REF_REPLAY,   /* rejected: a replayed base ("base version ...") */
    DL_ACCT_REF_CHUNK,    /* rejected: chunks out of order, lost or duplicated on the way ("chunk ...") */
    DL_ACCT_REF_OTHER,    /* rejected for any other reason */
    DL_ACCT_NREFUSALS
};
/* "dropped_stale", "busy", "duplicate", "norm", "counters", "replay", "chunk_order", "rejected_other". */
const char *dl_account_refusal_name(int kind);

/* A slot is flagged low_goodput below this share of the fleet's median goodput share. */
#define DL_ACCT_LOW_GOODPUT 0.5

/* Slot states as the harness's `state` events name them. */
enum {
    DL_ACCT_UP,
    DL_ACCT_SLOW,
    DL_ACCT_PARTITIONED,
    DL_ACCT_HUNG,
    DL_ACCT_DEAD,
    DL_ACCT_LEFT,
    DL_ACCT_UNKNOWN, /* a name this reader does not know */
    DL_ACCT_NSTATES
};
const char *dl_account_state_name(int state);

/* Staleness histogram bins: 0, 1, ..., DL_ACCT_STALE_BINS - 2, and the last
 * bin holds everything at or above DL_ACCT_STALE_BINS - 1. */
#define DL_ACCT_STALE_BINS 33

/* One slot's or the fleet's time (learner-seconds). */
typedef struct {
    double provisioned_s;
    double bucket_s[DL_ACCT_NBUCKETS];
    double frac[DL_ACCT_NBUCKETS]; /* bucket_s / provisioned_s; NaN when nothing was provisioned */
    double compute_s;              /* goodput + dropped_stale + wasted (before any split) */
    double skew_s;                 /* goodput + dropped_stale beyond compute, scaled away (0 normally) */
    double hang_credit_s;          /* merged compute taken off for the slot's hung time (a SIGSTOP inside a step
                                      inflates that step's measured time and the pushes that carry it) */
    double availability_bound;     /* (provisioned - down) / provisioned */
    double goodput_over_bound;     /* frac[goodput] / availability_bound */
} dl_account_time;

typedef struct {
    double t_s;
    int state; /* DL_ACCT_UP ... */
} dl_account_state_change;

typedef struct {
    int slot;          /* the harness's slot number */
    char id[64];       /* the learner id */
    char dc[64];       /* its datacenter */
    double speed;      /* throttle, 1 = full */
    int64_t batch;
    double begin_s, end_s;
    char end_reason[16]; /* leave | run_end | none (no slot_end: closed at the run's end) */
    int incarnations;    /* proc_starts */
    int killed;          /* proc_exits by a signal */
    dl_account_time time;
    double wasted_s[DL_ACCT_NWASTE]; /* time.bucket_s[WASTED] by cause */
    double tokens;       /* tokens its learner processed, every incarnation (each one's last reported total) */
    int low_goodput;     /* 1: goodput share < DL_ACCT_LOW_GOODPUT x the fleet's median */
    /* the synchronizer's view of the slot's id (events-sync.log, while the slot is provisioned) */
    int deaths;          /* learner_dead: declared dead (liveness lost) */
    int joins;           /* learner_join: Hellos welcomed */
    int rejoins;         /* joins after the first */
    int refetches;       /* of the rejoins, those welcomed with must_fetch=1: the whole model fetched again */
    int64_t refused[DL_ACCT_NREFUSALS]; /* its pushes not pooled, by kind */
    int n_states;
    dl_account_state_change *states; /* [n_states], by time */
} dl_account_slot;

/* A row of timeline.tsv, and whether the run applied it. */
typedef struct {
    int n;
    double at_s, duration_s, value;
    char kind[48], target[64], source[96];
    int planned; /* at_s < the run's duration_s: it had to happen */
    int applied; /* planned, and a begin/instant event (and an end when due before the run's end) was seen */
    char why[48]; /* why a planned fault is not applied: "no begin event", "no end event"; "" otherwise */
} dl_account_fault;

/* A harness `fault` event. */
typedef struct {
    int n;
    double t_s, value;
    char kind[48], target[64], phase[12], detail[160];
} dl_account_fault_event;

typedef struct {
    double elapsed_s; /* the event's own elapsed_s */
    int64_t merges;
    double val_loss;  /* may be NaN */
} dl_account_eval;

/* The synchronizer's own periodic evaluation (its `eval` events). */
typedef struct {
    double t_s;       /* since the run start */
    int64_t version;  /* sum of the fragment versions it read */
    double val_loss;
    int64_t seqs;
} dl_account_sync_eval;

/* A committed merge (synchronizer `merge`). */
typedef struct {
    double t_s;
    int frag;
    int64_t version;
    int n;              /* contributions */
    int alive;          /* slots provisioned and up|slow|partitioned at t_s */
    int in_run;         /* some slot was provisioned at t_s (counts in the liveness means) */
    double compute_s;   /* the merged pushes' training seconds */
    double staleness_mean;
    uint64_t tokens;
    double goodput;     /* cumulative sum of merge compute_s / P up to this merge / provisioned learner-s so far; NaN before any */
} dl_account_merge;

typedef struct {
    double t_s, up_bytes, down_bytes; /* cumulative */
} dl_account_link_sample;

/* A datacenter: its `dc` event and its `link` samples. */
typedef struct {
    char name[64], mode[16];
    double bandwidth_mbit, rtt_ms;
    int64_t learners;
    int n_samples;
    dl_account_link_sample *samples; /* [n_samples], by time */
    double up_bytes, down_bytes;     /* the last cumulative sample */
    double mean_up_Bps, mean_down_Bps; /* (last - first) / time between them; NaN with < 2 samples */
    double peak_up_Bps, peak_down_Bps; /* largest rate between consecutive samples */
} dl_account_link;

/* One synchronizer `ledger` event. */
typedef struct {
    double t_s;
    int64_t pid;
    int incarnation; /* from the harness's proc_start of that pid; -1 unknown */
    uint64_t applied, dropped_stale, rejected, lost, discarded, outstanding;
    uint64_t pooled, carried, processed, overclaim, carried_in;
    int balanced;
} dl_account_ledger;

typedef struct dl_account {
    /* run_start */
    char label[64], policy[32], scenario[128], seed[32];
    int baseline, netns;
    double duration_s, eval_every_s;
    int fragments; /* P */
    int slots_at_start, dcs;
    double end_s;  /* run_end's time; without one the last harness event's (a note says so) */
    double wall_s; /* run_end wall_s; NaN without one */

    /* learner time */
    dl_account_time fleet; /* every slot summed */
    double wasted_s[DL_ACCT_NWASTE]; /* fleet.bucket_s[WASTED] by cause */
    double median_goodput;  /* median over slots with provisioned time of their goodput share; NaN without any */
    int low_goodput_slots;  /* slots flagged low_goodput */
    int n_slots;
    dl_account_slot *slots; /* [n_slots], in slot_begin order */
    double unattributed_s;  /* merge_contrib / dropped compute_s / P of ids no slot has (not in any bucket) */

    /* tokens */
    uint64_t applied, dropped_stale, rejected, lost, discarded, outstanding;
    uint64_t processed, carried_in, overclaim; /* sums over the ledger events */
    double token_goodput;   /* applied / sum of the six states; NaN when 0 */
    int store_ledger;       /* 1: store_tokens[] was read from check.out */
    uint64_t store_tokens[6]; /* the store's ledger: applied, dropped_stale, rejected, lost, discarded, outstanding */
    double store_token_goodput; /* store_tokens[0] / their sum; NaN without the store's ledger or when 0 */
    int ledger_balanced;    /* 1, 0 or -1 (no ledger event) */
    char ledger_mismatch[256];
    int n_ledgers;
    dl_account_ledger *ledgers;
    int sync_incarnations;  /* harness proc_start role=sync */
    int sync_crashes;       /* proc_exit role=sync signal=9 */

    /* merges and quality */
    int merges;
    dl_account_merge *merge; /* [merges], by time */
    int64_t contributions;   /* merge_contrib events */
    int64_t staleness_hist[DL_ACCT_STALE_BINS];
    double staleness_mean;   /* over merge_contrib; NaN without any */
    double mean_alive, mean_participation; /* over merges with in_run; NaN without any */
    int n_evals;
    dl_account_eval *evals;  /* [n_evals], in file order */
    double final_val_loss;   /* the last eval's; NaN without one */
    int n_sync_evals;
    dl_account_sync_eval *sync_evals; /* [n_sync_evals]: events-sync.log eval events, in file order */
    double final_sync_val_loss; /* the last one's; NaN without one */

    /* links */
    int n_links;
    dl_account_link *links;

    /* faults */
    int n_faults;
    dl_account_fault *faults; /* timeline.tsv rows */
    int n_fault_events;
    dl_account_fault_event *fault_events;
    int faults_planned, faults_applied;
    int n_missing;
    int *missing;         /* [n_missing]: indices into faults[] of planned faults not applied */
    int faults_unplanned; /* fault events whose n is no timeline row */

    /* the end */
    int check_ok;        /* 1, 0; -1 without a check event */
    char check_detail[256];
    int64_t unplanned_exits; /* run_end's; -1 without one */

    /* reading */
    int64_t lines_garbage, lines_too_long, lines_torn, lines_cut; /* over every file */
    int64_t events_unmatched; /* learner events of a pid no harness proc_start names, ignored */
    int n_notes;
    char **notes; /* human-readable warnings: crashes, skipped lines, skew, missing files */
} dl_account;

/* Account the run in `run_dir`. Returns 0 and *out, or DL_ENOTFOUND /
 * DL_EIO (events-chaos.log cannot be read) or DL_EFORMAT (no run_start, or
 * one without fragments >= 1) with the reason in dl_errmsg(). A missing
 * events-sync.log, learner log or timeline.tsv is a note, not a failure. */
int dl_account_run(const char *run_dir, dl_account **out);
/* Free *a and NULL it; safe on NULL and twice. */
void dl_account_close(dl_account **a);

#endif
