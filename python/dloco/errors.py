"""The exceptions of the dloco package: one class per C error code of
include/dloco/learner.h, all under dloco.Error, each also a subclass of the
built-in exception a Python caller would expect (ValueError, TimeoutError...)."""


class Error(Exception):
    """Any failure of the dloco library or binding. `code` is the C error
    code (a negative DLOCO_E* value), or 0 for a failure found in Python."""

    code = 0

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class ManifestError(Error, ValueError):
    """The model cannot be described as a dloco manifest (a parameter that is
    not fp32, not contiguous, a bad role...): raised before any network."""


class InvalidArgument(Error, ValueError):
    """DLOCO_EINVAL / DLOCO_ERANGE / DLOCO_EMISMATCH: a bad option, manifest or value."""


class FileError(Error, OSError):
    """DLOCO_EIO / DLOCO_EFORMAT / DLOCO_EPERM: an options, key or events file."""


class OutOfMemory(Error, MemoryError):
    """DLOCO_ENOMEM."""


class NetworkError(Error, ConnectionError):
    """DLOCO_ENET: a session could not start or failed for good."""


class Refused(Error):
    """DLOCO_EREFUSED: the synchronizer refused this learner (another model,
    run id, fragment count, duplicate id, unknown key). Retrying cannot heal it."""


class Timeout(Error, TimeoutError):
    """DLOCO_ETIMEDOUT: join got no Welcome or initial fetch in time; the
    message names the endpoint(s) still silent."""


class StateError(Error, RuntimeError):
    """DLOCO_ESTATE: a call out of order (step before join, finish twice, a
    handle ended by an earlier failure)."""


class Stopped(Error):
    """DLOCO_ESTOPPED: Learner.stop() was called while join was waiting."""


class CallbackError(Error):
    """DLOCO_ECALLBACK: a parameter callback failed; the Python exception
    that made it fail is chained as __cause__."""


class LibraryNotFound(Error, ImportError):
    """libdloco_learner.so could not be found or is of another API version."""


_BY_CODE = {
    -1: InvalidArgument, -2: OutOfMemory, -3: FileError, -4: FileError, -6: InvalidArgument,
    -7: InvalidArgument, -10: NetworkError, -11: Refused, -15: Timeout, -18: FileError,
    -19: StateError, -20: Stopped, -21: CallbackError,
}


def from_code(code, message):
    """The exception for C error code `code` with the library's message."""
    return _BY_CODE.get(code, Error)(message, code)
