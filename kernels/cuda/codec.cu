/* CUDA twins of kernels/codec.c: encode with error feedback and checked
 * decode / decode_add of the wire codecs, bit-identical to the CPU.
 *
 * The per-element arithmetic is kernels/codec_elem.h, shared with the CPU
 * (__fmul_rn & co., so nothing is contracted into an FMA; this file is also
 * compiled with -fmad=false). Block codecs run one warp per block: absmax
 * and topk's counts are warp reductions, topk's ordered selection uses
 * ballots. A fault found on the device is reduced to its lowest element /
 * item with atomicMin into one word; the host reads it back and lets the CPU
 * code (dl_codec_item_check_, dl_codec_enc_fail_) write the same message. */
#include "kernels/cuda/internal.h"

#include <cassert>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" {
#include "core/codec.h"
#include "core/err.h"
#include "kernels/codec.h"
}
#include "kernels/codec_elem.h"
#include "kernels/cuda/codec.h"

/* Warps per CUDA block of the warp-per-codec-block kernels. */
#define DL_CX_WARPS 8
#define DL_CX_NONE 0xffffffffffffffffull

/* ---- device helpers */

__device__ static inline float ld_f(const uint8_t *p)
{
    return __uint_as_float((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}
__device__ static inline void st_f(uint8_t *p, float f)
{
    uint32_t b = __float_as_uint(f);
    p[0] = (uint8_t)b, p[1] = (uint8_t)(b >> 8), p[2] = (uint8_t)(b >> 16), p[3] = (uint8_t)(b >> 24);
}
__device__ static inline uint16_t ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
__device__ static inline void st_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

__device__ static inline uint32_t warp_max_u(uint32_t v)
{
    for (int off = 16; off > 0; off >>= 1) {
        uint32_t o = __shfl_xor_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    return v;
}
__device__ static inline uint32_t warp_sum_u(uint32_t v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ static inline float y_at(const float *x, const float *r, uint64_t i)
{
    return r ? __fadd_rn(x[i], r[i]) : x[i];
}

__device__ static inline bool finite_f(float f) { return DL_CX_ABS_BITS(__float_as_uint(f)) <= DL_CX_FINITE_MAX; }

/* One warp over block [i0, i0 + bj): the bits of max |y| (every lane gets
 * it). Above DL_CX_FINITE_MAX the block holds a non-finite y, whose lowest
 * element index is then recorded in *bad (as the CPU reports it). */
__device__ static inline uint32_t block_absmax_bits(const float *xj, const float *rj, uint64_t bj, int lane,
                                                    uint64_t i0, unsigned long long *bad)
{
    uint32_t m = 0;
    for (uint64_t i = lane; i < bj; i += 32) {
        uint32_t k = DL_CX_ABS_BITS(__float_as_uint(y_at(xj, rj, i)));
        m = k > m ? k : m;
    }
    m = warp_max_u(m);
    if (m > DL_CX_FINITE_MAX)
        for (uint64_t i = lane; i < bj; i += 32)
            if (!finite_f(y_at(xj, rj, i))) atomicMin(bad, (unsigned long long)(2 * (i0 + i)));
    return m;
}

/* Launch shape of the warp-per-item kernels. */
static inline unsigned warp_grid(uint64_t items)
{
    uint64_t b = (items + DL_CX_WARPS - 1) / DL_CX_WARPS;
    const uint64_t cap = (uint64_t)1 << 20;
    return (unsigned)(b < cap ? b : cap);
}

/* ---- encode */

/* fp32 and bf16, one thread per element. A fault: atomicMin of 2 * element + why. */
static __global__ void enc_flat_kernel(int id, const float *x, float *r, uint64_t n, uint8_t *out,
                                       unsigned long long *bad)
{
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float y = y_at(x, r, i);
        if (!finite_f(y)) {
            atomicMin(bad, (unsigned long long)(2 * i));
            continue;
        }
        if (id == DL_CODEC_FP32) {
            st_f(out + 4 * i, y);
            if (r) r[i] = 0.0f;
        } else {
            uint16_t h = dl_cx_bf16(y);
            if ((h & 0x7f80u) == 0x7f80u) {
                atomicMin(bad, (unsigned long long)(2 * i + 1));
                continue;
            }
            st_u16(out + 2 * i, h);
            if (r) r[i] = __fsub_rn(y, dl_cx_bf16_value(h));
        }
    }
}

/* int8 / int4 / e3m0: one warp per block. */
static __global__ void enc_scaled_kernel(int id, const float *x, float *r, uint64_t n, uint64_t b, uint64_t nb,
                                         uint64_t first, int st, uint64_t seed, uint8_t *out,
                                         unsigned long long *bad)
{
    int lane = threadIdx.x & 31;
    uint64_t w = (uint64_t)blockIdx.x * DL_CX_WARPS + (threadIdx.x >> 5), nw = (uint64_t)gridDim.x * DL_CX_WARPS;
    uint64_t stride = dl_cx_item_bytes(id, 0, b);
    for (uint64_t j = w; j < nb; j += nw) {
        uint64_t i0 = j * b, bj = n - i0 < b ? n - i0 : b;
        const float *xj = x + i0;
        float *rj = r ? r + i0 : NULL;
        uint8_t *o = out + j * stride;
        uint32_t m = block_absmax_bits(xj, rj, bj, lane, i0, bad);
        if (m > DL_CX_FINITE_MAX) continue;
        float a = __uint_as_float(m);
        float s = id == DL_CODEC_INT8   ? __fdiv_rn(a, (float)DL_CX_INT8_TOP)
                  : id == DL_CODEC_INT4 ? __fdiv_rn(a, (float)DL_CX_INT4_TOP)
                                        : a;
        if (lane == 0) st_f(o, s);
        uint8_t *q = o + 4;
        if (id == DL_CODEC_INT8) {
            for (uint64_t i = lane; i < bj; i += 32) {
                float y = y_at(xj, rj, i);
                float u = st ? dl_cx_uniform(seed, first + i0 + i) : 0.0f;
                int l = s == 0.0f ? 0 : dl_cx_int_level(fabsf(y), s, DL_CX_INT8_TOP, st, u);
                int qi = y < 0.0f ? -l : l;
                q[i] = (uint8_t)(int8_t)qi;
                if (rj) rj[i] = __fsub_rn(y, __fmul_rn((float)qi, s));
            }
            continue;
        }
        for (uint64_t p = lane; 2 * p < bj; p += 32) {
            unsigned byte = 0;
            for (int h = 0; h < 2; h++) {
                uint64_t i = 2 * p + h;
                if (i >= bj) break;
                float y = y_at(xj, rj, i);
                float u = st ? dl_cx_uniform(seed, first + i0 + i) : 0.0f;
                unsigned nib;
                float v;
                if (id == DL_CODEC_INT4) {
                    int l = s == 0.0f ? 0 : dl_cx_int_level(fabsf(y), s, DL_CX_INT4_TOP, st, u);
                    int qi = y < 0.0f ? -l : l;
                    nib = (unsigned)qi & 0xfu;
                    v = __fmul_rn((float)qi, s);
                } else {
                    int l = s == 0.0f ? 0 : dl_cx_e3m0_level(fabsf(y), s, st, u);
                    nib = dl_cx_e3m0_nib(l, y);
                    v = dl_cx_e3m0_value(nib, s);
                }
                byte |= nib << (4 * h);
                if (rj) rj[i] = __fsub_rn(y, v);
            }
            q[p] = (uint8_t)byte;
        }
    }
}

/* number of keys >= t in the block, on every lane */
__device__ static inline uint32_t warp_count_ge(const float *x, const float *r, uint64_t bj, uint32_t t, int lane)
{
    uint32_t c = 0;
    for (uint64_t i = lane; i < bj; i += 32) c += DL_CX_ABS_BITS(__float_as_uint(y_at(x, r, i))) >= t;
    return warp_sum_u(c);
}

/* topk: one warp per block; the threshold as on the CPU (octaves, then bisection), then
 * the block in chunks of 32 in index order: ballots give each lane the rank
 * of its tie and its place in the payload. */
static __global__ void enc_topk_kernel(const float *x, float *r, uint64_t n, uint64_t b, uint64_t nb, uint32_t topk,
                                       uint8_t *out, unsigned long long *bad)
{
    int lane = threadIdx.x & 31;
    uint32_t lt = (1u << lane) - 1u;
    uint64_t w = (uint64_t)blockIdx.x * DL_CX_WARPS + (threadIdx.x >> 5), nw = (uint64_t)gridDim.x * DL_CX_WARPS;
    uint64_t stride = dl_cx_item_bytes(DL_CODEC_TOPK, topk, b);
    for (uint64_t j = w; j < nb; j += nw) {
        uint64_t i0 = j * b, bj = n - i0 < b ? n - i0 : b;
        const float *xj = x + i0;
        float *rj = r ? r + i0 : NULL;
        uint8_t *o = out + j * stride;
        uint32_t m = block_absmax_bits(xj, rj, bj, lane, i0, bad);
        if (m > DL_CX_FINITE_MAX) continue;
        uint32_t k = (uint32_t)(bj < topk ? bj : topk);
        uint32_t lo = 0, hi = m;
        /* as the CPU: down from absmax by octaves, then bisection (the same set either way) */
        for (uint32_t d = 1u << 23; lo < hi && d <= (8u << 23); d += 1u << 23) {
            uint32_t t = hi > d ? m - d : 0;
            uint32_t cnt = warp_count_ge(xj, rj, bj, t, lane);
            if (cnt >= k) {
                lo = t;
                if (cnt == k) hi = t;
                break;
            }
            hi = t - 1;
        }
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo + 1) / 2;
            uint32_t cnt = warp_count_ge(xj, rj, bj, mid, lane);
            if (cnt >= k) lo = mid;
            if (cnt == k) break; /* exactly k keys >= mid: the same set as the k-th largest key gives */
            if (cnt < k) hi = mid - 1;
        }
        uint32_t ties = k - warp_count_ge(xj, rj, bj, lo + 1, lane), wpos = 0, seen = 0;
        for (uint64_t c0 = 0; c0 < bj; c0 += 32) {
            uint64_t i = c0 + lane;
            bool valid = i < bj;
            float y = valid ? y_at(xj, rj, i) : 0.0f;
            uint32_t key = DL_CX_ABS_BITS(__float_as_uint(y));
            bool eq = valid && key == lo;
            uint32_t eqm = __ballot_sync(0xffffffffu, eq);
            bool keep = valid && (key > lo || (eq && seen + __popc(eqm & lt) < ties));
            uint32_t km = __ballot_sync(0xffffffffu, keep);
            if (keep) {
                uint8_t *e = o + 6 * (uint64_t)(wpos + __popc(km & lt));
                st_u16(e, (uint16_t)i);
                st_f(e + 2, y);
            }
            if (valid && rj) rj[i] = keep ? 0.0f : y;
            wpos += __popc(km);
            seen += __popc(eqm);
        }
    }
}

extern "C" int dl_cuda_codec_encode(const dl_codec_enc *e, const float *x, float *r, uint64_t n, uint64_t first,
                                    uint8_t *out)
{
    int rc = dl_codec_enc_args_(e, n, first);
    if (rc) return rc < 0 ? rc : 0;
    assert(x && out);
    const dl_codec *c = &e->c;
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    void *work;
    DL_TRY(dl_cuda_ctx_work(ctx, sizeof(unsigned long long), &work));
    unsigned long long *bad = (unsigned long long *)work, hbad;
    DL_CUDA_CHECK(cudaMemset(bad, 0xff, sizeof *bad));
    uint64_t b = c->block, nb = b ? (n + b - 1) / b : 0;
    switch (c->id) {
    case DL_CODEC_FP32:
    case DL_CODEC_BF16: enc_flat_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(c->id, x, r, n, out, bad); break;
    case DL_CODEC_TOPK:
        enc_topk_kernel<<<warp_grid(nb), 32 * DL_CX_WARPS>>>(x, r, n, b, nb, c->topk, out, bad);
        break;
    default:
        enc_scaled_kernel<<<warp_grid(nb), 32 * DL_CX_WARPS>>>(c->id, x, r, n, b, nb, first,
                                                               e->rounding == DL_ROUND_STOCHASTIC, e->seed, out, bad);
        break;
    }
    DL_CUDA_CHECK_LAUNCH();
    DL_CUDA_CHECK(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost));
    if (hbad == DL_CX_NONE) return 0;
    /* the faulty element's r is untouched (its block / element was skipped) */
    uint64_t i = hbad / 2;
    float hx, hr = 0.0f;
    DL_CUDA_CHECK(cudaMemcpy(&hx, x + i, sizeof hx, cudaMemcpyDeviceToHost));
    if (r) DL_CUDA_CHECK(cudaMemcpy(&hr, r + i, sizeof hr, cudaMemcpyDeviceToHost));
    return dl_codec_enc_fail_(c, hbad, first, hx, r ? hx + hr : hx);
}

