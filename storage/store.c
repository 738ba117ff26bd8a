/* LMDB state store: encodings of every stored value, short transactions with
 * map growth that waits out open snapshots, block-wise fragment arrays, merge
 * commits, snapshots and the offline checker. */
#include "storage/store.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/shard.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* fp32 arrays are stored as host bytes and served zero-copy, so the on-disk
 * little-endian format needs a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "dloco store needs a little-endian host");
_Static_assert(sizeof(float) == 4, "fp32 must be 4 bytes");

// ----------------------------------------------------------------------------
// value formats: magic + format version at the start of every value

#define MAGIC4(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define MAGIC_SCHEMA MAGIC4('D', 'L', 'S', 'C')
#define MAGIC_RUN MAGIC4('D', 'L', 'R', 'N')
#define MAGIC_CONFIG MAGIC4('D', 'L', 'C', 'F')
#define MAGIC_EPOCH MAGIC4('D', 'L', 'E', 'P')
#define MAGIC_FRAG MAGIC4('D', 'L', 'F', 'R')
#define MAGIC_PBLK MAGIC4('D', 'L', 'P', 'B')
#define MAGIC_OBLK MAGIC4('D', 'L', 'O', 'B')
#define MAGIC_LEARNER MAGIC4('D', 'L', 'L', 'N')
#define MAGIC_MERGE MAGIC4('D', 'L', 'M', 'G')
#define MAGIC_LEDGER MAGIC4('D', 'L', 'L', 'G')
#define MAGIC_EVAL MAGIC4('D', 'L', 'E', 'V')
#define EVAL_LEN 40
#define FMT_VERSION 1u /* format version of every value kind above but the run (RUN_FMT) and fragment (FRAG_FMT) */

/* fragments value (format FRAG_FMT): the fragment's header; its params and
 * momentum are blocks in the params and outer databases.
 *   0 magic u32 | 4 fmt u32 | 8 p u32 | 12 blocks u32 | 16 version u64
 *  24 numel u64 | 32 block floats u32 | 36 reserved u32 | 40 wallclock ns i64 */
#define FRAG_HDR 48
#define FRAG_FMT 2u /* 1 (schema 2) was a 64-byte header followed by all the params */
/* params / outer value: block b of fragment p's params / momentum, elements
 * [b * BF, b * BF + n): a 48-byte header, then n fp32. In an LMDB overflow
 * page (16-byte page header) the floats start 64-byte aligned.
 *   0 magic u32 | 4 fmt u32 | 8 p u32 | 12 block u32 | 16 version u64
 *  24 n u32 | 28 reserved u32 | 32 XXH64 of the n floats | 40 reserved u64
 * Every block of an array of more than one block is stored at the full
 * size (the last one zero-padded after its n floats), so every value of a
 * large array takes the same number of pages: a run of pages freed by one
 * block fits any other block exactly, and the freelist does not fragment
 * into runs too short for the next commit (the file reaches a steady size). */
#define BLK_HDR 48
#define BF ((uint64_t)DL_STORE_BLOCK_FLOATS)
/* run value (format RUN_FMT): 0 magic | 4 fmt | 8 fingerprint u64
 *  16 created ns i64 | 24 P u32 | 28 id length u32 | 32 id char[64] NUL-padded
 *  96 n_layer u32 | 100 n_head u32 | 104 n_embd u32 | 108 seq_len u32
 * 112 vocab u32 | 116 shard u16 | 118 shards u16 | 120 init seed u64 | 128 numel u64[P]
 * (116 was reserved and written 0 before sharding: shards 0 = unsharded) */
#define RUN_HDR 128
#define RUN_FMT 2u /* 1 (schema 1) had no model fields and a 96-byte header */
/* merge value: 80-byte header + n_contrib entries of 160 bytes.
 *   0 magic | 4 fmt | 8 p u32 | 12 n u32 | 16 version u64 | 24 epoch u64
 *  32 wallclock i64 | 40 delta norm f64 | 48 staleness fn char[32]
 * entry: 0 id char[64] | 64 base u64 | 72 staleness u64 | 80 steps u64
 *  88 tokens u64 | 96 weight f64 | 104 decision u32 | 108 reason char[48]
 * 156 reserved u32 */
#define MREC_HDR 80
#define MREC_ENTRY 160
#define MREC_MAX_CONTRIB (1u << 20)
/* learner value: 0 magic | 4 fmt | 8 first ns | 16 last ns | 24 pubkey[32]
 *  56 pushes | 64 merged | 72 dropped | 80 tokens applied | 88 bytes in | 96 bytes out
 * 104 rejected | 112 step | 120 tokens (schema 4) */
#define LEARNER_LEN 128
#define LEDGER_LEN (8 + 8 * DL_LEDGER_NSTATES) /* magic | fmt | u64[4] */
#define EPOCH_LEN 16                           /* magic | fmt | epoch u64 */
#define SCHEMA_LEN 8                           /* magic | schema version u32 */
#define CONFIG_HDR 16                          /* magic | fmt | length u64 | text */
#define MAX_FRAGMENTS (1u << 20)
#define MAX_NUMEL (1ull << 40) /* per fragment: fewer than 2^32 blocks */

/* Map sizing and growth (see dl_store_opts in store.h). */
#define MAP_DEFAULT (1ull << 30)
#define MAP_FACTOR 4           /* a run's map: this many times its stored arrays */
#define GROW_WAIT_MS 10000u    /* default dl_store_opts.grow_wait_ms */
#define ENTER_WAIT_MS 20       /* longest a transaction begin waits for a pending grow */

static void put32(uint8_t *b, uint32_t v) { memcpy(b, &v, 4); }
static void put64(uint8_t *b, uint64_t v) { memcpy(b, &v, 8); }
static void putf64(uint8_t *b, double v) { memcpy(b, &v, 8); }
static uint32_t get32(const uint8_t *b) { uint32_t v; memcpy(&v, b, 4); return v; }
static uint64_t get64(const uint8_t *b) { uint64_t v; memcpy(&v, b, 8); return v; }
static double getf64(const uint8_t *b) { double v; memcpy(&v, b, 8); return v; }

/* Fixed-width text field: copy up to `cap` bytes, NUL-padded (no NUL when full). */
static void put_text(uint8_t *b, size_t cap, const char *s)
{
    size_t n = strnlen(s, cap);
    memset(b, 0, cap);
    memcpy(b, s, n);
}
static void get_text(char *dst, const uint8_t *b, size_t cap)
{
    size_t n = strnlen((const char *)b, cap);
    memcpy(dst, b, n);
    dst[n] = 0;
}

