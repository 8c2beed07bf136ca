"""The server's runtimes asked about a model's operators (devices/support.py), in a child process.

A runtime's reader may crash on a model it cannot take (a native abort, a segfault), which in-process would take the
web or Celery worker with it. The child answers in JSON; when it dies instead, each backend is asked again in a child
of its own, so that the one that crashes is named, as `cannot_run`, with the signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from devices import support

TIMEOUT_S = 300.0


class SupportCheckFailed(RuntimeError):
    """The check itself could not run (the child printed no answer for a reason other than a runtime's crash)."""


def _child(model_path: Path, backends: list[str] | None, timeout_s: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "devices.support", str(model_path), "--json"]
    for name in backends or []:
        command += ["--backend", name]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())


def _died(completed: subprocess.CompletedProcess) -> str:
    if completed.returncode < 0:
        try:
            return f"signal {signal.Signals(-completed.returncode).name}"
        except ValueError:
            return f"signal {-completed.returncode}"
    tail = (completed.stderr or "").strip().splitlines()[-1:] or [""]
    return f"exit status {completed.returncode}: {tail[0][:500]}"


def check_isolated(model_path: str | Path, backends: Iterable[str] | None = None, *, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """Each backend's answer (all the server has when `backends` is None), the way `devices.support.check` gives them."""
    names = sorted(set(backends)) if backends is not None else None
    completed = _child(Path(model_path), names, timeout_s)
    if completed.returncode == 0:
        return json.loads(completed.stdout.strip().splitlines()[-1])
    if not names:
        raise SupportCheckFailed(f"the operator-support check failed ({_died(completed)})")
    answers = []
    for name in names:
        alone = _child(Path(model_path), [name], timeout_s)
        if alone.returncode == 0:
            answers += json.loads(alone.stdout.strip().splitlines()[-1])
        else:
            answers.append(support.answer(backend=name, runtime=name, version=None, device="", source="operator_support", refused=True,
                                          reason=f"{name} crashed while reading the model ({_died(alone)})"))
    return answers
