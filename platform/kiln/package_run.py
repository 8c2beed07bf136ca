"""Verify this Kiln deployment package, load its model (decrypting it in memory if needed), and time it.

    python run.py inputs.npz                       # verify, then run on the backend Kiln measured (onnxruntime, openvino, litert)
    python run.py --verify-only                    # only check the signature and every file's digest
    python run.py inputs.npz --public-key kiln.pem # pin the server's key (kiln packages signing key)
    KILN_PACKAGE_KEY=... python run.py inputs.npz  # an encrypted package: the organization's key

    python run.py photos.zip --save-outputs out.npz # raw files through the job's recipe; every sample's outputs

The inputs are an .npz with one array per model input (first axis = samples), as uploaded to Kiln,
or, when the job's dataset was raw data with a recipe, the same kind of raw files (a .zip of
images or WAV files, a .txt of lines): `kiln_recipe.py` prepares them exactly as Kiln did.
Needs numpy, cryptography, and onnxruntime or openvino (ai-edge-litert for a LiteRT package's
model.tflite), plus Pillow, soundfile or tokenizers for raw input. Exit code 2: the package failed
verification.
"""
import argparse
import base64
import hashlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import load_pem_public_key

HERE = Path(__file__).resolve().parent
NONCE_BYTES = 12
UNSIGNED = {"manifest.json", "manifest.sig"}


class VerificationFailed(Exception):
    """The package is not what the server signed."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(root: Path, public_key_pem: bytes | None = None) -> dict:
    """The manifest, once its signature and every listed file check out and nothing else is there."""
    manifest_bytes = (root / "manifest.json").read_bytes()
    signature = base64.b64decode((root / "manifest.sig").read_bytes())
    key = load_pem_public_key(public_key_pem or (root / "signing-key.pem").read_bytes())
    try:
        key.verify(signature, manifest_bytes)
    except InvalidSignature:
        raise VerificationFailed("the manifest's signature does not match (wrong key, or the manifest was changed)") from None
    manifest = json.loads(manifest_bytes)
    listed = {entry["path"]: entry for entry in manifest["files"]}
    present = {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    extra = sorted(present - set(listed) - UNSIGNED)
    if extra:
        raise VerificationFailed(f"files not in the manifest: {', '.join(extra)}")
    for path, entry in listed.items():
        if path not in present:
            raise VerificationFailed(f"{path} is missing")
        if _sha256(root / path) != entry["sha256"]:
            raise VerificationFailed(f"{path} does not match its digest in the manifest")
    return manifest


def read_model_file(root: Path, entry: dict, key: bytes | None) -> bytes:
    """A model file's bytes; an encrypted one is opened here, in memory, and never written out."""
    data = (root / entry["path"]).read_bytes()
    if not entry.get("encrypted"):
        return data
    if key is None:
        raise SystemExit("This package is encrypted: pass --key or set KILN_PACKAGE_KEY (kiln packages key).")
    try:
        return AESGCM(key).decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], entry["original_path"].encode())
    except InvalidTag:
        raise SystemExit(f"{entry['path']} does not open with this key (wrong key, or another organization's package).") from None


FLOAT_PRECISIONS = ("fp32", "fp16")


def _ov_config(options: dict, precision: str = "fp32") -> dict:
    # The settings Kiln measured (devices/backends/openvino.py `_config`, restated here because this
    # script runs without Kiln installed): the LATENCY hint, and f32 for a float model unless the
    # search chose otherwise; a quantized model gets OpenVINO's default, which runs its INT8 kernels.
    config = {"PERFORMANCE_HINT": options.get("performance_hint", "LATENCY")}
    hint = options.get("inference_precision") or ("f32" if str(precision).split("-")[0] in FLOAT_PRECISIONS else None)
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    if options.get("threads"):
        config["INFERENCE_NUM_THREADS"] = int(options["threads"])
    return config


def _ort_session(ort, model_bytes: bytes, options: dict):
    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = levels[options.get("graph_optimization", "all")]
    if options.get("threads"):
        session_options.intra_op_num_threads = int(options["threads"])
    static = options.get("static_shapes") or {}
    if static:
        # Free dimensions are overridden by their symbolic names, which only a loaded session tells.
        probe = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
        for value in probe.get_inputs():
            for dim, size in zip(value.shape, static.get(value.name) or []):
                if isinstance(dim, str) and dim:
                    session_options.add_free_dimension_override_by_name(dim, int(size))
    return ort.InferenceSession(model_bytes, session_options, providers=["CPUExecutionProvider"])


