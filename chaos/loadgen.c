/* dloco-loadgen: the seeded open-loop load generator of the sync-timing bench (docs/SYNC_TIMING.md).
 *
 * Sends GET --path to --target (127.0.0.1:PORT) at the arrival times of chaos/loadsched.h (regime, rate,
 * seed: the same traffic for every policy of a seed). Open loop: --conns client threads take the arrivals in
 * order, each waits for its arrival's time and sends; latency is measured from the scheduled time (a late
 * send, because every client was busy, counts as latency: no coordinated omission). A request that gets no
 * "HTTP/1.x 200" reply within --timeout_ms is an error and a violation.
 * --out: one line per request, "SCHED_UNIX_NS LATENCY_US OK" (OK 1/0), in arrival order, so a bench can
 * count violations inside any time window (the learner's training). At the end a `loadgen_summary` event
 * (requests, violations of --slo_ms, errors, p50/p99 ms). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "chaos/loadsched.h"
#include "core/config.h"
#include "core/err.h"
#include "core/event.h"

typedef struct {
    char target[DL_CFG_STRLEN], path[DL_CFG_STRLEN], regime[DL_CFG_STRLEN], out[DL_CFG_STRLEN],
        events[DL_CFG_STRLEN];
    double rate, burst_x, period_s, duty, duration_s, slo_ms;
    int64_t seed, conns, timeout_ms;
} lg_cfg;

#define F(x) offsetof(lg_cfg, x)
static const dl_cfg_entry table[] = {
    {"target", DL_CFG_STR, F(target), 0, 0, "127.0.0.1:8080", NULL, 0, "dloco-serve's /work listener, 127.0.0.1:PORT"},
    {"path", DL_CFG_STR, F(path), 0, 0, "/work", NULL, 0, "request path"},
    {"regime", DL_CFG_ENUM, F(regime), 0, 0, "steady", "steady|bursty|aperiodic", 0, "arrival regime (chaos/loadsched.h)"},
    {"rate", DL_CFG_FLOAT, F(rate), 0.001, 1e5, "20", NULL, 0, "base rate R", "requests/s"},
    {"burst_x", DL_CFG_FLOAT, F(burst_x), 1, 100, "4", NULL, 0, "burst rate factor X"},
    {"period_s", DL_CFG_FLOAT, F(period_s), 0.1, 3600, "6", NULL, 0, "burst period T (aperiodic: mean gap)"},
    {"duty", DL_CFG_FLOAT, F(duty), 0.01, 0.99, "0.3", NULL, 0, "burst length as a fraction of T"},
    {"duration_s", DL_CFG_FLOAT, F(duration_s), 0.001, 86400, "30", NULL, 0, "length of the schedule"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "1", NULL, 0, "schedule seed"},
    {"slo_ms", DL_CFG_FLOAT, F(slo_ms), 0.001, 1e6, "20", NULL, 0, "latency objective"},
    {"conns", DL_CFG_INT, F(conns), 1, 256, "16", NULL, 0, "concurrent client threads", "threads"},
    {"timeout_ms", DL_CFG_INT, F(timeout_ms), 1, 600000, "2000", NULL, 0, "a request without a reply by then is an error"},
    {"out", DL_CFG_STR, F(out), 0, 0, "", NULL, 0, "per-request lines 'SCHED_UNIX_NS LATENCY_US OK'; empty = none"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0, "append events (docs/EVENTS.md) here; empty = off"},
};
#undef F
#define NCFG (sizeof table / sizeof table[0])

static lg_cfg cfg;
static const double *times;
static int64_t ntimes;
static atomic_llong next_i;
static double *lat_us;
static char *ok;
static struct sockaddr_in dst;
static int64_t t0_mono, t0_real;
static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s, stop = 1; }

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int one_request(int64_t deadline)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int good = 0;
    char req[400], buf[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", cfg.path);
    struct timeval tv = {.tv_sec = cfg.timeout_ms / 1000, .tv_usec = (cfg.timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&dst, sizeof dst) == 0 && send(fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
        size_t got = 0;
        for (;;) {
            if (mono_ns() > deadline) break;
            ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
            if (r <= 0) break;
            got += (size_t)r;
            if (got == sizeof buf - 1) got = 12; /* keep the status line only */
        }
        buf[got] = 0;
        good = got >= 12 && (!strncmp(buf, "HTTP/1.0 200", 12) || !strncmp(buf, "HTTP/1.1 200", 12));
    }
    close(fd);
    return good;
}

