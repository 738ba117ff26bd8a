/* LMDB state store, the read API: the run's facts, epoch and evaluation,
 * fragment reads, snapshots served zero-copy, merge and learner records,
 * the ledger totals and the store's statistics. */
#include "storage/store_int.h"

#include "core/err.h"
#include "core/hash.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// run facts, epoch, evaluation

int dl_store_get_run(const dl_store *s, dl_store_run *out)
{
    assert(s && out);
    if (!s->have_run) return dl_err(DL_ENOTFOUND, "store %s has no run", s->dir);
    *out = (dl_store_run){s->run_id, s->fingerprint, s->config_text, s->n_frag, s->numel, s->model, s->seed,
                          s->manifest};
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

int dl_store_get_epoch(dl_store *s, uint64_t *epoch_out)
{
    assert(s && epoch_out);
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    MDB_val k = key_str("epoch"), v;
    int rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = dl_store_epoch_decode(&v, epoch_out);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ECORRUPT, "store %s: meta has no epoch", s->dir)
                                : dl_store_mdb_fail(rc, "mdb_get(meta, epoch)", __FILE__, __LINE__);
    dl_store_txn_abort(s, t);
    return rc;
}

int dl_store_get_eval(dl_store *s, dl_store_eval *out)
{
    assert(s && out);
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
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
                                : dl_store_mdb_fail(rc, "mdb_get(meta, eval)", __FILE__, __LINE__);
    }
    dl_store_txn_abort(s, t);
    return rc;
}

int dl_store_get_evaldata(dl_store *s, dl_store_evaldata *out)
{
    assert(s && out);
    memset(out, 0, sizeof *out);
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    MDB_val k = key_str("evaldata"), v;
    int rc = mdb_get(t, s->dbi_meta, &k, &v);
    if (rc == MDB_SUCCESS) {
        const uint8_t *b = v.mv_data;
        uint32_t pl = v.mv_size >= EVALDATA_HDR ? get32(b + 32) : 0;
        if (v.mv_size < EVALDATA_HDR || get32(b) != MAGIC_EVALDATA || get32(b + 4) != FMT_VERSION || !pl ||
            pl >= sizeof out->path || v.mv_size != EVALDATA_HDR + pl || !memchr(b + 16, 0, 16) ||
            memchr(b + EVALDATA_HDR, 0, pl)) {
            rc = dl_err(DL_ECORRUPT, "store %s: meta evaldata: bad size/magic/format (%zu bytes)", s->dir, v.mv_size);
        } else {
            out->val_frac = getf64(b + 8);
            memcpy(out->format, b + 16, 16);
            memcpy(out->path, b + EVALDATA_HDR, pl);
            rc = 0;
        }
    } else {
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ENOTFOUND, "store %s: no evaluation data recorded", s->dir)
                                : dl_store_mdb_fail(rc, "mdb_get(meta, evaldata)", __FILE__, __LINE__);
    }
    dl_store_txn_abort(s, t);
    return rc;
}

// ----------------------------------------------------------------------------
// fragment reads

int dl_store_check_p(const dl_store *s, uint32_t p)
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
        DL_TRY(dl_store_blk_get(s, t, mom, p, h, b, &bv));
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
                          (unsigned long long)sums[b], dl_store_arr_db(mom), p, b);
    }
    return 0;
}

int dl_store_read_fragment(dl_store *s, uint32_t p, uint64_t *version, float *params, float *momentum)
{
    assert(s && version);
    DL_TRY(dl_store_check_p(s, p));
    uint32_t nb = blocks_of(s->numel[p]);
    uint64_t *sums = dl_xmalloc(2 * (size_t)nb * sizeof *sums);
    MDB_txn *t;
    frag_hdr h = {0};
    int rc = dl_store_txn_begin(s, 0, &t);
    if (rc == 0) {
        rc = dl_store_frag_get(s, t, p, &h);
        if (rc == 0 && params) rc = read_array(s, t, 0, p, &h, params, sums);
        if (rc == 0 && momentum && h.has_mom) rc = read_array(s, t, 1, p, &h, momentum, sums + nb);
        dl_store_txn_abort(s, t);
    }
    /* verify the copies outside the transaction */
    if (rc == 0 && params) rc = verify_array(0, p, &h, params, sums);
    if (rc == 0 && momentum && h.has_mom) rc = verify_array(1, p, &h, momentum, sums + nb);
    if (rc == 0 && momentum && !h.has_mom) memset(momentum, 0, (size_t)h.numel * sizeof *momentum);
    free(sums);
    if (rc == 0) *version = h.version;
    return rc;
}

