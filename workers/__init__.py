"""Kiln's host side: builds, the sandbox, scoring and the pipeline's Celery tasks."""
from kiln_contract.telemetry import vendor_telemetry_off

vendor_telemetry_off()
