"""`kiln`: the command line of the Kiln REST API (Click + Rich), built on `kiln.Client`.

Exit codes: 0 success (for `deploy --wait`: every device has a variant within the tolerance),
1 an error or a failed/canceled job, 2 usage, 3 the job finished but some device has no variant
within the tolerance.
"""
from __future__ import annotations

import json
import socket
import sys
import tempfile
import zipfile
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from kiln.client import ApiError, Client, ClientConfig, ServerUnavailable
from kiln.package_run import VerificationFailed, verify

EXIT_OK, EXIT_ERROR, EXIT_TOLERANCE_MISSED = 0, 1, 3

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
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--kind", type=click.Choice(["calibration", "validation"]), required=True)
@click.option("--name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def datasets_upload(ctx, path: Path, kind: str, name: str | None, as_json: bool) -> None:
    client = _client(ctx)
    dataset = _with_upload_progress(path, lambda progress: client.upload_dataset(path, kind=kind, name=name, progress=progress))
    if as_json:
        return _print_json(dataset)
    console.print(f"Dataset {dataset['id']} ({dataset['kind']}, {dataset['samples']} samples{', with labels' if dataset.get('has_labels') else ''}).")


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


def _resolve_model_version(client: Client, model: str, version: int | None) -> int:
    """MODEL is a file (uploaded now), a model id, or a model name."""
    path = Path(model)
    if path.is_file():
        created = _with_upload_progress(path, lambda progress: client.upload_model(path, progress=progress))
        console.print(f"Uploaded {path.name} as model {created['id']}.")
        return created["versions"][-1]["id"]
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
    return chosen["id"]


def _resolve_dataset(client: Client, value: str | None, kind: str) -> int | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        dataset = _with_upload_progress(path, lambda progress: client.upload_dataset(path, kind=kind, progress=progress))
        console.print(f"Uploaded {path.name} as {kind} dataset {dataset['id']}.")
        return dataset["id"]
    if value.isdigit():
        return int(value)
    raise click.BadParameter(f"{value!r} is neither a file nor a dataset id", param_hint=f"--{kind}")


def follow_job(client: Client, job_id: int) -> dict:
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
            progress.update(bar, completed=1.0 if done else job.get("progress", 0.0),
                            description=f"job {job_id} · {job['status']} · {job.get('stage')}")

        return client.wait_for_job(job_id, on_update=update)


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
@click.option("--calibration", help="Calibration .npz file or dataset id.")
@click.option("--validation", help="Validation .npz file or dataset id.")
@click.option("--precision", "precisions", multiple=True, help="fp32, fp16, int8, int8-dynamic, int4-weight; default auto (search).")
@click.option("--metric", default="auto", type=click.Choice(["auto", "accuracy", "cosine", "sqnr", "top1_agreement"]))
@click.option("--tolerance", help="Allowed accuracy drop: 1% or 0.01 (with --metric sqnr: a floor in dB).")
@click.option("--target", "targets", multiple=True, help="Agent id or label=value; repeat. Default: every online agent.")
@click.option("--encrypt", is_flag=True, help="Encrypt the model files of the deployment packages (AES-256-GCM).")
@click.option("--wait/--no-wait", default=False, help="Follow the job until it ends; the exit code says whether the tolerance was met.")
@click.option("--download", type=click.Path(file_okay=False, path_type=Path), help="With --wait: save each device's package here.")
@click.pass_context
def deploy(ctx, model: str, version_number, calibration, validation, precisions, metric, tolerance, targets, encrypt, wait, download) -> None:
    """Deploy MODEL (a file to upload, a model id or a name) to your devices."""
    client = _client(ctx)
    version_id = _resolve_model_version(client, model, version_number)
    job = client.create_job(
        model_version=version_id, precisions=list(precisions) or ["auto"],
        calibration_dataset=_resolve_dataset(client, calibration, "calibration"),
        validation_dataset=_resolve_dataset(client, validation, "validation"),
        targets=[int(t) if t.isdigit() else t for t in targets], tolerance=parse_tolerance(tolerance, metric),
        package={"encrypt": True} if encrypt else None,
    )
    console.print(f"Job {job['id']} created: {client.server}/jobs/{job['id']}")
    if not wait:
        return
    sys.exit(finish_job(client, follow_job(client, job["id"]), download))


# -- reports and jobs --------------------------------------------------------------------------

def _number(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def print_report(report: dict) -> None:
    """Each device's table, then its decision as the server stated it: the verdict, the timing behind it, why not the others."""
    for device in report.get("devices") or []:
        agent = device.get("agent") or {}
        decision = device.get("decision") or device.get("verdict") or {}
        table = Table(title=f"{agent.get('name') or device.get('target')} · job {report['job']}", title_justify="left")
        for column in ("", "variant", "precision", "backend", "p50 ms", "timed", "p99 ms", "metric", "value", "drop", "ok", "regression"):
            table.add_column(column)
        for variant in device.get("variants") or []:
            latency = variant.get("latency_ms") or {}
            accuracy = variant.get("accuracy") or {}
            regression = variant.get("regression") or {}
            table.add_row(
                "★" if variant["id"] == device.get("recommended") else "", variant.get("key") or variant.get("precision"),
                variant.get("effective_precision") or variant.get("precision"), variant.get("backend"), _number(latency.get("p50")),
                (variant.get("timing") or {}).get("source") or "", _number(latency.get("p99")), str(accuracy.get("metric") or "—"),
                _number(accuracy.get("value"), 4), _number(accuracy.get("drop"), 4), "yes" if accuracy.get("within_tolerance") else "no",
                f"{regression['slowdown']:.2f}x slower" if regression.get("flagged") else "",
            )
        console.print(table)
        console.print(decision.get("text") or device.get("reason") or "")
        print_decision_details(decision)
        estimate = device.get("estimate")
        if estimate and estimate.get("error") is not None:
            console.print(f"Estimated before measuring: {_number(estimate['estimated_p50_ms'])} ms, measured {_number(estimate['measured_p50_ms'])} ms "
                          f"({estimate['error'] * 100:+.0f}%).")
    rerun = report.get("rerun")
    if rerun:
        console.print(f"Re-run of job {rerun['job']}: " + ("; ".join(rerun.get("differences") or []) or "same toolchain."))


def print_decision_details(decision: dict) -> None:
    """The timing the decision rests on (noise once per device, the side-by-side rounds) and why not the others."""
    noise = (decision.get("noise") or {}).get("text")
    if noise:
        console.print(f"Timing: {noise}", markup=False)
    measurement = decision.get("measurement") or {}
    for row in measurement.get("finalists") or []:
        against = row.get("against_recommended")
        ratios = ", ".join(f"{value:.2f}" for value in (against or {}).get("per_round") or [])
        versus = f": recommended {against['ratio']:.2f}x ({against['low']:.2f}x to {against['high']:.2f}x, {against['comparison']}); per round {ratios}" if against else ""
        console.print(f"  side by side, {measurement['rounds']} rounds · {row['label']} p50 {_number(row['p50_ms'])} ms{versus}", markup=False)
    rows = decision.get("alternatives") or []
    if rows:
        console.print("Why not the others:")
        for row in rows:
            console.print(f"  {row['family']}: {row['label']} — {row['why']}", markup=False)


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def report(ctx, job_id: int, as_json: bool) -> None:
    """A job's report: every variant per device, the recommendation and why."""
    answer = _client(ctx).report(job_id)
    if as_json:
        return _print_json(answer)
    print_report(answer)


@main.group()
def jobs() -> None:
    """Deployment jobs."""


@jobs.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_list(ctx, as_json: bool) -> None:
    rows = _client(ctx).jobs()
    if as_json:
        return _print_json(rows)
    table = Table("id", "model", "status", "stage", "progress", "re-run of", "created")
    for job in rows:
        table.add_row(str(job["id"]), (job.get("model") or {}).get("name", ""), job["status"], job["stage"], f"{job['progress']:.0%}",
                      str(job.get("rerun_of") or ""), str(job.get("created_at", ""))[:19])
    console.print(table)


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