static void put_be32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)(v >> 24), b[1] = (uint8_t)(v >> 16), b[2] = (uint8_t)(v >> 8), b[3] = (uint8_t)v;
}
static uint32_t get_be32(const uint8_t *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Keys sort numerically: fragment index, block and version big-endian. */
static MDB_val key_frag(uint8_t b[4], uint32_t p)
{
    put_be32(b, p);
    return (MDB_val){4, b};
}
static uint32_t key_frag_p(const MDB_val *k) { return get_be32(k->mv_data); }
static MDB_val key_blk(uint8_t b[8], uint32_t p, uint32_t block)
{
    put_be32(b, p);
    put_be32(b + 4, block);
    return (MDB_val){8, b};
}
static MDB_val key_merge(uint8_t b[12], uint32_t p, uint64_t version)
{
    key_frag(b, p);
    for (int i = 0; i < 8; i++) b[4 + i] = (uint8_t)(version >> (56 - 8 * i));
    return (MDB_val){12, b};
}
static uint64_t key_merge_version(const MDB_val *k)
{
    const uint8_t *b = (const uint8_t *)k->mv_data + 4;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return v;
}
static MDB_val key_str(const char *s) { return (MDB_val){strlen(s), (void *)s}; }

/* Blocks of an array of numel floats, floats in block b, and the value size
 * of every one of its blocks (one size per array: see BLK_HDR). */
static uint32_t blocks_of(uint64_t numel) { return (uint32_t)((numel + BF - 1) / BF); }
static uint32_t block_len(uint64_t numel, uint32_t b)
{
    uint64_t left = numel - (uint64_t)b * BF;
    return (uint32_t)(left < BF ? left : BF);
}
static size_t block_size(uint64_t numel) { return BLK_HDR + 4 * (size_t)(numel < BF ? numel : BF); }

/* Ids: 1..DL_STORE_ID_MAX printable ASCII characters without spaces. */
static int check_id(const char *what, const char *id)
{
    size_t n = id ? strnlen(id, DL_STORE_ID_MAX + 1) : 0;
    if (n == 0 || n > DL_STORE_ID_MAX)
        return dl_err(DL_EINVAL, "%s must be 1..%d characters", what, DL_STORE_ID_MAX);
    for (size_t i = 0; i < n; i++)
        if (id[i] <= 0x20 || id[i] > 0x7e)
            return dl_err(DL_EINVAL, "%s '%.*s' has a non-printable or space character at %zu", what, (int)n,
                          id, i);
    return 0;
}

// ----------------------------------------------------------------------------
// the handle

struct dl_store {
    MDB_env *env;
    MDB_dbi dbi_meta, dbi_frag, dbi_params, dbi_outer, dbi_learners, dbi_merges, dbi_ledger;
    char *dir;
    int read_only, durability;
    int auto_map; /* opts.map_size was 0: size the map from the run */
    int lock_fd;  /* dloco.lock, flock'ed by a writer; -1 if none */
    int opened;   /* fully opened (close may sync) */
    uint32_t psize;
    /* LMDB may only change the map size while this process has no
     * transaction open (a remap moves every pointer a snapshot handed out),
     * so every transaction and snapshot is counted under `gate`. A grow
     * announces itself (grow_pending) and waits for the count to reach zero;
     * transactions that begin meanwhile hold back for it (ENTER_WAIT_MS at
     * most, and not at all once one of them gave up: grow_stalled), so a
     * stream of short snapshots cannot starve a grow, and a snapshot held
     * long (or begun by a thread that already holds one) cannot deadlock
     * it: the grow gives up after grow_wait_ms. mdb_env_info reads the map,
     * so it too runs under the gate. */
    pthread_mutex_t gate;
    pthread_cond_t gate_cv; /* broadcast when the count reaches zero under a pending grow, and when a grow ends */
    int active_txns;
    int grow_pending, grow_stalled;
    uint32_t grow_wait_ms;
    atomic_int snaps_open;
    /* run cache: written once by open or init_run, immutable afterwards */
    int have_run;
    char run_id[DL_STORE_ID_MAX + 1];
    uint64_t fingerprint;
    uint32_t n_frag;
    uint64_t *numel;   /* [n_frag] */
    dl_model_config model;
    uint64_t seed;
    uint32_t shard, shards; /* the shard layout as stored (shards 0 = unsharded) */
    char *config_text; /* NULL if none */
    /* stats */
    int stale_cleared;
    atomic_uint map_grows, map_full_retries, grow_timeouts;
};

/* A copy a snapshot hands out where it cannot point into the map: a range
 * that crosses blocks, an unaligned small value, a whole multi-block
 * fragment (kept per fragment: asked again, it is not copied again). */
typedef struct {
    float *data;
    uint32_t p;
    int whole;
} snap_copy;

struct dl_store_snap {
    dl_store *s;
    MDB_txn *txn;
    snap_copy *copies; /* freed at end */
    size_t ncopies, capcopies;
};

/* The raw LMDB code of the last failure on this thread, so the write loop can
 * tell MDB_MAP_FULL (grow and retry) from everything else. */
static _Thread_local int tl_mdb_rc;

static int mdb_fail(int rc, const char *what, const char *file, int line)
{
    tl_mdb_rc = rc;
    return dl_err(DL_ESTORE, "%s:%d: %s: %s", file, line, what, mdb_strerror(rc));
}

/* Every LMDB call goes through this: file:line and mdb_strerror on failure. */
#define MDB_CALL(call)                                                                                   \
    do {                                                                                                 \
        int mdb_rc_ = (call);                                                                            \
        if (mdb_rc_ != MDB_SUCCESS) return mdb_fail(mdb_rc_, #call, __FILE__, __LINE__);                 \
    } while (0)

/* mdb_get of a key that must exist: MDB_NOTFOUND becomes `code` (the store
 * is corrupt or not ours) with the caller's message. */
#define MDB_GET(txn, dbi, k, v, code, ...)                                                               \
    do {                                                                                                 \
        int mdb_rc_ = mdb_get((txn), (dbi), (k), (v));                                                   \
        if (mdb_rc_ == MDB_NOTFOUND) return dl_err((code), __VA_ARGS__);                                 \
        if (mdb_rc_ != MDB_SUCCESS) return mdb_fail(mdb_rc_, "mdb_get", __FILE__, __LINE__);             \
    } while (0)

// ----------------------------------------------------------------------------
// the gate and map growth

static struct timespec deadline_ms(uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return ts;
}

static void gate_enter(dl_store *s)
{
    pthread_mutex_lock(&s->gate);
    if (s->grow_pending && !s->grow_stalled) {
        struct timespec dl = deadline_ms(ENTER_WAIT_MS);
        while (s->grow_pending && !s->grow_stalled)
            if (pthread_cond_timedwait(&s->gate_cv, &s->gate, &dl) == ETIMEDOUT) {
                /* a transaction older than this one stays open: let the
                 * rest through, the grow waits for them all */
                s->grow_stalled = 1;
                break;
            }
    }
    s->active_txns++;
    pthread_mutex_unlock(&s->gate);
}
static void gate_leave(dl_store *s)
{
    pthread_mutex_lock(&s->gate);
    if (--s->active_txns == 0 && s->grow_pending) pthread_cond_broadcast(&s->gate_cv);
    pthread_mutex_unlock(&s->gate);
}

/* Map size and bytes up to the last used page (mdb_env_info, under the gate). */
static uint64_t map_info_locked(dl_store *s, uint64_t *map_size)
{
    MDB_envinfo info;
    int rc = mdb_env_info(s->env, &info); /* fails only on NULL arguments */
    if (rc) DL_PANIC("mdb_env_info: %s", mdb_strerror(rc));
    *map_size = info.me_mapsize;
    return ((uint64_t)info.me_last_pgno + 1) * s->psize;
}
static uint64_t map_info(dl_store *s, uint64_t *map_size)
{
    pthread_mutex_lock(&s->gate);
    uint64_t used = map_info_locked(s, map_size);
    pthread_mutex_unlock(&s->gate);
    return used;
}

/* Grow the map to at least `min_size` bytes (doubling from the current
 * size), or with min_size 0 adopt the size another process set. Call with
 * no transaction open on this thread. Waits up to grow_wait_ms for this
 * process's transactions and snapshots to end; DL_EAGAIN if they did not. */
static int map_grow(dl_store *s, uint64_t min_size)
{
    pthread_mutex_lock(&s->gate);
    while (s->grow_pending) pthread_cond_wait(&s->gate_cv, &s->gate); /* another thread's grow */
    uint64_t size, target = 0;
    map_info_locked(s, &size);
    if (min_size) {
        if (size >= min_size) { /* grown meanwhile */
            pthread_mutex_unlock(&s->gate);
            return 0;
        }
        for (target = size ? size : MAP_DEFAULT; target < min_size;) target *= 2;
    }
    s->grow_pending = 1;
    s->grow_stalled = 0;
    struct timespec dl = deadline_ms(s->grow_wait_ms);
    int timed_out = 0;
    while (s->active_txns > 0 && !timed_out)
        timed_out = pthread_cond_timedwait(&s->gate_cv, &s->gate, &dl) == ETIMEDOUT && s->active_txns > 0;
    int open = s->active_txns, rc = 0;
    if (!timed_out) rc = mdb_env_set_mapsize(s->env, (size_t)target);
    s->grow_pending = 0;
    pthread_cond_broadcast(&s->gate_cv);
    pthread_mutex_unlock(&s->gate);
    if (timed_out) {
        atomic_fetch_add(&s->grow_timeouts, 1);
        return dl_err(DL_EAGAIN,
                      "store %s: the map must grow from %llu to %llu MiB, but %d transaction(s) or snapshot(s) of "
                      "this process stayed open for %u ms; nothing was written, retry",
                      s->dir, (unsigned long long)(size >> 20), (unsigned long long)(target >> 20), open,
                      s->grow_wait_ms);
    }
    if (rc) return mdb_fail(rc, "mdb_env_set_mapsize", __FILE__, __LINE__);
    if (target) {
        atomic_fetch_add(&s->map_grows, 1);
        DL_INFO("store %s: map grown to %llu MiB", s->dir, (unsigned long long)(target >> 20));
    }
    return 0;
}

static int txn_begin(dl_store *s, int write, MDB_txn **out)
{
    for (int attempt = 0;; attempt++) {
        gate_enter(s);
        int rc = mdb_txn_begin(s->env, NULL, write ? 0 : MDB_RDONLY, out);
        if (rc == MDB_SUCCESS) return 0;
        gate_leave(s);
        if (rc == MDB_MAP_RESIZED && attempt < 3) { /* another process grew the map */
            DL_TRY(map_grow(s, 0));
            continue;
        }
        return mdb_fail(rc, write ? "mdb_txn_begin(write)" : "mdb_txn_begin(read)", __FILE__, __LINE__);
    }
}
static void txn_abort(dl_store *s, MDB_txn *t)
{
    mdb_txn_abort(t);
    gate_leave(s);
}
static int txn_commit(dl_store *s, MDB_txn *t)
{
    int rc = mdb_txn_commit(t);
    gate_leave(s);
    if (rc && (rc == EIO || rc == ENOSPC || rc == EDQUOT)) {
        /* LMDB reports a short pwrite on a full disk as EIO: say how full */
        struct statvfs fs;
        if (statvfs(s->dir, &fs) == 0) {
            int r = mdb_fail(rc, "mdb_txn_commit", __FILE__, __LINE__);
            char msg[600];
            snprintf(msg, sizeof msg, "%s", dl_errmsg());
            return dl_err(r, "%s (the store's filesystem has %llu bytes free%s)", msg,
                          (unsigned long long)fs.f_bavail * fs.f_frsize,
                          (unsigned long long)fs.f_bavail * fs.f_frsize < (1u << 20) ? ": full?" : "");
        }
    }
    if (rc) return mdb_fail(rc, "mdb_txn_commit", __FILE__, __LINE__);
    return 0;
}

/* Before a write of `need` bytes of values, grow the map so copy-on-write
 * has room for the new pages while the old ones are still referenced (the
 * pages the write frees are reused only by later writes). A grow that
 * times out is not an error here: the write may fit, and MDB_MAP_FULL
 * grows again. */
static void map_pregrow(dl_store *s, uint64_t need)
{
    uint64_t size, used = map_info(s, &size), want = used + 2 * need + 16 * (uint64_t)s->psize;
    if (want > size && map_grow(s, want) < 0) DL_DEBUG("store %s: pre-growing the map: %s", s->dir, dl_errmsg());
}

typedef int (*write_fn)(dl_store *s, MDB_txn *t, void *ctx);

/* Run fn in one write transaction; on MDB_MAP_FULL (from a put or from the
 * commit) abort, double the map and run it again. fn must be repeatable. */
static int store_write(dl_store *s, uint64_t need, write_fn fn, void *ctx)
{
    if (s->read_only) return dl_err(DL_EINVAL, "store %s is open read-only", s->dir);
    if (need) map_pregrow(s, need);
    for (int attempt = 0;; attempt++) {
        MDB_txn *t;
        DL_TRY(txn_begin(s, 1, &t));
        tl_mdb_rc = 0;
        int rc = fn(s, t, ctx);
        if (rc == 0)
            rc = txn_commit(s, t);
        else
            txn_abort(s, t);
        if (rc == 0) return 0;
        if (tl_mdb_rc != MDB_MAP_FULL || attempt >= 40) return rc;
        atomic_fetch_add(&s->map_full_retries, 1);
        uint64_t size;
        map_info(s, &size);
        DL_TRY(map_grow(s, size * 2));
    }
}

// ----------------------------------------------------------------------------
// decoders: validate magic, version and size; errors name the key

typedef struct {
    uint64_t version, numel;
    uint32_t blocks;
    int64_t wallclock_ns;
} frag_hdr;

static int frag_decode(const dl_store *s, uint32_t p, const MDB_val *v, frag_hdr *h)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size != FRAG_HDR)
        return dl_err(DL_ECORRUPT, "fragments[%u]: value of %zu bytes, a header is %d", p, v->mv_size, FRAG_HDR);
    if (get32(b) != MAGIC_FRAG || get32(b + 4) != FRAG_FMT)
        return dl_err(DL_ECORRUPT, "fragments[%u]: bad magic/format 0x%08x/%u", p, get32(b), get32(b + 4));
    if (get32(b + 8) != p)
        return dl_err(DL_ECORRUPT, "fragments[%u]: value says it is fragment %u", p, get32(b + 8));
    h->blocks = get32(b + 12);
    h->version = get64(b + 16);
    h->numel = get64(b + 24);
    h->wallclock_ns = (int64_t)get64(b + 40);
    if (p < s->n_frag && h->numel != s->numel[p])
        return dl_err(DL_ECORRUPT, "fragments[%u]: numel %llu, the run says %llu", p,
                      (unsigned long long)h->numel, (unsigned long long)s->numel[p]);
    if (h->numel == 0 || h->numel > MAX_NUMEL || get32(b + 32) != BF || h->blocks != blocks_of(h->numel))
        return dl_err(DL_ECORRUPT, "fragments[%u]: numel %llu in %u blocks of %u floats (this build: blocks of %llu)",
                      p, (unsigned long long)h->numel, h->blocks, get32(b + 32), (unsigned long long)BF);
    return 0;
}

/* One block of params (mom 0) or momentum (mom 1), validated against its
 * fragment's header. */
typedef struct {
    const uint8_t *data; /* n floats, possibly unaligned (a small value in a leaf page) */
    uint32_t n;
    uint64_t sum;
} blk_view;

static const char *arr_db(int mom) { return mom ? "outer" : "params"; }

static int blk_decode(int mom, uint32_t p, uint32_t blk, const frag_hdr *h, const MDB_val *v, blk_view *out)
{
    const uint8_t *b = v->mv_data;
    const char *db = arr_db(mom);
    if (v->mv_size != block_size(h->numel))
        return dl_err(DL_ECORRUPT, "%s[%u,%u]: value of %zu bytes, numel %llu needs %zu", db, p, blk, v->mv_size,
                      (unsigned long long)h->numel, block_size(h->numel));
    if (get32(b) != (mom ? MAGIC_OBLK : MAGIC_PBLK) || get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "%s[%u,%u]: bad magic/format 0x%08x/%u", db, p, blk, get32(b), get32(b + 4));
    if (get32(b + 8) != p || get32(b + 12) != blk)
        return dl_err(DL_ECORRUPT, "%s[%u,%u]: value says it is fragment %u block %u", db, p, blk, get32(b + 8),
                      get32(b + 12));
    if (get64(b + 16) != h->version)
        return dl_err(DL_ECORRUPT, "%s[%u,%u]: block of version %llu, fragment %u is at version %llu", db, p, blk,
                      (unsigned long long)get64(b + 16), p, (unsigned long long)h->version);
    if (get32(b + 24) != block_len(h->numel, blk))
        return dl_err(DL_ECORRUPT, "%s[%u,%u]: block holds %u floats, numel %llu puts %u in it", db, p, blk,
                      get32(b + 24), (unsigned long long)h->numel, block_len(h->numel, blk));
    out->data = b + BLK_HDR;
    out->n = get32(b + 24);
    out->sum = get64(b + 32);
    return 0;
}

