"""The two ways a variant build refuses: the precision makes no sense for the model, or the build failed.

The sandboxed build (workers.quantize.isolated) sends them back by name and raises them again as these types.
"""


class NotApplicable(Exception):
    """This precision makes no sense for this model (e.g. int4 weights without MatMul weights)."""


class QuantizationError(Exception):
    """The variant could not be built; the message says why in words a user can act on."""
