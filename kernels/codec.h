/* Encode and decode of the wire codecs (layouts: core/codec.h). CPU
 * reference, vectorised; kernels/cuda/codec.cu has the CUDA twins with the
 * same results (tests/test_cuda_codec.c).
 *
 * Determinism: decode is bit-exact and the same on every machine: a value is
 * q * s (one fp32 multiply) or the stored fp32/bf16 bits, and decode_add is
 * one fp32 add per element on top; this file is compiled without
 * floating-point contraction (no fused multiply-add), and the CUDA twins use
 * __fmul_rn / __fadd_rn. The synchronizer and every learner apply a delta
 * update with dl_codec_decode_add, so they hold the same bits (the base of a
 * learner's next pseudo-gradient is exactly what the synchronizer stored).
 *
 * Encode (error feedback): y = x + r, element by element in fp32 (r NULL:
 * y = x); the payload is the codec's encoding of y; then r = y - decode(payload),
 * so r is exactly what this payload did not carry. Scales are the block's
 * absmax over y divided by the codec's top level (int8 127, int4 7, e3m0 1).
 * Rounding of int8/int4/e3m0: nearest (ties away from zero), or stochastic
 * with u = a uniform in [0, 1) that is a pure function of (seed, first + i),
 * so the CPU and the GPU draw the same u, and E[decode] = y within a block
 * (except where |y| is clipped to the top level, which absmax scaling never
 * needs). e3m0 rounds between neighbouring powers of two (and zero) in
 * linear value. bf16 is round-to-nearest-even. topk keeps the k largest |y|
 * of each block (ties: the lower index). */
#ifndef DL_KERNELS_CODEC_H
#define DL_KERNELS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "core/codec.h"

typedef enum { DL_ROUND_NEAREST = 0, DL_ROUND_STOCHASTIC = 1 } dl_codec_rounding;

typedef struct {
    dl_codec c;
    dl_codec_rounding rounding; /* int8, int4, e3m0 */
    uint64_t seed;              /* stochastic rounding */
} dl_codec_enc;

/* "nearest" | "stochastic" -> rounding; DL_EINVAL otherwise. */
int dl_codec_rounding_parse(const char *name, dl_codec_rounding *out);

/* Encode x[0, n) -- elements [first, first + n) of a fragment; for block
 * codecs `first` is a multiple of the block size -- into out,
 * dl_codec_bytes(&e->c, n) bytes. r: NULL, or n floats of error-feedback
 * residual, read and then overwritten as above. out must not overlap x or r.
 * Returns 0, or DL_EINVAL (a non-finite y, an invalid codec; out and r are
 * then unspecified). */
int dl_codec_encode(const dl_codec_enc *e, const float *x, float *r, uint64_t n, uint64_t first, uint8_t *out);

/* Decode len bytes holding n elements into out[0, n). Everything is
 * checked: len == dl_codec_bytes(c, n), every scale finite and >= 0, every
 * fp32/bf16/topk value finite, topk indices strictly increasing and inside
 * their block. Returns 0 or DL_EINVAL with the reason (naming the block or
 * element) in dl_errmsg(); out is unspecified on error. */
int dl_codec_decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, float *out);

/* out[i] = base[i] + decode(in)[i], one fp32 add per element (out may be
 * base). Same checks as dl_codec_decode; on error out is unchanged. */
int dl_codec_decode_add(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, const float *base,
                        float *out);

#endif
