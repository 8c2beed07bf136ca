"""The static check of PyTorch files: what each pickle imports is read from its opcodes, never by loading it."""
from __future__ import annotations

import io
import pickle
import zipfile

import pytest

from tests.fixtures import torch_models
from workers.pytorch.scan import TORCH_EXPORT, TORCHSCRIPT, RefusedTorchFile, pickle_globals, scan_torch_file


class Exploit:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickle_globals_finds_the_import_of_every_protocol(protocol):
    names = pickle_globals(pickle.dumps(Exploit(), protocol=protocol))
    assert names == ["posix.system"] or names == ["os.system"]


def test_pickle_globals_follows_the_memo_for_stack_global():
    # Protocol 4 pushes the module and name as strings (memoized) before STACK_GLOBAL.
    data = pickle.dumps([Exploit(), Exploit()], protocol=4)
    assert set(pickle_globals(data)) <= {"posix.system", "os.system"} and len(pickle_globals(data)) >= 1


def test_a_stack_global_with_a_computed_name_is_refused():
    # STACK_GLOBAL fed by something other than two strings: the import cannot be known statically.
    data = b"\x80\x04K\x01K\x02\x93."
    with pytest.raises(RefusedTorchFile) as refused:
        pickle_globals(data)
    assert refused.value.code == "forbidden_import"


def test_export_and_torchscript_archives_pass_with_only_tensor_rebuilders(tmp_path):
    export = scan_torch_file(torch_models.save_export(tmp_path / "m.pt2"))
    script = scan_torch_file(torch_models.save_torchscript(tmp_path / "m.pt"))
    assert export.kind == TORCH_EXPORT and script.kind == TORCHSCRIPT
    assert "torch._utils._rebuild_tensor_v2" in export.globals
    assert any(name.startswith("__torch__.") for name in script.globals)


def test_a_torchscript_class_name_is_not_allowed_in_a_torch_export_archive(tmp_path):
    source = torch_models.save_export(tmp_path / "m.pt2")
    hostile = tmp_path / "hostile.pt2"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(hostile, "w") as target:
        for info in original.infolist():
            target.writestr(info, original.read(info))
        target.writestr("m/extra.pkl", b"\x80\x02c__torch__\nEvil\n)\x81.")
    with pytest.raises(RefusedTorchFile, match="__torch__.Evil"):
        scan_torch_file(hostile)


def test_nested_archives_are_scanned(tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(Exploit(), protocol=2))
    outer = tmp_path / "outer.pt2"
    source = torch_models.save_export(tmp_path / "m.pt2")
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(outer, "w") as target:
        for info in original.infolist():
            data = inner.getvalue() if info.filename.endswith("sample_inputs/model.pt") else original.read(info)
            target.writestr(info, data)
    with pytest.raises(RefusedTorchFile, match="system"):
        scan_torch_file(outer)


def test_entries_that_climb_out_are_refused(tmp_path):
    path = tmp_path / "escape.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("../m/data.pkl", b"\x80\x02N.")
    with pytest.raises(RefusedTorchFile) as refused:
        scan_torch_file(path)
    assert refused.value.code == "unsafe_archive"


def test_not_a_zip_is_unsupported(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"hello")
    with pytest.raises(RefusedTorchFile) as refused:
        scan_torch_file(path)
    assert refused.value.code == "unsupported_format"
