/* LMDB state store, the offline checker behind `dloco check`: one read
 * transaction walks every database against the run, the records and the ledger. */
#include "storage/store_int.h"

#include "core/err.h"
#include "core/hash.h"
#include "core/shard.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        rc = dl_store_mdb_fail(rc, "mdb_cursor_get", __FILE__, __LINE__);
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

/* A block key (8 bytes) that check_blocks did not expect. */
static int stray(const dl_store *s, int mom, const frag_hdr *h, const MDB_val *k)
{
    const char *db = dl_store_arr_db(mom);
    uint32_t kp = key_frag_p(k), blk = get_be32((const uint8_t *)k->mv_data + 4);
    if (kp >= s->n_frag)
        return dl_err(DL_ECORRUPT, "%s: stray key for fragment %u block %u (P=%u)", db, kp, blk, s->n_frag);
    if (mom && !h[kp].has_mom)
        return dl_err(DL_ECORRUPT, "%s: stray key for fragment %u block %u (its header says no momentum is stored)",
                      db, kp, blk);
    return dl_err(DL_ECORRUPT, "%s: stray key for fragment %u block %u (fragment %u has %u blocks, P=%u)", db, kp, blk,
                  kp, h[kp].blocks, s->n_frag);
}

/* Walk the params (mom 0) or outer (mom 1) database in key order: exactly
 * the blocks (p, 0..blocks-1) of every p < P, each valid for its
 * fragment's header h[p] and matching its checksum; nothing else. */
static int check_blocks(dl_store *s, MDB_txn *t, int mom, const frag_hdr *h, struct check_sum *c)
{
    const char *db = dl_store_arr_db(mom);
    MDB_cursor *cur;
    MDB_CALL(mdb_cursor_open(t, mom ? s->dbi_outer : s->dbi_params, &cur));
    MDB_val k, v;
    int rc = 0, lrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    for (uint32_t p = 0; p < s->n_frag && !rc; p++)
        /* a fragment without stored momentum has no outer block: one there is stray */
        for (uint32_t b = 0; b < (mom && !h[p].has_mom ? 0 : h[p].blocks) && !rc;
             b++, lrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            uint8_t kb[8];
            key_blk(kb, p, b);
            int cmp = lrc == MDB_SUCCESS ? memcmp(k.mv_data, kb, k.mv_size < 8 ? k.mv_size : 8) : 1;
            if (lrc != MDB_SUCCESS && lrc != MDB_NOTFOUND) {
                rc = dl_store_mdb_fail(lrc, "mdb_cursor_get", __FILE__, __LINE__);
            } else if (lrc == MDB_SUCCESS && k.mv_size != 8) {
                rc = dl_err(DL_ECORRUPT, "%s: key of %zu bytes (expected 8)", db, k.mv_size);
            } else if (cmp < 0) {
                rc = stray(s, mom, h, &k);
            } else if (cmp > 0) {
                rc = dl_err(DL_ECORRUPT, "%s[%u,%u] missing (fragment %u has %u blocks)", db, p, b, p, h[p].blocks);
            } else {
                blk_view bv = {0};
                uint64_t sum;
                if ((rc = dl_store_blk_decode(mom, p, b, &h[p], &v, &bv)) == 0 &&
                    (sum = dl_checksum64(bv.data, (size_t)bv.n * 4)) != bv.sum)
                    rc = dl_err(DL_ECORRUPT,
                                "fragment %u version %llu: %s checksum %016llx, stored %016llx (%s[%u,%u])", p,
                                (unsigned long long)h[p].version, mom ? "momentum" : "params",
                                (unsigned long long)sum, (unsigned long long)bv.sum, db, p, b);
                c->blocks++;
            }
        }
    if (rc == 0 && lrc == MDB_SUCCESS)
        rc = k.mv_size == 8 ? stray(s, mom, h, &k)
                            : dl_err(DL_ECORRUPT, "%s: key of %zu bytes (expected 8)", db, k.mv_size);
    else if (rc == 0 && lrc != MDB_NOTFOUND)
        rc = dl_store_mdb_fail(lrc, "mdb_cursor_get", __FILE__, __LINE__);
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
    DL_TRY(dl_store_epoch_decode(&v, &c->epoch));
    k = key_str("totals");
    MDB_GET(t, s->dbi_ledger, &k, &v, DL_ECORRUPT, "ledger totals missing");
    DL_TRY(dl_store_ledger_decode(&v, &c->ledger));
    for (uint32_t p = 0; p < s->n_frag; p++) {
        DL_TRY(dl_store_frag_get(s, t, p, &h[p]));
        if (h[p].version && !dl_shard_owns((int)p, (int)s->shard, (int)s->shards))
            return dl_err(DL_ECORRUPT, "fragment %u is at version %llu in the store of shard %u of %u; it belongs to "
                          "shard %d", p, (unsigned long long)h[p].version, s->shard, s->shards,
                          dl_shard_of((int)p, (int)s->shards));
        c->p = p;
        c->expect = 1;
        DL_TRY(dl_store_foreach_merge_in(s, t, p, 0, check_record_cb, c));
        if (c->expect - 1 != h[p].version)
            return dl_err(DL_ECORRUPT, "fragment %u is at version %llu but has %llu merge records (1..%llu)", p,
                          (unsigned long long)h[p].version, (unsigned long long)(c->expect - 1),
                          (unsigned long long)(c->expect - 1));
    }
    DL_TRY(check_blocks(s, t, 0, h, c));
    DL_TRY(check_blocks(s, t, 1, h, c));
    DL_TRY(check_no_stray(s, t, s->dbi_frag, "fragments", 4));
    DL_TRY(check_no_stray(s, t, s->dbi_merges, "merges", 12));
    DL_TRY(dl_store_foreach_learner_in(s, t, count_learner_cb, c));
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
        rc = dl_store_txn_begin(s, 0, &t);
        if (rc == 0) {
            rc = check_in(s, t, h, &c);
            dl_store_txn_abort(s, t);
        }
        free(h);
    }
    if (report) {
        fprintf(report, "dloco store check: %s\n", dir);
        char lb[48];
        if (s && s->have_run && s->shards > 1)
            fprintf(report, "  %s (fragments p with p %% %u == %u)\n", dl_store_layout_str(s->shard, s->shards, lb),
                    s->shards, s->shard);
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

