/* The pressure source (learner/pressure.h): document parser, file and loopback-HTTP polling. */
#include "learner/pressure.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/err.h"

static int value_of(const char *s, size_t n, double lo, double hi, double *out, const char **why)
{
    char tmp[64];
    if (n == 0 || n >= sizeof tmp || s[0] == ' ' || s[0] == '\t' || s[0] == '+') return *why = "malformed", DL_EINVAL;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(tmp, &end);
    if (end == tmp || *end) return *why = "malformed", DL_EINVAL;
    if (!isfinite(v)) return *why = "non_finite", DL_EINVAL;
    if (v < 0) return *why = "negative", DL_EINVAL;
    if (v < lo || v > hi) return *why = "out_of_range", DL_EINVAL;
    *out = v;
    return 0;
}

int dl_pressure_parse(const char *buf, size_t len, dl_pressure_sample *out, const char **why)
{
    const char *w = NULL;
    if (!why) why = &w;
    if (len > DL_PRESSURE_MAX_DOC) return *why = "oversized", DL_EINVAL;
    static const char *const names[] = {"request_rate", "link_util", "checkpoint", "queue_depth"};
    static const double his[] = {1e9, 1.0, 1.0, 1e6};
    double v[4] = {0, 0, 0, 0};
    int seen[4] = {0, 0, 0, 0}, any = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && buf[j] != '\n') j++;
        size_t e = j;
        if (e > i && buf[e - 1] == '\r') e--;
        const char *l = buf + i;
        size_t n = e - i;
        i = j + 1;
        if (n == 0 || l[0] == '#') continue;
        any = 1;
        size_t k = 0;
        while (k < n && l[k] != ' ' && l[k] != '\t') k++;
        if (k == 0 || k == n) return *why = "malformed", DL_EINVAL;
        for (size_t q = 0; q < n; q++)
            if ((unsigned char)l[q] < 0x20 && l[q] != '\t') return *why = "malformed", DL_EINVAL;
        int id = -1;
        for (int a = 0; a < 4; a++)
            if (strlen(names[a]) == k && !memcmp(l, names[a], k)) id = a;
        if (id < 0) return *why = "unknown_name", DL_EINVAL;
        if (seen[id]) return *why = "duplicate", DL_EINVAL;
        seen[id] = 1;
        DL_TRY(value_of(l + k + 1, n - k - 1, 0.0, his[id], &v[id], why));
    }
    if (!any) return *why = "empty", DL_EINVAL;
    if (!seen[0]) return *why = "missing_rate", DL_EINVAL;
    *out = (dl_pressure_sample){.known = 1, .rate = v[0], .link = v[1], .ckpt = v[2], .queue = v[3]};
    return 0;
}

/* ---- the source */

struct dl_pressure {
    char path[256]; /* file path, or the HTTP path */
    int http;
    uint16_t port;
    int poll_ms, timeout_ms, stale_ms;
    int64_t last_poll_ns, last_good_ns;
    int polled;
    dl_pressure_sample good; /* last good */
    int have_good;
    dl_pressure_stats st;
};

int dl_pressure_open(const char *spec, int poll_ms, int timeout_ms, int stale_ms, dl_pressure **out)
{
    assert(out);
    *out = NULL;
    if (!spec || !spec[0]) return dl_err(DL_EINVAL, "pressure: empty source");
    if (poll_ms < 1 || poll_ms > 60000) return dl_err(DL_EINVAL, "pressure: poll_ms %d outside [1, 60000]", poll_ms);
    if (timeout_ms < 1 || timeout_ms > 10000)
        return dl_err(DL_EINVAL, "pressure: timeout_ms %d outside [1, 10000]", timeout_ms);
    if (stale_ms < 0 || stale_ms > 3600000)
        return dl_err(DL_EINVAL, "pressure: stale_ms %d outside [0, 3600000]", stale_ms);
    dl_pressure *p = dl_xcalloc(1, sizeof *p);
    p->poll_ms = poll_ms;
    p->timeout_ms = timeout_ms;
    p->stale_ms = stale_ms;
    if (!strncmp(spec, "http://", 7)) {
        const char *h = spec + 7;
        static const char host[] = "127.0.0.1:";
        if (strncmp(h, host, sizeof host - 1)) {
            free(p);
            return dl_err(DL_EINVAL, "pressure: '%s': only http://127.0.0.1:PORT/PATH (loopback) is allowed", spec);
        }
        h += sizeof host - 1;
        char *end = NULL;
        long port = strtol(h, &end, 10);
        if (end == h || port < 1 || port > 65535 || *end != '/') {
            free(p);
            return dl_err(DL_EINVAL, "pressure: '%s': port must be in [1, 65535] and followed by /PATH", spec);
        }
        size_t n = strlen(end);
        int ok = n <= 200;
        for (size_t i = 0; ok && i < n; i++) ok = end[i] > 0x20 && end[i] < 0x7f;
        if (!ok) {
            free(p);
            return dl_err(DL_EINVAL, "pressure: '%s': PATH must be printable ASCII without spaces, at most 200 characters",
                          spec);
        }
        p->http = 1;
        p->port = (uint16_t)port;
        memcpy(p->path, end, n + 1);
    } else {
        if (strlen(spec) >= sizeof p->path) {
            free(p);
            return dl_err(DL_EINVAL, "pressure: file path longer than %zu characters", sizeof p->path - 1);
        }
        strcpy(p->path, spec);
    }
    *out = p;
    return 0;
}

