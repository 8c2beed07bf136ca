"""The sandbox's report in words: what the kernel granted, and what that means for every parser of a user's file."""
from __future__ import annotations

from .confine import OS_CONFINEMENTS

_NAMES = {"user": "unprivileged user", "mount_namespace": "private file tree (mount namespace)",
          "network_namespace": "no network (network namespace)", "pid_namespace": "own process table (PID namespace)",
          "landlock": "Landlock", "seccomp": "seccomp filter"}


def granted_names(sandbox: dict) -> list[str]:
    names = []
    for key, label in _NAMES.items():
        value = sandbox.get(key)
        if value:
            names.append(f"{label} ({value})" if isinstance(value, str) else f"{label} ABI {value}" if key == "landlock" else label)
    return names


CONFINED_WORK = ("uploads (ONNX, PyTorch, datasets), convert, simplify, validate, support checks, the FP32 reference, "
                 "calibration, quantize and build, PyTorch export")


def in_force(sandbox: dict, *, allow_unconfined: bool) -> str:
    """One line: which confinement every parser of a user's file runs under on this host, or that none does."""
    if any(sandbox.get(key) for key in OS_CONFINEMENTS):
        return f"every parser of a user's file runs confined ({CONFINED_WORK})"
    if allow_unconfined:
        return "NO OS confinement: users' files are parsed with rlimits only (KILN_SANDBOX_ALLOW_UNCONFINED=true, development only)"
    return "no OS confinement is available: users' models and datasets are refused (503) until the kernel grants one"


def describe(report: dict, *, allow_unconfined: bool) -> str:
    sandbox = report["sandbox"]
    missing = [_NAMES[key] for key in _NAMES if not sandbox.get(key)]
    lines = ["Granted: " + (", ".join(granted_names(sandbox)) or "nothing")]
    if missing:
        lines.append("Not granted: " + ", ".join(missing) + (f" ({'; '.join(sandbox['notes'])})" if sandbox.get("notes") else ""))
    for attempt, outcome in report["escapes"].items():
        lines.append(f"  {attempt}: {outcome}")
    sentence = in_force(sandbox, allow_unconfined=allow_unconfined)
    lines.append(sentence[0].upper() + sentence[1:] + ".")
    return "\n".join(lines)
