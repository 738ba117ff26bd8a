/* LMDB state store of the synchronizer: run meta, fragment params, outer
 * momentum, learner registry, append-only merge records and the token ledger. */
#ifndef DL_STORAGE_STORE_H
#define DL_STORAGE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/model.h"

/* Layout of a store directory (an LMDB environment: data.mdb + lock.mdb, plus
 * dloco.lock, which a writer holds with flock so two synchronizers never
 * write the same store). Named databases, every value little-endian with a
 * 4-byte magic and a format version at its start, checked on every read
 * (bad magic, version or size -> DL_ECORRUPT naming the key):
 *
 *   meta      "schema" -> schema version; "run" -> run id, fingerprint, P,
 *             model shape (L, NH, C, T, V), init seed, shard layout, numel
 *             of each fragment; "config" -> run config text (an audit
 *             record: nothing reads the model from it); "epoch";
 *             "eval" -> 40 bytes {magic, version, fragment version sum
 *             u64, loss f64, sequences u32, pad u32, wallclock i64}: the
 *             synchronizer's last periodic evaluation (absent until one);
 *             "evaldata" -> {magic, version, val_frac f64, format 16 bytes
 *             NUL-padded, path length u32, path}: the data it evaluates on.
 *   fragments p (u32 big-endian) -> 48-byte header {version, numel, number
 *             of blocks, block size, commit wallclock}; its format number
 *             says whether the fragment's outer momentum is stored (2) or
 *             zero and absent (3: a new run, a commit without momentum).
 *   params    (p u32 BE, block u32 BE) -> 48-byte header {p, block, version,
 *             n, XXH64 of the block's floats} + n fp32: elements
 *             [block * DL_STORE_BLOCK_FLOATS, + n) of fragment p's params.
 *   outer     (p, block) -> the same for the outer momentum, of the
 *             fragments whose header says it is stored (none else).
 *   learners  id -> registry record (seen times, public key, counters):
 *             128 bytes {magic, version, first/last seen, key, pushes,
 *             merged, dropped, tokens_applied, bytes_in, bytes_out,
 *             rejected, step, tokens}; a 104-byte record (before rejected,
 *             step and tokens were kept) reads with those 0.
 *   merges    (p u32 BE, version u64 BE) -> merge record; append-only, so a
 *             fragment at version v has exactly the records 1..v.
 *   ledger    "totals" -> tokens per final state.
 *
 * Why blocks: LMDB stores a large value in one run of contiguous pages and
 * frees that run when the value is replaced; a freed run can only be reused
 * by a value that fits in it. With one value per fragment (schema 2, GPT-2's
 * fragments of 12 to 155 MB), freed runs were split by smaller values and
 * the next large commit no longer fitted anywhere but at the end of the
 * file: the file grew without bound while a third of it was free. Every
 * block of an array of more than one block takes the same number of pages
 * (a short last block is zero-padded), so a freed block always fits the
 * next one and the file settles at about the live state plus the largest
 * commit's new copy plus what the last commit freed (see dl_store_stats).
 *
 * Checksums are dl_checksum64(bytes, len) (XXH3_64bits; XXH64 before schema
 * 4) over each block's raw little-endian fp32 floats. The host must be little-endian (checked at compile time):
 * fp32 arrays are served zero-copy from the map.
 *
 * Threads: one dl_store may be used from several threads at once (LMDB
 * serializes writers; readers never wait on a writer). At most one dl_store
 * per directory per process (an LMDB rule): never open a directory a second
 * time, not even read-only, while this process has it open. Call
 * dl_store_init_run before other threads use the handle.
 *
 * Map growth: LMDB can resize its map only while the process has no
 * transaction or snapshot open (the remap moves every pointer into it). A
 * write that needs a bigger map (ahead of time, from the size of what it
 * writes, or after MDB_MAP_FULL) announces a grow and waits for the open
 * ones to end; transactions and snapshots begun meanwhile wait for the grow
 * (at most 20 ms each, and not at all once one of them had to give up), so
 * a stream of short snapshots cannot starve it and a long one cannot
 * deadlock it. The grow gives up after dl_store_opts.grow_wait_ms: the write
 * then fails with DL_EAGAIN having written nothing. Snapshots never wait on
 * a writer, only (briefly) on a grow, and grows are rare: the map starts at
 * 4 x the run's state (a power of two) and doubles.
 *
 * Every call is one short transaction; nothing holds a transaction across
 * network I/O. A failed call changes nothing (its transaction is aborted). */

