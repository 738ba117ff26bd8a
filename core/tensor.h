/* One entry of a parameter tensor table: a named view (offset, shape) into
 * the contiguous fp32 parameter buffer. Shared by the model, the fragment plan
 * and the synchronizer, which never see per-tensor allocations. */
#ifndef DL_CORE_TENSOR_H
#define DL_CORE_TENSOR_H
#include <stddef.h>
#include <stdint.h>

/* kind decides merge rule and weight decay: embeddings merge by weighted mean,
 * the rest by radial-directional averaging; AdamW decays MATRIX and EMBED. */
enum { DL_TENSOR_MATRIX = 0, DL_TENSOR_VECTOR = 1, DL_TENSOR_EMBED = 2 };

/* Bounds of one entry: a name of up to 127 bytes (NUL-terminated in 128),
 * 1 to 4 dimensions. A GPT-2 table uses names under 48 bytes and 1 or 2
 * dimensions, the only ones the fingerprint's formats 1 and 2 can hold
 * (core/plan.h). */
#define DL_TENSOR_NAME_MAX 128
#define DL_TENSOR_NDIM_MAX 4

typedef struct {
    char name[DL_TENSOR_NAME_MAX]; /* "wte", "h.3.attn.c_attn.weight", ... */
    size_t offset;                 /* into the parameter buffer, in floats */
    size_t numel;
    int ndim;                           /* 1..DL_TENSOR_NDIM_MAX */
    int64_t shape[DL_TENSOR_NDIM_MAX];  /* row-major, 0 past ndim; rows = shape[0] */
    int kind;                           /* DL_TENSOR_* */
} dl_tensor;

#endif
