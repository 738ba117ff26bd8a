/* Private to kernels/codec.c and kernels/cuda/codec.cu: the per-element
 * arithmetic of the codecs, written once so the CPU and the GPU round alike.
 *
 * Every fp32 operation goes through DL_CX_MUL/ADD/SUB/DIV: plain operators in
 * C (codec.c is compiled with -ffp-contract=off), __fmul_rn & co. in device
 * code (no contraction into FMA, IEEE division), so both sides produce the
 * same bits. Only integer and exactly-representable operations otherwise. */
#ifndef DL_KERNELS_CODEC_ELEM_H
#define DL_KERNELS_CODEC_ELEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DL_CX_FN static __device__ __forceinline__
#define DL_CX_HD static __host__ __device__ __forceinline__
#define DL_CX_MUL(a, b) __fmul_rn((a), (b))
#define DL_CX_ADD(a, b) __fadd_rn((a), (b))
#define DL_CX_SUB(a, b) __fsub_rn((a), (b))
#define DL_CX_DIV(a, b) __fdiv_rn((a), (b))
DL_CX_FN uint32_t dl_cx_bits(float f) { return __float_as_uint(f); }
DL_CX_FN float dl_cx_float(uint32_t b) { return __uint_as_float(b); }
#else
#include <string.h>
#define DL_CX_FN static inline
#define DL_CX_HD static inline
#define DL_CX_MUL(a, b) ((a) * (b))
#define DL_CX_ADD(a, b) ((a) + (b))
#define DL_CX_SUB(a, b) ((a) - (b))
#define DL_CX_DIV(a, b) ((a) / (b))
DL_CX_FN uint32_t dl_cx_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}
DL_CX_FN float dl_cx_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}
#endif

/* Elements per work item of fp32/bf16 (they have no blocks): the unit of
 * parallel work and of "the first bad item" in decode. */
#define DL_CX_FLAT_CHUNK 4096u

/* Top level of each scaled codec: the scale is absmax / top. */
#define DL_CX_INT8_TOP 127
#define DL_CX_INT4_TOP 7

/* |f| as ordered bits: for finite values and infinities the unsigned order of
 * these keys is the order of |f|; any NaN is above +inf (0x7f800000). */
#define DL_CX_ABS_BITS(b) ((b) & 0x7fffffffu)
#define DL_CX_FINITE_MAX 0x7f7fffffu

/* The stochastic-rounding uniform of element idx (its index in the fragment):
 * the top 24 bits of splitmix64(seed ^ idx * golden), times 2^-24, so a
 * value in [0, 1) on a grid of 2^-24, exactly the same on CPU and GPU. */
DL_CX_FN float dl_cx_uniform(uint64_t seed, uint64_t idx)
{
    uint64_t z = seed ^ (idx * 0x9e3779b97f4a7c15ull);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(uint32_t)(z >> 40) * 0x1p-24f;
}

/* int8/int4 magnitude: t = ay / s (ay = |y| <= absmax, s > 0); floor(t)
 * (truncation: t >= 0 and small), one up when the fraction is >= 1/2
 * (nearest: ties away from zero) or when u < fraction (stochastic: E = t);
 * at most top. */
DL_CX_FN int dl_cx_int_level(float ay, float s, int top, int stochastic, float u)
{
    float t = DL_CX_DIV(ay, s);
    int f = (int)t;
    float frac = DL_CX_SUB(t, (float)f); /* exact: f <= t < 2^23 */
    int q = f + (stochastic ? (u < frac) : (frac >= 0.5f));
    return q > top ? top : q;
}

/* e3m0 exponent code 0..7 of t = ay / s in [0, 1]: the levels are 0 and
 * 2^(e-7). Between 2^(e-7) and 2^(e-6) the fraction is the mantissa (exact);
 * below 2^-6 (between 0 and the first level) it is t * 64 (exact). */
