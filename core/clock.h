/* Monotonic and wall clocks in nanoseconds. */
#ifndef DL_CORE_CLOCK_H
#define DL_CORE_CLOCK_H
#include <stdint.h>

int64_t dl_clock_ns(void);      /* CLOCK_MONOTONIC, ns */
int64_t dl_wallclock_ns(void);  /* CLOCK_REALTIME, ns since the epoch */
double dl_clock_s(void);        /* monotonic seconds, for timing loops */

#endif
