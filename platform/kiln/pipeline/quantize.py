"""The quantize rounds of a job: plan candidates, build each variant, and plan the search's next round.

quantize (plan, fan out one build per variant) -> variant builds -> the last build dispatches;
after the devices, collect plans another round for `auto` or goes on to the report.
"""
from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction

from devices import artifacts
from kiln.fleet.selectors import targets_resolve
from kiln.registry.selectors import blob_file
from kiln.reports.selectors import device_reports
from kiln_contract.feeds import needs_calls
from workers.calibration_set import CALLS_FILE, LISTED_INDICES
from workers.quantize import NotApplicable
from workers.quantize.cache import variant_cache_key
from workers.quantize.families import BF16_KEY, FAMILY_COMPILE
from workers.quantize.isa_families import bf16_choice, isa_notes
from workers.quantize.isolated import BuildWatch, build_isolated, rank_nodes_isolated
from workers.quantize.litert import PRECISIONS as LITERT_PRECISIONS
from workers.quantize.litert_family import explicit_specs as litert_explicit_specs
from workers.quantize.openvino_family import explicit_specs as openvino_explicit_specs
from workers.quantize.round_budget import first_round, fit_round, is_refinement
from workers.quantize.runtimes import for_targets
from workers.quantize.search import plan_round
from workers.quantize.verdicts import family_verdicts, ranking_pays
from workers.sandbox.runner import SandboxFailed, model_shown, run_confined

from . import specs, waiting
from .models import Artifact, ArtifactKind, DeploymentJob, Variant, VariantStatus
from .queue import enqueue_stage, enqueue_variant_build, wake_agents
from .retime import job_retime_finalists, retime_reserve
from .runner import StageFailed, model_folder, run_stage_open, scratch_dir, working_model_path
from .selectors import search_seconds_left, search_work_seconds
from .services import artifact_store, job_event_add, job_fail, job_progress, job_stage_finish, job_stage_start, job_work_add
from .support import runnable_backends, skipped_backends
from .waiting import job_wait_clear, job_wait_note

logger = logging.getLogger(__name__)

MAX_SEARCH_ROUNDS = 5
FINISHED_VARIANT_STATUSES = (VariantStatus.READY, VariantStatus.SKIPPED, VariantStatus.FAILED)


# -- planning -------------------------------------------------------------------------------

def _target_facts(job) -> tuple[list[str], list[str], list[int] | None]:
    """ISA flags, runtimes and thread counts worth trying on the agents the job targets (all of the organization when unknown)."""
    targets, _ = targets_resolve(job=job)
    agents = [t.pinned_agent for t in targets if t.pinned_agent] or list(job.organization.agents.filter(revoked_at__isnull=True))
    isa = sorted(set.intersection(*(set(a.capabilities.get("isa") or []) for a in agents))) if agents else []
    backends = sorted(runnable_backends(job, set().union(*(a.backends for a in agents)) if agents else {"onnxruntime", "openvino"}))
    # Physical vs logical cores: a dimension only where every target agrees on both counts.
    counts = {(a.capabilities.get("cores"), a.capabilities.get("logical_cores")) for a in agents}
    threads = None
    if len(counts) == 1:
        threads = sorted({int(c) for c in next(iter(counts)) if isinstance(c, int) and c > 0}) or None
    return isa, backends, threads


def _shape_facts(job) -> dict:
    """The inputs with a dynamic dimension and the shapes of the user's data at batch 1 (static-shape specialisation)."""
    dataset = job.validation_dataset or job.calibration_dataset
    arrays = (dataset.arrays if dataset else {}) or {}
    inputs = (job.model_version.signature or {}).get("inputs", [])
    dynamic = [spec["name"] for spec in inputs if any(not isinstance(d, int) or d <= 0 for d in spec.get("shape") or [])]
    shapes = {name: [1, *arrays[name]["shape"][1:]] for name in dynamic if name in arrays and arrays[name].get("shape")}
    return {"dynamic_inputs": dynamic, "data_shapes": shapes} if len(shapes) == len(dynamic) else {}


CALIBRATION_CALLS = "calibration-calls.zip"


def _calibration_calls_needed(job) -> bool:
    feeds = job.feeds or {}
    return bool(job.calibration_dataset_id) and (needs_calls(feeds.get("calibration")) or bool(feeds.get("calibration_subset")))


