/* Bounded read-only HTTP server on libmicrohttpd (see httpd.h) and the
 * published-documents handler. */
#include "core/httpd.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "core/err.h"

struct dl_httpd {
    struct MHD_Daemon *d;
    dl_httpd_handler handler;
    void *ctx;
    char addr[80];
};

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *text, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* MHD calls this once per request head, then (for a body) again per piece:
 * every refusal is answered at the first call, so a body is never read. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    (void)upload_data;
    (void)con_cls;
    dl_httpd *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET only\n", "GET, HEAD");
    if (*upload_data_size) return reply_text(c, MHD_HTTP_CONTENT_TOO_LARGE, "no request bodies\n", NULL);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if ((cl && strcmp(cl, "0")) || MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
        return reply_text(c, MHD_HTTP_CONTENT_TOO_LARGE, "no request bodies\n", NULL);
    dl_httpd_reply out = {0};
    if (h->handler(h->ctx, url, &out) || !out.status) {
        free(out.body);
        return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error\n", NULL);
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(out.len, out.body ? out.body : (void *)"", out.body ? MHD_RESPMEM_MUST_FREE
                                                                                           : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(out.body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, out.ctype ? out.ctype : "text/plain; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)out.status, r);
    MHD_destroy_response(r);
    return ok;
}

static int parse_addr(const char *addr, struct sockaddr_in *sa)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1])
        return dl_err(DL_EINVAL, "metrics address '%s': expected HOST:PORT", addr);
    char host[256];
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host) return dl_err(DL_EINVAL, "metrics address '%s': host too long", addr);
    memcpy(host, addr, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) return dl_err(DL_EINVAL, "metrics address '%s': bad port", addr);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g || !res) return dl_err(DL_ENET, "metrics address '%s': %s", addr, gai_strerror(g));
    memcpy(sa, res->ai_addr, sizeof *sa);
    freeaddrinfo(res);
    sa->sin_port = htons((uint16_t)port);
    return 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    (void)fmt;
    (void)ap; /* bind failures come back as our own error; the rest is client noise */
}

int dl_httpd_open(const char *addr, dl_httpd_handler handler, void *ctx, dl_httpd **out)
{
    *out = NULL;
    struct sockaddr_in sa;
    DL_TRY(parse_addr(addr, &sa));
    dl_httpd *h = dl_try_calloc(1, sizeof *h);
    if (!h) return dl_err(DL_ENOMEM, "metrics server on %s: out of memory", addr);
    h->handler = handler;
    h->ctx = ctx;
    /* AUTO: epoll or poll, never select(), whose descriptors stop at 1024 */
    h->d = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)DL_HTTPD_MAX_CONNS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)DL_HTTPD_PER_ADDR_CONNS, MHD_OPTION_LISTEN_BACKLOG_SIZE,
                            (unsigned)DL_HTTPD_BACKLOG, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)DL_HTTPD_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)DL_HTTPD_CONN_MEMORY,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return dl_err(DL_ENET, "cannot listen on %s (in use, or not an address of this host)", addr);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(h->addr, sizeof h->addr, "%s:%u", ip, di ? (unsigned)di->port : (unsigned)ntohs(sa.sin_port));
    *out = h;
    return 0;
}

const char *dl_httpd_addr(const dl_httpd *h) { return h->addr; }

void dl_httpd_close(dl_httpd **hp)
{
    if (!hp || !*hp) return;
    MHD_stop_daemon((*hp)->d);
    free(*hp);
    *hp = NULL;
}

/* ------------------------------------------------------------------------ */
/* published documents */

#define DL_PAGES_MAX 8

struct dl_httpd_pages {
    pthread_mutex_t mu;
    int n;
    struct {
        char path[64];
        const char *ctype;
        char *body;
        size_t len;
    } page[DL_PAGES_MAX];
};

dl_httpd_pages *dl_httpd_pages_new(void)
{
    dl_httpd_pages *pg = dl_try_calloc(1, sizeof *pg);
    if (pg) pthread_mutex_init(&pg->mu, NULL);
    return pg;
}

void dl_httpd_pages_set(dl_httpd_pages *pg, const char *path, const char *ctype, const char *body, size_t len)
{
    char *copy = dl_try_malloc(len + 1);
    if (!copy) return; /* out of memory: the page published before stays */
    memcpy(copy, body, len);
    copy[len] = 0;
    pthread_mutex_lock(&pg->mu);
    int i = 0;
    while (i < pg->n && strcmp(pg->page[i].path, path)) i++;
    if (i == pg->n) {
        if (pg->n == DL_PAGES_MAX) DL_PANIC("more than %d published paths", DL_PAGES_MAX);
        snprintf(pg->page[i].path, sizeof pg->page[i].path, "%s", path);
        pg->n++;
    }
    char *old = pg->page[i].body;
    pg->page[i].ctype = ctype;
    pg->page[i].body = copy;
    pg->page[i].len = len;
    pthread_mutex_unlock(&pg->mu);
    free(old);
}

int dl_httpd_pages_handler(void *ctx, const char *path, dl_httpd_reply *out)
{
    dl_httpd_pages *pg = ctx;
    size_t pl = strcspn(path, "?");
    pthread_mutex_lock(&pg->mu);
    for (int i = 0; i < pg->n; i++) {
        if (strlen(pg->page[i].path) != pl || strncmp(pg->page[i].path, path, pl)) continue;
        out->status = 200;
        out->ctype = pg->page[i].ctype;
        out->len = pg->page[i].len;
        out->body = dl_try_malloc(out->len + 1);
        if (out->body) memcpy(out->body, pg->page[i].body, out->len);
        pthread_mutex_unlock(&pg->mu);
        return out->body ? 0 : DL_ENOMEM; /* a 500 to this request */
    }
    pthread_mutex_unlock(&pg->mu);
    static const char nf[] = "not found\n";
    out->status = 404;
    out->ctype = "text/plain; charset=utf-8";
    out->len = sizeof nf - 1;
    out->body = dl_try_malloc(sizeof nf);
    if (!out->body) return DL_ENOMEM;
    memcpy(out->body, nf, sizeof nf);
    return 0;
}

void dl_httpd_pages_free(dl_httpd_pages **pg)
{
    if (!pg || !*pg) return;
    for (int i = 0; i < (*pg)->n; i++) free((*pg)->page[i].body);
    pthread_mutex_destroy(&(*pg)->mu);
    free(*pg);
    *pg = NULL;
}