def _litert(model_bytes: bytes, threads: int | None):
    """LiteRT's interpreter (XNNPACK by default, as on the device) over the flatbuffer: the input names and
    `run(feeds) -> {output name: array}` through its one signature, named as the ONNX model's inputs and outputs."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes, num_threads=threads)
    runner = interpreter.get_signature_runner()
    dtypes = {name: detail["dtype"] for name, detail in runner.get_input_details().items()}
    return list(dtypes), lambda feeds: runner(**{name: np.ascontiguousarray(feeds[name], dtype=dtypes[name]) for name in dtypes})


def _ov_model(core, ov, root: Path, files: dict, key: bytes | None):
    """OpenVINO's model of the package's model file: the ONNX file, or the IR's model.xml and model.bin from their tar."""
    if "model.openvino.tar" not in files:
        return core.read_model(read_model_file(root, files["model.onnx"], key))
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(read_model_file(root, files["model.openvino.tar"], key)), mode="r:") as archive:
        xml, weights = (archive.extractfile(name).read() for name in ("model.xml", "model.bin"))
    return core.read_model(xml, ov.Tensor(np.frombuffer(weights, dtype=np.uint8)))


def load(root: Path, manifest: dict, key: bytes | None, backend: str):
    """A callable `run(feeds) -> outputs`, on the backend asked for, from the engine Kiln measured when there is one,
    with the compile options Kiln measured (static shapes, threads, hints)."""
    files = {entry["original_path"]: entry for entry in manifest["files"] if entry.get("role") in ("model", "compiled")}
    compiled = next((entry for entry in files.values() if entry["role"] == "compiled"), None)
    options = manifest.get("compile") or {}
    if "model.tflite" in files:
        if backend != "litert":
            raise SystemExit(f"This package's model is a LiteRT flatbuffer (model.tflite): it runs on litert, not {backend}.")
        # The thread count the device measured with, unless the search chose one.
        threads = options.get("threads") or (manifest.get("measured") or {}).get("threads")
        return _litert(read_model_file(root, files["model.tflite"], key), int(threads) if threads else None)
    if "model.openvino.tar" in files and backend != "openvino":
        raise SystemExit(f"This package's model is an OpenVINO IR (model.openvino.tar): it runs on openvino, not {backend}.")
    if compiled is not None and manifest["backend"] != backend:
        compiled = None
    if backend == "openvino":
        import openvino as ov

        core = ov.Core()
        config = _ov_config(options, (manifest.get("variant") or {}).get("precision") or "fp32")
        if compiled is not None:
            engine = core.import_model(io.BytesIO(read_model_file(root, compiled, key)), "CPU", config)
        else:
            model = _ov_model(core, ov, root, files, key)
            if options.get("static_shapes"):
                model.reshape(options["static_shapes"])
            engine = core.compile_model(model, "CPU", config)
        request = engine.create_infer_request()
        return [port.get_any_name() for port in engine.inputs], request.infer
    import onnxruntime as ort

    source = compiled if compiled is not None and compiled["original_path"].endswith(".onnx") else files["model.onnx"]
    session = _ort_session(ort, read_model_file(root, source, key), options)
    return [i.name for i in session.get_inputs()], lambda feeds: session.run(None, feeds)


def _ordered(outputs, names: list[str]) -> dict:
    """Outputs by name, whether the runtime returned a list or a mapping by port."""
    if isinstance(outputs, list | tuple):
        return dict(zip(names, outputs))
    by_name = {(port.get_any_name() if hasattr(port, "get_any_name") else port): value for port, value in outputs.items()}
    return {name: by_name[name] for name in names}