static int frag_get(dl_store *s, MDB_txn *t, uint32_t p, frag_hdr *h)
{
    uint8_t kb[4];
    MDB_val k = key_frag(kb, p), v;
    MDB_GET(t, s->dbi_frag, &k, &v, DL_ECORRUPT, "store %s: fragments[%u] missing", s->dir, p);
    return frag_decode(s, p, &v, h);
}

static int blk_get(dl_store *s, MDB_txn *t, int mom, uint32_t p, const frag_hdr *h, uint32_t blk, blk_view *out)
{
    uint8_t kb[8];
    MDB_val k = key_blk(kb, p, blk), v;
    MDB_GET(t, mom ? s->dbi_outer : s->dbi_params, &k, &v, DL_ECORRUPT,
            "store %s: %s[%u,%u] missing (fragment %u has %u blocks)", s->dir, arr_db(mom), p, blk, p, h->blocks);
    return blk_decode(mom, p, blk, h, &v, out);
}

static int epoch_decode(const MDB_val *v, uint64_t *epoch)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size != EPOCH_LEN || get32(b) != MAGIC_EPOCH || get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "meta[epoch]: bad size/magic/format (%zu bytes)", v->mv_size);
    *epoch = get64(b + 8);
    return 0;
}

static int ledger_decode(const MDB_val *v, dl_store_ledger *l)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size != LEDGER_LEN || get32(b) != MAGIC_LEDGER || get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "ledger[totals]: bad size/magic/format (%zu bytes)", v->mv_size);
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) l->tokens[i] = get64(b + 8 + 8 * i);
    return 0;
}

static void learner_encode(uint8_t b[LEARNER_LEN], const dl_store_learner *r)
{
    put32(b, MAGIC_LEARNER);
    put32(b + 4, FMT_VERSION);
    put64(b + 8, (uint64_t)r->first_seen_ns);
    put64(b + 16, (uint64_t)r->last_seen_ns);
    memcpy(b + 24, r->pubkey, DL_STORE_PUBKEY_BYTES);
    const uint64_t c[9] = {r->pushes,   r->merged,   r->dropped, r->tokens_applied, r->bytes_in,
                           r->bytes_out, r->rejected, r->step,   r->tokens};
    for (int i = 0; i < 9; i++) put64(b + 56 + 8 * i, c[i]);
}

static int learner_decode(const MDB_val *k, const MDB_val *v, dl_store_learner *r)
{
    const uint8_t *b = v->mv_data;
    int klen = (int)(k->mv_size < 80 ? k->mv_size : 80);
    if (k->mv_size == 0 || k->mv_size > DL_STORE_ID_MAX)
        return dl_err(DL_ECORRUPT, "learners: key of %zu bytes is not an id", k->mv_size);
    if (v->mv_size != LEARNER_LEN || get32(b) != MAGIC_LEARNER ||
        get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "learners[%.*s]: bad size/magic/format (%zu bytes)", klen,
                      (const char *)k->mv_data, v->mv_size);
    memcpy(r->id, k->mv_data, k->mv_size);
    r->id[k->mv_size] = 0;
    r->first_seen_ns = (int64_t)get64(b + 8);
    r->last_seen_ns = (int64_t)get64(b + 16);
    memcpy(r->pubkey, b + 24, DL_STORE_PUBKEY_BYTES);
    uint64_t *c[9] = {&r->pushes,   &r->merged,   &r->dropped, &r->tokens_applied, &r->bytes_in,
                      &r->bytes_out, &r->rejected, &r->step,   &r->tokens};
    for (int i = 0; i < 9; i++) *c[i] = get64(b + 56 + 8 * i);
    return 0;
}

static size_t mrec_size(uint32_t n) { return MREC_HDR + (size_t)n * MREC_ENTRY; }

static int mrec_validate(const dl_merge_record *r)
{
    if (r->n_contrib > MREC_MAX_CONTRIB)
        return dl_err(DL_EINVAL, "merge record has %u contributors (max %u)", r->n_contrib, MREC_MAX_CONTRIB);
    if (r->n_contrib && !r->contrib) return dl_err(DL_EINVAL, "merge record has contributors but no array");
    if (strnlen(r->staleness_fn, sizeof r->staleness_fn) > DL_STORE_FN_MAX)
        return dl_err(DL_EINVAL, "staleness function name is not NUL-terminated");
    for (uint32_t i = 0; i < r->n_contrib; i++) {
        const dl_merge_contrib *c = &r->contrib[i];
        DL_TRY(check_id("contributor learner id", c->learner_id));
        if (c->decision < DL_MERGE_MERGED || c->decision > DL_MERGE_REJECTED)
            return dl_err(DL_EINVAL, "contributor %u (%s): bad decision code %d", i, c->learner_id, c->decision);
    }
    return 0;
}

static void mrec_encode(uint8_t *b, uint32_t p, uint64_t version, const dl_merge_record *r)
{
    put32(b, MAGIC_MERGE);
    put32(b + 4, FMT_VERSION);
    put32(b + 8, p);
    put32(b + 12, r->n_contrib);
    put64(b + 16, version);
    put64(b + 24, r->epoch);
    put64(b + 32, (uint64_t)r->wallclock_ns);
    putf64(b + 40, r->delta_norm);
    put_text(b + 48, 32, r->staleness_fn);
    for (uint32_t i = 0; i < r->n_contrib; i++) {
        const dl_merge_contrib *c = &r->contrib[i];
        uint8_t *e = b + MREC_HDR + (size_t)i * MREC_ENTRY;
        put_text(e, 64, c->learner_id);
        put64(e + 64, c->base_version);
        put64(e + 72, c->staleness);
        put64(e + 80, c->steps);
        put64(e + 88, c->tokens);
        putf64(e + 96, c->weight);
        put32(e + 104, (uint32_t)c->decision);
        char reason[DL_STORE_REASON_MAX + 1];
        snprintf(reason, sizeof reason, "%s", c->reason); /* truncates long reasons */
        put_text(e + 108, 48, reason);
        put32(e + 156, 0);
    }
}

/* Decode the record stored under (p, version); contributors go to *buf
 * (grown with dl_xrealloc to *cap entries as needed). */
static int mrec_decode(const MDB_val *v, uint32_t p, uint64_t version, dl_merge_record *out,
                       dl_merge_contrib **buf, uint32_t *cap)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size < MREC_HDR || get32(b) != MAGIC_MERGE || get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "merges[%u,%llu]: bad size/magic/format (%zu bytes)", p,
                      (unsigned long long)version, v->mv_size);
    uint32_t n = get32(b + 12);
    if (get32(b + 8) != p || get64(b + 16) != version)
        return dl_err(DL_ECORRUPT, "merges[%u,%llu]: value says fragment %u version %llu", p,
                      (unsigned long long)version, get32(b + 8), (unsigned long long)get64(b + 16));
    if (n > MREC_MAX_CONTRIB || v->mv_size != mrec_size(n))
        return dl_err(DL_ECORRUPT, "merges[%u,%llu]: %zu bytes for %u contributors", p,
                      (unsigned long long)version, v->mv_size, n);
    if (n > *cap) {
        *buf = dl_xrealloc(*buf, (size_t)n * sizeof **buf); /* n <= MREC_MAX_CONTRIB */
        *cap = n;
    }
    memset(out, 0, sizeof *out);
    out->version = version;
    out->epoch = get64(b + 24);
    out->wallclock_ns = (int64_t)get64(b + 32);
    out->delta_norm = getf64(b + 40);
    get_text(out->staleness_fn, b + 48, DL_STORE_FN_MAX);
    out->n_contrib = n;
    out->contrib = *buf;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = b + MREC_HDR + (size_t)i * MREC_ENTRY;
        dl_merge_contrib *c = &(*buf)[i];
        get_text(c->learner_id, e, DL_STORE_ID_MAX);
        c->base_version = get64(e + 64);
        c->staleness = get64(e + 72);
        c->steps = get64(e + 80);
        c->tokens = get64(e + 88);
        c->weight = getf64(e + 96);
        c->decision = (int32_t)get32(e + 104);
        get_text(c->reason, e + 108, DL_STORE_REASON_MAX);
        if (c->decision < DL_MERGE_MERGED || c->decision > DL_MERGE_REJECTED)
            return dl_err(DL_ECORRUPT, "merges[%u,%llu]: contributor %u has decision code %d", p,
                          (unsigned long long)version, i, c->decision);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// open / close

dl_store_opts dl_store_opts_default(void)
{
    return (dl_store_opts){.map_size = 0, .durability = DL_STORE_SYNC, .read_only = 0, .grow_wait_ms = 0};
}

/* Params + momentum of a run as stored: every block of both arrays. */
static uint64_t state_bytes(uint32_t P, const uint64_t *numel)
{
    uint64_t n = 0;
    for (uint32_t p = 0; p < P; p++) n += 2 * (uint64_t)blocks_of(numel[p]) * block_size(numel[p]);
    return n;
}

/* The map a run starts with when opts.map_size is 0: MAP_FACTOR times its
 * stored arrays (the live state, the copy a commit writes before the old
 * one is freed, the pages a recent snapshot still sees), a power of two. */
static uint64_t run_map_size(uint32_t P, const uint64_t *numel)
{
    uint64_t want = MAP_FACTOR * state_bytes(P, numel) + (64ull << 20), size = MAP_DEFAULT;
    while (size < want) size *= 2;
    return size;
}

static int mkdir_p(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return dl_err(DL_EINVAL, "store path too long: %s", dir);
    for (char *c = path + 1;; c++) {
        if (*c == '/' || *c == 0) {
            char saved = *c;
            *c = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return dl_err(DL_EIO, "mkdir %s: %s", path, strerror(errno));
            *c = saved;
            if (!saved) break;
        }
    }
    return 0;
}

static int load_run(dl_store *s, MDB_txn *t)
{
    MDB_val k = key_str("run"), v;
    int rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return mdb_fail(rc, "mdb_get(meta, run)", __FILE__, __LINE__);
    const uint8_t *b = v.mv_data;
    if (v.mv_size < RUN_HDR || get32(b) != MAGIC_RUN || get32(b + 4) != RUN_FMT)
        return dl_err(DL_ECORRUPT, "meta[run]: bad size/magic/format (%zu bytes)", v.mv_size);
    uint32_t P = get32(b + 24), idlen = get32(b + 28);
    if (P == 0 || P > MAX_FRAGMENTS || v.mv_size != RUN_HDR + 8 * (size_t)P || idlen == 0 ||
        idlen > DL_STORE_ID_MAX)
        return dl_err(DL_ECORRUPT, "meta[run]: P=%u, id length %u, %zu bytes do not fit", P, idlen, v.mv_size);
    dl_model_config m = {.n_layer = (int)get32(b + 96), .n_head = (int)get32(b + 100), .n_embd = (int)get32(b + 104),
                         .seq_len = (int)get32(b + 108), .vocab = (int)get32(b + 112)};
    if (dl_model_config_check(&m)) return dl_err(DL_ECORRUPT, "meta[run]: bad model: %s", dl_errmsg());
    s->model = m;
    s->seed = get64(b + 120);
    s->shard = get32(b + 116) & 0xffff;
    s->shards = get32(b + 116) >> 16;
    if (dl_shard_check((int)P, (int)s->shard, (int)s->shards) || s->shards == 1)
        return dl_err(DL_ECORRUPT, "meta[run]: bad shard layout: %s",
                      s->shards == 1 ? "shards 1 (unsharded is stored as 0)" : dl_errmsg());
    s->fingerprint = get64(b + 8);
    s->n_frag = P;
    memcpy(s->run_id, b + 32, idlen);
    s->run_id[idlen] = 0;
    s->numel = dl_xmalloc(P * sizeof *s->numel);
    for (uint32_t p = 0; p < P; p++) s->numel[p] = get64(b + RUN_HDR + 8 * (size_t)p);
    k = key_str("config");
    rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_SUCCESS) {
        b = v.mv_data;
        if (v.mv_size < CONFIG_HDR || get32(b) != MAGIC_CONFIG || get32(b + 4) != FMT_VERSION ||
            get64(b + 8) != v.mv_size - CONFIG_HDR)
            return dl_err(DL_ECORRUPT, "meta[config]: bad size/magic/format (%zu bytes)", v.mv_size);
        s->config_text = dl_xmalloc(v.mv_size - CONFIG_HDR + 1);
        memcpy(s->config_text, b + CONFIG_HDR, v.mv_size - CONFIG_HDR);
        s->config_text[v.mv_size - CONFIG_HDR] = 0;
    } else if (rc != MDB_NOTFOUND) {
        return mdb_fail(rc, "mdb_get(meta, config)", __FILE__, __LINE__);
    }
    s->have_run = 1;
    return 0;
}