def _write_calibration_calls(job) -> dict:
    """Choose the calibration samples and write their calls once per job (state values from the FP32 model)."""
    feeds = job.feeds
    dataset_path = blob_file(job.calibration_dataset.blob)
    model_path = working_model_path(job)
    with scratch_dir() as scratch:
        out = scratch / CALIBRATION_CALLS
        # The user's dataset is read and the user's model run: in the sandbox.
        try:
            made = run_confined("calibration.calls", {"model": str(model_path), "dataset": str(dataset_path), "feeds": feeds["calibration"],
                                                      "subset": feeds.get("calibration_subset")},
                                shared=(*model_shown(model_path, model_folder(job)), dataset_path), outputs={CALLS_FILE: out},
                                memory_mb=settings.TORCH_SANDBOX_MEMORY_MB, cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS,
                                what="writing the calibration calls")
        except SandboxFailed as failed:
            raise StageFailed(f"The calibration calls could not be written: {failed}") from None
        chosen, written = made["chosen"], made["written"]
        artifact_store(job=job, kind=ArtifactKind.REFERENCE, name=CALIBRATION_CALLS, path=out, precision="fp32")
    used = {**written, "of": job.calibration_dataset.samples}
    if chosen:
        used.update(seed=chosen["seed"], stratified=chosen["stratified"], by_label=chosen["by_label"],
                    indices=chosen["indices"][:LISTED_INDICES], indices_listed=min(len(chosen["indices"]), LISTED_INDICES))
    job.feeds = {**feeds, "calibration_used": used}
    job.save(update_fields=["feeds", "updated_at"])
    how = f", seed {chosen['seed']}{', stratified by label' if chosen['stratified'] else ''}" if chosen else ""
    job_event_add(job=job, stage="quantize", message=f"Calibration: {written['samples']} of {used['of']} samples{how}, {written['calls']} calls.")
    return written


def calibration_path(job):
    """The calibration data the quantizers read: the calls written for this job, else the dataset itself."""
    if not job.calibration_dataset_id:
        return None
    if _calibration_calls_needed(job):
        artifact = Artifact.objects.filter(job=job, kind=ArtifactKind.REFERENCE, name=CALIBRATION_CALLS).select_related("blob").first()
        if artifact is None:
            raise RuntimeError("the calibration calls of this job were not written")
        return blob_file(artifact.blob)
    return blob_file(job.calibration_dataset.blob)


def _sensitivity(job, measured: list[dict]) -> list[dict] | None:
    """Rank nodes by quantization error once per job, and only once INT8 has shown it can win on speed."""
    if "sensitivity" in job.search or not job.calibration_dataset_id:
        return job.search.get("sensitivity")
    if not ranking_pays(family_verdicts(measured, isa=job.search.get("isa"))):
        return None
    try:
        ranking = rank_nodes_isolated(model_path=working_model_path(job), calibration_path=calibration_path(job), model_folder=model_folder(job),
                                      watch=build_watch(job_id=job.id, what=f"the sensitivity analysis of job {job.id}"))
    except Exception as exc:
        job_event_add(job=job, stage="quantize", level="warning", message=f"Sensitivity analysis failed: {exc}")
        ranking = []
    job.search["sensitivity"] = ranking[:50]
    if ranking:
        top = ", ".join(f"{r['node']} ({r['sqnr_db']:.1f} dB)" for r in ranking[:3])
        job_event_add(job=job, stage="quantize", message=f"Most quantization-sensitive nodes: {top}.")
    return job.search["sensitivity"]


def _search_specs(job, *, round_number: int, measured: list[dict]) -> list[dict]:
    isa, backends, threads = _target_facts(job)
    # The chip → families decision is made once per job, on the ISA of its targets at round 1 (the notes say why).
    isa = job.search.setdefault("isa", isa)
    version = job.model_version
    return plan_round(
        round_number=round_number,
        model_facts={"signature": version.signature, "op_histogram": version.op_histogram, **_shape_facts(job)},
        device_isa=isa,
        backends=backends,
        has_calibration=job.calibration_dataset_id is not None,
        tolerance=job.tolerance,
        sensitivity=_sensitivity(job, measured) if round_number > 1 else None,
        measured=measured,
        thread_choices=threads,
        seconds_left=search_seconds_left(job) - retime_reserve({"": measured}),
    )


