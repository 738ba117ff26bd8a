/* Model files: a GPT-2 parameter buffer (core/model.h's layout) written as
 * safetensors, a Hugging Face GPT-2 directory or an llm.c checkpoint, and read
 * back from any of them as hostile input (every length, offset and float checked). */
#ifndef DL_STORAGE_MODELFILE_H
#define DL_STORAGE_MODELFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/model.h"

/* The formats (docs/OPERATING.md, "Exporting and importing models"):
 *
 * SAFETENSORS  one .safetensors file, dloco's tensor names (core/model.c's
 *              table: wte, wpe, h.N.ln_1.weight, ..., ln_f.bias), dloco's
 *              (= llm.c's, nn.Linear's) [out, in] weights, wte [V, C] (the
 *              padded rows dropped), all F32. __metadata__: format "pt",
 *              dloco_names "dloco", the model shape and, from the store, run
 *              id, fingerprint, fragments, versions.
 * HF           a directory: model.safetensors with Hugging Face GPT2LMHeadModel
 *              names (transformer.wte.weight, transformer.h.N.attn.c_attn.weight,
 *              ...; the head is tied, so no lm_head.weight) where the Conv1D
 *              weights are [in, out], the TRANSPOSE of dloco's; and config.json.
 * LLMC         llm.c's GPT-2 checkpoint (train_gpt2.c): int32 header[256] =
 *              {20240326, 3, maxT, V, L, NH, C, Vp, 0...}, then fp32 wte [Vp, C]
 *              with Vp = V rounded up to 128 (zero rows), wpe, and the
 *              per-layer tensors stacked over layers, in llm.c's order. */
enum { DL_MODELFILE_SAFETENSORS = 0, DL_MODELFILE_HF = 1, DL_MODELFILE_LLMC = 2 };

/* "safetensors" | "hf" | "llmc" -> DL_MODELFILE_*; DL_EINVAL otherwise. */
int dl_modelfile_format_parse(const char *s, int *out);
const char *dl_modelfile_format_name(int format);

/* What a run adds to an export's metadata (safetensors formats); every
 * field may be left 0 / NULL. */
typedef struct {
    const char *run_id;
    uint64_t fingerprint;
    uint32_t n_fragments;
    const uint64_t *versions; /* [n_fragments] fragment versions */
    uint64_t seed;
} dl_modelfile_meta;

/* Write `params` (dl_model_tensor_table's numel floats of the checked
 * `cfg`) to `path` as `format`. Atomic: the file (the directory for HF) is
 * built under "path.tmp.PID" and renamed into place, so `path` is either
 * absent / the old one or the complete new one. An existing `path` is
 * refused (DL_EINVAL, nothing written) unless `force`; with force it is
 * replaced (an HF directory's model.safetensors and config.json are removed
 * with it; a directory holding other files is left beside as path.tmp.PID
 * and reported). `progress` (may be NULL) gets a line per 10% for models of
 * more than 64 MiB. Errors: DL_EIO (create, write, fsync, rename),
 * DL_EINVAL (exists, bad format). */
int dl_modelfile_write(const char *path, int format, const dl_model_config *cfg, const float *params,
                       const dl_modelfile_meta *meta, int force, FILE *progress);

/* What a file holds. */
typedef struct {
    dl_model_config model; /* L, NH, C, T, V (and Vp, dloco's padding); NH -1 when the file does not say */
    char kind[32];         /* "llmc", "safetensors (dloco names)", "safetensors (hf names)" */
    char dtype[8];         /* "F32", "F16", "BF16", or "mixed" */
} dl_modelfile_info;

/* Read the model at `path` into `params` (dl_model_tensor_table's numel
 * floats for the checked `cfg`; padded wte rows set to 0). The format is
 * the file's: an llm.c checkpoint (magic 20240326), a safetensors file, or
 * a directory holding model.safetensors (HF). n_head, which no tensor shape
 * shows, comes from the safetensors __metadata__ ("n_head"), else from a
 * config.json beside the file (or in the directory).
 * Checked before any weight is used: file size vs header (exact), llm.c
 * magic, version 3, header fields within core/model.h's bounds and Vp >= V;
 * safetensors header length in [2, min(size - 8, 100 MiB)], JSON well formed
 * (bounded depth, no trailing bytes but spaces), __metadata__ values strings,
 * every tensor exactly once (unknown names refused; HF's attn.bias,
 * attn.masked_bias and lm_head.weight ignored), dtype F32 / F16 / BF16
 * (converted), shapes exact, data_offsets in bounds, contiguous,
 * non-overlapping and covering the data exactly; no NaN or Inf in a weight.
 * Nothing is allocated from a header field: the file is mapped, parsed in
 * place and converted straight into `params` (so the file must not be
 * truncated while it is read: that would be a SIGBUS).
 * Errors: DL_EIO, DL_EFORMAT (not a model file, bad JSON, bad dtype, missing
 * or duplicate or unknown tensor, bad offsets), DL_ETRUNC (shorter than its
 * header says), DL_ERANGE (header field out of bounds, NaN/Inf), DL_EMISMATCH
 * (the file's model is not `cfg`: the detail names both shapes as
 * "checkpoint is L=.. NH=.. C=.. V=.. T=.., this run is ..."). `params` may
 * be partly written on error. `info` may be NULL. */
int dl_modelfile_read(const char *path, const dl_model_config *cfg, float *params, dl_modelfile_info *info);

/* An IEEE half (fp16, as safetensors stores F16) as fp32, exactly (subnormals, inf and NaN kept);
 * the readers of model files (modelfile_st.c) and of manifest safetensors (tensorfile.c) share it. */
float dl_modelfile_f16_to_f32(uint16_t h);

#endif
