/* core/httpd: a server on an ephemeral loopback port answers GET from the
 * published pages and refuses the rest: another method 405 (with Allow), a
 * body 413, an unknown path 404, a URL longer than the connection's memory
 * 414 or 431; a second server on the same port cannot bind. */
#include "core/httpd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
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
    /* DL_HTTPD_MAX_CONNS idle connections hold every slot: one more waits unanswered (in the backlog, until
     * a slot frees: at the latest after DL_HTTPD_TIMEOUT_S); once they close, it is served */
    int idle[DL_HTTPD_MAX_CONNS];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(strrchr(addr, ':') + 1))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    for (int i = 0; i < DL_HTTPD_MAX_CONNS; i++) {
        idle[i] = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(connect(idle[i], (struct sockaddr *)&sa, sizeof sa) == 0, "idle connection %d", i);
    }
    usleep(200000); /* let the server accept them all */
    CHECK_EQ(ask_for(addr, get, strlen(get), buf, sizeof buf, 1), 0); /* 1 s < the 5 s idle timeout */
    for (int i = 0; i < DL_HTTPD_MAX_CONNS; i++) close(idle[i]);
    int code2 = 0;
    for (int tries = 0; tries < 50 && code2 != 200; tries++) {
        code2 = ask(addr, get, strlen(get), buf, sizeof buf);
        if (code2 != 200) usleep(20000);
    }
    CHECK_EQ(code2, 200);
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
