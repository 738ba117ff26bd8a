/* Model files' private header: the formats' constants, the buffered file
 * writer every format writes with, and the calls the files make to one
 * another. What may live here: what two or more of storage/modelfile*.c
 * share; other folders use storage/modelfile.h. The files:
 *   modelfile.c       the API: format names, write (temp + atomic rename), read (map, dispatch), the writer
 *   modelfile_st.c    safetensors: writer and the bounded header reader (dloco or HF names)
 *   modelfile_llmc.c  llm.c checkpoints: writer and reader
 *   modelfile_hf.c    the Hugging Face directory: config.json written and read (n_head) */
#ifndef DL_STORAGE_MODELFILE_INT_H
#define DL_STORAGE_MODELFILE_INT_H

#include "storage/modelfile.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define LLMC_MAGIC 20240326
#define LLMC_VERSION 3    /* fp32 params with the padded vocabulary in header[7] */
#define LLMC_HEADER 256   /* int32 */
#define LLMC_VPAD 128     /* llm.c pads the vocabulary to a multiple of this */
#define ST_HEADER_MAX (100u << 20) /* the safetensors spec's header bound */
#define ST_MAX_DIMS 8
#define NAME_MAX_LEN 127
#define CONFIG_JSON_MAX (1u << 20)

/* One run of output floats: n floats of src (rows x cols, written transposed
 * when transpose), or n zeros when src is NULL. */
typedef struct {
    const float *src;
    size_t n;
    size_t rows, cols;
    int transpose;
} piece;

typedef struct {
    int fd;
    const char *path;  /* the file written (a temporary name), for errors */
    const char *label; /* what the progress lines call it */
    char buf[1 << 20];
    size_t used;
    uint64_t done, total, next_report;
    FILE *progress;
} writer;

/* modelfile.c: the buffered writer and the files it writes */
int dl_modelfile_w_flush(writer *w);
int dl_modelfile_w_bytes(writer *w, const void *data, size_t n);
int dl_modelfile_w_piece(writer *w, const piece *pc);
/* Create path exclusively, for writing. */
int dl_modelfile_create(const char *path, int *fd);
/* fsync and close fd (closed whatever happens). */
int dl_modelfile_finish(int fd, const char *path);
void dl_modelfile_fsync_dir(const char *path);
/* DL_EMISMATCH naming both models; 1 when f and c are the same model. */
int dl_modelfile_mismatch(const char *path, const dl_model_config *f, const dl_model_config *c);
int dl_modelfile_same_model(const dl_model_config *f, const dl_model_config *c);

/* modelfile_st.c */
int dl_modelfile_write_st(const char *path, const dl_model_config *cfg, const float *params,
                          const dl_modelfile_meta *meta, int hf, FILE *progress, const char *label);
int dl_modelfile_read_st(const char *path, const unsigned char *map, uint64_t size, const dl_model_config *cfg,
                         float *params, dl_modelfile_info *info);

/* modelfile_llmc.c */
int dl_modelfile_write_llmc(const char *path, const dl_model_config *cfg, const float *params, FILE *progress,
                            const char *label);
int dl_modelfile_read_llmc(const char *path, const unsigned char *map, uint64_t size, const dl_model_config *cfg,
                           float *params, dl_modelfile_info *info);

/* modelfile_hf.c */
int dl_modelfile_write_hf_config(const char *path, const dl_model_config *cfg);
/* Removes model.safetensors and config.json of dir, then dir if empty. */
void dl_modelfile_remove_hf_dir(const char *dir);
/* n_head from a config.json beside the model (HF). -1 when there is none
 * or it has no n_head. */
int dl_modelfile_hf_n_head(const char *model_path, int64_t *out);

#endif
