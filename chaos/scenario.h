/* A chaos scenario: the INI file dloco-chaos runs (docs/CHAOS.md "Scenario
 * files"), parsed into typed, validated sections, and its fault timeline. */
#ifndef DL_CHAOS_SCENARIO_H
#define DL_CHAOS_SCENARIO_H

#include <stdint.h>
#include <stdio.h>

#include "core/config.h"

#define DL_SC_MAX_DCS 16
#define DL_SC_MAX_LEARNER_SECTIONS 32
#define DL_SC_MAX_SLOTS 128 /* learners, counting the ones churn brings in */
#define DL_SC_MAX_FAULT_SECTIONS 64
#define DL_SC_MAX_FAULTS 4096 /* entries of one timeline */
#define DL_SC_NAME 48

typedef enum {
    DL_FK_LEARNER_KILL,  /* SIGKILL, restarted after duration_s */
    DL_FK_LEARNER_HANG,  /* SIGSTOP, SIGCONT after duration_s */
    DL_FK_LEARNER_SLOW,  /* runs a `value` fraction of the time (SIGSTOP/SIGCONT duty cycle, as a CPU quota does) */
    DL_FK_LEARNER_LEAVE, /* SIGTERM: a graceful leave; the slot is no longer provisioned */
    DL_FK_LEARNER_JOIN,  /* a learner section's join_s: its slot starts */
    DL_FK_CHURN,         /* the target leaves (SIGTERM); a new learner joins its datacenter duration_s later */
    DL_FK_SYNC_KILL,     /* SIGKILL the synchronizer, restarted after duration_s */
    DL_FK_SYNC_HANG,     /* SIGSTOP the synchronizer, SIGCONT after duration_s */
    DL_FK_PARTITION,     /* a datacenter's link down for duration_s */
    DL_FK_BANDWIDTH,     /* its bandwidth is `value` Mbit/s for duration_s */
    DL_FK_DELAY,         /* `value` ms more round-trip time for duration_s (the relay) */
    DL_FK_LOSS,          /* messages dropped with probability `value` (the relay) */
    DL_FK_DUPLICATE,     /* messages sent twice with probability `value` (the relay) */
    DL_FK_REORDER,       /* messages held behind the next with probability `value` (the relay) */
    DL_FK_DISK_EIO,      /* the synchronizer's store writes and syncs fail with EIO, probability `value` (libfiu) */
    DL_FK_DISK_ENOSPC,   /* ... with ENOSPC */
    DL_FK_ROGUE_GARBAGE, /* a rogue client sends `value` garbage messages to the synchronizer */
    DL_FK_ROGUE_REPLAY,  /* the datacenter's relay replays `value` captured learner messages */
    DL_FK_N
} dl_fault_kind;

const char *dl_fault_kind_name(dl_fault_kind k);
/* What a kind's target is: 'l' a learner, 'd' a datacenter, 's' the synchronizer. */
char dl_fault_kind_target(dl_fault_kind k);
/* 1 when the kind lasts (has a duration and an end). */
int dl_fault_kind_lasts(dl_fault_kind k);

typedef struct {
    char name[DL_CFG_STRLEN];
    int64_t seed;
    double duration_s;
    char policy[DL_CFG_STRLEN];
    double eval_every_s;
    int64_t eval_batches;
    char corpus[DL_CFG_STRLEN];
    int64_t n_layer, n_head, n_embd, seq_len, vocab, fragments, H, threads;
    int64_t log_every;
} dl_sc_run;

typedef struct {
    int64_t heartbeat_ms, liveness, quorum, max_staleness, chunk_kb, push_chunk_max_kb;
    char durability[DL_CFG_STRLEN];
    double outer_lr, outer_momentum;
    double restart_delay_s; /* after an exit nobody asked for (a supervisor's restart) */
    char args[DL_CFG_STRLEN]; /* more dloco-sync flags, split on spaces; dloco-sync validates them */
} dl_sc_sync;

typedef struct {
    char name[DL_SC_NAME];
    char dc[DL_CFG_STRLEN];
    int64_t count; /* learners of this section: ids name0..name<count-1>, or name when 1 */
    double speed;  /* --throttle */
    int64_t batch;
    double lr;
    char device[DL_CFG_STRLEN];
    char adopt[DL_CFG_STRLEN];
    double join_s;  /* 0: from the start; else its slot starts then (a join) */
    double leave_s; /* 0: stays; else leaves gracefully then */
    char args[DL_CFG_STRLEN];
} dl_sc_learner;

