/* core/httpd: a server on an ephemeral loopback port answers GET from the
 * published pages and refuses the rest: another method 405 (with Allow), a
 * body 413, an unknown path 404, a URL longer than the connection's memory
 * 414 or 431; a second server on the same port cannot bind. Hostile
 * clients: connections over the per-address limit are closed at once; 8
 * clients trickling a request head (slowloris) and 3000 idle connections
 * (each from its own address of 127.0.0.0/8) leave scrapes from 127.0.0.1
 * answered. */
#include "core/httpd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/err.h"
#include "tests/check.h"

/* Send req to addr and return the status code of the answer (0 on no answer);
 * the whole answer into buf. */
static int ask_for(const char *addr, const char *req, size_t reqlen, char *buf, size_t cap, int wait_s)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *colon = strrchr(addr, ':');
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = wait_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    buf[0] = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return 0;
    }
    for (size_t o = 0; o < reqlen;) {
        ssize_t k = send(fd, req + o, reqlen - o, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server may answer and close before reading it all */
        o += (size_t)k;
    }
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = recv(fd, buf + n, cap - 1 - n, 0)) > 0) n += (size_t)k;
    buf[n] = 0;
    close(fd);
    int code = 0;
    sscanf(buf, "HTTP/1.%*d %d", &code);
    return code;
}

static int ask(const char *addr, const char *req, size_t reqlen, char *buf, size_t cap)
{
    return ask_for(addr, req, reqlen, buf, cap, 10);
}

/* A TCP connection to 127.0.0.1:port from source address src (any of
 * 127.0.0.0/8, so the server sees another client address); nonblock: do not
 * wait for the handshake. -1 on failure. */
