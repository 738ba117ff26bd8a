/* The synchronizer's learner registry: learner id -> slot in a hash table,
 * and per learner the connection (route) it speaks on and the counters and
 * times the loop keeps (never liveness: the merge policy is the one owner of
 * live / dead / left). */
#ifndef DL_SYNCHRONIZER_REGISTRY_H
#define DL_SYNCHRONIZER_REGISTRY_H

#include <stdint.h>

#include "proto/wire.h"

#define DL_REGISTRY_BASES 8
typedef struct {
    uint64_t version;
    int64_t ns; /* monotonic */
} dl_registry_base;

/* One learner the synchronizer has heard from in this process. A slot index
 * is the learner number the merge policy, the push ledger and the guards use;
 * it stays the learner's until dl_registry_remove (the loop reclaims slots of
 * learners that left or died, see admit.c), after which a new learner may get
 * it. */
typedef struct {
    int used;                /* 0: a free slot (removed; dl_registry_add reuses it) */
    char id[DL_WIRE_LEARNER_ID_MAX + 1];
    /* The connection the learner speaks on: libzmq's routing id of it on the
     * ROUTER (binary, never printed). Messages naming this learner from any
     * other connection are refused; 0 bytes = none (cut off, or not yet). */
    uint8_t route[DL_WIRE_ROUTING_ID_MAX];
    size_t route_len;
    char user[DL_WIRE_USER_ID_MAX + 1]; /* CURVE: the ZAP User-Id of that connection ("" without auth) */
    dl_wire_queue *outq;     /* bytes queued in libzmq for that connection (a new one per connection) */
    int64_t outq_busy_ns;    /* monotonic ns since when outq has been non-empty (0 = empty at the last look) */
    int64_t last_seen_ns;    /* monotonic ns of its last valid message */
    int64_t left_ns;         /* monotonic ns it was declared dead / said bye (0 while live) */
    int64_t first_seen_wall; /* wallclock ns of its first Hello */
    int64_t hello_ns;        /* monotonic ns of its latest Hello */
    uint32_t batch;          /* sequences per step it declared at Hello (0 = not declared) */
    uint64_t tps;            /* a manifest learner's tokens-per-step bound (its Hello claim, or the run's
                                max_tokens_per_step when none); 0: a GPT-2 learner, bound batch x seq_len */
    uint64_t instance;       /* Hello.instance of its latest welcomed Hello: which process holds the id (0 = older learner) */
    uint32_t max_chunk;      /* largest Update chunk it takes, bytes (Hello.max_chunk_bytes; 0 = whole fragments) */
    uint64_t step, tokens;   /* from its latest Heartbeat (or Bye): inner step, tokens processed since start */
    double steps_per_s;      /* from its latest Heartbeat */
    double train_loss;       /* Push.loss of its latest push (the learner's recent training loss; NaN: none yet);
                                shown, never trusted */
    uint64_t hellos, pushes, merged, dropped, rejected, tokens_applied; /* counters, fragment-tokens */
    uint64_t bytes_in, bytes_out;      /* frames, bytes (headers approximated) */
    uint64_t last_push_tokens;         /* tokens of its latest accepted push: its expected share of a round */
    uint64_t last_staleness;           /* staleness of its latest merged push, versions */
    int64_t chunk_gap_ns;              /* mean interval between the chunks of its latest complete chunked push,
                                          ns (0: none yet): how long its stalled pushes are waited for */
    double up_bytes_s;                 /* its uplink's rate over that push's chunks after the first, bytes/s (0:
                                          none yet): how long its heartbeats may wait behind its own chunks */
    uint32_t push_chunk;               /* the push chunk size it was told last (Welcome, then Ack.chunk_bytes),
                                          bytes: chunk_bytes at its Hello, resized from its measured uplink after
                                          each chunked push (uplink.c push_chunk_resize) */
    /* [P * DL_REGISTRY_BASES]: per fragment a ring of the versions this
     * learner was given (Update sent, or held at Hello) and when: a push from
     * base v can have accumulated steps only since v reached the learner. */
    dl_registry_base *bases;
    uint32_t *nbases;        /* [P] records written to each ring */
    uint8_t *owed;           /* [P] 1 = an Update of this fragment is owed (deferred by the outbound bounds) */
    uint64_t *given;         /* [P] version + 1 of the last Update of p sent whole on this connection since its
                                latest Hello (0 = none, or a Fetch / rebase of p asked for it again): the version
                                it holds exactly, onto which a delta Update applies (dl_registry_given) */
    int64_t *pushed_ns;      /* [P] monotonic ns the base of its latest push of p reached it (0 = none): that
                                push was made later, and a keep learner's next push carries the steps since,
                                which can be older than the base it adopted meanwhile (an outage's steps
                                carried onto a newer version) */
    double push_elapsed_s;   /* the push being taken in (one at a time): seconds its learner had for its steps,
                                as the counter check measured them (uplink.c push_head); the norm guard's
                                step cap grows with it */
    int n_owed;
    int64_t owed_since_ns;   /* monotonic ns the oldest owed update became owed */
    int64_t put_ns;          /* monotonic ns of its last store record (learner_put), 0 = none */
    int put_dirty;           /* a record was skipped by the one-a-second limit */
    uint64_t put_sig;        /* the counters' sum at that record: the tick writes again when they moved */
    int64_t probe_ns;        /* monotonic ns its connection was last probed (route_connected) */
    int probe_ok;            /* that probe's answer */
} dl_registry_learner;

