"""`kiln`: the command line of the Kiln REST API (Click + Rich), built on `kiln_client.Client`.

Exit codes: 0 success (for `deploy --wait`: every device has a variant within the tolerance),
1 an error or a failed/canceled job, 2 usage, 3 the job finished but some device has no variant
within the tolerance, 4 the job has not finished (`kiln report` on a running job; `kiln jobs wait
--timeout` ran out).
"""
from __future__ import annotations

import json
import socket
import sys
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from kiln_client.client import ApiError, Client, ClientConfig, ServerUnavailable
from kiln_client.package_run import VerificationFailed, verify

EXIT_OK, EXIT_ERROR, EXIT_TOLERANCE_MISSED, EXIT_NOT_FINISHED = 0, 1, 3, 4
TERMINAL_STATUSES = ("succeeded", "failed", "canceled")

console = Console()
errors = Console(stderr=True)


def _client(ctx: click.Context) -> Client:
    try:
        return Client(ctx.obj.get("server"), ctx.obj.get("token"))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _print_json(value) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


class KilnGroup(click.Group):
    """Turns the client's errors into one readable line and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            errors.print(f"[red]error[/red] ({exc.status}{', ' + exc.code if exc.code else ''}): {exc.message}")
            sys.exit(EXIT_ERROR)
        except ServerUnavailable as exc:
            errors.print(f"[red]error[/red]: the server did not answer: {exc}")
            sys.exit(EXIT_ERROR)


@click.group(cls=KilnGroup)
@click.option("--server", envvar="KILN_SERVER", help="Kiln URL (default: the one `kiln login` saved).")
@click.option("--token", envvar="KILN_TOKEN", help="API token (default: the one `kiln login` saved).")
@click.pass_context
def main(ctx: click.Context, server: str | None, token: str | None) -> None:
    """Upload models and datasets, deploy them to your devices, read reports and the performance database."""
    ctx.obj = {"server": server, "token": token}


@main.command()
@click.option("--server", "login_server", required=True, help="Kiln URL, e.g. http://127.0.0.1:8000")
@click.option("--token", "login_token", help="An API token (kiln_pat_…); otherwise sign in with a password.")
@click.option("--username")
@click.option("--password", help="Prompted for when missing.")
def login(login_server: str, login_token: str | None, username: str | None, password: str | None) -> None:
    """Save a server and an API token for the other commands (~/.config/kiln/client.json, mode 0600)."""
    client = Client(login_server, login_token, config=ClientConfig())
    if not login_token:
        username = username or click.prompt("Username")
        password = password or click.prompt("Password", hide_input=True)
        client.login(username, password, token_name=f"kiln cli on {socket.gethostname()}")
    me = client.me()
    ClientConfig().save(server=client.server, token=client.token)
    organization = (me.get("organization") or {}).get("name")
    console.print(f"Signed in to {client.server} as [bold]{me['user']['username']}[/bold] in {organization}.")


# -- uploads -----------------------------------------------------------------------------------

def _with_upload_progress(path: Path, action):
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                  console=errors, transient=True) as progress:
        task = progress.add_task(f"Uploading {path.name}", total=path.stat().st_size)
        return action(lambda done, total: progress.update(task, completed=done, total=total))


@main.group()
def models() -> None:
    """Models and their versions."""


@models.command("list")
@click.option("--search", default="")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def models_list(ctx, search: str, as_json: bool) -> None:
    rows = _client(ctx).models(search)
    if as_json:
        return _print_json(rows)
    table = Table("id", "name", "versions", "latest sha256")
    for model in rows:
        latest = model.get("latest_version") or {}
        table.add_row(str(model["id"]), model["name"], str(len(model.get("versions") or [])), (latest.get("sha256") or "")[:16])
    console.print(table)


@models.command("upload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="Model name (default: the file name).")
@click.option("--model", "model_id", type=int, help="Add a new version to this model instead.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def models_upload(ctx, path: Path, name: str | None, model_id: int | None, as_json: bool) -> None:
    """Upload an .onnx (or a .zip with external data, a .pt2 or a traced .pt), resumably."""
    client = _client(ctx)
    if model_id:
        result = _with_upload_progress(path, lambda progress: client.upload_model_version(model_id, path, progress=progress))
        version = result
    else:
        result = _with_upload_progress(path, lambda progress: client.upload_model(path, name=name, progress=progress))
        version = result["versions"][-1]
    if as_json:
        return _print_json(result)
    console.print(f"Model {version.get('model', result.get('id'))} version {version['number']} (version id {version['id']}), sha256 {version['sha256'][:16]}…")


@main.group()
def datasets() -> None:
    """Calibration and validation datasets (.npz)."""


@datasets.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def datasets_list(ctx, as_json: bool) -> None:
    rows = _client(ctx).datasets()
    if as_json:
        return _print_json(rows)
    table = Table("id", "name", "kind", "samples", "labels")
    for dataset in rows:
        table.add_row(str(dataset["id"]), dataset["name"], dataset["kind"], str(dataset["samples"]), "yes" if dataset.get("has_labels") else "")
    console.print(table)


@datasets.command("upload")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--kind", type=click.Choice(["calibration", "validation"]), required=True)
@click.option("--name")
@click.option("--recipe", help="For raw data: the recipe as JSON, or a .json file (see `kiln datasets recipe MODEL`).")
@click.option("--for-model", "for_model", help="For raw data: propose the recipe from this model (id or name) and check the data fits it.")
@click.option("--version", "version_number", type=int, help="With --for-model: the version (default: the latest).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def datasets_upload(ctx, path: Path, kind: str, name: str | None, recipe: str | None, for_model: str | None, version_number: int | None,
                    as_json: bool) -> None:
    """Upload an .npz (or a zip of .npz samples), or raw data: a folder or zip of images or WAV files (class folders become labels)."""
    client = _client(ctx)
    model = _resolve_model_version(client, for_model, version_number) if for_model else None
    names = raw_files(path)
    if names or recipe:
        if not names and not path.is_file():
            raise click.BadParameter(f"{path} holds no images or WAV files", param_hint="PATH")
        dataset = (upload_raw_dataset(client, path, names, kind=kind, name=name, recipe=_load_recipe(recipe) if recipe else None, model=model)
                   if names else _with_upload_progress(path, lambda progress: client.upload_dataset(
                       path, kind=kind, name=name, progress=progress, recipe=_load_recipe(recipe))))
    elif path.is_dir():
        raise click.BadParameter(f"{path} is a folder without images or WAV files", param_hint="PATH")
    else:
        dataset = _with_upload_progress(path, lambda progress: client.upload_dataset(path, kind=kind, name=name, progress=progress))
    if as_json:
        return _print_json(dataset)
    console.print(f"Dataset {dataset['id']} ({dataset['kind']}, {dataset['samples']} samples{', with labels' if dataset.get('has_labels') else ''}).")


@datasets.command("recipe")
@click.argument("model")
@click.option("--version", "version_number", type=int, help="The version (default: the latest).")
@click.pass_context
def datasets_recipe(ctx, model: str, version_number: int | None) -> None:
    """Print the recipe Kiln proposes for raw data fed to MODEL (JSON on stdout, the reasons on stderr), to edit and pass to --recipe."""
    client = _client(ctx)
    model_id, version = _resolve_model_version(client, model, version_number)
    proposal = client.recipe_proposal(model_id, version["number"])
    for reason in proposal.get("why") or []:
        errors.print(f"· {reason}", markup=False, highlight=False)
    if not proposal.get("recipe"):
        sys.exit(EXIT_ERROR)
    _print_json(proposal["recipe"])


# -- deploy ------------------------------------------------------------------------------------

def parse_tolerance(text: str | None, metric: str) -> dict:
    """`1%` or `0.01` is an allowed drop; with --metric sqnr the number is a floor in dB."""
    if text is None:
        return {"metric": metric}
    raw = text.strip().lower().removesuffix("db")
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number like 1% or 0.01", param_hint="--tolerance") from None
    return {"metric": metric, "min_value": value} if metric == "sqnr" else {"metric": metric, "max_drop": value}


def _resolve_model_version(client: Client, model: str, version: int | None) -> tuple[int, dict]:
    """MODEL is a file (uploaded now), a model id, or a model name: its id and the chosen version."""
    path = Path(model)
    if path.is_file():
        created = _with_upload_progress(path, lambda progress: client.upload_model(path, progress=progress))
        errors.print(f"Uploaded {path.name} as model {created['id']}.")
        return created["id"], created["versions"][-1]
    if model.isdigit():
        found = client.model(int(model))
    else:
        matches = [m for m in client.models(model) if m["name"] == model]
        if not matches:
            raise click.BadParameter(f"no model named {model!r} and no such file", param_hint="MODEL")
        found = matches[0]
    versions = found.get("versions") or []
    chosen = next((v for v in versions if v["number"] == version), None) if version else (versions[-1] if versions else None)
    if chosen is None:
        raise click.BadParameter(f"model {found['name']} has no version {version}", param_hint="--version")
    return found["id"], chosen


RAW_SUFFIXES = (".jpg", ".jpeg", ".png", ".wav")
PREVIEW_FILES = 4


def raw_files(path: Path) -> list[str]:
    """The images or WAV files a folder or a zip holds (relative names, so that class folders stay labels); [] for arrays."""
    if path.is_dir():
        return sorted(file.relative_to(path).as_posix() for file in path.rglob("*")
                      if file.is_file() and file.suffix.lower() in RAW_SUFFIXES and not any(part.startswith(".") for part in file.relative_to(path).parts))
    if path.suffix.lower() != ".zip":
        return []
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(name.endswith((".npy", ".npz")) for name in names):
        return []
    return [name for name in names if name.lower().endswith(RAW_SUFFIXES)]


def zip_raw_files(source: Path, names: list[str], target: Path) -> Path:
    """A zip of `names` from a folder or a zip, stored as they are (JPEG and PNG do not compress further)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
        if source.is_dir():
            for name in names:
                out.write(source / name, name)
        else:
            with zipfile.ZipFile(source) as archive:
                for name in names:
                    out.writestr(name, archive.read(name))
    return target


