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
 * enclosing int-returning function returns DL_ENODEV/DL_ECUDA with
 * "file:line: call: message" recorded via dl_err(). The caller must include
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

/* Use TF32 tensor cores for fp32 matmuls (process-wide, default 0 = exact
 * fp32 compute; TF32 has a 10-bit mantissa, ~1e-3 relative error). */
void dl_cuda_set_tf32(int on);

/* Wait for all queued work on the current device; reports errors raised by
 * kernels that already ran. */
int dl_cuda_sync(void);

/* Free this thread's cuBLAS handle and scratch buffer; safe to call twice and
 * on threads that never used CUDA. The next kernel call recreates them. */
void dl_cuda_thread_release(void);

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
/* delta = base - theta, bit-identical to the CPU. */
int dl_cuda_pseudograd(float *delta, const float *base, const float *theta, size_t n);
/* out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be NULL), cuBLAS
 * sgemm with fp32 compute (TF32 when dl_cuda_set_tf32(1)). N, IC, OC > 0. */
int dl_cuda_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);

#ifdef __cplusplus
}
#endif

#endif
