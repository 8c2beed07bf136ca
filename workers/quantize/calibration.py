"""Feed calibration batches from an .npz to onnxruntime's static quantizer without loading it whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from workers.datasets import batch_rows, iter_batches


class NpzCalibrationReader(CalibrationDataReader):
    """A CalibrationDataReader that streams batches from an .npz and counts the samples it served."""

    def __init__(
        self, path: str | Path, *, input_names: list[str], batch_size: int, limit: int | None = None
    ) -> None:
        self.path = Path(path)
        self.input_names = list(input_names)
        self.batch_size = batch_size
        self.limit = limit
        self.samples_read = 0
        self._batches: Iterator[dict[str, np.ndarray]] | None = None

    def get_next(self) -> dict[str, np.ndarray] | None:
        """Return the next batch as `{input name: array}`, or None when the data is used up."""
        if self._batches is None:
            self._batches = iter_batches(
                self.path, input_names=self.input_names, batch_size=self.batch_size, limit=self.limit
            )
        batch = next(self._batches, None)
        if batch is not None:
            self.samples_read += batch_rows(batch)
        return batch

    def rewind(self) -> None:
        """Start again from the first sample (some calibrators make several passes)."""
        if self._batches is not None:
            self._batches.close()
        self._batches = None
        self.samples_read = 0
