/* LMDB state store, the value encodings: ids, fragment headers and blocks,
 * epoch, ledger, learner and merge records (decoders validate every field). */
#include "storage/store_int.h"

#include "core/err.h"
#include "core/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ids: 1..DL_STORE_ID_MAX printable ASCII characters without spaces. */
int dl_store_check_id(const char *what, const char *id)
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
// decoders: validate magic, version and size; errors name the key

static int frag_decode(const dl_store *s, uint32_t p, const MDB_val *v, frag_hdr *h)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size != FRAG_HDR)
        return dl_err(DL_ECORRUPT, "fragments[%u]: value of %zu bytes, a header is %d", p, v->mv_size, FRAG_HDR);
    if (get32(b) != MAGIC_FRAG || (get32(b + 4) != FRAG_FMT && get32(b + 4) != FRAG_FMT_NO_MOM))
        return dl_err(DL_ECORRUPT, "fragments[%u]: bad magic/format 0x%08x/%u", p, get32(b), get32(b + 4));
    h->has_mom = get32(b + 4) == FRAG_FMT;
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

const char *dl_store_arr_db(int mom) { return mom ? "outer" : "params"; }

int dl_store_blk_decode(int mom, uint32_t p, uint32_t blk, const frag_hdr *h, const MDB_val *v, blk_view *out)
{
    const uint8_t *b = v->mv_data;
    const char *db = dl_store_arr_db(mom);
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

int dl_store_frag_get(dl_store *s, MDB_txn *t, uint32_t p, frag_hdr *h)
{
    uint8_t kb[4];
    MDB_val k = key_frag(kb, p), v;
    MDB_GET(t, s->dbi_frag, &k, &v, DL_ECORRUPT, "store %s: fragments[%u] missing", s->dir, p);
    return frag_decode(s, p, &v, h);
}

int dl_store_blk_get(dl_store *s, MDB_txn *t, int mom, uint32_t p, const frag_hdr *h, uint32_t blk, blk_view *out)
{
    uint8_t kb[8];
    MDB_val k = key_blk(kb, p, blk), v;
    MDB_GET(t, mom ? s->dbi_outer : s->dbi_params, &k, &v, DL_ECORRUPT,
            "store %s: %s[%u,%u] missing (fragment %u has %u blocks)", s->dir, dl_store_arr_db(mom), p, blk, p,
            h->blocks);
    return dl_store_blk_decode(mom, p, blk, h, &v, out);
}

int dl_store_epoch_decode(const MDB_val *v, uint64_t *epoch)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size != EPOCH_LEN || get32(b) != MAGIC_EPOCH || get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "meta[epoch]: bad size/magic/format (%zu bytes)", v->mv_size);
    *epoch = get64(b + 8);
    return 0;
}

int dl_store_ledger_decode(const MDB_val *v, dl_store_ledger *l)
{
    const uint8_t *b = v->mv_data;
    if (v->mv_size != LEDGER_LEN || get32(b) != MAGIC_LEDGER || get32(b + 4) != FMT_VERSION)
        return dl_err(DL_ECORRUPT, "ledger[totals]: bad size/magic/format (%zu bytes)", v->mv_size);
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) l->tokens[i] = get64(b + 8 + 8 * i);
    return 0;
}

void dl_store_learner_encode(uint8_t b[LEARNER_LEN], const dl_store_learner *r)
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

int dl_store_learner_decode(const MDB_val *k, const MDB_val *v, dl_store_learner *r)
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

size_t dl_store_mrec_size(uint32_t n) { return MREC_HDR + (size_t)n * MREC_ENTRY; }

int dl_store_mrec_validate(const dl_merge_record *r)
{
    if (r->n_contrib > MREC_MAX_CONTRIB)
        return dl_err(DL_EINVAL, "merge record has %u contributors (max %u)", r->n_contrib, MREC_MAX_CONTRIB);
    if (r->n_contrib && !r->contrib) return dl_err(DL_EINVAL, "merge record has contributors but no array");
    if (strnlen(r->staleness_fn, sizeof r->staleness_fn) > DL_STORE_FN_MAX)
        return dl_err(DL_EINVAL, "staleness function name is not NUL-terminated");
    for (uint32_t i = 0; i < r->n_contrib; i++) {
        const dl_merge_contrib *c = &r->contrib[i];
        DL_TRY(dl_store_check_id("contributor learner id", c->learner_id));
        if (c->decision < DL_MERGE_MERGED || c->decision > DL_MERGE_REJECTED)
            return dl_err(DL_EINVAL, "contributor %u (%s): bad decision code %d", i, c->learner_id, c->decision);
    }
    return 0;
}

void dl_store_mrec_encode(uint8_t *b, uint32_t p, uint64_t version, const dl_merge_record *r)
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
int dl_store_mrec_decode(const MDB_val *v, uint32_t p, uint64_t version, dl_merge_record *out,
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
    if (n > MREC_MAX_CONTRIB || v->mv_size != dl_store_mrec_size(n))
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
// fragment arrays as blocks

/* XXH64 of each block of x (numel floats; NULL = zeros) into sums[blocks_of(numel)]. */
void dl_store_hash_blocks(const float *x, uint64_t numel, uint64_t *sums)
{
    float *zeros = x ? NULL : dl_xcalloc(numel < BF ? numel : BF, sizeof *zeros);
    for (uint32_t b = 0; b < blocks_of(numel); b++)
        sums[b] = dl_checksum64(x ? x + (size_t)b * BF : zeros, (size_t)block_len(numel, b) * 4);
    free(zeros);
}

int dl_store_put_frag_hdr(dl_store *s, MDB_txn *t, uint32_t p, uint64_t version, uint64_t numel, int64_t wall,
                          int has_mom)
{
    uint8_t kb[4], b[FRAG_HDR] = {0};
    put32(b, MAGIC_FRAG);
    put32(b + 4, has_mom ? FRAG_FMT : FRAG_FMT_NO_MOM);
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

int dl_store_del_mom_blocks(dl_store *s, MDB_txn *t, uint32_t p, const frag_hdr *h)
{
    for (uint32_t blk = 0; blk < h->blocks; blk++) {
        uint8_t kb[8];
        MDB_val k = key_blk(kb, p, blk);
        int rc = mdb_del(t, s->dbi_outer, &k, NULL);
        if (rc == MDB_NOTFOUND)
            return dl_err(DL_ECORRUPT, "store %s: outer[%u,%u] missing (fragment %u has %u blocks)", s->dir, p, blk, p,
                          h->blocks);
        if (rc) return dl_store_mdb_fail(rc, "mdb_del(outer)", __FILE__, __LINE__);
    }
    return 0;
}

/* Write every block of fragment p's params (mom 0) or momentum (mom 1) at
 * `version` from x (numel floats; NULL = zeros), with their checksums. */
int dl_store_put_blocks(dl_store *s, MDB_txn *t, int mom, uint32_t p, uint64_t version, uint64_t numel,
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

