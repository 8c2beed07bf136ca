"""Run the test suite as parallel shards, each with its own database, Redis db and data folder; print each shard's log.

`make test-python` calls this when no PYTEST_ARGS are given. The machine has two cores and much of the suite waits
on real processes (servers, workers, agents, a browser), so pytest processes side by side finish well before one: the
end-to-end files (and a few heavy ones, HEAVY_FILES) dealt over two by their recorded durations, everything else in a third.
Each shard gets `KILN_DATA_DIR=var/test/shard-N` (its own SQLite and queue on the embedded default), and, where
DATABASE_URL / REDIS_URL are set, a database of its own (`<name>_shard_N`: pytest-django makes `test_<that>`) and a
Redis database of its own (the given number minus N), so that no shard's Celery worker takes another's tasks.
Tests marked `quiet` (their claim is about timing on a host with no load but their own) are left out of the shards and
run after them, alone, in one more pytest process on shard 0's environment.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parent.parent
# Seconds each end-to-end file took in a CI run (what the run prints from its JUnit reports): the files are dealt out over
# E2E_SHARDS shards, longest first, each to the shard with the least so far. A file not listed counts as the median.
DURATIONS = REPO / "tests" / "e2e_durations.json"
E2E_SHARDS = 2
# Files outside tests/e2e that take minutes (time-budgeted learning, whole pipelines): dealt with the end-to-end files so
# that the shard of everything else does not finish last alone (CI 2026-12-02: 460 s, 190 s and 110 s of its 2,435 s;
# CI 2026-12-06 on an AVX2 EPYC: that shard 2,109 s against 1,673 s and 1,742 s, packaging 154 s and the reaper 105 s of it).
HEAVY_FILES = ("tests/platform/pipeline/test_jobs.py", "tests/workers/learned/test_real_model.py", "tests/workers/learned/test_qat.py",
               "tests/platform/reports/test_packaging.py", "tests/platform/pipeline/test_reaper.py")
QUIET = "quiet"
QUIET_MARK = re.compile(rf"^\s*(@pytest\.mark\.{QUIET}\b|pytestmark\b.*\bmark\.{QUIET}\b)", re.MULTILINE)


def e2e_files() -> list[str]:
    return sorted(str(path.relative_to(REPO)) for path in (REPO / "tests" / "e2e").glob("test_*.py"))


def dealt_files() -> list[str]:
    """What is dealt over the E2E_SHARDS shards by duration: the end-to-end files and HEAVY_FILES."""
    return sorted([*e2e_files(), *HEAVY_FILES])


def deal(files: list[str], durations: dict[str, float], shards: int) -> list[list[str]]:
    """Longest-processing-time-first: each file to the shard that has the least work so far."""
    known = sorted(durations.values())
    default = known[len(known) // 2] if known else 60.0
    loads = [[0.0, []] for _ in range(shards)]
    for name in sorted(files, key=lambda name: (-durations.get(name, default), name)):
        lightest = min(loads, key=lambda load: load[0])
        lightest[0] += durations.get(name, default)
        lightest[1].append(name)
    return [sorted(names) for _, names in loads if names]


def shards() -> list[list[str]]:
    """The end-to-end files (real servers, workers, agents, a browser) and HEAVY_FILES over E2E_SHARDS shards; the rest in
    one more."""
    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    return [*deal(dealt_files(), durations, E2E_SHARDS), ["tests", "--ignore=tests/e2e", *(f"--ignore={name}" for name in HEAVY_FILES)]]


def quiet_files() -> list[str]:
    """The test files that hold a `quiet` test (found by the marker's decorator or `pytestmark` line: no import, no
    collection)."""
    return sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py") if QUIET_MARK.search(path.read_text(errors="replace")))


def shard_environment(index: int, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    data = Path(base.get("KILN_DATA_DIR") or REPO / "var" / "test") / f"shard-{index}"
    env["KILN_DATA_DIR"] = str(data)
    if base.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        env["DATABASE_URL"] = _database(base["DATABASE_URL"], index)
    if base.get("REDIS_URL"):
        env["REDIS_URL"] = _redis(base["REDIS_URL"], index)
    return env


def _database(url: str, index: int) -> str:
    head, _, name = url.rpartition("/")
    name, query = (name.split("?", 1) + [""])[:2]
    return f"{head}/{name or 'kiln'}_shard_{index}" + (f"?{query}" if query else "")


def _redis(url: str, index: int) -> str:
    match = re.match(r"^(redis://[^/]+)/(\d+)$", url)
    base_db = int(match.group(2)) if match else 15
    head = match.group(1) if match else url.rstrip("/")
    return f"{head}/{(base_db - index) % 16}"


def main(extra: list[str]) -> int:
    phases = [[(index, paths, ["-m", f"not {QUIET}"]) for index, paths in enumerate(shards())]]
    if quiet := quiet_files():
        phases.append([(0, quiet, ["-m", QUIET])])
    failed, reports = 0, []
    for phase_number, phase in enumerate(phases):
        processes = [_start(index, paths, [*marks, *extra], phase_number) for index, paths, marks in phase]
        for process in processes:
            failed = _finish(*process) or failed
            reports.append(process[3])
    print_e2e_durations(reports)
    return failed


def _start(index: int, paths: list[str], extra: list[str], phase: int) -> tuple:
    env = shard_environment(index, os.environ)
    Path(env["KILN_DATA_DIR"]).mkdir(parents=True, exist_ok=True)
    suffix = f"-phase-{phase}" if phase else ""
    log = Path(env["KILN_DATA_DIR"]) / f"pytest{suffix}.log"
    handle = log.open("w")
    # The slowest tests in every log: what to look at first when the suite grows past its time.
    junit = Path(env["KILN_DATA_DIR"]) / f"junit{suffix}.xml"
    command = [sys.executable, "-m", "pytest", *paths, "--durations=25", f"--junitxml={junit}", *extra]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    label = f"shard {index}" + (f" (phase {phase}, alone: {QUIET})" if phase else "")
    print(f"{label}: {' '.join(paths)} (log: {log})", flush=True)
    return label, paths, log, junit, handle, time.monotonic(), process


def _finish(label: str, paths: list[str], log: Path, _junit: Path, handle, started: float, process: subprocess.Popen) -> int:
    code = process.wait()
    handle.close()
    print(f"\n===== {label}: {' '.join(paths)}: exit {code} after {time.monotonic() - started:.0f} s =====", flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    # pytest exits 5 when a shard selected no test (every test of its files is quiet): nothing failed.
    return 0 if code == 5 else code


def e2e_durations(reports: list[Path]) -> dict[str, float]:
    """Seconds per dealt file (end-to-end and HEAVY_FILES: setup, call and teardown of its tests) from the shards' JUnit
    reports."""
    totals: dict[str, float] = {}
    for report in reports:
        if not report.exists():
            continue
        for case in ElementTree.parse(report).iter("testcase"):
            # "tests.e2e.test_ui" or, for a test class, "tests.e2e.test_ui.TestPages": the file is up to the test_ module.
            parts = case.get("classname", "").split(".")
            module = next((index for index, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
            name = "/".join(parts[:module + 1]) + ".py"
            if name.startswith("tests/e2e/") or name in HEAVY_FILES:
                totals[name] = totals.get(name, 0.0) + float(case.get("time") or 0.0)
    return {name: round(seconds) for name, seconds in sorted(totals.items())}


def print_e2e_durations(reports: list[Path]) -> None:
    """What this run measured, in the form of tests/e2e_durations.json, to deal the next runs by."""
    durations = e2e_durations(reports)
    if durations:
        print(f"\nend-to-end seconds per file (for {DURATIONS.relative_to(REPO)}):\n{json.dumps(durations, indent=2)}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
