/* Outer-loop kernels of Decoupled DiLoCo, CPU reference: merging m learners'
 * pseudo-gradients (weighted mean, RDA, robust rules) and the outer Nesterov step. */
#ifndef DL_KERNELS_OUTER_H
#define DL_KERNELS_OUTER_H

#include <stddef.h>

/* Conventions: x[0..m-1] are m input vectors of n floats each (one per
 * contributing learner), w[0..m-1] their weights (finite, >= 0, sum > 0;
 * asserted). Sums are accumulated in double. `out` may alias one of the x[i]
 * (the merge can run in place); it must not partially overlap any of them.
 * The CUDA twins take the same arguments as device pointers. */

/* out = sum_i w_i x_i / sum_i w_i. */
void dl_cpu_weighted_mean(float *out, const float *const *x, const double *w, int m, size_t n);

/* ||x||_2, double accumulation. */
double dl_cpu_norm2(const float *x, size_t n);

/* Radial-Directional Averaging: the length and the direction of the merged
 * update are averaged separately, so disagreeing learners shrink neither:
 *   out = (sum_i w_i ||x_i|| / W) * unit(sum_i w_i unit(x_i) / W),  W = sum_i w_i,
 * unit(v) = v / ||v||. A zero-norm input adds no direction but keeps its
 * weight in the radial mean; when the averaged direction is exactly zero
 * (or every input is zero) out = 0. */
void dl_cpu_rda(float *out, const float *const *x, const double *w, int m, size_t n);
/* dl_cpu_rda with each input's squared norm given (sumsq[i] = sum_j x[i][j]^2,
 * gathered elsewhere, e.g. as the input arrived; NULL: computed here, one
 * more pass over every input). */
void dl_cpu_rda_sumsq(float *out, const float *const *x, const double *w, const double *sumsq, int m, size_t n);

/* Outer Nesterov SGD step, as PyTorch SGD(momentum=mu, nesterov=True,
 * dampening=0, weight_decay=0) with `grad` the merged pseudo-gradient
 * (base - theta, so the step moves param toward the learners):
 *   momentum = mu*momentum + grad;  param -= lr * (grad + mu*momentum).
 * momentum starts at zero (PyTorch's first-step clone is the same thing).
 * DiLoCo defaults: lr 0.7, mu 0.9. */
void dl_cpu_nesterov(float *param, float *momentum, const float *grad, size_t n, float lr, float mu);

/* The same step out of place, with the pseudo-gradient first scaled by sc
 * (written back into grad when sc != 1) and its norm (dl_cpu_norm2's, bit
 * for bit) returned: one pass where the merge made three. The outputs may
 * be the inputs. With mu == 0 the momentum may be NULL, both of them: the
 * step is then param_out = param_in - lr * grad, as the momentum path gives
 * (a momentum of zero weight carries nothing from one step to the next, so
 * none is read or written). */
double dl_cpu_nesterov_to(float *param_out, float *mom_out, const float *param_in, const float *mom_in, float *grad,
                          size_t n, float lr, float mu, float sc);

/* Scale x in place so ||x|| <= max_norm (max_norm >= 0, finite). Returns the
 * norm before clipping, so the caller can log how hard it clipped. */
double dl_cpu_clip_norm(float *x, size_t n, double max_norm);

/* Coordinate-wise trimmed mean (unweighted): per coordinate, drop the `trim`
 * largest and `trim` smallest of the m values and average the rest.
 * Requires 0 <= trim and 2*trim < m (asserted). */
void dl_cpu_trimmed_mean(float *out, const float *const *x, int m, size_t n, int trim);

/* Coordinate-wise median (unweighted); for even m the mean of the two middle
 * values. Same as dl_cpu_trimmed_mean with trim = (m-1)/2. */
void dl_cpu_median(float *out, const float *const *x, int m, size_t n);

#endif
