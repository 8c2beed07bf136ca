"""JSON logs (KILN_LOG_JSON): one object per line with the job, device task and Celery task ids."""
from __future__ import annotations

import json
import logging
import sys

from kiln.core.logs import JsonFormatter
from workers.celery import app


def record(message: str, **extra) -> logging.LogRecord:
    logger = logging.getLogger("kiln.test")
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, (), None, extra=extra)


def test_a_line_is_json_with_the_ids_it_was_given():
    line = JsonFormatter().format(record("requeued", job_id=7, task_id=42, stage="devices"))
    entry = json.loads(line)
    assert entry["message"] == "requeued" and entry["level"] == "warning"
    assert entry["job_id"] == 7 and entry["task_id"] == 42 and entry["stage"] == "devices"
    assert "variant_id" not in entry and "celery_task_id" not in entry


def test_inside_a_celery_task_the_line_names_the_task():
    @app.task(name="kiln.test.log_line")
    def log_line() -> str:
        return JsonFormatter().format(record("working", job_id=3))

    entry = json.loads(log_line.apply(task_id="abc-123").get())
    assert entry["celery_task_id"] == "abc-123" and entry["celery_task"] == "kiln.test.log_line" and entry["job_id"] == 3


def test_an_exception_is_one_line_too():
    try:
        raise ValueError("boom")
    except ValueError:
        failing = record("crashed", job_id=1)
        failing.exc_info = sys.exc_info()
    line = JsonFormatter().format(failing)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]
