/* LMDB state store, the write API: a run's record and initial fragments,
 * the epoch, the evaluation record, merge commits, learner records and the
 * ledger. storage/store_int.h lists the store's other files. */
#include "storage/store_int.h"

#include "core/err.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/shard.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// run, epoch
static int check_run(const dl_store_run *r)
{
    DL_TRY(dl_store_check_id("run id", r->run_id));
    if (r->fingerprint == 0) return dl_err(DL_EINVAL, "run '%s': fingerprint must be nonzero", r->run_id);
    dl_model_config m = r->model;
    if (r->manifest) {
        if (m.n_layer || m.n_head || m.n_embd || m.seq_len || m.vocab)
            return dl_err(DL_EINVAL, "run '%s': a manifest run has no GPT-2 model fields", r->run_id);
        if (dl_manifest_check(r->manifest)) return dl_err(DL_EINVAL, "run '%s': %s", r->run_id, dl_errmsg());
    } else if (dl_model_config_check(&m)) {
        return dl_err(DL_EINVAL, "run '%s': model: %s", r->run_id, dl_errmsg());
    }
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
const char *dl_store_layout_str(uint32_t shard, uint32_t shards, char buf[48])
{
    if (shards <= 1) snprintf(buf, 48, "unsharded");
    else snprintf(buf, 48, "shard %u of %u", shard, shards);
    return buf;
}

struct init_ctx {
    const dl_store_run *run;
    const char *manifest_json; /* NULL: a GPT-2 run */
    dl_store_shard layout;
    const float *const *params;
    uint64_t **psum; /* [P][blocks of p] */
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
    if (c->manifest_json) {
        size_t n = strlen(c->manifest_json);
        k = key_str("manifest"), v = (MDB_val){CONFIG_HDR + n, NULL};
        MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, MDB_RESERVE));
        b = v.mv_data;
        put32(b, MAGIC_MANIFEST);
        put32(b + 4, FMT_VERSION);
        put64(b + 8, n);
        memcpy(b + CONFIG_HDR, c->manifest_json, n);
    }
    for (uint32_t p = 0; p < r->n_fragments; p++) {
        /* the momentum starts at zero: not stored (store_int.h, FRAG_FMT_NO_MOM) */
        DL_TRY(dl_store_put_frag_hdr(s, t, p, 0, r->numel[p], c->wall, 0));
        DL_TRY(dl_store_put_blocks(s, t, 0, p, 0, r->numel[p], c->params[p], c->psum[p]));
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
 * the first field that differs, with both values, and both shapes; for a
 * manifest run the first tensor that differs. */
static int same_model(const dl_store *s, const dl_store_run *r)
{
    char a[128], b[128];
    if (s->manifest && !r->manifest)
        return dl_err(DL_EMISMATCH,
                      "store %s holds run '%s' of a model described by a manifest (%d tensors); refusing a GPT-2 run "
                      "(%s): start with --manifest FILE (dloco manifest %s writes the store's)",
                      s->dir, s->run_id, dl_manifest_ntensors(s->manifest), shape_str(&r->model, r->n_fragments, a),
                      s->dir);
    if (!s->manifest && r->manifest)
        return dl_err(DL_EMISMATCH,
                      "store %s holds GPT-2 run '%s' (%s); refusing a run described by a manifest (%d tensors)",
                      s->dir, s->run_id, shape_str(&s->model, s->n_frag, a), dl_manifest_ntensors(r->manifest));
    if (s->manifest) {
        char msg[512];
        int nd = dl_manifest_diff(s->manifest, r->manifest, "the manifest given", msg, sizeof msg);
        if (nd)
            return dl_err(DL_EMISMATCH,
                          "store %s holds run '%s' of another model (%d tensor%s; 'here' is the store's): %s", s->dir,
                          s->run_id, nd, nd == 1 ? " differs" : "s differ", msg);
        return 0; /* a manifest run has no seed: its init is a file */
    }
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
                          dl_store_layout_str(s->shard, s->shards, a), s->run_id,
                          dl_store_layout_str(lay.shard, lay.shards, b));
        }
        DL_INFO("store %s: resuming run '%s'", s->dir, s->run_id);
        return 0;
    }
    if (!init_params) return dl_err(DL_EINVAL, "store %s is empty: init_run needs initial params", s->dir);
    if (s->read_only) return dl_err(DL_EINVAL, "store %s is open read-only", s->dir);
    uint32_t P = run->n_fragments;
    if (s->auto_map) DL_TRY(dl_store_map_grow(s, dl_store_run_map_size(P, run->numel)));
    uint64_t **sums = dl_xcalloc((size_t)P, sizeof *sums);
    for (uint32_t p = 0; p < P; p++) {
        assert(init_params[p]);
        sums[p] = dl_xmalloc(blocks_of(run->numel[p]) * sizeof **sums);
        dl_store_hash_blocks(init_params[p], run->numel[p], sums[p]);
    }
    char *mj = NULL;
    dl_manifest *mcopy = NULL;
    int rc = 0;
    if (run->manifest) {
        /* the store keeps its own copy, read back from what it wrote */
        rc = dl_manifest_to_json(run->manifest, &mj, NULL);
        if (!rc) rc = dl_manifest_from_json(mj, strlen(mj), &mcopy);
    }
    struct init_ctx c = {run, mj, lay, init_params, sums, dl_wallclock_ns()};
    if (!rc) rc = dl_store_write(s, dl_store_state_bytes(P, run->numel), init_fn, &c);
    free(mj);
    for (uint32_t p = 0; p < P; p++) free(sums[p]);
    free(sums);
    if (rc < 0) {
        dl_manifest_close(&mcopy);
        return rc;
    }
    s->manifest = mcopy;
    snprintf(s->run_id, sizeof s->run_id, "%s", run->run_id);
    s->fingerprint = run->fingerprint;
    s->numel = dl_xmalloc(P * sizeof *s->numel);
    memcpy(s->numel, run->numel, P * sizeof *s->numel);
    s->config_text = run->config_text ? strcpy(dl_xmalloc(strlen(run->config_text) + 1), run->config_text) : NULL;
    s->model = run->model;
    if (!s->manifest) dl_model_config_check(&s->model); /* fills padded_vocab; checked by check_run */
    s->seed = run->seed;
    s->shard = lay.shard;
    s->shards = lay.shards;
    s->n_frag = P;
    s->have_run = 1;
    DL_INFO("store %s: initialized run '%s' (fingerprint %016llx, %u fragments)", s->dir, s->run_id,
            (unsigned long long)s->fingerprint, P);
    return 0;
}