/* 2: the run record holds the model shape and the init seed as typed fields.
 * 3: fragment arrays are stored as fixed-size blocks (params, outer).
 * 4: block checksums are XXH3_64bits (dl_checksum64), were XXH64.
 * A store of another schema version is refused at open (DL_EFORMAT), the
 * message naming both versions. */
#define DL_STORE_SCHEMA_VERSION 4u
/* fp32 elements per stored block (1 MiB). A snapshot range that starts at a
 * multiple of it and is at most this long is served zero-copy. */
#define DL_STORE_BLOCK_FLOATS 262144u
#define DL_STORE_ID_MAX 64     /* run ids and learner ids: 1..64 printable ASCII chars, no spaces */
#define DL_STORE_FN_MAX 31     /* staleness function name, chars */
#define DL_STORE_REASON_MAX 47 /* contributor reason text, chars (longer is truncated) */
#define DL_STORE_PUBKEY_BYTES 32

typedef struct dl_store dl_store;
typedef struct dl_store_snap dl_store_snap;

typedef enum {
    /* fsync on every commit: an acknowledged commit survives power loss. */
    DL_STORE_SYNC = 0,
    /* Commits are not fsynced (MDB_NOSYNC); the caller runs dl_store_sync()
     * from a timer every N ms. Loss window: a crash of the process loses
     * nothing (committed pages are in the OS page cache); an OS crash or
     * power loss loses at most the commits of the last N ms plus one sync's
     * duration. LMDB writes the meta page last, so on a filesystem that keeps
     * write order (ext4 data=ordered, xfs) the store reopens at an older
     * consistent state; run dl_store_check after an OS crash. Epoch bumps are
     * always fsynced. */
    DL_STORE_PERIODIC = 1
} dl_store_durability;

typedef struct {
    uint64_t map_size;     /* initial map size, bytes (rounded up to 64 KiB); 0 (default) -> 1 GiB, raised
                              once the run is known (open or init_run) to 4 x its stored params + momentum,
                              rounded up to a power of two. Address space only: the file grows as pages are
                              written. Doubles whenever a write needs more. */
    int durability;        /* DL_STORE_SYNC or DL_STORE_PERIODIC */
    int read_only;         /* open for reading only (offline checker, status) */
    uint32_t grow_wait_ms; /* how long a map growth waits for this process's open transactions and snapshots
                              to end before the write fails with DL_EAGAIN; 0 -> 10000 */
} dl_store_opts;

/* map_size 0 (sized from the run), DL_STORE_SYNC, read-write, grow_wait_ms 0. */
dl_store_opts dl_store_opts_default(void);

/* Open (read-write: create the directory and an empty store if missing) the
 * store in `dir`. opts NULL = defaults. Clears stale reader slots of dead
 * processes (mdb_reader_check) and logs how many.
 * Errors: DL_EINVAL `dir` is not a directory; DL_ENOTFOUND read-only and no
 * store there; DL_EFORMAT data.mdb is not an LMDB file, the environment is not
 * a dloco store, or its schema version is not DL_STORE_SCHEMA_VERSION;
 * DL_EBUSY  another process (or handle) has the store open for writing;
 * DL_ESTORE / DL_EIO other LMDB or file failures (the LMDB function and its reason; file:line in the debug log). */
int dl_store_open(const char *dir, const dl_store_opts *opts, dl_store **out);
/* Syncs (periodic mode), closes and NULLs *s; safe on NULL. All snapshots
 * must have ended. */
void dl_store_close(dl_store **s);

/* fsync committed data now (periodic mode's timer). It blocks for the fsync:
 * call it from the thread that commits merges, not from the event loop.
 * No-op when read-only. */
int dl_store_sync(dl_store *s);

/* ---- run metadata */

