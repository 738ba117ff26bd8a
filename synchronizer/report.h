/* What the synchronizer tells people and scripts: the status line, the
 * shutdown summary (text and events) and the reload diff, all formatted from
 * one statistics snapshot (dl_sync_stats) or the tunables. No state. */
#ifndef DL_SYNCHRONIZER_REPORT_H
#define DL_SYNCHRONIZER_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "synchronizer/sync.h"

/* "epoch 3 | learners 2 live / 1 dead / 0 left | merges ..." into buf. */
void dl_report_status(const dl_sync_stats *st, char *buf, size_t cap);
/* The `sync-summary:` line and one `sync-learner:` line per learner. */
void dl_report_summary(const dl_sync_stats *st, FILE *f);
/* The same as events: sync_summary, one learner_summary per learner, ledger. */
void dl_report_summary_events(const dl_sync_stats *st);
/* " quorum 1 -> 2, outer_lr 0.7 -> 1" for every reloadable value that
 * differs (empty when none); returns the number of differences. */
int dl_report_tunables_diff(const dl_sync_tunables *a, const dl_sync_tunables *b, char *buf, size_t cap);

#endif
