/* dloco-serve: a latency-sensitive serving sidecar for the sync-timing bench (docs/SYNC_TIMING.md).
 *
 * Two loopback HTTP/1.0 listeners (Connection: close, GET only):
 *   --listen           GET /work      does --work_iters iterations of CPU work (so it shares the CPU with a
 *                                     learner pinned to the same core) and answers "ok\n"; one request at a
 *                                     time, in arrival order (a single-server queue: a busy CPU shows as
 *                                     latency)
 *   --pressure_listen  GET /pressure  the pressure document of learner/pressure.h: request_rate (arrivals at
 *                                     /work over the last --window_ms), link_util (bytes of --link_iface in
 *                                     /proc/net/dev since the previous /pressure, over --link_capacity_mbps),
 *                                     checkpoint (1 when --ckpt_path was modified in the last --ckpt_hold_ms),
 *                                     queue_depth (the /work requests waiting now, i.e. the listening socket's
 *                                     accept queue from TCP_INFO, plus the one in service)
 * A request is refused with a status and a `serve_refused` event naming the reason: a head over 2048 bytes
 * or not ended within 1 s (431 oversized / 408 timeout), not "METHOD PATH HTTP/1.x" (400 malformed), a
 * method other than GET (405 method), a path not served by that listener (404 path).
 * Server-side latency (accept to reply sent) of each /work request is checked against --slo_ms; SIGTERM /
 * SIGINT end it with a `serve_summary` event (requests, violations, p50/p99 ms). The bench's SLO measure is
 * the load generator's (dloco-loadgen: from the scheduled arrival, so queueing counts). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "core/err.h"
#include "core/event.h"

typedef struct {
    char listen[DL_CFG_STRLEN], pressure_listen[DL_CFG_STRLEN];
    int64_t work_iters, window_ms, ckpt_hold_ms;
    double slo_ms, link_capacity_mbps;
    char link_iface[DL_CFG_STRLEN], ckpt_path[DL_CFG_STRLEN], events[DL_CFG_STRLEN];
} serve_cfg;

#define F(x) offsetof(serve_cfg, x)
static const dl_cfg_entry table[] = {
    {"listen", DL_CFG_STR, F(listen), 0, 0, "127.0.0.1:0", NULL, 0, "/work on 127.0.0.1:PORT (0 = ephemeral; serve_start says)"},
    {"pressure_listen", DL_CFG_STR, F(pressure_listen), 0, 0, "127.0.0.1:0", NULL, 0, "/pressure on 127.0.0.1:PORT"},
    {"work_iters", DL_CFG_INT, F(work_iters), 1, 1e10, "200000", NULL, 0, "CPU work per /work request", "iterations"},
    {"slo_ms", DL_CFG_FLOAT, F(slo_ms), 0.001, 1e6, "20", NULL, 0, "latency objective of a /work request"},
    {"window_ms", DL_CFG_INT, F(window_ms), 10, 60000, "500", NULL, 0, "request_rate is the arrivals over this window"},
    {"link_iface", DL_CFG_STR, F(link_iface), 0, 0, "lo", NULL, 0, "interface of /proc/net/dev for link_util"},
    {"link_capacity_mbps", DL_CFG_FLOAT, F(link_capacity_mbps), 0.001, 1e7, "1000", NULL, 0,
     "link_util = (rx+tx bits/s) / this, capped at 1", "Mbit/s"},
    {"ckpt_path", DL_CFG_STR, F(ckpt_path), 0, 0, "", NULL, 0, "checkpoint file to watch; empty = checkpoint 0"},
    {"ckpt_hold_ms", DL_CFG_INT, F(ckpt_hold_ms), 0, 3600000, "2000", NULL, 0, "checkpoint is 1 this long after a write"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0, "append events (docs/EVENTS.md) here; empty = off"},
};
#undef F
#define NCFG (sizeof table / sizeof table[0])

static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s, stop = 1; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- arrivals (request_rate): a ring of accept times, shared by both threads */
#define RING 65536
static double ring[RING];
static uint64_t arrivals;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void arrived(double t)
{
    pthread_mutex_lock(&mu);
    ring[arrivals++ % RING] = t;
    pthread_mutex_unlock(&mu);
}