typedef struct {
    const char *run_id;      /* 1..DL_STORE_ID_MAX printable ASCII chars, no spaces */
    uint64_t fingerprint;    /* model/fragment-plan fingerprint, nonzero */
    const char *config_text; /* run config text to record (audit only); NULL = none */
    uint32_t n_fragments;    /* P >= 1 */
    const uint64_t *numel;   /* [P] fp32 elements per fragment, each >= 1 */
    /* The model the fragments are views of: L, NH, C, T and V are stored, and
     * must pass dl_model_config_check; padded_vocab is derived (filled on read). */
    dl_model_config model;
    uint64_t seed;           /* init seed of the version-0 params */
    /* A manifest run (core/manifest.h): the model the fragments are views
     * of, recorded under meta key "manifest" (a store without it, as every
     * store before manifests, holds a GPT-2 run); `model` is then all 0.
     * NULL: a GPT-2 run of `model`. Read back: the store's, valid until
     * dl_store_close. */
    const struct dl_manifest *manifest;
} dl_store_run;

/* The shard layout of a store (core/shard.h): the store of shard `shard` of
 * a sharded synchronizer of `shards`; shards 0 or 1 = unsharded (shard 0;
 * every store from before sharding). A shard's store holds every fragment,
 * but only its own ever leave version 0. Kept in the run record. */
typedef struct {
    uint32_t shard, shards;
} dl_store_shard;

struct dl_manifest;

/* Start or resume a run.
 * Empty store: writes meta and every fragment p at version 0 with params
 * init_params[p] (numel[p] floats) and zero momentum, in ONE transaction.
 * Store with a run: same run id, model (n_layer, n_head, n_embd, seq_len,
 * vocab), seed, fingerprint, P, numels and shard layout -> 0, state left as
 * is (resume; init_params may be NULL). Otherwise DL_EMISMATCH: a different
 * run id names both runs; a different model field or seed names that field
 * with both values; a different fingerprint, P or numel names both runs; a
 * different shard layout names both layouts. A manifest run resumes on the
 * same manifest only: DL_EMISMATCH naming the first differing tensor, or
 * saying which side is a GPT-2 run and which a manifest run. DL_EINVAL for a bad run
 * description (dl_model_config_check and dl_shard_check included) or
 * init_params NULL on an empty store. */
int dl_store_init_run(dl_store *s, const dl_store_run *run, const float *const *init_params);
/* dl_store_init_run for shard layout `layout` (NULL = unsharded): a new run
 * records it, a resumed one must have recorded the same (shards 0 and 1
 * both mean unsharded). dl_store_init_run is this with NULL. */
int dl_store_init_run_shard(dl_store *s, const dl_store_run *run, const dl_store_shard *layout,
                            const float *const *init_params);
/* The stored layout ({0, 0} when unsharded); DL_ENOTFOUND if no run. */
int dl_store_get_shard(const dl_store *s, dl_store_shard *out);

/* The stored run; the pointers stay valid until dl_store_close.
 * DL_ENOTFOUND if no run was initialized. */
int dl_store_get_run(const dl_store *s, dl_store_run *out);
uint32_t dl_store_n_fragments(const dl_store *s);           /* P, 0 if no run */
uint64_t dl_store_fragment_numel(const dl_store *s, uint32_t p); /* 0 if p >= P */

/* Increment the epoch (every synchronizer start does this once) and fsync,
 * whatever the durability mode. A new store starts at epoch 0. */
int dl_store_bump_epoch(dl_store *s, uint64_t *epoch_out);
int dl_store_get_epoch(dl_store *s, uint64_t *epoch_out);

/* The last periodic evaluation of the global model (dloco-sync
 * --eval_every_s), kept so an offline `dloco status STORE` shows it. */
typedef struct {
    uint64_t version;     /* sum of the fragment versions evaluated */
    double loss;          /* mean validation loss */
    uint32_t seqs;        /* sequences it averaged over */
    int64_t wallclock_ns; /* when it finished */
} dl_store_eval;
/* Replace the record (one small write transaction, no fsync of its own). */
int dl_store_put_eval(dl_store *s, const dl_store_eval *e);
/* DL_ENOTFOUND when no evaluation was recorded. */
int dl_store_get_eval(dl_store *s, dl_store_eval *out);

/* The data the run's global model is evaluated on (dloco-sync --eval_data),
 * recorded at every start so `dloco eval STORE` and `dloco status STORE`
 * use and name it. */
#define DL_STORE_EVALDATA_PATH_MAX 1024
typedef struct {
    char path[DL_STORE_EVALDATA_PATH_MAX]; /* a file or directory, as given */
    char format[16];                       /* "auto" | "text" | "shards" */
    double val_frac;                       /* the validation fraction */
} dl_store_evaldata;
/* Replace the record. DL_EINVAL for an empty or too long path or format. */
int dl_store_put_evaldata(dl_store *s, const dl_store_evaldata *e);
/* DL_ENOTFOUND when none was recorded (a store from before the record). */
int dl_store_get_evaldata(dl_store *s, dl_store_evaldata *out);

