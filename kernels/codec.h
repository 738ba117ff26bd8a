/* Encode and decode of the wire codecs (layouts: core/codec.h). CPU
 * reference, vectorised and OpenMP-parallel over blocks (results do not
 * depend on the thread count); kernels/cuda/codec.h declares the CUDA twins
 * (kernels/cuda/codec.cu) with the same bytes, floats and refusals
 * (tests/test_cuda_codec.c).
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
 * needs). u is the top 24 bits of splitmix64(seed ^ (first + i) * 0x9e3779b97f4a7c15)
 * times 2^-24 (kernels/codec_elem.h); a value t = |y|/s between two levels
 * goes up with probability (t - lower) / (upper - lower), i.e. when u < that
 * fraction. e3m0 rounds between neighbouring levels 0, 2^-6, ..., 1 (times s)
 * in linear value (below 2^-6: between 0 and 2^-6). bf16 is round-to-nearest-
 * even. topk keeps the k largest |y| of each block (ties: the lower index)
 * as exact fp32 values. A block whose absmax is 0 (or so small that absmax /
 * top underflows to 0) has scale 0 and all-zero codes; its r is then y. */
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
/* "nearest", "stochastic"; "unknown" otherwise. */
const char *dl_codec_rounding_name(int rounding);

/* A learner's push codec from its option rows (push_codec, push_block,
 * push_topk, push_rounding): checked as a whole (block even, topk at most half
 * a block: 6 bytes per entry would make a chunk larger than the fp32 one, and
 * dl_codec_check), one DL_EINVAL naming the row otherwise. */
int dl_codec_push_opts(const char *codec, long long block, long long topk, const char *rounding, dl_codec *out,
                       dl_codec_rounding *rounding_out);

/* Encode x[0, n) -- elements [first, first + n) of a fragment; for block
 * codecs `first` is a multiple of the block size -- into out,
 * dl_codec_bytes(&e->c, n) bytes. r: NULL, or n floats of error-feedback
 * residual, read and then overwritten as above. out must not overlap x or r.
 * n == 0 writes nothing and returns 0. Returns 0, or DL_EINVAL naming the
 * element: a non-finite y, a bf16 y that rounds beyond bf16's largest
 * finite value; or an invalid codec, rounding, or `first` off a block (out
 * and r are then unspecified). */
int dl_codec_encode(const dl_codec_enc *e, const float *x, float *r, uint64_t n, uint64_t first, uint8_t *out);

/* The synchronizer's delta Update of one fragment, tile by tile so that each
 * tile's arrays are read from memory once: x = next - base (fp32), the
 * payload = the encoding of y = x + r (r = r_in, or zeros when r_in is NULL)
 * into out (dl_codec_bytes(&e->c, n) bytes), r_out = r after the encode (NULL:
 * not kept), and next = base + decode(payload) in place. The same bits as
 *   x = next - base; r = a copy of r_in (or zeros); dl_codec_encode(e, x, r, n, 0, out);
 *   dl_codec_decode_add(&e->c, out, len, n, base, next); r_out = r
 * (tests/test_codec.c checks it). r_out must not overlap r_in, next or base.
 * Returns 0, dl_codec_encode's DL_EINVAL naming the element (the fragment's
 * index), or DL_ENOMEM for a tile's scratch; next, r_out and out are then
 * unspecified. */
int dl_codec_encode_step(const dl_codec_enc *e, float *next, const float *base, const float *r_in, float *r_out,
                         uint64_t n, uint8_t *out);

/* Decode len bytes holding n elements into out[0, n). Everything is
 * checked: len == dl_codec_bytes(c, n), every scale finite and >= 0, every
 * fp32/bf16/topk value finite, topk indices strictly increasing and inside
 * their block, and no code an encoder never writes: int8 -128, the nibble 8
 * (int4 -8, e3m0 negative zero), a non-zero padding nibble after an odd
 * block. Returns 0 or DL_EINVAL with the reason (naming the first bad block
 * or element, e.g. "int4 block 3: scale -1 is negative") in dl_errmsg(); out
 * is unspecified on error. n == 0 with len == 0 is valid and a no-op. */
int dl_codec_decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, float *out);

/* out[i] = base[i] + decode(in)[i], one fp32 add per element (out may be
 * base). Same checks as dl_codec_decode; on error out is unchanged. */
int dl_codec_decode_add(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, const float *base,
                        float *out);

#endif
