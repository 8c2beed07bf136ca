"""Parsing and checking of what a job asks for: precisions, tolerance, declared metrics, targets.

The rules themselves live in `kiln_contract.contract`; this module turns their complaints into 400s.
"""
from __future__ import annotations

from kiln.core.errors import KilnError
from kiln.core.fields import MAX_ID
from kiln_contract import contract
from workers.quantize import variants

PRECISIONS = contract.PRECISIONS
AUTO = contract.AUTO
BF16 = contract.BF16


def parse_precisions(raw) -> list[str]:
    if raw in (None, "", []):
        return [AUTO]
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise KilnError("precisions must be a list of names.", code="invalid_precisions")
    unknown = [p for p in raw if p not in PRECISIONS and p != AUTO]
    if unknown:
        raise KilnError(
            f"Unknown precision {', '.join(map(repr, unknown))}; use {', '.join(PRECISIONS)} or auto.",
            code="invalid_precisions",
        )
    if AUTO in raw and len(raw) > 1:
        raise KilnError("auto cannot be combined with explicit precisions.", code="invalid_precisions")
    return list(dict.fromkeys(raw))


def resolve_precisions(requested: list[str], *, has_calibration: bool) -> list[str]:
    """Expand `auto` into the candidates the host builds: every precision a build makes, static INT8 only with calibration."""
    if requested != [AUTO]:
        return requested
    return [precision for precision in variants.PRECISIONS if precision != "int8" or has_calibration]


DEFAULT_BUDGET_MINUTES = 10
MAX_BUDGET_MINUTES = 24 * 60


def parse_budget_minutes(raw) -> int:
    """The `auto` search's time budget in whole minutes (default 10, at most a day)."""
    if raw in (None, ""):
        return DEFAULT_BUDGET_MINUTES
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise KilnError("budget_minutes must be a number of minutes.", code="invalid_budget")
    try:
        value = float(raw)
    except ValueError:
        raise KilnError(f"budget_minutes must be a number of minutes, got {str(raw)[:20]!r}.", code="invalid_budget") from None
    if not 1 <= value <= MAX_BUDGET_MINUTES or value != value:
        raise KilnError(f"budget_minutes must be between 1 and {MAX_BUDGET_MINUTES}.", code="invalid_budget")
    return int(round(value))


def parse_tolerance(raw) -> dict:
    try:
        return contract.parse_tolerance(raw)
    except contract.InvalidSpec as exc:
        raise KilnError(str(exc), code=exc.code) from None


def parse_metrics(raw, *, outputs: list[str]) -> list[dict]:
    """Declared metrics per output (`[{"output", "kind", "threshold", "primary"}]`), checked against the model's outputs."""
    try:
        return contract.parse_declared_metrics(raw, outputs=outputs)
    except contract.InvalidSpec as exc:
        raise KilnError(str(exc), code=exc.code) from None


def _agent_id(raw: int | str) -> int:
    text = str(raw)
    # Digits beyond a 64-bit key are no agent of ours (and int() of 5,000 digits raises).
    if len(text) > len(str(MAX_ID)) or not 1 <= int(text) <= MAX_ID:
        shown = text if len(text) <= 24 else f"{text[:24]}…"
        raise KilnError(f"Unknown agent id {shown}.", code="invalid_targets")
    return int(text)


def parse_targets(raw) -> list:
    """Targets are agent ids or `label=value` strings; empty means every online agent."""
    if raw in (None, ""):
        return []
    if not isinstance(raw, list):
        raise KilnError('targets must be a list of agent ids or "label=value" strings.', code="invalid_targets")
    parsed = []
    for item in raw:
        if (isinstance(item, int) and not isinstance(item, bool)) or (isinstance(item, str) and item.isascii() and item.isdigit()):
            parsed.append(_agent_id(item))
        elif isinstance(item, str) and "=" in item.removeprefix("label="):
            key, _, value = item.removeprefix("label=").partition("=")
            if not key or not value:
                raise KilnError(f"Bad target {item!r}: write label=value.", code="invalid_targets")
            parsed.append(f"{key}={value}")
        else:
            raise KilnError(f"Bad target {item!r}: use an agent id or label=value.", code="invalid_targets")
    return parsed


