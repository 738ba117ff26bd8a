/* Error text, per-thread detail messages and the one allocator wrapper with
 * failure injection. The detail buffer is thread-local so the comms thread
 * and the training thread never overwrite each other's messages. */
#include "core/err.h"
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
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
    case DL_EPERM: return "not authorized";
    case DL_EBUSY: return "in use";
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

/* ---- allocation. The counter and the armed number are atomics, so the
 * comms thread and the training thread share one numbering. */

static atomic_llong dl_alloc_n;       /* allocations so far */
static atomic_llong dl_alloc_fail_at; /* the number that fails; 0 = none */
static pthread_once_t dl_alloc_env_once = PTHREAD_ONCE_INIT;

static void alloc_read_env(void)
{
    const char *v = getenv("DLOCO_ALLOC_FAIL_AT");
    if (v && *v) atomic_store(&dl_alloc_fail_at, strtoll(v, NULL, 10));
}

void dl_alloc_fail_after(long long n)
{
    pthread_once(&dl_alloc_env_once, alloc_read_env); /* so the env var cannot re-arm later */
    atomic_store(&dl_alloc_fail_at, n > 0 ? atomic_load(&dl_alloc_n) + n : 0);
}

long long dl_alloc_count(void) { return atomic_load(&dl_alloc_n); }

/* Number this allocation; its number when it must fail, else 0. */
static long long alloc_injected(void)
{
    pthread_once(&dl_alloc_env_once, alloc_read_env);
    long long k = atomic_fetch_add(&dl_alloc_n, 1) + 1;
    long long at = atomic_load(&dl_alloc_fail_at);
    return at > 0 && k == at ? k : 0;
}

static void alloc_die(long long injected, size_t n, const char *file, int line)
{
    if (injected) fprintf(stderr, "dloco: injected allocation failure %lld at %s:%d\n", injected, file, line);
    else if (dl_log_enabled(DL_LOG_DEBUG))
        fprintf(stderr, "dloco: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
    else
        fprintf(stderr, "dloco: out of memory allocating %zu bytes: give the process more memory, or use a smaller "
                        "model, batch or --pool_mb\n", n);
    abort();
}

void *dl_xmalloc_(size_t n, const char *file, int line)
{
    long long inj = alloc_injected();
    void *p = inj ? NULL : malloc(n ? n : 1);
    if (!p) alloc_die(inj, n, file, line);
    return p;
}

void *dl_xcalloc_(size_t n, size_t sz, const char *file, int line)
{
    long long inj = alloc_injected();
    void *p = inj ? NULL : calloc(n ? n : 1, sz ? sz : 1);
    if (!p) alloc_die(inj, n * sz, file, line);
    return p;
}

void *dl_xrealloc_(void *old, size_t n, const char *file, int line)
{
    long long inj = alloc_injected();
    void *p = inj ? NULL : realloc(old, n ? n : 1);
    if (!p) alloc_die(inj, n, file, line);
    return p;
}

void *dl_xaligned_(size_t align, size_t n, const char *file, int line)
{
    long long inj = alloc_injected();
    void *p = NULL;
    if (!inj && posix_memalign(&p, align, n ? n : 1)) p = NULL;
    if (!p) alloc_die(inj, n, file, line);
    return p;
}

void *dl_try_malloc_(size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (alloc_injected()) return NULL;
    return malloc(n ? n : 1);
}

void *dl_try_calloc_(size_t n, size_t sz, const char *file, int line)
{
    (void)file;
    (void)line;
    if (alloc_injected()) return NULL;
    return calloc(n ? n : 1, sz ? sz : 1);
}

void *dl_try_realloc_(void *old, size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (alloc_injected()) return NULL; /* old stays valid, as with realloc */
    return realloc(old, n ? n : 1);
}

void *dl_try_aligned_(size_t align, size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (alloc_injected()) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1)) return NULL;
    return p;
}
