"""The parent never acts on a host file a sandboxed child points at: its outputs and its answer are taken only as plain files."""
from __future__ import annotations

import json

from workers.sandbox import runner


def test_an_output_reached_through_a_link_the_child_made_is_left_where_it_is(tmp_path):
    private, host = tmp_path / "work", tmp_path / "host-blobs"
    private.mkdir()
    host.mkdir()
    (host / "converted.onnx").write_bytes(b"another organization's model")
    (private / "converted").symlink_to(host, target_is_directory=True)
    runner._move_out(private, "converted/converted.onnx", tmp_path / "out" / "converted.onnx")
    assert (host / "converted.onnx").read_bytes() == b"another organization's model"
    assert not (tmp_path / "out").exists()
    (private / "model.onnx").symlink_to(host / "converted.onnx")
    runner._move_out(private, "model.onnx", tmp_path / "out" / "model.onnx")
    assert not (tmp_path / "out").exists()


def test_an_answer_that_is_a_link_to_a_host_file_is_not_read(tmp_path):
    private, secrets = tmp_path / "work", tmp_path / "agent.json"
    private.mkdir()
    secrets.write_text(json.dumps({"token": "kiln_agt_secret", "answers": []}))
    (private / "result.json").symlink_to(secrets)
    result = runner._read_result(private, 0, "", limits=runner.Limits(), usage=runner.Usage())
    assert result == {"error": "the sandboxed process left an unreadable result"}
