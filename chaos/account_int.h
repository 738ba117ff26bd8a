/* The chaos accounting's private parts (chaos/account.h is the API): the
 * state of one accounting, shared by the readers of the run's files
 * (account_read.c) and the sweep and totals (account.c). */
#ifndef DL_CHAOS_ACCOUNT_INT_H
#define DL_CHAOS_ACCOUNT_INT_H

#include "chaos/account.h"

#include <stddef.h>
#include <stdint.h>

/* Runs of more fragments than this do not track each fragment's latest push
 * (killed and unpushed then count as other). */
#define DL_ACCT_MAX_TRACKED_P 65536

/* Grow arr (n used, cap allocated) so one more element fits. */
#define GROW(arr, n, cap)                                                                                         \
    do {                                                                                                          \
        if ((n) >= (cap)) {                                                                                       \
            (cap) = (cap) ? 2 * (cap) : 16;                                                                       \
            (arr) = dl_xrealloc((arr), (size_t)(cap) * sizeof *(arr));                                            \
        }                                                                                                         \
    } while (0)

/* A learner process, from the harness's proc_start / proc_exit. */
typedef struct {
    int slot;     /* index into a->slots */
    int64_t pid;
    int first;    /* the slot's first incarnation: its start-up is `startup`, later ones `recovery` */
    int killed;   /* it exited by a signal */
    double start, exit, ready; /* exit, ready: NaN when none */
    double *lastpush;          /* [P] time of each fragment's latest push (NaN: none); NULL before its first */
    double tokens;             /* its latest reported token total (step, learner_summary) */
    double disc_summary;       /* learner_summary discarded_tokens (fragment-tokens); NaN without a summary */
    double disc_returned;      /* sum of push_returned discarded_tokens */
} incarn;

/* A barrier wait of an incarnation. */
typedef struct {
    int inc;
    double t0, t1;
} span;

typedef struct {
    int64_t pid;
    int incarnation;
    double start, exit;
    int64_t code, signal;
    int ledgers; /* ledger events of this pid */
} sync_inc;

typedef struct {
    dl_account *a;
    const char *dir;
    int64_t ts0;
    int have_run_end;
    double last_t; /* the latest harness event */
    incarn *inc;
    int n_inc, cap_inc;
    span *bar;
    int n_bar, cap_bar;
    sync_inc *sinc;
    int n_sinc, cap_sinc;
    double *goodput_raw, *dropped_raw; /* per slot, learner-s (already / P) */
    int cap_sync_evals;
    int cap_slots, cap_ledgers, cap_merges, cap_evals, cap_links, cap_faults, cap_fev, cap_notes;
    int *cap_states;  /* per slot */
    int *cap_samples; /* per link */
} ctx;

/* A note for the report (printf-style). */
void dl_acct_note(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Copy a string, NULL as "". */
void dl_acct_cpy(char *dst, size_t cap, const char *src);
/* Seconds since the run's start of an event's ts (ns). */
double dl_acct_rel(const ctx *c, int64_t ts);
/* A state's index by its name (DL_ACCT_UNKNOWN when none). */
int dl_acct_state_of(const char *name);

/* The readers (account_read.c), each filling c->a and the ctx: the
 * harness's events-chaos.log (DL_E* when it cannot be read), timeline.tsv,
 * events-sync.log, and every events-<id>.log of the learners. */
int dl_acct_read_chaos(ctx *c);
void dl_acct_read_timeline(ctx *c);
int dl_acct_read_sync(ctx *c);
int dl_acct_read_learners(ctx *c);

#endif
