/* The store's private header: the value formats, the byte and key helpers,
 * the handle's state, the LMDB check macros, and the calls the store's files
 * make to one another. What may live here: what two or more of storage/store*.c
 * share; nothing here is for other folders (they use storage/store.h). The files:
 *   store_codec.c  encodings of every stored value (decoders validate; errors name the key)
 *   store_txn.c    the gate, map growth, transactions, open / reopen / close
 *   store.c        the write API: run, epoch, evaluation, merge commit, learner records, ledger
 *   store_read.c   the read API: run facts, fragment reads, snapshots, records, stats
 *   store_check.c  the offline checker (`dloco check`) */
#ifndef DL_STORAGE_STORE_INT_H
#define DL_STORAGE_STORE_INT_H

#include "storage/store.h"

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
#define MAGIC_EVALDATA MAGIC4('D', 'L', 'E', 'D')
#define MAGIC_MANIFEST MAGIC4('D', 'L', 'M', 'F') /* meta[manifest]: magic | fmt | length u64 | the manifest's JSON */
#define EVAL_LEN 40
#define EVALDATA_HDR 36 /* magic, version, val_frac, format[16], path length; then the path */
#define FMT_VERSION 1u /* format version of every value kind above but the run (RUN_FMT) and fragment (FRAG_FMT) */

/* fragments value: the fragment's header; its params and momentum are
 * blocks in the params and outer databases.
 *   0 magic u32 | 4 fmt u32 | 8 p u32 | 12 blocks u32 | 16 version u64
 *  24 numel u64 | 32 block floats u32 | 36 reserved u32 | 40 wallclock ns i64
 * Format FRAG_FMT: params and momentum blocks. Format FRAG_FMT_NO_MOM, the
 * same header: params blocks only, the momentum is zero and not stored (a
 * new run's, and every commit of a run with outer momentum 0: the step
 * carries nothing over, so nothing is kept; a build before it refuses such a
 * fragment by its format number instead of missing its momentum). */
#define FRAG_HDR 48
#define FRAG_FMT 2u /* 1 (schema 2) was a 64-byte header followed by all the params */
#define FRAG_FMT_NO_MOM 3u
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

static inline void put32(uint8_t *b, uint32_t v) { memcpy(b, &v, 4); }
static inline void put64(uint8_t *b, uint64_t v) { memcpy(b, &v, 8); }
static inline void putf64(uint8_t *b, double v) { memcpy(b, &v, 8); }
static inline uint32_t get32(const uint8_t *b) { uint32_t v; memcpy(&v, b, 4); return v; }
static inline uint64_t get64(const uint8_t *b) { uint64_t v; memcpy(&v, b, 8); return v; }
static inline double getf64(const uint8_t *b) { double v; memcpy(&v, b, 8); return v; }

/* Fixed-width text field: copy up to `cap` bytes, NUL-padded (no NUL when full). */
static inline void put_text(uint8_t *b, size_t cap, const char *s)
{
    size_t n = strnlen(s, cap);
    memset(b, 0, cap);
    memcpy(b, s, n);
}
static inline void get_text(char *dst, const uint8_t *b, size_t cap)
{
    size_t n = strnlen((const char *)b, cap);
    memcpy(dst, b, n);
    dst[n] = 0;
}

