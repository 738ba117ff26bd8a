"""ctypes declarations of include/dloco/learner.h and the loading of
libdloco_learner.so (found via DLOCO_LIBRARY, next to the package, in a build
tree or on the system's library path), with its API version checked."""
import ctypes
import ctypes.util
import glob
import os

from .errors import LibraryNotFound

# The API this binding is written for (include/dloco/learner.h).
API_MAJOR = 1
API_MINOR = 2  # 1: dloco_learner_opts.start_step; 2: dloco_learner_save_state
SONAME = "libdloco_learner.so.%d" % API_MAJOR

ROLE_MATRIX, ROLE_VECTOR, ROLE_EMBEDDING = 0, 1, 2
ROLE_NAMES = {"matrix": ROLE_MATRIX, "vector": ROLE_VECTOR, "embedding": ROLE_EMBEDDING, "embed": ROLE_EMBEDDING}
ROLE_OF = {ROLE_MATRIX: "matrix", ROLE_VECTOR: "vector", ROLE_EMBEDDING: "embedding"}
MAX_DIMS = 4
NAME_MAX = 127  # DLOCO_TENSOR_NAME_MAX: UTF-8 bytes without the NUL

LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR = 0, 1, 2, 3
STATES = {0: "open", 1: "joining", 2: "ready", 3: "refused", 4: "failed", 5: "done"}


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("ndim", ctypes.c_int32), ("role", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS)]


class Gpt2Config(ctypes.Structure):
    _fields_ = [("n_layer", ctypes.c_int32), ("n_head", ctypes.c_int32), ("n_embd", ctypes.c_int32),
                ("seq_len", ctypes.c_int32), ("vocab", ctypes.c_int32)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p)


class Opts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("connect", ctypes.c_char_p), ("run_id", ctypes.c_char_p),
                ("learner_id", ctypes.c_char_p), ("fragments", ctypes.c_int32),
                ("tensors", ctypes.POINTER(Tensor)), ("n_tensors", ctypes.c_int32),
                ("max_tokens_per_step", ctypes.c_uint64), ("gpt2", ctypes.POINTER(Gpt2Config)),
                ("config_path", ctypes.c_char_p), ("log", LOG_FN), ("log_ctx", ctypes.c_void_p),
                ("device", ctypes.c_char_p), ("start_step", ctypes.c_int64)]


class Span(ctypes.Structure):
    _fields_ = [("tensor", ctypes.c_int32), ("fragment", ctypes.c_int32), ("start", ctypes.c_uint64),
                ("numel", ctypes.c_uint64), ("offset", ctypes.c_uint64)]


READ_BEGIN_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32)
READ_END_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                               ctypes.POINTER(ctypes.POINTER(ctypes.c_float)))
APPLY_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_float,
                            ctypes.POINTER(ctypes.c_float))


class Callbacks(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("ctx", ctypes.c_void_p), ("deferred", ctypes.c_int32),
                ("read_begin", READ_BEGIN_FN), ("read_end", READ_END_FN), ("apply", APPLY_FN)]


class StepInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("pushes", ctypes.c_int32), ("adopted", ctypes.c_int32),
                ("barrier_waited", ctypes.c_int32), ("barrier_wait_s", ctypes.c_double),
                ("step", ctypes.c_uint64), ("stop_requested", ctypes.c_int32), ("h", ctypes.c_int32),
                ("fragment_changed", ctypes.POINTER(ctypes.c_uint8)),
                ("tensor_changed", ctypes.POINTER(ctypes.c_uint8))]


class Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("state", ctypes.c_int32)] + [
        (n, ctypes.c_uint64) for n in ("steps", "tokens", "pushes", "push_bytes", "accepted", "dropped_stale",
                                       "rejected", "coalesced", "adopted", "rebased", "ignored", "refused",
                                       "held", "hold_released", "barrier_waits")] + [
        ("barrier_wait_s", ctypes.c_double)] + [
        (n, ctypes.c_uint64) for n in ("bytes_sent", "bytes_received", "rehellos", "rebuilds", "epoch")] + [
        ("h", ctypes.c_uint32), ("flush_unanswered", ctypes.c_int32)]