def _load_recipe(text: str) -> dict:
    """--recipe takes JSON or the path of a .json file."""
    raw = Path(text).read_text() if text.strip().endswith(".json") and Path(text).is_file() else text
    try:
        recipe = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON (nor a .json file): {exc}", param_hint="--recipe") from None
    if not isinstance(recipe, dict):
        raise click.BadParameter("a recipe is a JSON object", param_hint="--recipe")
    return recipe


def upload_raw_dataset(client: Client, path: Path, names: list[str], *, kind: str, name: str | None, recipe: dict | None,
                       model: tuple[int, dict] | None) -> dict:
    """A folder or zip of images (or WAV files) through a recipe: proposed from the model when none is given, previewed on
    the first files and checked against the model's input before everything is uploaded."""
    if recipe is None:
        if model is None:
            raise click.UsageError(f"{path.name} holds {len(names)} raw files: give --for-model MODEL (Kiln proposes the recipe) or --recipe JSON.")
        proposal = client.recipe_proposal(model[0], model[1]["number"])
        if not proposal.get("recipe"):
            raise click.ClickException("; ".join(proposal.get("why") or ["no recipe fits this model"]))
        recipe = proposal["recipe"]
        errors.print(f"Recipe proposed from the model: {json.dumps(recipe)}", markup=False, highlight=False)
        for reason in proposal.get("why") or []:
            errors.print(f"  · {reason}", markup=False, highlight=False)
    with tempfile.TemporaryDirectory(prefix="kiln-raw-") as scratch:
        sample = zip_raw_files(path, names[:PREVIEW_FILES], Path(scratch) / "preview.zip")
        preview = client.preview_dataset(sample, recipe=recipe, model_version=model[1]["id"] if model else None)
        made = ", ".join(f"{key} {spec['shape']} {spec['dtype']} (values {spec['min']}..{spec['max']})" for key, spec in preview["arrays"].items())
        labels = sorted({item["label"] for item in preview["previews"] if item.get("label")})
        errors.print(f"Preview of {len(preview['previews'])} of {len(names)} files: each becomes {made}"
                     + (f"; labels from folders: {', '.join(labels)}…" if labels else "") + ".", markup=False, highlight=False)
        fits = preview.get("fits")
        if fits and not fits["ok"]:
            raise click.ClickException("the recipe does not fit the model: " + "; ".join(fits["problems"]) + " (change it with --recipe)")
        archive = path if path.suffix.lower() == ".zip" and path.is_file() else zip_raw_files(path, names, Path(scratch) / f"{path.name}.zip")
        return _with_upload_progress(archive, lambda progress: client.upload_dataset(archive, kind=kind, name=name or path.stem,
                                                                                    progress=progress, recipe=recipe))