/* ---- decode: a checking kernel (the lowest bad item, atomicMin), then the decoding kernel */

static __global__ void check_flat_kernel(int id, const uint8_t *in, uint64_t n, unsigned long long *bad)
{
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        bool ok = id == DL_CODEC_FP32 ? finite_f(ld_f(in + 4 * i)) : (ld_u16(in + 2 * i) & 0x7f80u) != 0x7f80u;
        if (!ok) atomicMin(bad, (unsigned long long)(i / DL_CX_FLAT_CHUNK));
    }
}

static __global__ void check_block_kernel(int id, const uint8_t *in, uint64_t n, uint64_t b, uint64_t nb,
                                          uint32_t topk, unsigned long long *bad)
{
    int lane = threadIdx.x & 31;
    uint64_t w = (uint64_t)blockIdx.x * DL_CX_WARPS + (threadIdx.x >> 5), nw = (uint64_t)gridDim.x * DL_CX_WARPS;
    uint64_t stride = dl_cx_item_bytes(id, topk, b);
    for (uint64_t j = w; j < nb; j += nw) {
        uint64_t i0 = j * b, bj = n - i0 < b ? n - i0 : b;
        const uint8_t *p = in + j * stride;
        bool fault = false;
        if (id == DL_CODEC_TOPK) {
            uint64_t k = bj < topk ? bj : topk;
            for (uint64_t e = lane; e < k; e += 32) {
                uint32_t ix = ld_u16(p + 6 * e);
                fault |= ix >= bj || (e > 0 && ix <= ld_u16(p + 6 * (e - 1))) || !finite_f(ld_f(p + 6 * e + 2));
            }
        } else {
            float s = ld_f(p);
            if (lane == 0) fault |= !(finite_f(s) && s >= 0.0f);
            const uint8_t *q = p + 4;
            if (id == DL_CODEC_INT8) {
                for (uint64_t i = lane; i < bj; i += 32) fault |= q[i] == 0x80u;
            } else {
                uint64_t bytes = (bj + 1) / 2;
                for (uint64_t i = lane; i < bytes; i += 32) {
                    unsigned lo = q[i] & 0xfu, hi = q[i] >> 4;
                    fault |= lo == 8u || (2 * i + 1 < bj ? hi == 8u : hi != 0u);
                }
            }
        }
        if (__any_sync(0xffffffffu, fault) && lane == 0) atomicMin(bad, (unsigned long long)j);
    }
}

