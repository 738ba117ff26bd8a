/* Dynamic local steps: the rule and the cycle schedule (gpt/dynh.h). */
#include "gpt/dynh.h"

#include "core/err.h"

#include <assert.h>
#include <math.h>

int dl_dynh_init(dl_dynh *d, int mode, int h_min, int h_max)
{
    *d = (dl_dynh){.mode = mode, .h_min = h_min, .h_max = h_max};
    if (mode != DL_DYNH_OFF && mode != DL_DYNH_SPEED) return dl_err(DL_EINVAL, "option dynamic_h: unknown mode %d", mode);
    if (h_min < 1 || h_min > DL_DYNH_H_MAX)
        return dl_err(DL_EINVAL, "option dynamic_h_min: %d outside [1, %d]", h_min, DL_DYNH_H_MAX);
    if (h_max < 0 || h_max > DL_DYNH_H_MAX)
        return dl_err(DL_EINVAL, "option dynamic_h_max: %d outside [0, %d]", h_max, DL_DYNH_H_MAX);
    if (h_max && h_max < h_min)
        return dl_err(DL_EINVAL, "option dynamic_h_max: %d is below dynamic_h_min %d", h_max, h_min);
    return 0;
}

int dl_dynh_rule(const dl_dynh *d, int base, double own, double fleet)
{
    assert(base >= 1);
    if (d->mode == DL_DYNH_OFF || !(own > 0) || !(fleet > 0) || !isfinite(own) || !isfinite(fleet)) return base;
    double hi = d->h_max ? d->h_max : 4.0 * base;
    if (hi < d->h_min) hi = d->h_min;
    if (hi > DL_DYNH_H_MAX) hi = DL_DYNH_H_MAX;
    double h = round((double)base * (own / fleet));
    if (!(h >= d->h_min)) h = d->h_min; /* NaN too */
    if (h > hi) h = hi;
    return (int)h;
}

int64_t dl_dynh_step(dl_dynh *d, int64_t step, int base, double own, double fleet, int *H, int *changed)
{
    assert(step >= 1 && base >= 1);
    *changed = 0;
    if (!d->cur) { /* the first cycle starts before the first trained step, as the plain one at step 0 */
        d->start = step - 1;
        d->cur = dl_dynh_rule(d, base, own, fleet);
        d->cycles = 1;
    }
    /* a caller that skipped steps (it never does) still gets one cycle per
     * due position: catch up by whole cycles */
    while (step - d->start >= d->cur) {
        int prev = d->cur;
        d->start += d->cur;
        d->cur = dl_dynh_rule(d, base, own, fleet);
        d->cycles++;
        if (d->cur != prev) {
            d->changes++;
            *changed = 1;
        }
    }
    *H = d->cur;
    return (int64_t)d->cur + (step - d->start);
}