def _resolve_dataset(client: Client, value: str | None, kind: str, model: tuple[int, dict] | None = None) -> int | None:
    if value is None:
        return None
    path = Path(value)
    if path.exists():
        names = raw_files(path)
        if names:
            dataset = upload_raw_dataset(client, path, names, kind=kind, name=None, recipe=None, model=model)
        elif path.is_file():
            dataset = _with_upload_progress(path, lambda progress: client.upload_dataset(path, kind=kind, progress=progress))
        else:
            raise click.BadParameter(f"{value} is a folder without images or WAV files", param_hint=f"--{kind}")
        errors.print(f"Uploaded {path.name} as {kind} dataset {dataset['id']} ({dataset['samples']} samples).")
        return dataset["id"]
    if value.isdigit():
        return int(value)
    raise click.BadParameter(f"{value!r} is neither a file, a folder nor a dataset id", param_hint=f"--{kind}")


def waiting_text(job: dict) -> str:
    """Why the job waits, as the server says it ("waiting for a build slot: 2 jobs ahead"), or ""."""
    return ((job.get("waiting") or {}).get("message") or "").strip()


def follow_job(client: Client, job_id: int, *, timeout_s: float | None = None) -> dict:
    """Live stage progress and events until the job ends."""
    seen_events = 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), console=console) as progress:
        bar = progress.add_task(f"job {job_id}", total=1.0)

        def update(job: dict) -> None:
            nonlocal seen_events
            events = job.get("events") or []
            for event in events[seen_events:]:
                style = {"warning": "yellow", "error": "red"}.get(event.get("level"), "dim")
                progress.console.print(f"[{style}]{event.get('stage', '')}: {event['message']}[/{style}]")
            seen_events = len(events)
            done = job["status"] == "succeeded"
            waiting = waiting_text(job)
            progress.update(bar, completed=1.0 if done else job.get("progress", 0.0),
                            description=f"job {job_id} · {job['status']} · {job.get('stage')}" + (f" · {waiting}" if waiting else ""))

        return client.wait_for_job(job_id, on_update=update, timeout_s=timeout_s)