static double rate_now(double t, double window)
{
    pthread_mutex_lock(&mu);
    uint64_t n = 0;
    for (uint64_t i = arrivals; i > 0 && n < RING && ring[(i - 1) % RING] > t - window; i--) n++;
    pthread_mutex_unlock(&mu);
    return (double)n / window;
}

/* "127.0.0.1:PORT" -> bound, listening socket; -1 with a message. */
static int listen_on(const char *addr, char *bound, size_t cap)
{
    static const char pre[] = "127.0.0.1:";
    char *end = NULL;
    long port = strncmp(addr, pre, sizeof pre - 1) ? -1 : strtol(addr + sizeof pre - 1, &end, 10);
    if (port < 0 || port > 65535 || !end || *end || end == addr + sizeof pre - 1) {
        fprintf(stderr, "dloco-serve: '%s' is not 127.0.0.1:PORT (PORT in [0, 65535]; loopback only)\n", addr);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 256)) {
        fprintf(stderr, "dloco-serve: cannot listen on %s: %s\n", addr, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    snprintf(bound, cap, "127.0.0.1:%d", ntohs(a.sin_port));
    return fd;
}

static void reply(int fd, const char *status, const char *body)
{
    char buf[1400];
    int n = snprintf(buf, sizeof buf, "HTTP/1.0 %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, strlen(body), body);
    (void)!send(fd, buf, (size_t)n, MSG_NOSIGNAL);
}

/* Read a request head and check it; returns 0 with the path, or -1 after refusing it. */
static int read_request(int fd, const char *want, char *path, size_t cap)
{
    char buf[2049];
    size_t got = 0;
    double deadline = now_s() + 1.0;
    const char *why = NULL, *status = NULL;
    for (;;) {
        if (got >= 4 && memmem(buf, got, "\r\n\r\n", 4)) break;
        if (got == sizeof buf - 1) {
            why = "oversized", status = "431 Request Header Fields Too Large";
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0) {
            why = "timeout", status = "408 Request Timeout";
            break;
        }
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r <= 0) {
            why = "malformed", status = "400 Bad Request";
            break;
        }
        got += (size_t)r;
    }
    if (!why) {
        buf[got] = 0;
        char m[16], p[512], v[16];
        if (sscanf(buf, "%15s %511s %15s", m, p, v) != 3 || strncmp(v, "HTTP/1.", 7))
            why = "malformed", status = "400 Bad Request";
        else if (strcmp(m, "GET")) why = "method", status = "405 Method Not Allowed";
        else if (strcmp(p, want)) why = "path", status = "404 Not Found";
        else snprintf(path, cap, "%s", p);
    }
    if (!why) return 0;
    reply(fd, status, why);
    dl_event("serve_refused", "reason=%s listener=%s", why, want + 1);
    return -1;
}

static serve_cfg cfg;
static int work_lfd = -1;             /* the /work listener: its accept queue is the waiting backlog */
static _Atomic int serving; /* 1 while a /work request is in service (written here, read by the pressure thread) */

/* Requests queued or in service now: Linux reports a listening socket's accept-queue length in
 * tcpi_unacked (sk_ack_backlog); -1 when that cannot be read. */
static double queue_now(void)
{
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (work_lfd < 0 || getsockopt(work_lfd, IPPROTO_TCP, TCP_INFO, &ti, &l)) return -1;
    return (double)ti.tcpi_unacked + (serving ? 1.0 : 0.0);
}
static volatile uint64_t sink;

static void work(int64_t iters)
{
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < iters; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    sink = x;
}

static int read_netdev(const char *iface, double *bytes)
{
    FILE *f = fopen("/proc/net/dev", "r");
    if (!f) return -1;
    char line[512];
    int rc = -1;
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!c) continue;
        *c = 0;
        char *n = line;
        while (*n == ' ') n++;
        if (strcmp(n, iface)) continue;
        unsigned long long v[16];
        if (sscanf(c + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7], &v[8]) == 9) {
            *bytes = (double)v[0] + (double)v[8];
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

static void *pressure_thread(void *a)
{
    int lfd = *(int *)a;
    double prev_b = 0, prev_t = now_s();
    int have = read_netdev(cfg.link_iface, &prev_b) == 0;
    while (!stop) {
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        char path[512];
        if (read_request(fd, "/pressure", path, sizeof path) == 0) {
            double t = now_s(), b = 0, link = 0, ckpt = 0;
            if (have && read_netdev(cfg.link_iface, &b) == 0 && t > prev_t) {
                link = (b - prev_b) * 8.0 / (t - prev_t) / (cfg.link_capacity_mbps * 1e6);
                if (link > 1) link = 1;
                if (!(link >= 0)) link = 0;
                prev_b = b, prev_t = t;
            }
            struct stat st;
            if (cfg.ckpt_path[0] && !stat(cfg.ckpt_path, &st)) {
                struct timespec rt;
                clock_gettime(CLOCK_REALTIME, &rt);
                double age = (double)(rt.tv_sec - st.st_mtim.tv_sec) + 1e-9 * (double)(rt.tv_nsec - st.st_mtim.tv_nsec);
                ckpt = age * 1000.0 < (double)cfg.ckpt_hold_ms ? 1 : 0;
            }
            char body[256], qs[48] = "";
            double q = queue_now();
            if (q >= 0) snprintf(qs, sizeof qs, "queue_depth %.0f\n", q); /* unreadable: not reported */
            snprintf(body, sizeof body, "request_rate %.6f\nlink_util %.6f\ncheckpoint %g\n%s",
                     rate_now(t, (double)cfg.window_ms / 1000.0), link, ckpt, qs);
            reply(fd, "200 OK", body);
        }
        close(fd);
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    static const dl_cfg_main preamble = {
        "dloco-serve",
        "usage: dloco-serve [--name value ...]\nserving sidecar of the sync-timing bench (docs/SYNC_TIMING.md)\n"};
    int rc;
    if (dl_cfg_main_parse(table, NCFG, &cfg, &preamble, argc, argv, &rc)) return rc;
    if ((rc = dl_event_open(cfg.events, "serve"))) {
        fprintf(stderr, "dloco-serve: events: %s\n", dl_errmsg());
        return 2;
    }
    char wa[64], pa[64];
    int wfd = listen_on(cfg.listen, wa, sizeof wa);
    int pfd = wfd < 0 ? -1 : listen_on(cfg.pressure_listen, pa, sizeof pa);
    if (wfd < 0 || pfd < 0) return 2;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    work_lfd = wfd;
    pthread_t th;
    if (pthread_create(&th, NULL, pressure_thread, &pfd)) {
        fprintf(stderr, "dloco-serve: cannot start the pressure thread\n");
        close(wfd);
        close(pfd);
        return 2;
    }
    dl_event("serve_start", "work=%s pressure=%s work_iters=%lld slo_ms=%g", wa, pa, (long long)cfg.work_iters,
             cfg.slo_ms);
    printf("dloco-serve: /work on %s, /pressure on %s\n", wa, pa);
    fflush(stdout);
    size_t cap = 4096, n = 0;
    double *lat = dl_xmalloc(cap * sizeof *lat);
    uint64_t viol = 0;
    while (!stop) {
        struct pollfd pf = {.fd = wfd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0) continue;
        int fd = accept(wfd, NULL, NULL);
        if (fd < 0) continue;
        double t0 = now_s();
        arrived(t0);
        serving = 1;
        char path[512];
        if (read_request(fd, "/work", path, sizeof path) == 0) {
            work(cfg.work_iters);
            reply(fd, "200 OK", "ok\n");
            double ms = (now_s() - t0) * 1e3;
            if (n == cap) lat = dl_xrealloc(lat, (cap *= 2) * sizeof *lat);
            lat[n++] = ms;
            viol += ms > cfg.slo_ms;
        }
        close(fd);
        serving = 0;
    }
    pthread_join(th, NULL);
    qsort(lat, n, sizeof *lat, cmp_d);
    dl_event("serve_summary", "requests=%zu violations=%llu slo_ms=%g p50_ms=%.3f p99_ms=%.3f", n,
             (unsigned long long)viol, cfg.slo_ms, n ? lat[n / 2] : 0.0, n ? lat[(size_t)((double)(n - 1) * 0.99)] : 0.0);
    free(lat);
    close(wfd);
    close(pfd);
    return 0;
}
