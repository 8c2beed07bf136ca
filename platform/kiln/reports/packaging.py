"""Deployment packages: per device, the recommended variant with its report and a script to run it.

Every package has a manifest (each file's sha256, the toolchain versions, the model's inputs and
outputs, the pre/post-processing the job declared) signed by the server's Ed25519 key; `run.py`
checks it before it loads anything. With `package.encrypt`, the model files are AES-256-GCM
encrypted with the organization's key and opened only in memory by `run.py`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import unicodedata
import zipfile
from pathlib import Path

from devices import artifacts
from kiln.pipeline.models import Artifact
from kiln.registry.models import Blob
from kiln.registry.selectors import blob_file
from kiln_client import package_run
from kiln_contract import feeds, recipes
from workers.noise import interval_text, ratio_text

from . import signing

# The package's run.py is the client's own verifier (kiln_client/package_run.py, shipped in the kiln-client wheel too).
RUN_SCRIPT_PATH = Path(package_run.__file__)
RECIPE_SCRIPT_PATH = Path(recipes.__file__)
FEEDS_SCRIPT_PATH = Path(feeds.__file__)
FORMAT = "kiln-package/1"
ZIP64_FROM_BYTES = 1 << 31
# The model file a package carries, by what the variant's file holds, and what the README says of it.
MODEL_FILES = {artifacts.ONNX: ("model.onnx", "the variant (runs on ONNX Runtime; OpenVINO reads it too)"),
               artifacts.TFLITE: ("model.tflite", "the variant as a LiteRT flatbuffer (runs on LiteRT: `pip install ai-edge-litert`)"),
               artifacts.OPENVINO_IR: ("model.openvino.tar", "the variant as an OpenVINO IR, `model.xml` and `model.bin` in a tar "
                                       "(runs on OpenVINO: `pip install openvino`)")}


def dataset_recipe(job) -> dict:
    """The recipe that made the job's validation data from raw files (else its calibration data's), if any."""
    for dataset in (job.validation_dataset, job.calibration_dataset):
        if dataset is not None and dataset.recipe:
            return dataset.recipe
    return {}


NAME_PART_CHARS = 48


def _slug(text: str) -> str:
    """`text` in lowercase ASCII letters, digits and single hyphens (accents folded, the rest dropped), at most NAME_PART_CHARS."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")[:NAME_PART_CHARS].strip("-")


def package_name(*, job, target: str, agent_name: str | None, chosen: dict) -> str:
    """The package's file name: model, version, variant, backend and device, e.g. `digits-v1-int8-minmax-onnxruntime-pi-5-agent-3.zip`.

    Only `[a-z0-9-]`, so it is safe as a path and in a Content-Disposition header. The target (`agent:3`,
    `rack=a`) ends it because device names need not be unique: one job's packages never share a name.
    """
    version = job.model_version
    parts = [_slug(version.model.name) or "model", f"v{version.number}", _slug(chosen.get("key") or chosen["precision"]),
             _slug(chosen["backend"]), _slug(agent_name or ""), _slug(target)]
    return "-".join(part for part in parts if part) + ".zip"


def legacy_package_name(target: str) -> str:
    """The name a package had in reports stored before `package_name` said the model and variant."""
    return "kiln-package-" + re.sub(r"[^A-Za-z0-9._-]+", "-", target).strip("-") + ".zip"


def _why_not_table(decision: dict) -> list[str]:
    """The decision's "why not the others", one row per precision family and per failure, as Markdown lines."""
    rows = decision.get("alternatives") or []
    if not rows:
        return []
    lines = ["Why not the others:", "", "| family | best of it | p50 (ms) | why not |", "|---|---|---|---|"]
    for row in rows:
        p50 = f"{row['p50_ms']:.3g}" if row.get("p50_ms") is not None else "-"
        count = f" (of {row['variants']})" if row.get("variants", 1) > 1 else ""
        lines.append(f"| {row['family']} | {row['label']}{count} | {p50} | {str(row['why']).replace('|', '/')} |")
    return [*lines, ""]


