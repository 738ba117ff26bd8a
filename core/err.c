/* Error text, per-thread detail messages and checked allocation.
 * The detail buffer is thread-local so the comms thread and the training
 * thread never overwrite each other's messages. */
#include "core/err.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char dl_detail[512];
static _Thread_local char dl_full[640];

const char *dl_strerror(int code)
{
    switch (code) {
    case DL_OK: return "success";
    case DL_EINVAL: return "invalid argument";
    case DL_ENOMEM: return "out of memory";
    case DL_EIO: return "I/O error";
    case DL_EFORMAT: return "bad format";
    case DL_ETRUNC: return "truncated";
    case DL_ERANGE: return "value out of range";
    case DL_EMISMATCH: return "mismatch";
    case DL_ENOTFOUND: return "not found";
    case DL_ESTORE: return "store error";
    case DL_ENET: return "network error";
    case DL_EPROTO: return "protocol error";
    case DL_ENODEV: return "no CUDA device";
    case DL_ECUDA: return "CUDA error";
    case DL_EAGAIN: return "try again";
    case DL_ETIMEDOUT: return "timed out";
    case DL_ESTALE: return "too stale";
    case DL_ECORRUPT: return "corrupt data";
    default: return "unknown error";
    }
}

int dl_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dl_detail, sizeof dl_detail, fmt, ap);
    va_end(ap);
    return code;
}

const char *dl_errmsg(void)
{
    if (!dl_detail[0]) return "";
    snprintf(dl_full, sizeof dl_full, "%s", dl_detail);
    return dl_full;
}

void dl_err_clear(void) { dl_detail[0] = 0; }

void *dl_xmalloc_(size_t n, const char *file, int line)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "dloco: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
        abort();
    }
    return p;
}

void *dl_xcalloc_(size_t n, size_t sz, const char *file, int line)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "dloco: out of memory allocating %zu x %zu bytes at %s:%d\n", n, sz, file, line);
        abort();
    }
    return p;
}