_c = ctypes.c_void_p  # dloco_learner *
_PROTOS = {
    "dloco_learner_api_version": (ctypes.c_int32, []),
    "dloco_learner_strerror": (ctypes.c_char_p, [ctypes.c_int32]),
    "dloco_learner_opts_init": (None, [ctypes.POINTER(Opts)]),
    "dloco_learner_open": (ctypes.c_int, [ctypes.POINTER(Opts), ctypes.POINTER(_c)]),
    "dloco_learner_close": (None, [ctypes.POINTER(_c)]),
    "dloco_learner_errmsg": (ctypes.c_char_p, [_c]),
    "dloco_learner_set_option": (ctypes.c_int, [_c, ctypes.c_char_p, ctypes.c_char_p]),
    "dloco_learner_save_state": (ctypes.c_int, [_c]),
    "dloco_learner_fragments": (ctypes.c_int32, [_c]),
    "dloco_learner_fingerprint": (ctypes.c_uint64, [_c]),
    "dloco_learner_numel": (ctypes.c_uint64, [_c]),
    "dloco_learner_fragment_numel": (ctypes.c_uint64, [_c, ctypes.c_int32]),
    "dloco_learner_fragment_nspans": (ctypes.c_int32, [_c, ctypes.c_int32]),
    "dloco_learner_fragment_span": (ctypes.c_int, [_c, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(Span)]),
    "dloco_learner_gpt2_manifest": (ctypes.c_int32, [ctypes.POINTER(Gpt2Config), ctypes.POINTER(Tensor),
                                                     ctypes.c_int32]),
    "dloco_learner_bind_host": (ctypes.c_int, [_c, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]),
    "dloco_learner_bind_contiguous": (ctypes.c_int, [_c, ctypes.c_void_p, ctypes.c_uint64]),
    "dloco_learner_bind_callbacks": (ctypes.c_int, [_c, ctypes.POINTER(Callbacks)]),
    "dloco_learner_join": (ctypes.c_int, [_c, ctypes.c_int32]),
    "dloco_learner_step": (ctypes.c_int, [_c, ctypes.c_uint64, ctypes.c_double, ctypes.c_double,
                                          ctypes.POINTER(StepInfo)]),
    "dloco_learner_finish": (ctypes.c_int, [_c, ctypes.c_int32, ctypes.c_char_p]),
    "dloco_learner_stop": (None, [_c]),
    "dloco_learner_get_stats": (ctypes.c_int, [_c, ctypes.POINTER(Stats)]),
}


def candidates():
    """Where the library is looked for, in order."""
    env = os.environ.get("DLOCO_LIBRARY")
    if env:
        return [env]  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, SONAME), os.path.join(here, "libdloco_learner.so")]
    # installed: <prefix>/lib/python3/dist-packages/dloco -> <prefix>/lib[/<multiarch>]
    prefix = os.path.normpath(os.path.join(here, "..", "..", "..", ".."))
    for d in [os.path.join(prefix, "lib")] + sorted(glob.glob(os.path.join(prefix, "lib", "*-linux-gnu"))):
        out.append(os.path.join(d, SONAME))
    # a build tree: <repo>/python/dloco -> <repo>/build*/...
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    for b in ["build"] + sorted(d for d in os.listdir(repo) if d.startswith("build") and d != "build"):
        for sub in ("learner", "lib", ""):
            out.append(os.path.join(repo, b, sub, "libdloco_learner.so"))
    found = ctypes.util.find_library("dloco_learner")
    if found:
        out.append(found)
    return out


_lib = None


def lib():
    """The loaded library (loaded and checked on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    tried, errors = [], []
    for path in candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        missing = [n for n in _PROTOS if not hasattr(handle, n)]
        if missing:
            errors.append("%s: not a dloco learner library (no %s)" % (path, missing[0]))
            continue
        for name, (res, args) in _PROTOS.items():
            f = getattr(handle, name)
            f.restype, f.argtypes = res, args
        v = handle.dloco_learner_api_version()
        if v // 10000 != API_MAJOR or v % 10000 < API_MINOR:
            raise LibraryNotFound(
                "%s has learner API %d.%d; this dloco package needs %d.%d or a later %d.x: rebuild the library "
                "and the package from the same checkout (or point DLOCO_LIBRARY at a matching build)"
                % (path, v // 10000, v % 10000, API_MAJOR, API_MINOR, API_MAJOR))
        handle.path = path
        _lib = handle
        return _lib
    raise LibraryNotFound(
        "libdloco_learner.so not found (%s); build it (cmake --build build --target dloco_learner), "
        "install it (cmake --install build), or set DLOCO_LIBRARY to its path"
        % "; ".join(errors + ["looked at " + ", ".join(tried[:6]) + (" ..." if len(tried) > 6 else "")]))