/* Open (or, read-write on an empty environment, create) the named databases,
 * check the schema and load the run. */
static int open_dbs(dl_store *s, MDB_txn *t)
{
    static const char *names[] = {"fragments", "params", "outer", "learners", "merges", "ledger"};
    MDB_dbi *dbis[] = {&s->dbi_frag, &s->dbi_params, &s->dbi_outer, &s->dbi_learners, &s->dbi_merges, &s->dbi_ledger};
    int fresh = 0;
    int rc = mdb_dbi_open(t, "meta", 0, &s->dbi_meta);
    if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE) {
        MDB_dbi main;
        MDB_stat st;
        MDB_CALL(mdb_dbi_open(t, NULL, 0, &main));
        MDB_CALL(mdb_stat(t, main, &st));
        if (rc == MDB_INCOMPATIBLE || st.ms_entries > 0)
            return dl_err(DL_EFORMAT, "%s holds an LMDB environment that is not a dloco store", s->dir);
        if (s->read_only)
            return dl_err(DL_EFORMAT, "%s holds an empty LMDB environment, not a dloco store", s->dir);
        fresh = 1;
        MDB_CALL(mdb_dbi_open(t, "meta", MDB_CREATE, &s->dbi_meta));
    } else if (rc) {
        return mdb_fail(rc, "mdb_dbi_open(meta)", __FILE__, __LINE__);
    }
    /* the schema first: a store of another schema may lack this one's databases */
    MDB_val k = key_str("schema"), v;
    if (!fresh) {
        MDB_GET(t, s->dbi_meta, &k, &v, DL_EFORMAT, "store %s: meta has no schema version", s->dir);
        const uint8_t *b = v.mv_data;
        if (v.mv_size != SCHEMA_LEN || get32(b) != MAGIC_SCHEMA)
            return dl_err(DL_EFORMAT, "store %s: meta[schema] has a bad size/magic (%zu bytes)", s->dir, v.mv_size);
        if (get32(b + 4) != DL_STORE_SCHEMA_VERSION)
            return dl_err(DL_EFORMAT, "store %s has schema version %u, this build reads schema version %u", s->dir,
                          get32(b + 4), DL_STORE_SCHEMA_VERSION);
    }
    for (int i = 0; i < 6; i++) {
        rc = mdb_dbi_open(t, names[i], fresh ? MDB_CREATE : 0, dbis[i]);
        if (rc == MDB_NOTFOUND) return dl_err(DL_EFORMAT, "store %s has no '%s' database", s->dir, names[i]);
        if (rc) return mdb_fail(rc, "mdb_dbi_open", __FILE__, __LINE__);
    }
    if (!fresh) return load_run(s, t);
    uint8_t sb[SCHEMA_LEN], eb[EPOCH_LEN], lb[LEDGER_LEN] = {0};
    put32(sb, MAGIC_SCHEMA);
    put32(sb + 4, DL_STORE_SCHEMA_VERSION);
    put32(eb, MAGIC_EPOCH);
    put32(eb + 4, FMT_VERSION);
    put64(eb + 8, 0);
    put32(lb, MAGIC_LEDGER);
    put32(lb + 4, FMT_VERSION);
    v = (MDB_val){SCHEMA_LEN, sb};
    MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, 0));
    k = key_str("epoch"), v = (MDB_val){EPOCH_LEN, eb};
    MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, 0));
    k = key_str("totals"), v = (MDB_val){LEDGER_LEN, lb};
    MDB_CALL(mdb_put(t, s->dbi_ledger, &k, &v, 0));
    DL_INFO("store %s: created (schema %u)", s->dir, DL_STORE_SCHEMA_VERSION);
    return 0;
}

/* LMDB sizes its lock file lock.mdb with ftruncate (a sparse file) and
 * writes its reader table through a shared mmap of it: on a filesystem with
 * no free block the first store into that page raises SIGBUS inside
 * mdb_env_open, and the process dies with nothing logged. So the file's
 * blocks are allocated here first, where a full disk is an error: a new lock
 * file at a size no smaller than LMDB's (maxreaders 256 x 64-byte slots +
 * its 192-byte header; every opener derives the reader count from the
 * file's size, so it is set only while the file is new and empty), an
 * existing one at its own size (its holes, e.g. left by a run that died
 * here). data.mdb needs no such care: LMDB maps it read-only and writes it
 * with pwrite, whose ENOSPC fails the transaction. */
#define STORE_LOCK_BYTES 20480
static int alloc_lock_file(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/lock.mdb", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return 0; /* read-only media and the like: LMDB's own open reports it */
    struct stat st;
    int rc = fstat(fd, &st) ? errno : posix_fallocate(fd, 0, st.st_size ? st.st_size : STORE_LOCK_BYTES);
    close(fd);
    if (rc == ENOSPC || rc == EDQUOT)
        return dl_err(DL_EIO, "store %s: no space left on its filesystem (%s allocating %s, %lld bytes): free some "
                              "space or put the store elsewhere", dir, strerror(rc), path,
                      (long long)(st.st_size ? st.st_size : STORE_LOCK_BYTES));
    return 0; /* EOPNOTSUPP, EROFS, ...: nothing better to do than let LMDB try */
}

int dl_store_open(const char *dir, const dl_store_opts *opts, dl_store **out)
{
    assert(dir && out);
    *out = NULL;
    dl_store_opts o = opts ? *opts : dl_store_opts_default();
    int auto_map = o.map_size == 0;
    if (auto_map) o.map_size = MAP_DEFAULT;
    o.map_size = (o.map_size + 0xffff) & ~(uint64_t)0xffff;
    if (o.durability != DL_STORE_SYNC && o.durability != DL_STORE_PERIODIC)
        return dl_err(DL_EINVAL, "store durability %d is neither SYNC nor PERIODIC", o.durability);

    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return dl_err(DL_EINVAL, "store path %s is not a directory", dir);
    } else if (errno != ENOENT) {
        return dl_err(DL_EIO, "stat %s: %s", dir, strerror(errno));
    } else if (o.read_only) {
        return dl_err(DL_ENOTFOUND, "no store at %s (directory does not exist)", dir);
    } else {
        DL_TRY(mkdir_p(dir));
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    if (o.read_only && stat(path, &st) != 0)
        return dl_err(DL_ENOTFOUND, "no store at %s (no data.mdb)", dir);

    dl_store *s = dl_xcalloc(1, sizeof *s);
    s->dir = dl_xmalloc(strlen(dir) + 1);
    strcpy(s->dir, dir);
    s->read_only = o.read_only;
    s->durability = o.durability;
    s->auto_map = auto_map;
    s->grow_wait_ms = o.grow_wait_ms ? o.grow_wait_ms : GROW_WAIT_MS;
    s->lock_fd = -1;
    pthread_mutex_init(&s->gate, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->gate_cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = 0;

    if (!o.read_only) { /* one writer per store, across processes */
        snprintf(path, sizeof path, "%s/dloco.lock", dir);
        s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (s->lock_fd < 0) {
            rc = dl_err(DL_EIO, "open %s: %s", path, strerror(errno));
            goto fail;
        }
        if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
            rc = errno == EWOULDBLOCK
                     ? dl_err(DL_EAGAIN, "store %s is already open for writing by another process or handle", dir)
                     : dl_err(DL_EIO, "flock %s: %s", path, strerror(errno));
            goto fail;
        }
    }

    if ((rc = alloc_lock_file(dir))) goto fail;

    int lrc = mdb_env_create(&s->env);
    if (lrc) {
        s->env = NULL;
        rc = mdb_fail(lrc, "mdb_env_create", __FILE__, __LINE__);
        goto fail;
    }
    if ((lrc = mdb_env_set_maxdbs(s->env, 8)) || (lrc = mdb_env_set_maxreaders(s->env, 256)) ||
        (lrc = mdb_env_set_mapsize(s->env, (size_t)o.map_size))) {
        rc = mdb_fail(lrc, "mdb_env_set_*", __FILE__, __LINE__);
        goto fail;
    }
    /* MDB_NOTLS: read snapshots are not tied to a thread, and a thread may
     * hold several. */
    unsigned flags = MDB_NOTLS | (o.read_only ? MDB_RDONLY : 0) | (o.durability == DL_STORE_PERIODIC ? MDB_NOSYNC : 0);
    lrc = mdb_env_open(s->env, dir, flags, 0644);
    if (lrc == MDB_INVALID || lrc == MDB_VERSION_MISMATCH) {
        rc = dl_err(DL_EFORMAT, "%s/data.mdb is not an LMDB environment this build can read (%s)", dir,
                    mdb_strerror(lrc));
        goto fail;
    }
    if (lrc == EACCES || lrc == EROFS || lrc == ENOENT) {
        rc = dl_err(DL_EIO, "mdb_env_open %s: %s", dir, mdb_strerror(lrc));
        goto fail;
    }
    if (lrc) {
        rc = mdb_fail(lrc, "mdb_env_open", __FILE__, __LINE__);
        goto fail;
    }
    MDB_stat est;
    if ((lrc = mdb_env_stat(s->env, &est))) {
        rc = mdb_fail(lrc, "mdb_env_stat", __FILE__, __LINE__);
        goto fail;
    }
    s->psize = est.ms_psize;

    if ((lrc = mdb_reader_check(s->env, &s->stale_cleared))) {
        rc = mdb_fail(lrc, "mdb_reader_check", __FILE__, __LINE__);
        goto fail;
    }
    DL_INFO("store %s: mdb_reader_check cleared %d stale reader slot(s) of dead processes", dir,
            s->stale_cleared);

    MDB_txn *t;
    if ((rc = txn_begin(s, !o.read_only, &t)) < 0) goto fail;
    if ((rc = open_dbs(s, t)) < 0) {
        txn_abort(s, t);
        goto fail;
    }
    /* committing (also a read txn) keeps the dbi handles for the env's life */
    if ((rc = txn_commit(s, t)) < 0) goto fail;
    s->opened = 1;
    if (!o.read_only && auto_map && s->have_run && (rc = map_grow(s, run_map_size(s->n_frag, s->numel))) < 0)
        goto fail;
    uint64_t size;
    map_info(s, &size);
    DL_INFO("store %s: open %s%s, map %llu MiB, run %s", dir, o.read_only ? "read-only" : "read-write",
            o.read_only ? "" : o.durability == DL_STORE_SYNC ? " (sync)" : " (periodic sync)",
            (unsigned long long)(size >> 20), s->have_run ? s->run_id : "(none)");
    *out = s;
    return 0;
fail:
    dl_store_close(&s);
    return rc;
}

void dl_store_close(dl_store **sp)
{
    if (!sp || !*sp) return;
    dl_store *s = *sp;
    assert(atomic_load(&s->snaps_open) == 0 && "dl_store_close with snapshots open");
    if (s->env) {
        if (s->opened && !s->read_only && s->durability == DL_STORE_PERIODIC) {
            int rc = mdb_env_sync(s->env, 1);
            if (rc) DL_WARN("store %s: final sync failed: %s", s->dir, mdb_strerror(rc));
        }
        mdb_env_close(s->env);
    }
    if (s->lock_fd >= 0) close(s->lock_fd); /* releases the flock */
    pthread_mutex_destroy(&s->gate);
    pthread_cond_destroy(&s->gate_cv);
    free(s->numel);
    free(s->config_text);
    free(s->dir);
    free(s);
    *sp = NULL;
}

