"""The sandbox PyTorch files are loaded in: no network, no processes, no reads or writes outside its folder, bounded memory."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.fixtures import torch_models
from workers.pytorch.sandbox import SandboxFailed, run_in_sandbox

pytestmark = pytest.mark.timeout(300)

GUARDED = textwrap.dedent("""
    import os, socket, subprocess, sys, tempfile
    from pathlib import Path
    from workers.pytorch.commands import install_guard
    private = Path(tempfile.mkdtemp())
    install_guard(private)
    def refused(action):
        try:
            action()
        except PermissionError as error:
            return "refused"
        except OSError as error:
            return f"oserror {error}"
        return "allowed"
    print("connect", refused(lambda: socket.create_connection(("127.0.0.1", 9), timeout=1)))
    print("resolve", refused(lambda: socket.getaddrinfo("example.com", 80)))
    print("process", refused(lambda: subprocess.run(["true"])))
    print("system", refused(lambda: os.system("true")))
    print("write-outside", refused(lambda: open(sys.argv[1], "w")))
    print("write-inside", refused(lambda: (private / "ok.txt").write_text("x")))
""")


def test_guard_refuses_network_processes_and_writes_outside_its_folder(tmp_path):
    outside = tmp_path / "outside.txt"
    result = subprocess.run([sys.executable, "-c", GUARDED, str(outside)], capture_output=True, text=True, timeout=60)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines == {"connect": "refused", "resolve": "refused", "process": "refused", "system": "refused",
                     "write-outside": "refused", "write-inside": "allowed"}, result.stderr
    assert not outside.exists()


def test_memory_limit_turns_into_a_readable_failure(tmp_path):
    model = torch_models.save_export(tmp_path / "m.pt2")
    with pytest.raises(SandboxFailed) as failed:
        run_in_sandbox({"command": "convert", "kind": "torch-export"}, files={"model": model}, memory_mb=300)
    assert str(failed.value)
    assert str(tmp_path) not in str(failed.value)


def test_parity_on_dataset_inputs_compares_pytorch_with_the_export(tmp_path):
    import numpy as np

    model = torch_models.save_torchscript(tmp_path / "m.pt")
    onnx_path = tmp_path / "m.onnx"
    converted = run_in_sandbox({"command": "convert", "kind": "torchscript", "onnx_out": str(onnx_path)}, files={"model": model})
    assert converted["exporter"] == "torchscript" and onnx_path.exists()
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.random.default_rng(1).standard_normal((5, 1, 8, 8)).astype(np.float32))
    result = run_in_sandbox({"command": "parity", "kind": "torchscript", "max_samples": 5}, files={"model": model, "onnx": onnx_path, "inputs": inputs})
    parity = result["parity"]
    # Five samples through a batch-2 model: three padded batches.
    assert parity["passed"] and parity["samples"] == 6 and parity["outputs"][0]["max_abs_error"] < 1e-4


def test_torchscript_that_writes_a_file_is_stopped_by_the_os_alone(tmp_path):
    """The operator allow-list switched off: the confinement by itself keeps the write from reaching the host."""
    target = tmp_path / "outside" / "written-by-model"
    target.parent.mkdir()
    target.parent.chmod(0o777)
    model = torch_models.save_file_writer(tmp_path / "writer.pt", target)
    with pytest.raises(SandboxFailed) as failed:
        run_in_sandbox({"command": "convert", "kind": "torchscript"}, files={"model": model}, check_operators=False)
    assert "from_file" in str(failed.value) or "No such file" in str(failed.value), failed.value
    assert not target.exists()


def test_torchscript_that_reads_a_file_learns_nothing_even_from_the_error(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(bytes([201, 202, 203, 204]) * 4)
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    model = torch_models.save_file_reader(tmp_path / "reader.pt", secret, tmp_path)
    with pytest.raises(SandboxFailed) as failed:
        run_in_sandbox({"command": "convert", "kind": "torchscript"}, files={"model": model}, check_operators=False)
    message = str(failed.value)
    assert "No such file" in message and not any(str(byte) in message for byte in (201, 202, 203, 204)), message


def test_the_same_reader_unconfined_would_leak_the_bytes_in_its_error(tmp_path):
    """The control for the test above: without the sandbox's layers, the error message carries the file's bytes."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(bytes([201, 202, 203, 204]) * 4)
    model = torch_models.save_file_reader(tmp_path / "reader.pt", secret, tmp_path)
    from workers.sandbox import runner

    with pytest.raises(SandboxFailed) as failed:
        runner.run_confined("torch.convert", {"kind": "torchscript", "check_operators": False}, files={"model": model}, layers=(),
                            allow_unconfined=True)
    assert "201" in str(failed.value), failed.value


@pytest.mark.parametrize("check_operators", [True, False])
def test_file_writer_is_refused_by_name_before_it_runs(tmp_path, check_operators):
    target = tmp_path / "written-by-model"
    model = torch_models.save_file_writer(tmp_path / "writer.pt", target)
    with pytest.raises(SandboxFailed) as failed:
        run_in_sandbox({"command": "convert", "kind": "torchscript"}, files={"model": model}, check_operators=check_operators)
    if check_operators:
        assert failed.value.code == "forbidden_operator" and "aten::from_file" in str(failed.value)
    assert not target.exists()