/* ---- fragments */

/* Copy out fragment p: its version, params (numel floats, may be NULL) and
 * outer momentum (numel floats, may be NULL; zeros when the fragment stores
 * none: a new run's, or one committed without momentum). Copied arrays are
 * verified against their stored checksums (DL_ECORRUPT on mismatch).
 * DL_ERANGE p >= P; DL_ENOTFOUND no run. */
int dl_store_read_fragment(dl_store *s, uint32_t p, uint64_t *version, float *params, float *momentum);

/* Zero-copy read snapshot (an LMDB read transaction) for serving joiners: it
 * never waits on a merge and sees the state of its begin, whatever commits
 * happen meanwhile. Pointers it hands out stay valid until dl_store_snapshot_end.
 * Keep a snapshot short-lived (one message's worth of sends): while it is
 * open, the pages the commits since its begin freed cannot be reused, and a
 * map growth waits for it to end (see "Map growth"). Begin may wait for a
 * pending growth, at most 20 ms. A snapshot may be ended on another thread
 * than it began on. */
int dl_store_snapshot_begin(dl_store *s, dl_store_snap **out);
/* Version and numel of fragment p as of the snapshot (its header only).
 * DL_ERANGE p >= P. */
int dl_store_snapshot_info(dl_store_snap *snap, uint32_t p, uint64_t *version, size_t *numel);
/* Params [offset, offset + *n) of fragment p as of the snapshot, *n =
 * min(max_n, numel - offset), max_n >= 1; not checksum-verified (the
 * checker does that). `*params` is 4-byte aligned. Zero-copy (a pointer into
 * the map) when the range lies inside one stored block: every range of a
 * fragment of at most DL_STORE_BLOCK_FLOATS elements, and every chunk of a
 * divisor of DL_STORE_BLOCK_FLOATS floats starting at a multiple of it.
 * Otherwise (a range across blocks, or a small value LMDB stored unaligned)
 * it is a copy of at most max_n floats, owned by the snapshot.
 * DL_ERANGE p >= P or offset >= numel. */
int dl_store_snapshot_range(dl_store_snap *snap, uint32_t p, uint64_t offset, size_t max_n, uint64_t *version,
                            const float **params, size_t *n);
/* All params of fragment p: dl_store_snapshot_range(0, numel). A fragment of
 * more than one block is COPIED (numel floats, once per fragment per
 * snapshot, freed at its end): serve large fragments range by range. */
int dl_store_snapshot_fragment(dl_store_snap *snap, uint32_t p, uint64_t *version, const float **params,
                               size_t *numel);
void dl_store_snapshot_end(dl_store_snap **snap);

/* ---- token ledger: every fragment-token a learner processed ends in one
 * state (synchronizer/ledger.h defines them and moves tokens between them;
 * the store only persists the totals). */

enum {
    DL_LEDGER_APPLIED = 0,       /* merged into a committed version (only by dl_store_commit_merge) */
    DL_LEDGER_DROPPED_STALE = 1, /* too stale, dropped; the learner rebased */
    DL_LEDGER_REJECTED = 2,      /* refused and not carried on */
    DL_LEDGER_LOST = 3,          /* learner died or left before the tokens were merged */
    DL_LEDGER_DISCARDED = 4,     /* thrown away by the learner (adopt overwrite/mix, rebase) */
    DL_LEDGER_OUTSTANDING = 5,   /* pooled, carried or unpushed when the synchronizer stopped */
    DL_LEDGER_NSTATES = 6
};
typedef struct {
    uint64_t tokens[DL_LEDGER_NSTATES];
} dl_store_ledger;

int dl_store_ledger_get(dl_store *s, dl_store_ledger *out);
/* Add `delta` to the totals in one transaction. delta->tokens[DL_LEDGER_APPLIED]
 * must be 0: applied tokens only move with a merge commit (API misuse). */
int dl_store_ledger_add(dl_store *s, const dl_store_ledger *delta);

/* ---- merges */

typedef enum {
    DL_MERGE_MERGED = 0,        /* contribution went into the merged delta */
    DL_MERGE_DROPPED_STALE = 1, /* too stale, dropped */
    DL_MERGE_REJECTED = 2       /* invalid (non-finite, wrong shape, ...) */
} dl_merge_decision;

