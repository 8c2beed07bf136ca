"""The sandbox the OS enforces: what the kernel grants, and that each wall stops escapes on its own.

Every test runs a real child through workers.sandbox.runner against real targets outside it (a file, a
folder, a listening port, this process). A layer the running kernel does not grant is skipped with that
reason; on the kind of machine CI runs on, all of them are granted.
"""
from __future__ import annotations

import os

import pytest

from workers.sandbox import landlock, seccomp
from workers.sandbox.runner import SandboxFailed, Unconfined, probe, run_confined

pytestmark = pytest.mark.timeout(120)
ALL = ("read a host file", "write outside its folder", "run a program", "signal the server", "open a connection")


def _refused(escapes: dict, names) -> dict:
    return {name: escapes[name].split(" ", 1)[0] for name in names}


@pytest.fixture(scope="module")
def full():
    return probe()


def test_with_every_layer_no_escape_gets_through(full):
    if not any(full["sandbox"][key] for key in ("mount_namespace", "landlock", "seccomp")):
        pytest.skip(f"this kernel grants no OS confinement: {full['sandbox']['notes']}")
    assert _refused(full["escapes"], ALL) == dict.fromkeys(ALL, "refused"), full


def test_a_root_server_runs_the_child_as_an_unprivileged_user(full):
    if os.geteuid() != 0:
        assert full["sandbox"]["user"].endswith("in its own user namespace")
    else:
        assert full["sandbox"]["user"] == "uid 65534", full["sandbox"]


@pytest.mark.parametrize(("layer", "stops"), [
    ("namespaces", ("read a host file", "write outside its folder", "signal the server", "open a connection")),
    ("landlock", ALL),
    ("seccomp", ("run a program", "open a connection")),
])
def test_each_layer_alone_stops_the_escapes_it_is_for(full, layer, stops):
    granted = {"namespaces": full["sandbox"]["mount_namespace"], "landlock": full["sandbox"]["landlock"] >= 6,
               "seccomp": full["sandbox"]["seccomp"]}
    if not granted[layer]:
        pytest.skip(f"this kernel does not grant {layer} (Landlock needs ABI 6 for signals): {full['sandbox']['notes']}")
    alone = probe(layers=(layer,))
    assert _refused(alone["escapes"], stops) == dict.fromkeys(stops, "refused"), alone


def test_without_any_layer_the_escapes_do_get_through():
    """The control: the probe's targets are reachable when nothing confines the child, so the tests above mean something."""
    bare = probe(layers=())
    assert _refused(bare["escapes"], ALL) == dict.fromkeys(ALL, "ALLOWED"), bare


def test_a_child_that_cannot_be_confined_refuses_to_run_unless_allowed():
    with pytest.raises(Unconfined) as refused:
        run_confined("probe", {"targets": {"server_pid": os.getpid()}}, layers=(), memory_mb=1024)
    assert "KILN_SANDBOX_ALLOW_UNCONFINED" in str(refused.value)
    assert run_confined("probe", {"targets": {"server_pid": os.getpid()}}, layers=(), memory_mb=1024, allow_unconfined=True)["escapes"]


def test_an_unknown_command_is_not_run():
    with pytest.raises((SandboxFailed, KeyError)):
        run_confined("os.system", {}, memory_mb=1024)


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_seccomp_filter_jumps_stay_inside_the_program_and_end_in_allow(architecture):
    program = seccomp.build_filter(architecture)
    for index, (code, jt, jf, _) in enumerate(program):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert index + 1 + max(jt, jf) < len(program)
    assert program[-1] == (0x06, 0, 0, 0x7FFF0000)
    denied = {k for code, _, _, k in program if code == 0x15}
    table = seccomp._TABLES[architecture]
    assert {table[name] for name in ("socket", "execve", "ptrace", "mount", "unshare", "io_uring_setup", "bpf")} <= denied


def test_landlock_reports_its_abi():
    assert landlock.abi_version() >= 0


def test_the_data_folder_stays_hidden_inside_a_tree_the_child_may_read(tmp_path, monkeypatch):
    """A shared tree (say an install that happens to hold the data folder) shows its files, never the data folder's."""
    tree = tmp_path / "tree"
    secret = tree / "data" / "secret_key"
    secret.parent.mkdir(parents=True)
    secret.write_text("kiln-secret")
    (tree / "model.onnx").write_text("shown")
    monkeypatch.setenv("KILN_DATA_DIR", str(tree / "data"))
    tmp_path.chmod(0o755)
    result = run_confined("probe", {"targets": {"server_pid": os.getpid(), "secret_file": str(secret)}}, shared=(tree,), memory_mb=1024,
                          layers=("namespaces", "user"))
    if not result["sandbox"]["mount_namespace"]:
        pytest.skip(f"this kernel grants no mount namespace: {result['sandbox']['notes']}")
    assert result["escapes"]["read a host file"].startswith("refused"), result
    shown = run_confined("probe", {"targets": {"server_pid": os.getpid(), "secret_file": str(tree / "model.onnx")}}, shared=(tree,),
                         memory_mb=1024, layers=("namespaces", "user"))
    assert shown["escapes"]["read a host file"] == "ALLOWED"
