/* The machine-readable event log (core/event.h): logfmt lines, each built in
 * one buffer and appended with a single write(2) so no two lines interleave. */
#include "core/event.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A whole line, newline included, is at most this long: well under the size
 * that Linux writes atomically to an O_APPEND regular file in one call. */
#define DL_EVENT_LINE 4096
/* Appended to a line that had to be cut, so a reader knows fields are missing. */
static const char dl_event_cut_mark[] = " cut=1";

/* fd is read by dl_event() under the lock, so a close on another thread
 * never races a write to a reused descriptor. */
static pthread_mutex_t dl_event_lock = PTHREAD_MUTEX_INITIALIZER;
static int dl_event_fd = -1;
static char dl_event_proc[80];

static int bare_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == ':' || c == '/' || c == '+' || c == '-';
}

const char *dl_event_str(const char *s, char *buf, unsigned cap)
{
    assert(buf && cap >= 3);
    if (!s) s = "";
    int bare = s[0] != 0;
    for (const char *q = s; *q && bare; q++) bare = bare_char((unsigned char)*q);
    if (bare && strlen(s) < cap) {
        memcpy(buf, s, strlen(s) + 1);
        return buf;
    }
    /* Quoted; control bytes are escaped too, because a raw newline would
     * split the event across two lines. A value too long for buf is cut
     * before an escape, never inside one, and the quote is always closed. */
    unsigned n = 0;
    buf[n++] = '"';
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        char esc[5];
        unsigned len = 0;
        if (*q == '"' || *q == '\\') esc[len++] = '\\', esc[len++] = (char)*q;
        else if (*q == '\n') esc[len++] = '\\', esc[len++] = 'n';
        else if (*q == '\r') esc[len++] = '\\', esc[len++] = 'r';
        else if (*q == '\t') esc[len++] = '\\', esc[len++] = 't';
        else if (*q < 0x20 || *q == 0x7f) len = (unsigned)snprintf(esc, sizeof esc, "\\x%02x", *q);
        else esc[len++] = (char)*q;
        if (n + len + 2 > cap) break; /* room for the closing quote and NUL */
        memcpy(buf + n, esc, len);
        n += len;
    }
    buf[n++] = '"';
    buf[n] = 0;
    return buf;
}

int dl_event_open(const char *path, const char *proc)
{
    dl_event_close();
    if (!path || !path[0]) return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return dl_err(DL_EIO, "events file %s: %s", path, strerror(errno));
    pthread_mutex_lock(&dl_event_lock);
    dl_event_str(proc && proc[0] ? proc : "dloco", dl_event_proc, sizeof dl_event_proc);
    dl_event_fd = fd;
    pthread_mutex_unlock(&dl_event_lock);
    return 0;
}

void dl_event_close(void)
{
    pthread_mutex_lock(&dl_event_lock);
    if (dl_event_fd >= 0) close(dl_event_fd);
    dl_event_fd = -1;
    pthread_mutex_unlock(&dl_event_lock);
}

/* Events echoed on stderr at debug rather than info: one per push, ack,
 * update, adopt or merged contribution, and those that can come once per
 * message or per round (an ignored heartbeat, a clipped push, a refused or
 * rate-limited Hello retried, a barrier wait, a sync-timing decision, a refused
 * pressure read or sidecar request), so an info log stays readable
 * at any fleet size (docs/EVENTS.md "On stderr"). */
static int echo_level(const char *name)
{
    static const char *debug[] = {"push",           "ack",          "update",       "adopt",
                                  "merge_contrib",  "update_resumed", "update_restarted", "heartbeat_ignored",
                                  "push_clipped",   "auth_refused", "hello_limited", "learner_duplicate",
                                  "barrier_wait",   "barrier_enter", "update_base",  "sync_timing",  "pressure_refused",
                                  "serve_refused"};
    for (size_t i = 0; i < sizeof debug / sizeof debug[0]; i++)
        if (!strcmp(name, debug[i])) return DL_LOG_DEBUG;
    return DL_LOG_INFO;
}

int dl_event_enabled(void)
{
    pthread_mutex_lock(&dl_event_lock);
    int on = dl_event_fd >= 0;
    pthread_mutex_unlock(&dl_event_lock);
    return on;
}

/* Length of the longest prefix of line[0..len) that ends at a field
 * boundary (a space outside quotes) and is at most `limit` bytes. */
static size_t cut_at_field(const char *line, size_t len, size_t limit)
{
    size_t best = 0;
    int quoted = 0;
    for (size_t i = 0; i < len && i <= limit; i++) {
        char c = line[i];
        if (quoted && c == '\\') i++;
        else if (c == '"') quoted = !quoted;
        else if (c == ' ' && !quoted) best = i;
    }
    if (len <= limit) best = len;
    return best;
}

void dl_event(const char *name, const char *fields, ...)
{
    assert(name && name[0] && fields);
    for (const char *q = name; *q; q++) assert(bare_char((unsigned char)*q));
    /* Cheap checks first: no file and an echo the log level filters out. */
    int level = echo_level(name), echo = dl_log_enabled(level);
    if (!echo && !dl_event_enabled()) return;

    char body[2 * DL_EVENT_LINE];
    va_list ap;
    va_start(ap, fields);
    int blen = vsnprintf(body, sizeof body, fields, ap);
    va_end(ap);
    if (blen < 0) blen = 0;
    if ((size_t)blen >= sizeof body) blen = (int)sizeof body - 1;
    const char *b = body;
    while (*b == ' ') b++, blen--;
    if (echo) {
        /* the same event as a log line on stderr (the file keeps its format) */
        char kv[sizeof body + 96];
        snprintf(kv, sizeof kv, "event=%s%s%.*s", name, blen > 0 ? " " : "", blen, b);
        dl_log_kv(level, kv);
    }

    char line[DL_EVENT_LINE + 2 * DL_EVENT_LINE + 160];
    pthread_mutex_lock(&dl_event_lock);
    int fd = dl_event_fd;
    int hlen = snprintf(line, 160, "ts=%lld proc=%s pid=%ld event=%s", (long long)dl_wallclock_ns(), dl_event_proc,
                        (long)getpid(), name);
    if (hlen < 0 || hlen >= 160) hlen = 159;
    size_t len = (size_t)hlen;
    if (blen > 0) {
        line[len++] = ' ';
        memcpy(line + len, b, (size_t)blen);
        len += (size_t)blen;
    }
    if (len + 1 > DL_EVENT_LINE) {
        /* cut so the line, the mark and the newline fit in DL_EVENT_LINE */
        size_t room = DL_EVENT_LINE - 1 - (sizeof dl_event_cut_mark - 1);
        len = cut_at_field(line, len, room);
        if (len < (size_t)hlen) len = (size_t)hlen; /* never cut the header */
        memcpy(line + len, dl_event_cut_mark, sizeof dl_event_cut_mark - 1);
        len += sizeof dl_event_cut_mark - 1;
    }
    line[len++] = '\n';
    if (fd >= 0) {
        size_t off = 0;
        while (off < len) {
            ssize_t w = write(fd, line + off, len - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break; /* disk full or similar: events are best-effort, training goes on */
            off += (size_t)w;
        }
    }
    pthread_mutex_unlock(&dl_event_lock);
}
