/* GPA (Generalized Primal Averaging, Defazio et al. 2025, "Smoothing DiLoCo
 * with Primal Averaging"): AdamW as the base optimizer of an averaged model,
 * with one extra parameter copy; and the parameter interface a networked GPA learner's node uses.
 *
 * Three sequences (docs/GPA.md):
 *     y_t     = mu_y * x_t + (1 - mu_y) * z_t        the gradient is taken here
 *     z_{t+1} = AdamW step of z_t with grad f(y_t)    (decoupled weight decay on z)
 *     x_{t+1} = mu_x * x_t + (1 - mu_x) * z_{t+1}    the model: evaluated, pushed, saved
 * Stored: x (the model's parameter buffer) and y (the one extra copy);
 * z is recovered each step as z = y + mu_y/(1-mu_y) * (y - x), which is
 * why mu_y < 1. The step is written in differences,
 *     x' = z' + mu_x * (x - z'),   y' = z' + mu_y * (x' - z'),
 * so that mu_x = 0 gives x' = y' = z' bit for bit: with mu_x = 0 (any mu_y)
 * and x == y at the start, the step IS dl_cpu_adamw, bit for bit. mu_y = 0
 * alone is not AdamW: the gradient is taken at z, and the model x is an
 * exponential average of the z's (EMA / Polyak averaging of AdamW).
 *
 * The DiLoCo mapping: single-worker DiLoCo with outer Nesterov momentum mu
 * and H inner steps per outer step forgets an old pseudo-gradient by mu per
 * H inner steps; an average that forgets by mu_x per inner step matches it
 * when mu_x^H = mu, i.e. mu_x = mu^(1/H) (dl_gpa_mu_x_from). */
#ifndef DL_LEARNER_GPA_H
#define DL_LEARNER_GPA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu.h"  /* dl_adamw_hp */
#include "gpt/gpt.h"  /* dl_gpt, dl_adamw_cfg */
#include "learner/node.h" /* dl_node_model */

struct dl_plan;

enum { DL_OPT_ADAMW = 0, DL_OPT_GPA = 1 };

/* "adamw" / "gpa"; NULL for another code. */
const char *dl_gpa_optimizer_name(int optimizer);

/* mu^(1/H): the smoothing that stands for DiLoCo's outer momentum mu over
 * H inner steps. mu in [0, 1), H >= 1 (asserted). */
double dl_gpa_mu_x_from(double mu, int64_t H);

/* Both coefficients: finite and in [0, 1). mu_x = 0 is plain AdamW (the
 * model is z); mu_y = 0 takes the gradient at z. Returns 0 or DL_EINVAL
 * naming the coefficient (1 would freeze the model x, or leave z
 * unrecoverable from x and y). */
int dl_gpa_check(double mu_x, double mu_y);

/* One GPA step over n elements: x, y (the stored pair), m, v in place,
 * with `grad` the gradient at y and hp's AdamW (lr, betas, eps, weight
 * decay on z, grad_scale, t). dl_cpu_adamw's arithmetic for z. */
void dl_gpa_adamw(float *x, float *y, const float *grad, float *m, float *v, size_t n, const dl_adamw_hp *hp,
                  float mu_x, float mu_y);

/* z from the stored pair, and a stored y from x and z (n elements). */
void dl_gpa_z(float *z, const float *x, const float *y, size_t n, float mu_y);
void dl_gpa_y(float *y, const float *x, const float *z, size_t n, float mu_y);

/* The model's GPA step: dl_gpt_adamw_step's clipping and decay runs, the
 * model's parameters are x, `y` is the extra copy (dl_gpt_num_params
 * floats), the model's grads were taken at y. Returns the global gradient
 * norm before clipping. */
float dl_gpa_step(dl_gpt *g, float *y, const dl_adamw_cfg *c, float lr, int64_t t, float mu_x, float mu_y);

/* Swap a and b element by element (exact): the trainer puts y into the
 * model's parameter buffer for the forward/backward of a step and x back. */
void dl_gpa_swap(float *a, float *b, size_t n);

/* The parameter interface (learner/node.h) of a networked GPA learner: theta
 * is the model x, so a push is delta = base - x; read_begin/read_end read x.
 * apply(a, b, in) applies the same map to the whole state,
 *     x = a*x + b*in,   y = a*y + b*in   (hence z = a*z + b*in),
 * so rebase / overwrite (a = 0, b = 1) set x = y = z = g exactly, keep
 * (a = 1) shifts all three by the same g - ref, and mix (alpha, 1-alpha)
 * pulls all three toward g (the gap x - z shrinks by alpha). Non-deferred;
 * `plan`, `x` and `y` are borrowed. DL_EINVAL for a NULL argument. */
int dl_gpa_node_model_open(const struct dl_plan *plan, float *x, float *y, dl_node_model **out);
void dl_gpa_node_model_close(dl_node_model **m); /* safe on NULL and twice */

#endif
