/* CUDA runtime side of the backend: error recording for the check macros,
 * device discovery, memory helpers and the per-thread cuBLAS/scratch context. */
#include "kernels/cuda/internal.h"

#include <atomic>
#include <cassert>
#include <cstring>

extern "C" {
#include "core/log.h"
}

/* ---- errors */

static int dl_cuda_code(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable: return DL_ENODEV;
    default: return DL_ECUDA;
    }
}

/* What a failing CUDA call was doing, from its name, for users: the
 * expression and file:line go to the debug log only. */
static const char *dl_cuda_doing(const char *expr)
{
    static const struct {
        const char *prefix, *doing;
    } ops[] = {{"cudaGetDeviceCount", "looking for CUDA devices"},
               {"cudaFuncGetAttributes", "checking this build runs on the GPU"},
               {"cudaSetDevice", "selecting the GPU"},
               {"cudaGetDeviceProperties", "reading the GPU's properties"},
               {"cudaMalloc", "allocating GPU memory"},
               {"cudaFree", "freeing GPU memory"},
               {"cudaMemcpy", "copying between host and GPU memory"},
               {"cudaMemset", "clearing GPU memory"},
               {"cudaStream", "synchronising with the GPU"},
               {"cudaDeviceSynchronize", "synchronising with the GPU"},
               {"cudaHost", "pinning host memory"},
               {"cudaGetLastError", "running a GPU kernel"},
               {"cublas", "running a cuBLAS matrix multiply"}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strncmp(expr, ops[i].prefix, strlen(ops[i].prefix))) return ops[i].doing;
    return "making a CUDA call";
}

/* The fix for the errors a user can act on; "" otherwise. */
static const char *dl_cuda_fix(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable: return ": no usable CUDA device here; train on the CPU with --device cpu";
    case cudaErrorInsufficientDriver:
        return ": the NVIDIA driver is older than this build's CUDA; update the driver or use --device cpu";
    case cudaErrorStubLibrary: return ": no NVIDIA driver is installed; install it or use --device cpu";
    case cudaErrorMemoryAllocation: return ": out of GPU memory; use a smaller --batch or model";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return ": this build has no code for this GPU; rebuild with CMAKE_CUDA_ARCHITECTURES naming its "
               "compute capability";
    default: return "";
    }
}

extern "C" int dl_cuda_fail_(int err, const char *expr, const char *file, int line)
{
    cudaError_t e = (cudaError_t)err;
    /* Clear a non-sticky error so it is not reported again by the next
     * unrelated DL_CUDA_CHECK_LAUNCH(); sticky errors stay regardless. */
    (void)cudaGetLastError();
    DL_DEBUG("%s:%d: %s: %s", file, line, expr, cudaGetErrorName(e));
    return dl_err(dl_cuda_code(e), "CUDA error while %s: %s (%s)%s", dl_cuda_doing(expr), cudaGetErrorString(e),
                  cudaGetErrorName(e), dl_cuda_fix(e));
}

extern "C" int dl_cublas_fail_(int status, const char *expr, const char *file, int line)
{
    cublasStatus_t s = (cublasStatus_t)status;
    DL_DEBUG("%s:%d: %s: %s", file, line, expr, cublasGetStatusName(s));
    return dl_err(DL_ECUDA, "CUDA error while %s: %s (%s)%s", dl_cuda_doing(expr), cublasGetStatusString(s),
                  cublasGetStatusName(s),
                  s == CUBLAS_STATUS_ALLOC_FAILED ? ": out of GPU memory; use a smaller --batch or model" : "");
}

/* ---- device */

/* Empty kernel whose attributes tell whether this binary carries code the
 * current GPU can run (SASS for its arch or PTX it can JIT). */
static __global__ void dl_cuda_probe_kernel(void) {}

static int dl_cuda_probe(void)
{
    int n = 0;
    DL_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n <= 0) return dl_err(DL_ENODEV, "no CUDA device found; train on the CPU with --device cpu");
    cudaFuncAttributes attr;
    DL_CUDA_CHECK(cudaFuncGetAttributes(&attr, dl_cuda_probe_kernel));
    return 0;
}

extern "C" int dl_cuda_available(void) { return dl_cuda_probe() == 0; }