int dl_store_sync(dl_store *s)
{
    assert(s);
    if (s->read_only) return 0;
    MDB_CALL(mdb_env_sync(s->env, 1));
    return 0;
}

// ----------------------------------------------------------------------------
// fragment arrays as blocks

/* XXH64 of each block of x (numel floats; NULL = zeros) into sums[blocks_of(numel)]. */
static void hash_blocks(const float *x, uint64_t numel, uint64_t *sums)
{
    float *zeros = x ? NULL : dl_xcalloc(numel < BF ? numel : BF, sizeof *zeros);
    for (uint32_t b = 0; b < blocks_of(numel); b++)
        sums[b] = dl_checksum64(x ? x + (size_t)b * BF : zeros, (size_t)block_len(numel, b) * 4);
    free(zeros);
}

static int put_frag_hdr(dl_store *s, MDB_txn *t, uint32_t p, uint64_t version, uint64_t numel, int64_t wall)
{
    uint8_t kb[4], b[FRAG_HDR] = {0};
    put32(b, MAGIC_FRAG);
    put32(b + 4, FRAG_FMT);
    put32(b + 8, p);
    put32(b + 12, blocks_of(numel));
    put64(b + 16, version);
    put64(b + 24, numel);
    put32(b + 32, (uint32_t)BF);
    put64(b + 40, (uint64_t)wall);
    MDB_val k = key_frag(kb, p), v = {FRAG_HDR, b};
    MDB_CALL(mdb_put(t, s->dbi_frag, &k, &v, 0));
    return 0;
}

/* Write every block of fragment p's params (mom 0) or momentum (mom 1) at
 * `version` from x (numel floats; NULL = zeros), with their checksums. */
static int put_blocks(dl_store *s, MDB_txn *t, int mom, uint32_t p, uint64_t version, uint64_t numel,
                      const float *x, const uint64_t *sums)
{
    size_t size = block_size(numel);
    for (uint32_t blk = 0; blk < blocks_of(numel); blk++) {
        uint8_t kb[8];
        uint32_t n = block_len(numel, blk);
        MDB_val k = key_blk(kb, p, blk), v = {size, NULL};
        MDB_CALL(mdb_put(t, mom ? s->dbi_outer : s->dbi_params, &k, &v, MDB_RESERVE));
        uint8_t *b = v.mv_data, *data = b + BLK_HDR;
        memset(b, 0, BLK_HDR);
        put32(b, mom ? MAGIC_OBLK : MAGIC_PBLK);
        put32(b + 4, FMT_VERSION);
        put32(b + 8, p);
        put32(b + 12, blk);
        put64(b + 16, version);
        put32(b + 24, n);
        put64(b + 32, sums[blk]);
        if (x)
            memcpy(data, x + (size_t)blk * BF, (size_t)n * 4);
        else
            memset(data, 0, (size_t)n * 4);
        memset(data + (size_t)n * 4, 0, size - BLK_HDR - (size_t)n * 4); /* a short last block's padding */
    }
    return 0;
}

// ----------------------------------------------------------------------------
// run, epoch

static int check_run(const dl_store_run *r)
{
    DL_TRY(check_id("run id", r->run_id));
    if (r->fingerprint == 0) return dl_err(DL_EINVAL, "run '%s': fingerprint must be nonzero", r->run_id);
    dl_model_config m = r->model;
    if (dl_model_config_check(&m)) return dl_err(DL_EINVAL, "run '%s': model: %s", r->run_id, dl_errmsg());
    if (r->n_fragments == 0 || r->n_fragments > MAX_FRAGMENTS || !r->numel)
        return dl_err(DL_EINVAL, "run '%s': %u fragments (need 1..%u with numels)", r->run_id, r->n_fragments,
                      MAX_FRAGMENTS);
    for (uint32_t p = 0; p < r->n_fragments; p++)
        if (r->numel[p] == 0 || r->numel[p] > (1ull << 40))
            return dl_err(DL_EINVAL, "run '%s': fragment %u has numel %llu", r->run_id, p,
                          (unsigned long long)r->numel[p]);
    return 0;
}

/* "shard K of S" or "unsharded", for messages. */
static const char *layout_str(uint32_t shard, uint32_t shards, char buf[48])
{
    if (shards <= 1) snprintf(buf, 48, "unsharded");
    else snprintf(buf, 48, "shard %u of %u", shard, shards);
    return buf;
}

struct init_ctx {
    const dl_store_run *run;
    dl_store_shard layout;
    const float *const *params;
    uint64_t **psum, **msum; /* [P][blocks of p] */
    int64_t wall;
};

static int init_fn(dl_store *s, MDB_txn *t, void *vctx)
{
    struct init_ctx *c = vctx;
    const dl_store_run *r = c->run;
    MDB_val k = key_str("run"), v;
    if (mdb_get(t, s->dbi_meta, &k, &v) == MDB_SUCCESS)
        return dl_err(DL_EMISMATCH, "store %s: a run appeared while initializing", s->dir);
    size_t idlen = strlen(r->run_id);
    v = (MDB_val){RUN_HDR + 8 * (size_t)r->n_fragments, NULL};
    MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, MDB_RESERVE));
    uint8_t *b = v.mv_data;
    memset(b, 0, RUN_HDR);
    put32(b, MAGIC_RUN);
    put32(b + 4, RUN_FMT);
    put64(b + 8, r->fingerprint);
    put64(b + 16, (uint64_t)c->wall);
    put32(b + 24, r->n_fragments);
    put32(b + 28, (uint32_t)idlen);
    memcpy(b + 32, r->run_id, idlen);
    put32(b + 96, (uint32_t)r->model.n_layer);
    put32(b + 100, (uint32_t)r->model.n_head);
    put32(b + 104, (uint32_t)r->model.n_embd);
    put32(b + 108, (uint32_t)r->model.seq_len);
    put32(b + 112, (uint32_t)r->model.vocab);
    put32(b + 116, c->layout.shards > 1 ? c->layout.shard | c->layout.shards << 16 : 0);
    put64(b + 120, r->seed);
    for (uint32_t p = 0; p < r->n_fragments; p++) put64(b + RUN_HDR + 8 * (size_t)p, r->numel[p]);
    if (r->config_text) {
        size_t n = strlen(r->config_text);
        k = key_str("config"), v = (MDB_val){CONFIG_HDR + n, NULL};
        MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, MDB_RESERVE));
        b = v.mv_data;
        put32(b, MAGIC_CONFIG);
        put32(b + 4, FMT_VERSION);
        put64(b + 8, n);
        memcpy(b + CONFIG_HDR, r->config_text, n);
    }
    for (uint32_t p = 0; p < r->n_fragments; p++) {
        DL_TRY(put_frag_hdr(s, t, p, 0, r->numel[p], c->wall));
        DL_TRY(put_blocks(s, t, 0, p, 0, r->numel[p], c->params[p], c->psum[p]));
        DL_TRY(put_blocks(s, t, 1, p, 0, r->numel[p], NULL, c->msum[p]));
    }
    return 0;
}

/* "L=.. NH=.. C=.. T=.. V=.. P=..": a model's shape and fragment count as
 * refusals name them, for both sides. */
static const char *shape_str(const dl_model_config *m, uint32_t P, char buf[128])
{
    snprintf(buf, 128, "L=%d NH=%d C=%d T=%d V=%d P=%u", m->n_layer, m->n_head, m->n_embd, m->seq_len, m->vocab, P);
    return buf;
}

/* A resumed run must describe the stored model and seed: DL_EMISMATCH naming
 * the first field that differs, with both values, and both shapes. */
static int same_model(const dl_store *s, const dl_store_run *r)
{
    char a[128], b[128];
    const char *names[] = {"n_layer", "n_head", "n_embd", "seq_len", "vocab"};
    int have[] = {s->model.n_layer, s->model.n_head, s->model.n_embd, s->model.seq_len, s->model.vocab};
    int want[] = {r->model.n_layer, r->model.n_head, r->model.n_embd, r->model.seq_len, r->model.vocab};
    for (int i = 0; i < 5; i++)
        if (have[i] != want[i])
            return dl_err(DL_EMISMATCH,
                          "store %s holds run '%s' with %s %d; refusing %s %d (the store's model: %s; this one: %s)",
                          s->dir, s->run_id, names[i], have[i], names[i], want[i], shape_str(&s->model, s->n_frag, a),
                          shape_str(&r->model, r->n_fragments, b));
    if (s->seed != r->seed)
        return dl_err(DL_EMISMATCH, "store %s holds run '%s' with seed %llu; refusing seed %llu", s->dir, s->run_id,
                      (unsigned long long)s->seed, (unsigned long long)r->seed);
    return 0;
}

int dl_store_init_run(dl_store *s, const dl_store_run *run, const float *const *init_params)
{
    return dl_store_init_run_shard(s, run, NULL, init_params);
}

int dl_store_init_run_shard(dl_store *s, const dl_store_run *run, const dl_store_shard *layout,
                            const float *const *init_params)
{
    assert(s && run);
    DL_TRY(check_run(run));
    dl_store_shard lay = layout && layout->shards > 1 ? *layout : (dl_store_shard){0, 0};
    if (layout && (layout->shards > 0xffff || dl_shard_check((int)run->n_fragments, (int)layout->shard,
                                                             (int)layout->shards)))
        return dl_err(DL_EINVAL, "run '%s': shard layout: %s", run->run_id,
                      layout->shards > 0xffff ? "more than 65535 shards" : dl_errmsg());
    if (s->have_run) {
        /* the run id first (another run altogether), then the field that
         * differs, then what the model does not cover (plan, numels) */
        if (strcmp(s->run_id, run->run_id) == 0) DL_TRY(same_model(s, run));
        int same = strcmp(s->run_id, run->run_id) == 0 && s->fingerprint == run->fingerprint &&
                   s->n_frag == run->n_fragments;
        for (uint32_t p = 0; same && p < s->n_frag; p++) same = s->numel[p] == run->numel[p];
        if (!same) {
            char a[128], b[128];
            return dl_err(DL_EMISMATCH,
                          "store %s holds run '%s' (fingerprint %016llx, P=%u); refusing run '%s' "
                          "(fingerprint %016llx, P=%u) (the store's model: %s; this one: %s)",
                          s->dir, s->run_id, (unsigned long long)s->fingerprint, s->n_frag, run->run_id,
                          (unsigned long long)run->fingerprint, run->n_fragments, shape_str(&s->model, s->n_frag, a),
                          shape_str(&run->model, run->n_fragments, b));
        }
        if (s->shards != lay.shards || s->shard != lay.shard) {
            char a[48], b[48];
            return dl_err(DL_EMISMATCH, "store %s holds %s of run '%s'; refusing %s", s->dir,
                          layout_str(s->shard, s->shards, a), s->run_id, layout_str(lay.shard, lay.shards, b));
        }
        DL_INFO("store %s: resuming run '%s'", s->dir, s->run_id);
        return 0;
    }
    if (!init_params) return dl_err(DL_EINVAL, "store %s is empty: init_run needs initial params", s->dir);
    if (s->read_only) return dl_err(DL_EINVAL, "store %s is open read-only", s->dir);
    uint32_t P = run->n_fragments;
    if (s->auto_map) DL_TRY(map_grow(s, run_map_size(P, run->numel)));
    uint64_t **sums = dl_xcalloc(2 * (size_t)P, sizeof *sums);
    for (uint32_t p = 0; p < P; p++) {
        assert(init_params[p]);
        sums[p] = dl_xmalloc(blocks_of(run->numel[p]) * sizeof **sums);
        sums[P + p] = dl_xmalloc(blocks_of(run->numel[p]) * sizeof **sums);
        hash_blocks(init_params[p], run->numel[p], sums[p]);
        hash_blocks(NULL, run->numel[p], sums[P + p]);
    }
    struct init_ctx c = {run, lay, init_params, sums, sums + P, dl_wallclock_ns()};
    int rc = store_write(s, state_bytes(P, run->numel), init_fn, &c);
    for (uint32_t p = 0; p < 2 * P; p++) free(sums[p]);
    free(sums);
    if (rc < 0) return rc;
    snprintf(s->run_id, sizeof s->run_id, "%s", run->run_id);
    s->fingerprint = run->fingerprint;
    s->numel = dl_xmalloc(P * sizeof *s->numel);
    memcpy(s->numel, run->numel, P * sizeof *s->numel);
    s->config_text = run->config_text ? strcpy(dl_xmalloc(strlen(run->config_text) + 1), run->config_text) : NULL;
    s->model = run->model;
    dl_model_config_check(&s->model); /* fills padded_vocab; checked by check_run */
    s->seed = run->seed;
    s->shard = lay.shard;
    s->shards = lay.shards;
    s->n_frag = P;
    s->have_run = 1;
    DL_INFO("store %s: initialized run '%s' (fingerprint %016llx, %u fragments)", s->dir, s->run_id,
            (unsigned long long)s->fingerprint, P);
    return 0;
}

