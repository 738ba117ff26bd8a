/* Learner checkpoints: params + AdamW moments + step + data position in one
 * file (magic "DLCK", version, config, checksum), written atomically. */
#ifndef DL_LEARNER_CKPT_H
#define DL_LEARNER_CKPT_H

#include "learner/data.h"
#include "learner/gpt.h"

#define DL_CKPT_MAGIC 0x4B434C44u /* "DLCK" little-endian */
#define DL_CKPT_VERSION 1u

typedef struct {
    int64_t step;     /* completed optimizer steps (AdamW t of the last step) */
    dl_data_pos data; /* next training sequence */
    uint64_t seed;    /* run seed, for the record */
} dl_ckpt_state;

/* Write to path.tmp, fsync, rename: a crash leaves the old or the new file. */
int dl_ckpt_save(const char *path, dl_gpt *g, const dl_ckpt_state *st);
/* Load into an open model whose config must match the file's. Errors:
 * DL_EIO, DL_EFORMAT (magic/version), DL_ETRUNC (short file), DL_EMISMATCH
 * (model config differs), DL_ECORRUPT (checksum), DL_ENOMEM (no room to
 * stage the file's state, 3 x nparams floats, before it is checked). The
 * model is untouched on error. */
int dl_ckpt_load(const char *path, dl_gpt *g, dl_ckpt_state *st);

/* The same file from / into raw host buffers (a model that lives elsewhere,
 * e.g. on a GPU): params, AdamW m and v of `nparams` floats each for the
 * checked config `cfg` (padded_vocab filled). Byte for byte what
 * dl_ckpt_save/dl_ckpt_load write and read, so a checkpoint moves between
 * backends. load_raw leaves the buffers untouched on error. */
int dl_ckpt_save_raw(const char *path, const dl_model_config *cfg, size_t nparams, const float *params,
                     const float *m, const float *v, const dl_ckpt_state *st);
int dl_ckpt_load_raw(const char *path, const dl_model_config *cfg, size_t nparams, float *params, float *m, float *v,
                     dl_ckpt_state *st);

#endif
