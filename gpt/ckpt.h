/* Learner checkpoints: params + AdamW moments + step + data position in one
 * file (magic "DLCK", version, config, checksums of the header and the arrays), written atomically; a GPA
 * run's (gpt/gpa.h) also holds its second parameter copy. */
#ifndef DL_LEARNER_CKPT_H
#define DL_LEARNER_CKPT_H

#include "gpt/data.h"
#include "gpt/gpt.h"

#define DL_CKPT_MAGIC 0x4B434C44u /* "DLCK" little-endian */
#define DL_CKPT_VERSION 1u     /* AdamW: params, m, v */
#define DL_CKPT_VERSION_GPA 2u /* GPA: x (as params), m, v, then y, and mu_y in the header */
#define DL_CKPT_VERSION_FLEET 3u /* AdamW with adam_fleet: params, m, v (its own part, may be < 0), then the noise
                                  * moment w, and the adam_fleet multiplier in the header */

typedef struct {
    int64_t step;     /* completed optimizer steps (AdamW t of the last step) */
    dl_data_pos data; /* next training sequence */
    uint64_t seed;    /* run seed, for the record */
    float gpa_mu_y;   /* GPA files: the mu_y that y was stored under (z = y + mu_y/(1-mu_y) (y - x)); 0 otherwise */
    uint64_t run_tag; /* whose file: a learner's recovery file (gpt/recovery.h) holds its run and id's tag; 0 for a
                       * plain checkpoint */
    float fleet;      /* adam_fleet files: the multiplier (gpt/train.h); 0 otherwise */
} dl_ckpt_state;

/* Write to path.tmp, fsync, rename: a crash leaves the old or the new file. */
int dl_ckpt_save(const char *path, dl_gpt *g, const dl_ckpt_state *st);
/* Load into an open model whose config must match the file's. Errors:
 * DL_EIO, DL_EFORMAT (magic/version), DL_ETRUNC (short file), DL_EMISMATCH
 * (model config differs), DL_ECORRUPT (checksum), DL_ENOMEM (no room to
 * stage the file's state, 3 x nparams floats, before it is checked). The
 * model is untouched on error. */
int dl_ckpt_load(const char *path, dl_gpt *g, dl_ckpt_state *st);

/* Read and check only the header (magic, version, header checksum, optimizer
 * code, step >= 0) into *st, without the model: which file this is before
 * anything is loaded. *hashed (may be NULL) = 1 when the header carries its
 * checksum (files from before it do not: their header is unchecked).
 * Errors: DL_EIO, DL_ETRUNC, DL_EFORMAT, DL_ECORRUPT. */
int dl_ckpt_peek(const char *path, dl_ckpt_state *st, int *hashed);

/* The same file from / into raw host buffers (a model that lives elsewhere,
 * e.g. on a GPU): params, AdamW m and v of `nparams` floats each for the
 * checked config `cfg` (padded_vocab filled). Byte for byte what
 * dl_ckpt_save/dl_ckpt_load write and read, so a checkpoint moves between
 * backends. load_raw leaves the buffers untouched on error. */
int dl_ckpt_save_raw(const char *path, const dl_model_config *cfg, size_t nparams, const float *params,
                     const float *m, const float *v, const dl_ckpt_state *st);
int dl_ckpt_load_raw(const char *path, const dl_model_config *cfg, size_t nparams, float *params, float *m, float *v,
                     dl_ckpt_state *st);

/* A GPA run's file (version DL_CKPT_VERSION_GPA): the model x in the params
 * place (so its params are the model, as in an AdamW file), m, v, then y,
 * with st->gpa_mu_y (finite, in [0, 1)) in the header; the checksum chains
 * all four arrays. The rule between the two kinds: dl_ckpt_load /
 * dl_ckpt_load_raw refuse a GPA file and dl_ckpt_load_gpa an AdamW file,
 * both DL_EMISMATCH naming the optimizer the file is from (resuming one
 * optimizer's state with the other would not continue the run). A GPA file
 * whose header mu_y is not in [0, 1) is DL_EFORMAT; the load stages 4 x
 * nparams floats (DL_ENOMEM before anything is touched). */
int dl_ckpt_save_gpa(const char *path, const dl_model_config *cfg, size_t nparams, const float *x, const float *m,
                     const float *v, const float *y, const dl_ckpt_state *st);
int dl_ckpt_load_gpa(const char *path, const dl_model_config *cfg, size_t nparams, float *x, float *m, float *v,
                     float *y, dl_ckpt_state *st);

/* An adam_fleet run's file (version DL_CKPT_VERSION_FLEET, optimizer code 2):
 * params, m, v as the run holds them (v is the first half's part and may be
 * negative), then the noise moment w, with st->fleet (in [1, 1e6]) in the
 * header; the checksum chains all four. A plain AdamW or GPA run refuses it
 * and it refuses theirs (DL_EMISMATCH naming both). Written by recovery
 * files: dl_trainer_save still writes an adam_fleet run's checkpoint as a
 * plain AdamW file (v = max(v, 0) + w), which any run can resume. */
int dl_ckpt_save_fleet(const char *path, const dl_model_config *cfg, size_t nparams, const float *params,
                       const float *m, const float *v, const float *w, const dl_ckpt_state *st);
int dl_ckpt_load_fleet(const char *path, const dl_model_config *cfg, size_t nparams, float *params, float *m, float *v,
                       float *w, dl_ckpt_state *st);

#endif
