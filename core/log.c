/* Leveled logfmt lines to stderr (core/log.h). Each line is built in one
 * buffer and written with one fputs, so lines from the comms thread and the
 * training thread never interleave mid-line. */
#include "core/log.h"
#include "core/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int dl_log_level = DL_LOG_INFO;
static char dl_log_name[48] = "dloco";
static const char *dl_log_tags[] = {"debug", "info", "warn", "error"};
/* dl_log_set_sink: read with one atomic load per line (set from another thread than the writers) */
static void (*dl_log_sink)(void *ctx, int level, const char *line);
static void *dl_log_sink_ctx;

void dl_log_set_sink(void (*fn)(void *ctx, int level, const char *line), void *ctx)
{
    __atomic_store_n(&dl_log_sink, NULL, __ATOMIC_RELEASE);
    dl_log_sink_ctx = ctx;
    __atomic_store_n(&dl_log_sink, fn, __ATOMIC_RELEASE);
}

/* One finished line (ending in a newline) to the sink or stderr. */
static void emit(int level, char *line, size_t n)
{
    void (*fn)(void *, int, const char *) = __atomic_load_n(&dl_log_sink, __ATOMIC_ACQUIRE);
    if (!fn) {
        fputs(line, stderr);
        return;
    }
    if (n && line[n - 1] == '\n') line[n - 1] = 0;
    fn(dl_log_sink_ctx, level, line);
}

void dl_log_set_level(int level) { dl_log_level = level; }
int dl_log_enabled(int level) { return level >= dl_log_level; }

int dl_log_level_parse(const char *name)
{
    if (!strcmp(name, "debug")) return DL_LOG_DEBUG;
    if (!strcmp(name, "warn")) return DL_LOG_WARN;
    if (!strcmp(name, "error")) return DL_LOG_ERROR;
    return DL_LOG_INFO;
}

/* The tag is written bare in every line: keep [A-Za-z0-9._:/+-], '_' for the rest. */
void dl_log_set_name(const char *name)
{
    snprintf(dl_log_name, sizeof dl_log_name, "%s", name && name[0] ? name : "dloco");
    for (char *c = dl_log_name; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || strchr("._:/+-", *c)))
            *c = '_';
}

void dl_log_rfc3339(int64_t wall_ns, char *buf, unsigned cap)
{
    time_t s = (time_t)(wall_ns / 1000000000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char ymd[32];
    strftime(ymd, sizeof ymd, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%.24s.%03dZ", ymd, (int)(wall_ns / 1000000 % 1000));
}

static int head(int level, char *buf, size_t cap)
{
    char ts[40];
    dl_log_rfc3339(dl_wallclock_ns(), ts, sizeof ts);
    return snprintf(buf, cap, "ts=%s level=%s proc=%s ", ts, dl_log_tags[level < 0 ? 0 : level > 3 ? 3 : level],
                    dl_log_name);
}

void dl_log_kv(int level, const char *kv)
{
    if (level < dl_log_level) return;
    char line[8192 + 128];
    int n = head(level, line, sizeof line);
    snprintf(line + n, sizeof line - (size_t)n - 1, "%s", kv);
    strcat(line, "\n");
    emit(level, line, strlen(line));
}

void dl_log(int level, const char *fmt, ...)
{
    if (level < dl_log_level) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* msg="...": escaped so one call stays one line */
    char line[4 * sizeof msg + 160];
    size_t n = (size_t)head(level, line, sizeof line);
    n += (size_t)snprintf(line + n, sizeof line - n, "msg=\"");
    for (const unsigned char *q = (const unsigned char *)msg; *q; q++) {
        if (*q == '"' || *q == '\\') line[n++] = '\\', line[n++] = (char)*q;
        else if (*q == '\n') line[n++] = '\\', line[n++] = 'n';
        else if (*q == '\t') line[n++] = '\\', line[n++] = 't';
        else if (*q == '\r') line[n++] = '\\', line[n++] = 'r';
        else if (*q < 0x20 || *q == 0x7f) n += (size_t)snprintf(line + n, 5, "\\x%02x", *q);
        else line[n++] = (char)*q;
    }
    line[n++] = '"';
    line[n++] = '\n';
    line[n] = 0;
    emit(level, line, n);
}
