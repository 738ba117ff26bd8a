/* Tests for chaos/relay: a real ROUTER behind the relay and real DEALERs in
 * front of it; every impairment checked on what arrives (counts, contents, order). */
#define _GNU_SOURCE /* usleep */
#include "chaos/relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "core/clock.h"
#include "core/err.h"
#include "tests/check.h"

// ---------------------------------------------------------------------------
// multipart messages

#define MP_MAX 8

typedef struct {
    int n;
    size_t len[MP_MAX];
    uint8_t *data[MP_MAX];
} mp;

static void mp_free(mp *m)
{
    for (int i = 0; i < m->n; i++) free(m->data[i]);
    m->n = 0;
}

/* Receive one whole message within timeout_ms: its frame count, 0 on timeout. */
static int mp_recv(void *sock, int timeout_ms, mp *m)
{
    m->n = 0;
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return 0;
    int more = 1;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            zmq_msg_close(&f);
            mp_free(m);
            return 0;
        }
        more = zmq_msg_more(&f);
        if (m->n < MP_MAX) {
            size_t len = zmq_msg_size(&f);
            m->data[m->n] = malloc(len + 1);
            memcpy(m->data[m->n], zmq_msg_data(&f), len);
            m->data[m->n][len] = 0; /* so text frames print and compare as strings */
            m->len[m->n++] = len;
        }
        zmq_msg_close(&f);
    }
    return m->n;
}

/* Frame i of m equals the string s. */
static int mp_is(const mp *m, int i, const char *s)
{
    return i < m->n && m->len[i] == strlen(s) && memcmp(m->data[i], s, m->len[i]) == 0;
}

static void send_str(void *sock, const char *s, int more)
{
    REQUIRE(zmq_send(sock, s, strlen(s), more ? ZMQ_SNDMORE : 0) >= 0, "send: %s", zmq_strerror(zmq_errno()));
}

static void send_buf(void *sock, const void *p, size_t n, int more)
{
    REQUIRE(zmq_send(sock, p, n, more ? ZMQ_SNDMORE : 0) >= 0, "send: %s", zmq_strerror(zmq_errno()));
}

/* Byte k of the payload of message i: a pattern that catches shifted,
 * truncated and swapped bodies. */
static uint8_t pat(int i, size_t k) { return (uint8_t)(i * 31 + k * 7 + (k >> 8)); }

// ---------------------------------------------------------------------------
// the fixture: ROUTER <- relay <- DEALER "learner-1"

static void *ctx, *router, *dealer;
static dl_relay *relay;
static int router_port;
static const dl_relay_impair CLEAR = {0};

static void *dealer_open(const char *id, int port, int heartbeat_ms)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    REQUIRE(d, "zmq_socket");
    int zero = 0, ivl = 50, big = 1 << 30;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(d, ZMQ_SNDHWM, &big, sizeof big);
    zmq_setsockopt(d, ZMQ_RCVHWM, &big, sizeof big);
    REQUIRE(zmq_setsockopt(d, ZMQ_ROUTING_ID, id, strlen(id)) == 0, "routing id");
    if (heartbeat_ms) {
        int timeout = heartbeat_ms * 5;
        zmq_setsockopt(d, ZMQ_HEARTBEAT_IVL, &heartbeat_ms, sizeof heartbeat_ms);
        zmq_setsockopt(d, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout);
    }
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    REQUIRE(zmq_connect(d, ep) == 0, "connect %s", ep);
    return d;
}

static dl_relay *relay_open(size_t queue_max, int upstream_port)
{
    dl_relay_cfg cfg = {.listen_host = "127.0.0.1",
                        .listen_port = 0,
                        .upstream_host = "127.0.0.1",
                        .upstream_port = upstream_port,
                        .seed = 42,
                        .queue_max_bytes = queue_max};
    dl_relay *r = NULL;
    int rc = dl_relay_open(&cfg, &r);
    REQUIRE(rc == 0 && r, "dl_relay_open: %s %s", dl_strerror(rc), dl_errmsg());
    CHECK(dl_relay_port(r) > 0, "port %d", dl_relay_port(r));
    return r;
}