void dl_pressure_close(dl_pressure **p)
{
    if (!p || !*p) return;
    free(*p);
    *p = NULL;
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait for fd to become ready for `ev` until deadline; 0 or -1 (timeout / error). */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = (deadline - mono_ns()) / 1000000;
        if (left <= 0) return -1;
        struct pollfd pf = {.fd = fd, .events = ev};
        int r = poll(&pf, 1, (int)left);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* One HTTP GET into buf; returns body length, or -1 with *why. */
static long http_get(dl_pressure *p, char *buf, size_t cap, const char **why)
{
    int64_t deadline = mono_ns() + (int64_t)p->timeout_ms * 1000000;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return *why = "unreachable", -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    long rc = -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
        *why = "unreachable";
        goto out;
    }
    if (wait_fd(fd, POLLOUT, deadline)) {
        *why = "timeout";
        goto out;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr) {
        *why = "unreachable";
        goto out;
    }
    char req[300];
    int rn = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", p->path);
    for (int off = 0; off < rn;) {
        ssize_t w = send(fd, req + off, (size_t)(rn - off), MSG_NOSIGNAL);
        if (w > 0) off += (int)w;
        else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLOUT, deadline)) {
                *why = "timeout";
                goto out;
            }
        } else {
            *why = "unreachable";
            goto out;
        }
    }
    size_t got = 0;
    for (;;) {
        if (got == cap) {
            *why = "oversized";
            goto out;
        }
        ssize_t r = recv(fd, buf + got, cap - got, 0);
        if (r > 0) got += (size_t)r;
        else if (r == 0) break;
        else if (errno == EAGAIN || errno == EINTR) {
            if (wait_fd(fd, POLLIN, deadline)) {
                *why = "timeout";
                goto out;
            }
        } else {
            *why = "unreachable";
            goto out;
        }
    }
    if (got < 13 || (memcmp(buf, "HTTP/1.0 ", 9) && memcmp(buf, "HTTP/1.1 ", 9))) {
        *why = "bad_reply";
        goto out;
    }
    if (memcmp(buf + 9, "200", 3) || (buf[12] != ' ' && buf[12] != '\r')) { /* not "2000", "200x" */
        *why = "http_status";
        goto out;
    }
    size_t hdr = 0;
    for (size_t i = 0; i + 3 < got; i++)
        if (!memcmp(buf + i, "\r\n\r\n", 4)) {
            hdr = i + 4;
            break;
        }
    if (!hdr) {
        *why = "bad_reply";
        goto out;
    }
    memmove(buf, buf + hdr, got - hdr);
    rc = (long)(got - hdr);
out:
    close(fd);
    return rc;
}

static long file_get(dl_pressure *p, char *buf, size_t cap, const char **why)
{
    int fd = open(p->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return *why = "unreachable", -1;
    size_t got = 0;
    for (;;) {
        if (got == cap) {
            close(fd);
            return *why = "oversized", -1;
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r > 0) got += (size_t)r;
        else if (r == 0) break;
        else if (errno != EINTR) {
            close(fd);
            return *why = "unreachable", -1;
        }
    }
    close(fd);
    return (long)got;
}

int dl_pressure_get(dl_pressure *p, int64_t now_ns, dl_pressure_sample *out, const char **why)
{
    assert(p && out);
    int refused = 0;
    if (!p->polled || now_ns - p->last_poll_ns >= (int64_t)p->poll_ms * 1000000) {
        p->polled = 1;
        p->last_poll_ns = now_ns;
        p->st.polls++;
        char buf[DL_PRESSURE_MAX_REPLY + 1];
        const char *w = NULL;
        long n = p->http ? http_get(p, buf, DL_PRESSURE_MAX_REPLY + 1, &w)
                         : file_get(p, buf, DL_PRESSURE_MAX_DOC + 1, &w);
        dl_pressure_sample s;
        if (n >= 0 && dl_pressure_parse(buf, (size_t)n, &s, &w) == 0) {
            p->good = s;
            p->have_good = 1;
            p->last_good_ns = now_ns;
            p->st.good++;
        } else {
            refused = 1;
            p->st.refused++;
            p->st.last_refusal = w;
            if (why) *why = w;
        }
    }
    if (p->have_good && now_ns - p->last_good_ns <= (int64_t)p->stale_ms * 1000000) *out = p->good;
    else *out = (dl_pressure_sample){.known = 0};
    return refused;
}

void dl_pressure_get_stats(const dl_pressure *p, dl_pressure_stats *out) { *out = p->st; }
