/* CUDA twins of the wire codecs of kernels/codec.h: the same arguments on
 * device pointers, the same bytes and the same floats (tests/test_cuda_codec.c).
 *
 * Plain C header, like kernels/cuda/cuda.h. Each call checks its arguments
 * and reports a refused input exactly as the CPU does (same DL_EINVAL, same
 * dl_errmsg() text); it synchronizes the device once to read the verdict of
 * the checks (a 4- or 8-byte copy), so the host knows the result on return.
 * CUDA failures are DL_ENODEV / DL_ECUDA as in cuda.h. Work is queued on the
 * legacy default stream. */
#ifndef DL_KERNELS_CUDA_CODEC_H
#define DL_KERNELS_CUDA_CODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/codec.h"

/* dl_codec_encode on the device: x, r (NULL or n floats) and out
 * (dl_codec_bytes(&e->c, n) bytes) are device pointers; e is a host pointer.
 * Nearest and stochastic rounding give the CPU's bytes, and r the CPU's
 * residual, bit for bit. On DL_EINVAL out and r are unspecified. */
int dl_cuda_codec_encode(const dl_codec_enc *e, const float *x, float *r, uint64_t n, uint64_t first, uint8_t *out);

/* dl_codec_decode on the device: in (len bytes) and out are device pointers. */
int dl_cuda_codec_decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, float *out);

/* dl_codec_decode_add on the device (in, base, out device pointers; out may
 * be base): out = base + decode, the CPU's bits. Every check runs before
 * anything is written, so out is unchanged on DL_EINVAL. */
int dl_cuda_codec_decode_add(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, const float *base,
                             float *out);

#ifdef __cplusplus
}
#endif

#endif
