/* LMDB state store, transactions: the gate every transaction passes, map
 * growth that waits out open snapshots, the write loop, open, reopen after an MDB_PANIC, close. */
#include "storage/store_int.h"

#include "core/err.h"
#include "core/manifest.h"
#include "core/log.h"
#include "core/shard.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Map sizing and growth (see dl_store_opts in store.h). */
#define MAP_DEFAULT (1ull << 30)
#define MAP_FACTOR 4           /* a run's map: this many times its stored arrays */
#define GROW_WAIT_MS 10000u    /* default dl_store_opts.grow_wait_ms */
#define ENTER_WAIT_MS 20       /* longest a transaction begin waits for a pending grow */

/* The raw LMDB code of the last failure on this thread, so the write loop can
 * tell MDB_MAP_FULL (grow and retry) from everything else. */
static _Thread_local int tl_mdb_rc;

int dl_store_mdb_fail(int rc, const char *what, const char *file, int line)
{
    tl_mdb_rc = rc;
    /* users get the LMDB function and its reason; the call and file:line
     * are for the debug log */
    DL_DEBUG("%s:%d: %s: %s", file, line, what, mdb_strerror(rc));
    return dl_err(DL_ESTORE, "LMDB %.*s failed: %s", (int)strcspn(what, "("), what, mdb_strerror(rc));
}

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
    if (!s->env) { /* a reopen failed (env_reopen): nothing is mapped */
        *map_size = 0;
        return 0;
    }
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
/* With the gate held: announce a change of the environment (grow_pending:
 * new transactions wait, ENTER_WAIT_MS at most) and wait up to grow_wait_ms
 * for this process's open transactions and snapshots to end. Returns how
 * many are still open (0: the environment may change now). The caller clears
 * grow_pending and broadcasts when done. */
static int quiesce_locked(dl_store *s)
{
    s->grow_pending = 1;
    s->grow_stalled = 0;
    struct timespec dl = deadline_ms(s->grow_wait_ms);
    while (s->active_txns > 0)
        if (pthread_cond_timedwait(&s->gate_cv, &s->gate, &dl) == ETIMEDOUT) break;
    return s->active_txns;
}

int dl_store_map_grow(dl_store *s, uint64_t min_size)
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
    int open = quiesce_locked(s), timed_out = open > 0, rc = 0;
    if (!timed_out) rc = s->env ? mdb_env_set_mapsize(s->env, (size_t)target) : MDB_PANIC;
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
    if (rc) return dl_store_mdb_fail(rc, "mdb_env_set_mapsize", __FILE__, __LINE__);
    if (target) {
        atomic_fetch_add(&s->map_grows, 1);
        DL_INFO("store %s: map grown to %llu MiB", s->dir, (unsigned long long)(target >> 20));
    }
    return 0;
}

/* Opens s->dir's environment into s->env again, with the databases
 * dl_store_open found (same names, same order): called with the gate held and
 * no transaction or snapshot open. On failure s->env stays NULL and the next
 * transaction tries again. Returns 0 or an LMDB code. */
static int env_reopen_locked(dl_store *s, uint64_t map_size)
{
    static const char *names[] = {"meta", "fragments", "params", "outer", "learners", "merges", "ledger"};
    MDB_dbi *dbis[] = {&s->dbi_meta,     &s->dbi_frag,   &s->dbi_params, &s->dbi_outer,
                       &s->dbi_learners, &s->dbi_merges, &s->dbi_ledger};
    if (s->env) mdb_env_close(s->env);
    s->env = NULL;
    MDB_env *e;
    int rc = mdb_env_create(&e);
    if (rc) return rc;
    unsigned flags = MDB_NOTLS | (s->durability == DL_STORE_PERIODIC ? MDB_NOSYNC : 0);
    MDB_txn *t = NULL;
    if ((rc = mdb_env_set_maxdbs(e, 8)) || (rc = mdb_env_set_maxreaders(e, 256)) ||
        (rc = mdb_env_set_mapsize(e, (size_t)map_size)) || (rc = mdb_env_open(e, s->dir, flags, 0644)) ||
        (rc = mdb_txn_begin(e, NULL, MDB_RDONLY, &t))) {
        mdb_env_close(e);
        return rc;
    }
    MDB_dbi got[7];
    for (int i = 0; i < 7 && !rc; i++) rc = mdb_dbi_open(t, names[i], 0, &got[i]);
    if (rc) mdb_txn_abort(t);
    else rc = mdb_txn_commit(t); /* a commit keeps the handles for the env's life */
    if (rc) {
        mdb_env_close(e);
        return rc;
    }
    for (int i = 0; i < 7; i++) *dbis[i] = got[i];
    s->env = e;
    return 0;
}

