/* Leveled logging to stderr. One fprintf per line so lines from the comms
 * thread and the training thread never interleave mid-line. */
#include "core/log.h"
#include "core/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int dl_log_level = DL_LOG_INFO;
static char dl_log_name[48] = "dloco";

void dl_log_set_level(int level) { dl_log_level = level; }

int dl_log_level_parse(const char *name)
{
    if (!strcmp(name, "debug")) return DL_LOG_DEBUG;
    if (!strcmp(name, "warn")) return DL_LOG_WARN;
    if (!strcmp(name, "error")) return DL_LOG_ERROR;
    return DL_LOG_INFO;
}

void dl_log_set_name(const char *name)
{
    snprintf(dl_log_name, sizeof dl_log_name, "%s", name);
}

void dl_log(int level, const char *fmt, ...)
{
    static const char *tags[] = {"debug", "info", "warn", "error"};
    if (level < dl_log_level) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    double t = (double)dl_clock_ns() * 1e-9;
    fprintf(stderr, "[%10.3f %s %s] %s\n", t, dl_log_name, tags[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}