/* fp32 / bf16: one thread per element */
static __global__ void dec_flat_kernel(int id, const uint8_t *in, uint64_t n, const float *base, float *out)
{
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = id == DL_CODEC_FP32 ? ld_f(in + 4 * i) : dl_cx_bf16_value(ld_u16(in + 2 * i));
        out[i] = base ? __fadd_rn(base[i], v) : v;
    }
}

/* int8 / int4 / e3m0: one warp per block (no 64-bit division per element);
 * int4/e3m0 lanes take a byte, two elements, each */
static __global__ void dec_scaled_kernel(int id, const uint8_t *in, uint64_t n, uint64_t b, uint64_t nb,
                                         const float *base, float *out)
{
    int lane = threadIdx.x & 31;
    uint64_t w = (uint64_t)blockIdx.x * DL_CX_WARPS + (threadIdx.x >> 5), nw = (uint64_t)gridDim.x * DL_CX_WARPS;
    uint64_t stride = dl_cx_item_bytes(id, 0, b);
    for (uint64_t j = w; j < nb; j += nw) {
        uint64_t i0 = j * b, bj = n - i0 < b ? n - i0 : b;
        const uint8_t *p = in + j * stride, *q = p + 4;
        float s = ld_f(p);
        const float *bs = base ? base + i0 : NULL;
        float *o = out + i0;
        if (id == DL_CODEC_INT8) {
            for (uint64_t i = lane; i < bj; i += 32) {
                float v = __fmul_rn((float)(int8_t)q[i], s);
                o[i] = bs ? __fadd_rn(bs[i], v) : v;
            }
            continue;
        }
        for (uint64_t t = lane; 2 * t < bj; t += 32) {
            unsigned byte = q[t];
            for (int h = 0; h < 2 && 2 * t + h < bj; h++) {
                unsigned nib = (byte >> (4 * h)) & 0xfu;
                float v = id == DL_CODEC_E3M0 ? dl_cx_e3m0_value(nib, s) : __fmul_rn((float)dl_cx_nib_int(nib), s);
                uint64_t i = 2 * t + h;
                o[i] = bs ? __fadd_rn(bs[i], v) : v;
            }
        }
    }
}