/* LMDB stops an environment for good when a commit cannot write its meta
 * page nor put the old one back (a full or failing disk at that instant):
 * every later transaction fails with MDB_PANIC. The data file still holds the
 * last commit that reached it (the meta page names it), so the environment
 * is closed and opened again once no transaction or snapshot of this process
 * is open, and commits succeed again as soon as the disk does, not after a
 * restart. A writer (may_wait) waits for open transactions like a map
 * growth (grow_wait_ms); a reader never waits: it reopens only when nothing
 * else is open, and otherwise fails at once with DL_EAGAIN. The
 * synchronizer's loop reads (stats, snapshots for Updates) while holding
 * pinned snapshots of its own: waiting there kept the worker's reopen from
 * ever quiescing and stalled the loop grow_wait_ms at a time, so that it
 * answered nobody and no SIGTERM (test_chaos, its disk faults; the waits
 * were untimed once, a deadlock). */
static int env_reopen(dl_store *s, uint32_t failed_serial, int may_wait)
{
    pthread_mutex_lock(&s->gate);
    if (!may_wait && (s->grow_pending || (!(s->env && s->env_serial != failed_serial) && s->active_txns > 0))) {
        /* a reader, and the reopen would have to wait (or another thread's is waiting) */
        int open = s->active_txns;
        pthread_mutex_unlock(&s->gate);
        return dl_err(DL_EAGAIN, "store %s: LMDB stopped the environment after a failed write (a full or failing "
                                 "disk) and it is being opened again, or waits for %d open transaction(s) or "
                                 "snapshot(s) of this process to end; nothing was read, retry", s->dir, open);
    }
    /* a growth, or another thread's reopen: waited for at most grow_wait_ms. An untimed wait deadlocked the
     * synchronizer (test_chaos, disk faults): the loop waited here while its own pinned read snapshots kept the
     * worker's reopen from ever quiescing, and the worker retried at once, setting grow_pending again */
    struct timespec dl = deadline_ms(s->grow_wait_ms);
    while (s->grow_pending)
        if (pthread_cond_timedwait(&s->gate_cv, &s->gate, &dl) == ETIMEDOUT && s->grow_pending) {
            pthread_mutex_unlock(&s->gate);
            return dl_err(DL_EAGAIN, "store %s: another thread is opening the environment again after a failed write "
                                     "(a full or failing disk); nothing was read or written, retry", s->dir);
        }
    if (s->env && s->env_serial != failed_serial) { /* another thread reopened it meanwhile: try that one */
        pthread_mutex_unlock(&s->gate);
        return 0;
    }
    int open = quiesce_locked(s), timed_out = open > 0, rc = 0;
    uint64_t size = 0;
    if (!timed_out) {
        map_info_locked(s, &size);
        rc = env_reopen_locked(s, size ? size : MAP_DEFAULT);
        s->env_serial++;
    }
    s->grow_pending = 0;
    pthread_cond_broadcast(&s->gate_cv);
    pthread_mutex_unlock(&s->gate);
    if (timed_out)
        return dl_err(DL_EAGAIN, "store %s: LMDB stopped the environment after a failed write and it must be opened "
                                 "again, but %d transaction(s) or snapshot(s) of this process stayed open for %u ms; "
                                 "nothing was written, retry", s->dir, open, s->grow_wait_ms);
    if (rc) return dl_store_mdb_fail(rc, "mdb_env_open(reopen)", __FILE__, __LINE__);
    atomic_fetch_add(&s->env_reopens, 1);
    DL_WARN("store %s: LMDB had stopped the environment after a failed write (a full or failing disk); opened it "
            "again at its last commit on disk", s->dir);
    return 0;
}