def _measurement_lines(decision: dict) -> list[str]:
    """How the decision was measured: the device's noise, told once, and the side-by-side rounds when there were some."""
    lines = []
    noise = (decision.get("noise") or {}).get("text")
    if noise:
        lines += [f"Timing on this device: {noise}", ""]
    measurement = decision.get("measurement")
    if measurement:
        lines += [f"Finalists timed side by side in {measurement['rounds']} rounds (each finalist's figures from those rounds alone):", ""]
        for row in measurement.get("finalists") or []:
            against = row.get("against_recommended")
            versus = (f"; the recommended is {ratio_text(against['ratio'])} its speed ({interval_text(against['low'], against['high'])}), "
                      f"{against['comparison']}" if against else "")
            lines.append(f"- {row['label']}: p50 {row['p50_ms']:.3g} ms{versus}")
        lines.append("")
    return lines


def _readme(job, device: dict, chosen: dict, model_format: str) -> str:
    latency = chosen.get("latency_ms") or {}
    accuracy = chosen.get("accuracy") or {}
    agent = device.get("agent") or {}
    decision = device.get("decision") or {}
    return "\n".join([
        f"# {job.model_version.model.name} v{job.model_version.number}: {decision.get('label') or chosen.get('label') or chosen['backend']}",
        "",
        f"Kiln job {job.id} measured this variant on {agent.get('name') or device['target']}:",
        f"p50 {latency.get('p50', float('nan')):.3f} ms, p99 {latency.get('p99', float('nan')):.3f} ms, "
        f"{accuracy.get('metric')} {accuracy.get('value')} (drop {accuracy.get('drop')}).",
        "",
        f"Verdict: {decision.get('text') or device['reason']}",
        "",
        *_measurement_lines(decision),
        *_why_not_table(decision),
        "- `{}`: {}.".format(*MODEL_FILES[model_format]),
        "- `compiled/`: the engine the device built from it, when the agent uploaded one.",
        "- `report.json`: every variant measured on this device.",
        "- `manifest.json`, `manifest.sig`, `signing-key.pem`: every file's sha256 and the toolchain, signed by the Kiln server.",
        "- `run.py`: `python run.py your-inputs.npz --public-key kiln.pem` verifies the package against your server's key",
        "  (`kiln packages signing-key > kiln.pem`), then times the model here; `--random` is a smoke test on random inputs,",
        "  `--verify-only` only checks. Without `--public-key` it trusts the key the package carries, and says so.",
        *(["- `kiln_recipe.py`: the preprocessing recipe of the job's data; `run.py` reads raw input through it",
           "  (`python run.py cat.jpg`, a folder or .zip of files, `--save-outputs outputs.npz` for every sample's outputs)."]
          if dataset_recipe(job) else []),
        "- Your own files beside `run.py` (inputs, outputs) are fine; code or caches the server did not sign",
        "  (`*.py`, `__pycache__/`, `*.so`, `*.pth`, anything in `compiled/`) fail verification.",
        *(["", "The model files are encrypted (`.enc`, AES-256-GCM). Set `KILN_PACKAGE_KEY` to your organization's key",
           "(`kiln packages key`); `run.py` decrypts them in memory only."] if (job.package or {}).get("encrypt") else []),
        "",
    ])


class _HashingWriter:
    """Counts and hashes what goes into a zip entry."""

    def __init__(self, target):
        self.target, self.digest, self.size = target, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.target.write(data)


def _add_file(archive: zipfile.ZipFile, source: Path, name: str, *, role: str, key: bytes | None) -> dict:
    """Stream one file into the package, encrypted when a key is given; returns its manifest entry."""
    stored = f"{name}.enc" if key else name
    info = zipfile.ZipInfo(stored)
    # Ciphertext does not compress; the model as is usually does a little.
    info.compress_type = zipfile.ZIP_STORED if key else zipfile.ZIP_DEFLATED
    with open(source, "rb") as handle, archive.open(info, "w", force_zip64=source.stat().st_size >= ZIP64_FROM_BYTES) as entry:
        writer = _HashingWriter(entry)
        if key:
            signing.encrypt_stream(key=key, source=handle, target=writer, associated_data=name.encode())
        else:
            while block := handle.read(signing.STREAM_BYTES):
                writer.write(block)
    return {"path": stored, "original_path": name, "role": role, "sha256": writer.digest.hexdigest(), "size_bytes": writer.size, "encrypted": bool(key)}