extern "C" int dl_cuda_device_name(char *buf, size_t cap)
{
    assert(buf && cap > 0);
    buf[0] = 0;
    int dev = 0;
    cudaDeviceProp p;
    DL_CUDA_CHECK(cudaGetDevice(&dev));
    DL_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    snprintf(buf, cap, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

static std::atomic<int> dl_cuda_matmul{DL_MATMUL_FP32};

extern "C" void dl_cuda_set_matmul(int precision)
{
    assert(precision == DL_MATMUL_FP32 || precision == DL_MATMUL_TF32 || precision == DL_MATMUL_BF16);
    dl_cuda_matmul.store(precision);
}

extern "C" int dl_cuda_get_matmul(void) { return dl_cuda_matmul.load(); }

extern "C" const char *dl_cuda_matmul_name(int precision)
{
    switch (precision) {
    case DL_MATMUL_FP32: return "fp32";
    case DL_MATMUL_TF32: return "tf32";
    case DL_MATMUL_BF16: return "bf16";
    default: return "?";
    }
}

cublasComputeType_t dl_cuda_compute_type(void)
{
    switch (dl_cuda_matmul.load()) {
    case DL_MATMUL_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case DL_MATMUL_BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    default: return CUBLAS_COMPUTE_32F;
    }
}

extern "C" int dl_cuda_sync(void)
{
    DL_CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}

/* ---- per-thread context */

static thread_local dl_cuda_ctx dl_tls_ctx;
static thread_local bool dl_tls_ready;

int dl_cuda_ctx_get(dl_cuda_ctx **out)
{
    if (!dl_tls_ready) {
        dl_cuda_ctx c = {};
        /* Scratch first: on a machine without a device this is the call that
         * fails, with a CUDA error that maps to DL_ENODEV. */
        DL_CUDA_CHECK(cudaMalloc((void **)&c.scratch, (DL_CUDA_SUMSQ_BLOCKS + 1) * sizeof(double)));
        cublasStatus_t s = cublasCreate(&c.blas);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cudaFree(c.scratch);
            return dl_cublas_fail_((int)s, "cublasCreate(&c.blas)", __FILE__, __LINE__);
        }
        dl_tls_ctx = c;
        dl_tls_ready = true;
    }
    *out = &dl_tls_ctx;
    return 0;
}

int dl_cuda_ctx_work(dl_cuda_ctx *ctx, size_t bytes, void **out)
{
    if (ctx->work_bytes < bytes) {
        if (ctx->work) {
            cudaError_t e = cudaFree(ctx->work);
            ctx->work = NULL;
            ctx->work_bytes = 0;
            DL_CUDA_CHECK(e);
        }
        DL_CUDA_CHECK(cudaMalloc(&ctx->work, bytes));
        ctx->work_bytes = bytes;
    }
    *out = ctx->work;
    return 0;
}

extern "C" void dl_cuda_thread_release(void)
{
    if (!dl_tls_ready) return;
    cublasStatus_t s = cublasDestroy(dl_tls_ctx.blas);
    cudaError_t e = cudaFree(dl_tls_ctx.scratch);
    if (dl_tls_ctx.work) {
        cudaError_t e2 = cudaFree(dl_tls_ctx.work);
        if (e == cudaSuccess) e = e2;
    }
    if (s != CUBLAS_STATUS_SUCCESS || e != cudaSuccess)
        DL_WARN("dl_cuda_thread_release: cublasDestroy: %s, cudaFree: %s", cublasGetStatusString(s),
                cudaGetErrorString(e));
    dl_tls_ctx = dl_cuda_ctx{};
    dl_tls_ready = false;
}

/* ---- memory */

extern "C" int dl_cuda_malloc(size_t bytes, void **out)
{
    assert(out);
    *out = NULL;
    DL_CUDA_CHECK(cudaMalloc(out, bytes));
    return 0;
}

extern "C" void dl_cuda_free(void **p)
{
    assert(p);
    if (!*p) return;
    cudaError_t e = cudaFree(*p);
    /* cudaFree also returns errors of earlier asynchronous work; the memory
     * is gone either way, so report and carry on. */
    if (e != cudaSuccess) DL_WARN("cudaFree: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    *p = NULL;
}

extern "C" int dl_cuda_h2d(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return 0;
    assert(dst && src);
    DL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

extern "C" int dl_cuda_d2h(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return 0;
    assert(dst && src);
    DL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int dl_cuda_memset0(void *dst, size_t bytes)
{
    if (!bytes) return 0;
    assert(dst);
    DL_CUDA_CHECK(cudaMemset(dst, 0, bytes));
    return 0;
}

/* ---- streams, events, pinned host memory */

extern "C" int dl_cuda_stream_open(dl_cuda_stream *out)
{
    assert(out);
    *out = NULL;
    cudaStream_t s = NULL;
    DL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return 0;
}

extern "C" void dl_cuda_stream_close(dl_cuda_stream *s)
{
    assert(s);
    if (!*s) return;
    cudaError_t e = cudaStreamSynchronize(*s);
    cudaError_t e2 = cudaStreamDestroy(*s);
    if (e == cudaSuccess) e = e2;
    if (e != cudaSuccess) DL_WARN("dl_cuda_stream_close: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    *s = NULL;
}

extern "C" int dl_cuda_stream_sync(dl_cuda_stream s)
{
    DL_CUDA_CHECK(cudaStreamSynchronize(s));
    return 0;
}

extern "C" int dl_cuda_event_open(dl_cuda_event *out)
{
    assert(out);
    *out = NULL;
    cudaEvent_t e = NULL;
    DL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = e;
    return 0;
}

extern "C" void dl_cuda_event_close(dl_cuda_event *e)
{
    assert(e);
    if (!*e) return;
    cudaError_t r = cudaEventDestroy(*e);
    if (r != cudaSuccess) DL_WARN("cudaEventDestroy: %s (%s)", cudaGetErrorString(r), cudaGetErrorName(r));
    *e = NULL;
}

extern "C" int dl_cuda_event_record(dl_cuda_event e, dl_cuda_stream s)
{
    assert(e);
    DL_CUDA_CHECK(cudaEventRecord(e, s));
    return 0;
}

extern "C" int dl_cuda_event_sync(dl_cuda_event e)
{
    assert(e);
    DL_CUDA_CHECK(cudaEventSynchronize(e));
    return 0;
}

extern "C" int dl_cuda_stream_wait(dl_cuda_stream s, dl_cuda_event e)
{
    assert(e);
    DL_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0));
    return 0;
}

extern "C" int dl_cuda_copy_async(void *dst, const void *src, size_t bytes, dl_cuda_stream s)
{
    if (!bytes) return 0;
    assert(dst && src);
    DL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    return 0;
}

extern "C" int dl_cuda_host_alloc(size_t bytes, void **out)
{
    assert(out);
    *out = NULL;
    DL_CUDA_CHECK(cudaMallocHost(out, bytes));
    return 0;
}

extern "C" void dl_cuda_host_free(void **p)
{
    assert(p);
    if (!*p) return;
    cudaError_t e = cudaFreeHost(*p);
    if (e != cudaSuccess) DL_WARN("cudaFreeHost: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    *p = NULL;
}