int dl_store_txn_begin(dl_store *s, int write, MDB_txn **out)
{
    for (int attempt = 0;; attempt++) {
        gate_enter(s);
        int rc = s->env ? mdb_txn_begin(s->env, NULL, write ? 0 : MDB_RDONLY, out) : MDB_PANIC;
        if (rc == MDB_SUCCESS) return 0;
        /* read while this thread is counted: a reopen waits for the count to reach zero */
        uint32_t serial = s->env_serial;
        gate_leave(s);
        if (rc == MDB_MAP_RESIZED && attempt < 3) { /* another process grew the map */
            DL_TRY(dl_store_map_grow(s, 0));
            continue;
        }
        if (rc == MDB_PANIC && !s->read_only && attempt < 3) {
            DL_TRY(env_reopen(s, serial, write));
            continue;
        }
        return dl_store_mdb_fail(rc, write ? "mdb_txn_begin(write)" : "mdb_txn_begin(read)", __FILE__, __LINE__);
    }
}
void dl_store_txn_abort(dl_store *s, MDB_txn *t)
{
    mdb_txn_abort(t);
    gate_leave(s);
}
int dl_store_txn_commit(dl_store *s, MDB_txn *t)
{
    int rc = mdb_txn_commit(t);
    gate_leave(s);
    if (rc && (rc == EIO || rc == ENOSPC || rc == EDQUOT)) {
        /* LMDB reports a short pwrite on a full disk as EIO: say how full */
        struct statvfs fs;
        if (statvfs(s->dir, &fs) == 0) {
            int r = dl_store_mdb_fail(rc, "mdb_txn_commit", __FILE__, __LINE__);
            char msg[600];
            snprintf(msg, sizeof msg, "%s", dl_errmsg());
            return dl_err(r, "%s (the store's filesystem has %llu bytes free%s)", msg,
                          (unsigned long long)fs.f_bavail * fs.f_frsize,
                          (unsigned long long)fs.f_bavail * fs.f_frsize < (1u << 20) ? ": full?" : "");
        }
    }
    if (rc) return dl_store_mdb_fail(rc, "mdb_txn_commit", __FILE__, __LINE__);
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
    if (want > size && dl_store_map_grow(s, want) < 0)
        DL_DEBUG("store %s: pre-growing the map: %s", s->dir, dl_errmsg());
}

/* Run fn in one write transaction; on MDB_MAP_FULL (from a put or from the
 * commit) abort, double the map and run it again. fn must be repeatable. */
int dl_store_write(dl_store *s, uint64_t need, dl_store_write_fn fn, void *ctx)
{
    if (s->read_only) return dl_err(DL_EINVAL, "store %s is open read-only", s->dir);
    if (need) map_pregrow(s, need);
    for (int attempt = 0;; attempt++) {
        MDB_txn *t;
        DL_TRY(dl_store_txn_begin(s, 1, &t));
        tl_mdb_rc = 0;
        int rc = fn(s, t, ctx);
        if (rc == 0)
            rc = dl_store_txn_commit(s, t);
        else
            dl_store_txn_abort(s, t);
        if (rc == 0) return 0;
        if (tl_mdb_rc != MDB_MAP_FULL || attempt >= 40) return rc;
        atomic_fetch_add(&s->map_full_retries, 1);
        uint64_t size;
        map_info(s, &size);
        DL_TRY(dl_store_map_grow(s, size * 2));
    }
}

// ----------------------------------------------------------------------------
// open / close

dl_store_opts dl_store_opts_default(void)
{
    return (dl_store_opts){.map_size = 0, .durability = DL_STORE_SYNC, .read_only = 0, .grow_wait_ms = 0};
}

/* Params + momentum of a run with every fragment's momentum stored: every
 * block of both arrays (the most its arrays take: a run with outer momentum
 * 0 stores params only). */
uint64_t dl_store_state_bytes(uint32_t P, const uint64_t *numel)
{
    uint64_t n = 0;
    for (uint32_t p = 0; p < P; p++) n += 2 * (uint64_t)blocks_of(numel[p]) * block_size(numel[p]);
    return n;
}

/* The map a run starts with when opts.map_size is 0: MAP_FACTOR times its
 * stored arrays (the live state, the copy a commit writes before the old
 * one is freed, the pages a recent snapshot still sees), a power of two. */