def _add_text(archive: zipfile.ZipFile, name: str, text: str, *, role: str) -> dict:
    data = text.encode()
    archive.writestr(name, data)
    return {"path": name, "original_path": name, "role": role, "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data), "encrypted": False}


def _manifest(*, job, device: dict, chosen: dict, files: list[dict], key_id: str | None) -> dict:
    agent = device.get("agent") or {}
    capabilities = agent.get("capabilities") or {}
    version = job.model_version
    return {
        "format": FORMAT,
        "job": job.id,
        "model": {"name": version.model.name, "version": version.number, "sha256": version.blob.sha256},
        "variant": {"key": chosen.get("key"), "precision": chosen["precision"], "effective_precision": chosen.get("effective_precision"),
                    "label": chosen.get("label"), "recipe": chosen.get("recipe") or {}},
        "backend": chosen["backend"],
        # Compile options the search measured for this variant; run.py applies them (static shapes, threads, hints).
        "compile": (chosen.get("options") or {}).get("compile") or {},
        "device": {"name": agent.get("name"), "target": device["target"], "cpu_model": capabilities.get("cpu_model")},
        "measured": {"latency_ms": chosen.get("latency_ms"), "accuracy": chosen.get("accuracy"), "threads": chosen.get("threads")},
        "toolchain": {"host": (job.toolchain or {}).get("host") or {},
                      "device": {"agent_version": capabilities.get("agent_version"), "runtimes": capabilities.get("runtimes") or {}}},
        "signature": version.signature,
        "preprocessing": (job.package or {}).get("preprocessing"),
        "recipe": dataset_recipe(job) or None,
        "feeds": (job.evaluation or {}).get("feeds"),
        "postprocessing": (job.package or {}).get("postprocessing"),
        "encryption": {"algorithm": "AES-256-GCM", "key": "organization", "key_id": key_id, "associated_data": "original_path"} if key_id else None,
        "signing_key_fingerprint": signing.public_key_fingerprint(),
        "files": files,
    }


def build_device_package(*, job, device: dict, out_path: Path) -> bool:
    """Write the signed package of one device's recommended variant; False when nothing was recommended."""
    chosen = next((v for v in device["variants"] if v["id"] == device["recommended"]), None)
    if chosen is None or not chosen.get("variant_artifact"):
        return False
    key, key_id = signing.organization_package_key(organization=job.organization) if (job.package or {}).get("encrypt") else (None, None)
    variant_artifact = Artifact.objects.select_related("blob").get(pk=chosen["variant_artifact"]["id"])
    with zipfile.ZipFile(out_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        model_path = blob_file(variant_artifact.blob)
        model_format = artifacts.artifact_format(model_path)
        files = [_add_file(archive, model_path, MODEL_FILES[model_format][0], role="model", key=key)]
        compiled = chosen.get("artifact")
        # A runtime whose compiled artifact is the variant itself (LiteRT loads the flatbuffer as is) adds no second copy.
        if compiled and compiled["id"] != variant_artifact.id and compiled.get("sha256") != variant_artifact.blob.sha256:
            compiled_artifact = Artifact.objects.select_related("blob").get(pk=compiled["id"])
            files.append(_add_file(archive, blob_file(compiled_artifact.blob), f"compiled/{compiled_artifact.name}", role="compiled", key=key))
        # How Kiln fed the model (layouts, state carried): run.py feeds the same way.
        files.append(_add_text(archive, "kiln_feeds.py", FEEDS_SCRIPT_PATH.read_text(), role="script"))
        recipe = dataset_recipe(job)
        if recipe:
            # The package prepares raw input with the very code that made the dataset it was measured on.
            files.append(_add_text(archive, "kiln_recipe.py", RECIPE_SCRIPT_PATH.read_text(), role="script"))
            if recipe.get("tokenizer_sha256"):
                tokenizer = Blob.objects.get(organization=job.organization, sha256=recipe["tokenizer_sha256"])
                files.append(_add_file(archive, blob_file(tokenizer), "tokenizer.json", role="tokenizer", key=None))
        files += [
            _add_text(archive, "report.json", json.dumps({"job": job.id, "tolerance": job.tolerance, **device}, indent=2, default=str), role="report"),
            _add_text(archive, "run.py", RUN_SCRIPT_PATH.read_text(), role="script"),
            _add_text(archive, "README.md", _readme(job, device, chosen, model_format), role="readme"),
            _add_text(archive, "signing-key.pem", signing.public_key_pem(), role="signing-key"),
        ]
        manifest = json.dumps(_manifest(job=job, device=device, chosen=chosen, files=files, key_id=key_id), indent=2, sort_keys=True, default=str).encode()
        archive.writestr("manifest.json", manifest)
        archive.writestr("manifest.sig", base64.b64encode(signing.sign(manifest)))
    return True
