"""Memory and time of turning a zip of JPEGs into a dataset: Kiln's streaming build against the
usual load-everything-then-save, side by side in one process, on the same files and recipe.

The usual way decodes every image with the same recipe into a list, stacks it and saves one
`.npz`; Kiln's `build_raw_dataset` appends each prepared sample to a scratch file and assembles
the `.npz` from those. Both outputs must hold identical arrays. Peak memory is what tracemalloc
sees of Python and numpy allocations (Pillow's decoder buffers are outside it and alike on both
sides); rounds alternate the order.

    python benchmarks/raw_datasets.py [--images 200] [--side 320] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln_contract import recipes
from workers.raw_datasets import build_raw_dataset


def make_zip(path: Path, images: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(images):
            pixels = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
            archive.writestr(f"{index:05d}.jpg", buffer.getvalue())


def load_everything(raw: Path, recipe: dict, out: Path) -> None:
    """The usual script: every sample in a list, stacked, saved."""
    with zipfile.ZipFile(raw) as archive:
        members = recipes.raw_members(archive.namelist(), recipe)
        samples = [recipes.prepare_image(archive.read(member), recipe) for member in members]
    np.savez(out, **{recipe["input"]: np.stack(samples)})


def measure(action) -> tuple[float, float]:
    tracemalloc.start()
    started = time.perf_counter()
    action()
    wall = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return wall, peak / 1024**2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--side", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    recipe = recipes.parse_recipe({"type": "image", "input": "images", "size": [args.side, args.side], "layout": "NCHW"})
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        raw = root / "photos.zip"
        make_zip(raw, args.images)
        results: dict[str, list[tuple[float, float]]] = {"kiln (streaming)": [], "load everything": []}
        for round_number in range(args.rounds):
            sides = [("kiln (streaming)", lambda: build_raw_dataset(raw, recipe, root / "kiln.npz", display_name="photos.zip")),
                     ("load everything", lambda: load_everything(raw, recipe, root / "usual.npz"))]
            for name, action in sides if round_number % 2 == 0 else sides[::-1]:
                results[name].append(measure(action))
        with np.load(root / "kiln.npz") as ours, np.load(root / "usual.npz") as theirs:
            assert np.array_equal(ours["images"], theirs["images"]), "the two ways must make the same array"
    dataset_mb = args.images * 3 * args.side * args.side * 4 / 1024**2
    print(f"{args.images} JPEGs 640x480 -> {args.side}x{args.side} float32 NCHW ({dataset_mb:.0f} MB of arrays), {args.rounds} rounds")
    summary = {}
    for name, rows in results.items():
        wall = statistics.median(row[0] for row in rows)
        peak = max(row[1] for row in rows)
        summary[name] = (wall, peak)
        print(f"  {name:18s} wall {wall:6.2f} s   peak traced memory {peak:8.1f} MB")
    (kiln_wall, kiln_peak), (usual_wall, usual_peak) = summary["kiln (streaming)"], summary["load everything"]
    print(f"  ratio usual/kiln: peak memory {usual_peak / kiln_peak:.1f}x, wall time {usual_wall / kiln_wall:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
