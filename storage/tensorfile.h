/* Safetensors files of any model a manifest describes (core/manifest.h): the manifest's own tensor names
 * and shapes, the manifest itself (roles, order) in __metadata__; written atomically, read as hostile input. */
#ifndef DL_STORAGE_TENSORFILE_H
#define DL_STORAGE_TENSORFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/manifest.h"

/* The file (docs/OPERATING.md "Manifest runs"): a standard safetensors file
 * (u64 little-endian header length, a JSON header, the data) with one entry
 * per manifest tensor under the tensor's name, its shape, dtype F32, in the
 * manifest's order, and in __metadata__ (string values, as safetensors
 * wants): "format": "pt", "dloco_manifest": the manifest's JSON
 * (dl_manifest_to_json, so roles and order travel with the weights), and,
 * from a store, run id, fingerprint, fragments and versions. PyTorch's
 * safetensors.torch.load_file reads it as is. */

/* What a run adds to the metadata; every field may be 0 / NULL. */
typedef struct {
    const char *run_id;
    uint64_t fingerprint;
    uint32_t n_fragments;
    const uint64_t *versions; /* [n_fragments] */
} dl_tensorfile_meta;

/* Write params (dl_manifest_numel floats, the manifest's buffer layout) to
 * path. Built as path.tmp.PID, fsynced and renamed into place; an existing
 * path is refused (DL_EINVAL) unless force. progress (may be NULL) gets a
 * line per 10% for files above 64 MiB. DL_EIO, DL_EINVAL, DL_ENOMEM. */
int dl_tensorfile_write(const char *path, const dl_manifest *m, const float *params, const dl_tensorfile_meta *meta,
                        int force, FILE *progress);

/* The manifest a file's __metadata__ carries ("dloco_manifest"), from its
 * header alone. DL_ENOTFOUND (the file is fine but carries none: give the
 * manifest another way), DL_EIO, DL_EFORMAT / DL_ETRUNC (not a safetensors
 * file), DL_EINVAL (a safetensors file whose manifest is bad, named). */
int dl_tensorfile_manifest(const char *path, dl_manifest **out);

/* A manifest for a safetensors file that carries none (one PyTorch's
 * save_file wrote): its tensors in the file's data order, roles guessed --
 * embedding for a 2-D tensor whose name contains "embed" or is "wte" /
 * "wpe" (or ends in ".wte.weight" / ".wpe.weight"), vector for 1-D, matrix
 * for the rest. `dloco manifest FILE` prints it for the operator to check.
 * A file that carries one gives that one (*guessed 0). Errors as
 * dl_tensorfile_manifest, DL_EINVAL for a name or shape a manifest cannot
 * hold. */
int dl_tensorfile_guess_manifest(const char *path, dl_manifest **out, int *guessed);

typedef struct {
    char dtype[8];   /* "F32", "F16", "BF16" or "mixed" */
    int has_manifest; /* the file carried a dloco_manifest (then equal to m) */
} dl_tensorfile_info;

/* Read the tensors of manifest m from the safetensors file at path into
 * params (dl_manifest_numel(m) floats, each tensor at its offset). Every
 * file tensor must be one of m's with m's shape, and every one of m's must
 * be in the file; F32, F16 and BF16 are read (converted to fp32); no NaN or
 * Inf. A file that carries a dloco_manifest must carry m (roles and order
 * included): DL_EMISMATCH naming the first differing tensor otherwise.
 * Checked before any weight is used as in storage/modelfile.h: file size,
 * header length in [2, min(size - 8, 100 MiB)], well-formed JSON, metadata
 * values strings, no duplicate names, data_offsets in bounds, contiguous and
 * covering the data exactly. The file is mapped read-only (it must not be
 * truncated while read). Errors: DL_EIO, DL_EFORMAT, DL_ETRUNC, DL_ERANGE
 * (NaN/Inf), DL_EMISMATCH (a missing, extra or differently shaped tensor,
 * named). params may be partly written on error; info may be NULL. */
int dl_tensorfile_read(const char *path, const dl_manifest *m, float *params, dl_tensorfile_info *info);

#endif
