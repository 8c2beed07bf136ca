"""A Kiln process sends no vendor telemetry: OpenVINO's converter and NNCF would post usage events to Google Analytics
from a forked process (openvino_telemetry), and in a sandboxed build that fork was counted against the build's memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import onnx
from onnx import TensorProto, helper

from tests.conftest import REPO


def test_a_kiln_process_converts_with_openvino_and_nncf_loaded_and_starts_no_process_and_no_request(tmp_path):
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "relu.onnx"))
    script = textwrap.dedent(f"""
        import json, sys, time
        import workers  # what every worker, sandbox and benchmark process imports first
        events = []
        sys.addaudithook(lambda event, args: events.append(event) if event in ("os.fork", "subprocess.Popen", "urllib.Request") else None)
        import nncf  # noqa: F401
        import openvino as ov
        import openvino.tools.ovc.telemetry_utils as ovc_telemetry
        ov.convert_model({str(tmp_path / "relu.onnx")!r})
        time.sleep(1)  # the sends run on a thread pool
        print(json.dumps({{"events": events, "ovc": ovc_telemetry.tm.__name__, "module": repr(sys.modules.get("openvino_telemetry"))}}))
    """)
    # Not in CI's environment: the vendors skip telemetry where CI=true, and a sandbox's environment has no CI.
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "NNCF_CI", "TF_BUILD", "JENKINS_URL")}
    env["HOME"] = str(tmp_path)  # no consent file: the vendors' default is to send
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"events": [], "ovc": "openvino.tools.ovc.telemetry_stub", "module": "None"}
