/* Test helpers shared by test_hostile and test_manifest_run, whose raw DEALER peers speak for learners: the
 * messages they send, built as a learner builds them (proto/wire.h). Header-only, like tests/proc.h. */
#ifndef DL_TESTS_PEER_MSGS_H
#define DL_TESTS_PEER_MSGS_H

#include <stdint.h>

#include "proto/wire.h"

/* An fp32 Push header of fragment frag (numel elements) on base, for steps and tokens: transfer 0 carries
 * the whole delta (off 0, n numel), else elements [off, off + n) as a chunk of that transfer. `payload` is
 * the n floats sent (the checksum covers them); loss 3.0. */
static inline void msg_push_fp32(Dloco__V1__Push *ph, int frag, uint64_t base, uint64_t steps, uint64_t tokens,
                                 uint64_t numel, uint64_t transfer, uint64_t off, uint64_t n, const float *payload)
{
    dloco__v1__push__init(ph);
    ph->fragment = (uint32_t)frag;
    ph->base_version = base;
    ph->steps = steps;
    ph->tokens = tokens;
    ph->codec = DLOCO__V1__CODEC__CODEC_FP32;
    ph->numel = numel;
    ph->chunk_offset = transfer ? off : 0;
    ph->chunk_numel = transfer ? n : 0;
    ph->transfer = transfer;
    ph->checksum = dl_wire_checksum(payload, n * 4);
    ph->loss = 3.0;
}

/* A Heartbeat envelope in learner id's name; env borrows hb (its fields zero: set step, tokens after). */
static inline void msg_heartbeat(Dloco__V1__Envelope *env, Dloco__V1__Heartbeat *hb, const char *run_id,
                                 uint64_t epoch, const char *id)
{
    dloco__v1__heartbeat__init(hb);
    dl_wire_env_init(env, run_id, epoch, id);
    dl_wire_set_heartbeat(env, hb);
}

#endif
