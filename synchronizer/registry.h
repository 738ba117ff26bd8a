/* The synchronizer's learner registry: learner id -> slot in a hash table,
 * and per learner the counters and times the loop keeps (never liveness:
 * the merge policy is the one owner of live / dead / left). */
#ifndef DL_SYNCHRONIZER_REGISTRY_H
#define DL_SYNCHRONIZER_REGISTRY_H

#include <stdint.h>

#include "proto/wire.h"

/* One learner the synchronizer has heard from in this process. Slot indices
 * are stable for the life of the registry: they are the learner numbers the
 * merge policy and the push ledger use. */
typedef struct {
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    int64_t last_seen_ns;    /* monotonic ns of its last valid message */
    int64_t first_seen_wall; /* wallclock ns of its first Hello */
    uint64_t step, tokens;   /* from its latest Heartbeat (or Bye): inner step, tokens processed since start */
    double steps_per_s;      /* from its latest Heartbeat */
    uint64_t hellos, pushes, merged, dropped, rejected, tokens_applied; /* counters, fragment-tokens */
    uint64_t bytes_in, bytes_out;      /* frames, bytes (headers approximated) */
    uint64_t last_push_tokens;         /* tokens of its latest push: its expected share of a round */
} dl_registry_learner;

typedef struct dl_registry dl_registry;

/* A registry of at most `max` learners (>= 1). */
int dl_registry_open(int max, dl_registry **out);
void dl_registry_close(dl_registry **r); /* safe on NULL and twice */

/* Slot of `id`, or -1 when unknown. O(1) expected. */
int dl_registry_find(const dl_registry *r, const char *id);
/* Slot of `id`, adding it (zeroed, first_seen_wall = now_wall) when unknown.
 * DL_ERANGE when the registry already holds `max` learners. */
int dl_registry_add(dl_registry *r, const char *id, int64_t now_wall);
/* Slots in use are 0 .. dl_registry_count()-1. */
int dl_registry_count(const dl_registry *r);
int dl_registry_max(const dl_registry *r);
dl_registry_learner *dl_registry_get(dl_registry *r, int slot);
const dl_registry_learner *dl_registry_cget(const dl_registry *r, int slot);

#endif
