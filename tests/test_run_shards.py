"""The suite's shards: every end-to-end file in exactly one, dealt so that no shard waits on another for long."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("run_shards", Path(__file__).resolve().parent / "run_shards.py")
run_shards = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(run_shards)


def test_each_file_lands_in_one_shard_and_the_long_ones_are_spread():
    durations = {"a.py": 300, "b.py": 280, "c.py": 100, "d.py": 90, "e.py": 10}
    dealt = run_shards.deal([*durations, "new.py"], durations, 2)
    assert sorted(name for shard in dealt for name in shard) == sorted([*durations, "new.py"])
    # The two longest never share a shard; an unlisted file counts as the median (100 s).
    assert not any({"a.py", "b.py"} <= set(shard) for shard in dealt)
    totals = [sum(durations.get(name, 100) for name in shard) for shard in dealt]
    assert max(totals) - min(totals) <= 100, totals


def test_the_real_suite_is_dealt_whole_with_the_rest_in_a_shard_of_its_own():
    shards = run_shards.shards()
    dealt = [name for shard in shards[:-1] for name in shard]
    assert sorted(dealt) == run_shards.dealt_files() and len(dealt) == len(set(dealt))
    assert set(run_shards.e2e_files()) < set(dealt) and all((run_shards.REPO / name).is_file() for name in run_shards.HEAVY_FILES)
    # Everything else runs once, in the last shard: no heavy file both dealt and run there.
    assert shards[-1] == ["tests", "--ignore=tests/e2e", *(f"--ignore={name}" for name in run_shards.HEAVY_FILES)]
    # Each shard gets its own database and Redis database.
    base = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres", "REDIS_URL": "redis://127.0.0.1:6379/15", "KILN_DATA_DIR": "/x"}
    environments = [run_shards.shard_environment(index, base) for index in range(len(shards))]
    assert len({env["DATABASE_URL"] for env in environments}) == len({env["REDIS_URL"] for env in environments}) == len(shards)


def test_a_run_reports_seconds_per_end_to_end_file_from_the_junit_reports(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text("""<testsuites><testsuite>
      <testcase classname="tests.e2e.test_ui" name="a" time="10.5"/><testcase classname="tests.e2e.test_ui" name="b" time="4.0"/>
      <testcase classname="tests.e2e.test_faults.TestKills" name="c" time="7.2"/>
      <testcase classname="tests.platform.test_jobs" name="d" time="99"/>
      <testcase classname="tests.platform.pipeline.test_jobs" name="e" time="30.4"/></testsuite></testsuites>""")
    assert run_shards.e2e_durations([report, tmp_path / "missing.xml"]) == {
        "tests/e2e/test_faults.py": 7, "tests/e2e/test_ui.py": 14, "tests/platform/pipeline/test_jobs.py": 30}


def test_quiet_tests_run_after_the_shards_alone_and_a_shard_left_empty_by_them_passes(tmp_path, monkeypatch, capsys):
    """A real run of two tiny shards: the quiet test is left out of its shard and runs once the shards are done."""
    log = tmp_path / "order.log"
    loud, quiet = tmp_path / "test_loud.py", tmp_path / "test_quiet_only.py"
    loud.write_text(f"import pytest, time\n\ndef test_loud():\n    time.sleep(0.5)\n    open({str(log)!r}, 'a').write('loud\\n')\n\n"
                    f"@pytest.mark.quiet\ndef test_quiet():\n    open({str(log)!r}, 'a').write('quiet\\n')\n")
    quiet.write_text(f"import pytest\n\n@pytest.mark.quiet\ndef test_alone():\n    open({str(log)!r}, 'a').write('alone\\n')\n")
    monkeypatch.setattr(run_shards, "shards", lambda: [[str(loud)], [str(quiet)]])
    monkeypatch.setattr(run_shards, "quiet_files", lambda: [str(loud), str(quiet)])
    monkeypatch.setenv("KILN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert run_shards.main(["-W", "ignore::pytest.PytestUnknownMarkWarning"]) == 0
    lines = log.read_text().split()
    assert lines[0] == "loud" and sorted(lines[1:]) == ["alone", "quiet"], lines
    assert "phase 1, alone: quiet" in capsys.readouterr().out


def test_the_measurement_test_that_needs_a_quiet_host_is_found_by_its_marker():
    # Found by its decorator; a file that only writes the marker into a string (this one) is not.
    assert "tests/e2e/test_measurement_stack.py" in run_shards.quiet_files()
    assert "tests/test_run_shards.py" not in run_shards.quiet_files()
