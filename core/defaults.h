/* The defaults of the options that depend on the link between learners and
 * the synchronizer: one set for dloco-sync, dloco-learner, the learner library
 * and the chaos scenario format (docs/DEPLOY.md "Across datacenters"). */
#ifndef DL_CORE_DEFAULTS_H
#define DL_CORE_DEFAULTS_H

/* Config tables hold defaults as text: DL_DEF_STR(DL_DEF_H) is "24". */
#define DL_DEF_STR_(x) #x
#define DL_DEF_STR(x) DL_DEF_STR_(x)

/* Inner steps between two pushes of one fragment. */
#define DL_DEF_H 24
/* Heartbeat period, ms, and the heartbeats missed before a learner is dead:
 * 3 s, longer than two chunks take over 3 Mbit/s. */
#define DL_DEF_HEARTBEAT_MS 500
#define DL_DEF_LIVENESS 6
/* Versions a push may be behind before it is dropped: with quorum 1 each of
 * N learners adds a version per push period, so a learner whose push and
 * Update take a period or two to cross its link is ~2N behind; 32 covers a
 * fleet of 16 (the staleness weight still discounts it). */
#define DL_DEF_MAX_STALENESS 32
/* KiB per chunk of an Update and of a push: two chunks queued for a learner
 * (peer_outbound_mb's default) cross its share of a thin link -- 1.5 Mbit/s,
 * two learners on 3 Mbit/s -- in 0.7 s, well inside the 3 s liveness;
 * divides the store's 1 MiB blocks. */
#define DL_DEF_CHUNK_KB 64
/* KiB a learner's push chunks may grow to where its measured uplink carries
 * one in 50 ms (synchronizer/uplink.c): on loopback, 16 GPT-2 learners'
 * fp32 pushes cost the synchronizer 9.3-9.5 memcpys per merged byte against
 * 14.8-15.4 in fixed 64 KiB chunks (docs/RESULTS.md); a thin link (below
 * ~20 Mbit/s) keeps DL_DEF_CHUNK_KB. */
#define DL_DEF_PUSH_CHUNK_MAX_KB 1024
/* How a learner adopts a new global fragment. */
#define DL_DEF_ADOPT "keep"

#endif