DL_CX_FN int dl_cx_e3m0_level(float ay, float s, int stochastic, float u)
{
    float t = DL_CX_DIV(ay, s);
    uint32_t b = dl_cx_bits(t);
    int E = (int)(b >> 23), low = E < 121; /* t < 2^-6 */
    int lo = low ? 0 : E - 120;
    float frac = low ? DL_CX_MUL(t, 64.0f) : DL_CX_SUB(dl_cx_float((b & 0x7fffffu) | 0x3f800000u), 1.0f);
    int e = lo + (stochastic ? (u < frac) : (frac >= 0.5f));
    return e > 7 ? 7 : e;
}

/* The e3m0 level of exponent code e (0..7): 0 or 2^(e-7), exact. */
DL_CX_FN float dl_cx_e3m0_unit(int e)
{
    return dl_cx_float(((uint32_t)(e + 120) << 23) & (0u - (uint32_t)(e != 0)));
}

/* Decoded value of an e3m0 nibble under scale s: +-s * 2^(e-7), or +0
 * (bit operations only, so the loops using it vectorise). */
DL_CX_FN float dl_cx_e3m0_value(unsigned nib, float s)
{
    float v = DL_CX_MUL(s, dl_cx_e3m0_unit((int)(nib & 7u)));
    return dl_cx_float(dl_cx_bits(v) ^ ((uint32_t)(nib & 8u) << 28));
}

/* The e3m0 nibble of y at exponent code e: sign bit only for e > 0. */
DL_CX_FN unsigned dl_cx_e3m0_nib(int e, float y)
{
    return (unsigned)e | (((unsigned)(e != 0) & (unsigned)(y < 0.0f)) << 3);
}

/* Two's-complement nibble -> -8..7. */
DL_CX_FN int dl_cx_nib_int(unsigned nib)
{
    return (int)(nib & 0xfu) - (int)((nib & 8u) << 1);
}

/* fp32 -> bf16, round to nearest even (finite input). */
DL_CX_FN uint16_t dl_cx_bf16(float f)
{
    uint32_t b = dl_cx_bits(f);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
DL_CX_FN float dl_cx_bf16_value(uint16_t h)
{
    return dl_cx_float((uint32_t)h << 16);
}

/* ---- work items: blocks of b elements (fp32/bf16: DL_CX_FLAT_CHUNK), the
 * last one b_j = n - j*b may be shorter; item j starts at byte j * stride.
 * ids are core/codec.h's (1 fp32, 2 bf16, 3 int8, 4 int4, 5 e3m0, 6 topk). */
DL_CX_HD uint64_t dl_cx_item_bytes(int id, uint64_t topk, uint64_t bj)
{
    switch (id) {
    case 1: return 4 * bj;
    case 2: return 2 * bj;
    case 3: return 4 + bj;
    case 4:
    case 5: return 4 + (bj + 1) / 2;
    case 6: return 6 * (bj < topk ? bj : topk);
    }
    return 0;
}

/* Host-side helpers of kernels/codec.c that the CUDA twins share, so both
 * backends refuse the same things with the same messages. */
#ifdef __cplusplus
extern "C" {
#endif
#include "kernels/codec.h"
/* Argument checks of dl_codec_encode (codec, rounding, first on a block,
 * size): 0 to go on, 1 when n == 0 (nothing to do), or DL_EINVAL. */
int dl_codec_enc_args_(const dl_codec_enc *e, uint64_t n, uint64_t first);
/* The DL_EINVAL of an element encode refuses: bad = 2 * element + why (0 y
 * not finite, 1 beyond bf16's range); x, y its x and y = x + r. */
int dl_codec_enc_fail_(const dl_codec *c, uint64_t bad, uint64_t first, float x, float y);
/* Argument checks of decode (codec, len == dl_codec_bytes): 0 to go on, 1
 * when n == 0 and len == 0, or DL_EINVAL. */
int dl_codec_dec_args_(const dl_codec *c, size_t len, uint64_t n);
/* 0 when work item j (its bytes at `item`, bj elements) is valid, else the
 * DL_EINVAL naming its first fault. */
int dl_codec_item_check_(const dl_codec *c, uint64_t j, uint64_t bj, const uint8_t *item);
#ifdef __cplusplus
}
#endif

#endif
