/* The machine-readable event log: one logfmt line per event, appended to the
 * file named by a program's --events flag, for tests, the chaos harness and
 * operators' tools. Human log lines (core/log.h) may change freely; event
 * names and their fields are an interface (docs/EVENTS.md lists them).
 *
 * Line format:  ts=<unix ns> proc=<name> pid=<pid> event=<name> k=v ...
 * Values are integers, floats (%.17g), or strings, which are written bare
 * when they hold only [A-Za-z0-9._:/+-] and quoted with \" and \\ escaped
 * otherwise. Each line is written with one write(2) on an O_APPEND
 * descriptor, so lines of several processes sharing one file never
 * interleave and every event written before a SIGKILL is on disk (in the
 * page cache). Thread-safe.
 *
 * Every event is also a log line on stderr (core/log.h), whether or not a
 * file is open: "ts=<RFC 3339> level=<info|debug> proc=<tag> event=<name>
 * <fields>", subject to --log-level (the per-push events are debug). */
#ifndef DL_CORE_EVENT_H
#define DL_CORE_EVENT_H

#include <stdint.h>

/* Open the process's event log (append, created 0644). path NULL or "" turns
 * events off. `proc` is the process tag (e.g. "sync", "learner"). Returns 0
 * or DL_EIO with the reason. Opening again closes the previous file. */
int dl_event_open(const char *path, const char *proc);
void dl_event_close(void);
/* 1 when events are being written. */
int dl_event_enabled(void);

/* Write one event. `fields` is a printf format of " k=v" pairs that the
 * caller keeps logfmt-clean (use dl_event_str for free text):
 *   dl_event("merge", "frag=%d version=%llu n=%d", p, v, n);
 * A line longer than 4096 bytes is cut at the last whole field. No-op when
 * events are off. */
void dl_event(const char *name, const char *fields, ...) __attribute__((format(printf, 2, 3)));

/* Format `s` as a logfmt value (bare or quoted) into buf; returns buf. */
const char *dl_event_str(const char *s, char *buf, unsigned cap);

#endif
