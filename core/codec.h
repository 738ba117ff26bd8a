/* Tensor codecs of the wire: ids, names, parameters and payload sizes.
 *
 * This is the one description of a payload's layout that the protocol
 * (proto/wire.c: a frame's length must be exactly dl_codec_bytes), the
 * learner (encode with error feedback) and the synchronizer (decode, the
 * quantized downlink) share. The numeric encode/decode kernels live in
 * kernels/codec.{c,h} (CPU) and kernels/cuda/ (CUDA twins); nothing here
 * touches a float.
 *
 * Ids are the protocol's numbers (proto/dloco.proto enum Codec). A payload
 * holds n consecutive elements of a fragment starting at element `first`;
 * for the block codecs `first` is a multiple of the block size b (a chunk
 * of a transfer starts on a block), so every block of b elements (the last
 * one may be shorter: b_j = min(b, n - j*b)) is encoded on its own and a
 * block-aligned range of a payload is the payload of that range. All
 * multi-byte values are little-endian.
 *
 *   FP32  4n bytes: IEEE-754 binary32.
 *   BF16  2n bytes: binary32 rounded to nearest-even to its upper 16 bits.
 *   INT8  per block: fp32 scale s (absmax / 127), then b_j int8 q in [-127, 127]: x ~ q*s.
 *   INT4  per block: fp32 scale s (absmax / 7), then ceil(b_j/2) bytes of two's-complement
 *         nibbles q in [-7, 7], element 2i in the low nibble of byte i: x ~ q*s.
 *   E3M0  per block (Streaming DiLoCo's 4-bit sign + 3-bit exponent, no mantissa):
 *         fp32 scale s (absmax), then ceil(b_j/2) bytes of nibbles (low nibble first):
 *         bit 3 sign, bits 0-2 e; e = 0 is zero, e in 1..7 is s * 2^(e-7).
 *   TOPK  per block: k_j = min(k, b_j) entries of (uint16 index within the block,
 *         fp32 value), indices strictly increasing; the other elements are zero.
 *
 * A scale is finite and >= 0; a decoder refuses anything else, an index out
 * of its block or out of order, a non-finite value, a code no encoder writes
 * (int8 -128, int4 -8, e3m0 8: a negative zero) and a non-zero padding
 * nibble after an odd last element (kernels/codec.h). */
#ifndef DL_CORE_CODEC_H
#define DL_CORE_CODEC_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    DL_CODEC_FP32 = 1,
    DL_CODEC_BF16 = 2,
    DL_CODEC_INT8 = 3,
    DL_CODEC_INT4 = 4,
    DL_CODEC_E3M0 = 5,
    DL_CODEC_TOPK = 6
} dl_codec_id;

#define DL_CODEC_N 7               /* ids are 1 .. DL_CODEC_N-1 */
#define DL_CODEC_BLOCK_MIN 16u     /* block codecs: elements per block, even */
#define DL_CODEC_BLOCK_MAX 65536u
#define DL_CODEC_BLOCK_DEFAULT 128u

typedef struct {
    dl_codec_id id;
    uint32_t block; /* block codecs: [DL_CODEC_BLOCK_MIN, DL_CODEC_BLOCK_MAX], even; 0 for fp32/bf16 */
    uint32_t topk;  /* TOPK: entries per block, [1, block]; 0 for the others */
} dl_codec;

/* 1 for INT8, INT4, E3M0 and TOPK (they carry a block size). */
int dl_codec_is_block(dl_codec_id id);
/* "fp32", "bf16", "int8", "int4", "e3m0", "topk"; "unknown" otherwise. */
const char *dl_codec_name(int id);
/* Name -> id; DL_EINVAL (dl_errmsg lists the valid names) for anything else. */
int dl_codec_parse(const char *name, dl_codec_id *out);
/* 0 when c's id is known and block/topk are valid for it (as above), else
 * DL_EINVAL with a one-line reason in why (and dl_errmsg()). */
int dl_codec_check(const dl_codec *c, char *why, size_t cap);
/* Bytes of a payload of n elements (a block-aligned range for block codecs);
 * 0 when there is no valid size: n 0, c invalid, or a size beyond 2^62. */
uint64_t dl_codec_bytes(const dl_codec *c, uint64_t n);
/* Elements of a chunk whose payload fills at most `bytes`: as many whole
 * blocks as fit for a block codec (a chunk starts on a block and holds whole
 * blocks: proto/wire.c), as many elements as fit otherwise; 0 when not one
 * block (element) fits or c is invalid. A chunk is sized in bytes on the wire
 * whatever it carries (docs/PROTOCOL.md "Chunks"). */
uint64_t dl_codec_chunk_numel(const dl_codec *c, uint64_t bytes);
/* Bits per element of a whole-fragment payload of n elements (for reports). */
double dl_codec_bits(const dl_codec *c, uint64_t n);

#endif
