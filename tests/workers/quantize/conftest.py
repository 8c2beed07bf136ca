"""Fixtures for the quantization-intelligence tests: the digits MLP (MatMul weights) and its data."""

from __future__ import annotations

import pytest

from tests.fixtures.mlp import DigitsMlp, train_digits_mlp
from tests.fixtures.models import ModelFiles, write_model_files


@pytest.fixture(scope="session")
def mlp() -> DigitsMlp:
    return train_digits_mlp()


@pytest.fixture(scope="session")
def mlp_files(mlp: DigitsMlp, tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    return write_model_files(mlp, tmp_path_factory.mktemp("mlp"), "mlp")