def _create_variants(job, planned: list[dict], *, round_number: int) -> list[str]:
    created = []
    skipped = skipped_backends(job)
    for spec in planned:
        if spec.get("backends") and not runnable_backends(job, spec["backends"]):
            # A variant made for runtimes the support stage ruled out is never built.
            job_event_add(job=job, stage="quantize", message=f"{spec['key']} not built: {'; '.join(skipped[b] for b in spec['backends'])}")
            continue
        options = dict(spec.get("options") or {})
        if spec.get("compile"):
            # Compile options ride with the variant to its device tasks; the build itself ignores them.
            options["compile"] = spec["compile"]
        _, was_created = Variant.objects.get_or_create(
            job=job, key=spec["key"],
            defaults={"organization": job.organization, "precision": spec["precision"], "options": options,
                      "round": round_number, "backends": spec.get("backends") or []},
        )
        if was_created:
            created.append(spec["key"])
    return created


def _plan_variants(job) -> str:
    if _calibration_calls_needed(job):
        _write_calibration_calls(job)
    if job.precisions == [specs.AUTO]:
        job.search.setdefault("round", 1)
        job.search.setdefault("started_at", time.time())
        job.search.setdefault("budget_minutes", specs.DEFAULT_BUDGET_MINUTES)
        planned = _first_answer(job, _search_specs(job, round_number=1, measured=[]))
        job.save(update_fields=["search", "updated_at"])
        _log_isa_families(job)
        created = _create_variants(job, planned, round_number=1)
        return f"search round 1: {len(created)} candidate(s): {', '.join(created)}"
    precisions = specs.resolve_precisions(job.precisions, has_calibration=job.calibration_dataset_id is not None)
    isa, backends, _ = _target_facts(job)
    # One ONNX build per precision serves ONNX Runtime and OpenVINO, but static INT8's QDQ file is ONNX Runtime's:
    # OpenVINO targets get NNCF's OpenVINO IR instead, LiteRT targets LiteRT's own builds.
    has_calibration = job.calibration_dataset_id is not None
    planned = for_targets([{"key": p, "precision": p} for p in precisions if p != specs.BF16], backends)
    planned += _bf16_explicit(job, precisions, isa=isa, backends=backends)
    planned += litert_explicit_specs(precisions, backends=backends, has_calibration=has_calibration)
    planned += openvino_explicit_specs(precisions, backends=backends, has_calibration=has_calibration)
    if not planned:
        raise NotApplicable(f"no target device runs {', '.join(precisions)}: the targets offer {', '.join(backends)} "
                            f"(LiteRT builds {', '.join(LITERT_PRECISIONS)})")
    _create_variants(job, planned, round_number=1)
    return f"planned {len(planned)} variant(s): {', '.join(spec['key'] for spec in planned)}"


def _calibration_samples(job) -> int | None:
    if not job.calibration_dataset_id:
        return None
    subset = (job.feeds or {}).get("calibration_subset") or {}
    return int(subset.get("count") or job.calibration_dataset.samples or 0) or None


def _first_answer(job, planned: list[dict]) -> list[dict]:
    """Round 1 within a third of the budget (round_budget.first_round); what waits for round 2 is kept on the job."""
    fitted = first_round(planned, budget_s=job.search["budget_minutes"] * 60, parameters=job.model_version.parameter_count,
                         calibration_samples=_calibration_samples(job))
    deferred = set(fitted.left_out)
    job.search["deferred"] = [spec for spec in planned if spec["key"] in deferred]
    if fitted.note:
        job_event_add(job=job, stage="quantize", message=f"The search's {fitted.note}.")
    return fitted.kept


def _bf16_explicit(job, precisions: list[str], *, isa: list[str], backends: list[str]) -> list[dict]:
    """bf16 asked for by name: FP32's build under OpenVINO's bf16 inference precision, as `auto`'s bf16 family, where the
    targets run OpenVINO on bf16 units. Elsewhere the hint would run FP32 (or emulate) under bf16's name: not built, said why."""
    if specs.BF16 not in precisions:
        return []
    choice = bf16_choice(isa)
    if "openvino" in backends and choice.proposed:
        return [{"key": BF16_KEY, "precision": "fp32", "compile": dict(FAMILY_COMPILE[BF16_KEY]), "backends": ["openvino"]}]
    reason = choice.reason if "openvino" in backends else "it is OpenVINO's bf16 inference precision, and no target device runs OpenVINO"
    job_event_add(job=job, stage="quantize", level="warning", message=f"bf16 not built: {reason}")
    return []