static int epoch_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    uint64_t *epoch = ctx;
    MDB_val k = key_str("epoch"), v;
    MDB_GET(t, s->dbi_meta, &k, &v, DL_ECORRUPT, "store %s: meta has no epoch", s->dir);
    DL_TRY(dl_store_epoch_decode(&v, epoch));
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
    DL_TRY(dl_store_write(s, 0, epoch_fn, &epoch));
    /* the epoch fences off older synchronizers: it must survive power loss */
    if (s->durability == DL_STORE_PERIODIC) DL_TRY(dl_store_sync(s));
    *epoch_out = epoch;
    return 0;
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
    return dl_store_write(s, 0, eval_put_fn, (void *)e);
}

static int evaldata_put_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    (void)s;
    const dl_store_evaldata *e = ctx;
    size_t pl = strlen(e->path);
    uint8_t b[EVALDATA_HDR + DL_STORE_EVALDATA_PATH_MAX] = {0};
    put32(b, MAGIC_EVALDATA);
    put32(b + 4, FMT_VERSION);
    putf64(b + 8, e->val_frac);
    memcpy(b + 16, e->format, strlen(e->format));
    put32(b + 32, (uint32_t)pl);
    memcpy(b + EVALDATA_HDR, e->path, pl);
    MDB_val k = key_str("evaldata"), v = {EVALDATA_HDR + pl, b};
    MDB_CALL(mdb_put(t, s->dbi_meta, &k, &v, 0));
    return 0;
}

