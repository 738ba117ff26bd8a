/* One chaos run: a synchronizer and its learners as real processes, the
 * datacenters' links and relays, the fault timeline applied on schedule,
 * every process's events collected in the run directory. */
#ifndef DL_CHAOS_RUN_H
#define DL_CHAOS_RUN_H

#include "chaos/scenario.h"

typedef struct {
    const dl_scenario *sc;
    const dl_timeline *tl; /* a failure-free twin gets one built with faults = 0 */
    const char *policy;    /* decoupled | sync-elastic | sync */
    const char *label;     /* the run directory's name, e.g. "sync" or "decoupled-baseline" */
    int baseline;
    const char *dir;       /* the run directory (created) */
    const char *bin;       /* build directory: synchronizer/dloco-sync, learner/dloco-learner, tools/dloco */
    const char *self;      /* this program (for the rogue client's process) */
    int netns;             /* datacenters as namespaces (else loopback, relay only) */
    int tag;               /* keeps namespaces and addresses of concurrent runs apart */
} dl_chaos_run_cfg;

/* Runs the scenario once. 0 when it ran to its end (whatever the faults
 * did); an error when it could not start or was interrupted (SIGINT/SIGTERM
 * to the harness: everything it started is stopped, the namespaces go). */
int dl_chaos_run(const dl_chaos_run_cfg *cfg);

/* Set by the harness's SIGINT/SIGTERM handler. */
extern volatile int dl_chaos_interrupted;

#endif