static inline void put_be32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)(v >> 24), b[1] = (uint8_t)(v >> 16), b[2] = (uint8_t)(v >> 8), b[3] = (uint8_t)v;
}
static inline uint32_t get_be32(const uint8_t *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Keys sort numerically: fragment index, block and version big-endian. */
static inline MDB_val key_frag(uint8_t b[4], uint32_t p)
{
    put_be32(b, p);
    return (MDB_val){4, b};
}
static inline uint32_t key_frag_p(const MDB_val *k) { return get_be32(k->mv_data); }
static inline MDB_val key_blk(uint8_t b[8], uint32_t p, uint32_t block)
{
    put_be32(b, p);
    put_be32(b + 4, block);
    return (MDB_val){8, b};
}
static inline MDB_val key_merge(uint8_t b[12], uint32_t p, uint64_t version)
{
    key_frag(b, p);
    for (int i = 0; i < 8; i++) b[4 + i] = (uint8_t)(version >> (56 - 8 * i));
    return (MDB_val){12, b};
}
static inline uint64_t key_merge_version(const MDB_val *k)
{
    const uint8_t *b = (const uint8_t *)k->mv_data + 4;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return v;
}
static inline MDB_val key_str(const char *s) { return (MDB_val){strlen(s), (void *)s}; }

/* Blocks of an array of numel floats, floats in block b, and the value size
 * of every one of its blocks (one size per array: see BLK_HDR). */
static inline uint32_t blocks_of(uint64_t numel) { return (uint32_t)((numel + BF - 1) / BF); }
static inline uint32_t block_len(uint64_t numel, uint32_t b)
{
    uint64_t left = numel - (uint64_t)b * BF;
    return (uint32_t)(left < BF ? left : BF);
}
static inline size_t block_size(uint64_t numel) { return BLK_HDR + 4 * (size_t)(numel < BF ? numel : BF); }

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
    uint32_t env_serial; /* environments opened since dl_store_open (env_reopen); changes only at zero count */
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
    struct dl_manifest *manifest; /* a manifest run's model (meta[manifest]); NULL: a GPT-2 run */
    /* stats */
    int stale_cleared;
    atomic_uint map_grows, map_full_retries, grow_timeouts, env_reopens;
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

typedef struct {
    uint64_t version, numel;
    uint32_t blocks;
    int has_mom; /* its momentum blocks are stored (FRAG_FMT); 0: zero momentum, none stored (FRAG_FMT_NO_MOM) */
    int64_t wallclock_ns;
} frag_hdr;

/* One block of params (mom 0) or momentum (mom 1), validated against its
 * fragment's header. */
typedef struct {
    const uint8_t *data; /* n floats, possibly unaligned (a small value in a leaf page) */
    uint32_t n;
    uint64_t sum;
} blk_view;

/* Every LMDB call goes through this: file:line and mdb_strerror on failure. */
#define MDB_CALL(call)                                                                                   \
    do {                                                                                                 \
        int mdb_rc_ = (call);                                                                            \
        if (mdb_rc_ != MDB_SUCCESS) return dl_store_mdb_fail(mdb_rc_, #call, __FILE__, __LINE__);                 \
    } while (0)

/* mdb_get of a key that must exist: MDB_NOTFOUND becomes `code` (the store
 * is corrupt or not ours) with the caller's message. */
#define MDB_GET(txn, dbi, k, v, code, ...)                                                               \
    do {                                                                                                 \
        int mdb_rc_ = mdb_get((txn), (dbi), (k), (v));                                                   \
        if (mdb_rc_ == MDB_NOTFOUND) return dl_err((code), __VA_ARGS__);                                 \
        if (mdb_rc_ != MDB_SUCCESS) return dl_store_mdb_fail(mdb_rc_, "mdb_get", __FILE__, __LINE__);             \
    } while (0)

/* The check macros above report through this: it records the raw LMDB code
 * for dl_store_write's MDB_MAP_FULL retry and returns DL_ESTORE. */
int dl_store_mdb_fail(int rc, const char *what, const char *file, int line);

/* store_codec.c: value encodings (decoders validate; errors name the key) */
int dl_store_check_id(const char *what, const char *id);
const char *dl_store_arr_db(int mom);
int dl_store_blk_decode(int mom, uint32_t p, uint32_t blk, const frag_hdr *h, const MDB_val *v, blk_view *out);
int dl_store_frag_get(dl_store *s, MDB_txn *t, uint32_t p, frag_hdr *h);
int dl_store_blk_get(dl_store *s, MDB_txn *t, int mom, uint32_t p, const frag_hdr *h, uint32_t blk, blk_view *out);
int dl_store_epoch_decode(const MDB_val *v, uint64_t *epoch);
int dl_store_ledger_decode(const MDB_val *v, dl_store_ledger *l);
void dl_store_learner_encode(uint8_t b[LEARNER_LEN], const dl_store_learner *r);
int dl_store_learner_decode(const MDB_val *k, const MDB_val *v, dl_store_learner *r);
size_t dl_store_mrec_size(uint32_t n);
int dl_store_mrec_validate(const dl_merge_record *r);
void dl_store_mrec_encode(uint8_t *b, uint32_t p, uint64_t version, const dl_merge_record *r);
int dl_store_mrec_decode(const MDB_val *v, uint32_t p, uint64_t version, dl_merge_record *out,
                         dl_merge_contrib **buf, uint32_t *cap);
void dl_store_hash_blocks(const float *x, uint64_t numel, uint64_t *sums);
int dl_store_put_frag_hdr(dl_store *s, MDB_txn *t, uint32_t p, uint64_t version, uint64_t numel, int64_t wall,
                          int has_mom);
/* Delete every momentum block of fragment p (header h, which has them). */
int dl_store_del_mom_blocks(dl_store *s, MDB_txn *t, uint32_t p, const frag_hdr *h);
int dl_store_put_blocks(dl_store *s, MDB_txn *t, int mom, uint32_t p, uint64_t version, uint64_t numel,
                        const float *x, const uint64_t *sums);

/* store_txn.c: transactions under the gate, map growth */
int dl_store_txn_begin(dl_store *s, int write, MDB_txn **out);
void dl_store_txn_abort(dl_store *s, MDB_txn *t);
int dl_store_txn_commit(dl_store *s, MDB_txn *t);
int dl_store_map_grow(dl_store *s, uint64_t min_size);
typedef int (*dl_store_write_fn)(dl_store *s, MDB_txn *t, void *ctx);
int dl_store_write(dl_store *s, uint64_t need, dl_store_write_fn fn, void *ctx);
uint64_t dl_store_state_bytes(uint32_t P, const uint64_t *numel);
uint64_t dl_store_run_map_size(uint32_t P, const uint64_t *numel);

/* store.c */
const char *dl_store_layout_str(uint32_t shard, uint32_t shards, char buf[48]);

/* store_read.c */
int dl_store_check_p(const dl_store *s, uint32_t p);
int dl_store_foreach_merge_in(dl_store *s, MDB_txn *t, uint32_t p, uint64_t from, dl_merge_cb cb, void *ctx);
int dl_store_foreach_learner_in(dl_store *s, MDB_txn *t, dl_learner_cb cb, void *ctx);

#endif
