/* Clock helpers; monotonic time for intervals, realtime only for records. */
#include "core/clock.h"
#include <time.h>

int64_t dl_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t dl_wallclock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double dl_clock_s(void) { return (double)dl_clock_ns() * 1e-9; }