int dl_store_put_evaldata(dl_store *s, const dl_store_evaldata *e)
{
    assert(s && e);
    size_t pl = strnlen(e->path, sizeof e->path), fl = strnlen(e->format, sizeof e->format);
    if (!pl || pl >= sizeof e->path || !fl || fl >= sizeof e->format)
        return dl_err(DL_EINVAL, "evaluation data: the path must be 1..%zu bytes and the format 1..%zu",
                      sizeof e->path - 1, sizeof e->format - 1);
    return dl_store_write(s, 0, evaldata_put_fn, (void *)e);
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
    DL_TRY(dl_store_ledger_decode(&v, &l));
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
    DL_TRY(dl_store_frag_get(s, t, c->p, &h));
    if (c->new_version != h.version + 1)
        return dl_err(DL_EMISMATCH, "fragment %u: refusing to commit version %llu, stored version is %llu", c->p,
                      (unsigned long long)c->new_version, (unsigned long long)h.version);
    MDB_val k = key_merge(kb, c->p, c->new_version), v = {c->rec_len, (void *)c->rec};
    int rc = mdb_put(t, s->dbi_merges, &k, &v, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST)
        return dl_err(DL_ECORRUPT, "merges[%u,%llu] already exists while fragment %u is at version %llu", c->p,
                      (unsigned long long)c->new_version, c->p, (unsigned long long)h.version);
    if (rc) return dl_store_mdb_fail(rc, "mdb_put(merges)", __FILE__, __LINE__);
    DL_TRY(dl_store_put_frag_hdr(s, t, c->p, c->new_version, c->numel, c->wall, c->momentum != NULL));
    DL_TRY(dl_store_put_blocks(s, t, 0, c->p, c->new_version, c->numel, c->params, c->psum));
    if (c->momentum)
        DL_TRY(dl_store_put_blocks(s, t, 1, c->p, c->new_version, c->numel, c->momentum, c->msum));
    else if (h.has_mom) /* outer momentum turned off: the blocks of its last value go */
        DL_TRY(dl_store_del_mom_blocks(s, t, c->p, &h));
    return ledger_rmw(s, t, &c->ledger);
}

int dl_store_commit_merge(dl_store *s, uint32_t p, uint64_t new_version, const float *params,
                          const float *momentum, const dl_merge_record *rec, const dl_store_ledger *ledger)
{
    return dl_store_commit_merge_sums(s, p, new_version, params, NULL, momentum, rec, ledger);
}

int dl_store_commit_merge_sums(dl_store *s, uint32_t p, uint64_t new_version, const float *params,
                               const uint64_t *param_sums, const float *momentum, const dl_merge_record *rec,
                               const dl_store_ledger *ledger)
{
    assert(s && params && rec);
    DL_TRY(dl_store_check_p(s, p));
    DL_TRY(dl_store_mrec_validate(rec));
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
    if (param_sums) memcpy(sums, param_sums, (size_t)nb * sizeof *sums);
    else dl_store_hash_blocks(params, c.numel, sums);
    if (momentum) dl_store_hash_blocks(momentum, c.numel, sums + nb);
    c.psum = sums, c.msum = sums + nb;
    c.rec_len = dl_store_mrec_size(rec->n_contrib);
    uint8_t *buf = dl_xmalloc(c.rec_len); /* dl_store_mrec_validate bounds n_contrib */
    dl_store_mrec_encode(buf, p, new_version, rec);
    c.rec = buf;
    if (ledger) c.ledger = *ledger;
    uint64_t need = (momentum ? 2 : 1) * (uint64_t)nb * block_size(c.numel) + FRAG_HDR + c.rec_len;
    int rc = dl_store_write(s, need, commit_fn, &c);
    free(buf);
    free(sums);
    return rc;
}

// ----------------------------------------------------------------------------
// learner records, ledger

static int learner_put_fn(dl_store *s, MDB_txn *t, void *ctx)
{
    const dl_store_learner *r = ctx;
    uint8_t b[LEARNER_LEN];
    dl_store_learner_encode(b, r);
    MDB_val k = key_str(r->id), v = {LEARNER_LEN, b};
    MDB_CALL(mdb_put(t, s->dbi_learners, &k, &v, 0));
    return 0;
}

int dl_store_learner_put(dl_store *s, const dl_store_learner *rec)
{
    assert(s && rec);
    DL_TRY(dl_store_check_id("learner id", rec->id));
    return dl_store_write(s, 0, learner_put_fn, (void *)rec);
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
    for (int i = 0; i < n; i++) DL_TRY(dl_store_check_id("learner id", recs[i].id));
    if (n == 0) return 0;
    learner_many m = {recs, n};
    return dl_store_write(s, 0, learner_put_many_fn, &m);
}

static int ledger_add_fn(dl_store *s, MDB_txn *t, void *vctx) { return ledger_rmw(s, t, vctx); }

int dl_store_ledger_add(dl_store *s, const dl_store_ledger *delta)
{
    assert(s && delta);
    assert(delta->tokens[DL_LEDGER_APPLIED] == 0 && "applied tokens move only with a merge commit");
    dl_store_ledger d = *delta;
    return dl_store_write(s, 0, ledger_add_fn, &d);
}

