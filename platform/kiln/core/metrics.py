"""Prometheus instruments of the server processes (request latency, agent long-polls) and their text.

Counters live in this process; with KILN_METRICS on, prometheus_client's multiprocess mode keeps
them in files under PROMETHEUS_MULTIPROC_DIR so that a scrape of any server process sums them all.
"""
from __future__ import annotations

import os
import time

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REQUEST_SECONDS = Histogram(
    "kiln_http_request_duration_seconds", "Time to answer an HTTP request, by route (long-polls include their wait).",
    ["route", "method", "status"], buckets=LATENCY_BUCKETS,
)
LEASE_WAITING = Gauge("kiln_agent_lease_waiting", "Agent lease long-polls waiting now.", multiprocess_mode="livesum")
LEASE_CHECKS = Counter("kiln_agent_lease_checks", "Database checks for a leasable task made by lease long-polls.")
LEASE_WAKEUPS = Counter("kiln_agent_lease_wakeups", "Lease long-polls woken by a notification (a task became leasable, or a cancel).")
DB_QUERIES = Counter("kiln_db_queries", "SQL statements this server's processes sent to the database (web and workers).")

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _count_query(execute, sql, params, many, context):
    DB_QUERIES.inc()
    return execute(sql, params, many, context)


def count_queries(*, connection, **_) -> None:
    """Count every statement of a database connection (connection_created, on each connect or pool checkout)."""
    if _count_query not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count_query)


def observe_request(*, route: str, method: str, status: int, started: float) -> None:
    REQUEST_SECONDS.labels(route=route, method=method, status=f"{status // 100}xx").observe(time.perf_counter() - started)


def exposition(*collectors) -> bytes:
    """The Prometheus text of every process's instruments plus `collectors` (read at scrape time)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        registry.register(_Forward(REGISTRY))
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry)


class _Forward:
    """This process's default registry as one collector of another registry."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()
