/* CUDA backend: device discovery, memory helpers, check macros, and CUDA twins
 * of the CPU reference kernels in kernels/cpu.h (same arguments, device pointers).
 *
 * Plain C header: it pulls in no CUDA header, so C code (learner, tests) can
 * include it and link dl_kernels_cuda without knowing about nvcc.
 *
 * Error convention (chosen over void + a last-error getter): every function
 * returns 0 or a negative code and records a detail with dl_err():
 *   DL_ENODEV  no usable device / no driver (cudaErrorNoDevice, ...InsufficientDriver)
 *   DL_ECUDA   any other CUDA or cuBLAS failure; the detail reads
 *              "file:line: <call>: <CUDA error string> (<error name>)".
 *
 * Streams: all work is queued on the legacy default stream of the current
 * device, in call order. Kernels are asynchronous: a launch error is reported
 * by the call itself, an error raised while the kernel runs is reported by the
 * next synchronizing call (dl_cuda_sync, dl_cuda_d2h, dl_cuda_sumsq).
 *
 * Per-thread state: each host thread lazily gets a cuBLAS handle and a small
 * reduction scratch buffer, bound to the device current at first use. Call
 * dl_cuda_thread_release() before a thread exits (or to switch devices). */
#ifndef DL_KERNELS_CUDA_H
#define DL_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu.h" /* dl_adamw_hp */

/* ---- check macros. `call` returns a cudaError_t (DL_CUDA_CHECK) or a
 * cublasStatus_t (DL_CUBLAS_CHECK); both are 0 on success. On failure the
 * enclosing int-returning function returns DL_ENODEV/DL_ECUDA with a message
 * for users recorded via dl_err() (what the call was doing, CUDA's reason, the
 * fix where there is one); "file:line: call" goes to the debug log. The caller must include
 * the CUDA header that declares `call`. */
