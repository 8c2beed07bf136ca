"""The sandbox's report in words: what the kernel granted, and what that means for PyTorch uploads."""
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


def describe(report: dict, *, allow_unconfined: bool) -> str:
    sandbox = report["sandbox"]
    missing = [_NAMES[key] for key in _NAMES if not sandbox.get(key)]
    lines = ["Granted: " + (", ".join(granted_names(sandbox)) or "nothing")]
    if missing:
        lines.append("Not granted: " + ", ".join(missing) + (f" ({'; '.join(sandbox['notes'])})" if sandbox.get("notes") else ""))
    for attempt, outcome in report["escapes"].items():
        lines.append(f"  {attempt}: {outcome}")
    if any(sandbox.get(key) for key in OS_CONFINEMENTS):
        lines.append("PyTorch uploads are loaded in this sandbox.")
    elif allow_unconfined:
        lines.append("PyTorch uploads are loaded WITHOUT OS confinement (KILN_SANDBOX_ALLOW_UNCONFINED=true).")
    else:
        lines.append("PyTorch uploads are refused: no OS confinement is available (KILN_SANDBOX_ALLOW_UNCONFINED=true overrides).")
    return "\n".join(lines)