static int conn_from(const char *src, int port, int nonblock)
{
    int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    struct sockaddr_in me = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, src, &me.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (bind(fd, (struct sockaddr *)&me, sizeof me) ||
        (connect(fd, (struct sockaddr *)&to, sizeof to) && !(nonblock && errno == EINPROGRESS))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* n scrapes of /metrics from 127.0.0.1, each given 3 s: how many got 200. */
static int scrapes(const char *addr, int n)
{
    static char buf[4096];
    const char *get = "GET /metrics HTTP/1.0\r\n\r\n";
    int ok = 0;
    for (int i = 0; i < n; i++) ok += ask_for(addr, get, strlen(get), buf, sizeof buf, 3) == 200;
    return ok;
}

int main(void)
{
    dl_httpd_pages *pg = dl_httpd_pages_new();
    dl_httpd_pages_set(pg, "/metrics", "text/plain; version=0.0.4", "a 1\n", 4);
    dl_httpd_pages_set(pg, "/metrics", "text/plain; version=0.0.4", "a 2\n", 4); /* replaces */
    dl_httpd *h = NULL;
    CHECK(dl_httpd_open("127.0.0.1", dl_httpd_pages_handler, pg, &h) == DL_EINVAL, "no port");
    REQUIRE(dl_httpd_open("127.0.0.1:0", dl_httpd_pages_handler, pg, &h) == 0, "open: %s", dl_errmsg());
    const char *addr = dl_httpd_addr(h);
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0 && atoi(addr + 10) > 0, "bound %s", addr);
    char buf[65536];
    const char *get = "GET /metrics HTTP/1.0\r\n\r\n";
    CHECK_EQ(ask(addr, get, strlen(get), buf, sizeof buf), 200);
    CHECK(strstr(buf, "\r\n\r\na 2\n") != NULL, "latest body: %s", buf);
    CHECK(strstr(buf, "version=0.0.4") != NULL, "content type");
    const char *getq = "GET /metrics?x=1 HTTP/1.0\r\n\r\n";
    CHECK_EQ(ask(addr, getq, strlen(getq), buf, sizeof buf), 200);
    const char *unk = "GET /nope HTTP/1.0\r\n\r\n";
    CHECK_EQ(ask(addr, unk, strlen(unk), buf, sizeof buf), 404);
    const char *post = "POST /metrics HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello";
    CHECK_EQ(ask(addr, post, strlen(post), buf, sizeof buf), 405);
    CHECK(strstr(buf, "Allow: GET, HEAD") != NULL, "Allow header: %s", buf);
    const char *del = "DELETE /metrics HTTP/1.0\r\n\r\n";
    CHECK_EQ(ask(addr, del, strlen(del), buf, sizeof buf), 405);
    const char *body = "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    CHECK_EQ(ask(addr, body, strlen(body), buf, sizeof buf), 413);
    size_t ul = 64 * 1024;
    char *huge = malloc(ul + 64);
    int o = sprintf(huge, "GET /");
    memset(huge + o, 'a', ul);
    o += (int)ul;
    o += sprintf(huge + o, " HTTP/1.0\r\n\r\n");
    int code = ask(addr, huge, (size_t)o, buf, sizeof buf);
    CHECK(code == 414 || code == 431, "huge URL: %d", code);
    free(huge);
    /* still serving after all that */
    CHECK_EQ(ask(addr, get, strlen(get), buf, sizeof buf), 200);
    /* Slow and idle clients from one address hold at most DL_HTTPD_PER_ADDR_CONNS slots; scrapes from another
     * address are answered meanwhile. */
    int port = atoi(strrchr(addr, ':') + 1);
    int held[DL_HTTPD_PER_ADDR_CONNS];
    for (int i = 0; i < DL_HTTPD_PER_ADDR_CONNS; i++) {
        held[i] = conn_from("127.0.0.4", port, 0);
        CHECK(held[i] >= 0, "idle connection %d", i);
    }
    int extra = conn_from("127.0.0.4", port, 0);
    CHECK(extra >= 0, "one connection over the per-address limit is accepted by the kernel");
    struct timeval tv = {.tv_sec = 3};
    setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char one;
    CHECK(recv(extra, &one, 1, 0) == 0, "the connection over the per-address limit is closed at once");
    close(extra);
    CHECK_EQ(scrapes(addr, 5), 5);
    for (int i = 0; i < DL_HTTPD_PER_ADDR_CONNS; i++) close(held[i]);

    /* slowloris: 8 clients trickle a request head, a header line before each scrape */
    int slow[8];
    const char *head = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 8; i++) {
        slow[i] = conn_from("127.0.0.2", port, 0);
        CHECK(slow[i] >= 0 && send(slow[i], head, strlen(head), MSG_NOSIGNAL) > 0, "slow client %d", i);
    }
    int answered = 0;
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < 8; i++) send(slow[i], "X-a: b\r\n", 8, MSG_NOSIGNAL);
        answered += scrapes(addr, 1);
    }
    printf("slowloris (8 clients trickling a request head): %d of 5 scrapes answered\n", answered);
    CHECK_EQ(answered, 5);
    for (int i = 0; i < 8; i++) close(slow[i]);

    /* idle flood: 3000 connections that send nothing (descriptors permitting) */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int nflood = rl.rlim_cur > 3100 ? 3000 : (int)rl.rlim_cur - 100;
    int *flood = malloc((size_t)nflood * sizeof *flood);
    int opened = 0;
    for (int i = 0; i < nflood; i++) {
        flood[i] = conn_from("127.0.0.3", port, 1);
        if (flood[i] >= 0) opened++;
    }
    answered = scrapes(addr, 5);
    printf("idle flood (%d of %d connections opened): %d of 5 scrapes answered\n", opened, nflood, answered);
    CHECK(opened > 1000, "flood connections opened: %d", opened);
    CHECK_EQ(answered, 5);
    for (int i = 0; i < nflood; i++)
        if (flood[i] >= 0) close(flood[i]);
    free(flood);
    CHECK_EQ(ask(addr, get, strlen(get), buf, sizeof buf), 200);
    dl_httpd *h2 = NULL;
    CHECK(dl_httpd_open(addr, dl_httpd_pages_handler, pg, &h2) == DL_ENET, "same port twice");
    CHECK(h2 == NULL, "no handle on failure");
    dl_httpd_close(&h);
    dl_httpd_close(&h);
    CHECK(h == NULL, "closed");
    dl_httpd_pages_free(&pg);
    printf("test_httpd: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