def job_quantize(*, job_id: int) -> None:
    """Plan the variants and fan out one build task each; the last one to finish dispatches."""
    started = time.monotonic()
    opened = run_stage_open(job_id, "quantize", _plan_variants)
    job_work_add(job_id=job_id, seconds=time.monotonic() - started)
    if not opened:
        return
    for variant_id in Variant.objects.filter(job_id=job_id, status__in=[VariantStatus.PENDING, VariantStatus.BUILDING]).values_list("id", flat=True):
        enqueue_variant_build(variant_id=variant_id)


# -- building one variant -------------------------------------------------------------------

def _build_options(variant: Variant) -> dict:
    """The variant's recipe options without its compile options (those shape the device's compile, not the build)."""
    return {key: value for key, value in variant.options.items() if key != "compile"}


def _variant_cache_key(variant: Variant, job: DeploymentJob) -> str:
    model_sha = (job.converted_blob or job.model_version.blob).sha256
    calibration_sha = job.calibration_dataset.blob.sha256 if job.calibration_dataset_id else ""
    # The same file fed another way (layout, state, subset) calibrates differently.
    feeds = {key: (job.feeds or {}).get(key) for key in ("calibration", "calibration_subset")}
    return variant_cache_key(model_sha256=model_sha, precision=variant.precision,
                             options={**_build_options(variant), "_calibration": calibration_sha, "_feeds": feeds})


def _reuse_cached(variant: Variant, job: DeploymentJob) -> bool:
    """Reuse a ready build with the same model bytes, recipe, data and toolchain versions."""
    cached = (
        Variant.objects.filter(organization=job.organization, cache_key=variant.cache_key, status=VariantStatus.READY, artifact__isnull=False)
        .exclude(pk=variant.pk).select_related("artifact__blob").order_by("-id").first()
    )
    if cached is None:
        return False
    variant.artifact, _ = Artifact.objects.update_or_create(
        job=job, kind=ArtifactKind.VARIANT, name=variant.key + artifacts.suffix_for(blob_file(cached.artifact.blob)),
        defaults={"organization": job.organization, "blob": cached.artifact.blob, "precision": variant.precision},
    )
    variant.recipe = {**cached.recipe, "cached_from_job": cached.job_id, **_compile_recipe(variant)}
    # As a fresh build would: never widen what the planner allowed (a bf16 variant shares FP32's build, not its backends).
    variant.backends = [b for b in cached.backends if b in variant.backends] if variant.backends else cached.backends
    variant.status = VariantStatus.READY
    job_event_add(job=job, stage="quantize", message=f"{variant.key}: reused the identical build of job {cached.job_id}.")
    return True


def _build_variant_artifact(variant: Variant, job: DeploymentJob) -> None:
    variant.cache_key = _variant_cache_key(variant, job)
    if _reuse_cached(variant, job):
        return
    calibration = calibration_path(job)
    with scratch_dir() as scratch:
        out = scratch / f"{variant.key}.onnx"
        # In the sandbox, under the build memory budget (KILN_BUILD_MEMORY_MB): a clear error, never the OOM killer.
        built = build_isolated(
            model_path=working_model_path(job), precision=variant.precision, out_path=out, calibration_path=calibration,
            options=_build_options(variant), model_folder=model_folder(job),
            watch=build_watch(job_id=job.id, what=f"the build of {variant.key} (job {job.id})"),
        )
        # Named for what it holds: a LiteRT variant is a .tflite, not an .onnx.
        artifact = artifact_store(job=job, kind=ArtifactKind.VARIANT, name=variant.key + artifacts.suffix_for(out), path=out,
                                  precision=variant.precision)
    variant.artifact = artifact
    variant.recipe = {**built.get("recipe", {}), "peak_rss_mb": round(built.get("peak_rss_mb") or 0.0, 1),
                      "build_s": round(built.get("build_s") or 0.0, 2), "paused_s": round(built.get("paused_s") or 0.0, 2),
                      "memory_wait_s": round(built.get("memory_wait_s") or 0.0, 2), **_compile_recipe(variant)}
    job_work_add(job_id=job.id, seconds=(built.get("build_s") or 0.0) - (built.get("paused_s") or 0.0) - (built.get("memory_wait_s") or 0.0))
    # The planner may restrict backends (an OpenVINO-only recipe); never widen what the build can run on.
    built_backends = built.get("backends", ["onnxruntime"])
    planned = variant.backends or _target_facts(job)[1]
    variant.backends = [b for b in built_backends if b in variant.backends] if variant.backends else built_backends
    # A target runtime that refuses the file costs that runtime only: the variant goes on without it, and says why.
    refused = {backend: reason for backend, reason in (built.get("refused_backends") or {}).items() if backend in planned}
    if refused:
        variant.recipe["refused_backends"] = refused
    variant.status = VariantStatus.READY


