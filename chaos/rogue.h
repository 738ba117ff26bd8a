/* A rogue client: garbage aimed at the synchronizer's port, the way a
 * scanner, a broken peer or an attacker would send it. */
#ifndef DL_CHAOS_ROGUE_H
#define DL_CHAOS_ROGUE_H

#include <stdint.h>

typedef struct {
    int raw_conns;   /* TCP connections that sent bytes that are not ZMTP */
    int zmq_msgs;    /* ZeroMQ messages of random frames sent */
    int envelopes;   /* truncated / corrupted protobuf envelopes sent */
} dl_rogue_stats;

/* Send about n garbage messages to host:port (a ZeroMQ ROUTER): a few raw
 * TCP connections of random bytes, DEALERs with random routing ids sending
 * random multi-frame messages, and protobuf-looking headers with random
 * fields. Bounded: returns within ~2 s. 0, or DL_ENET when nothing could be
 * sent at all. */
int dl_rogue_garbage(const char *host, int port, int n, uint64_t seed, dl_rogue_stats *out);

#endif
