/* Fragment copies between the device-resident GPT (gpt/gpt_cuda.h) and the
 * host: the parameter interface (dl_node_model) of a networked CUDA learner. */
#ifndef DL_LEARNER_XFER_CUDA_H
#define DL_LEARNER_XFER_CUDA_H

#include <stddef.h>

#include "gpt/gpt_cuda.h"
#include "learner/node.h"

/* Per fragment p it holds a device snapshot and a device staging buffer, and
 * a pinned host snapshot and a pinned host staging buffer (numel_p floats
 * each; in all 2 x nparams floats of device memory and 2 x nparams of pinned
 * host memory), and events. The model's kernels run on the legacy default
 * stream ("compute"); the copies to and from the host run on one side stream
 * created cudaStreamNonBlocking, ordered with events only, so they overlap
 * the training step and the host never waits for the compute stream:
 *
 *   read_begin(p)  compute: wait until the last host copy of p's snapshot is
 *                  done; copy p's tensors (device to device, one copy per run
 *                  of adjacent tensors) into its device snapshot; record.
 *                  side: wait for that; copy the snapshot to pinned host;
 *                  record `done`. Returns at once: theta_p as of the work
 *                  queued so far (the step's AdamW included).
 *   read_end(p)    the host waits for `done`: the pinned snapshot.
 *   apply(p, a, b, in)
 *                  the host waits until the previous upload from p's pinned
 *                  staging finished, copies `in` there; side: waits until the
 *                  compute stream finished reading p's device staging, uploads,
 *                  records; compute: waits for the upload, then
 *                  theta = a*theta + b*staging (dl_cuda_axpby per run),
 *                  records. The next step's kernels run after it, in stream
 *                  order.
 *
 * Every call is from the thread that drives the model. Errors: DL_ECUDA /
 * DL_ENODEV (dl_errmsg() has file:line and the CUDA error); the model is
 * unusable after one. */
typedef struct dl_gptc_xfer dl_gptc_xfer;

/* `plan` must be the fragment plan of g's tensor table (dl_model_plan_open of
 * the same config): DL_EINVAL otherwise. g and plan are borrowed. */
int dl_gptc_xfer_open(dl_gptc *g, const struct dl_plan *plan, dl_gptc_xfer **out);
/* Waits for the side stream, frees everything, NULLs; safe on NULL and twice. */
void dl_gptc_xfer_close(dl_gptc_xfer **x);

/* The interface for dl_node_opts.model (deferred = 1); valid until close. */
const dl_node_model *dl_gptc_xfer_model(dl_gptc_xfer *x);

/* The interface's three calls, also directly. */
int dl_gptc_xfer_read_begin(dl_gptc_xfer *x, int p);
int dl_gptc_xfer_read_end(dl_gptc_xfer *x, int p, const float **theta);
int dl_gptc_xfer_apply(dl_gptc_xfer *x, int p, float a, float b, const float *in);

/* Bytes of device memory and of pinned host memory held. */
size_t dl_gptc_xfer_device_bytes(const dl_gptc_xfer *x);
size_t dl_gptc_xfer_host_bytes(const dl_gptc_xfer *x);

#endif