def _tolerance_met_everywhere(report: dict) -> bool:
    devices = report.get("devices") or []
    if not devices:
        return False
    for device in devices:
        chosen = next((v for v in device.get("variants") or [] if v["id"] == device.get("recommended")), None)
        if not chosen or not (chosen.get("accuracy") or {}).get("within_tolerance"):
            return False
    return True


def finish_job(client: Client, job: dict, download: Path | None) -> int:
    """Print the report, download the packages, and turn the outcome into the exit code."""
    if job["status"] != "succeeded":
        errors.print(f"[red]Job {job['id']} {job['status']}[/red]: {job.get('error') or ''}")
        return EXIT_ERROR
    report = client.report(job["id"])
    print_report(report)
    if download:
        for device in report.get("devices") or []:
            if device.get("package"):
                path = client.download_artifact(device["package"], download)
                console.print(f"Saved {path}")
    return EXIT_OK if _tolerance_met_everywhere(report) else EXIT_TOLERANCE_MISSED


@main.command()
@click.argument("model")
@click.option("--version", "version_number", type=int, help="Model version number (default: the latest).")
@click.option("--calibration", help="Calibration data: an .npz, a folder or zip of images/WAV files (recipe proposed from the model), or a dataset id.")
@click.option("--validation", help="Validation data: the same; class folders of images become labels.")
@click.option("--precision", "precisions", multiple=True, help="fp32, bf16, fp16, int8, int8-dynamic, int4-weight; default auto (search).")
@click.option("--metric", default="auto", type=click.Choice(["auto", "accuracy", "cosine", "sqnr", "top1_agreement"]))
@click.option("--tolerance", help="Allowed accuracy drop: 1% or 0.01 (with --metric sqnr: a floor in dB).")
@click.option("--target", "targets", multiple=True, help="Agent id or label=value; repeat. Default: every online agent.")
@click.option("--budget", "budget_minutes", type=click.IntRange(1, 24 * 60), metavar="MINUTES",
              help="The auto search's time budget in minutes (default 10); not with --precision.")
@click.option("--encrypt", is_flag=True, help="Encrypt the model files of the deployment packages (AES-256-GCM).")
@click.option("--wait/--no-wait", default=False, help="Follow the job until it ends; the exit code says whether the tolerance was met.")
@click.option("--download", type=click.Path(file_okay=False, path_type=Path), help="With --wait: save each device's package here.")
@click.option("--json", "as_json", is_flag=True, help="Print the job (with --wait: the report) as JSON; the exit code is the same.")
@click.pass_context
def deploy(ctx, model: str, version_number, calibration, validation, precisions, metric, tolerance, targets, budget_minutes, encrypt, wait, download,
           as_json) -> None:
    """Deploy MODEL (a file to upload, a model id or a name) to your devices."""
    if budget_minutes is not None and precisions:
        raise click.UsageError("--budget is the auto search's time budget; with --precision nothing is searched. Drop one of them.")
    client = _client(ctx)
    model_id, version = _resolve_model_version(client, model, version_number)
    version_id = version["id"]
    job = client.create_job(
        model_version=version_id, precisions=list(precisions) or ["auto"],
        calibration_dataset=_resolve_dataset(client, calibration, "calibration", (model_id, version)),
        validation_dataset=_resolve_dataset(client, validation, "validation", (model_id, version)),
        targets=[int(t) if t.isdigit() else t for t in targets], tolerance=parse_tolerance(tolerance, metric),
        package={"encrypt": True} if encrypt else None, budget_minutes=budget_minutes,
    )
    if as_json and not wait:
        return _print_json(job)
    (errors if as_json else console).print(f"Job {job['id']} created: {client.server}/jobs/{job['id']}")
    if not wait:
        return
    if as_json:
        ctx.invoke(jobs_wait, job_id=job["id"], timeout_s=None, download=download, as_json=True)
    sys.exit(finish_job(client, follow_job(client, job["id"]), download))


# -- reports and jobs --------------------------------------------------------------------------

