/* The networked learner's /metrics (Prometheus text, docs/OPERATING.md
 * "Metrics"): the training thread observes each step and, about once a
 * second, renders the counters of the node and the comms sessions (read
 * under their own locks) into a document the HTTP thread serves. */
#ifndef DL_LEARNER_METRICS_H
#define DL_LEARNER_METRICS_H

#include <stdint.h>

#include "learner/comms.h"
#include "learner/node.h"

typedef struct dl_lmet dl_lmet;

/* Listen on addr ("HOST:PORT", port 0 = ephemeral; "auto" = 127.0.0.1:0, or
 * *out NULL with a warning when that cannot be bound; "" or "off" = *out
 * NULL, nothing served) for learner `id`; logs the address and writes the
 * event metrics_listen. DL_EINVAL / DL_ENET (message names the option) for
 * an explicit address that cannot be bound. */
int dl_lmet_open(const char *addr, const char *id, dl_lmet **out);
/* One training step: its wall seconds and loss, the step counter and the
 * tokens processed since start. NULL m: nothing. */
void dl_lmet_step(dl_lmet *m, double step_s, double loss, uint64_t step, uint64_t tokens);
/* Render now from the sessions' (summed) and the node's counters;
 * tokens_per_s over the latest window. */
void dl_lmet_publish(dl_lmet *m, const dl_comms_stats *cs, const dl_node_stats *ns, double tokens_per_s);
/* 1 when a second has passed since the last publish. */
int dl_lmet_due(const dl_lmet *m);
void dl_lmet_close(dl_lmet **m); /* safe on NULL and twice */

#endif
