"""Work classes: each task goes to its class's queue, priorities favour a job's first builds, slots follow the host."""
from __future__ import annotations

from kiln.pipeline.queue import STAGE_TASK_NAMES, VARIANT_BUILD_TASK_NAME
from kiln.registry.services import SUPPORT_TASK_NAME
from workers import routing
from workers.celery import HOUSEKEEPING_TASKS, app


def test_every_registered_task_has_a_class_and_control_steps_never_share_a_queue_with_builds():
    import workers.tasks  # noqa: F401  (registers the tasks)

    # Kiln's own tasks (a test may register one of its own in this process).
    names = [name for name, task in app.tasks.items() if name.startswith("kiln.") and task.run.__module__ == "workers.tasks"]
    queues = {name: app.amqp.router.route({}, name)["queue"].name for name in names}
    # A new task must be given its class: none falls into the control queue by default.
    assert [name for name in names if name not in routing.TASK_CLASSES and not name.startswith(routing.HOUSEKEEPING_PREFIX)] == []
    assert {queues[STAGE_TASK_NAMES[stage]] for stage in ("dispatch", "collect", "report")} == {routing.CONTROL}
    assert {queues[f"kiln.housekeeping.{name}"] for name in HOUSEKEEPING_TASKS} == {routing.CONTROL}
    assert {queues[STAGE_TASK_NAMES[stage]] for stage in ("validate", "convert", "reference", "quantize", "plan")} == {routing.BUILD}
    assert queues[VARIANT_BUILD_TASK_NAME] == routing.BUILD
    assert {queues[STAGE_TASK_NAMES["support"]], queues[SUPPORT_TASK_NAME]} == {routing.CHECK}


def test_a_jobs_later_builds_and_a_busy_organizations_go_behind_a_newcomers_first():
    assert routing.priority_for(job_builds_ahead=0, organization_builds_ahead=0) == 0
    assert routing.priority_for(job_builds_ahead=9, organization_builds_ahead=9) > routing.priority_for(job_builds_ahead=0,
                                                                                                        organization_builds_ahead=0)
    assert routing.priority_for(job_builds_ahead=0, organization_builds_ahead=12) == 3
    assert routing.priority_for(job_builds_ahead=500, organization_builds_ahead=500) == routing.LOWEST_PRIORITY


def test_build_slots_follow_cores_and_the_memory_budget():
    assert routing.build_slots(cores=2, host_memory_mb=19000, build_memory_mb=4096) == 2
    assert routing.build_slots(cores=16, host_memory_mb=19000, build_memory_mb=4096) == 4
    assert routing.build_slots(cores=16, host_memory_mb=2000, build_memory_mb=4096) == 1
    assert routing.check_slots(cores=2, host_memory_mb=19000, check_memory_mb=6144) == 2
    assert routing.check_slots(cores=1, host_memory_mb=19000, check_memory_mb=6144) == 1


def test_the_control_worker_drains_the_queue_of_earlier_releases_and_runs_the_beat(tmp_path):
    command = routing.worker_command(routing.CONTROL, concurrency=1, beat_schedule=tmp_path / "beat")
    assert command[command.index("--queues") + 1] == "control,kiln" and "--beat" in command
    build = routing.worker_command(routing.BUILD, concurrency=2)
    assert build[build.index("--queues") + 1] == "build" and build[build.index("--concurrency") + 1] == "2" and "--beat" not in build
