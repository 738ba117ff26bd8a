/* A small, bounded HTTP server for read-only endpoints (metrics, status)
 * on libmicrohttpd's own thread: GET (and HEAD) only, a bounded number of
 * connections in all and per client address, an idle timeout per connection,
 * a bounded accept queue, no request bodies. Slow or idle clients from one
 * address hold at most DL_HTTPD_PER_ADDR_CONNS slots: a scrape from another
 * address is still answered. Nothing it serves changes
 * state: the handler runs on the server's thread and must only read what
 * another thread published (dl_httpd_pages does that under a mutex). */
#ifndef DL_CORE_HTTPD_H
#define DL_CORE_HTTPD_H

#include <stddef.h>

/* Limits of one server. */
#define DL_HTTPD_MAX_CONNS 64      /* concurrent connections; more wait in the accept queue until one closes */
#define DL_HTTPD_PER_ADDR_CONNS 4  /* concurrent connections from one client address; more are closed at once */
#define DL_HTTPD_BACKLOG 64        /* connections the kernel queues while every slot is taken */
#define DL_HTTPD_TIMEOUT_S 5       /* a connection that sends or reads nothing for this long is closed */
#define DL_HTTPD_CONN_MEMORY 16384 /* bytes per connection for the request head: a longer URL or head gets 414/431 */

typedef struct {
    int status;        /* HTTP status, e.g. 200, 404 */
    const char *ctype; /* Content-Type (static string) */
    char *body;        /* malloc'd; the server frees it */
    size_t len;
} dl_httpd_reply;

/* Fill *out for GET path (the URL path, query included as sent); runs on the
 * server's thread. Return 0, or a negative code for a 500. */
typedef int (*dl_httpd_handler)(void *ctx, const char *path, dl_httpd_reply *out);

typedef struct dl_httpd dl_httpd;

/* Listen on addr ("HOST:PORT", HOST an IPv4 literal or a name that resolves
 * to one, PORT 0 = ephemeral) and serve. Methods other than GET/HEAD get
 * 405 with "Allow: GET, HEAD"; a request with a body gets 413. Errors:
 * DL_EINVAL (malformed addr), DL_ENET (cannot bind: in use, no such
 * address), with a message naming addr. */
int dl_httpd_open(const char *addr, dl_httpd_handler handler, void *ctx, dl_httpd **out);
/* The bound address, "HOST:PORT" with the port resolved. */
const char *dl_httpd_addr(const dl_httpd *h);
/* Stop the server thread (waits for it) and free. Safe on NULL / twice. */
void dl_httpd_close(dl_httpd **h);

/* Published documents: a few paths, each the latest copy a producer thread
 * set; the server thread serves copies under a mutex. */
typedef struct dl_httpd_pages dl_httpd_pages;
dl_httpd_pages *dl_httpd_pages_new(void);
/* Replace path's document (copied). At most 8 paths. */
void dl_httpd_pages_set(dl_httpd_pages *pg, const char *path, const char *ctype, const char *body, size_t len);
/* A dl_httpd_handler over pages (ctx = the pages): 200 with the document,
 * 404 for a path never set. The
 * query string is ignored. */
int dl_httpd_pages_handler(void *ctx, const char *path, dl_httpd_reply *out);
void dl_httpd_pages_free(dl_httpd_pages **pg);

#endif
