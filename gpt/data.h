/* Training data: raw text as bytes (vocab 256) or llm.c uint16 token shards
 * (256-int32 header, magic 20240520), split into train/validation sequences,
 * shuffled per epoch from a seed, with a position a checkpoint can store. */
#ifndef DL_LEARNER_DATA_H
#define DL_LEARNER_DATA_H

#include <stdint.h>

#define DL_SHARD_MAGIC 20240520
#define DL_SHARD_VERSION 1

typedef struct dl_data dl_data;

typedef struct {
    uint64_t epoch; /* completed passes over the training sequences */
    uint64_t index; /* next sequence within this epoch's permutation */
} dl_data_pos;

typedef struct {
    const char *path;   /* a file, or a directory of text files / .bin shards */
    const char *format; /* "auto" | "text" | "shards" */
    int seq_len;        /* T: each sample is T inputs + T shifted targets */
    int vocab;          /* shards: tokens must be < vocab; text: must be >= 256 */
    double val_frac;    /* fraction of sequences held out, chosen by a fixed hash */
    uint64_t seed;      /* shuffling seed (train order only; the split never changes) */
    int shard_index;    /* this learner keeps training sequences with index % shard_count == shard_index */
    int shard_count;    /* 0 or 1 = no sharding; validation is never sharded */
    int shard_mode;     /* DL_DATA_SHARD_IID (default, 0): the index rule above; DL_DATA_SHARD_CLUSTER: see below */
    int min_seqs;       /* cluster mode: refuse a shard with fewer training sequences than this (the batch) */
} dl_data_opts;

/* Shard modes (dloco-learner --data_shard_mode, docs/HETEROGENEOUS.md "Non-IID shards").
 * iid: training sequence number k (in corpus order, validation ones skipped) goes to shard k % count, so
 *   every shard is a uniform sample of the corpus.
 * cluster: the training sequences, in corpus order, are cut into documents of DL_DATA_CLUSTER_DOC
 *   consecutive sequences (the last may be shorter); each document is described by the histogram of its
 *   tokens over DL_DATA_CLUSTER_BINS bins (token % bins), normalised to frequencies; k-means with k =
 *   shard_count (k-means++ seeding from the fixed seed DL_DATA_CLUSTER_SEED, not the learner's --seed, so
 *   every learner computes the same clusters; DL_DATA_CLUSTER_ITERS Lloyd iterations, squared Euclidean
 *   distance) finds k centroids; then the documents are assigned to centroids under a capacity of
 *   ceil(documents / k) each (all (distance, document, centroid) triples in ascending order, greedily: a
 *   document goes to its nearest centroid that still has room), so the shards are of equal size and each is
 *   a region of the corpus's topic/character space. Shard i takes centroid i's documents. Deterministic (a
 *   pure function of the corpus, T, val_frac and count); the shards are disjoint and cover the training
 *   sequences. A shard with fewer than min_seqs training sequences is refused (DL_ERANGE, with the counts). */
enum { DL_DATA_SHARD_IID = 0, DL_DATA_SHARD_CLUSTER = 1 };
#define DL_DATA_CLUSTER_DOC 8
#define DL_DATA_CLUSTER_BINS 64
#define DL_DATA_CLUSTER_ITERS 12
#define DL_DATA_CLUSTER_SEED 0xC1A55EEDu

/* Load and validate. Errors: DL_EIO (unreadable), DL_EFORMAT (foreign file:
 * a shard without the magic, wrong version), DL_ETRUNC (shard shorter than
 * its header says), DL_ERANGE (token >= vocab, too little data), DL_ENOMEM
 * (a file or the token array does not fit in memory). *out is NULL on error. */
int dl_data_open(const dl_data_opts *o, dl_data **out);
void dl_data_close(dl_data **d);

uint64_t dl_data_num_tokens(const dl_data *d);
uint64_t dl_data_train_seqs(const dl_data *d);
uint64_t dl_data_val_seqs(const dl_data *d);
const char *dl_data_kind(const dl_data *d); /* "text" or "shards" */
/* Token offset of training sequence i (< dl_data_train_seqs, canonical order): which part of the corpus a
 * shard holds (tests, the data event). */
uint64_t dl_data_train_offset(const dl_data *d, uint64_t i);

/* Next B training sequences into inp/tgt [B*T]; advances the position and
 * reshuffles at each epoch boundary. */
void dl_data_next_train(dl_data *d, int B, int32_t *inp, int32_t *tgt);
/* Validation batch i (sequences i*B .. i*B+B-1, wrapping): fixed across runs. */
void dl_data_val_batch(const dl_data *d, uint64_t i, int B, int32_t *inp, int32_t *tgt);

dl_data_pos dl_data_get_pos(const dl_data *d);
int dl_data_set_pos(dl_data *d, dl_data_pos pos); /* DL_ERANGE if index is past the epoch */

/* Write tokens as an llm.c shard (used by tests and tools). */
int dl_data_write_shard(const char *path, const uint16_t *tokens, uint64_t n);

#endif