typedef struct dl_registry dl_registry;

/* A registry of at most `max` learners (>= 1), each with P (>= 1) fragments. */
int dl_registry_open(int max, int P, dl_registry **out);
void dl_registry_close(dl_registry **r); /* safe on NULL and twice */

/* Slot of `id`, or -1 when unknown. O(1) expected. */
int dl_registry_find(const dl_registry *r, const char *id);
/* Slot of `id`, adding it (zeroed, first_seen_wall = now_wall) when unknown,
 * in a free slot if there is one. DL_ERANGE when all `max` slots are used. */
int dl_registry_add(dl_registry *r, const char *id, int64_t now_wall);
/* Free a slot: its id is forgotten, its connection queue released. */
void dl_registry_remove(dl_registry *r, int slot);
/* Slots are 0 .. dl_registry_count()-1; skip the ones with used == 0. */
int dl_registry_count(const dl_registry *r);
int dl_registry_used(const dl_registry *r); /* slots in use */
int dl_registry_max(const dl_registry *r);
dl_registry_learner *dl_registry_get(dl_registry *r, int slot);
const dl_registry_learner *dl_registry_cget(const dl_registry *r, int slot);

/* Record that the learner got `version` of fragment p at `ns`. */
void dl_registry_base_add(dl_registry *r, int slot, int p, uint64_t version, int64_t ns);
/* When the learner got `version` of p: the newest record of it; else the
 * oldest record of p (a base older than the ring); 0 with *found = 0 when p
 * has no record. */
int64_t dl_registry_base_ns(const dl_registry *r, int slot, int p, uint64_t version, int *found);

/* The version of p last sent whole to the learner (an Update, full or
 * delta) since its latest Hello: 1 with *version set, 0 when there is none. */
int dl_registry_given(const dl_registry *r, int slot, int p, uint64_t *version);
void dl_registry_given_set(dl_registry *r, int slot, int p, uint64_t version);
/* Forget it for p, or for every fragment when p is -1. */
void dl_registry_given_clear(dl_registry *r, int slot, int p);

/* Attach the connection `route` (with ZAP user id `user`, "" for none) to a
 * slot: a fresh outbound queue counter replaces the old one, unless it is the
 * connection already attached (its queue stays counted against it). */
void dl_registry_set_route(dl_registry *r, int slot, const uint8_t *route, size_t len, const char *user);
/* Detach the slot's connection (it is cut off: nothing more is sent there). */
void dl_registry_clear_route(dl_registry *r, int slot);
/* 1 when the slot's connection is `route`. */
int dl_registry_route_is(const dl_registry *r, int slot, const uint8_t *route, size_t len);

#endif
