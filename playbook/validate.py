"""One way to check what comes from a file: read it as one JSON object, then check each field
against a range table (kind, lowest, highest, example), as ``cli.checks.LIMITS`` does for the flags.

A bad file or field is refused with one ``ValueError`` line naming the file, the field, the
constraint and a value that works; nothing reaches a constructor, a float conversion or a loop
with a value it cannot take (a 401-digit integer, a string for a bandwidth, a list for a number).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Range:
    """``kind`` "int" (not bool) or "number" (int or finite float); ``low`` inclusive unless
    ``open_low``; ``nullable``: None is allowed (the field's own meaning of "absent")."""

    kind: str
    low: float
    high: float
    example: str
    open_low: bool = False
    nullable: bool = False

    def describe(self) -> str:
        noun = "an integer" if self.kind == "int" else "a number"
        if self.open_low and self.low == 0:
            low = "greater than 0"
        elif self.kind == "int" and self.low == 1:
            noun, low = "a positive integer", ""
        else:
            low = f"at least {self.low:g}"
        high = (
            ""
            if not math.isfinite(self.high)
            else f"at most {self.high:,}"
            if self.kind == "int"
            else f"at most {self.high:g}"
        )
        return f"{noun} {' and '.join(x for x in (low, high) if x)}".strip()

    def ok(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.open_low else value >= self.low
        return above and value <= self.high


def shown(value) -> str:
    """A value as the user wrote it, cut short (a 401-digit integer is not echoed whole)."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def check_fields(where: str, values: dict, table: dict[str, Range], *, sep: str = "=") -> None:
    """Refuse the first field of ``values`` that ``table`` lists and that is out of its range."""
    for name, rule in table.items():
        if name in values and not rule.ok(values[name]):
            raise ValueError(
                f"{where}: {name} must be {rule.describe()}, got {shown(values[name])}; e.g. {name}{sep}{rule.example}"
            )


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in ``path``, or one line saying why not (unreadable, not JSON, nested too
    deep, a number Python refuses, or a JSON list/string instead of an object)."""
    try:
        text = path.read_text()
    except IsADirectoryError:
        raise ValueError(f"{what} {str(path)!r} is a folder; give the .json file in it") from None
    except OSError as e:
        raise ValueError(f"cannot read {what} {str(path)!r}: {e.strerror or e}; check its permissions") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(path)!r} is not text (UTF-8); a {what} is one JSON object") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {str(path)!r} is not JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise ValueError(f"{what} {str(path)!r} nests too deep to read; a {what} is one JSON object") from None
    except ValueError as e:  # e.g. an integer past Python's digit limit
        raise ValueError(f"{what} {str(path)!r} holds a value Python cannot read ({str(e)[:80]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{what} {str(path)!r} holds a JSON {type(raw).__name__}; a {what} is one JSON object")
    return raw


def require_keys(where: str, raw: dict, keys: list[str], kind: str) -> None:
    missing = [k for k in keys if k not in raw]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}; a {kind} needs {', '.join(keys)}")


_BIG = 10**7  # far above any published model's width or vocabulary
# ModelConfig: every field a file can set. n_layers is bounded so that a planner's loops over layers
# and stages stay short (DeepSeek-V3 has 61, Llama-3.1-405B 126).
MODEL_LIMITS = {
    "vocab_size": Range("int", 1, _BIG, "32000"),
    "hidden": Range("int", 1, 10**6, "4096"),
    "n_layers": Range("int", 1, 10_000, "32"),
    "n_heads": Range("int", 1, 10**5, "32"),
    "ffn_hidden": Range("int", 1, _BIG, "14336"),
    "max_seq_len": Range("int", 1, 10**8, "8192"),
    "n_kv_heads": Range("int", 1, 10**5, "8", nullable=True),
    "head_dim": Range("int", 1, 10**5, "128", nullable=True),
    "rope_theta": Range("number", 0, 1e15, "500000", open_low=True),
    "norm_eps": Range("number", 0, 1, "1e-5", open_low=True),
    "n_experts": Range("int", 0, 10**5, "8"),
    "top_k": Range("int", 0, 10**5, "2"),
    "expert_ffn_hidden": Range("int", 0, _BIG, "14336"),
    "n_shared_experts": Range("int", 0, 10**4, "1"),
    "n_dense_layers": Range("int", 0, 10_000, "1"),
    "q_lora_rank": Range("int", 0, 10**6, "1536"),
    "kv_lora_rank": Range("int", 0, 10**6, "512"),
    "qk_rope_head_dim": Range("int", 0, 10**5, "64"),
    "qk_nope_head_dim": Range("int", 0, 10**5, "128"),
    "v_head_dim": Range("int", 0, 10**5, "128"),
}