int dl_store_snapshot_begin(dl_store *s, dl_store_snap **out)
{
    assert(s && out);
    dl_store_snap *snap = dl_xcalloc(1, sizeof *snap);
    snap->s = s;
    int rc = dl_store_txn_begin(s, 0, &snap->txn);
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
    DL_TRY(dl_store_blk_get(s, snap->txn, 0, p, h, b, &bv));
    uint64_t in = offset - (uint64_t)b * BF;
    const uint8_t *ptr = bv.data + in * 4;
    if (in + n <= bv.n && (uintptr_t)ptr % _Alignof(float) == 0) {
        *out = (const float *)ptr;
        return 0;
    }
    float *x = snap_copy_new(snap, p, whole, n);
    for (uint64_t done = 0; done < n; b++, in = 0) {
        if (done) DL_TRY(dl_store_blk_get(s, snap->txn, 0, p, h, b, &bv));
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
    DL_TRY(dl_store_check_p(snap->s, p));
    frag_hdr h = {0};
    DL_TRY(dl_store_frag_get(snap->s, snap->txn, p, &h));
    *version = h.version;
    *numel = (size_t)h.numel;
    return 0;
}

int dl_store_snapshot_range(dl_store_snap *snap, uint32_t p, uint64_t offset, size_t max_n, uint64_t *version,
                            const float **params, size_t *n)
{
    assert(snap && version && params && n && max_n > 0);
    DL_TRY(dl_store_check_p(snap->s, p));
    frag_hdr h = {0};
    DL_TRY(dl_store_frag_get(snap->s, snap->txn, p, &h));
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
    DL_TRY(dl_store_check_p(snap->s, p));
    frag_hdr h = {0};
    DL_TRY(dl_store_frag_get(snap->s, snap->txn, p, &h));
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
    dl_store_txn_abort(snap->s, snap->txn);
    atomic_fetch_sub(&snap->s->snaps_open, 1);
    for (size_t i = 0; i < snap->ncopies; i++) free(snap->copies[i].data);
    free(snap->copies);
    free(snap);
    *sp = NULL;
}

// ----------------------------------------------------------------------------
// merge and learner records, ledger, stats

int dl_store_get_merge(dl_store *s, uint32_t p, uint64_t version, dl_merge_record *out)
{
    assert(s && out);
    memset(out, 0, sizeof *out);
    DL_TRY(dl_store_check_p(s, p));
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    uint8_t kb[12];
    MDB_val k = key_merge(kb, p, version), v;
    dl_merge_contrib *buf = NULL;
    uint32_t cap = 0;
    int rc = mdb_get(t, s->dbi_merges, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = dl_store_mrec_decode(&v, p, version, out, &buf, &cap);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ENOTFOUND, "no merge record for fragment %u version %llu", p,
                                         (unsigned long long)version)
                                : dl_store_mdb_fail(rc, "mdb_get(merges)", __FILE__, __LINE__);
    dl_store_txn_abort(s, t);
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

int dl_store_foreach_merge_in(dl_store *s, MDB_txn *t, uint32_t p, uint64_t from, dl_merge_cb cb, void *ctx)
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
            rc = dl_store_mdb_fail(lrc, "mdb_cursor_get(merges)", __FILE__, __LINE__);
            break;
        }
        if (k.mv_size != 12) {
            rc = dl_err(DL_ECORRUPT, "merges: key of %zu bytes", k.mv_size);
            break;
        }
        if (key_frag_p(&k) != p) break;
        dl_merge_record rec;
        if ((rc = dl_store_mrec_decode(&v, p, key_merge_version(&k), &rec, &buf, &cap)) < 0) break;
        if ((rc = cb(&rec, ctx)) != 0) break;
    }
    free(buf);
    mdb_cursor_close(cur);
    return rc;
}

