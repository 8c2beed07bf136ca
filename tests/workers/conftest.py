"""Shared real models and datasets for the host-side toolchain tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.fixtures.models import (
    DigitsModel,
    ModelFiles,
    build_transformer_like,
    train_digits_cnn,
    write_model_files,
    write_npz,
)


@pytest.fixture(scope="session")
def digits() -> DigitsModel:
    return train_digits_cnn()


@pytest.fixture(scope="session")
def digits_files(digits: DigitsModel, tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    return write_model_files(digits, tmp_path_factory.mktemp("digits"), "digits")


@pytest.fixture(scope="session")
def digits_path(digits_files: ModelFiles) -> Path:
    return digits_files.model


@pytest.fixture(scope="session")
def digits_calibration(digits_files: ModelFiles) -> Path:
    return digits_files.calibration


@pytest.fixture(scope="session")
def digits_validation(digits_files: ModelFiles) -> Path:
    return digits_files.validation


@pytest.fixture(scope="session")
def transformer() -> onnx.ModelProto:
    return build_transformer_like()


@pytest.fixture(scope="session")
def transformer_path(transformer: onnx.ModelProto, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("transformer") / "transformer.onnx"
    onnx.save(transformer, str(path))
    return path


@pytest.fixture(scope="session")
def transformer_inputs() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((24, 16, 32)).astype(np.float32)


@pytest.fixture(scope="session")
def transformer_calibration(transformer_inputs: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_npz(tmp_path_factory.mktemp("tcalib") / "calibration.npz", input=transformer_inputs)
