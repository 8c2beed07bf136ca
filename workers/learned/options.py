"""The options of an int8 spec that ask for learning on top of its calibration (workers.learned.recipes), whichever
runtime it is built for; the variant builds (workers.quantize.variants) take them and hand them over."""

LEARN_OPTIONS = ("learn", "learn_seconds", "learn_samples", "learn_memory_mb", "learn_rate")