/* topk: one warp per block, chunks of 32 elements; the chunk's entries are
 * spread into a per-warp table in shared memory, then every lane adds its own. */
static __global__ void dec_topk_kernel(const uint8_t *in, uint64_t n, uint64_t b, uint64_t nb, uint32_t topk,
                                       const float *base, float *out)
{
    __shared__ float val[DL_CX_WARPS][32];
    __shared__ unsigned hit[DL_CX_WARPS];
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    uint64_t w = (uint64_t)blockIdx.x * DL_CX_WARPS + wi, nw = (uint64_t)gridDim.x * DL_CX_WARPS;
    uint64_t stride = dl_cx_item_bytes(DL_CODEC_TOPK, topk, b);
    for (uint64_t j = w; j < nb; j += nw) {
        uint64_t i0 = j * b, bj = n - i0 < b ? n - i0 : b, k = bj < topk ? bj : topk, e0 = 0;
        const uint8_t *p = in + j * stride;
        for (uint64_t c0 = 0; c0 < bj; c0 += 32) {
            /* entries e0.. with an index in [c0, c0 + 32): at most 32 (strictly increasing) */
            uint64_t e = e0 + lane;
            bool mine = e < k && ld_u16(p + 6 * e) < c0 + 32;
            uint32_t mm = __ballot_sync(0xffffffffu, mine);
            if (lane == 0) hit[wi] = 0;
            __syncwarp();
            if (mine) {
                unsigned t = ld_u16(p + 6 * e) - (unsigned)c0;
                val[wi][t] = ld_f(p + 6 * e + 2);
                atomicOr(&hit[wi], 1u << t);
            }
            __syncwarp();
            uint64_t i = c0 + lane;
            if (i < bj) {
                float v = (hit[wi] >> lane) & 1u ? val[wi][lane] : 0.0f;
                out[i0 + i] = base ? __fadd_rn(base[i0 + i], v) : v;
            }
            e0 += __popc(mm);
            __syncwarp();
        }
    }
}

