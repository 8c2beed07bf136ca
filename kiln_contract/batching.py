"""Where the samples are in a model's output: the one rule the host's reference run, the host's
search and the agent all follow, so their arrays line up sample for sample."""

from __future__ import annotations

import numpy as np


def sample_rows(output: np.ndarray, *, batch_size: int, rows: int) -> np.ndarray:
    """The first `rows` samples of one run's output, stacked on a leading sample axis.

    Most outputs lead with the batch axis. A batch-1 model may put it elsewhere (a CTC recognizer's
    `[T, 1, C]`): its output is then one whole sample, given a new leading axis.
    """
    output = np.asarray(output)
    if output.ndim and output.shape[0] == batch_size:
        return output[:rows]
    if batch_size == 1:
        return output[None]
    raise ValueError(f"output of shape {list(output.shape)} has no batch axis of size {batch_size}; cannot split it per sample")