int dl_store_get_run(const dl_store *s, dl_store_run *out)
{
    assert(s && out);
    if (!s->have_run) return dl_err(DL_ENOTFOUND, "store %s has no run", s->dir);
    *out = (dl_store_run){s->run_id, s->fingerprint, s->config_text, s->n_frag, s->numel, s->model, s->seed};
    return 0;
}

int dl_store_get_shard(const dl_store *s, dl_store_shard *out)
{
    assert(s && out);
    if (!s->have_run) return dl_err(DL_ENOTFOUND, "store %s has no run", s->dir);
    *out = (dl_store_shard){s->shard, s->shards};
    return 0;
}

uint32_t dl_store_n_fragments(const dl_store *s) { return s->have_run ? s->n_frag : 0; }
uint64_t dl_store_fragment_numel(const dl_store *s, uint32_t p)
{
    return s->have_run && p < s->n_frag ? s->numel[p] : 0;
}

static int epoch_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    uint64_t *epoch = ctx;
    MDB_val k = key_str("epoch"), v;
    MDB_GET(t, s->dbi_meta, &k, &v, DL_ECORRUPT, "store %s: meta has no epoch", s->dir);
    DL_TRY(epoch_decode(&v, epoch));
    uint8_t b[EPOCH_LEN];
    put32(b, MAGIC_EPOCH);
    put32(b + 4, FMT_VERSION);
    put64(b + 8, ++*epoch);
    v = (MDB_val){EPOCH_LEN, b};
    MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, 0));
    return 0;
}

int dl_store_bump_epoch(dl_store *s, uint64_t *epoch_out)
{
    assert(s && epoch_out);
    uint64_t epoch = 0;
    DL_TRY(store_write(s, 0, epoch_fn, &epoch));
    /* the epoch fences off older synchronizers: it must survive power loss */
    if (s->durability == DL_STORE_PERIODIC) MDB_CALL(mdb_env_sync(s->env, 1));
    *epoch_out = epoch;
    return 0;
}

int dl_store_get_epoch(dl_store *s, uint64_t *epoch_out)
{
    assert(s && epoch_out);
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    MDB_val k = key_str("epoch"), v;
    int rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = epoch_decode(&v, epoch_out);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ECORRUPT, "store %s: meta has no epoch", s->dir)
                                : mdb_fail(rc, "mdb_get(meta, epoch)", __FILE__, __LINE__);
    txn_abort(s, t);
    return rc;
}

static int eval_put_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    const dl_store_eval *e = ctx;
    uint8_t b[EVAL_LEN] = {0};
    put32(b, MAGIC_EVAL);
    put32(b + 4, FMT_VERSION);
    put64(b + 8, e->version);
    putf64(b + 16, e->loss);
    put32(b + 24, e->seqs);
    put64(b + 32, (uint64_t)e->wallclock_ns);
    MDB_val k = key_str("eval"), v = {EVAL_LEN, b};
    MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, 0));
    return 0;
}

int dl_store_put_eval(dl_store *s, const dl_store_eval *e)
{
    assert(s && e);
    return store_write(s, 0, eval_put_fn, (void *)e);
}

int dl_store_get_eval(dl_store *s, dl_store_eval *out)
{
    assert(s && out);
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    MDB_val k = key_str("eval"), v;
    int rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_SUCCESS) {
        const uint8_t *b = v.mv_data;
        if (v.mv_size != EVAL_LEN || get32(b) != MAGIC_EVAL || get32(b + 4) != FMT_VERSION) {
            rc = dl_err(DL_ECORRUPT, "store %s: meta eval: bad size/magic/format (%zu bytes)", s->dir, v.mv_size);
        } else {
            out->version = get64(b + 8);
            out->loss = getf64(b + 16);
            out->seqs = get32(b + 24);
            out->wallclock_ns = (int64_t)get64(b + 32);
            rc = 0;
        }
    } else {
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ENOTFOUND, "store %s: no evaluation recorded", s->dir)
                                : mdb_fail(rc, "mdb_get(meta, eval)", __FILE__, __LINE__);
    }
    txn_abort(s, t);
    return rc;
}

// ----------------------------------------------------------------------------
// fragment reads

static int check_p(const dl_store *s, uint32_t p)
{
    if (!s->have_run) return dl_err(DL_ENOTFOUND, "store %s has no run", s->dir);
    if (p >= s->n_frag) return dl_err(DL_ERANGE, "fragment %u out of range (P=%u)", p, s->n_frag);
    return 0;
}

/* Copy every block of one array of fragment p (header h) into x and its
 * stored checksums into sums (verified by the caller, on the copy). */
static int read_array(dl_store *s, MDB_txn *t, int mom, uint32_t p, const frag_hdr *h, float *x, uint64_t *sums)
{
    for (uint32_t b = 0; b < h->blocks; b++) {
        blk_view bv = {0};
        DL_TRY(blk_get(s, t, mom, p, h, b, &bv));
        memcpy(x + (size_t)b * BF, bv.data, (size_t)bv.n * 4);
        sums[b] = bv.sum;
    }
    return 0;
}

static int verify_array(int mom, uint32_t p, const frag_hdr *h, const float *x, const uint64_t *sums)
{
    for (uint32_t b = 0; b < h->blocks; b++) {
        uint64_t sum = dl_checksum64(x + (size_t)b * BF, (size_t)block_len(h->numel, b) * 4);
        if (sum != sums[b])
            return dl_err(DL_ECORRUPT, "fragment %u version %llu: %s checksum %016llx, stored %016llx (%s[%u,%u])",
                          p, (unsigned long long)h->version, mom ? "momentum" : "params", (unsigned long long)sum,
                          (unsigned long long)sums[b], arr_db(mom), p, b);
    }
    return 0;
}

int dl_store_read_fragment(dl_store *s, uint32_t p, uint64_t *version, float *params, float *momentum)
{
    assert(s && version);
    DL_TRY(check_p(s, p));
    uint32_t nb = blocks_of(s->numel[p]);
    uint64_t *sums = dl_xmalloc(2 * (size_t)nb * sizeof *sums);
    MDB_txn *t;
    frag_hdr h = {0};
    int rc = txn_begin(s, 0, &t);
    if (rc == 0) {
        rc = frag_get(s, t, p, &h);
        if (rc == 0 && params) rc = read_array(s, t, 0, p, &h, params, sums);
        if (rc == 0 && momentum) rc = read_array(s, t, 1, p, &h, momentum, sums + nb);
        txn_abort(s, t);
    }
    /* verify the copies outside the transaction */
    if (rc == 0 && params) rc = verify_array(0, p, &h, params, sums);
    if (rc == 0 && momentum) rc = verify_array(1, p, &h, momentum, sums + nb);
    free(sums);
    if (rc == 0) *version = h.version;
    return rc;
}

int dl_store_snapshot_begin(dl_store *s, dl_store_snap **out)
{
    assert(s && out);
    dl_store_snap *snap = dl_xcalloc(1, sizeof *snap);
    snap->s = s;
    int rc = txn_begin(s, 0, &snap->txn);
    if (rc < 0) {
        free(snap);
        *out = NULL;
        return rc;
    }
    atomic_fetch_add(&s->snaps_open, 1);
    *out = snap;
    return 0;
}

static float *snap_copy_new(dl_store_snap *snap, uint32_t p, int whole, uint64_t n)
{
    if (snap->ncopies == snap->capcopies) {
        snap->capcopies = snap->capcopies ? 2 * snap->capcopies : 8;
        snap->copies = dl_xrealloc(snap->copies, snap->capcopies * sizeof *snap->copies);
    }
    float *x = dl_xaligned(64, (size_t)n * 4);
    snap->copies[snap->ncopies++] = (snap_copy){x, p, whole};
    return x;
}

/* Params [offset, offset + n) of fragment p (header h): a pointer into the
 * map when they lie in one block and are aligned, else a copy. */
static int snap_range(dl_store_snap *snap, uint32_t p, const frag_hdr *h, uint64_t offset, uint64_t n, int whole,
                      const float **out)
{
    dl_store *s = snap->s;
    uint32_t b = (uint32_t)(offset / BF);
    blk_view bv = {0};
    DL_TRY(blk_get(s, snap->txn, 0, p, h, b, &bv));
    uint64_t in = offset - (uint64_t)b * BF;
    const uint8_t *ptr = bv.data + in * 4;
    if (in + n <= bv.n && (uintptr_t)ptr % _Alignof(float) == 0) {
        *out = (const float *)ptr;
        return 0;
    }
    float *x = snap_copy_new(snap, p, whole, n);
    for (uint64_t done = 0; done < n; b++, in = 0) {
        if (done) DL_TRY(blk_get(s, snap->txn, 0, p, h, b, &bv));
        uint64_t take = bv.n - in < n - done ? bv.n - in : n - done;
        memcpy(x + done, bv.data + in * 4, (size_t)take * 4);
        done += take;
    }
    *out = x;
    return 0;
}

int dl_store_snapshot_info(dl_store_snap *snap, uint32_t p, uint64_t *version, size_t *numel)
{
    assert(snap && version && numel);
    DL_TRY(check_p(snap->s, p));
    frag_hdr h = {0};
    DL_TRY(frag_get(snap->s, snap->txn, p, &h));
    *version = h.version;
    *numel = (size_t)h.numel;
    return 0;
}

int dl_store_snapshot_range(dl_store_snap *snap, uint32_t p, uint64_t offset, size_t max_n, uint64_t *version,
                            const float **params, size_t *n)
{
    assert(snap && version && params && n && max_n > 0);
    DL_TRY(check_p(snap->s, p));
    frag_hdr h = {0};
    DL_TRY(frag_get(snap->s, snap->txn, p, &h));
    if (offset >= h.numel)
        return dl_err(DL_ERANGE, "fragment %u: offset %llu is past its %llu elements", p, (unsigned long long)offset,
                      (unsigned long long)h.numel);
    uint64_t want = h.numel - offset < max_n ? h.numel - offset : max_n;
    DL_TRY(snap_range(snap, p, &h, offset, want, 0, params));
    *version = h.version;
    *n = (size_t)want;
    return 0;
}

int dl_store_snapshot_fragment(dl_store_snap *snap, uint32_t p, uint64_t *version, const float **params,
                               size_t *numel)
{
    assert(snap && version && params && numel);
    DL_TRY(check_p(snap->s, p));
    frag_hdr h = {0};
    DL_TRY(frag_get(snap->s, snap->txn, p, &h));
    const float *x = NULL;
    for (size_t i = 0; i < snap->ncopies && !x; i++)
        if (snap->copies[i].whole && snap->copies[i].p == p) x = snap->copies[i].data;
    if (!x) DL_TRY(snap_range(snap, p, &h, 0, h.numel, 1, &x));
    *version = h.version;
    *params = x;
    *numel = (size_t)h.numel;
    return 0;
}