# Hardware: bytes, FLOP/s, bytes/s, seconds (an H100 is 8e10 B, 9.9e14 FLOP/s, 3.35e12 B/s).
HARDWARE_REQUIRED = [
    "memory_bytes",
    "peak_bf16_flops",
    "memory_bandwidth",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
]
HARDWARE_LIMITS = {
    "memory_bytes": Range("number", 0, 1e15, "80e9", open_low=True),
    "peak_bf16_flops": Range("number", 0, 1e18, "989.4e12", open_low=True),
    "memory_bandwidth": Range("number", 0, 1e15, "3.35e12", open_low=True),
    "intra_node_bandwidth": Range("number", 0, 1e15, "450e9", open_low=True),
    "inter_node_bandwidth": Range("number", 0, 1e15, "50e9", open_low=True),
    "devices_per_node": Range("int", 1, 1024, "8"),
    "intra_node_latency": Range("number", 0, 1, "3e-6"),
    "inter_node_latency": Range("number", 0, 1, "1e-5"),
    "achievable_flops_fraction": Range("number", 0, 1, "0.5", open_low=True),
    "sms": Range("int", 0, 10**5, "132"),
    "reported_memory_bytes": Range("number", 0, 1e15, "85.5e9"),  # 0: memory_bytes (Hardware.capacity_bytes)
    "peak_fp8_flops": Range("number", 0, 1e19, "1979e12", open_low=True),
    "storage_bandwidth": Range("number", 0, 1e15, "1e9", open_low=True),  # bytes/s per node: checkpoint writes
    # what `playbook calibrate` writes beside its fits (playbook.measure.calibrate)
    "cpus": Range("int", 1, 10**6, "2", nullable=True),  # os.cpu_count(): None where it cannot tell
    "ranks": Range("int", 1, 10**6, "2"),
    "threads_per_rank": Range("int", 1, 4096, "1"),
    "calibration_seconds": Range("number", 0, 1e9, "60"),
}
# A calibrated profile's nested fields: each collective's α–β fit (theory.cost.alpha_beta.Fit, its
# measured points) and each matmul measured (measure.calibrate.matmul_rates).
COLLECTIVE_FIT = {
    "alpha": Range("number", 0, 1, "2e-5"),
    "beta": Range("number", 0, 1, "1e-10"),
    "rms_rel_residual": Range("number", 0, 1e6, "0.1"),
    "group_size": Range("int", 1, 10**6, "2"),
}
COLLECTIVE_POINT = {
    "bytes": Range("number", 0, 1e15, "4096", open_low=True),
    "seconds": Range("number", 0, 1e6, "1e-4"),
    "median_seconds": Range("number", 0, 1e6, "1e-4"),
}
MATMUL_POINT = {
    "size": Range("number", 0, 1e6, "512", open_low=True),
    "flops_per_s": Range("number", 0, 1e19, "5e10", open_low=True),
    "seconds": Range("number", 0, 1e6, "1e-3"),
    "median_seconds": Range("number", 0, 1e6, "1e-3"),
}


_JSON_NAMES = {dict: "object", str: "string", bool: "true or false", type(None): "null", list: "list"}


def check_types(where: str, values: dict, types: dict) -> None:
    """Refuse a field of the wrong JSON type (``types``: name -> a type or a tuple of them)."""
    for name, kind in types.items():
        if name in values and not isinstance(values[name], kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            what = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
            raise ValueError(f"{where}: {name} must be a JSON {what}, got {shown(values[name])}")


def _each(where: str, name: str, value, kind: type, what: str) -> None:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}: {name} must be {what}, got {shown(value)}")


def check_hardware(where: str, raw: dict) -> None:
    """Every field of a hardware profile (``data/hardware/``, or what ``playbook calibrate`` wrote)
    by type and range, nested ones too, so a wrong one is one line here and never a TypeError in a
    planner's arithmetic: the numbers of :data:`HARDWARE_LIMITS`, text for ``source``, ``*_source``
    and ``date``, ``quick`` true or false, and ``collectives``, ``matmul`` and ``load_average``."""
    require_keys(where, raw, HARDWARE_REQUIRED, "hardware profile")
    check_fields(where, raw, HARDWARE_LIMITS, sep=": ")
    for name, value in raw.items():
        if name.endswith("source") or name in ("date", "name", "host"):
            _each(where, name, value, str, "text (a JSON string)")
    if "quick" in raw:
        _each(where, "quick", raw["quick"], bool, "true or false")
    _each(where, "collectives", raw.get("collectives", {}), dict, "a JSON object (collective -> its α–β fit)")
    for op, fit in raw.get("collectives", {}).items():
        name = f"collectives.{op}"
        _each(where, name, fit, dict, 'a JSON object, e.g. {"alpha": 2e-5, "beta": 1e-10}')
        require_keys(f"{where}: {name}", fit, ["alpha", "beta"], "collective's fit")
        check_fields(where, {f"{name}.{k}": v for k, v in fit.items()}, _prefixed(name, COLLECTIVE_FIT), sep=": ")
        if "bandwidth" in fit:  # 1/β: infinite when β is 0
            _each(where, f"{name}.bandwidth", fit["bandwidth"], (int, float), "a number (bytes/s)")
        if "pinned" in fit:
            _each(where, f"{name}.pinned", fit["pinned"], str, 'text ("", "alpha" or "beta")')
        _each(where, f"{name}.points", fit.get("points", []), list, "a JSON list of measured points")
        for i, point in enumerate(fit.get("points", [])):
            _points(where, f"{name}.points[{i}]", point, COLLECTIVE_POINT, ["bytes", "seconds"])
    _each(where, "matmul", raw.get("matmul", []), list, "a JSON list of measured matmuls")
    for i, point in enumerate(raw.get("matmul", [])):
        _points(where, f"matmul[{i}]", point, MATMUL_POINT, ["size", "flops_per_s"])
    load = raw.get("load_average", {})
    _each(where, "load_average", load, dict, 'a JSON object, e.g. {"before": [1.0, 1.2, 1.1]}')
    for when, values in load.items():
        _each(where, f"load_average.{when}", values, list, "a JSON list of numbers (os.getloadavg())")
        for i, x in enumerate(values):
            if not Range("number", 0, 1e6, "1.0").ok(x):
                raise ValueError(f"{where}: load_average.{when}[{i}] must be a number at least 0, got {shown(x)}")


