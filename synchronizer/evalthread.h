/* The synchronizer's periodic evaluation: a background thread that, when
 * asked, reads the global model from the store (short read transactions,
 * never the loop's or the worker's buffers) and computes its validation loss
 * (gpt/evaluate.h, the code of `dloco eval`); it wakes the loop when a
 * result is ready. Neither the loop nor the merge worker ever waits for it. */
#ifndef DL_SYNCHRONIZER_EVALTHREAD_H
#define DL_SYNCHRONIZER_EVALTHREAD_H

#include <stddef.h>

#include "gpt/evaluate.h"

typedef struct dl_evalthread dl_evalthread;

/* Open the evaluation (model state, data) and start the thread; it uses
 * `threads` OpenMP threads for its forward passes. store and plan are
 * borrowed and must outlive it. wake(ctx) is called from the thread after
 * each result. Errors: those of dl_evaluate_open. */
int dl_evalthread_open(const dl_model_config *m, const dl_plan *plan, dl_store *store, const dl_evaluate_opts *o,
                       int threads, void (*wake)(void *), void *ctx, dl_evalthread **out);
/* Ask for an evaluation now: 0 started, 1 one is still running (nothing
 * queued: a slow evaluation is skipped, not stacked). */
int dl_evalthread_request(dl_evalthread *t);
/* 1 when a result came since the last call: *out (ok = 1), or the failure's
 * message in err (ok = 0); 0 when none. */
int dl_evalthread_take(dl_evalthread *t, dl_store_eval *out, int *ok, char *err, size_t cap);
/* Stop (an evaluation in progress ends at its next forward pass) and free;
 * safe twice. */
void dl_evalthread_close(dl_evalthread **t);

#endif
