/* One entry of a parameter tensor table: a named view (offset, shape) into
 * the contiguous fp32 parameter buffer. Shared by the model, the fragment plan
 * and the synchronizer, which never see per-tensor allocations. */
#ifndef DL_CORE_TENSOR_H
#define DL_CORE_TENSOR_H
#include <stddef.h>

/* kind decides merge rule and weight decay: embeddings merge by weighted mean,
 * the rest by radial-directional averaging; AdamW decays MATRIX and EMBED. */
enum { DL_TENSOR_MATRIX = 0, DL_TENSOR_VECTOR = 1, DL_TENSOR_EMBED = 2 };

typedef struct {
    char name[48]; /* "wte", "h.3.attn.c_attn.weight", ... */
    size_t offset; /* into the parameter buffer, in floats */
    size_t numel;
    int ndim;
    int shape[2];
    int kind; /* DL_TENSOR_* */
} dl_tensor;

#endif
