/* The sync timing of a networked dloco-learner (learner/timing.h, learner/pressure.h, docs/SYNC_TIMING.md):
 * its rows across options, the --pressure source, the trace files in and out, and the node's due callback. */
#ifndef DL_GPT_PUSHTIMING_H
#define DL_GPT_PUSHTIMING_H

#include <stdint.h>
#include <stdio.h>

#include "gpt/options.h"
#include "learner/pressure.h"
#include "learner/timing.h"

typedef struct {
    const learner_cfg *cfg;
    dl_timing_kind kind;
    dl_timing *t;      /* opened once H is known (after the Welcome); NULL: dl_plan_due */
    dl_pressure *src;  /* --pressure, or NULL */
    FILE *trace;       /* --timing_trace_out */
    int *counts;       /* --timing_trace_in: [P] push decisions per fragment */
    double *ptrace;    /* its pressure per step (unknown = 0) */
    int64_t tsteps;
    int P, on; /* on: the node asks dl_pushtiming_due (not fixed, or a trace or a pressure source wanted) */
    dl_pressure_sample last;
} dl_pushtiming;

/* Before joining: the sync timing rows across options; opens --pressure and reads --timing_trace_in (a file
 * of another run's fragments or steps, or not in the format, is refused naming the line). Returns 0 or a
 * DL_E* code naming the option; *tc is to be finished either way (dl_pushtiming_finish). */
int dl_pushtiming_prepare(const learner_cfg *cfg, int P, dl_pushtiming *tc);
/* After the Welcome: the policy for the synchronizer's H (when tc->on). */
int dl_pushtiming_start(dl_pushtiming *tc, int P, int H);
/* After each step, before the library's step: poll the pressure and feed the policy (and the trace). */
void dl_pushtiming_step(dl_pushtiming *tc, int64_t step, double loss);
/* dl_learner_ext.due: 1 when fragment p is to be pushed at step (the policy, else the fixed schedule). */
int dl_pushtiming_due(void *ctx, int64_t step, int p, int H);
/* At the end (step = the last step trained): the trace's end line, the pressure_summary event; frees *tc. */
void dl_pushtiming_finish(dl_pushtiming *tc, int64_t step);

#endif