/* One message from dealer `d` reaches the ROUTER under routing id `id`. */
static void expect_hello(void *d, const char *id)
{
    send_str(d, "hello", 0);
    mp m;
    int n = mp_recv(router, 5000, &m);
    REQUIRE(n == 2 && mp_is(&m, 0, id) && mp_is(&m, 1, "hello"), "hello via the relay from %s: %d frames", id, n);
    mp_free(&m);
}

/* Nothing arrives on sock within ms. */
static int quiet(void *sock, int ms)
{
    mp m;
    int got = 0;
    while (mp_recv(sock, ms, &m) > 0) {
        got++;
        mp_free(&m);
        ms = 1;
    }
    return got == 0;
}

static dl_relay_stats stats(void)
{
    dl_relay_stats s;
    dl_relay_stats_get(relay, &s);
    return s;
}

// ---------------------------------------------------------------------------
// cases

static void test_passthrough(void)
{
    int before = checks;
    enum { N = 200 };
    dl_relay_stats s0 = stats();
    uint8_t *buf = malloc(400 << 10);
    size_t total = 0;
    for (int dir = 0; dir < 2; dir++) {
        void *from = dir == 0 ? dealer : router, *to = dir == 0 ? router : dealer;
        for (int i = 0; i < N; i++) {
            size_t len = (size_t)(i * 37) % 2000 + (i == 100 ? (300u << 10) + 7 : 0);
            for (size_t k = 0; k < len; k++) buf[k] = pat(i + dir, k);
            char hdr[32];
            snprintf(hdr, sizeof hdr, "m%d", i);
            if (dir == 1) send_str(from, "learner-1", 1);
            send_str(from, hdr, 1);
            send_buf(from, buf, len, i % 3 == 0);
            if (i % 3 == 0) send_str(from, "tail", 0);
            if (dir == 0) total += len;
        }
        int ok = 0, off = dir == 0 ? 1 : 0; /* the ROUTER prepends the routing id */
        for (int i = 0; i < N; i++) {
            mp m;
            int n = mp_recv(to, 5000, &m);
            char hdr[32];
            snprintf(hdr, sizeof hdr, "m%d", i);
            size_t len = (size_t)(i * 37) % 2000 + (i == 100 ? (300u << 10) + 7 : 0);
            int good = n == off + 2 + (i % 3 == 0) && mp_is(&m, off, hdr) && m.len[off + 1] == len;
            if (dir == 0) good = good && mp_is(&m, 0, "learner-1");
            for (size_t k = 0; good && k < len; k++) good = m.data[off + 1][k] == pat(i + dir, k);
            if (good && i % 3 == 0) good = mp_is(&m, off + 2, "tail");
            CHECK(good, "%s message %d: %d frames, header \"%s\"", dir == 0 ? "up" : "down", i, n,
                  n > off ? (char *)m.data[off] : "");
            ok += good;
            mp_free(&m);
            if (!n) break;
        }
        CHECK_EQ(ok, N);
    }
    dl_relay_stats s1 = stats();
    CHECK_EQ(s1.up_msgs - s0.up_msgs, N);
    CHECK_EQ(s1.down_msgs - s0.down_msgs, N);
    CHECK(s1.up_bytes - s0.up_bytes > total, "up_bytes %llu for %zu payload bytes",
          (unsigned long long)(s1.up_bytes - s0.up_bytes), total);
    CHECK(s1.down_bytes - s0.down_bytes > total, "down_bytes %llu", (unsigned long long)(s1.down_bytes - s0.down_bytes));
    CHECK_EQ(s1.dropped + s1.duplicated + s1.reordered + s1.replayed, 0);
    free(buf);
    printf("pass-through: %d checks\n", checks - before);
}

