"""Fixtures for the quantization-intelligence tests: the digits MLP (MatMul weights) and its data."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.fixtures.mlp import DigitsMlp, train_digits_mlp
from tests.fixtures.models import write_npz


@pytest.fixture(scope="session")
def mlp() -> DigitsMlp:
    return train_digits_mlp()


@pytest.fixture(scope="session")
def mlp_path(mlp: DigitsMlp, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    onnx.save(mlp.model, str(path))
    return path


@pytest.fixture(scope="session")
def mlp_calibration(mlp: DigitsMlp, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_npz(tmp_path_factory.mktemp("mlp-calib") / "calibration.npz", input=mlp.x_calib)


@pytest.fixture(scope="session")
def mlp_validation(mlp: DigitsMlp, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_npz(tmp_path_factory.mktemp("mlp-val") / "validation.npz", input=mlp.x_val, labels=mlp.y_val)