def _number(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


RECOMMENDED = "★"
# Below this width the p99 column goes: the variant names must stay whole, so the star's row can be read.
WIDE_REPORT_COLUMNS = 100


def report_table(device: dict, job_id, width: int) -> Table:
    """One device's variants, the recommended one starred and in bold; names are never cut."""
    agent = device.get("agent") or {}
    variants = device.get("variants") or []
    metric = next(((v.get("accuracy") or {}).get("metric") for v in variants if (v.get("accuracy") or {}).get("metric")), None) or "accuracy"
    wide = width >= WIDE_REPORT_COLUMNS
    flagged = any((v.get("regression") or {}).get("flagged") for v in variants)
    value_header = metric if wide and len(metric) <= 14 else "value"
    table = Table(title=f"{agent.get('name') or device.get('target')} · job {job_id}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, padding=0, caption=f"recommended: {RECOMMENDED} · {value_header}: {metric} · drop: against FP32", caption_justify="left")
    longest = max((len(_variant_name(v)) for v in variants), default=7)
    table.add_column("", width=1, no_wrap=True)
    table.add_column("variant", min_width=min(longest, 40), no_wrap=True, overflow="fold")
    table.add_column("runs as", no_wrap=True)
    table.add_column("backend", min_width=11, overflow="fold")
    table.add_column("p50 ms", justify="right", no_wrap=True)
    if wide:
        table.add_column("timed", no_wrap=True)
        table.add_column("p99 ms", justify="right", no_wrap=True)
    table.add_column(value_header, justify="right", no_wrap=True)
    table.add_column("drop", justify="right", no_wrap=True)
    table.add_column("ok", min_width=3, no_wrap=True)
    if wide and flagged:
        table.add_column("regression", overflow="fold")
    for variant in variants:
        latency = variant.get("latency_ms") or {}
        accuracy = variant.get("accuracy") or {}
        regression = variant.get("regression") or {}
        starred = variant["id"] == device.get("recommended")
        cells = [RECOMMENDED if starred else "", _variant_name(variant), variant.get("effective_precision") or variant.get("precision") or "",
                 variant.get("backend") or "", _number(latency.get("p50"))]
        if wide:
            cells += [(variant.get("timing") or {}).get("source") or "", _number(latency.get("p99"))]
        cells += [_number(accuracy.get("value"), 4), _number(accuracy.get("drop"), 4), "yes" if accuracy.get("within_tolerance") else "no"]
        if wide and flagged:
            cells.append(f"{regression['slowdown']:.2f}x slower" if regression.get("flagged") else "")
        table.add_row(*cells, style="bold" if starred else None)
    return table


def _variant_name(variant: dict) -> str:
    return str(variant.get("key") or variant.get("precision") or variant.get("id"))


def regression_lines(device: dict) -> list[str]:
    """The regressions a narrow table has no column for."""
    return [f"{_variant_name(v)} on {v.get('backend')} is {v['regression']['slowdown']:.2f}x slower than before (regression)"
            for v in device.get("variants") or [] if (v.get("regression") or {}).get("flagged")]


def print_report(report: dict) -> None:
    """Each device's table, then its decision as the server stated it: the verdict, the timing behind it, why not the others."""
    for device in report.get("devices") or []:
        decision = device.get("decision") or device.get("verdict") or {}
        console.print(report_table(device, report["job"], console.width))
        if console.width < WIDE_REPORT_COLUMNS:
            for line in regression_lines(device):
                console.print(line, style="yellow", highlight=False)
        chosen = next((v for v in device.get("variants") or [] if v["id"] == device.get("recommended")), None)
        if chosen:
            console.print(f"{RECOMMENDED} {_variant_name(chosen)} on {chosen.get('backend')}", style="bold")
        console.print(decision.get("text") or device.get("reason") or "")
        print_decision_details(decision)
        print_search_notes(((report.get("search") or {}).get("notes") or {}).get(device.get("target")) or [])
        estimate = device.get("estimate")
        if estimate and estimate.get("error") is not None:
            console.print(f"Estimated before measuring: {_number(estimate['estimated_p50_ms'])} ms, measured {_number(estimate['measured_p50_ms'])} ms "
                          f"({estimate['error'] * 100:+.0f}%).")
    rerun = report.get("rerun")
    if rerun:
        console.print(f"Re-run of job {rerun['job']}: " + ("; ".join(rerun.get("differences") or []) or "same toolchain."))


def _ratio_words(ratio: dict) -> str:
    """ "1.03x (1.002x to 1.05x" as the server wrote it (the digits that decide it); a report stored before it did, at 2 decimals."""
    if ratio.get("ratio_text") and ratio.get("interval_text"):
        return f"{ratio['ratio_text']} ({ratio['interval_text']}"
    return f"{ratio['ratio']:.2f}x ({ratio['low']:.2f}x to {ratio['high']:.2f}x"


def print_search_notes(notes: list[str]) -> None:
    """Why the `auto` search proposed or dropped each family on this device: the chip's reasons, then the measured verdicts."""
    if notes:
        console.print("Search:")
        for note in notes:
            console.print(f"  {note}", markup=False, highlight=False)


def print_decision_details(decision: dict) -> None:
    """The timing the decision rests on (noise once per device, the side-by-side rounds) and why not the others."""
    noise = (decision.get("noise") or {}).get("text")
    if noise:
        console.print(f"Timing: {noise}", markup=False)
    measurement = decision.get("measurement") or {}
    for row in measurement.get("finalists") or []:
        against = row.get("against_recommended")
        ratios = ", ".join(f"{value:.2f}" for value in (against or {}).get("per_round") or [])
        versus = f": recommended {_ratio_words(against)}, {against['comparison']}); per round {ratios}" if against else ""
        console.print(f"  side by side, {measurement['rounds']} rounds · {row['label']} p50 {_number(row['p50_ms'])} ms{versus}", markup=False)
    rows = decision.get("alternatives") or []
    if rows:
        console.print("Why not the others:")
        for row in rows:
            console.print(f"  {row['family']}: {row['label']} — {row['why']}", markup=False)


def _not_finished_message(job: dict) -> str:
    progress = f", {job['progress']:.0%}" if isinstance(job.get("progress"), int | float) else ""
    return (f"Job {job['id']} is still {job['status']} (stage {job.get('stage') or '—'}{progress}): it has no report yet. "
            f"Follow it with `kiln jobs wait {job['id']}`.")


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def report(ctx, job_id: int, as_json: bool) -> None:
    """A job's report: every variant per device, the recommendation and why. Exit 4 while the job runs, 1 if it failed."""
    client = _client(ctx)
    answer = client.report(job_id)
    if as_json:
        _print_json(answer)
    if answer.get("status") not in TERMINAL_STATUSES:
        errors.print(_not_finished_message(client.job(job_id)))
        sys.exit(EXIT_NOT_FINISHED)
    if answer.get("status") != "succeeded":
        job = client.job(job_id)
        errors.print(f"[red]Job {job_id} {job['status']}[/red]: {job.get('error') or 'no report.'}")
        sys.exit(EXIT_ERROR)
    if not as_json:
        print_report(answer)


def relative_time(iso: str | None, now: datetime | None = None) -> str:
    """"just now", "42 s ago", "3 min ago", "5 h ago", "6 d ago", then the date: short enough for a narrow column."""
    if not iso:
        return "never"
    try:
        then = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return str(iso)
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = ((now or datetime.now(UTC)) - then).total_seconds()
    if seconds < 5:
        return "just now"
    for limit, unit, size in ((60, "s", 1), (3600, "min", 60), (48 * 3600, "h", 3600), (14 * 86400, "d", 86400)):
        if seconds < limit:
            return f"{round(seconds / size)} {unit} ago"
    return then.date().isoformat()


# A name longer than this folds onto a second line at 80 columns rather than squeezing every other column to nothing.
NAME_WIDTH = 36


def _narrow_table(columns: list[tuple[str, list[str], bool]]) -> Table:
    """A table for an 80-column terminal: each (header, values, whole) column marked whole is as wide as its longest value
    (a name up to NAME_WIDTH) and never cut; the others take what is left and wrap between words."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header, values, whole in columns:
        widest = max([len(header), *(len(line) for value in values for line in value.splitlines())])
        if whole:
            table.add_column(header, no_wrap=True, overflow="fold", min_width=min(widest, NAME_WIDTH))
        else:
            table.add_column(header, overflow="fold", max_width=widest)
    return table


def jobs_table(rows: list[dict], now: datetime | None = None) -> Table:
    """`kiln jobs`: model names whole (a re-run says so under its name), the stage with its progress and why it waits,
    times relative."""
    models = [(job.get("model") or {}).get("name", "") + (f"\nre-run of #{job['rerun_of']}" if job.get("rerun_of") else "") for job in rows]
    statuses = [str(job["status"]).replace("_", " ") for job in rows]
    stages = [f"{job.get('stage') or ''} {job.get('progress') or 0:.0%}" + (f"\n{waiting_text(job)}" if waiting_text(job) else "") for job in rows]
    created = [relative_time(job.get("created_at"), now) for job in rows]
    table = _narrow_table([("id", [str(job["id"]) for job in rows], True), ("model", models, True), ("status", statuses, False),
                           ("stage", stages, False), ("created", created, True)])
    for job, *cells in zip(rows, models, statuses, stages, created, strict=True):
        table.add_row(str(job["id"]), *cells)
    return table


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs(ctx, as_json: bool) -> None:
    """Deployment jobs: `kiln jobs` lists them, newest first."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(jobs_list, as_json=as_json)


@jobs.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_list(ctx, as_json: bool) -> None:
    """Your deployment jobs, newest first."""
    rows = _client(ctx).jobs()
    if as_json:
        return _print_json(rows)
    if not rows:
        console.print("No deployments yet. `kiln deploy MODEL` starts one.")
        return
    console.print(jobs_table(rows))


def _duration(stage: dict) -> str:
    started, finished = stage.get("started_at"), stage.get("finished_at")
    if not started or not finished:
        return ""
    seconds = (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def print_job(job: dict, *, events: int = 10) -> None:
    model = job.get("model") or {}
    console.print(f"[bold]Job {job['id']}[/bold] · {model.get('name', '')} v{model.get('version', '')} · {job['status']} · "
                  f"stage {job.get('stage') or '—'} · {job.get('progress', 0):.0%}", highlight=False)
    if job.get("error"):
        errors.print(f"[red]{job['error']}[/red]")
    if waiting_text(job):
        console.print(f"[yellow]Waiting: {waiting_text(job)}[/yellow]", highlight=False)
    budget = job.get("budget") or {}
    if budget.get("first_answer_at") and job["status"] not in ("succeeded", "failed", "canceled"):
        console.print("First answer in the report; still searching.", highlight=False)
    table = Table("stage", "status", "took", "message", box=box.SIMPLE_HEAD, pad_edge=False)
    for stage in job.get("stages") or []:
        table.add_row(stage["name"], stage["status"], _duration(stage), stage.get("message") or "")
    console.print(table)
    tasks = job.get("device_tasks") or []
    if tasks:
        done = sum(1 for task in tasks if task.get("status") in ("succeeded", "failed", "canceled"))
        console.print(f"Device tasks: {done} of {len(tasks)} ended.")
    for event in (job.get("events") or [])[-events:]:
        console.print(f"[dim]{str(event.get('created_at', ''))[:19]}[/dim] {event.get('stage', '')}: {event.get('message', '')}", highlight=False)


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_show(ctx, job_id: int, as_json: bool) -> None:
    """A job's status, stages with their times, device tasks and last events."""
    job = _client(ctx).job(job_id)
    if as_json:
        return _print_json(job)
    print_job(job)


@jobs.command("wait")
@click.argument("job_id", type=int)
@click.option("--timeout", "timeout_s", type=float, help="Give up after this many seconds (exit 4).")
@click.option("--download", type=click.Path(file_okay=False, path_type=Path), help="Save each device's package here.")
@click.option("--json", "as_json", is_flag=True, help="Print the final report as JSON instead of following the stages.")
@click.pass_context
def jobs_wait(ctx, job_id: int, timeout_s: float | None, download: Path | None, as_json: bool) -> None:
    """Follow a job until it ends; the exit code is deploy --wait's (0 met, 3 tolerance missed, 1 failed, 4 timed out)."""
    client = _client(ctx)
    try:
        job = client.wait_for_job(job_id, timeout_s=timeout_s) if as_json else follow_job(client, job_id, timeout_s=timeout_s)
    except TimeoutError as exc:
        errors.print(f"{exc}.")
        sys.exit(EXIT_NOT_FINISHED)
    if as_json:
        report = client.report(job_id)
        _print_json(report)
        for device in report.get("devices") or [] if download else []:
            if device.get("package"):
                errors.print(f"Saved {client.download_artifact(device['package'], download)}")
        sys.exit(EXIT_ERROR if job["status"] != "succeeded" else EXIT_OK if _tolerance_met_everywhere(report) else EXIT_TOLERANCE_MISSED)
    sys.exit(finish_job(client, job, download))


@jobs.command("rerun")
@click.argument("job_id", type=int)
@click.option("--wait/--no-wait", default=False)
@click.option("--download", type=click.Path(file_okay=False, path_type=Path))
@click.pass_context
def jobs_rerun(ctx, job_id: int, wait: bool, download: Path | None) -> None:
    """Run a job again with the same inputs; the report says what differed and flags regressions."""
    client = _client(ctx)
    job = client.rerun_job(job_id)
    console.print(f"Job {job['id']} re-runs job {job_id}.")
    if wait:
        sys.exit(finish_job(client, follow_job(client, job["id"]), download))


@jobs.command("cancel")
@click.argument("job_id", type=int)
@click.pass_context
def jobs_cancel(ctx, job_id: int) -> None:
    job = _client(ctx).cancel_job(job_id)
    console.print(f"Job {job['id']} {job['status']}.")


# -- devices -----------------------------------------------------------------------------------

@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def devices(ctx, as_json: bool) -> None:
    """Your device agents (`kiln devices`), and `kiln devices add NAME` for the commands that add one."""
    if ctx.invoked_subcommand is not None:
        return
    rows = _client(ctx).agents()
    if as_json:
        return _print_json(rows)
    if not rows:
        console.print("No devices yet. `kiln devices add lab` prints the commands that add one.")
        return
    console.print(devices_table(rows))


def devices_table(rows: list[dict], now: datetime | None = None) -> Table:
    """`kiln devices`: names whole with their labels under them, one runtime a line, heartbeats relative."""
    names = [agent["name"] + ("\n" + " ".join(f"{key}={value}" for key, value in agent["labels"].items()) if agent.get("labels") else "")
             for agent in rows]
    statuses = ["revoked" if agent.get("revoked") else "online" if agent.get("online") else "offline" for agent in rows]
    runtimes = ["\n".join(f"{name} {version}" for name, version in ((agent.get("capabilities") or {}).get("runtimes") or {}).items())
                for agent in rows]
    heartbeats = [relative_time(agent.get("last_heartbeat_at"), now) for agent in rows]
    table = _narrow_table([("id", [str(agent["id"]) for agent in rows], True), ("name · labels", names, True), ("status", statuses, True),
                           ("runtimes", runtimes, True), ("heartbeat", heartbeats, True)])
    for agent, *cells in zip(rows, names, statuses, runtimes, heartbeats, strict=True):
        table.add_row(str(agent["id"]), *cells)
    return table


@devices.command("add")
@click.argument("token_name")
@click.option("--expires-in-days", type=click.IntRange(1, 3650), help="The token enrols no device after this many days (default: never).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def devices_add(ctx, token_name: str, expires_in_days: int | None, as_json: bool) -> None:
    """Make a registration token and print the commands to run on the device (install, register and run)."""
    client = _client(ctx)
    setup = client.agent_setup()
    token = client.create_registration_token(token_name, expires_in_days=expires_in_days)
    up = token["register_command"].replace("kiln-agent register", "kiln-agent up", 1)
    if as_json:
        return _print_json({**setup, "token": token["token"], "register_command": token["register_command"], "up_command": up})
    if setup.get("warning"):
        errors.print(f"[yellow]warning[/yellow]: {setup['warning']}")
        for url in setup.get("suggested_urls") or []:
            errors.print(f"  this server's address: {url}")
    expiry = f", and enrols devices until {str(token['expires_at'])[:16].replace('T', ' ')} UTC" if token.get("expires_at") else ""
    click.echo(f"On the device (the token is shown once{expiry}):")
    click.echo(f"  1. {setup['install_command']}")
    click.echo(f"  2. {up}")
    click.echo("  3. kiln-agent install-service   # optional: keeps it running after log-out and reboots")


# -- performance database ----------------------------------------------------------------------

@main.command()
@click.option("--model", "model_id", type=int, help="Model id.")
@click.option("--agent", "agent_id", type=int, help="Agent (device) id.")
@click.option("--backend")
@click.option("--precision")
@click.option("--job", "job_id", type=int)
@click.option("--regressions", is_flag=True, help="Only measurements flagged as regressions.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--estimate", "estimate_version", type=int, help="Instead: latency estimates for this model version id on each known device.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def perf(ctx, model_id, agent_id, backend, precision, job_id, regressions, limit, estimate_version, as_json) -> None:
    """Query the performance database: every measurement across jobs, devices and toolchains."""
    client = _client(ctx)
    if estimate_version:
        answer = client.estimate(estimate_version)
        if as_json:
            return _print_json(answer)
        table = Table("device", "backend", "estimated p50 ms", "operators covered")
        for row in answer.get("devices") or []:
            table.add_row(row["agent"]["name"], row["backend"], _number(row["p50_ms"]), f"{row['coverage']:.0%}")
        return console.print(table)
    rows = client.performance(limit=limit, model=model_id, agent=agent_id, backend=backend, precision=precision, job=job_id,
                              regression="true" if regressions else None)
    if as_json:
        return _print_json(rows)
    table = Table("id", "job", "model", "variant", "device", "backend", "version", "p50 ms", "std ms", "regression", "measured")
    for row in rows:
        regression = row.get("regression") or {}
        table.add_row(str(row["id"]), str(row.get("job") or ""), row["model"]["name"], row["variant_key"], row["agent"]["name"], row["backend"],
                      row.get("backend_version") or "", _number(row["latency_ms"].get("p50")), _number(row["latency_ms"].get("std")),
                      f"{regression['slowdown']:.2f}x" if regression.get("flagged") else "", str(row["measured_at"])[:19])
    console.print(table)


# -- packages ----------------------------------------------------------------------------------

@main.group()
def packages() -> None:
    """Deployment packages: the keys that sign and encrypt them, and verification."""


@packages.command("signing-key")
@click.pass_context
def packages_signing_key(ctx) -> None:
    """Print the server's Ed25519 public key (PEM), to pin with `run.py --public-key`."""
    click.echo(_client(ctx).package_signing_key(), nl=False)


@packages.command("key")
@click.pass_context
def packages_key(ctx) -> None:
    """Print the organization's package key (base64): KILN_PACKAGE_KEY for encrypted packages."""
    click.echo(_client(ctx).package_key())


def _safe_extract(archive_path: Path, target: Path) -> None:
    with zipfile.ZipFile(archive_path) as archive:
        for member in archive.infolist():
            name = Path(member.filename)
            if name.is_absolute() or ".." in name.parts:
                raise click.ClickException(f"{archive_path.name} holds an unsafe path: {member.filename}")
        archive.extractall(target)


@packages.command("verify")
@click.argument("package", type=click.Path(exists=True, path_type=Path))
@click.option("--public-key", "public_key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM to trust; default: the key of the server you are logged in to.")
@click.pass_context
def packages_verify(ctx, package: Path, public_key: Path | None) -> None:
    """Check a package (.zip or folder) against the server's signature without running anything in it."""
    pem = public_key.read_bytes() if public_key else _client(ctx).package_signing_key().encode()
    with tempfile.TemporaryDirectory(prefix="kiln-verify-") as scratch:
        root = package
        if package.is_file():
            _safe_extract(package, Path(scratch))
            root = Path(scratch)
        try:
            manifest = verify(root, pem)
        except (VerificationFailed, OSError, ValueError, KeyError) as exc:
            errors.print(f"[red]package verification failed[/red]: {exc}")
            sys.exit(EXIT_ERROR)
    encrypted = " (model files encrypted)" if manifest.get("encryption") else ""
    console.print(f"Verified: {len(manifest['files'])} files of job {manifest['job']}, {manifest['variant']['key']} on {manifest['backend']}{encrypted}.")


if __name__ == "__main__":
    main()
