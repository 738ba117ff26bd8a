/* Validation loss of a global model in a store: the evaluation `dloco eval`
 * prints and the synchronizer's periodic evaluation reports
 * (--eval_every_s), one code path so their numbers agree. The data and its
 * split are the learners' (gpt/data.h, seed 0): sequence k of the
 * validation set is the same whatever the batch, so N sequences give the
 * same loss in batches of any size. */
#ifndef DL_LEARNER_EVALUATE_H
#define DL_LEARNER_EVALUATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/model.h"
#include "core/plan.h"
#include "storage/store.h"

typedef struct {
    const char *data;  /* the run's data (a text file or llm.c shards) */
    const char *data_format; /* "auto" (NULL too), "text" or "shards" (gpt/data.h) */
    double val_frac;   /* validation fraction the learners used */
    int batch;         /* sequences per forward pass (memory: activations of batch x seq_len) */
    int seqs;          /* validation sequences; rounded up to a multiple of batch */
} dl_evaluate_opts;

typedef struct dl_evaluate dl_evaluate;

/* Model state for m at o->batch, the data, the token buffers. The data must
 * be of m's vocab: text is one token per byte (vocab 256; any other vocab
 * needs data_format "text"), token shards hold no token >= vocab. Errors:
 * those of dl_gpt_open and dl_data_open, DL_EINVAL (batch or seqs < 1),
 * DL_EMISMATCH (data of another vocab, both named). */
int dl_evaluate_open(const dl_model_config *m, const dl_evaluate_opts *o, dl_evaluate **out);
/* Read every fragment of the store's global model into the model (each
 * fragment in its own short read transaction, checksums verified); *version_sum
 * = the sum of the versions read. Safe on any thread (storage/store.h). */
int dl_evaluate_load(dl_evaluate *e, dl_store *s, const dl_plan *plan, uint64_t *version_sum);
/* Mean loss over the sequences into *loss. stop (may be NULL) is polled
 * between forward passes: nonzero ends the run early with DL_EAGAIN. */
int dl_evaluate_run(dl_evaluate *e, const atomic_int *stop, double *loss);
/* Write the sequences dl_evaluate_run evaluates to `path` (for checks outside
 * dloco, e.g. tests/export_check.py): int32 little-endian header {0x51534c44
 * "DLSQ", 1, batches, batch, seq_len, vocab, 0, 0}, then per sequence
 * seq_len inputs and seq_len targets. Errors: DL_EIO. */
int dl_evaluate_dump(dl_evaluate *e, const char *path);
int dl_evaluate_seqs(const dl_evaluate *e);   /* sequences evaluated */
int dl_evaluate_batches(const dl_evaluate *e); /* forward passes */
void dl_evaluate_close(dl_evaluate **e);      /* safe on NULL and twice */

#endif