static void test_delay(void)
{
    int before = checks;
    dl_relay_impair imp = {.delay_ms = 40};
    dl_relay_set(relay, &imp);
    dl_relay_impair got;
    dl_relay_get(relay, &got);
    CHECK(got.delay_ms == 40, "get delay %g", got.delay_ms);
    for (int round = 0; round < 3; round++) {
        double t0 = dl_clock_s();
        send_str(dealer, "ping", 0);
        mp m;
        int n = mp_recv(router, 5000, &m);
        CHECK(n == 2 && mp_is(&m, 1, "ping"), "ping: %d frames", n);
        mp_free(&m);
        send_str(router, "learner-1", 1);
        send_str(router, "pong", 0);
        n = mp_recv(dealer, 5000, &m);
        double rtt = dl_clock_s() - t0;
        CHECK(n == 1 && mp_is(&m, 0, "pong"), "pong: %d frames", n);
        mp_free(&m);
        CHECK(rtt >= 0.080, "round trip %.1f ms with 40 ms one-way", rtt * 1e3);
    }
    /* Jitter without reordering keeps the order. */
    imp = (dl_relay_impair){.delay_ms = 5, .jitter_ms = 30};
    dl_relay_set(relay, &imp);
    for (int i = 0; i < 50; i++) {
        char b[16];
        snprintf(b, sizeof b, "j%d", i);
        send_str(dealer, b, 0);
    }
    int inorder = 0;
    for (int i = 0; i < 50; i++) {
        mp m;
        char b[16];
        snprintf(b, sizeof b, "j%d", i);
        if (!mp_recv(router, 5000, &m)) break;
        inorder += mp_is(&m, 1, b);
        mp_free(&m);
    }
    CHECK_EQ(inorder, 50);
    dl_relay_set(relay, &CLEAR);
    printf("delay: %d checks\n", checks - before);
}

static void test_loss(void)
{
    int before = checks;
    /* A second learner that heartbeats every 50 ms and gives the connection
     * up after 250 ms without an answer: if the relay dropped commands
     * (PING/PONG) with the messages, it would reconnect. */
    void *d2 = dealer_open("learner-2", dl_relay_port(relay), 50);
    expect_hello(d2, "learner-2");
    dl_relay_stats s0 = stats();
    dl_relay_impair imp = {.loss = 1.0};
    dl_relay_set(relay, &imp);
    for (int i = 0; i < 20; i++) send_str(d2, "lost", 0);
    send_str(router, "learner-2", 1);
    send_str(router, "lost-down", 0);
    CHECK(quiet(router, 700), "messages arrived at the ROUTER with loss 1.0");
    CHECK(quiet(d2, 1), "a message arrived at the DEALER with loss 1.0");
    dl_relay_stats s1 = stats();
    CHECK_EQ(s1.dropped - s0.dropped, 21);
    dl_relay_set(relay, &CLEAR);
    for (int i = 0; i < 5; i++) {
        char b[16];
        snprintf(b, sizeof b, "after%d", i);
        send_str(d2, b, 0);
    }
    int ok = 0;
    for (int i = 0; i < 5; i++) {
        mp m;
        char b[16];
        snprintf(b, sizeof b, "after%d", i);
        if (!mp_recv(router, 5000, &m)) break;
        ok += mp_is(&m, 0, "learner-2") && mp_is(&m, 1, b);
        mp_free(&m);
    }
    CHECK_EQ(ok, 5);
    dl_relay_stats s2 = stats();
    CHECK(s2.conns_accepted == s0.conns_accepted, "the learner reconnected during the loss: %llu -> %llu accepted",
          (unsigned long long)s0.conns_accepted, (unsigned long long)s2.conns_accepted);
    zmq_close(d2);
    printf("loss: %d checks\n", checks - before);
}