void dl_store_snapshot_end(dl_store_snap **sp)
{
    if (!sp || !*sp) return;
    dl_store_snap *snap = *sp;
    txn_abort(snap->s, snap->txn);
    atomic_fetch_sub(&snap->s->snaps_open, 1);
    for (size_t i = 0; i < snap->ncopies; i++) free(snap->copies[i].data);
    free(snap->copies);
    free(snap);
    *sp = NULL;
}

// ----------------------------------------------------------------------------
// merge commit

struct commit_ctx {
    uint32_t p;
    uint64_t new_version, numel;
    const uint64_t *psum, *msum; /* [blocks] */
    const float *params, *momentum;
    const uint8_t *rec;
    size_t rec_len;
    dl_store_ledger ledger; /* added to the totals in the same transaction */
    int64_t wall;
};

static int ledger_rmw(dl_store *s, MDB_txn *t, const dl_store_ledger *delta)
{
    MDB_val k = key_str("totals"), v;
    dl_store_ledger l = {{0}};
    MDB_GET(t, s->dbi_ledger, &k, &v, DL_ECORRUPT, "store %s: ledger totals missing", s->dir);
    DL_TRY(ledger_decode(&v, &l));
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) l.tokens[i] += delta->tokens[i];
    uint8_t buf[LEDGER_LEN];
    put32(buf, MAGIC_LEDGER);
    put32(buf + 4, FMT_VERSION);
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) put64(buf + 8 + 8 * i, l.tokens[i]);
    v = (MDB_val){LEDGER_LEN, buf};
    MDB_CALL(mdb_put(t, s->dbi_ledger, &k, &v, 0));
    return 0;
}

static int commit_fn(dl_store *s, MDB_txn *t, void *vctx)
{
    struct commit_ctx *c = vctx;
    uint8_t kb[12];
    frag_hdr h = {0};
    DL_TRY(frag_get(s, t, c->p, &h));
    if (c->new_version != h.version + 1)
        return dl_err(DL_EMISMATCH, "fragment %u: refusing to commit version %llu, stored version is %llu", c->p,
                      (unsigned long long)c->new_version, (unsigned long long)h.version);
    MDB_val k = key_merge(kb, c->p, c->new_version), v = {c->rec_len, (void *)c->rec};
    int rc = mdb_put(t, s->dbi_merges, &k, &v, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST)
        return dl_err(DL_ECORRUPT, "merges[%u,%llu] already exists while fragment %u is at version %llu", c->p,
                      (unsigned long long)c->new_version, c->p, (unsigned long long)h.version);
    if (rc) return mdb_fail(rc, "mdb_put(merges)", __FILE__, __LINE__);
    DL_TRY(put_frag_hdr(s, t, c->p, c->new_version, c->numel, c->wall));
    DL_TRY(put_blocks(s, t, 0, c->p, c->new_version, c->numel, c->params, c->psum));
    DL_TRY(put_blocks(s, t, 1, c->p, c->new_version, c->numel, c->momentum, c->msum));
    return ledger_rmw(s, t, &c->ledger);
}

int dl_store_commit_merge(dl_store *s, uint32_t p, uint64_t new_version, const float *params,
                          const float *momentum, const dl_merge_record *rec, const dl_store_ledger *ledger)
{
    assert(s && params && momentum && rec);
    DL_TRY(check_p(s, p));
    DL_TRY(mrec_validate(rec));
    uint64_t applied = 0;
    for (uint32_t i = 0; i < rec->n_contrib; i++)
        if (rec->contrib[i].decision == DL_MERGE_MERGED) applied += rec->contrib[i].tokens;
    uint64_t given = ledger ? ledger->tokens[DL_LEDGER_APPLIED] : 0;
    if (given != applied)
        return dl_err(DL_EINVAL, "fragment %u merge %llu: ledger adds %llu applied tokens, its merged contributors have %llu",
                      p, (unsigned long long)new_version, (unsigned long long)given, (unsigned long long)applied);
    struct commit_ctx c = {.p = p, .new_version = new_version, .numel = s->numel[p], .params = params,
                           .momentum = momentum, .wall = dl_wallclock_ns()};
    /* encode and checksum before the transaction: nothing slow inside it */
    uint32_t nb = blocks_of(c.numel);
    uint64_t *sums = dl_xmalloc(2 * (size_t)nb * sizeof *sums);
    hash_blocks(params, c.numel, sums);
    hash_blocks(momentum, c.numel, sums + nb);
    c.psum = sums, c.msum = sums + nb;
    c.rec_len = mrec_size(rec->n_contrib);
    uint8_t *buf = dl_xmalloc(c.rec_len); /* mrec_validate bounds n_contrib */
    mrec_encode(buf, p, new_version, rec);
    c.rec = buf;
    if (ledger) c.ledger = *ledger;
    uint64_t need = 2 * (uint64_t)nb * block_size(c.numel) + FRAG_HDR + c.rec_len;
    int rc = store_write(s, need, commit_fn, &c);
    free(buf);
    free(sums);
    return rc;
}

int dl_store_get_merge(dl_store *s, uint32_t p, uint64_t version, dl_merge_record *out)
{
    assert(s && out);
    memset(out, 0, sizeof *out);
    DL_TRY(check_p(s, p));
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    uint8_t kb[12];
    MDB_val k = key_merge(kb, p, version), v;
    dl_merge_contrib *buf = NULL;
    uint32_t cap = 0;
    int rc = mdb_get(t, s->dbi_merges, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = mrec_decode(&v, p, version, out, &buf, &cap);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ENOTFOUND, "no merge record for fragment %u version %llu", p,
                                         (unsigned long long)version)
                                : mdb_fail(rc, "mdb_get(merges)", __FILE__, __LINE__);
    txn_abort(s, t);
    if (rc < 0) {
        free(buf);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

void dl_merge_record_free(dl_merge_record *rec)
{
    if (!rec) return;
    free(rec->contrib);
    rec->contrib = NULL;
    rec->n_contrib = 0;
}

static int foreach_merge_in(dl_store *s, MDB_txn *t, uint32_t p, uint64_t from, dl_merge_cb cb, void *ctx)
{
    MDB_cursor *cur;
    MDB_CALL(mdb_cursor_open(t, s->dbi_merges, &cur));
    uint8_t kb[12];
    MDB_val k = key_merge(kb, p, from), v;
    dl_merge_contrib *buf = NULL;
    uint32_t cap = 0;
    int rc = 0;
    for (int lrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);; lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (lrc == MDB_NOTFOUND) break;
        if (lrc) {
            rc = mdb_fail(lrc, "mdb_cursor_get(merges)", __FILE__, __LINE__);
            break;
        }
        if (k.mv_size != 12) {
            rc = dl_err(DL_ECORRUPT, "merges: key of %zu bytes", k.mv_size);
            break;
        }
        if (key_frag_p(&k) != p) break;
        dl_merge_record rec;
        if ((rc = mrec_decode(&v, p, key_merge_version(&k), &rec, &buf, &cap)) < 0) break;
        if ((rc = cb(&rec, ctx)) != 0) break;
    }
    free(buf);
    mdb_cursor_close(cur);
    return rc;
}

int dl_store_foreach_merge(dl_store *s, uint32_t p, uint64_t from_version, dl_merge_cb cb, void *ctx)
{
    assert(s && cb);
    DL_TRY(check_p(s, p));
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    int rc = foreach_merge_in(s, t, p, from_version, cb, ctx);
    txn_abort(s, t);
    return rc;
}

// ----------------------------------------------------------------------------
// learners, ledger, stats

static int learner_put_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    const dl_store_learner *r = ctx;
    uint8_t b[LEARNER_LEN];
    learner_encode(b, r);
    MDB_val k = key_str(r->id), v = {LEARNER_LEN, b};
    MDB_CALL(mdb_put(t, s->dbi_learners, &k, &v, 0));
    return 0;
}

int dl_store_learner_put(dl_store *s, const dl_store_learner *rec)
{
    assert(s && rec);
    DL_TRY(check_id("learner id", rec->id));
    return store_write(s, 0, learner_put_fn, (void *)rec);
}

typedef struct {
    const dl_store_learner *recs;
    int n;
} learner_many;

static int learner_put_many_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    const learner_many *m = ctx;
    for (int i = 0; i < m->n; i++) DL_TRY(learner_put_fn(s, t, (void *)&m->recs[i]));
    return 0;
}

int dl_store_learner_put_many(dl_store *s, const dl_store_learner *recs, int n)
{
    assert(s && (recs || n == 0));
    for (int i = 0; i < n; i++) DL_TRY(check_id("learner id", recs[i].id));
    if (n == 0) return 0;
    learner_many m = {recs, n};
    return store_write(s, 0, learner_put_many_fn, &m);
}

int dl_store_learner_get(dl_store *s, const char *id, dl_store_learner *out)
{
    assert(s && out);
    DL_TRY(check_id("learner id", id));
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    MDB_val k = key_str(id), v;
    int rc = mdb_get(t, s->dbi_learners, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = learner_decode(&k, &v, out);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ENOTFOUND, "learner '%s' is not in the registry", id)
                                : mdb_fail(rc, "mdb_get(learners)", __FILE__, __LINE__);
    txn_abort(s, t);
    return rc;
}

static int foreach_learner_in(dl_store *s, MDB_txn *t, dl_learner_cb cb, void *ctx)
{
    MDB_cursor *cur;
    MDB_CALL(mdb_cursor_open(t, s->dbi_learners, &cur));
    MDB_val k, v;
    int rc = 0;
    for (int lrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);; lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (lrc == MDB_NOTFOUND) break;
        if (lrc) {
            rc = mdb_fail(lrc, "mdb_cursor_get(learners)", __FILE__, __LINE__);
            break;
        }
        dl_store_learner r;
        if ((rc = learner_decode(&k, &v, &r)) < 0 || (cb && (rc = cb(&r, ctx)) != 0)) break;
    }
    mdb_cursor_close(cur);
    return rc;
}

int dl_store_foreach_learner(dl_store *s, dl_learner_cb cb, void *ctx)
{
    assert(s && cb);
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    int rc = foreach_learner_in(s, t, cb, ctx);
    txn_abort(s, t);
    return rc;
}

int dl_store_ledger_get(dl_store *s, dl_store_ledger *out)
{
    assert(s && out);
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    MDB_val k = key_str("totals"), v;
    int rc = mdb_get(t, s->dbi_ledger, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = ledger_decode(&v, out);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ECORRUPT, "store %s: ledger totals missing", s->dir)
                                : mdb_fail(rc, "mdb_get(ledger)", __FILE__, __LINE__);
    txn_abort(s, t);
    return rc;
}

static int ledger_add_fn(dl_store *s, MDB_txn *t, void *vctx) { return ledger_rmw(s, t, vctx); }

int dl_store_ledger_add(dl_store *s, const dl_store_ledger *delta)
{
    assert(s && delta);
    assert(delta->tokens[DL_LEDGER_APPLIED] == 0 && "applied tokens move only with a merge commit");
    dl_store_ledger d = *delta;
    return store_write(s, 0, ledger_add_fn, &d);
}

