"""Confinement for code that parses users' files with native code: PyTorch loading and export, and the like.

`runner.run_confined` (the parent side) starts `python -m workers.sandbox.child`, which first confines itself
with what the kernel grants (`confine.enter`: namespaces, a minimal read-only file tree, an unprivileged user,
Landlock, seccomp, rlimits) and only then imports and runs the named command.
"""