static void test_duplicate(void)
{
    int before = checks;
    dl_relay_stats s0 = stats();
    dl_relay_impair imp = {.duplicate = 1.0};
    dl_relay_set(relay, &imp);
    for (int i = 0; i < 10; i++) {
        char b[16];
        snprintf(b, sizeof b, "d%d", i);
        send_str(dealer, b, 0);
        send_str(router, "learner-1", 1);
        send_str(router, b, 0);
    }
    for (int dir = 0; dir < 2; dir++) {
        void *to = dir == 0 ? router : dealer;
        int off = dir == 0 ? 1 : 0, ok = 0;
        for (int i = 0; i < 20; i++) {
            mp m;
            char b[16];
            snprintf(b, sizeof b, "d%d", i / 2);
            if (!mp_recv(to, 5000, &m)) break;
            ok += mp_is(&m, off, b);
            mp_free(&m);
        }
        CHECK(ok == 20, "%s: %d of 20 copies in place", dir == 0 ? "up" : "down", ok);
    }
    dl_relay_set(relay, &CLEAR);
    CHECK(quiet(router, 100) && quiet(dealer, 1), "more than two copies");
    dl_relay_stats s1 = stats();
    CHECK_EQ(s1.duplicated - s0.duplicated, 20);
    CHECK_EQ(s1.up_msgs - s0.up_msgs, 20);
    printf("duplicate: %d checks\n", checks - before);
}

static void test_reorder(void)
{
    int before = checks;
    enum { N = 100 };
    dl_relay_stats s0 = stats();
    dl_relay_impair imp = {.reorder = 0.5};
    dl_relay_set(relay, &imp);
    for (int i = 0; i < N; i++) {
        char b[16];
        snprintf(b, sizeof b, "%d", i);
        send_str(dealer, b, 0);
    }
    int seen[N] = {0}, got = 0, inversions = 0, last = -1;
    for (int i = 0; i < N; i++) {
        mp m;
        if (mp_recv(router, 5000, &m) < 2) break;
        int v = atoi((char *)m.data[1]);
        if (v >= 0 && v < N && !seen[v]) {
            seen[v] = 1;
            got++;
        }
        if (v < last) inversions++;
        last = v;
        mp_free(&m);
    }
    dl_relay_set(relay, &CLEAR);
    CHECK_EQ(got, N);
    CHECK(inversions > 0, "no message arrived out of order");
    dl_relay_stats s1 = stats();
    CHECK(s1.reordered > s0.reordered, "stats.reordered %llu", (unsigned long long)s1.reordered);
    CHECK_EQ(s1.up_msgs - s0.up_msgs, N);
    printf("reorder: %d checks (%d inversions, %llu held)\n", checks - before, inversions,
           (unsigned long long)(s1.reordered - s0.reordered));
}

static void test_partition(void)
{
    int before = checks;
    enum { N = 20 };
    dl_relay_impair imp = {.partitioned = 1};
    dl_relay_set(relay, &imp);
    for (int i = 0; i < N; i++) {
        char b[16];
        snprintf(b, sizeof b, "p%d", i);
        send_str(dealer, b, 0);
        send_str(router, "learner-1", 1);
        send_str(router, b, 0);
    }
    CHECK(quiet(router, 400), "a message crossed the partition upward");
    CHECK(quiet(dealer, 1), "a message crossed the partition downward");
    dl_relay_set(relay, &CLEAR);
    for (int dir = 0; dir < 2; dir++) {
        void *to = dir == 0 ? router : dealer;
        int off = dir == 0 ? 1 : 0, ok = 0;
        for (int i = 0; i < N; i++) {
            mp m;
            char b[16];
            snprintf(b, sizeof b, "p%d", i);
            if (!mp_recv(to, 5000, &m)) break;
            ok += mp_is(&m, off, b);
            mp_free(&m);
        }
        CHECK(ok == N, "%s after the heal: %d of %d in order", dir == 0 ? "up" : "down", ok, N);
    }
    printf("partition: %d checks\n", checks - before);
}

