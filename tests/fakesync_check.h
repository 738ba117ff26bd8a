/* The fake synchronizer (tests/fakesync.h) as checks of the learner test that includes this header after
 * tests/check.h: the bound of every wait, WAIT_FOR, and the calls each scripted exchange makes. */
#ifndef DL_TESTS_FAKESYNC_CHECK_H
#define DL_TESTS_FAKESYNC_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "core/clock.h"
#include "tests/fakesync.h"

#define WAIT_MS 5000 /* bound of every single wait */

/* Poll `expr` every 2 ms (the test's nap_ms) for up to WAIT_MS; evaluates to whether it held. */
#define WAIT_FOR(expr)                                                                                   \
    ({                                                                                                   \
        int64_t wf_t0_ = dl_clock_ns();                                                                  \
        int wf_ok_ = 0;                                                                                  \
        while (!(wf_ok_ = !!(expr)) && dl_clock_ns() - wf_t0_ < WAIT_MS * 1000000LL) nap_ms(2);          \
        wf_ok_;                                                                                          \
    })

/* Next message that is not a heartbeat within timeout_ms: its body case (m to be closed by the caller),
 * or -1 on a timeout. A message of the learner's that proto/wire.c refuses fails a check. */
static inline int fs_check_next(dl_fakesync *h, dl_wire_msg *m, int timeout_ms)
{
    int bad = h->bad, got = fs_next(h, m, timeout_ms);
    CHECK(h->bad == bad, "the learner sent a bad message");
    return got;
}

/* A message of `body` next (heartbeats aside) within WAIT_MS: 1, else a failed check and 0. */
static inline int fs_check_expect(dl_fakesync *h, int body, dl_wire_msg *m, const char *what)
{
    int ok = fs_expect(h, body, m, WAIT_MS, what);
    CHECK(ok, "expected %s", what);
    return ok;
}

/* Send env (+ `bytes` of payload) to learner `id` (NULL: the connection last heard); a failure ends the test. */
static inline void fs_check_send(dl_fakesync *h, const char *id, Dloco__V1__Envelope *env, const void *payload,
                                 size_t bytes)
{
    REQUIRE(fs_send(h, id, env, payload, bytes) == 0, "fake synchronizer send %s", dl_wire_body_name(env->body_case));
}

#endif
