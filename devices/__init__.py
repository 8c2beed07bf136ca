"""Kiln's device side: the agent, its runtimes and the benchmark protocol."""
from kiln_contract.telemetry import vendor_telemetry_off

vendor_telemetry_off()
