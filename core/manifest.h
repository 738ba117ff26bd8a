/* The model's manifest: the tensors a run trains (name, shape of 1-4 dims, role; fp32, in declaration
 * order), its plan, fingerprint, first difference and JSON form. A GPT-2 config is one kind of manifest. */
#ifndef DL_CORE_MANIFEST_H
#define DL_CORE_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"
#include "core/tensor.h"

/* A manifest is what the synchronizer knows of a model: an ordered list of
 * fp32 tensors, each a name (1 to DL_TENSOR_NAME_MAX - 1 bytes, no control
 * character), a row-major shape of 1 to DL_TENSOR_NDIM_MAX dimensions (each
 * >= 1) and a role (DL_TENSOR_EMBED: merged by weighted mean; MATRIX and
 * VECTOR: by radial-directional averaging). The tensors lie one after
 * another in one parameter buffer in declaration order, so offsets follow
 * from the shapes. A manifest built from a GPT-2 config (or tagged as one,
 * dl_manifest_set_gpt) keeps that config: its plan and fingerprint are
 * exactly dl_model_plan_open's and dl_model_fingerprint's, so GPT-2 runs
 * keep their fingerprints bit for bit.
 *
 * Functions return 0 or a negative DL_E* code with dl_errmsg() naming the
 * tensor and the fix; none aborts on bad input or a failed allocation. */
typedef struct dl_manifest dl_manifest;

/* Tensors per manifest: a Hello carrying one must fit the protocol's 64 KiB
 * header (about 1000 tensors of 40-byte names), the JSON form has no such
 * limit below this one. */
#define DL_MANIFEST_TENSORS_MAX 65536
/* JSON values a manifest document (or a safetensors header) may hold, an
 * upper bound counted before parsing (every '[', '{' and ',' byte), so a
 * hostile document cannot make the parsed tree huge: 2^22 values is about
 * 60 per tensor at the tensor cap, and a tree of at most ~250 MB. */
#define DL_MANIFEST_JSON_VALUES_MAX (1u << 22)
/* 0, or DL_EFORMAT when text[0, len) may hold more values than that. */
int dl_manifest_json_bounded(const char *text, size_t len, const char *what);
/* Floats in the whole model: 2^40 (4 TiB of fp32). */
#define DL_MANIFEST_NUMEL_MAX (UINT64_C(1) << 40)

/* An empty manifest to dl_manifest_add to. DL_ENOMEM. */
int dl_manifest_open(dl_manifest **out);
/* Free and NULL; safe on NULL and twice. */
void dl_manifest_close(dl_manifest **m);

/* Append a tensor. DL_EINVAL (nothing appended) for an empty, overlong or
 * control-character name, ndim outside [1, 4], a dimension below 1, an
 * element count or model size past DL_MANIFEST_NUMEL_MAX, a role that is
 * not DL_TENSOR_*, more than DL_MANIFEST_TENSORS_MAX tensors, or a manifest
 * tagged GPT-2 (its table is fixed). Duplicate names are found by
 * dl_manifest_check. DL_ENOMEM. */
int dl_manifest_add(dl_manifest *m, const char *name, int ndim, const int64_t *shape, int role);

/* The whole manifest: at least one tensor, names unique. DL_EINVAL naming
 * the first duplicate otherwise. Every consumer below calls it. */
int dl_manifest_check(const dl_manifest *m);

/* The manifest of a GPT-2 config (checked by dl_model_config_check; padded
 * vocabulary filled): dl_model_tensor_table's table, tagged with the config. */
int dl_manifest_from_gpt(const dl_model_config *cfg, dl_manifest **out);
/* Tag an untagged manifest as GPT-2 config cfg: DL_EMISMATCH naming the
 * first differing tensor when its table is not exactly cfg's (names, shapes,
 * roles, order). A learner that describes dloco's GPT-2 by its tensors then
 * gets the GPT-2 fingerprint. */
