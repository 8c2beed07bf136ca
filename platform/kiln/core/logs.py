"""Logs as one JSON object per line (KILN_LOG_JSON), carrying the job, device task and Celery task ids."""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from celery import current_task

# Ids the code passes with `extra=` (job_event_add, stage runners, fleet services).
CONTEXT_FIELDS = ("job_id", "task_id", "variant_id", "agent_id", "stage")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        celery_task = current_task
        if celery_task and celery_task.request and celery_task.request.id:
            entry["celery_task"] = celery_task.name
            entry["celery_task_id"] = celery_task.request.id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