static int cuda_decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, const float *base, float *out)
{
    int rc = dl_codec_dec_args_(c, len, n);
    if (rc) return rc < 0 ? rc : 0;
    assert(in && out);
    dl_cuda_ctx *ctx;
    DL_TRY(dl_cuda_ctx_get(&ctx));
    void *work;
    DL_TRY(dl_cuda_ctx_work(ctx, sizeof(unsigned long long), &work));
    unsigned long long *bad = (unsigned long long *)work, hbad;
    DL_CUDA_CHECK(cudaMemset(bad, 0xff, sizeof *bad));
    int blockc = dl_codec_is_block(c->id);
    uint64_t b = blockc ? c->block : DL_CX_FLAT_CHUNK, nb = (n + b - 1) / b;
    if (blockc)
        check_block_kernel<<<warp_grid(nb), 32 * DL_CX_WARPS>>>(c->id, in, n, b, nb, c->topk, bad);
    else
        check_flat_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(c->id, in, n, bad);
    DL_CUDA_CHECK_LAUNCH();
    DL_CUDA_CHECK(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost));
    if (hbad != DL_CX_NONE) {
        /* the CPU names the fault of that item, from a host copy of its bytes */
        uint64_t j = hbad, i0 = j * b, bj = n - i0 < b ? n - i0 : b;
        uint64_t stride = dl_cx_item_bytes(c->id, c->topk, b), ib = dl_cx_item_bytes(c->id, c->topk, bj);
        std::vector<uint8_t> item(ib);
        DL_CUDA_CHECK(cudaMemcpy(item.data(), in + j * stride, ib, cudaMemcpyDeviceToHost));
        rc = dl_codec_item_check_(c, j, bj, item.data());
        if (rc < 0) return rc;
        return dl_err(DL_ECUDA, "%s decode: the device refused item %llu, the CPU accepts it", dl_codec_name(c->id),
                      (unsigned long long)j);
    }
    if (c->id == DL_CODEC_TOPK)
        dec_topk_kernel<<<warp_grid(nb), 32 * DL_CX_WARPS>>>(in, n, b, nb, c->topk, base, out);
    else if (blockc)
        dec_scaled_kernel<<<warp_grid(nb), 32 * DL_CX_WARPS>>>(c->id, in, n, b, nb, base, out);
    else
        dec_flat_kernel<<<dl_cuda_grid(n), DL_CUDA_BLOCK>>>(c->id, in, n, base, out);
    DL_CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int dl_cuda_codec_decode(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n, float *out)
{
    return cuda_decode(c, in, len, n, NULL, out);
}

extern "C" int dl_cuda_codec_decode_add(const dl_codec *c, const uint8_t *in, size_t len, uint64_t n,
                                        const float *base, float *out)
{
    assert(base || n == 0);
    return cuda_decode(c, in, len, n, base, out);
}