def _compile_recipe(variant: Variant) -> dict:
    return {"compile": variant.options["compile"]} if variant.options.get("compile") else {}


def build_watch(*, job_id: int, what: str) -> BuildWatch:
    """A build's waits, told on its job: memory it waits for, and pauses while a device of this host times."""
    return BuildWatch(
        what=what,
        on_memory_wait=lambda reason: job_wait_note(job_id=job_id, cause=waiting.MEMORY, message=reason),
        on_pause=lambda label: job_wait_note(job_id=job_id, cause=waiting.BUILDS_PAUSED,
                                             message=f"builds paused while {label or 'a device of this host times'}"),
        on_continue=lambda: job_wait_clear(job_id=job_id, cause=waiting.BUILDS_PAUSED),
    )


def _budget_spent_elsewhere(variant: Variant, job: DeploymentJob) -> bool:
    """An `auto` search out of budget builds nothing more once something of the job is built or building: what is built
    is measured and reported."""
    if job.precisions != [specs.AUTO] or search_seconds_left(job) >= 0:
        return False
    return job.variants.exclude(pk=variant.pk).filter(status__in=[VariantStatus.READY, VariantStatus.BUILDING]).exists()


def variant_build(*, variant_id: int) -> None:
    """Build one host-side variant; its failure fails the variant, not the job."""
    variant = Variant.objects.select_related("job").filter(pk=variant_id).first()
    if variant is None or variant.job.is_terminal or variant.status in FINISHED_VARIANT_STATUSES:
        return
    job = variant.job
    if _budget_spent_elsewhere(variant, job):
        variant.status, variant.error = VariantStatus.SKIPPED, "not built: the search's budget was spent before its turn came"
        variant.save(update_fields=["status", "error"])
        job_event_add(job=job, stage="quantize", message=f"{variant.key} {variant.error}.")
        quantize_finish_if_done(job_id=job.id)
        return
    variant.status = VariantStatus.BUILDING
    variant.save(update_fields=["status"])
    try:
        _build_variant_artifact(variant, job)
        if "cached_from_job" not in variant.recipe:
            job_event_add(job=job, stage="quantize", message=f"Built {variant.key} ({variant.artifact.blob.size_bytes} bytes).")
        for backend, reason in (variant.recipe.get("refused_backends") or {}).items():
            job_event_add(job=job, stage="quantize", level="warning", message=f"{variant.key} is not measured on {backend}: {reason}")
    except NotApplicable as exc:
        variant.status, variant.error = VariantStatus.SKIPPED, str(exc)
        job_event_add(job=job, stage="quantize", level="warning", message=f"{variant.key} skipped: {exc}")
    except Exception as exc:
        logger.exception("variant %s failed", variant_id, extra={"job_id": job.id, "variant_id": variant_id})
        variant.status, variant.error = VariantStatus.FAILED, f"{type(exc).__name__}: {exc}"
        job_event_add(job=job, stage="quantize", level="error", message=f"{variant.key} failed: {variant.error}")
    variant.save()
    job_wait_clear(job_id=job.id)
    quantize_finish_if_done(job_id=job.id)


