"""`kiln jobs show` says why a job waits and that a first answer is in while the search refines it."""
from __future__ import annotations

import io

from rich.console import Console

from kiln_client import cli


def shown(job: dict, monkeypatch) -> str:
    buffer = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=buffer, width=80, color_system=None))
    cli.print_job(job)
    return buffer.getvalue()


def job(**changes) -> dict:
    return {"id": 6, "model": {"name": "layout", "version": 1}, "status": "running", "stage": "quantize", "progress": 0.4,
            "stages": [], "events": [], **changes}


def test_a_waiting_job_says_why_and_how_many_are_ahead(monkeypatch):
    text = shown(job(waiting={"cause": "build_slot", "position": 2, "since": None, "message": "waiting for a build slot: 2 jobs ahead (5 builds)"}),
                 monkeypatch)
    assert "Waiting: waiting for a build slot: 2 jobs ahead (5 builds)" in text


def test_a_search_with_a_first_answer_says_it_is_still_searching_until_it_ends(monkeypatch):
    assert "First answer in the report; still searching." in shown(job(budget={"minutes": 10, "first_answer_at": 5.0}), monkeypatch)
    assert "still searching" not in shown(job(status="succeeded", budget={"minutes": 10, "first_answer_at": 5.0}), monkeypatch)
    assert "Waiting" not in shown(job(waiting=None), monkeypatch)
