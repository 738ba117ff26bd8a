/* The load schedule of dloco-loadgen (docs/SYNC_TIMING.md): a pure, seeded function from a regime to the
 * arrival times of requests, so a bench's every policy sees the same serving traffic for a seed.
 *
 * Regimes, with base rate R (requests/s), burst factor X and period T (seconds):
 *   steady     a Poisson process of rate R
 *   bursty     rate X*R during the first duty*T seconds of every period T (the first period starts at a
 *              seeded phase in [0, T)), R otherwise
 *   aperiodic  bursts whose gaps are exponential with mean T (the first after one such gap), each lasting
 *              duty*T*U(0.5, 1.5) seconds at rate X*R*U(0.5, 1.5); R between them
 * Arrivals of the time-varying regimes are drawn by thinning a Poisson process of the peak rate. Everything
 * is a function of (cfg, seed): the same inputs give the same times on every machine (core/rng.h). */
#ifndef DL_CHAOS_LOADSCHED_H
#define DL_CHAOS_LOADSCHED_H

#include <stdint.h>

typedef enum { DL_LOAD_STEADY = 0, DL_LOAD_BURSTY = 1, DL_LOAD_APERIODIC = 2 } dl_load_regime;

typedef struct {
    dl_load_regime regime;
    double rate;       /* R, (0, 1e5] */
    double burst_x;    /* X, [1, 100] */
    double period_s;   /* T, [0.1, 3600] */
    double duty;       /* (0, 1) */
    double duration_s; /* (0, 86400] */
    uint64_t seed;
} dl_loadsched_cfg;

typedef struct dl_loadsched dl_loadsched;

/* "steady" | "bursty" | "aperiodic" -> 0 or DL_EINVAL. */
int dl_loadsched_parse(const char *s, dl_load_regime *out);
const char *dl_loadsched_name(dl_load_regime r);
/* Build the schedule. DL_EINVAL names a value outside its range (above), or a schedule of more than 1e7
 * arrivals (rate x duration too large). */
int dl_loadsched_open(const dl_loadsched_cfg *c, dl_loadsched **out);
void dl_loadsched_close(dl_loadsched **s);
/* Arrivals in seconds from the start, increasing, all in [0, duration_s). */
const double *dl_loadsched_times(const dl_loadsched *s, int64_t *n);
/* The intended rate at t seconds (what the thinning draws from). */
double dl_loadsched_rate(const dl_loadsched *s, double t);

#endif