def _prefixed(prefix: str, table: dict[str, Range]) -> dict[str, Range]:
    return {f"{prefix}.{k}": rule for k, rule in table.items()}


def _points(where: str, name: str, point, table: dict[str, Range], required: list[str]) -> None:
    _each(where, name, point, dict, f"a JSON object with {' and '.join(required)}")
    require_keys(f"{where}: {name}", point, required, "measured point")
    check_fields(where, {f"{name}.{k}": v for k, v in point.items()}, _prefixed(name, table), sep=": ")


_KERNEL_FOLDERS = ("/proc", "/sys")  # the kernel's interfaces: a file there is a setting, not a file


def check_output_path(flag: str, path: str, example: str, *, suffix: str | None = None, also=()) -> Path:
    """Refuse, in one line and before anything runs, an output path that could not be written at the
    end: empty, a folder, the wrong suffix, inside /proc or /sys, an existing FIFO or device (a
    write would block or go nowhere), a missing folder, a name longer than the file system allows,
    or a place this process cannot create a file in (tried: the file is created and, if it was not
    there before, removed again). ``also``: names of files written beside it (checked for length).
    Returns the path, ``~`` expanded."""
    if not path:
        raise ValueError(f"{flag} is empty; name a file, e.g. {flag} {example}")
    target = Path(path).expanduser()
    if suffix and target.suffix != suffix:
        raise ValueError(f"{flag} must name a {suffix} file, got {shown(path)}; e.g. {flag} {example}")
    folder = target.parent  # (a name too long for the file system makes even is_dir() raise: first)
    try:
        longest = os.pathconf(folder if folder.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        longest = 255
    for name in (target.name, *also):
        if len(os.fsencode(name)) > longest:
            raise ValueError(
                f"{flag} {shown(path)}: a file name of {len(os.fsencode(name))} bytes"
                f"{'' if name == target.name else f' ({shown(name)}, written beside it)'}, more than the "
                f"{longest} this file system allows; choose a shorter name, e.g. {flag} {example}"
            )
    if target.is_dir():
        raise ValueError(f"{flag} {shown(path)} is a folder; name a file in it, e.g. {flag} {target / example}")
    real = str(target.resolve())
    for kernel in _KERNEL_FOLDERS:
        if real == kernel or real.startswith(kernel + "/"):
            raise ValueError(
                f"{flag} {shown(path)} is inside {kernel}, the kernel's interface; e.g. {flag} /tmp/{example}"
            )
    if target.exists() and not target.is_file():
        raise ValueError(
            f"{flag} {shown(path)} is not a regular file (a pipe or a device: writing it could block or go "
            f"nowhere); e.g. {flag} /tmp/{example}"
        )
    if not folder.is_dir():
        if folder.exists():  # a file or a pipe where the folder should be: "does not exist" would be false
            raise ValueError(
                f"{flag} {shown(path)}: {shown(str(folder))} is a file, not a folder; e.g. {flag} /tmp/{example}"
            )
        raise ValueError(f"{flag} {shown(path)}: the folder {shown(str(folder))} does not exist; create it first")
    existed = target.exists()
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644))
        if not existed:
            target.unlink()
    except OSError as e:
        raise ValueError(
            f"{flag} {shown(path)} cannot be written ({e.strerror or e}); choose a writable place, "
            f"e.g. {flag} /tmp/{example}"
        ) from None
    return target


def write_output(flag: str, path, text: str) -> None:
    """Write ``text`` to ``path`` (checked by :func:`check_output_path` before the work), or one
    line saying why not: the disk filled, the folder went away."""
    import tempfile

    target = Path(path)
    if target.exists() and not target.is_file():  # a rename would replace a device or a pipe with a file
        raise ValueError(f"{flag} {shown(str(path))} is not a regular file; nothing was written there")
    fd, part = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".part")  # whole or not at all
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(part, 0o666 & ~umask)  # as open() would make it (mkstemp's file is the owner's alone)
        os.replace(part, target)
    except OSError as e:
        Path(part).unlink(missing_ok=True)
        raise ValueError(
            f"could not write {flag} {shown(str(path))} ({e.strerror or e}); nothing was written there"
        ) from None