static void test_replay(void)
{
    int before = checks;
    send_str(dealer, "replay-me", 1);
    send_str(dealer, "payload-xyz", 0);
    send_str(dealer, "bare", 0); /* one frame: not what the capture keeps over a real message */
    mp m;
    CHECK(mp_recv(router, 5000, &m) == 3 && mp_is(&m, 1, "replay-me"), "original");
    mp_free(&m);
    CHECK(mp_recv(router, 5000, &m) == 2 && mp_is(&m, 1, "bare"), "bare");
    mp_free(&m);
    dl_relay_stats s0 = stats();
    int rc = dl_relay_replay(relay);
    CHECK(rc == 0, "replay: %s %s", dl_strerror(rc), dl_errmsg());
    int n = mp_recv(router, 5000, &m);
    CHECK(n == 3 && mp_is(&m, 0, "learner-1") && mp_is(&m, 1, "replay-me") && mp_is(&m, 2, "payload-xyz"),
          "replayed copy: %d frames", n);
    mp_free(&m);
    CHECK(quiet(router, 100), "more than one copy replayed");
    dl_relay_stats s1 = stats();
    CHECK_EQ(s1.replayed - s0.replayed, 1);
    /* The connection carries on after the injection. */
    expect_hello(dealer, "learner-1");
    printf("replay: %d checks\n", checks - before);
}

static void test_rate(void)
{
    int before = checks;
    size_t len = 1u << 20;
    uint8_t *buf = malloc(len);
    for (size_t k = 0; k < len; k++) buf[k] = pat(7, k);
    dl_relay_impair imp = {.rate_mbit = 8};
    dl_relay_set(relay, &imp);
    double t0 = dl_clock_s();
    send_str(dealer, "bulk", 1);
    send_buf(dealer, buf, len, 0);
    mp m;
    int n = mp_recv(router, 10000, &m);
    double dt = dl_clock_s() - t0;
    CHECK(n == 3 && m.len[2] == len && memcmp(m.data[2], buf, len) == 0, "1 MiB through the rate limit: %d frames", n);
    mp_free(&m);
    CHECK(dt >= 0.9, "1 MiB at 8 Mbit/s took %.3f s", dt);
    dl_relay_set(relay, &CLEAR);
    free(buf);
    printf("rate: %d checks (%.2f s)\n", checks - before, dt);
}

/* A raw TCP client sends `bytes` and must see its connection closed. */
static int raw_rejected(const void *bytes, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0, "socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)dl_relay_port(relay))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s", strerror(errno));
    if (send(fd, bytes, n, MSG_NOSIGNAL) != (ssize_t)n) {
        close(fd);
        return 1; /* already reset */
    }
    int closed = 0;
    double t_end = dl_clock_s() + 5;
    while (!closed && dl_clock_s() < t_end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        char b[256];
        ssize_t k = recv(fd, b, sizeof b, 0); /* the ROUTER's greeting may come first */
        if (k <= 0) closed = 1;
    }
    close(fd);
    return closed;
}

static void test_hostile(void)
{
    int before = checks;
    dl_relay_stats s0 = stats();
    const char http[] = "GET / HTTP/1.0\r\nHost: sync\r\n\r\n";
    CHECK(raw_rejected(http, sizeof http - 1), "garbage: the pair stayed open");

    /* A valid NULL greeting, then a frame that announces 2^62 bytes: refused
     * from its header, nothing allocated for it. */
    uint8_t g[64 + 9] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 1, 'N', 'U', 'L', 'L'};
    g[64] = 0x02; /* LONG */
    g[65] = 0x40;
    CHECK(raw_rejected(g, sizeof g), "huge frame: the pair stayed open");
    /* Reserved flag bits. */
    g[64] = 0x80;
    g[65] = 0;
    CHECK(raw_rejected(g, 66), "reserved flags: the pair stayed open");
    /* A ZMTP 2 peer (major version 1). */
    g[10] = 1;
    CHECK(raw_rejected(g, 64), "old version: the pair stayed open");

    dl_relay_stats s1 = stats();
    CHECK_EQ(s1.conns_bad_framing - s0.conns_bad_framing, 4);
    CHECK_EQ(s1.conns_accepted - s0.conns_accepted, 4);
    /* The relay goes on serving the real learner. */
    expect_hello(dealer, "learner-1");
    send_str(router, "learner-1", 1);
    send_str(router, "still-here", 0);
    mp m;
    CHECK(mp_recv(dealer, 5000, &m) == 1 && mp_is(&m, 0, "still-here"), "down after the hostile clients");
    mp_free(&m);
    printf("hostile: %d checks\n", checks - before);
}

