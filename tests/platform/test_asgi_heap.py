"""A web worker's garbage collector leaves what booting loaded alone, and collects its youngest objects less often.

Run in a fresh interpreter: importing kiln.asgi is what a uvicorn worker does when it boots (and
freezing this test process's own heap would change every test after this one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kiln.core.heap import GEN0_THRESHOLD

REPO = Path(__file__).resolve().parents[2]

WORKER_BOOT = """
import gc, json
import kiln.asgi
walked = {id(o) for o in gc.get_objects()}
print(json.dumps({"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
                  "application_walked": id(kiln.asgi.application) in walked,
                  "handler_class_walked": id(type(kiln.asgi.application)) in walked,
                  "tracked_after_boot": len(walked)}))
"""


def boot_a_worker() -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kiln.settings",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", WORKER_BOOT], env=env, cwd=REPO / "platform", capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_booted_worker_freezes_its_modules_and_raises_the_youngest_threshold():
    worker = boot_a_worker()
    # Django, DRF and every view module: tens of thousands of objects no collection walks again.
    assert worker["frozen"] > 50_000
    assert worker["frozen"] > 10 * worker["tracked_after_boot"]
    assert not worker["application_walked"] and not worker["handler_class_walked"]
    assert worker["threshold"][0] == GEN0_THRESHOLD > 700
