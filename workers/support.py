"""The server's runtimes asked about a model's operators (devices/support.py), in the sandbox (workers/sandbox).

A runtime's reader may crash on a model it cannot take (a native abort, a segfault), which in-process would take the
web or Celery worker with it, and it is native code parsing a user's file. The confined child answers in JSON; when it
dies instead, each backend is asked again in a child of its own, so that the one that crashes is named, as
`cannot_run`, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from devices import support
from kiln_contract import operator_support

from .sandbox.runner import SandboxFailed, Unconfined, model_shown, run_confined

TIMEOUT_S = 300.0


class SupportCheckFailed(RuntimeError):
    """The check itself could not run (the child printed no answer for a reason other than a runtime's crash)."""


def check_command(request: dict, work: Path) -> dict:
    """The sandbox's `support.check` command."""
    return {"answers": support.check(Path(request["model"]), request.get("backends"))}


# A check in the background runs on the CPU others leave idle, so its wall-clock limit is this much longer (its CPU limit
# is the same): on a host busy with builds, a harmless model's check must not run out of time waiting for a core.
BACKGROUND_WALL_FACTOR = 3


def _ask(model_path: Path, backends: list[str] | None, timeout_s: float, shared: tuple[Path, ...], background: bool) -> list[dict]:
    wall_s = timeout_s * (BACKGROUND_WALL_FACTOR if background else 1)
    return run_confined("support.check", {"model": str(model_path), "backends": backends}, shared=shared, wall_seconds=int(wall_s),
                        what="the operator-support check", background=background)["answers"]


def check_isolated(model_path: str | Path, backends: Iterable[str] | None = None, *, timeout_s: float = TIMEOUT_S,
                   folder: Path | None = None, background: bool = False) -> list[dict]:
    """Each backend's answer (all the server has when `backends` is None), the way `devices.support.check` gives them.

    `folder`: the model's own folder, when its external data lies there under names of its own (an extracted zip).
    `background`: nobody waits on the answer (an upload's check): the lowest CPU priority, so that a model that computes
    until its limit takes no CPU from the host's builds and timings.
    """
    names = sorted(set(backends)) if backends is not None else None
    shared = model_shown(Path(model_path), folder)
    try:
        return _ask(Path(model_path), names, timeout_s, shared, background)
    except Unconfined as refused:  # no runtime crashed: this host parses no user's file at all
        raise SupportCheckFailed(f"the operator-support check did not run ({refused})") from None
    except SandboxFailed as failed:
        if not names:
            raise SupportCheckFailed(f"the operator-support check failed ({failed})") from None
    answers = []
    for name in names:
        try:
            answers += _ask(Path(model_path), [name], timeout_s, shared, background)
        except SandboxFailed as failed:
            answers.append(operator_support.answer(backend=name, runtime=name, version=None, device="", source="operator_support", refused=True,
                                                   reason=f"{name} crashed while reading the model ({failed})"))
    return answers