/* A tiny queue under a partition: the relay stops reading (TCP back-pressure)
 * and loses nothing when the link heals. */
static void test_backpressure(void)
{
    int before = checks;
    enum { N = 200, LEN = 64 << 10 };
    dl_relay *r2 = relay_open(64 << 10, router_port);
    void *d3 = dealer_open("learner-3", dl_relay_port(r2), 0);
    int hwm = 1 << 30;
    zmq_setsockopt(d3, ZMQ_SNDHWM, &hwm, sizeof hwm);
    expect_hello(d3, "learner-3");
    dl_relay_impair imp = {.partitioned = 1};
    dl_relay_set(r2, &imp);
    uint8_t *buf = malloc(LEN);
    for (int i = 0; i < N; i++) {
        for (size_t k = 0; k < LEN; k++) buf[k] = pat(i, k);
        char b[16];
        snprintf(b, sizeof b, "bp%d", i);
        send_str(d3, b, 1);
        send_buf(d3, buf, LEN, 0);
    }
    CHECK(quiet(router, 300), "a message crossed the partition");
    dl_relay_set(r2, &CLEAR);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        mp m;
        char b[16];
        snprintf(b, sizeof b, "bp%d", i);
        if (!mp_recv(router, 5000, &m)) break;
        int good = m.n == 3 && mp_is(&m, 1, b) && m.len[2] == LEN;
        for (size_t k = 0; good && k < LEN; k++) good = m.data[2][k] == pat(i, k);
        ok += good;
        mp_free(&m);
    }
    CHECK(ok == N, "%d of %d 64 KiB messages intact and in order after the heal", ok, N);
    dl_relay_stats s;
    dl_relay_stats_get(r2, &s);
    CHECK_EQ(s.up_msgs, N + 1);
    zmq_close(d3);
    dl_relay_close(&r2);
    dl_relay_close(&r2); /* twice is fine */
    CHECK(r2 == NULL, "close NULLs the handle");
    free(buf);
    printf("back-pressure: %d checks\n", checks - before);
}

static void test_upstream_down(void)
{
    int before = checks;
    /* A port nobody listens on: bind one, note it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0,
            "bind");
    int dead_port = ntohs(a.sin_port);
    close(fd);
    dl_relay *r3 = relay_open(0, dead_port);
    CHECK(dl_relay_replay(r3) == DL_ENOTFOUND, "replay with nothing captured");
    void *d4 = dealer_open("learner-4", dl_relay_port(r3), 0);
    dl_relay_stats s = {0};
    double t_end = dl_clock_s() + 5;
    while (s.conns_failed_upstream == 0 && dl_clock_s() < t_end) {
        usleep(20000);
        dl_relay_stats_get(r3, &s);
    }
    CHECK(s.conns_failed_upstream >= 1, "no failed upstream counted");
    CHECK(s.conns_open == 0 || s.conns_failed_upstream >= 1, "open %llu", (unsigned long long)s.conns_open);
    zmq_close(d4);
    dl_relay_close(&r3);
    printf("upstream down: %d checks\n", checks - before);
}

static void test_cut(void)
{
    int before = checks;
    dl_relay_stats s0 = stats();
    int n = dl_relay_cut(relay);
    CHECK(n >= 1, "cut closed %d pairs", n);
    CHECK_EQ(stats().conns_open, 0);
    /* The DEALER reconnects by itself; keep sending until one gets through
     * (what was in flight at the cut may be gone). */
    int arrived = 0;
    double t_end = dl_clock_s() + 10;
    for (int i = 0; !arrived && dl_clock_s() < t_end; i++) {
        send_str(dealer, "after-cut", 0);
        mp m;
        if (mp_recv(router, 100, &m) && mp_is(&m, 0, "learner-1") && mp_is(&m, 1, "after-cut")) arrived = 1;
        mp_free(&m);
    }
    CHECK(arrived, "nothing arrived after the cut");
    quiet(router, 200);
    dl_relay_stats s1 = stats();
    CHECK(s1.conns_accepted > s0.conns_accepted, "no reconnection counted");
    send_str(router, "learner-1", 1);
    send_str(router, "down-after-cut", 0);
    mp m;
    CHECK(mp_recv(dealer, 5000, &m) >= 1, "down after the cut");
    int found = 0;
    do {
        found |= mp_is(&m, 0, "down-after-cut");
        mp_free(&m);
    } while (!found && mp_recv(dealer, 500, &m));
    CHECK(found, "down-after-cut missing");
    /* The capture's connection is gone: the replay goes on the new one. */
    int rc = dl_relay_replay(relay);
    CHECK(rc == 0, "replay after the cut: %s %s", dl_strerror(rc), dl_errmsg());
    int k = mp_recv(router, 5000, &m);
    CHECK(k == 3 && mp_is(&m, 0, "learner-1") && mp_is(&m, 1, "replay-me"), "replay on the new connection: %d frames",
          k);
    mp_free(&m);
    printf("cut: %d checks\n", checks - before);
}

