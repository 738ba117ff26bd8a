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
 * (model config differs), DL_ECORRUPT (checksum). The model is untouched on
 * error. */
int dl_ckpt_load(const char *path, dl_gpt *g, dl_ckpt_state *st);

#endif
