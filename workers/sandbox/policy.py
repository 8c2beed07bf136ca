"""Who decides how the sandbox runs: read once from the environment, checked, and used by every caller.

`KILN_SANDBOX_ALLOW_UNCONFINED=true` lets a sandboxed command run where the kernel grants none of the OS
confinements (rlimits and the in-process guard only). That is a development convenience, never a server
setting: outside the test suite and `KILN_DEBUG=true` it is refused at start-up (settings.py turns the
error into ImproperlyConfigured), so a production server either confines every parser or parses nothing.
"""
from __future__ import annotations

import os
import sys

ALLOW_UNCONFINED_ENV = "KILN_SANDBOX_ALLOW_UNCONFINED"
UID_ENV = "KILN_SANDBOX_UID"
DEBUG_ENV = "KILN_DEBUG"
NOBODY = 65534
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class UnsafeSandboxSetting(ValueError):
    """A sandbox setting that would leave users' files unconfined on a server; the message says what to change."""


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise UnsafeSandboxSetting(f"{name} must be true or false, got {raw!r}")


def development() -> bool:
    """The test suite, or a server started with KILN_DEBUG=true: the only places running unconfined is allowed."""
    return "pytest" in sys.modules or _flag(DEBUG_ENV)


def allow_unconfined() -> bool:
    """Whether a command may run without OS confinement where the kernel grants none (development only)."""
    if not _flag(ALLOW_UNCONFINED_ENV):
        return False
    if not development():
        raise UnsafeSandboxSetting(
            f"{ALLOW_UNCONFINED_ENV}=true is for tests and development (KILN_DEBUG=true) only: on a server it would let "
            "every model and dataset parser run as this process's user with the network and the whole file system. "
            f"Unset it, and give the server a kernel that grants user or mount namespaces, Landlock or seccomp "
            "(`python platform/manage.py sandbox` shows which).")
    return True


def sandbox_uid() -> int:
    """The identity a sandbox started by root takes (65534, nobody, unless KILN_SANDBOX_UID says otherwise)."""
    raw = os.environ.get(UID_ENV, "").strip()
    if not raw:
        return NOBODY
    if not raw.isdigit() or int(raw) < 1:
        raise UnsafeSandboxSetting(f"{UID_ENV} must be a user id other than root (a whole number of at least 1), got {raw!r}")
    return int(raw)
