"""The sandbox PyTorch files are loaded in: no network, no processes, no writes outside its folder, bounded memory."""
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
    from workers.pytorch.child import install_guard
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
