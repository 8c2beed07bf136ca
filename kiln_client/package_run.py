"""Verify this Kiln deployment package, load its model (decrypting it in memory if needed), and time it.

    python run.py inputs.npz --public-key kiln.pem # verify against your server's pinned key, then time the model
    python run.py cat.jpg                          # raw input through the package's recipe: an image, a WAV, a .txt,
                                                   # or a folder or .zip of them
    python run.py --random                         # a smoke test on random inputs shaped by the model's signature
    python run.py --verify-only                    # only check the signature and every file's digest
    KILN_PACKAGE_KEY=... python run.py inputs.npz  # an encrypted package: the organization's key
    python run.py photos.zip --save-outputs out.npz # every sample's outputs, by output name

The inputs are an .npz with one array per model input (first axis = samples), as uploaded to Kiln,
or, when the job's dataset was raw data with a recipe, the same kind of raw input:
`kiln_recipe.py` prepares it exactly as Kiln did. Without `--public-key` (`kiln packages
signing-key > kiln.pem`) the package is checked against the key it carries itself, and run.py says
so on stderr. Files you keep beside run.py (inputs, outputs, photos) are yours; code or caches the
server did not sign (`*.py`, `*.pyc`, `__pycache__/`, `*.so`, `*.pth`, anything in `compiled/`)
fail verification. The helpers (`kiln_feeds.py`, `kiln_recipe.py`) are compiled from their verified
bytes; no bytecode is read or written. Needs numpy and cryptography, and onnxruntime or openvino
(ai-edge-litert for a LiteRT package's model.tflite), plus Pillow, soundfile or tokenizers for raw
input; a missing one ends with the command that installs it. Exit code 2: the package failed
verification.
"""
import os
import sys

if __name__ == "__main__":
    # Before anything else is imported. `python run.py` puts this folder first on sys.path, so a planted
    # `numpy.py` (or `__pycache__/argparse.cpython-311.pyc`) beside run.py would run before any check:
    # take the folder off the path, and write no bytecode of what this script loads.
    sys.dont_write_bytecode = True
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]

import argparse
import base64
import hashlib
import io
import json
import statistics
import time
import types
from pathlib import Path

try:
    import numpy as np
    from cryptography.exceptions import InvalidSignature, InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
except ImportError as missing:  # the first thing a new machine trips on: say what to install, not a traceback
    raise SystemExit(f"run.py needs numpy and cryptography ({missing.name} is missing): pip install numpy cryptography") from None

HERE = Path(__file__).resolve().parent
NONCE_BYTES = 12
UNSIGNED = {"manifest.json", "manifest.sig"}
# Files a user may not add to a package: anything Python (or the dynamic linker) could load as code.
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".pyd", ".pth", ".so", ".dylib", ".dll")
# How a runtime a package needs is installed, for the message a machine without it gets.
INSTALL = {"onnxruntime": "pip install onnxruntime", "openvino": "pip install openvino", "litert": "pip install ai-edge-litert",
           "PIL": "pip install pillow", "soundfile": "pip install soundfile", "tokenizers": "pip install tokenizers"}


