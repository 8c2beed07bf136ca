"""The web worker's heap: the garbage collector's pauses kept short under a fleet's load.

Every pass of Python's cyclic garbage collector stops the worker's event loop (every request it
serves) while it walks the objects of the generations collected. A worker boots with about 140,000
tracked objects (Django, DRF, every view module and what they import), nearly all alive until it
exits, and under 1,000 agents it holds their connections and waiting long-polls besides: each full
collection (about 7 a minute per worker, with the default thresholds) took 0.27-0.50 s, and the
slowest user requests were those that waited one out.

`tune_for_serving` (1) freezes what booting left alive (`gc.freeze()`: a permanent generation that
collections skip) and (2) collects the youngest generation every GEN0_THRESHOLD allocations instead
of 700: fewer objects survive into the older generations for the short-lived ones (a request's),
so the older ones, and the full collection, come round far less often.
"""
from __future__ import annotations

import gc

# Net allocations of tracked objects between collections of the youngest generation (Python: 700).
GEN0_THRESHOLD = 5000


def tune_for_serving() -> int:
    """Collect what booting left as garbage, freeze the rest, raise the youngest generation's
    threshold; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
    return gc.get_freeze_count()