def iter_rows(path: str, manifest: dict, names: list[str]):
    """Each sample's arrays without the sample axis: rows of an .npz, or raw files prepared by the package's recipe."""
    if path.lower().endswith(".npz"):
        with np.load(path, allow_pickle=False) as data:
            present = [name for name in names if name in data.files]
            for index in range(len(data[present[0]])):
                yield {name: data[name][index] for name in present}
        return
    recipe = manifest.get("recipe")
    if not recipe:
        raise SystemExit("This package has no recipe for raw input: pass an .npz of input arrays.")
    import kiln_recipe

    if recipe["type"] == "text":
        tokenizer = kiln_recipe.load_tokenizer((HERE / "tokenizer.json").read_text(encoding="utf-8"), recipe)
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield kiln_recipe.prepare_text(line.rstrip("\n"), recipe, tokenizer)
        return
    import zipfile

    with zipfile.ZipFile(path) as archive:
        for member in kiln_recipe.raw_members(archive.namelist(), recipe):
            yield kiln_recipe.prepare_file(member, archive.read(member), recipe)


def feed_plan(manifest: dict, names: list[str]) -> dict:
    """How Kiln fed the model (kiln_feeds.py): batch-first samples unless the job said otherwise."""
    return manifest.get("feeds") or {"mode": "batch", "format": "npz", "offsets": dict.fromkeys(names, 0), "state": {}, "initial": {}}


def iter_calls(run, path: str, manifest: dict, names: list[str]):
    """`(step, feeds, outputs)` of every call, sequences call by call with state carried as Kiln did."""
    import kiln_feeds

    plan = feed_plan(manifest, names)
    state_inputs = set((plan.get("state") or {}).values())
    for row in iter_rows(path, manifest, [name for name in names if name not in state_inputs]):
        yield from kiln_feeds.run_calls(run, kiln_feeds.sample_calls(row, plan), plan)


def save_outputs(run, path: str, manifest: dict, names: list[str], output: str) -> int:
    """Run every sample and write the outputs by name, laid out as Kiln's FP32 reference."""
    import kiln_feeds

    by_calls = kiln_feeds.needs_calls(feed_plan(manifest, names))
    collected: dict[str, list] = {}
    for _, _, outputs in iter_calls(run, path, manifest, names):
        for name, value in outputs.items():
            value = np.asarray(value)
            # Batch-first: one sample's rows (its batch of one); by calls: the exact tensor of each call.
            collected.setdefault(name, []).append(value if by_calls or (value.ndim and value.shape[0] == 1) else value[None])
    np.savez(output, **{name: np.stack(parts) if by_calls else np.concatenate(parts) for name, parts in collected.items()})
    return len(next(iter(collected.values()), []))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="?", help=".npz of input arrays (first axis = samples), or raw files the package's recipe reads")
    parser.add_argument("--save-outputs", help="run every sample and write the outputs, by output name, to this .npz")
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--public-key", help="PEM of the server's signing key to trust (default: the one in the package)")
    parser.add_argument("--key", default=os.environ.get("KILN_PACKAGE_KEY"), help="base64 key of an encrypted package")
    parser.add_argument("--backend", choices=["onnxruntime", "openvino", "litert"], help="default: the backend Kiln measured")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    try:
        manifest = verify(HERE, Path(args.public_key).read_bytes() if args.public_key else None)
    except (VerificationFailed, OSError, ValueError, KeyError) as exc:
        print(f"package verification failed: {exc}", file=sys.stderr)
        return 2
    print(f"verified: {len(manifest['files'])} files signed by key {manifest['signing_key_fingerprint']}")
    if args.verify_only:
        return 0
    if not args.inputs:
        parser.error("inputs is required unless --verify-only")
    key = base64.b64decode(args.key) if args.key else None
    names, run = load(HERE, manifest, key, args.backend or manifest["backend"])
    sys.path.insert(0, str(HERE))
    output_names = [output["name"] for output in manifest["signature"]["outputs"]]
    by_name = lambda feeds: _ordered(run(feeds), output_names)  # noqa: E731
    if args.save_outputs:
        count = save_outputs(by_name, args.inputs, manifest, names, args.save_outputs)
        print(f"outputs of {count} calls written to {args.save_outputs}")
        return 0
    _, feeds, _ = next(iter_calls(by_name, args.inputs, manifest, names))
    for _ in range(10):
        run(feeds)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        run(feeds)
        times.append((time.perf_counter() - start) * 1000)
    print(f"p50 {statistics.median(times):.3f} ms over {args.runs} runs (batch 1, {args.backend or manifest['backend']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