class VerificationFailed(Exception):
    """The package is not what the server signed."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _present_files(root: Path) -> set[str]:
    """Every file under `root` (links included, never followed), as paths relative to it; caches are files too."""
    present = set()
    for folder, subfolders, names in os.walk(root, followlinks=False):
        relative = Path(folder).relative_to(root)
        links = [name for name in subfolders if os.path.islink(os.path.join(folder, name))]
        present |= {(relative / name).as_posix() for name in [*names, *links]}
    return present


def _could_run(path: str, package_folders: set[str]) -> bool:
    """Whether an unsigned file could be imported or executed: code, any cache, anything in the package's own folders.

    Data a user keeps beside run.py (the .npz, photos, a .wav) cannot, and is not the package's business.
    """
    parts = path.split("/")
    name = parts[-1].lower()
    return ("__pycache__" in parts or name.endswith(CODE_SUFFIXES) or ".so." in name
            or (len(parts) > 1 and parts[0] in package_folders))


def verify(root: Path, public_key_pem: bytes | None = None) -> dict:
    """The manifest, once its signature and every listed file check out and no unsigned file could run.

    Every file counts, `__pycache__` included: an unchecked-hash .pyc beside a signed .py is what Python would run.
    """
    manifest_bytes = (root / "manifest.json").read_bytes()
    signature = base64.b64decode((root / "manifest.sig").read_bytes())
    key = load_pem_public_key(public_key_pem or (root / "signing-key.pem").read_bytes())
    try:
        key.verify(signature, manifest_bytes)
    except InvalidSignature:
        raise VerificationFailed("the manifest's signature does not match (wrong key, or the manifest was changed)") from None
    manifest = json.loads(manifest_bytes)
    listed = {entry["path"]: entry for entry in manifest["files"]}
    present = _present_files(root)
    package_folders = {path.split("/")[0] for path in listed if "/" in path}
    unsigned = sorted(path for path in present - set(listed) - UNSIGNED if _could_run(path, package_folders))
    if unsigned:
        raise VerificationFailed(f"files not in the manifest: {', '.join(unsigned)} (code or caches the server did not sign; "
                                 "delete them, and keep your own files outside the package's folders)")
    for path, entry in listed.items():
        if path not in present:
            raise VerificationFailed(f"{path} is missing")
        if _sha256(root / path) != entry["sha256"]:
            raise VerificationFailed(f"{path} does not match its digest in the manifest")
    return manifest


def read_verified(root: Path, entry: dict) -> bytes:
    """A listed file's bytes, checked against the manifest once more as read: what is used is what was verified."""
    data = (root / entry["path"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise VerificationFailed(f"{entry['path']} changed after it was verified")
    return data


def _entry(manifest: dict, original_path: str) -> dict:
    entry = next((entry for entry in manifest["files"] if entry.get("original_path", entry["path"]) == original_path), None)
    if entry is None:
        raise VerificationFailed(f"{original_path} is not in this package's manifest")
    return entry


def load_helper(root: Path, manifest: dict, name: str) -> types.ModuleType:
    """The package's `NAME.py` as a module, compiled from its verified bytes: never from a .pyc, never from sys.path."""
    if name in sys.modules and getattr(sys.modules[name], "__kiln_verified__", False):
        return sys.modules[name]
    source = read_verified(root, _entry(manifest, f"{name}.py"))
    module = types.ModuleType(name)
    module.__file__ = str(root / f"{name}.py")
    module.__kiln_verified__ = True
    sys.modules[name] = module  # dataclasses and typing look a module up by name while it runs
    exec(compile(source, module.__file__, "exec", dont_inherit=True), module.__dict__)
    return module


def require(module: str):
    """Import a runtime or decoder the package needs; without it, end with the command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        name = "litert" if top == "ai_edge_litert" else top
        raise SystemExit(f"{name} is not installed on this machine: {INSTALL.get(name, f'pip install {name}')}") from None


def read_model_file(root: Path, entry: dict, key: bytes | None) -> bytes:
    """A model file's bytes; an encrypted one is opened here, in memory, and never written out."""
    data = read_verified(root, entry)
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
    Interpreter = require("ai_edge_litert.interpreter").Interpreter

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
        ov = require("openvino")

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
    ort = require("onnxruntime")
    source = compiled if compiled is not None and compiled["original_path"].endswith(".onnx") else files["model.onnx"]
    session = _ort_session(ort, read_model_file(root, source, key), options)
    return [i.name for i in session.get_inputs()], lambda feeds: session.run(None, feeds)


def _ordered(outputs, names: list[str]) -> dict:
    """Outputs by name, whether the runtime returned a list or a mapping by port."""
    if isinstance(outputs, list | tuple):
        return dict(zip(names, outputs))
    by_name = {(port.get_any_name() if hasattr(port, "get_any_name") else port): value for port, value in outputs.items()}
    return {name: by_name[name] for name in names}


# iter_rows's source for `--random`.
RANDOM = object()
DECODERS = {"image": ("PIL",), "audio": ("soundfile",), "text": ("tokenizers",)}
RAW_SUFFIXES = {"image": (".jpg", ".jpeg", ".png"), "audio": (".wav",), "text": (".txt",)}


def random_row(manifest: dict, names: list[str], plan: dict) -> dict:
    """One sample of seeded random inputs shaped by the model's signature (free dimensions 1): a smoke test, not a measure.

    Whole-number inputs (token ids, indices) are zeros, which every embedding table accepts.
    """
    rng = np.random.default_rng(0)
    row = {}
    for spec in manifest["signature"]["inputs"]:
        if spec["name"] not in names:
            continue
        shape = [dim if isinstance(dim, int) and dim > 0 else 1 for dim in spec.get("shape") or []]
        # The layout Kiln fed (kiln_feeds.py): a batch-first sample drops the batch axis, a sequence adds a step axis.
        offset = (plan.get("offsets") or {}).get(spec["name"], 0)
        shape = shape[1:] if offset == 0 else [1, *shape] if offset == 2 else shape
        dtype = np.dtype(spec["dtype"]) if spec["dtype"] in np.sctypeDict else np.dtype(np.float32)
        row[spec["name"]] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    return row


def _raw_files(path: Path, recipe: dict, recipes) -> list[tuple[str, bytes]]:
    """`(name, bytes)` of the raw files a path holds for an image or audio recipe: one file, a folder of them, or a zip."""
    suffixes = RAW_SUFFIXES[recipe["type"]]
    if path.is_dir():
        names = [item.relative_to(path).as_posix() for item in sorted(path.rglob("*")) if item.is_file()]
        return [(name, (path / name).read_bytes()) for name in recipes.raw_members(names, recipe)]
    if path.suffix.lower() == ".zip":
        import zipfile

        with zipfile.ZipFile(path) as archive:
            return [(name, archive.read(name)) for name in recipes.raw_members(archive.namelist(), recipe)]
    if path.suffix.lower() in suffixes:
        return [(path.name, path.read_bytes())]
    kind = {"image": "a JPEG or PNG", "audio": "a WAV file", "text": "a .txt of lines"}[recipe["type"]]
    raise SystemExit(f"This package's recipe reads {recipe['type']} input: pass {kind}, a folder or .zip of them, or an .npz of "
                     f"input arrays (not {path.name}).")


def iter_rows(source: str, manifest: dict, names: list[str], root: Path = HERE):
    """Each sample's arrays without the sample axis: rows of an .npz, random inputs (`--random`), or raw input
    (an image, a WAV, a text file, a folder or zip of them) prepared by the package's own recipe."""
    if source is RANDOM:
        yield random_row(manifest, names, feed_plan(manifest, names))
        return
    if source.lower().endswith(".npz"):
        with np.load(source, allow_pickle=False) as data:
            present = [name for name in names if name in data.files]
            if not present:
                raise SystemExit(f"{source} holds no array named as a model input ({', '.join(names)}).")
            for index in range(len(data[present[0]])):
                yield {name: data[name][index] for name in present}
        return
    recipe = manifest.get("recipe")
    if not recipe:
        raise SystemExit("This package has no recipe for raw input: pass an .npz of input arrays (or --random for a smoke test).")
    for module in DECODERS[recipe["type"]]:
        require(module)
    recipes = load_helper(root, manifest, "kiln_recipe")
    path = Path(source)
    if recipe["type"] == "text":
        if path.is_dir() or path.suffix.lower() in (".zip", ".npz"):
            raise SystemExit(f"This package's recipe reads text: pass a .txt file of lines (not {path.name}).")
        tokenizer = recipes.load_tokenizer(read_verified(root, _entry(manifest, "tokenizer.json")).decode("utf-8"), recipe)
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield recipes.prepare_text(line.rstrip("\n"), recipe, tokenizer)
        return
    files = _raw_files(path, recipe, recipes)
    if not files:
        raise SystemExit(f"{path.name} holds no {' or '.join(RAW_SUFFIXES[recipe['type']])} file for this package's recipe.")
    for name, data in files:
        yield recipes.prepare_file(name, data, recipe)


def feed_plan(manifest: dict, names: list[str]) -> dict:
    """How Kiln fed the model (kiln_feeds.py): batch-first samples unless the job said otherwise."""
    return manifest.get("feeds") or {"mode": "batch", "format": "npz", "offsets": dict.fromkeys(names, 0), "state": {}, "initial": {}}


def iter_calls(run, source: str, manifest: dict, names: list[str], root: Path = HERE):
    """`(step, feeds, outputs)` of every call, sequences call by call with state carried as Kiln did."""
    feeds = load_helper(root, manifest, "kiln_feeds")
    plan = feed_plan(manifest, names)
    state_inputs = set((plan.get("state") or {}).values())
    for row in iter_rows(source, manifest, [name for name in names if name not in state_inputs], root):
        yield from feeds.run_calls(run, feeds.sample_calls(row, plan), plan)


def save_outputs(run, source: str, manifest: dict, names: list[str], output: str, root: Path = HERE) -> int:
    """Run every sample and write the outputs by name, laid out as Kiln's FP32 reference."""
    by_calls = load_helper(root, manifest, "kiln_feeds").needs_calls(feed_plan(manifest, names))
    collected: dict[str, list] = {}
    for _, _, outputs in iter_calls(run, source, manifest, names, root):
        for name, value in outputs.items():
            value = np.asarray(value)
            # Batch-first: one sample's rows (its batch of one); by calls: the exact tensor of each call.
            collected.setdefault(name, []).append(value if by_calls or (value.ndim and value.shape[0] == 1) else value[None])
    np.savez(output, **{name: np.stack(parts) if by_calls else np.concatenate(parts) for name, parts in collected.items()})
    return len(next(iter(collected.values()), []))


UNPINNED_WARNING = ("WARNING: no --public-key given, so run.py trusts the key inside this package (signing-key.pem). That proves\n"
                    "the files match each other, not that your Kiln server made them: anyone can re-sign a package with their own key.\n"
                    "Pin your server's key:  kiln packages signing-key > kiln.pem  and  python run.py ... --public-key kiln.pem\n"
                    "(or check the package with `kiln packages verify`, which pins it for you).")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="?", help=".npz of input arrays (first axis = samples), or raw input the package's recipe "
                        "reads: an image, a WAV, a .txt of lines, or a folder or .zip of them")
    parser.add_argument("--random", action="store_true", help="a smoke test on random inputs shaped by the model's signature")
    parser.add_argument("--save-outputs", help="run every sample and write the outputs, by output name, to this .npz")
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--public-key", help="PEM of the server's signing key to trust (default: the one in the package)")
    parser.add_argument("--key", default=os.environ.get("KILN_PACKAGE_KEY"), help="base64 key of an encrypted package")
    parser.add_argument("--backend", choices=["onnxruntime", "openvino", "litert"], help="default: the backend Kiln measured")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    if not args.public_key:
        print(UNPINNED_WARNING, file=sys.stderr)
    try:
        manifest = verify(HERE, Path(args.public_key).read_bytes() if args.public_key else None)
    except (VerificationFailed, OSError, ValueError, KeyError) as exc:
        print(f"package verification failed: {exc}", file=sys.stderr)
        return 2
    pinned = "the pinned key" if args.public_key else "the package's own key (not pinned)"
    print(f"verified: {len(manifest['files'])} files signed by {pinned}, fingerprint {manifest['signing_key_fingerprint']}")
    if args.verify_only:
        return 0
    if args.random == bool(args.inputs):
        parser.error("give the inputs (an .npz, an image, a WAV, a .txt, a folder or .zip of them) or --random, one of them")
    try:
        return _run(args, manifest)
    except VerificationFailed as exc:
        print(f"package verification failed: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # the recipe's RecipeError and numpy's complaints about an input: a message, not a traceback
        print(f"run.py: {exc}", file=sys.stderr)
        return 1


def _run(args, manifest: dict) -> int:
    source = RANDOM if args.random else args.inputs
    key = base64.b64decode(args.key) if args.key else None
    names, run = load(HERE, manifest, key, args.backend or manifest["backend"])
    output_names = [output["name"] for output in manifest["signature"]["outputs"]]
    by_name = lambda feeds: _ordered(run(feeds), output_names)  # noqa: E731
    if args.save_outputs:
        count = save_outputs(by_name, source, manifest, names, args.save_outputs)
        print(f"outputs of {count} calls written to {args.save_outputs}")
        return 0
    _, feeds, _ = next(iter_calls(by_name, source, manifest, names))
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