#define DL_CUDA_CHECK(call)                                                    \
    do {                                                                       \
        int dl_cuda_rc_ = (int)(call);                                         \
        if (dl_cuda_rc_ != 0) return dl_cuda_fail_(dl_cuda_rc_, #call, __FILE__, __LINE__); \
    } while (0)
#define DL_CUBLAS_CHECK(call)                                                  \
    do {                                                                       \
        int dl_cublas_rc_ = (int)(call);                                       \
        if (dl_cublas_rc_ != 0) return dl_cublas_fail_(dl_cublas_rc_, #call, __FILE__, __LINE__); \
    } while (0)
/* After a <<<...>>> launch: reports bad launch configurations and missing
 * kernel images for this GPU (cudaGetLastError). */
#define DL_CUDA_CHECK_LAUNCH() DL_CUDA_CHECK(cudaGetLastError())

/* Record the failure (see above) and return DL_ENODEV or DL_ECUDA. `err` is a
 * cudaError_t / cublasStatus_t value. Used by the macros; rarely called directly. */
int dl_cuda_fail_(int err, const char *expr, const char *file, int line);
int dl_cublas_fail_(int status, const char *expr, const char *file, int line);

/* ---- device */

/* 1 when at least one CUDA device is usable by this build, else 0. Never
 * aborts: no driver, no device, or any CUDA error reads as 0 (the reason is
 * left in dl_errmsg()). Also 0 when the device cannot run our kernels (no
 * compatible SASS/PTX in the binary). Cheap enough to call at start-up, not
 * per step. */
int dl_cuda_available(void);

/* "NVIDIA H200 (sm_90, 139.8 GiB)" for the current device, truncated to cap-1
 * bytes and NUL-terminated (cap > 0). buf is "" on failure. */
int dl_cuda_device_name(char *buf, size_t cap);

/* Compute precision of every cuBLAS matmul (process-wide; operands, results
 * and the master weights stay fp32 in memory, accumulation is fp32):
 *   DL_MATMUL_FP32  CUBLAS_COMPUTE_32F, exact fp32 (the default here)
 *   DL_MATMUL_TF32  CUBLAS_COMPUTE_32F_FAST_TF32: tensor cores round the
 *                   operands to TF32 (10-bit mantissa), ~1e-3 relative error
 *   DL_MATMUL_BF16  CUBLAS_COMPUTE_32F_FAST_16BF: operands rounded to bf16
 *                   (7-bit mantissa) on the tensor cores, ~1e-2 relative error
 * An unknown value is API misuse (asserted). */
enum { DL_MATMUL_FP32 = 0, DL_MATMUL_TF32 = 1, DL_MATMUL_BF16 = 2 };
void dl_cuda_set_matmul(int precision);
int dl_cuda_get_matmul(void);
/* "fp32" | "tf32" | "bf16" (DL_MATMUL_*), "?" otherwise. */
const char *dl_cuda_matmul_name(int precision);

/* Wait for all queued work on the current device; reports errors raised by
 * kernels that already ran. */
int dl_cuda_sync(void);

/* Free this thread's cuBLAS handle and scratch buffer; safe to call twice and
 * on threads that never used CUDA. The next kernel call recreates them. */
void dl_cuda_thread_release(void);

/* ---- streams, events, pinned host memory: for copies that overlap the
 * compute. The handles ARE cudaStream_t / cudaEvent_t (same struct tags), so
 * .cu code may pass them to the runtime directly. A NULL stream is the legacy
 * default stream, where every kernel of this backend runs ("the compute
 * stream"). */
typedef struct CUstream_st *dl_cuda_stream;
typedef struct CUevent_st *dl_cuda_event;
/* A stream created with cudaStreamNonBlocking: it does not synchronize
 * implicitly with the legacy default stream; order it with events. */
int dl_cuda_stream_open(dl_cuda_stream *out);
/* Wait for the stream's work, destroy it, NULL the handle; NULL-safe. */
void dl_cuda_stream_close(dl_cuda_stream *s);
int dl_cuda_stream_sync(dl_cuda_stream s);
/* An event without timing (cudaEventDisableTiming). A never-recorded event
 * counts as complete. */
int dl_cuda_event_open(dl_cuda_event *out);
void dl_cuda_event_close(dl_cuda_event *e); /* NULLs the handle; NULL-safe */
/* Record e after the work queued so far on s. */
int dl_cuda_event_record(dl_cuda_event e, dl_cuda_stream s);
/* The host waits until the work before e's last record has finished. */
int dl_cuda_event_sync(dl_cuda_event e);
/* Work queued on s after this call waits for e on the device; the host does
 * not block. */
int dl_cuda_stream_wait(dl_cuda_stream s, dl_cuda_event e);
/* cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s): the direction
 * follows from the pointers (unified addressing). Asynchronous only for
 * pinned host memory (dl_cuda_host_alloc) and device memory. */
int dl_cuda_copy_async(void *dst, const void *src, size_t bytes, dl_cuda_stream s);
/* Page-locked host memory (cudaMallocHost); *out = NULL on failure. */
int dl_cuda_host_alloc(size_t bytes, void **out);
void dl_cuda_host_free(void **p); /* NULLs *p; NULL-safe */

/* ---- memory. Copies take (dst, src, bytes) in memcpy order and are
 * synchronous with respect to the host. */
int dl_cuda_malloc(size_t bytes, void **out);     /* *out = NULL on failure */
void dl_cuda_free(void **p);                      /* frees *p, sets *p = NULL; NULL-safe */
int dl_cuda_h2d(void *dst, const void *src, size_t bytes);
int dl_cuda_d2h(void *dst, const void *src, size_t bytes);
int dl_cuda_memset0(void *dst, size_t bytes);

/* ---- kernels: CUDA twins of kernels/cpu.h. All pointers are device
 * pointers unless said otherwise; `hp` is a host pointer. n == 0 is a no-op. */

/* AdamW step, same formula and operation order as dl_cpu_adamw (bias
 * corrections 1/(1-beta^t) computed on the host with powf, as the CPU does). */
int dl_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, const dl_adamw_hp *hp);
/* *out (HOST pointer) = sum of x[i]^2, each square and the whole reduction in
 * double. Deterministic for a given n (fixed grid, fixed reduction tree), but
 * the order differs from the CPU's, so expect ~1e-15 relative difference.
 * Synchronizes the device. */
int dl_cuda_sumsq(const float *x, size_t n, double *out);
/* dl_cpu_adamw_split on the device: ga, gb the two half-batch gradients, w
 * the noise moment; same formula and operation order. fleet >= 1. */
int dl_cuda_adamw_split(float *param, const float *ga, const float *gb, float *m, float *v, float *w, size_t n,
                        const dl_adamw_hp *hp, float fleet);
/* *out (HOST) = sum of ((a[i] + b[i]) / 2)^2 in double, as dl_cuda_sumsq
 * (deterministic, synchronizes): the norm of the split step's gradient. */
int dl_cuda_sumsq_mean2(const float *a, const float *b, size_t n, double *out);
/* delta = base - theta, bit-identical to the CPU. */
int dl_cuda_pseudograd(float *delta, const float *base, const float *theta, size_t n);
/* y = a*y + b*x as fmaf(a, y, b*x), bit-identical to dl_cpu_axpby; a == 0
 * writes y = b*x without reading y (a NaN in y does not survive). */
int dl_cuda_axpby(float *y, float a, const float *x, float b, size_t n);
/* out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be NULL), cuBLAS
 * GEMM with fp32 operands in the dl_cuda_set_matmul precision. N, IC, OC > 0. */
int dl_cuda_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);
/* dinp += dout @ w; dw += dout^T @ inp (cuBLAS, beta = 1); dbias += colsum(dout)
 * (dbias may be NULL) by a fixed-order two-pass column reduction. */