int dl_store_foreach_merge(dl_store *s, uint32_t p, uint64_t from_version, dl_merge_cb cb, void *ctx)
{
    assert(s && cb);
    DL_TRY(dl_store_check_p(s, p));
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    int rc = dl_store_foreach_merge_in(s, t, p, from_version, cb, ctx);
    dl_store_txn_abort(s, t);
    return rc;
}

int dl_store_learner_get(dl_store *s, const char *id, dl_store_learner *out)
{
    assert(s && out);
    DL_TRY(dl_store_check_id("learner id", id));
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    MDB_val k = key_str(id), v;
    int rc = mdb_get(t, s->dbi_learners, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = dl_store_learner_decode(&k, &v, out);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ENOTFOUND, "learner '%s' is not in the registry", id)
                                : dl_store_mdb_fail(rc, "mdb_get(learners)", __FILE__, __LINE__);
    dl_store_txn_abort(s, t);
    return rc;
}

int dl_store_foreach_learner_in(dl_store *s, MDB_txn *t, dl_learner_cb cb, void *ctx)
{
    MDB_cursor *cur;
    MDB_CALL(mdb_cursor_open(t, s->dbi_learners, &cur));
    MDB_val k, v;
    int rc = 0;
    for (int lrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);; lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (lrc == MDB_NOTFOUND) break;
        if (lrc) {
            rc = dl_store_mdb_fail(lrc, "mdb_cursor_get(learners)", __FILE__, __LINE__);
            break;
        }
        dl_store_learner r;
        if ((rc = dl_store_learner_decode(&k, &v, &r)) < 0 || (cb && (rc = cb(&r, ctx)) != 0)) break;
    }
    mdb_cursor_close(cur);
    return rc;
}

int dl_store_foreach_learner(dl_store *s, dl_learner_cb cb, void *ctx)
{
    assert(s && cb);
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    int rc = dl_store_foreach_learner_in(s, t, cb, ctx);
    dl_store_txn_abort(s, t);
    return rc;
}

int dl_store_ledger_get(dl_store *s, dl_store_ledger *out)
{
    assert(s && out);
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
    MDB_val k = key_str("totals"), v;
    int rc = mdb_get(t, s->dbi_ledger, &k, &v);
    if (rc == MDB_SUCCESS)
        rc = dl_store_ledger_decode(&v, out);
    else
        rc = rc == MDB_NOTFOUND ? dl_err(DL_ECORRUPT, "store %s: ledger totals missing", s->dir)
                                : dl_store_mdb_fail(rc, "mdb_get(ledger)", __FILE__, __LINE__);
    dl_store_txn_abort(s, t);
    return rc;
}

int dl_store_get_stats(dl_store *s, dl_store_stats *out)
{
    assert(s && out);
    memset(out, 0, sizeof *out);
    MDB_txn *t;
    DL_TRY(dl_store_txn_begin(s, 0, &t));
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
    /* the arrays as stored: params, and momentum where the fragment keeps one */
    uint64_t state = 0;
    int hrc = 0;
    for (uint32_t p = 0; rc == 0 && hrc == 0 && s->have_run && p < s->n_frag; p++) {
        frag_hdr h = {0};
        if ((hrc = dl_store_frag_get(s, t, p, &h)) == 0)
            state += (h.has_mom ? 2 : 1) * (uint64_t)h.blocks * block_size(h.numel);
    }
    dl_store_txn_abort(s, t);
    if (rc) return dl_store_mdb_fail(rc, "dl_store_get_stats", __FILE__, __LINE__);
    if (hrc) return hrc;
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
        .state_bytes = state,
        .page_size = s->psize,
        .readers_used = info.me_numreaders,
        .readers_max = info.me_maxreaders,
        .stale_readers_cleared = s->stale_cleared,
        .map_grows = atomic_load(&s->map_grows),
        .map_full_retries = atomic_load(&s->map_full_retries),
        .grow_timeouts = atomic_load(&s->grow_timeouts),
        .env_reopens = atomic_load(&s->env_reopens),
        .snapshots_open = (uint32_t)atomic_load(&s->snaps_open),
    };
    return 0;
}

