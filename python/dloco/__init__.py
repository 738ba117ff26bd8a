"""dloco: train your own PyTorch model as one learner of a dloco run.

    import dloco
    dl = dloco.Learner(model, connect="tcp://sync:5555", run_id="run1", fragments=8,
                       max_tokens_per_step=B * T)
    dl.join()
    for ...:  # your loop: forward, backward, optimizer.step(), then
        dl.step(B * T, loss)
    dl.finish()

Pure Python over ctypes: needs libdloco_learner.so (next to the package, in
the build tree, installed, or named by DLOCO_LIBRARY) and torch for models.
docs/LIBRARY.md is the guide."""
from ._lib import API_MAJOR, API_MINOR
from .errors import (CallbackError, Error, FileError, InvalidArgument, LibraryNotFound, ManifestError,
                     NetworkError, OutOfMemory, Refused, StateError, Stopped, Timeout)
from .learner import Learner, StepResult, api_version, gpt2_manifest
from .manifest import build as manifest, load_into, read_safetensors, to_json as manifest_json, write_init, \
    write_manifest

__all__ = ["Learner", "StepResult", "Error", "ManifestError", "InvalidArgument", "FileError", "OutOfMemory",
           "NetworkError", "Refused", "Timeout", "StateError", "Stopped", "CallbackError", "LibraryNotFound",
           "write_init", "write_manifest", "manifest", "manifest_json", "read_safetensors", "load_into",
           "api_version", "gpt2_manifest", "check_library", "API_MAJOR", "API_MINOR"]


def check_library():
    """Load libdloco_learner now (it is loaded on first use otherwise) and
    check its API version; returns its path. Raises LibraryNotFound with the
    places looked at and the fix."""
    from . import _lib
    return _lib.lib().path


import os as _os

if _os.environ.get("DLOCO_CHECK_AT_IMPORT", "1") != "0":
    # The API version is checked at import when the library can be found, so
    # a mismatched build fails loudly here; a missing library only fails when
    # a Learner is made (manifests and init files need no library).
    try:
        check_library()
    except LibraryNotFound as _e:
        if "API" in str(_e):
            raise
del _os