typedef struct {
    char name[DL_SC_NAME];
    double bandwidth_mbit; /* 0: unshaped */
    double rtt_ms, jitter_ms, loss, duplicate, reorder;
} dl_sc_dc;

typedef struct {
    char name[DL_SC_NAME];
    char kind[DL_CFG_STRLEN];
    char target[DL_CFG_STRLEN]; /* a learner id, a datacenter, "sync", or "*": every target of the kind */
    double at_s;                /* scheduled: when (-1 = not scheduled) */
    double duration_s;          /* scheduled: how long */
    double mtbf_s;              /* random: mean time between failures per target (0 = not random) */
    double repair_s;            /* random: mean (exp), value (fixed) or upper bound (uniform) of the repair time */
    double repair_min_s;        /* uniform: lower bound */
    char repair[DL_CFG_STRLEN]; /* exp|fixed|uniform */
    double start_s, end_s;      /* random: the window failures are drawn in (end 0 = duration - 10 s) */
    double value;               /* the kind's parameter (-1 = its default) */
    int64_t max;                /* random: at most this many per target */
    dl_fault_kind k;            /* parsed kind */
} dl_sc_fault;

/* [sim]: dloco-sim's keys (docs/SIM.md); dloco-chaos ignores them. */
typedef struct {
    char mode[DL_CFG_STRLEN];         /* decoupled|dp|elastic */
    int64_t chips;                    /* 0: one chip per learner slot */
    int64_t learners;                 /* 0: the learner slots */
    double horizon_s;                 /* 0: [run] duration_s */
    double mtbi_s;                    /* per chip; 0: no random interruptions */
    double recovery_s, ckpt_s;        /* dp; restart learners */
    int64_t slice_chips;              /* elastic; resize learners */
    double resize_s, repair_s;
    char learner_fail[DL_CFG_STRLEN]; /* resize|restart */
    double startup_s, restart_s, step_s, step_cv;
    double params, bytes_per_param;
    double grace_steps, grace_cap_s, merge_s, update_s, step_overhead_s;
} dl_sc_sim;

typedef struct {
    char path[DL_CFG_STRLEN];
    dl_sc_sim sim;
    dl_sc_run run;
    dl_sc_sync sync;
    dl_sc_learner learner_defaults;
    dl_sc_dc dc[DL_SC_MAX_DCS];
    int n_dc;
    dl_sc_learner learner[DL_SC_MAX_LEARNER_SECTIONS];
    int n_learner;
    dl_sc_fault fault[DL_SC_MAX_FAULT_SECTIONS];
    int n_fault;
} dl_scenario;

/* One learner slot of the fleet at the start or joining later. */
typedef struct {
    char id[64];
    int section; /* index into scenario.learner */
    int dc;      /* index into scenario.dc */
    double join_s, leave_s;
    int data_shard;
} dl_sc_slot;

/* One fault of the timeline. */
typedef struct {
    int n;
    double at_s;
    dl_fault_kind kind;
    char target[64];
    double duration_s;
    double value;
    char source[DL_SC_NAME + 16];
} dl_sc_event;

typedef struct {
    dl_sc_slot slot[DL_SC_MAX_SLOTS];
    int n_slot;  /* slots declared by learner sections (churn adds more at run time) */
    dl_sc_event ev[DL_SC_MAX_FAULTS];
    int n_ev;
} dl_timeline;

/* Command-line overrides of [run] keys, applied before validation (so
 * every rule sees them): < 0 = not given. */
typedef struct {
    double duration_s;
    int64_t seed;
} dl_sc_overrides;

/* Parse and validate SCENARIO: every value typed and bounded, every
 * reference resolved. Errors name path:line and the key, or the section.
 * ov may be NULL. */
int dl_scenario_load(const char *path, const dl_sc_overrides *ov, dl_scenario *out);
/* Every section and its keys, with type, unit, default, range and help
 * (`dloco-chaos keys`). */
void dl_scenario_usage(FILE *f);
/* Expand the learner sections into slots and draw the fault timeline from the
 * scenario's seed (deterministic: the same file and seed give the same
 * timeline). `faults` 0 leaves only joins and leaves (a failure-free twin). */
int dl_timeline_build(const dl_scenario *sc, int faults, dl_timeline *out);
/* timeline.tsv (docs/CHAOS.md). */
int dl_timeline_write(const dl_timeline *t, const char *path);
void dl_timeline_print(const dl_timeline *t, FILE *f);
int dl_scenario_dc_index(const dl_scenario *sc, const char *name);

#endif