static void *client(void *a)
{
    (void)a;
    for (;;) {
        long long i = atomic_fetch_add(&next_i, 1);
        if (i >= ntimes || stop) return NULL;
        int64_t at = t0_mono + (int64_t)(times[i] * 1e9);
        for (int64_t now = mono_ns(); now < at && !stop; now = mono_ns()) {
            int64_t d = at - now;
            struct timespec ts = {(time_t)(d / 1000000000), (long)(d % 1000000000)};
            nanosleep(&ts, NULL);
        }
        ok[i] = (char)one_request(at + (int64_t)cfg.timeout_ms * 1000000);
        lat_us[i] = (double)(mono_ns() - at) / 1e3;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    static const dl_cfg_main preamble = {
        "dloco-loadgen",
        "usage: dloco-loadgen [--name value ...]\n"
        "seeded open-loop load of the sync-timing bench (docs/SYNC_TIMING.md)\n"};
    int rc;
    if (dl_cfg_main_parse(table, NCFG, &cfg, &preamble, argc, argv, &rc)) return rc;
    static const char pre[] = "127.0.0.1:";
    char *end = NULL;
    long port = strncmp(cfg.target, pre, sizeof pre - 1) ? -1 : strtol(cfg.target + sizeof pre - 1, &end, 10);
    if (port < 1 || port > 65535 || !end || *end) {
        fprintf(stderr, "dloco-loadgen: bad configuration: target '%s' is not 127.0.0.1:PORT (PORT in [1, 65535])\n",
                cfg.target);
        return 2;
    }
    if (cfg.path[0] != '/' || strlen(cfg.path) > 200 || strpbrk(cfg.path, " \r\n\t")) {
        fprintf(stderr, "dloco-loadgen: bad configuration: path '%s' must start with / and hold no spaces (<= 200)\n",
                cfg.path);
        return 2;
    }
    dl_loadsched_cfg sc = {.rate = cfg.rate, .burst_x = cfg.burst_x, .period_s = cfg.period_s, .duty = cfg.duty,
                           .duration_s = cfg.duration_s, .seed = (uint64_t)cfg.seed};
    dl_loadsched *ls = NULL;
    if ((rc = dl_loadsched_parse(cfg.regime, &sc.regime)) || (rc = dl_loadsched_open(&sc, &ls))) {
        fprintf(stderr, "dloco-loadgen: bad configuration: %s\n", dl_errmsg());
        return 2;
    }
    if ((rc = dl_event_open(cfg.events, "loadgen"))) {
        fprintf(stderr, "dloco-loadgen: events: %s\n", dl_errmsg());
        return 2;
    }
    FILE *out = NULL;
    if (cfg.out[0] && !(out = fopen(cfg.out, "w"))) {
        fprintf(stderr, "dloco-loadgen: cannot write %s: %s\n", cfg.out, strerror(errno));
        return 2;
    }
    times = dl_loadsched_times(ls, &ntimes);
    lat_us = calloc((size_t)ntimes + 1, sizeof *lat_us);
    ok = calloc((size_t)ntimes + 1, 1);
    dst = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    t0_real = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
    t0_mono = mono_ns();
    dl_event("loadgen_start", "target=%s regime=%s rate=%g seed=%lld requests=%lld duration_s=%g t0_ns=%lld",
             cfg.target, cfg.regime, cfg.rate, (long long)cfg.seed, (long long)ntimes, cfg.duration_s,
             (long long)t0_real);
    pthread_t th[256];
    for (int i = 0; i < cfg.conns; i++) pthread_create(&th[i], NULL, client, NULL);
    for (int i = 0; i < cfg.conns; i++) pthread_join(th[i], NULL);
    long long done = atomic_load(&next_i);
    if (done > ntimes) done = ntimes;
    long long viol = 0, errs = 0;
    for (long long i = 0; i < done; i++) {
        errs += !ok[i];
        viol += !ok[i] || lat_us[i] > cfg.slo_ms * 1e3;
        if (out) fprintf(out, "%lld %.1f %d\n", (long long)(t0_real + (int64_t)(times[i] * 1e9)), lat_us[i], ok[i]);
    }
    if (out) fclose(out);
    qsort(lat_us, (size_t)done, sizeof *lat_us, cmp_d);
    dl_event("loadgen_summary", "requests=%lld violations=%lld errors=%lld slo_ms=%g p50_ms=%.3f p99_ms=%.3f stopped=%d",
             done, viol, errs, cfg.slo_ms, done ? lat_us[done / 2] / 1e3 : 0.0,
             done ? lat_us[(size_t)((double)(done - 1) * 0.99)] / 1e3 : 0.0, (int)stop);
    printf("dloco-loadgen: %lld requests, %lld over %g ms (%lld errors)\n", done, viol, cfg.slo_ms, errs);
    dl_loadsched_close(&ls);
    return 0;
}