typedef struct {
    char learner_id[DL_STORE_ID_MAX + 1];
    uint64_t base_version; /* fragment version the learner's delta was taken from */
    uint64_t staleness;    /* versions behind at merge time */
    uint64_t steps;        /* inner steps behind the delta */
    uint64_t tokens;       /* tokens behind the delta */
    double weight;         /* merge weight (token x staleness), sums to 1 over merged */
    int32_t decision;      /* dl_merge_decision */
    char reason[DL_STORE_REASON_MAX + 1]; /* short text, "" if none */
} dl_merge_contrib;

typedef struct {
    uint64_t version;      /* fragment version this merge produced */
    uint64_t epoch;        /* synchronizer epoch that merged */
    int64_t wallclock_ns;  /* commit time, ns since the Unix epoch */
    char staleness_fn[DL_STORE_FN_MAX + 1]; /* name of the staleness weighting */
    double delta_norm;     /* L2 norm of the merged (pre-outer-step) delta */
    uint32_t n_contrib;
    dl_merge_contrib *contrib; /* [n_contrib]; caller's on commit, malloc'd on read */
} dl_merge_record;

/* Commit merge `new_version` of fragment p: params, momentum (numel floats
 * each; momentum NULL: zero, stored as no momentum at all -- a run with
 * outer momentum 0 keeps none, and the fragment's momentum blocks, if it
 * had some, are deleted in the same transaction), the fragment version,
 * `rec` (stored as version new_version; rec->version is ignored) and the ledger changes `ledger` (the push
 * ledger's updates since the last commit plus this merge's applied tokens)
 * in ONE transaction; a crash at any instant leaves either the old or the
 * new version. ledger->tokens[DL_LEDGER_APPLIED] must equal the tokens of
 * rec's MERGED contributors (DL_EINVAL otherwise), so applied always equals
 * the merge records' sum; DROPPED_STALE and REJECTED contributors are
 * recorded for audit, their tokens travel in `ledger` (possibly in another
 * fragment's commit). ledger may be NULL only when rec has no MERGED
 * contributor's tokens to add.
 * DL_EMISMATCH (nothing written) unless new_version == stored version + 1;
 * DL_ERANGE p >= P; DL_EINVAL bad record (id/name too long, bad decision);
 * DL_EAGAIN the map had to grow and transactions or snapshots of this
 * process stayed open longer than grow_wait_ms: transient, nothing written,
 * the same commit may be retried. */
int dl_store_commit_merge(dl_store *s, uint32_t p, uint64_t new_version, const float *params,
                          const float *momentum, const dl_merge_record *rec, const dl_store_ledger *ledger);
/* dl_store_commit_merge with the params' block checksums given: param_sums[b]
 * = dl_checksum64 of elements [b x DL_STORE_BLOCK_FLOATS, + its length) of
 * params (dl_store_blocks(numel) of them; NULL: computed here), so a caller
 * that passes over params anyway hashes each block while it is in cache.
 * The store writes what it is given: a wrong sum makes the block corrupt. */
int dl_store_commit_merge_sums(dl_store *s, uint32_t p, uint64_t new_version, const float *params,
                               const uint64_t *param_sums, const float *momentum, const dl_merge_record *rec,
                               const dl_store_ledger *ledger);
/* Blocks of a fragment of numel elements (DL_STORE_BLOCK_FLOATS each, the last one shorter). */
static inline uint32_t dl_store_blocks(uint64_t numel)
{
    return (uint32_t)((numel + DL_STORE_BLOCK_FLOATS - 1) / DL_STORE_BLOCK_FLOATS);
}

/* Merge record (p, version), contrib malloc'd: free with dl_merge_record_free.
 * DL_ENOTFOUND if absent. */
int dl_store_get_merge(dl_store *s, uint32_t p, uint64_t version, dl_merge_record *out);
void dl_merge_record_free(dl_merge_record *rec);

/* Visit fragment p's merge records with version >= from_version in version
 * order. `cb` runs inside a read transaction: copy what you need, never block.
 * cb returns 0 to go on, nonzero to stop; the call then returns that value. */
typedef int (*dl_merge_cb)(const dl_merge_record *rec, void *ctx);
int dl_store_foreach_merge(dl_store *s, uint32_t p, uint64_t from_version, dl_merge_cb cb, void *ctx);

