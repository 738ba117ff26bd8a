/* The pressure source a learner polls for its sync timing (learner/timing.h, docs/SYNC_TIMING.md).
 *
 * A source is a file or a local HTTP endpoint:
 *   http://127.0.0.1:PORT/PATH   GET over plain TCP to loopback only (HTTP/1.0, Connection: close); the
 *                                reply must be "HTTP/1.x 200" and its body the document below
 *   anything else                a file path, read whole each poll (written by another process: write a
 *                                temporary file and rename it over, so a poll never sees half of one)
 *
 * The document (at most DL_PRESSURE_MAX_DOC bytes, an HTTP reply at most DL_PRESSURE_MAX_REPLY): lines
 * "NAME VALUE" (one space or tab between, '\n' or "\r\n" ends a line; empty lines and lines starting with
 * '#' are skipped), names at most once each:
 *   request_rate  requests per second of the serving workload, finite, in [0, 1e9]   (required)
 *   link_util     utilisation of the shared link, finite, in [0, 1]                  (optional, 0)
 *   checkpoint    checkpoint activity, finite, in [0, 1]                             (optional, 0)
 *   queue_depth   serving requests queued or in service now, finite, in [0, 1e6]    (optional, 0: a sidecar
 *                 that does not report it, an older one, counts as no backlog)
 * Refusals (dl_pressure_parse's *why, the `pressure_refused` event's reason):
 *   oversized, empty, malformed (a line that is not NAME VALUE, a value with trailing text),
 *   unknown_name, duplicate, non_finite, negative, out_of_range, missing_rate; for a source also
 *   unreachable (connect/open failed), timeout, http_status (not 200), bad_reply (no header end).
 *
 * What a refusal does: the last good sample is kept for stale_ms after it was read; after that (or before
 * any good sample) the pressure is unknown (known = 0) and the wa policies fall back to the fixed period
 * (learner/timing.h). Polling is at most once per poll_ms (between polls the last result stands); one poll
 * blocks the caller at most timeout_ms (connect, send and receive together; a file read does not wait). */
#ifndef DL_LEARNER_PRESSURE_H
#define DL_LEARNER_PRESSURE_H

#include <stddef.h>
#include <stdint.h>

#include "learner/timing.h"

#define DL_PRESSURE_MAX_DOC 1024
#define DL_PRESSURE_MAX_REPLY 4096

/* Parse a document (len bytes, need not be NUL-terminated). Returns 0 and fills *out (known = 1), or
 * DL_EINVAL with the refusal's name in why (static string) and *out untouched. */
int dl_pressure_parse(const char *buf, size_t len, dl_pressure_sample *out, const char **why);

typedef struct dl_pressure dl_pressure;

typedef struct {
    uint64_t polls, good, refused;
    const char *last_refusal; /* static; NULL when none yet */
} dl_pressure_stats;

/* spec: the URL or file path (a URL must be http://127.0.0.1:PORT/PATH, PORT in [1, 65535], PATH printable
 * ASCII without spaces, at most 200 characters); poll_ms in [1, 60000], timeout_ms in [1, 10000], stale_ms in
 * [0, 3600000]. Returns 0 or DL_EINVAL naming what is wrong. Nothing is read yet. */
int dl_pressure_open(const char *spec, int poll_ms, int timeout_ms, int stale_ms, dl_pressure **out);
void dl_pressure_close(dl_pressure **p); /* safe on NULL and twice */

/* The current sample at now_ns (a monotonic clock): polls when poll_ms has passed since the last poll.
 * Returns 1 when this call polled and the poll was refused (*why set), else 0. */
int dl_pressure_get(dl_pressure *p, int64_t now_ns, dl_pressure_sample *out, const char **why);
void dl_pressure_get_stats(const dl_pressure *p, dl_pressure_stats *out);

#endif