PACKAGE_TEXT_LIMIT = 4000


def parse_package(raw) -> dict:
    """Package options: `encrypt` (bool) and the pre/post-processing the package declares (objects)."""
    if raw in (None, {}):
        return {"encrypt": False}
    if not isinstance(raw, dict):
        raise KilnError('package must be an object like {"encrypt": true}.', code="invalid_package")
    unknown = sorted(set(raw) - {"encrypt", "preprocessing", "postprocessing"})
    if unknown:
        raise KilnError(f"Unknown package option(s): {', '.join(unknown)}.", code="invalid_package")
    if not isinstance(raw.get("encrypt", False), bool):
        raise KilnError("package.encrypt must be true or false.", code="invalid_package")
    parsed = {"encrypt": raw.get("encrypt", False)}
    for key in ("preprocessing", "postprocessing"):
        if key in raw:
            import json

            if not isinstance(raw[key], dict) or len(json.dumps(raw[key])) > PACKAGE_TEXT_LIMIT:
                raise KilnError(f"package.{key} must be an object of at most {PACKAGE_TEXT_LIMIT} characters as JSON.", code="invalid_package")
            parsed[key] = raw[key]
    return parsed


def host_toolchain() -> dict:
    """Versions of the host-side toolchain that converts and quantizes (installed distributions)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("kiln", "onnx", "onnxruntime", "onnxslim", "nncf", "openvino"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            continue
    return versions


MAX_STATE_ENTRIES = 32
MAX_CALIBRATION_SAMPLES = 100_000


def parse_state(state, initial_state) -> tuple[dict[str, str], dict]:
    """`state` maps an output to the input it feeds on the next call; `initial_state` gives inputs' first values."""
    state = state or {}
    initial_state = initial_state or {}
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in state.items()):
        raise KilnError('state must map output names to input names, e.g. {"stateN": "state"}.', code="invalid_state")
    if not isinstance(initial_state, dict) or not all(isinstance(k, str) for k in initial_state):
        raise KilnError('initial_state must map input names to a number or a nested list, e.g. {"state": 0}.', code="invalid_state")
    if len(state) > MAX_STATE_ENTRIES or len(initial_state) > MAX_STATE_ENTRIES:
        raise KilnError(f"At most {MAX_STATE_ENTRIES} state entries.", code="invalid_state")
    return dict(state), dict(initial_state)


def parse_calibration_subset(raw, *, available: int | None) -> dict | None:
    """`{"count": N, "seed": S, "stratify": bool}`: which calibration samples to use (None = all)."""
    if raw in (None, {}, ""):
        return None
    if not isinstance(raw, dict) or set(raw) - {"count", "seed", "stratify"}:
        raise KilnError('calibration_subset is {"count": N, "seed": S, "stratify": true|false}.', code="invalid_calibration_subset")
    count, seed = raw.get("count"), raw.get("seed", 0)
    if type(count) is not int or not 1 <= count <= MAX_CALIBRATION_SAMPLES:
        raise KilnError(f"calibration_subset.count must be a whole number from 1 to {MAX_CALIBRATION_SAMPLES}.", code="invalid_calibration_subset")
    if type(seed) is not int or not 0 <= seed < 2**32:
        raise KilnError("calibration_subset.seed must be a whole number from 0 to 2**32 - 1.", code="invalid_calibration_subset")
    if available is None:
        raise KilnError("calibration_subset needs a calibration dataset.", code="invalid_calibration_subset")
    if count > available:
        raise KilnError(f"calibration_subset.count is {count} but the calibration dataset has {available} samples.", code="invalid_calibration_subset")
    return {"count": count, "seed": seed, "stratify": bool(raw.get("stratify", True))}