int dl_cuda_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                       int N, int IC, int OC);

/* out[B,T,C] = wte[inp[b,t]] + wpe[t]; inp is a device int32 array. Bit-identical to the CPU. */
int dl_cuda_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T, int C);
/* dwte += scatter of dout by token, dwpe += sum over b. V = rows of dwte
 * (every inp[i] < V; one block scans the batch per row): the extra argument
 * the CPU does not need. No atomics: same additions in the same (b, t) order
 * as the CPU, so the result is bit-identical. */
int dl_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C, int V);

/* layernorm over C, eps 1e-5, as dl_cpu_layernorm_fwd (one warp per row). */
int dl_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                          int N, int C);
/* dinp += ...; dw, db += fixed-order column reductions (deterministic). */
int dl_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                          const float *mean, const float *rstd, int N, int C);

/* Causal self-attention as dl_cpu_attention_fwd: qkv[B,T,3C], att[B,NH,T,T]
 * probabilities (zero above the diagonal), out[B,T,C]; scale 1/sqrt(C/NH).
 * cuBLAS strided-batched GEMMs over the heads of each batch row. */
int dl_cuda_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv += ...; scratch needs B*NH*T*T floats (overwritten). */
int dl_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B,
                          int T, int C, int NH);

/* GELU with the CPU's rational tanh (same coefficients); bwd: dinp += . */
int dl_cuda_gelu_fwd(float *out, const float *inp, size_t n);
int dl_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
/* out = a + b, bit-identical to the CPU. */
int dl_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n);

/* Softmax over V + cross-entropy, probs[N,V], losses[N] on the device; the
 * mean loss (double sum of the row losses, one fixed-order block) goes to the
 * HOST *mean_loss. targets is a device array with every entry < V (not
 * checked on the device). Synchronizes. */
int dl_cuda_softmax_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *targets, int N, int V,
                             double *mean_loss);
/* The same over rows of ld >= V floats (padded vocab): columns V..ld-1 of
 * probs are not written. */
int dl_cuda_softmax_xent_fwd_ld(float *probs, float *losses, const float *logits, const int32_t *targets, int N,
                                int V, int ld, double *mean_loss);
/* dlogits = (probs - onehot(target)) * dloss (overwrites, not +=). */
int dl_cuda_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int N, int V, float dloss);
/* Rows of ld >= V floats; columns V..ld-1 of dlogits are set to 0. */
int dl_cuda_softmax_xent_bwd_ld(float *dlogits, const float *probs, const int32_t *targets, int N, int V, int ld,
                                float dloss);

#ifdef __cplusplus
}
#endif

#endif
