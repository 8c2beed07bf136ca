"""`kiln devices` and `kiln jobs` in an 80-column terminal: names and times whole, times relative, `kiln jobs` lists."""
from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from rich.console import Console

from kiln_client.cli import devices_table, jobs_table, main, relative_time

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ago(**delta) -> str:
    return (NOW - timedelta(**delta)).isoformat().replace("+00:00", "Z")


def rendered(table, width: int = 80) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(table)
    return buffer.getvalue()


def test_relative_times_fit_a_narrow_column():
    assert relative_time(ago(seconds=2), NOW) == "just now"
    assert relative_time(ago(seconds=42), NOW) == "42 s ago"
    assert relative_time(ago(minutes=3, seconds=10), NOW) == "3 min ago"
    assert relative_time(ago(hours=5), NOW) == "5 h ago"
    assert relative_time(ago(days=6), NOW) == "6 d ago"
    assert relative_time(ago(days=40), NOW) == "2026-10-22"
    assert relative_time(None, NOW) == "never"


AGENTS = [
    {"id": 12, "name": "jetson-orin-nano-lab-bench-2", "online": True, "labels": {"site": "lab", "board": "orin-nano"},
     "capabilities": {"runtimes": {"onnxruntime": "1.32.0", "openvino": "2026.4.1", "litert": "2.1.0"}}, "last_heartbeat_at": ago(seconds=3)},
    {"id": 7, "name": "raspberry-pi-5-kitchen", "online": False, "labels": {}, "capabilities": {"runtimes": {"onnxruntime": "1.32.0"}},
     "last_heartbeat_at": ago(minutes=14)},
]


def test_at_80_columns_kiln_devices_keeps_every_name_runtime_and_heartbeat_whole():
    text = rendered(devices_table(AGENTS, NOW))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in text
    for agent in AGENTS:
        assert any(agent["name"] in line for line in lines), agent["name"]
    assert any("jetson-orin-nano-lab-bench-2" in line and "just now" in line for line in lines)
    assert any("raspberry-pi-5-kitchen" in line and "14 min ago" in line for line in lines)
    for value in ("onnxruntime 1.32.0", "openvino 2026.4.1", "litert 2.1.0", "site=lab", "board=orin-nano"):
        assert any(value in line for line in lines), value


JOBS = [
    {"id": 118, "model": {"name": "mobilenet-v3-small-shapes-classifier"}, "status": "waiting_for_devices", "stage": "dispatch",
     "progress": 0.42, "rerun_of": 97, "created_at": ago(minutes=7)},
    {"id": 121, "model": {"name": "layout"}, "status": "running", "stage": "quantize", "progress": 0.3, "rerun_of": None,
     "created_at": ago(minutes=2), "waiting": {"cause": "build_slot", "position": 2, "since": None,
                                              "message": "waiting for a build slot: 2 jobs ahead (5 builds)"}},
    {"id": 97, "model": {"name": "digits"}, "status": "succeeded", "stage": "done", "progress": 1.0, "rerun_of": None, "created_at": ago(hours=26)},
]


def test_at_80_columns_kiln_jobs_keeps_model_names_and_times_whole():
    text = rendered(jobs_table(JOBS, NOW))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in text
    assert any("mobilenet-v3-small-shapes-classifier" in line and "7 min ago" in line for line in lines), text
    assert any("re-run of #97" in line for line in lines), text
    assert any("digits" in line and "26 h ago" in line and "100%" in line for line in lines), text
    # Why a job waits, under its stage, wrapped and never cut (issue 33).
    assert "waiting for a build slot: 2 jobs ahead (5 builds)" in " ".join(" ".join(line.split()) for line in lines).replace("│", ""), text


def test_bare_kiln_jobs_lists_like_kiln_jobs_list(monkeypatch):
    """`kiln jobs` alone lists (it once printed its sub-commands); both read the same jobs."""
    import kiln_client.cli as cli

    class Listing:
        def jobs(self):
            return JOBS

    monkeypatch.setattr(cli, "_client", lambda ctx: Listing())
    runner = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"})
    bare, listed = runner.invoke(main, ["jobs"]), runner.invoke(main, ["jobs", "list"])
    assert bare.exit_code == 0 and listed.exit_code == 0, bare.output
    assert "mobilenet-v3-small-shapes-classifier" in bare.output and bare.output == listed.output
    assert '"id": 118' in runner.invoke(main, ["jobs", "--json"]).output