uint64_t dl_store_run_map_size(uint32_t P, const uint64_t *numel)
{
    uint64_t want = MAP_FACTOR * dl_store_state_bytes(P, numel) + (64ull << 20), size = MAP_DEFAULT;
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
    if (rc) return dl_store_mdb_fail(rc, "mdb_get(meta, run)", __FILE__, __LINE__);
    const uint8_t *b = v.mv_data;
    if (v.mv_size < RUN_HDR || get32(b) != MAGIC_RUN || get32(b + 4) != RUN_FMT)
        return dl_err(DL_ECORRUPT, "meta[run]: bad size/magic/format (%zu bytes)", v.mv_size);
    uint32_t P = get32(b + 24), idlen = get32(b + 28);
    if (P == 0 || P > MAX_FRAGMENTS || v.mv_size != RUN_HDR + 8 * (size_t)P || idlen == 0 ||
        idlen > DL_STORE_ID_MAX)
        return dl_err(DL_ECORRUPT, "meta[run]: P=%u, id length %u, %zu bytes do not fit", P, idlen, v.mv_size);
    dl_model_config m = {.n_layer = (int)get32(b + 96), .n_head = (int)get32(b + 100), .n_embd = (int)get32(b + 104),
                         .seq_len = (int)get32(b + 108), .vocab = (int)get32(b + 112)};
    int manifest_run = !m.n_layer && !m.n_head && !m.n_embd && !m.seq_len && !m.vocab;
    if (!manifest_run && dl_model_config_check(&m)) return dl_err(DL_ECORRUPT, "meta[run]: bad model: %s", dl_errmsg());
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
        return dl_store_mdb_fail(rc, "mdb_get(meta, config)", __FILE__, __LINE__);
    }
    /* meta[manifest]: a manifest run's model; a store without it (every
     * store from before manifests) holds a GPT-2 run */
    k = key_str("manifest");
    rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_SUCCESS) {
        b = v.mv_data;
        if (v.mv_size < CONFIG_HDR || get32(b) != MAGIC_MANIFEST || get32(b + 4) != FMT_VERSION ||
            get64(b + 8) != v.mv_size - CONFIG_HDR)
            return dl_err(DL_ECORRUPT, "meta[manifest]: bad size/magic/format (%zu bytes)", v.mv_size);
        if (!manifest_run) return dl_err(DL_ECORRUPT, "meta[manifest] beside a GPT-2 model in meta[run]");
        if (dl_manifest_from_json((const char *)b + CONFIG_HDR, v.mv_size - CONFIG_HDR, &s->manifest))
            return dl_err(DL_ECORRUPT, "meta[manifest]: %s", dl_errmsg());
    } else if (rc != MDB_NOTFOUND) {
        return dl_store_mdb_fail(rc, "mdb_get(meta, manifest)", __FILE__, __LINE__);
    } else if (manifest_run) {
        return dl_err(DL_ECORRUPT, "meta[run]: no GPT-2 model and no meta[manifest]");
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
        return dl_store_mdb_fail(rc, "mdb_dbi_open(meta)", __FILE__, __LINE__);
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
        if (rc) return dl_store_mdb_fail(rc, "mdb_dbi_open", __FILE__, __LINE__);
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
                     ? dl_err(DL_EBUSY, "store %s is already open for writing by another process or handle (another "
                                        "dloco-sync on this store?): stop it, or give this one another --store", dir)
                     : dl_err(DL_EIO, "flock %s: %s", path, strerror(errno));
            goto fail;
        }
    }

    if ((rc = alloc_lock_file(dir))) goto fail;

    int lrc = mdb_env_create(&s->env);
    if (lrc) {
        s->env = NULL;
        rc = dl_store_mdb_fail(lrc, "mdb_env_create", __FILE__, __LINE__);
        goto fail;
    }
    if ((lrc = mdb_env_set_maxdbs(s->env, 8)) || (lrc = mdb_env_set_maxreaders(s->env, 256)) ||
        (lrc = mdb_env_set_mapsize(s->env, (size_t)o.map_size))) {
        rc = dl_store_mdb_fail(lrc, "mdb_env_set_*", __FILE__, __LINE__);
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
        rc = dl_store_mdb_fail(lrc, "mdb_env_open", __FILE__, __LINE__);
        goto fail;
    }
    MDB_stat est;
    if ((lrc = mdb_env_stat(s->env, &est))) {
        rc = dl_store_mdb_fail(lrc, "mdb_env_stat", __FILE__, __LINE__);
        goto fail;
    }
    s->psize = est.ms_psize;

    if ((lrc = mdb_reader_check(s->env, &s->stale_cleared))) {
        rc = dl_store_mdb_fail(lrc, "mdb_reader_check", __FILE__, __LINE__);
        goto fail;
    }
    DL_INFO("store %s: mdb_reader_check cleared %d stale reader slot(s) of dead processes", dir,
            s->stale_cleared);

    MDB_txn *t;
    if ((rc = dl_store_txn_begin(s, !o.read_only, &t)) < 0) goto fail;
    if ((rc = open_dbs(s, t)) < 0) {
        dl_store_txn_abort(s, t);
        goto fail;
    }
    /* committing (also a read txn) keeps the dbi handles for the env's life */
    if ((rc = dl_store_txn_commit(s, t)) < 0) goto fail;
    s->opened = 1;
    if (!o.read_only && auto_map && s->have_run &&
        (rc = dl_store_map_grow(s, dl_store_run_map_size(s->n_frag, s->numel))) < 0)
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
    dl_manifest_close(&s->manifest);
    free(s->dir);
    free(s);
    *sp = NULL;
}

int dl_store_sync(dl_store *s)
{
    assert(s);
    if (s->read_only) return 0;
    gate_enter(s); /* counted like a transaction: a reopen must not close the environment under it */
    int rc = s->env ? mdb_env_sync(s->env, 1) : MDB_PANIC;
    gate_leave(s);
    if (rc) return dl_store_mdb_fail(rc, "mdb_env_sync", __FILE__, __LINE__);
    return 0;
}

