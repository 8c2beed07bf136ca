"""`GET /metrics`: Prometheus text of the server's instruments and of the fleet's state in the database."""
from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpResponse
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from kiln.fleet.selectors import agents_online_count
from kiln.pipeline.selectors import JOB_DURATION_BUCKETS, device_tasks_by_status, finished_job_durations, jobs_by_status_and_stage

from .errors import json_error
from .metrics import CONTENT_TYPE, exposition


class FleetStateCollector:
    """Gauges read from the database at scrape time, so every process and host reports the same."""

    def collect(self):
        jobs = GaugeMetricFamily("kiln_jobs", "Jobs by status and stage (queue depth per stage).", labels=["status", "stage"])
        for status, stage, count in jobs_by_status_and_stage():
            jobs.add_metric([status, stage], count)
        yield jobs
        tasks = GaugeMetricFamily("kiln_device_tasks", "Device tasks by status (leased = leases held now).", labels=["status"])
        for status, count in sorted(device_tasks_by_status().items()):
            tasks.add_metric([status], count)
        yield tasks
        yield GaugeMetricFamily("kiln_agents_online", "Agents with a recent heartbeat.", value=agents_online_count())
        cumulative, total, count = finished_job_durations()
        buckets = [(str(bound), value) for bound, value in zip(JOB_DURATION_BUCKETS, cumulative, strict=True)] + [("+Inf", count)]
        yield HistogramMetricFamily("kiln_job_duration_seconds", "Time from a job's creation to its end.", buckets=buckets, sum_value=total)


def metrics(request):
    """404 unless KILN_METRICS is on; with KILN_METRICS_TOKEN set, the scraper must send it as a bearer token."""
    if not settings.METRICS:
        return json_error("Not found.", "not_found", 404)
    if settings.METRICS_TOKEN:
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(sent.encode(), settings.METRICS_TOKEN.encode()):
            return json_error("Send the metrics token: Authorization: Bearer …", "not_authenticated", 401)
    return HttpResponse(exposition(FleetStateCollector()), content_type=CONTENT_TYPE)