static void test_open_errors(void)
{
    dl_relay *r = NULL;
    dl_relay_cfg cfg = {.listen_host = "127.0.0.1", .upstream_host = "127.0.0.1", .upstream_port = 0};
    CHECK(dl_relay_open(&cfg, &r) == DL_EINVAL && !r, "upstream port 0");
    cfg.upstream_port = 70000;
    CHECK(dl_relay_open(&cfg, &r) == DL_EINVAL && !r, "upstream port 70000");
    cfg.upstream_port = 1;
    cfg.listen_host = NULL;
    CHECK(dl_relay_open(&cfg, &r) == DL_EINVAL && !r, "no listen host");
    cfg.listen_host = "256.1.1.1";
    CHECK(dl_relay_open(&cfg, &r) == DL_ENET && !r, "bad listen host: %s", dl_errmsg());
    dl_relay_close(NULL);
    dl_relay_close(&r);
}

int main(void)
{
    double t0 = dl_clock_s();
    test_open_errors();
    ctx = zmq_ctx_new();
    REQUIRE(ctx, "zmq_ctx_new");
    router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, one = 1, big = 1 << 30;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    /* After a cut the learner comes back under the same routing id, maybe
     * before this ROUTER noticed the old connection died. */
    zmq_setsockopt(router, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    zmq_setsockopt(router, ZMQ_SNDHWM, &big, sizeof big);
    zmq_setsockopt(router, ZMQ_RCVHWM, &big, sizeof big);
    REQUIRE(zmq_bind(router, "tcp://127.0.0.1:*") == 0, "bind: %s", zmq_strerror(zmq_errno()));
    char ep[256];
    size_t sz = sizeof ep;
    REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &sz) == 0, "last endpoint");
    router_port = atoi(strrchr(ep, ':') + 1);
    relay = relay_open(0, router_port);
    CHECK(dl_relay_replay(relay) == DL_ENOTFOUND, "replay before any connection");
    dealer = dealer_open("learner-1", dl_relay_port(relay), 0);
    expect_hello(dealer, "learner-1");
    dl_relay_stats s = stats();
    CHECK_EQ(s.conns_accepted, 1);
    CHECK_EQ(s.conns_open, 1);

    test_passthrough();
    test_delay();
    test_loss();
    test_duplicate();
    test_reorder();
    test_partition();
    test_replay();
    test_rate();
    test_hostile();
    test_backpressure();
    test_upstream_down();
    test_cut();

    zmq_close(dealer);
    zmq_close(router);
    dl_relay_close(&relay);
    zmq_ctx_term(ctx);
    printf("test_relay: %.1f s\n", dl_clock_s() - t0);
    return CHECK_DONE("test_relay");
}
