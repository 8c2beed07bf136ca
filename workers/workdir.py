"""Working directories for host-side work: libraries that drop scratch files into the current
directory write them into a private temporary folder, never into the checkout or the worker's home.

onnxruntime's symbolic shape inference saves `sym_shape_infer_temp.onnx` and `<uuid>.data` files into
the current directory when it cannot infer every shape (it does so inside `quant_pre_process`), and
NNCF writes scratch models there too. Both only know "the current directory", so Kiln moves it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The current directory belongs to the process: one region at a time may move it.
_CWD_LOCK = threading.RLock()
# Celery tasks in progress in this process: (task id, directory to go back to, private folder).
_TASK_DIRS: list[tuple[str, str, Path]] = []


@contextmanager
def working_directory(path: Path) -> Iterator[Path]:
    """Run the body with `path` as the current directory (serialized within the process)."""
    with _CWD_LOCK:
        previous = os.getcwd()
        os.chdir(path)
        try:
            yield path
        finally:
            os.chdir(previous)


def task_work_dir_enter(task_id: str) -> Path:
    """Give a Celery task its own empty working directory (see `workers.celery`'s signal handlers)."""
    path = Path(tempfile.mkdtemp(prefix="kiln-task-"))
    _TASK_DIRS.append((task_id, os.getcwd(), path))
    os.chdir(path)
    return path


def task_work_dir_leave(task_id: str) -> None:
    """Go back to where the task started and remove whatever it left in its working directory."""
    for index in range(len(_TASK_DIRS) - 1, -1, -1):
        if _TASK_DIRS[index][0] == task_id:
            _, previous, path = _TASK_DIRS.pop(index)
            os.chdir(previous)
            shutil.rmtree(path, ignore_errors=True)
            return