@transaction.atomic
def quantize_finish_if_done(*, job_id: int) -> None:
    """Once every variant of the round is built, skipped or failed: dispatch, report, or fail."""
    job = DeploymentJob.objects.select_for_update().get(pk=job_id)
    if job.is_terminal or job.stage != "quantize":
        return
    variants = list(job.variants.all())
    done = [v for v in variants if v.status in FINISHED_VARIANT_STATUSES]
    job_progress(job=job, progress=0.25 + 0.3 * len(done) / max(1, len(variants)))
    if len(done) < len(variants):
        return
    ready = [v for v in variants if v.status == VariantStatus.READY]
    if not any(v.status == VariantStatus.READY for v in variants if v.round == job.search.get("round", 1)) and job.search.get("round", 1) > 1:
        job_event_add(job=job, stage="quantize", level="warning", message="No candidate of this round could be built; reporting what was measured.")
        job_stage_finish(job=job, stage="quantize", message="round without new variants")
        job.stage = "report"
        job.save(update_fields=["stage", "updated_at"])
        enqueue_stage(job_id=job_id, stage="report")
        return
    if not ready:
        reasons = "; ".join(f"{v.key}: {v.error}" for v in variants)
        job_fail(job=job, stage="quantize", message=f"No variant could be built. {reasons}")
        return
    job_stage_finish(job=job, stage="quantize", message=f"{len(ready)} of {len(variants)} variants built")
    enqueue_stage(job_id=job_id, stage="dispatch")


# -- collect: another search round, or the report ------------------------------------------

def _measured_by_target(job) -> dict[str, list[dict]]:
    reports, _ = device_reports(job=job)
    return {report.target: report.variants for report in reports}


def _budget_spent(job) -> bool:
    return search_seconds_left(job) < 0


def _log_isa_families(job) -> None:
    """Say once per target which families its chip makes worth searching and why ("INT8: VNNI … u8 and s8 …"); the
    ISA is the one the plan used (the flags every target agent shares), and the report's search notes repeat it."""
    targets, _ = targets_resolve(job=job)
    notes = isa_notes(job.search.get("isa") or [])
    for target in sorted(target.key for target in targets) or [""]:
        for note in notes:
            job_event_add(job=job, stage="quantize", message=f"{target}: {note}." if target else f"{note}.")


def _log_verdicts(job, measured_by_target: dict[str, list[dict]]) -> None:
    """Say once per family and target why the search went on with it or dropped it ("INT8 does not pay …"), and keep where
    it paid then: the report's notes are read from its final table, and say so where the search decided otherwise."""
    said = set(job.search.get("verdicts_said", []))
    decided = job.search.setdefault("verdicts_decided", {})
    for target, entries in sorted(measured_by_target.items()):
        for precision, verdict in family_verdicts(entries, isa=job.search.get("isa")).items():
            if f"{target}:{verdict['family']}" in said:
                continue
            said.add(f"{target}:{verdict['family']}")
            decided.setdefault(target, {})[precision] = verdict["paying_backends"]
            job_event_add(job=job, stage="quantize", message=f"{target}: {verdict['reason']}.")
    job.search["verdicts_said"] = sorted(said)


def _next_round_specs(job) -> list[dict]:
    round_number = job.search.get("round", 1)
    if job.precisions != [specs.AUTO]:
        return []
    measured_by_target = _measured_by_target(job)
    _log_verdicts(job, measured_by_target)
    if round_number >= MAX_SEARCH_ROUNDS:
        return []
    if _budget_spent(job):
        minutes = job.search.get("budget_minutes", specs.DEFAULT_BUDGET_MINUTES)
        _stop_search(job, f"the time budget of {minutes} minute(s) was spent after round {round_number}; the report shows the best found")
        return []
    proposals: dict[str, dict] = {}
    for entries in measured_by_target.values():
        for spec in _search_specs(job, round_number=round_number + 1, measured=entries):
            known = proposals.get(spec["key"])
            if known is not None and known.get("backends") and spec.get("backends"):
                spec = {**known, "backends": sorted(set(known["backends"]) | set(spec["backends"]))}
            proposals[spec["key"]] = spec
    # Round 1's deferred candidates come back once, beside the refinements round 1's evidence asked for.
    for spec in job.search.pop("deferred", None) or []:
        proposals.setdefault(spec["key"], spec)
    existing = set(job.variants.values_list("key", flat=True))
    entries = [entry for target_entries in measured_by_target.values() for entry in target_entries]
    return _fit_to_budget(job, [spec for spec in proposals.values() if spec["key"] not in existing], round_number + 1,
                          measurements=len(entries), refinement_due=_refinement_due(job, entries),
                          reserve_s=retime_reserve(measured_by_target))


def _refinement_due(job, measured: list[dict]) -> bool:
    """A measured build misses the tolerance and nothing of the job was refined yet: refining it is still to come."""
    misses = any((entry.get("accuracy") or {}).get("within_tolerance") is False for entry in measured)
    return misses and not any(is_refinement({"key": key, "options": options}) for key, options in job.variants.values_list("key", "options"))


