/* The synchronizer daemon: a libev loop around a ZeroMQ ROUTER, the learner
 * registry and liveness, the merge policy, and a worker thread that merges,
 * applies the outer step and commits to LMDB so the loop never blocks. */
#ifndef DL_SYNCHRONIZER_SYNC_H
#define DL_SYNCHRONIZER_SYNC_H

#include <stdint.h>
#include <stdio.h>

#include "learner/gpt.h"
#include "synchronizer/merge.h"
#include "synchronizer/policy.h"

typedef struct {
    char bind[256];        /* ZeroMQ endpoint to bind, e.g. tcp://127.0.0.1:5555 */
    char store[256];       /* LMDB store directory */
    char run_id[65];
    dl_gpt_config model;
    int P;                 /* fragments */
    int H;                 /* inner steps between two pushes of one fragment */
    uint64_t seed;         /* init of a new run's global model */
    dl_policy_cfg policy;
    dl_merge_opts merge;
    int heartbeat_ms;      /* both directions */
    int rebase_ms;         /* a learner silent longer than this must fetch before pushing again */
    int liveness;          /* missed heartbeats before a learner is dead */
    int durability;        /* DL_STORE_SYNC | DL_STORE_PERIODIC */
    int sync_every_ms;     /* periodic durability: fsync interval */
    int status_every_ms;   /* progress line interval (0 = off) */
    uint64_t max_msg_bytes;
    char config_text[4096]; /* the effective config, recorded in the store */
} dl_sync_cfg;

typedef struct dl_sync dl_sync;

/* What SIGHUP may change at runtime (DESIGN: the merge hyper-parameters that
 * can safely change). */
typedef struct {
    dl_policy_cfg policy;
    dl_merge_opts merge;
} dl_sync_tunables;

/* Called on SIGHUP with the running values; fills *out from the config file
 * and returns 0, or returns an error (dl_errmsg says why) to keep the running
 * values. */
typedef int (*dl_sync_reload_fn)(void *ctx, const dl_sync_tunables *cur, dl_sync_tunables *out);
void dl_sync_set_reload(dl_sync *s, dl_sync_reload_fn fn, void *ctx);

/* Open the store (creating or resuming the run), bump the epoch and bind.
 * Errors carry a message: DL_EMISMATCH for a store of another run, DL_ENET
 * for a bind failure, ... */
int dl_sync_open(const dl_sync_cfg *cfg, dl_sync **out);
/* Run the loop until SIGINT/SIGTERM (or dl_sync_stop). Returns 0. */
int dl_sync_run(dl_sync *s);
/* Print the end-of-run summary (merges, staleness, per-learner bytes). */
void dl_sync_summary(dl_sync *s, FILE *f);
void dl_sync_close(dl_sync **s);
/* The endpoint actually bound (resolves tcp://...:* ports). */
const char *dl_sync_endpoint(const dl_sync *s);

#endif
