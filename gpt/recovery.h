/* dloco-learner's recovery file: the trainer's checkpoint (gpt/ckpt.h: parameters, AdamW or GPA state, step,
 * data position) tagged with the run and learner id, and beside it the learner library's state (path.node),
 * copied between steps and written on a thread of its own. */
#ifndef DL_GPT_RECOVERY_H
#define DL_GPT_RECOVERY_H

#include <stddef.h>
#include <stdint.h>

#include "gpt/train.h"

typedef struct dl_recovery dl_recovery;

#define DL_RECOVERY_MIN_S 2.0 /* with a budget: files at most this often (the first one this soon) */

typedef struct {
    const char *path;    /* the file (written as path.tmp, fsynced, renamed); required */
    double every_s;      /* a copy at least this often, seconds; 0 = only at the finish (and every_steps) */
    double budget;       /* > 0: as often as the copies and writes stay within this share of the time (measured
                          * per file), every DL_RECOVERY_MIN_S at most, every_s at least; 0: every every_s */
    int64_t every_steps; /* ... or once this many steps passed since the last, whichever first; 0 = time only */
    int64_t max_step;    /* a file beyond this step (the run's --steps) is refused */
    uint64_t run_tag;    /* dl_recovery_tag: a file of another run or learner is refused */
    const char *id;      /* the learner id, for messages and events */
} dl_recovery_opts;

typedef struct {
    uint64_t writes;    /* files written (the finish included) */
    uint64_t skipped;   /* due copies skipped because the previous file was still being written */
    uint64_t failed;    /* writes that failed (warned; the previous file stays) */
    double copy_s_sum, copy_s_max; /* training-thread seconds spent copying the state (the step path's cost) */
    uint64_t copies;               /* copies taken on the step path */
    double write_s_sum;            /* writer-thread seconds writing + fsyncing */
    int64_t last_step;             /* step of the newest file written; -1 none */
    double interval_s;             /* the time between files now in force (the budget's choice, or every_s) */
    int removed;                   /* dl_recovery_remove removed the file */
} dl_recovery_stats;

/* The tag of (run id, learner id): never 0 (0 marks a plain checkpoint). */
uint64_t dl_recovery_tag(const char *run_id, const char *learner_id);

/* Starts the writer thread. DL_EINVAL (no path, negative intervals, a budget outside [0, 1)). */
int dl_recovery_open(const dl_recovery_opts *o, dl_recovery **out);
void dl_recovery_close(dl_recovery **r); /* waits for a write in progress; safe twice */

/* Resume `tr` from the file when it holds this learner's state. Returns 1
 * resumed (step, optimizer state, data position and parameters), 0 fresh
 * start: no file, or a file refused -- truncated, damaged, not a checkpoint,
 * another run's or learner's, a plain checkpoint, another model or
 * optimizer, a step beyond max_step, a data position beyond the data --:
 * then the reason is in why, the file is moved aside to path.rejected
 * (so the next start does not meet it again), and `tr` is untouched. Never
 * fails otherwise: a learner always starts. */
int dl_recovery_load(dl_recovery *r, dl_trainer *tr, char *why, size_t cap);

/* Before training: allocate the copy's buffer and touch every page (one
 * copy), so the first copy on the step path does not pay for them. 0 or
 * DL_ENOMEM (and the others of dl_trainer_snap_take). */
int dl_recovery_prepare(dl_recovery *r, dl_trainer *tr);

/* After a completed step: when a copy is due and the writer is idle, copy
 * the state (the only cost on the step path) and hand it to the writer.
 * Returns 1 when a copy was handed over, 0 otherwise. */
int dl_recovery_step(dl_recovery *r, dl_trainer *tr);

/* A clean finish: wait for the writer, then write the state now. 0 or the
 * write's error (the previous file stays). */
int dl_recovery_finish(dl_recovery *r, dl_trainer *tr);

/* The run is complete (every step trained): wait for the writer and remove
 * the file, so a later start under the same id is a fresh one. 0, or
 * DL_EIO (warned; a later start meets a file at the last step and trains
 * nothing more). */
int dl_recovery_remove(dl_recovery *r);

/* The learner library's own state (learner/learner_int.h dl_learner_state_copy:
 * fragment bases, versions, unpushed counters, error feedback residuals), copied at the same step as the
 * trainer's and written before it to dl_recovery_learner_path (a restarted
 * learner restores it at join through the option state_path when its step is
 * the file's). fn copies into *buf (grown as needed) on the training thread;
 * write writes a copy to a path atomically, on the writer thread
 * (dl_learner_state_write). */
typedef int (*dl_recovery_copy_fn)(void *ctx, void **buf, size_t *cap, size_t *len);
typedef int (*dl_recovery_write_fn)(const char *path, const void *buf, size_t len);
void dl_recovery_set_learner(dl_recovery *r, dl_recovery_copy_fn fn, dl_recovery_write_fn write, void *ctx);
const char *dl_recovery_learner_path(const dl_recovery *r); /* path.node */

/* XXH64 of the optimizer state (m, v, and y for GPA) of `tr`: the field
 * `moments_hash` of the recovery events, so a test sees the state come back. */
uint64_t dl_recovery_moments_hash(dl_trainer *tr);

void dl_recovery_get_stats(dl_recovery *r, dl_recovery_stats *out);

#endif