def _fit_to_budget(job, candidates: list[dict], round_number: int, *, measurements: int, refinement_due: bool = False,
                   reserve_s: float = 0.0) -> list[dict]:
    """The candidates whose estimated cost at this search's pace fits the time it has left once `reserve_s` is set aside
    for re-timing the finalists (round_budget.fit_round), with a share kept for refinements; the job's events say what
    was left out, and the search stops when nothing fits."""
    fitted = fit_round(candidates, round_number=round_number, seconds_left=search_seconds_left(job) - reserve_s,
                       elapsed_s=search_work_seconds(job), measurements=measurements,
                       budget_s=job.search.get("budget_minutes", specs.DEFAULT_BUDGET_MINUTES) * 60, refinement_due=refinement_due)
    if fitted.note:
        job_event_add(job=job, stage="quantize", message=f"The search's {fitted.note}.")
    if candidates and not fitted.kept:
        kept_back = f" and the finalists' re-timing (about {reserve_s:.0f} s)" if reserve_s else ""
        _stop_search(job, f"what is left of the time budget would not cover round {round_number}'s candidates{kept_back}; "
                     "the report shows the best found")
    return fitted.kept


def _stop_search(job, reason: str) -> None:
    """The search ends before its planner runs out of candidates: the job keeps the reason, and its events say it."""
    job.search["stopped"] = reason
    job_event_add(job=job, stage="devices", level="warning", message=f"The search stopped: {reason}.")
    job.save(update_fields=["search", "updated_at"])


def _collected_job(job_id: int) -> DeploymentJob | None:
    job = DeploymentJob.objects.select_related("model_version", "calibration_dataset__blob", "converted_blob").filter(pk=job_id).first()
    if job is None or job.is_terminal or job.stage != "report":
        return None
    return job


def _search_may_go_on(job: DeploymentJob) -> bool:
    """Whether planning another round is worth a build slot: an `auto` search, not re-timed yet, rounds left."""
    return job.precisions == [specs.AUTO] and "retimed" not in job.search and job.search.get("round", 1) < MAX_SEARCH_ROUNDS


def job_collect(*, job_id: int) -> None:
    """After the devices (a control step): plan the search's next round on a build slot (planning reads the model), or
    go on at once to the re-timing or the report."""
    job = _collected_job(job_id)
    if job is None:
        return
    if _search_may_go_on(job):
        enqueue_stage(job_id=job_id, stage="plan")
        return
    _end_search(job)


def _end_search(job: DeploymentJob) -> None:
    """No round follows: re-time the finalists side by side once, then report."""
    job.save(update_fields=["search", "updated_at"])
    if "retimed" not in job.search and job_retime_finalists(job=job):
        job_stage_start(job=job, stage="devices")
        job_event_add(job=job, stage="devices", message="Finalists: re-timing them side by side on their device until the fastest "
                      "separates at 95% or the round cap.")
        wake_agents(organization_id=job.organization_id)
        return
    enqueue_stage(job_id=job.id, stage="report")


def _note_first_answer(job: DeploymentJob) -> None:
    """Round 1 is measured: the report already holds a first answer while the search refines it."""
    if "first_answer_at" in job.search:
        return
    job.search["first_answer_at"] = time.time()
    job_event_add(job=job, stage="report", message="First answer: round 1 is measured and the report shows the best so far; "
                  "still searching.")


def job_plan(*, job_id: int) -> None:
    """Plan the search's next round (build-class work: sensitivity analysis reads the model) and fan out its builds."""
    job = _collected_job(job_id)
    if job is None:
        return
    started = time.monotonic()
    next_specs = _next_round_specs(job)
    job_work_add(job_id=job.id, seconds=time.monotonic() - started)
    if not next_specs:
        _end_search(job)
        return
    _note_first_answer(job)
    round_number = job.search.get("round", 1) + 1
    job.search["round"] = round_number
    job.save(update_fields=["search", "updated_at"])
    created = _create_variants(job, next_specs, round_number=round_number)
    job_stage_start(job=job, stage="quantize")
    job_event_add(job=job, stage="quantize", message=f"Search round {round_number}: {len(created)} refined candidate(s): {', '.join(created)}.")
    for variant_id in job.variants.filter(round=round_number, status=VariantStatus.PENDING).values_list("id", flat=True):
        enqueue_variant_build(variant_id=variant_id)