int dl_manifest_set_gpt(dl_manifest *m, const dl_model_config *cfg);
/* 1 (and *cfg filled when non-NULL) when the manifest is a GPT-2 config's. */
int dl_manifest_gpt(const dl_manifest *m, dl_model_config *cfg);

int dl_manifest_ntensors(const dl_manifest *m);
/* Entry i of the table (offset and numel filled), 0 <= i < ntensors. */
const dl_tensor *dl_manifest_tensor(const dl_manifest *m, int i);
/* The table itself, ntensors entries in buffer order. */
const dl_tensor *dl_manifest_table(const dl_manifest *m);
/* Floats in all tensors: the parameter buffer's length. */
size_t dl_manifest_numel(const dl_manifest *m);

/* The fragment plan with P fragments (core/plan.h): a GPT-2 manifest's is
 * dl_model_plan_open's. DL_EINVAL from dl_manifest_check or the plan. */
struct dl_plan;
int dl_manifest_plan_open(const dl_manifest *m, int P, struct dl_plan **out);
/* The run's model fingerprint for a plan built from this manifest: a GPT-2
 * manifest's is dl_model_fingerprint (formats 1/2, config bytes included);
 * any other is dl_plan_fingerprint_v3 over the plan (names, shapes, roles,
 * offsets, blocks and P) with no config bytes, so no other manifest can
 * share a GPT-2 fingerprint by construction. */
uint64_t dl_manifest_fingerprint(const dl_manifest *m, const struct dl_plan *plan);

/* Differences between manifest `here` and `other` (called `other_label`,
 * e.g. "the learner's manifest"): compared position by position (the order
 * is the buffer layout), a position counts once whether its name, shape or
 * role differs; each tensor one side has beyond the other's end counts; and
 * when the tables agree but one side is GPT-2 and the other not (or another
 * GPT-2 config: the head count and the real vocabulary are not in the
 * table), that counts one. Returns the count (0: the same model), and writes
 * the first difference to msg (cap bytes, may be NULL), e.g.
 *   tensor 'h.0.attn.w' (3 of 148) has shape [768, 2304] here, [768, 768] in the learner's manifest */
int dl_manifest_diff(const dl_manifest *here, const dl_manifest *other, const char *other_label, char *msg,
                     size_t cap);

/* "matrix", "vector", "embedding" for DL_TENSOR_*; "?" otherwise. */
const char *dl_manifest_role_name(int role);
/* DL_TENSOR_* of a role name (the three above; "embed" too), -1 otherwise. */
int dl_manifest_role_parse(const char *name);
/* "[768, 2304]" into buf (cap bytes); returns buf. */
const char *dl_manifest_shape_str(const dl_tensor *t, char *buf, size_t cap);

/* JSON form (docs/ARCHITECTURE.md "Manifest"):
 *   {"dloco_manifest": 1,
 *    "gpt": {"n_layer": 2, "n_head": 2, "n_embd": 64, "seq_len": 32, "vocab": 100},   (GPT-2 only)
 *    "tensors": [{"name": "wte", "shape": [128, 64], "role": "embedding"}, ...]}
 * A tensor may carry "dtype": "F32" (the only one); other members are
 * refused, so a typo is not silently ignored. to_json writes that form
 * (one tensor per line) into a malloc'd NUL-terminated string *out of *len
 * bytes; from_json reads it back: DL_EFORMAT for malformed JSON or a wrong
 * field, DL_EINVAL from dl_manifest_add / check / set_gpt; every message
 * names the tensor. */
int dl_manifest_to_json(const dl_manifest *m, char **out, size_t *len);
int dl_manifest_from_json(const char *text, size_t len, dl_manifest **out);
/* The same on files (save writes path.tmp and renames it over path). */
int dl_manifest_load(const char *path, dl_manifest **out);
int dl_manifest_save(const dl_manifest *m, const char *path);

#endif
