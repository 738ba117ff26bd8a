/* dloco error codes, the one dl_strerror(), a thread-local detail message,
 * and the check macros used at every library boundary (file:line on failure). */
#ifndef DL_CORE_ERR_H
#define DL_CORE_ERR_H

#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 0 is success; every failure is a negative DL_E* code. */
enum {
    DL_OK = 0,
    DL_EINVAL = -1,    /* invalid argument or config value */
    DL_ENOMEM = -2,    /* allocation failed */
    DL_EIO = -3,       /* read/write/open failed (errno in the detail) */
    DL_EFORMAT = -4,   /* file or message has the wrong magic/version/layout */
    DL_ETRUNC = -5,    /* file or message shorter than its header says */
    DL_ERANGE = -6,    /* value outside its allowed range */
    DL_EMISMATCH = -7, /* fingerprint / run id / shape does not match */
    DL_ENOTFOUND = -8, /* key, file or record absent */
    DL_ESTORE = -9,    /* LMDB failure */
    DL_ENET = -10,     /* ZeroMQ / socket failure */
    DL_EPROTO = -11,   /* peer broke the protocol */
    DL_ENODEV = -12,   /* no CUDA device */
    DL_ECUDA = -13,    /* CUDA / cuBLAS failure */
    DL_EAGAIN = -14,   /* try again later */
    DL_ETIMEDOUT = -15,/* deadline passed */
    DL_ESTALE = -16,   /* contribution too stale */
    DL_ECORRUPT = -17, /* checksum / invariant violated in stored data */
    DL_EPERM = -18,    /* not authorized: unknown or revoked key, file with unsafe permissions */
    /* -19..-21 are the learner library's public-only codes (include/dloco/learner.h: DLOCO_ESTATE,
     * DLOCO_ESTOPPED, DLOCO_ECALLBACK), fixed forever: never used here */
    DL_EBUSY = -22,    /* held by another process (a store open for writing): waiting does not help */
    DL_ECODE_MIN = -22
};

/* Short fixed text for a code ("invalid argument"); never NULL. */
const char *dl_strerror(int code);

/* Record a detail for the current thread and return `code`, so a failing
 * function can write `return dl_err(DL_EIO, "open %s: %s", p, strerror(errno));`.
 * The caller prints dl_strerror(code) and dl_errmsg(). */
int dl_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The detail text of the last dl_err() on this thread ("" if none). */
const char *dl_errmsg(void);
void dl_err_clear(void);

/* Broken invariant: print and abort. API misuse uses assert(). */
#define DL_PANIC(...)                                                          \
    do {                                                                       \
        fprintf(stderr, "dloco panic %s:%d: ", __FILE__, __LINE__);            \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
        abort();                                                               \
    } while (0)

/* Propagate a negative code. */
#define DL_TRY(expr)                                                           \
    do {                                                                       \
        int dl_try_rc_ = (expr);                                               \
        if (dl_try_rc_ < 0) return dl_try_rc_;                                 \
    } while (0)

/* ---- the one allocator wrapper. Every heap allocation of dloco goes
 * through these, so tests can fail any one of them on purpose.
 *
 * dl_xmalloc / dl_xcalloc / dl_xrealloc / dl_xaligned abort with file:line
 * when the allocation fails: out of memory is not a runtime condition dloco
 * recovers from. The dl_try_* twins return NULL instead, for the rare caller
 * with a real fallback or a size that comes from outside (a data file, a
 * model config, a checkpoint) and deserves a DL_ENOMEM naming what and how
 * much, each with a test that exercises it; and every path of the learner
 * library (include/dloco/learner.h: the plan, mailbox, node, sessions,
 * error feedback), whose caller may be a Python interpreter that must
 * survive (tests/test_learner_api.c fails each of its allocations in turn). dl_try_realloc leaves the old
 * block valid and unchanged when it fails. All results are released with
 * free(); zero-byte requests return a unique pointer.
 *
 * Failure injection: allocations are counted (1, 2, ...) across all threads;
 * the one numbered by the environment variable DLOCO_ALLOC_FAIL_AT=N (read
 * at the first allocation) or armed by dl_alloc_fail_after() fails, once.
 * An aborting variant then prints "dloco: injected allocation failure N at
 * file:line" and aborts; a dl_try_* variant returns NULL. */
void *dl_xmalloc_(size_t n, const char *file, int line);
void *dl_xcalloc_(size_t n, size_t sz, const char *file, int line);
void *dl_xrealloc_(void *p, size_t n, const char *file, int line);
/* `align` is a power of two and a multiple of sizeof(void *) (posix_memalign). */
void *dl_xaligned_(size_t align, size_t n, const char *file, int line);
void *dl_try_malloc_(size_t n, const char *file, int line);
void *dl_try_calloc_(size_t n, size_t sz, const char *file, int line);
void *dl_try_realloc_(void *p, size_t n, const char *file, int line);
void *dl_try_aligned_(size_t align, size_t n, const char *file, int line);
#define dl_xmalloc(n) dl_xmalloc_((n), __FILE__, __LINE__)
#define dl_xcalloc(n, sz) dl_xcalloc_((n), (sz), __FILE__, __LINE__)
#define dl_xrealloc(p, n) dl_xrealloc_((p), (n), __FILE__, __LINE__)
#define dl_xaligned(align, n) dl_xaligned_((align), (n), __FILE__, __LINE__)
#define dl_try_malloc(n) dl_try_malloc_((n), __FILE__, __LINE__)
#define dl_try_calloc(n, sz) dl_try_calloc_((n), (sz), __FILE__, __LINE__)
#define dl_try_realloc(p, n) dl_try_realloc_((p), (n), __FILE__, __LINE__)
#define dl_try_aligned(align, n) dl_try_aligned_((align), (n), __FILE__, __LINE__)

/* Fail the n-th allocation from now (1 = the next one); 0 disarms. Replaces
 * DLOCO_ALLOC_FAIL_AT. */
void dl_alloc_fail_after(long long n);
/* Allocations made through the wrappers so far (the numbers injection uses). */
long long dl_alloc_count(void);

#ifdef __cplusplus
}
#endif

#endif
