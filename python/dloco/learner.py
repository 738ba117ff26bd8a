"""dloco.Learner: a PyTorch model as one learner of a dloco run, over the C
API of include/dloco/learner.h (libdloco_learner.so) through ctypes. CPU
parameters are bound zero-copy (the library reads and writes the tensors'
own memory); CUDA parameters through callbacks (a device snapshot copied to
pinned host memory on a side stream, overlapped with the next step)."""
import atexit
import ctypes
import logging
import signal
import threading
import weakref

from . import _lib
from . import manifest as _manifest
from .errors import CallbackError, Error, ManifestError, StateError, from_code

log = logging.getLogger("dloco")
# Handles still open at interpreter exit are closed first, while Python can
# still take the library threads' log lines.
_open = weakref.WeakSet()
atexit.register(lambda: [h.close() for h in list(_open)])
_LEVELS = {_lib.LOG_DEBUG: logging.DEBUG, _lib.LOG_INFO: logging.INFO, _lib.LOG_WARN: logging.WARNING,
           _lib.LOG_ERROR: logging.ERROR}


class StepResult:
    """What one Learner.step did: `step` (steps counted so far), `pushes`
    (pushes made after this step), `fragments` (indices whose parameters the
    library changed in this call), `tensors` (the manifest names it changed),
    `adopted` (len(fragments)), `stop_requested`, `h` (H from the
    synchronizer), `barrier_wait_s`."""

    __slots__ = ("step", "pushes", "adopted", "fragments", "tensors", "stop_requested", "h", "barrier_wait_s")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw[k])

    @property
    def changed(self):
        return bool(self.fragments)

    def __repr__(self):
        return "StepResult(step=%d, pushes=%d, fragments=%s, stop_requested=%d)" % (
            self.step, self.pushes, self.fragments, self.stop_requested)


class _Callbacks:
    """The callback binding: fragment payloads gathered from and applied to
    tensors the library cannot address (CUDA), or CPU tensors when asked.

    Reads (push snapshots): on the training thread's current stream the
    fragment's spans are copied into one device scratch tensor (so the next
    optimizer step may change the parameters at once); a side stream then
    copies the scratch to a pinned host buffer and records an event, and the
    library collects it one step later (deferred), so the device-to-host copy
    overlaps the next optimizer step. Applies: the library's host floats are
    copied to a pinned staging buffer, uploaded on the current stream, and
    theta = a*theta + b*in runs there, ordered before the next forward."""

    def __init__(self, entries, spans, frag_numel, deferred):
        import torch
        self.torch = torch
        self.flat = [e.tensor.detach().view(-1) for e in entries]
        self.spans = spans  # per fragment: [(tensor, start, numel, offset)]
        self.cuda = any(t.is_cuda for t in self.flat)
        pin = self.cuda
        self.host = [torch.empty(n, dtype=torch.float32, pin_memory=pin) for n in frag_numel]
        self.events = [None] * len(frag_numel)
        self.pending = [None] * len(frag_numel)  # device scratch kept alive while its copy runs
        self.error = None
        if self.cuda:
            dev = next(t.device for t in self.flat if t.is_cuda)
            self.side = torch.cuda.Stream(device=dev)
            self.staging = torch.empty(max(frag_numel), dtype=torch.float32, pin_memory=True)
            self.staging_ev = None
        self.fns = _lib.Callbacks(ctypes.sizeof(_lib.Callbacks), None, 1 if deferred else 0,
                                  _lib.READ_BEGIN_FN(self._guard(self.read_begin)),
                                  _lib.READ_END_FN(self._guard(self.read_end)),
                                  _lib.APPLY_FN(self._guard(self.apply)))

    def _guard(self, f):
        def wrapped(ctx, *a):
            try:
                f(*a)
                return 0
            except BaseException as e:  # never let an exception cross into C
                if self.error is None:
                    self.error = e
                return 1
        return wrapped

    def read_begin(self, p):
        torch = self.torch
        host = self.host[p]
        with torch.no_grad():
            if not self.cuda:
                for t, start, n, off in self.spans[p]:
                    host[off:off + n].copy_(self.flat[t][start:start + n])
                return
            cur = torch.cuda.current_stream(self.side.device)
            scratch = torch.empty(host.numel(), dtype=torch.float32, device=self.side.device)
            for t, start, n, off in self.spans[p]:
                src = self.flat[t][start:start + n]
                if src.is_cuda:
                    scratch[off:off + n].copy_(src)
                else:
                    scratch[off:off + n].copy_(src, non_blocking=False)
            self.side.wait_stream(cur)
            with torch.cuda.stream(self.side):
                host.copy_(scratch, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.side)
            scratch.record_stream(self.side)
            self.events[p], self.pending[p] = ev, scratch

    def read_end(self, p, values):
        if self.events[p] is not None:
            self.events[p].synchronize()
            self.events[p], self.pending[p] = None, None
        values[0] = ctypes.cast(self.host[p].data_ptr(), ctypes.POINTER(ctypes.c_float))

    def apply(self, p, a, b, inp):
        torch = self.torch
        n_all = self.host[p].numel()
        src = torch.frombuffer((ctypes.c_float * n_all).from_address(ctypes.addressof(inp.contents)),
                               dtype=torch.float32)
        with torch.no_grad():
            if self.cuda:
                if self.staging_ev is not None:
                    self.staging_ev.synchronize()  # the previous upload has left the staging buffer
                stage = self.staging[:n_all]
                stage.copy_(src)
                dev = stage.to(self.side.device, non_blocking=True)
                self.staging_ev = torch.cuda.Event()
                self.staging_ev.record(torch.cuda.current_stream(self.side.device))
            else:
                dev = src
            for t, start, n, off in self.spans[p]:
                dst = self.flat[t][start:start + n]
                v = dev[off:off + n]
                if v.device != dst.device:
                    v = v.to(dst.device)
                if a == 0.0:
                    dst.copy_(v)
                    if b != 1.0:
                        dst.mul_(b)
                else:
                    if a != 1.0:
                        dst.mul_(a)
                    dst.add_(v, alpha=b)


