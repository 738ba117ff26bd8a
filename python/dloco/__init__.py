"""dloco: join a dloco training run from a PyTorch training loop (placeholder; the package is being written).

The binding is pure Python over ctypes and loads libdloco_learner.so (include/dloco/learner.h).
"""
