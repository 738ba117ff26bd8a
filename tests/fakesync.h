/* A fake synchronizer for learner tests: a real ZeroMQ ROUTER on loopback speaking the real protocol
 * (proto/wire.h), with send helpers for every message a synchronizer sends, so a test plays any script. */
#ifndef DL_TESTS_FAKESYNC_H
#define DL_TESTS_FAKESYNC_H

#include <stddef.h>
#include <stdint.h>

#include "proto/auth.h"
#include "proto/wire.h"

struct dl_plan;

#define DL_FS_MAX_P 64
#define DL_FS_MAX_PEERS 8

typedef struct {
    void *ctx, *router;
    char ep[256];                  /* "tcp://127.0.0.1:PORT" */
    dl_wire_limits lim;
    uint64_t numel[DL_FS_MAX_P];   /* per fragment */
    const struct dl_plan *plan;    /* borrowed */
    const char *run_id;            /* Envelope.run_id of everything sent; "dloco" */
    const char *id;                /* the learner a one-learner test talks to (fs_send with id NULL: the
                                    * connection last heard) */
    int heartbeats;                /* learner heartbeats seen (fs_next skips them) */
    uint64_t hb_step;              /* step of the last one */
    int conns;                     /* distinct connections heard (a learner sets no routing id: a new one each) */
    int bad;                       /* messages from learners that proto/wire.c refused */
    uint8_t rid[DL_WIRE_ROUTING_ID_MAX + 1]; /* the connection last heard */
    size_t rid_len;
    char last_id[DL_WIRE_LEARNER_ID_MAX + 1]; /* the learner id last heard */
    /* the connection each learner id last spoke on */
    struct {
        char id[DL_WIRE_LEARNER_ID_MAX + 1];
        uint8_t rid[DL_WIRE_ROUTING_ID_MAX + 1];
        size_t rid_len;
    } peer[DL_FS_MAX_PEERS];
    int npeer;
} dl_fakesync;

/* Bind on an ephemeral loopback port for `plan` (P <= DL_FS_MAX_P); `curve` non-NULL: a CURVE server of
 * that key pair (no ZAP handler: any client key that completes the handshake is admitted); id: see above
 * (NULL: the learner id last heard).
 * Exits the test on failure (setup, not a check). */
void fs_open(dl_fakesync *h, const struct dl_plan *plan, const char *id, const dl_auth_keypair *curve);
void fs_close(dl_fakesync *h);

/* Next message that is not a heartbeat within timeout_ms: its body case (m to be closed by the caller),
 * or -1 (timeout; or a refused message, counted in bad and printed). */
int fs_next(dl_fakesync *h, dl_wire_msg *m, int timeout_ms);
/* fs_next must give `body`: 1, else 0 (printed: what came instead; m closed). */
int fs_expect(dl_fakesync *h, int body, dl_wire_msg *m, int timeout_ms, const char *what);

/* Send env (+ payload frames) to learner `id` (NULL: the connection last heard). 0, or -1 (printed). */
int fs_send_frames(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *const *pl,
                   const size_t *len, int n);
int fs_send(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *payload, size_t bytes);
/* What dl_wire_send would refuse to send (a lying synchronizer does not check itself). */
int fs_send_unchecked(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *payload,
                      size_t bytes);

typedef struct {
    uint64_t epoch, version;       /* every fragment at `version` */
    uint32_t h, hb_ms, liveness;   /* a 0 among them is sent unchecked */
    int must_fetch;
    const char *policy;            /* NULL: "test" */
    uint32_t chunk_bytes, update_codec, shard, shards;
    const uint64_t *answered;      /* Welcome.answered_bases [P] (NULL: none) */
} fs_welcome_args;
int fs_welcome(dl_fakesync *h, const char *id, const fs_welcome_args *a);
/* A full fp32 Update of p at `version`; `bytes` != 4 numel_p is sent unchecked. */
int fs_update_raw(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const void *g,
                  size_t bytes);
int fs_update(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const float *g);
/* One chunk of a full fp32 Update of p at `version`: elements [off, off + n) of g (n >= 1). */
int fs_update_chunk(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t version, const float *g,
                    uint64_t off, uint64_t n);
/* Ack of p echoing `base`: decision DLOCO__V1__DECISION__*; rebase with DROPPED_STALE. */
int fs_ack(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t base, int decision, uint64_t merged);
/* The same, sent again after a Welcome (Ack.again), without rebase. */
int fs_ack_again(dl_fakesync *h, const char *id, uint64_t epoch, int p, uint64_t base, int decision, uint64_t merged);
int fs_error(dl_fakesync *h, const char *id, uint64_t epoch, int code, const char *msg, int fatal);
int fs_heartbeat(dl_fakesync *h, const char *id, uint64_t epoch);

#endif
