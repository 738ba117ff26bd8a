/* Logging to stderr with a monotonic timestamp and a level; one line per call.
 * Level is set once at start (config "log_level"); no global state besides it. */
#ifndef DL_CORE_LOG_H
#define DL_CORE_LOG_H

enum { DL_LOG_DEBUG = 0, DL_LOG_INFO = 1, DL_LOG_WARN = 2, DL_LOG_ERROR = 3 };

void dl_log_set_level(int level);
/* "debug" | "info" | "warn" | "error" -> DL_LOG_*; anything else is info
 * (config tables restrict the value to these names). */
int dl_log_level_parse(const char *name);
void dl_log_set_name(const char *name); /* process tag, e.g. "sync" or "learner-3" */
void dl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DL_DEBUG(...) dl_log(DL_LOG_DEBUG, __VA_ARGS__)
#define DL_INFO(...) dl_log(DL_LOG_INFO, __VA_ARGS__)
#define DL_WARN(...) dl_log(DL_LOG_WARN, __VA_ARGS__)
#define DL_ERROR(...) dl_log(DL_LOG_ERROR, __VA_ARGS__)

#endif
