/* Reload on SIGHUP: the CURVE allowlist (revoked keys are cut off) and the
 * reloadable options (policy, merge, guards), validated whole first. */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "synchronizer/report.h"

#include <string.h>

/* SIGHUP with CURVE: re-read the allowlist; every registered learner whose
 * connection's key no longer owns its id is cut off (dead, connection
 * detached, told so). Its later messages on that connection are refused by
 * on_message, and a new connection with the removed key fails ZAP. */
static void reload_allowlist(dl_sync *s)
{
    int n = 0;
    if (dl_auth_reload(s->auth, &n)) {
        char rb[600];
        DL_ERROR("allowlist reload refused, the running list stays: %s", dl_errmsg());
        dl_event("allowlist_reload", "refused=1 reason=%s", dl_event_str(dl_errmsg(), rb, sizeof rb));
        return;
    }
    int revoked = 0;
    int64_t now = dl_clock_ns();
    for (int i = 0; i < dl_registry_count(s->reg); i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (!l->used || !l->route_len || dl_auth_user_ok(s->auth, l->user, l->id)) continue;
        dl_downlink_error(s, l->route, l->route_len, l->id, DL_EPERM, 1, "the key of learner '%s' was revoked", l->id);
        if (member(s, i) == DL_POLICY_MEMBER_LIVE) dl_admit_mark_left(s, l, i, now, DL_POLICY_LEAVE_DEAD);
        dl_registry_clear_route(s->reg, i);
        memset(l->owed, 0, (size_t)s->cfg.P);
        l->n_owed = 0;
        dl_event("learner_revoked", "id=%s", l->id);
        DL_WARN("learner %s: its key left the allowlist; cut off", l->id);
        revoked++;
    }
    DL_INFO("allowlist reloaded: %d key(s), %d learner(s) cut off", n, revoked);
    dl_event("allowlist_reload", "refused=0 keys=%d revoked=%d", n, revoked);
    dl_commit_schedule(s);
}

void dl_reload_on_hup(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (s->auth) reload_allowlist(s);
    if (!s->reload) {
        DL_WARN("SIGHUP: no config file to reload");
        dl_event("reload", "refused=1 reason=no_config_file");
        return;
    }
    /* the candidate is validated whole (the callback checks the full config,
     * the guard and policy checks here) before anything applies */
    dl_sync_tunables cur = {.policy = *dl_policy_get_cfg(s->policy), .merge = s->cfg.merge, .guard = s->cfg.guard},
                     nt = cur;
    int ignored = 0, rc;
    dl_err_clear();
    if ((rc = s->reload(s->reload_ctx, &cur, &nt, &ignored)) == 0) {
        rc = dl_guard_cfg_check(&nt.guard);
        if (!rc) rc = dl_policy_reconfigure(s->policy, &nt.policy);
        if (s->reload_done) s->reload_done(s->reload_ctx, rc == 0);
    }
    if (rc) {
        DL_ERROR("reload refused, running values unchanged: %s", dl_errmsg());
        char rb[600];
        dl_event("reload", "refused=1 reason=%s", dl_event_str(dl_errmsg(), rb, sizeof rb));
        return;
    }
    char diff[1024], db[1100];
    int n = dl_report_tunables_diff(&cur, &nt, diff, sizeof diff);
    s->cfg.merge = nt.merge;
    s->cfg.policy = nt.policy;
    s->cfg.guard = nt.guard;
    dl_guard_reconfigure(s->guard, &nt.guard);
    DL_INFO("reload applied:%s; %d restart-only option(s) of the file ignored, kept as they run",
            n ? diff : " no reloadable value changed", ignored);
    dl_event("reload", "refused=0 changes=%d changed=%s ignored=%d", n, dl_event_str(n ? diff + 1 : "", db, sizeof db),
             ignored);
    dl_commit_schedule(s);
    dl_sync_drain(s);
}

void dl_sync_set_reload(dl_sync *s, dl_sync_reload_fn fn, dl_sync_reload_done_fn done, void *ctx)
{
    s->reload = fn;
    s->reload_done = done;
    s->reload_ctx = ctx;
}