/* ---- learner registry */

typedef struct {
    char id[DL_STORE_ID_MAX + 1];
    int64_t first_seen_ns, last_seen_ns; /* wallclock ns */
    uint8_t pubkey[DL_STORE_PUBKEY_BYTES]; /* CURVE public key, zeros if none */
    uint64_t pushes, merged, dropped, tokens_applied, bytes_in, bytes_out; /* tokens_applied: fragment-tokens */
    uint64_t rejected;      /* pushes answered REJECTED (busy and failed merges included) */
    uint64_t step, tokens;  /* its latest Heartbeat: inner step, tokens processed since its start */
} dl_store_learner;

/* Insert or replace the record of rec->id. */
int dl_store_learner_put(dl_store *s, const dl_store_learner *rec);
/* Insert or replace n records in one transaction (one commit, one fsync under
 * durability sync): the synchronizer's periodic write of every live
 * learner's counters. All or none. */
int dl_store_learner_put_many(dl_store *s, const dl_store_learner *recs, int n);
/* DL_ENOTFOUND if the id is unknown. */
int dl_store_learner_get(dl_store *s, const char *id, dl_store_learner *out);
/* Visit every learner in id order; same callback rules as dl_store_foreach_merge. */
typedef int (*dl_learner_cb)(const dl_store_learner *rec, void *ctx);
int dl_store_foreach_learner(dl_store *s, dl_learner_cb cb, void *ctx);


/* ---- health */

/* Sizes, bytes. file >= used = live + free, live >= state: state is what the run
 * must keep, live what the current version of every database occupies
 * (state, records, registry, B-tree and freelist pages), free the pages
 * commits freed (reused by later commits once no snapshot older than the
 * freeing one is open). In steady state used stays near live plus the
 * largest fragment's params + momentum (the new copy a commit writes before
 * the old one is freed) plus what the previous commit freed. */
typedef struct {
    uint64_t map_size;         /* bytes currently mapped (address space, not disk) */
    uint64_t file_bytes;       /* size of data.mdb (LMDB never shrinks it) */
    uint64_t used_bytes;       /* pages up to the last used one */
    uint64_t live_bytes;       /* used_bytes - free_bytes */
    uint64_t free_bytes;       /* pages on LMDB's freelist */
    uint64_t state_bytes;      /* params + momentum blocks of every fragment as stored (headers, padding; momentum
                                  only where a fragment keeps one: dl_store_commit_merge) */
    uint32_t page_size;
    uint32_t readers_used, readers_max; /* reader slots: high-water mark, capacity */
    int stale_readers_cleared; /* by mdb_reader_check at open */
    uint32_t map_grows;        /* map growths since open (all causes) */
    uint32_t map_full_retries; /* transactions retried after MDB_MAP_FULL */
    uint32_t grow_timeouts;    /* growths that gave up (DL_EAGAIN): transactions stayed open past grow_wait_ms */
    uint32_t env_reopens;      /* environments reopened after LMDB stopped one (MDB_PANIC: a commit could not
                                  write its meta page, e.g. a full disk) */
    uint32_t snapshots_open;   /* snapshots open now */
} dl_store_stats;

/* One short read transaction; walks the freelist's records (one per
 * freeing commit still on it, not one per page). */
int dl_store_get_stats(dl_store *s, dl_store_stats *out);

/* Offline consistency check (opens `dir` read-only; safe while a
 * synchronizer runs, but not from a process that has `dir` open). Verifies:
 * schema version; run and fingerprint present; the run's model passes
 * dl_model_config_check (the store does not recompute the fingerprint from
 * it: `dloco check` does, with core/model.h); for every fragment p < P the
 * header, numel, that version == number of merge records and the record
 * versions are exactly 1..version; that params and outer hold exactly the
 * blocks 0..blocks-1 of every p < P and nothing else, each at the
 * fragment's version with its checksum; a shard's store: the fragments of
 * other shards at version 0; no records of fragments >= P; ledger applied
 * and dropped_stale equal the sums over all merge records. Returns 0, or
 * DL_ECORRUPT / DL_EFORMAT (or an open error) with the FIRST violation in the
 * detail. Prints a short summary to `report` (may be NULL). */
int dl_store_check(const char *dir, FILE *report);

#endif
