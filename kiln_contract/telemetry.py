"""No vendor telemetry from a Kiln process: OpenVINO's converter (OVC) and NNCF send usage events to Google Analytics
through `openvino_telemetry` unless a consent file in the user's home says no, each send a forked process
(multiprocessing) of the caller. A self-hosted platform sends nothing home, and a fork of a sandboxed build holding
hundreds of MB was counted against its memory budget and stopped it (CI, 2026-12-07).

`vendor_telemetry_off()` makes `import openvino_telemetry` fail in this process (a None entry in sys.modules), so OVC and
NNCF take their own no-telemetry stubs. It must run before they are imported; `workers` and `devices` call it on import.
"""
from __future__ import annotations

import sys

VENDOR_TELEMETRY = ("openvino_telemetry",)


def vendor_telemetry_off() -> bool:
    """Turn the vendors' telemetry off in this process; False if one was imported already (then it is left as it is)."""
    already = [name for name in VENDOR_TELEMETRY if sys.modules.get(name) is not None]
    for name in VENDOR_TELEMETRY:
        sys.modules.setdefault(name, None)
    return not already