class Learner:
    """One learner of a dloco run, training `model` (an nn.Module, or a dict /
    list of (name, tensor) pairs) with the caller's own loop and optimizer.

        dl = dloco.Learner(model, connect="tcp://sync:5555", run_id="run1",
                           fragments=8, max_tokens_per_step=B * T)
        dl.join()                      # the global model overwrites the parameters
        for x, y in data:
            loss = train_step(x, y)    # forward, backward, optimizer.step()
            dl.step(B * T, loss)       # push what is due, adopt what has arrived
        dl.finish()                    # final pushes, their decisions, Bye

    or `with dloco.Learner(...) as dl:` (join on enter, finish and close on
    exit). Arguments:
      connect        "tcp://host:port" (a sharded synchronizer: its shards' endpoints comma-separated)
      run_id         the synchronizer's run id
      learner_id     unique in the run; None = <hostname>-<pid>
      fragments      P, the same on every learner and the synchronizer
      max_tokens_per_step  the most tokens one step trains on (the synchronizer holds the learner to it)
      config         an INI file of networked options (keys as dloco-learner's: adopt, push_codec, ...)
      options        {name: value} of the same options, applied after `config`
      roles          {parameter name: "matrix" | "vector" | "embedding"} overriding the defaults
      gpt2           {n_layer, n_head, n_embd, seq_len, vocab}: the model is dloco's GPT-2 (llm.c layout),
                     so this learner joins runs of dloco-learners (same fingerprint)
      binding        "auto" (CPU: host, zero copy; CUDA: callbacks), "host" or "callbacks"
      device         Hello.device; None = "cpu" or "cuda:N <name>"
      logger         where the library's log lines go (default: logging.getLogger("dloco"))
      start_step     the step a caller resumed its own training at (from its own saved optimizer state and
                     step, docs/LIBRARY.md "Restarts"); 0 = a fresh start
    The manifest is checked (fp32, contiguous...) before the library is even
    loaded: a ManifestError means nothing touched the network."""

    def __init__(self, model, connect, run_id, learner_id=None, fragments=4, max_tokens_per_step=None,
                 config=None, options=None, roles=None, gpt2=None, binding="auto", device=None, logger=None,
                 start_step=0):
        self._h = ctypes.c_void_p()
        self._joined = self._finished = False
        self._stop_requested = False
        self._old_handlers = {}
        entries = _manifest.build(model, roles)
        if not isinstance(max_tokens_per_step, int) or max_tokens_per_step < 1:
            raise ManifestError("max_tokens_per_step must be a positive int (the most tokens one step trains "
                                "on, e.g. batch * seq_len), got %r" % (max_tokens_per_step,))
        if binding not in ("auto", "host", "callbacks"):
            raise ManifestError("binding %r: use auto, host or callbacks" % (binding,))
        on_cuda = any(e.tensor.is_cuda for e in entries)
        if binding == "host" and on_cuda:
            raise ManifestError("binding='host' needs CPU parameters; CUDA parameters are bound by callbacks")
        if any(e.tensor.device.type not in ("cpu", "cuda") for e in entries):
            bad = next(e for e in entries if e.tensor.device.type not in ("cpu", "cuda"))
            raise ManifestError("parameter %r is on %s; dloco binds CPU and CUDA tensors" % (bad.name,
                                                                                             bad.tensor.device))
        L = _lib.lib()
        self._L = L
        self._gpt2 = None
        if gpt2 is not None:
            entries = self._gpt2_order(L, entries, gpt2)
        self.entries = entries
        self.names = [e.name for e in entries]
        self._names_b = [e.name.encode() for e in entries]
        arr = (_lib.Tensor * len(entries))()
        for i, e in enumerate(entries):
            arr[i].name = self._names_b[i]
            arr[i].ndim = e.tensor.dim()
            arr[i].role = _lib.ROLE_NAMES[e.role]
            for d, s in enumerate(e.shape):
                arr[i].shape[d] = s
        self._logger = logger or log
        self._log_fn = _lib.LOG_FN(self._on_log)
        if device is None:
            device = "cpu"
            if on_cuda:
                import torch
                dev = next(e.tensor.device for e in entries if e.tensor.is_cuda)
                device = "cuda:%d %s" % (dev.index or 0, torch.cuda.get_device_name(dev))
        o = _lib.Opts()
        L.dloco_learner_opts_init(ctypes.byref(o))
        self._keep = [connect.encode(), run_id.encode(), (learner_id or "").encode(),
                      (config or "").encode() if config else None, device.encode(), arr]
        o.connect, o.run_id = self._keep[0], self._keep[1]
        o.learner_id = self._keep[2] if learner_id else None
        o.fragments = int(fragments)
        o.tensors, o.n_tensors = arr, len(entries)
        o.max_tokens_per_step = max_tokens_per_step
        o.gpt2 = ctypes.pointer(self._gpt2) if self._gpt2 is not None else None
        o.config_path = self._keep[3]
        o.log, o.log_ctx, o.device = self._log_fn, None, self._keep[4]
        o.start_step = int(start_step)
        self._check(L.dloco_learner_open(ctypes.byref(o), ctypes.byref(self._h)), handle=False)
        _open.add(self)
        try:
            for k, v in (options or {}).items():
                if isinstance(v, bool):
                    v = int(v)
                self._check(L.dloco_learner_set_option(self._h, str(k).encode(), str(v).encode()))
            self.fragments = L.dloco_learner_fragments(self._h)
            self.fingerprint = L.dloco_learner_fingerprint(self._h)
            self.numel = L.dloco_learner_numel(self._h)
            self._bind("callbacks" if binding == "callbacks" or on_cuda else "host")
        except BaseException:
            self.close()
            raise

    # ---- construction helpers

    def _gpt2_order(self, L, entries, gpt2):
        keys = ("n_layer", "n_head", "n_embd", "seq_len", "vocab")
        try:
            self._gpt2 = _lib.Gpt2Config(*(int(gpt2[k]) for k in keys))
        except (KeyError, TypeError, ValueError):
            raise ManifestError("gpt2 must give %s as ints, got %r" % (", ".join(keys), gpt2))
        n = L.dloco_learner_gpt2_manifest(ctypes.byref(self._gpt2), None, 0)
        if n < 0:
            self._check(n, handle=False)
        tab = (_lib.Tensor * n)()
        L.dloco_learner_gpt2_manifest(ctypes.byref(self._gpt2), tab, n)
        by_name = {e.name: e for e in entries}
        out = []
        for t in tab:
            name = t.name.decode()
            shape = [t.shape[d] for d in range(t.ndim)]
            e = by_name.pop(name, None)
            if e is None:
                raise ManifestError("the model has no parameter %r of dloco's GPT-2 %s (shape %s); name the "
                                    "model's parameters as dloco's table (examples/torch/gpt2.py)" % (
                                        name, dict(zip(keys, (getattr(self._gpt2, k) for k in keys))), shape))
            if e.shape != shape:
                raise ManifestError("parameter %r has shape %s; dloco's GPT-2 has %s (padded vocabulary: "
                                    "vocab rounded up to 64 rows)" % (name, e.shape, shape))
            out.append(_manifest.Entry(name, e.tensor, _lib.ROLE_OF[t.role]))
        if by_name:
            raise ManifestError("parameters %s are not in dloco's GPT-2 table" % sorted(by_name)[:4])
        return out

    def _bind(self, how):
        L = self._L
        if how == "host":
            ptrs = (ctypes.c_void_p * len(self.entries))(*[e.tensor.data_ptr() for e in self.entries])
            self._ptrs = ptrs
            self._check(L.dloco_learner_bind_host(self._h, ptrs, len(self.entries)))
            self._cb = None
            self.binding = "host"
            return
        spans, numels = [], []
        for p in range(self.fragments):
            ns = L.dloco_learner_fragment_nspans(self._h, p)
            if ns < 0:
                self._check(ns)
            sp = []
            for i in range(ns):
                s = _lib.Span()
                self._check(L.dloco_learner_fragment_span(self._h, p, i, ctypes.byref(s)))
                sp.append((s.tensor, s.start, s.numel, s.offset))
            spans.append(sp)
            numels.append(L.dloco_learner_fragment_numel(self._h, p))
        on_cuda = any(e.tensor.is_cuda for e in self.entries)
        self._cb = _Callbacks(self.entries, spans, numels, deferred=on_cuda)
        self._check(L.dloco_learner_bind_callbacks(self._h, ctypes.byref(self._cb.fns)))
        self.binding = "callbacks"

    def _on_log(self, ctx, level, line):
        try:
            self._logger.log(_LEVELS.get(level, logging.INFO), "%s", line.decode("utf-8", "replace"))
        except BaseException:  # a log line must never raise into a library thread
            pass

    def _check(self, rc, handle=True):
        if rc >= 0:
            return rc
        msg = self._L.dloco_learner_errmsg(self._h if handle and self._h else None) or b""
        msg = msg.decode("utf-8", "replace") or self._L.dloco_learner_strerror(rc).decode()
        err = from_code(rc, msg)
        cb = getattr(self, "_cb", None)
        if cb is not None and cb.error is not None:
            cause, cb.error = cb.error, None
            if isinstance(cause, (KeyboardInterrupt, SystemExit)):
                raise cause
            raise err from cause
        raise err

    # ---- the run

    def join(self, timeout=None):
        """Connect, say Hello, fetch the global model into the parameters
        (they are overwritten). timeout in seconds (None: the
        connect_timeout_ms option, 30 s by default). Raises Timeout naming the
        silent endpoint, Refused, NetworkError, Stopped. The call runs on a
        helper thread so that a Python signal handler calling stop() can end
        it; the parameters are written on that thread while this one waits."""
        if self._joined:
            raise StateError("join: this learner has joined already")
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        box = {}

        def run():
            box["rc"] = self._L.dloco_learner_join(self._h, ms)
        t = threading.Thread(target=run, name="dloco-join", daemon=True)
        t.start()
        try:
            while t.is_alive():
                t.join(0.2)
        except BaseException:
            self.stop()
            t.join()
            raise
        self._check(box["rc"])
        self._joined = True
        return self

    def step(self, tokens, loss, compute_s=-1.0):
        """After each optimizer step: count the step's `tokens` and `loss`
        (a float or a 0-d tensor), push what is due, adopt what has arrived
        (in place, now). Returns a StepResult naming the changed fragments
        and tensors (a model holding other copies of them, e.g. a DDP group,
        must refresh those). compute_s: the step's seconds (< 0: measured by
        the library)."""
        if hasattr(loss, "item"):
            loss = loss.item()
        info = _lib.StepInfo()
        info.struct_size = ctypes.sizeof(_lib.StepInfo)
        self._check(self._L.dloco_learner_step(self._h, int(tokens), float(loss), float(compute_s),
                                               ctypes.byref(info)))
        frags, tens = [], []
        if info.adopted:
            frags = [p for p in range(self.fragments) if info.fragment_changed[p]]
            tens = [self.names[i] for i in range(len(self.names)) if info.tensor_changed[i]]
        if info.stop_requested:
            self._stop_requested = True
        return StepResult(step=info.step, pushes=info.pushes, adopted=info.adopted, fragments=frags, tensors=tens,
                          stop_requested=bool(info.stop_requested), h=info.h, barrier_wait_s=info.barrier_wait_s)

    def save_state(self):
        """Save the learner's own state (versions held, the base of its
        unpushed progress, its counters) to the option state_path
        (options={"state_path": PATH}), atomically. Call it when you save
        your parameters and optimizer state, at the same step: a process
        started again with them, start_step = that step and the same
        state_path keeps its fragments and pushes that progress, counted
        once. The file replaced is kept as PATH.prev: killed between this
        call and your own checkpoint, a process restarted at the previous
        step restores that one (docs/LIBRARY.md "Restarts")."""
        self._check(self._L.dloco_learner_save_state(self._h))

    def finish(self, timeout=None, reason="done"):
        """Final pushes of every fragment with progress, wait up to `timeout`
        seconds (None: the flush_timeout_ms option, 10 s) for their decisions
        and updates (adopting them), say Bye with `reason`. Returns the number
        of final pushes left unanswered (0 = a complete flush)."""
        if self._finished:
            raise StateError("finish: this learner has finished already")
        ms = -1 if timeout is None else int(timeout * 1000)
        rc = self._check(self._L.dloco_learner_finish(self._h, ms, (reason or "done").encode()))
        self._finished = True
        return rc

    def stop(self):
        """Ask the learner to stop: a join in progress raises Stopped, a
        barrier wait ends, the next StepResult has stop_requested. Safe from
        a Python signal handler and any thread; finish() still flushes."""
        self._stop_requested = True
        if self._h:
            self._L.dloco_learner_stop(self._h)

    @property
    def stop_requested(self):
        return self._stop_requested

    def handle_signals(self, signals=(signal.SIGTERM, signal.SIGINT)):
        """Opt in: make `signals` call stop() (the library installs no handler
        itself). The loop then ends at the next step with stop_requested, and
        finish() flushes and says Bye. The previous handlers come back on close()."""
        for s in signals:
            self._old_handlers.setdefault(s, signal.getsignal(s))
            signal.signal(s, lambda signum, frame: self.stop())
        return self

    def stats(self):
        """The library's counters as a dict (state, steps, tokens, pushes,
        accepted, adopted, rebased, bytes_sent, ...)."""
        s = _lib.Stats()
        s.struct_size = ctypes.sizeof(_lib.Stats)
        self._check(self._L.dloco_learner_get_stats(self._h, ctypes.byref(s)))
        out = {name: getattr(s, name) for name, _ in _lib.Stats._fields_ if name != "struct_size"}
        out["state"] = _lib.STATES.get(out["state"], str(out["state"]))
        return out

    def spans(self, fragment):
        """Fragment `fragment`'s spans: [(tensor name, start, numel, payload offset)]."""
        out = []
        for i in range(self._check(self._L.dloco_learner_fragment_nspans(self._h, fragment))):
            s = _lib.Span()
            self._check(self._L.dloco_learner_fragment_span(self._h, fragment, i, ctypes.byref(s)))
            out.append((self.names[s.tensor], s.start, s.numel, s.offset))
        return out

    def close(self):
        """Stop the sessions (no Bye unless finish() ran) and free the
        handle; safe twice. The parameters stay the caller's."""
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        self._old_handlers = {}
        if getattr(self, "_h", None):
            self._L.dloco_learner_close(ctypes.byref(self._h))
            self._h = ctypes.c_void_p()

    def __enter__(self):
        if not self._joined:
            self.join()
        return self

    def __exit__(self, et, ev, tb):
        try:
            if self._joined and not self._finished:
                if et is None:
                    self.finish()
                else:
                    reason = "signal" if issubclass(et, KeyboardInterrupt) or self._stop_requested else \
                        "error: %s" % et.__name__
                    try:
                        self.finish(reason=reason)
                    except Error:
                        pass  # the first exception is the one to report
        finally:
            self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def api_version():
    """(major, minor) of the loaded libdloco_learner."""
    v = _lib.lib().dloco_learner_api_version()
    return v // 10000, v % 10000


def gpt2_manifest(n_layer, n_head, n_embd, seq_len, vocab):
    """dloco's GPT-2 tensor table: [(name, shape, role)] from the library."""
    cfg = _lib.Gpt2Config(n_layer, n_head, n_embd, seq_len, vocab)
    L = _lib.lib()
    n = L.dloco_learner_gpt2_manifest(ctypes.byref(cfg), None, 0)
    if n < 0:
        raise from_code(n, (L.dloco_learner_errmsg(None) or b"").decode())
    tab = (_lib.Tensor * n)()
    L.dloco_learner_gpt2_manifest(ctypes.byref(cfg), tab, n)
    return [(t.name.decode(), [t.shape[d] for d in range(t.ndim)], _lib.ROLE_OF[t.role]) for t in tab]


