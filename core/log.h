/* Human log lines on stderr, in logfmt, one line per call:
 *   ts=2026-12-01T16:02:52.123Z level=info proc=sync msg="store ... opened"
 * ts is RFC 3339 UTC with milliseconds; msg is always quoted (\" \\ \n \t
 * and \xHH escaped). The level filter is set once at start (config
 * "log_level", --log-level); core/event.c echoes every event here too
 * (dl_log_kv), as `event=<name> <fields>` instead of msg. No global state
 * besides the level and the process tag. */
#ifndef DL_CORE_LOG_H
#define DL_CORE_LOG_H

#include <stdint.h>

enum { DL_LOG_DEBUG = 0, DL_LOG_INFO = 1, DL_LOG_WARN = 2, DL_LOG_ERROR = 3 };

void dl_log_set_level(int level);
/* "debug" | "info" | "warn" | "error" -> DL_LOG_*; anything else is info
 * (config tables restrict the value to these names). */
int dl_log_level_parse(const char *name);
/* 1 when a line of this level is written. */
int dl_log_enabled(int level);
void dl_log_set_name(const char *name); /* process tag, e.g. "sync" or "learner-3" */
void dl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One line "ts=... level=... proc=... <kv>" where kv is already logfmt
 * (the event echo); written whole with one fputs. */
void dl_log_kv(int level, const char *kv);
/* Send every line (without its newline) to fn(ctx, level, line) instead of
 * stderr; fn NULL = stderr again. For a library whose caller owns the log
 * (include/dloco/learner.h); fn may be called from any thread. */
void dl_log_set_sink(void (*fn)(void *ctx, int level, const char *line), void *ctx);
/* "2026-12-01T16:02:52.123Z" for a CLOCK_REALTIME time in ns; buf >= 25 bytes. */
void dl_log_rfc3339(int64_t wall_ns, char *buf, unsigned cap);

#define DL_DEBUG(...) dl_log(DL_LOG_DEBUG, __VA_ARGS__)
#define DL_INFO(...) dl_log(DL_LOG_INFO, __VA_ARGS__)
#define DL_WARN(...) dl_log(DL_LOG_WARN, __VA_ARGS__)
#define DL_ERROR(...) dl_log(DL_LOG_ERROR, __VA_ARGS__)

#endif
