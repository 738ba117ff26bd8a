/* Shared by the libFuzzer harnesses of tests/fuzz and their seed generator:
 * the check macro, the run plan the wire targets validate against, input framing. */
#ifndef DL_TESTS_FUZZ_H
#define DL_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A broken invariant: print it and abort, which libFuzzer reports as a
 * crash and saves the input. Not assert(): it must hold under -DNDEBUG too. */
#define FUZZ_CHECK(cond, ...)                                                                            \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "fuzz check failed %s:%d: %s: ", __FILE__, __LINE__, #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                                                \
            fputc('\n', stderr);                                                                         \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)

/* The plan both wire targets use, as the synchronizer and the learner set
 * it (synchronizer/sync.c dl_sync_open, learner/comms.c): 4 fragments with
 * a fragment_numel table, max_frames 2. The sizes are small so fuzz_message
 * can carry whole payloads: 17 is not a multiple of the int8/int4 block
 * minimum (16), 3 is odd (int4 packs two per byte), 1 is the smallest. */
#define FUZZ_NUM_FRAGMENTS 4
static const uint64_t FUZZ_FRAGMENT_NUMEL[FUZZ_NUM_FRAGMENTS] = {64, 17, 3, 1};

/* FUZZ_EXPLAIN set in the environment: each input prints one line on stderr,
 * "fuzz verdict: accepted ..." or "fuzz verdict: refused: why" (tests/fuzz/run.sh
 * checks the seed corpus with it: bad_* seeds refused, the others accepted). */
static inline int fuzz_explain(void)
{
    static int on = -1;
    if (on < 0) on = getenv("FUZZ_EXPLAIN") != NULL;
    return on;
}
#define FUZZ_VERDICT(...)                                                                                \
    do {                                                                                                 \
        if (fuzz_explain()) {                                                                            \
            fprintf(stderr, "fuzz verdict: " __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                                         \
        }                                                                                                \
    } while (0)

/* Little-endian loads for the harnesses' input prefixes. */
static inline uint32_t fuzz_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint16_t fuzz_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* fuzz_envelope input: [ctl u8][len0 u32 LE][len1 u32 LE][header bytes...]
 *   ctl bits 0-1: npayload = (ctl & 3) % 3, the payload frames that came
 *                 with the header (lengths len0, len1; their bytes are not
 *                 needed to validate a header);
 *   ctl bits 2-3: limits, FUZZ_LIM_* below. */
#define FUZZ_ENV_PREFIX 9
enum {
    FUZZ_LIM_PLAN = 0,      /* the synchronizer's and learner's: plan, max_frames 2 */
    FUZZ_LIM_DEFAULT = 1,   /* dl_wire_limits_default(): plan not known yet */
    FUZZ_LIM_SEND = 2,      /* dl_wire_send's own check: defaults, max_frames 1 + DL_WIRE_MAX_PAYLOADS */
    FUZZ_LIM_COUNT_ONLY = 3 /* num_fragments known, no numel table: max_numel bounds sizes */
};

/* fuzz_message input: [flags u8][hlen u16 LE][header: hlen bytes][payload: the rest]
 * (hlen is clamped to what is there). A two-frame message [header][payload]
 * as the synchronizer receives it; with FUZZ_MSG_HEADER_ONLY a one-frame
 * message (the rest of the input is ignored). */
#define FUZZ_MSG_PREFIX 3
enum {
    FUZZ_MSG_HEADER_ONLY = 1,  /* no payload frame */
    FUZZ_MSG_TRUST_SUM = 2     /* decode the payload even when the checksum
                                * disagrees, as if the sender had computed it:
                                * the fuzzer cannot forge a 64-bit hash */
};

#endif