int dl_store_get_stats(dl_store *s, dl_store_stats *out)
{
    assert(s && out);
    memset(out, 0, sizeof *out);
    MDB_txn *t;
    DL_TRY(txn_begin(s, 0, &t));
    MDB_envinfo info;
    int rc = mdb_env_info(s->env, &info); /* the map cannot move: this transaction is counted */
    /* the freelist (FREE_DBI, 0): one record per freeing transaction, an
     * IDL whose first word is its page count */
    uint64_t free_pages = 0;
    MDB_cursor *cur = NULL;
    if (rc == 0) rc = mdb_cursor_open(t, 0, &cur);
    if (rc == 0) {
        MDB_val k, v;
        int lrc;
        for (lrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); lrc == MDB_SUCCESS;
             lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            size_t n = 0;
            if (v.mv_size >= sizeof n) memcpy(&n, v.mv_data, sizeof n);
            free_pages += n;
        }
        if (lrc != MDB_NOTFOUND) rc = lrc;
        mdb_cursor_close(cur);
    }
    txn_abort(s, t);
    if (rc) return mdb_fail(rc, "dl_store_get_stats", __FILE__, __LINE__);
    struct stat st;
    mdb_filehandle_t fd;
    uint64_t file = 0;
    if (mdb_env_get_fd(s->env, &fd) == 0 && fstat(fd, &st) == 0) file = (uint64_t)st.st_size;
    uint64_t used = ((uint64_t)info.me_last_pgno + 1) * s->psize, free_b = free_pages * s->psize;
    if (free_b > used) free_b = used;
    *out = (dl_store_stats){
        .map_size = info.me_mapsize,
        .file_bytes = file,
        .used_bytes = used,
        .free_bytes = free_b,
        .live_bytes = used - free_b,
        .state_bytes = s->have_run ? state_bytes(s->n_frag, s->numel) : 0,
        .page_size = s->psize,
        .readers_used = info.me_numreaders,
        .readers_max = info.me_maxreaders,
        .stale_readers_cleared = s->stale_cleared,
        .map_grows = atomic_load(&s->map_grows),
        .map_full_retries = atomic_load(&s->map_full_retries),
        .grow_timeouts = atomic_load(&s->grow_timeouts),
        .snapshots_open = (uint32_t)atomic_load(&s->snaps_open),
    };
    return 0;
}

// ----------------------------------------------------------------------------
// offline checker

struct check_sum {
    uint64_t epoch, records, learners, blocks;
    uint64_t applied, dropped; /* token sums over merge records */
    dl_store_ledger ledger;
    /* per-fragment record walk */
    uint32_t p;
    uint64_t expect;
};

static int check_record_cb(const dl_merge_record *r, void *ctx)
{
    struct check_sum *c = ctx;
    if (r->version != c->expect)
        return dl_err(DL_ECORRUPT, "fragment %u: merge record version %llu missing (next record is %llu)", c->p,
                      (unsigned long long)c->expect, (unsigned long long)r->version);
    c->expect++;
    c->records++;
    for (uint32_t i = 0; i < r->n_contrib; i++) {
        if (r->contrib[i].decision == DL_MERGE_MERGED) c->applied += r->contrib[i].tokens;
        if (r->contrib[i].decision == DL_MERGE_DROPPED_STALE) c->dropped += r->contrib[i].tokens;
    }
    return 0;
}

/* Any key in db at or after `from` (a fragment index >= P) is a stray. */
static int check_no_stray(dl_store *s, MDB_txn *t, MDB_dbi dbi, const char *name, size_t klen)
{
    MDB_cursor *cur;
    MDB_CALL(mdb_cursor_open(t, dbi, &cur));
    uint8_t kb[12];
    MDB_val k = klen == 4 ? key_frag(kb, s->n_frag) : key_merge(kb, s->n_frag, 0), v;
    int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    if (rc == MDB_SUCCESS)
        rc = dl_err(DL_ECORRUPT, "%s: stray key of %zu bytes for fragment %u (run has P=%u)", name, k.mv_size,
                    k.mv_size >= 4 ? key_frag_p(&k) : 0, s->n_frag);
    else if (rc == MDB_NOTFOUND)
        rc = 0;
    else
        rc = mdb_fail(rc, "mdb_cursor_get", __FILE__, __LINE__);
    /* keys of the wrong length sort anywhere: walk all for those */
    for (int lrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &k, &v, MDB_FIRST); lrc == MDB_SUCCESS;
         lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
        if (k.mv_size != klen) {
            rc = dl_err(DL_ECORRUPT, "%s: key of %zu bytes (expected %zu)", name, k.mv_size, klen);
            break;
        }
    mdb_cursor_close(cur);
    return rc;
}

/* Walk the params (mom 0) or outer (mom 1) database in key order: exactly
 * the blocks (p, 0..blocks-1) of every p < P, each valid for its
 * fragment's header h[p] and matching its checksum; nothing else. */
static int check_blocks(dl_store *s, MDB_txn *t, int mom, const frag_hdr *h, struct check_sum *c)
{
    const char *db = arr_db(mom);
    MDB_cursor *cur;
    MDB_CALL(mdb_cursor_open(t, mom ? s->dbi_outer : s->dbi_params, &cur));
    MDB_val k, v;
    int rc = 0, lrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    for (uint32_t p = 0; p < s->n_frag && !rc; p++)
        for (uint32_t b = 0; b < h[p].blocks && !rc; b++, lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            uint8_t kb[8];
            key_blk(kb, p, b);
            int cmp = lrc == MDB_SUCCESS ? memcmp(k.mv_data, kb, k.mv_size < 8 ? k.mv_size : 8) : 1;
            if (lrc != MDB_SUCCESS && lrc != MDB_NOTFOUND) {
                rc = mdb_fail(lrc, "mdb_cursor_get", __FILE__, __LINE__);
            } else if (lrc == MDB_SUCCESS && k.mv_size != 8) {
                rc = dl_err(DL_ECORRUPT, "%s: key of %zu bytes (expected 8)", db, k.mv_size);
            } else if (cmp < 0) {
                rc = dl_err(DL_ECORRUPT, "%s: stray key for fragment %u block %u (fragment %u has %u blocks, P=%u)", db,
                            key_frag_p(&k), get_be32((const uint8_t *)k.mv_data + 4), key_frag_p(&k),
                            key_frag_p(&k) < s->n_frag ? h[key_frag_p(&k)].blocks : 0, s->n_frag);
            } else if (cmp > 0) {
                rc = dl_err(DL_ECORRUPT, "%s[%u,%u] missing (fragment %u has %u blocks)", db, p, b, p, h[p].blocks);
            } else {
                blk_view bv = {0};
                uint64_t sum;
                if ((rc = blk_decode(mom, p, b, &h[p], &v, &bv)) == 0 &&
                    (sum = dl_checksum64(bv.data, (size_t)bv.n * 4)) != bv.sum)
                    rc = dl_err(DL_ECORRUPT,
                                "fragment %u version %llu: %s checksum %016llx, stored %016llx (%s[%u,%u])", p,
                                (unsigned long long)h[p].version, mom ? "momentum" : "params",
                                (unsigned long long)sum, (unsigned long long)bv.sum, db, p, b);
                c->blocks++;
            }
        }
    if (rc == 0 && lrc == MDB_SUCCESS)
        rc = k.mv_size == 8 ? dl_err(DL_ECORRUPT, "%s: stray key for fragment %u block %u (P=%u)", db, key_frag_p(&k),
                                     get_be32((const uint8_t *)k.mv_data + 4), s->n_frag)
                            : dl_err(DL_ECORRUPT, "%s: key of %zu bytes (expected 8)", db, k.mv_size);
    else if (rc == 0 && lrc != MDB_NOTFOUND)
        rc = mdb_fail(lrc, "mdb_cursor_get", __FILE__, __LINE__);
    mdb_cursor_close(cur);
    return rc;
}

static int count_learner_cb(const dl_store_learner *r, void *ctx)
{
    (void)r;
    ((struct check_sum *)ctx)->learners++;
    return 0;
}

/* One read transaction for a consistent view of the whole store; it blocks
 * no writer, so holding it while hashing is fine for an offline check. */
static int check_in(dl_store *s, MDB_txn *t, frag_hdr *h, struct check_sum *c)
{
    MDB_val k = key_str("epoch"), v;
    MDB_GET(t, s->dbi_meta, &k, &v, DL_ECORRUPT, "meta has no epoch");
    DL_TRY(epoch_decode(&v, &c->epoch));
    k = key_str("totals");
    MDB_GET(t, s->dbi_ledger, &k, &v, DL_ECORRUPT, "ledger totals missing");
    DL_TRY(ledger_decode(&v, &c->ledger));
    for (uint32_t p = 0; p < s->n_frag; p++) {
        DL_TRY(frag_get(s, t, p, &h[p]));
        if (h[p].version && !dl_shard_owns((int)p, (int)s->shard, (int)s->shards))
            return dl_err(DL_ECORRUPT, "fragment %u is at version %llu in the store of shard %u of %u; it belongs to "
                          "shard %d", p, (unsigned long long)h[p].version, s->shard, s->shards,
                          dl_shard_of((int)p, (int)s->shards));
        c->p = p;
        c->expect = 1;
        DL_TRY(foreach_merge_in(s, t, p, 0, check_record_cb, c));
        if (c->expect - 1 != h[p].version)
            return dl_err(DL_ECORRUPT, "fragment %u is at version %llu but has %llu merge records (1..%llu)", p,
                          (unsigned long long)h[p].version, (unsigned long long)(c->expect - 1),
                          (unsigned long long)(c->expect - 1));
    }
    DL_TRY(check_blocks(s, t, 0, h, c));
    DL_TRY(check_blocks(s, t, 1, h, c));
    DL_TRY(check_no_stray(s, t, s->dbi_frag, "fragments", 4));
    DL_TRY(check_no_stray(s, t, s->dbi_merges, "merges", 12));
    DL_TRY(foreach_learner_in(s, t, count_learner_cb, c));
    /* Dropped-stale pushes are recorded in their fragment's next merge
     * record, so the ones after a fragment's last merge are in the ledger
     * only: the records' sum is a lower bound. */
    if (c->applied != c->ledger.tokens[DL_LEDGER_APPLIED] || c->dropped > c->ledger.tokens[DL_LEDGER_DROPPED_STALE])
        return dl_err(DL_ECORRUPT,
                      "ledger says applied %llu, dropped_stale %llu tokens; merge records sum to %llu, %llu",
                      (unsigned long long)c->ledger.tokens[DL_LEDGER_APPLIED],
                      (unsigned long long)c->ledger.tokens[DL_LEDGER_DROPPED_STALE], (unsigned long long)c->applied,
                      (unsigned long long)c->dropped);
    return 0;
}

int dl_store_check(const char *dir, FILE *report)
{
    assert(dir);
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    struct check_sum c = {0};
    int rc = dl_store_open(dir, &o, &s);
    if (rc == 0 && !s->have_run) rc = dl_err(DL_EFORMAT, "store %s has no run (no fingerprint)", dir);
    if (rc == 0 && s->fingerprint == 0) rc = dl_err(DL_EFORMAT, "store %s: run fingerprint is zero", dir);
    if (rc == 0) {
        MDB_txn *t;
        frag_hdr *h = dl_xcalloc(s->n_frag, sizeof *h);
        rc = txn_begin(s, 0, &t);
        if (rc == 0) {
            rc = check_in(s, t, h, &c);
            txn_abort(s, t);
        }
        free(h);
    }
    if (report) {
        fprintf(report, "dloco store check: %s\n", dir);
        char lb[48];
        if (s && s->have_run && s->shards > 1)
            fprintf(report, "  %s (fragments p with p %% %u == %u)\n", layout_str(s->shard, s->shards, lb), s->shards,
                    s->shard);
        if (s && s->have_run)
            fprintf(report,
                    "  schema %u, run '%s', fingerprint %016llx, epoch %llu, %u fragments (%llu blocks), %llu merge "
                    "records, %llu learners\n"
                    "  ledger fragment-tokens: applied %llu, dropped_stale %llu, rejected %llu, lost %llu, "
                    "discarded %llu, outstanding %llu\n",
                    DL_STORE_SCHEMA_VERSION, s->run_id, (unsigned long long)s->fingerprint,
                    (unsigned long long)c.epoch, s->n_frag, (unsigned long long)c.blocks,
                    (unsigned long long)c.records, (unsigned long long)c.learners,
                    (unsigned long long)c.ledger.tokens[0], (unsigned long long)c.ledger.tokens[1],
                    (unsigned long long)c.ledger.tokens[2], (unsigned long long)c.ledger.tokens[3],
                    (unsigned long long)c.ledger.tokens[4], (unsigned long long)c.ledger.tokens[5]);
        if (rc == 0)
            fprintf(report, "  result: OK\n");
        else
            fprintf(report, "  result: FAILED (%s): %s\n", dl_strerror(rc), dl_errmsg());
    }
    dl_store_close(&s);
    return rc;
}
