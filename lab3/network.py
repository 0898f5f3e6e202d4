"""Lab 3's trained networks as files: where they live, how they are made, and how they are loaded.

Importing this module does not import torch (task specs import it cheaply); the functions that need
torch import it themselves. The nn.Module classes live in lab3.train and are reachable here as
lab3.network.MLP and lab3.network.CNN (imported on first use).

Files, in lab3/models/ (or $LAB3_MODELS_DIR), safetensors with metadata (arch, dataset, data, accuracy):
    mlp.safetensors      fc1.weight (1000, 784)  fc1.bias (1000,)  fc2.weight (10, 1000)  fc2.bias (10,)
    cnn.safetensors      conv1.weight (16, 1, 5, 5)  conv1.bias (16,)  conv2.weight (32, 16, 5, 5)  conv2.bias (32,)
                         fc1.weight (1000, 1568)  fc1.bias (1000,)  fc2.weight (10, 1000)  fc2.bias (10,)
    testset.safetensors  x (N, 1, 28, 28) float32 normalized   y (N,) int64
Weights are float32 in torch's nn.Linear layout (out, in): y = x @ Wᵀ + b.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

PathLike = str | os.PathLike

PIXELS, HIDDEN, CLASSES = 28 * 28, 1000, 10
CONV1, CONV2 = 16, 32
FEATURES = CONV2 * 7 * 7  # two 2x2 pools: 28 -> 14 -> 7
FIX = "make train-lab3"
DEFAULT_DIR = Path(__file__).resolve().parent / "models"
ARCHS = ("mlp", "cnn")

# file -> key -> (shape, dtype); None in a shape is the test set's N, the same for x and y
SCHEMA: dict[str, dict[str, tuple[tuple[int | None, ...], str]]] = {
    "mlp": {
        "fc1.weight": ((HIDDEN, PIXELS), "float32"),
        "fc1.bias": ((HIDDEN,), "float32"),
        "fc2.weight": ((CLASSES, HIDDEN), "float32"),
        "fc2.bias": ((CLASSES,), "float32"),
    },
    "cnn": {
        "conv1.weight": ((CONV1, 1, 5, 5), "float32"),
        "conv1.bias": ((CONV1,), "float32"),
        "conv2.weight": ((CONV2, CONV1, 5, 5), "float32"),
        "conv2.bias": ((CONV2,), "float32"),
        "fc1.weight": ((HIDDEN, FEATURES), "float32"),
        "fc1.bias": ((HIDDEN,), "float32"),
        "fc2.weight": ((CLASSES, HIDDEN), "float32"),
        "fc2.bias": ((CLASSES,), "float32"),
    },
    "testset": {
        "x": ((None, 1, 28, 28), "float32"),
        "y": ((None,), "int64"),
    },
}


class WeightsError(ValueError):
    """A weights or test-set file that is missing, not safetensors, or not the shapes and dtypes lab 3 expects."""


def __getattr__(name: str) -> Any:
    if name in ("MLP", "CNN"):  # the nn.Module classes, without importing torch at this module's import
        from lab3 import train

        return getattr(train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def models_dir(directory: PathLike | None = None) -> Path:
    return Path(directory or os.environ.get("LAB3_MODELS_DIR") or DEFAULT_DIR)


def weights_path(arch: str, directory: PathLike | None = None) -> Path:
    """lab3/models/<arch>.safetensors for arch in mlp, cnn, testset."""
    if arch not in SCHEMA:
        raise ValueError(f"unknown arch {arch!r}: one of {', '.join(SCHEMA)}")
    return models_dir(directory) / f"{arch}.safetensors"


# --- loading ----------------------------------------------------------------------------------------


def load_mlp(directory: PathLike | None = None) -> dict[str, torch.Tensor]:
    return _load("mlp", directory)


def load_cnn(directory: PathLike | None = None) -> dict[str, torch.Tensor]:
    return _load("cnn", directory)


def load_testset(directory: PathLike | None = None) -> dict[str, torch.Tensor]:
    return _load("testset", directory)


def metadata(arch: str, directory: PathLike | None = None) -> dict[str, str]:
    """The file's header metadata (arch, dataset, data, accuracy), checked like a load."""
    path = weights_path(arch, directory)
    _load(arch, directory)
    return _header(path).get("__metadata__", {})


def _fail(path: Path, problem: str) -> WeightsError:
    return WeightsError(f"{path}: {problem}. Fix: run `{FIX}` (it rewrites lab3/models/).")


# safetensors' dtype codes, as torch names them, and their sizes in bytes
_DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
           "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
           "BOOL": ("bool", 1)}  # fmt: skip


def _header(path: Path) -> dict[str, Any]:
    return _layout(path)[0]


def _layout(path: Path) -> tuple[dict[str, Any], int]:
    """The file's JSON header and how many bytes of tensor data follow it."""
    # safetensors: an 8-byte little-endian header length, a JSON header, then the tensor bytes
    with path.open("rb") as f:
        size_bytes = f.read(8)
        if len(size_bytes) < 8:
            raise _fail(path, "truncated or not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", size_bytes)
        if size > 100_000_000:
            raise _fail(path, "not a safetensors file (its header length is implausible)")
        raw = f.read(size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if len(raw) < size or not isinstance(header, dict):
        raise _fail(path, "truncated or not a safetensors file (its JSON header does not parse)")
    return header, path.stat().st_size - 8 - size


def _check(arch: str, directory: PathLike | None) -> Path:
    """The file of `arch`, checked from its header alone (keys, dtypes, shapes, each tensor's bytes
    present): what a load would find wrong, without importing torch. The grading process asks this
    before every lab 3 task (ensure_trained), where importing torch would cost seconds of each run."""
    path = weights_path(arch, directory)
    if not path.is_file():
        raise _fail(path, "missing")
    header, data_bytes = _layout(path)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    schema = SCHEMA[arch]
    missing = [k for k in schema if k not in tensors]
    if missing:
        raise _fail(path, f"missing key {', '.join(missing)} (found {', '.join(sorted(tensors)) or 'none'})")
    extra = sorted(set(tensors) - set(schema))
    if extra:
        raise _fail(path, f"unexpected key {', '.join(extra)}: not a lab 3 {arch} file")
    n = None
    for key, (shape, dtype) in schema.items():
        info = tensors[key]
        found = info.get("shape") if isinstance(info, dict) else None
        code = info.get("dtype") if isinstance(info, dict) else None
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(found, list) and isinstance(offsets, list) and len(offsets) == 2):
            raise _fail(path, f"truncated or not a safetensors file ({key} has no shape or data offsets)")
        found_dtype, itemsize = _DTYPES.get(str(code), (str(code).lower(), 0))
        if found_dtype != dtype:
            raise _fail(path, f"{key} has dtype {found_dtype}, expected {dtype}")
        expected = tuple(n if s is None else s for s in shape)
        if shape[0] is None and n is None:
            n = found[0] if found else None
            expected = (n, *shape[1:])
        if tuple(found) != expected:
            show = tuple("N" if s is None else s for s in expected)
            raise _fail(path, f"{key} has shape {tuple(found)}, expected {show}")
        begin, end = offsets
        if end - begin != math.prod(found) * itemsize or end > data_bytes:
            raise _fail(
                path, f"truncated or not a safetensors file ({key} needs bytes {begin}..{end}, {data_bytes} are there)"
            )
    return path


def _load(arch: str, directory: PathLike | None) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = _check(arch, directory)  # a clear message for the common damage before safetensors' own
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise _fail(path, f"truncated or not a safetensors file ({err})") from err


# --- writing and training -----------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """Write atomically: a temporary file in the same folder, then a rename, so readers never see half a file."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(path.parent.stat().st_mode | 0o755)  # listable by nobody too (the sandbox's user)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        # readable by every user whatever the umask: a submission graded in the sandbox runs as nobody
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _usable(arch: str, directory: PathLike | None) -> bool:
    try:
        _check(arch, directory)
    except WeightsError:
        return False
    return True


def ensure_trained(directory: PathLike | None = None) -> None:
    """Train whatever of mlp, cnn and the test set is missing or unreadable, once across processes.

    A file lock in the models folder makes a second grading process wait for the first one's files
    instead of training too. Missing files are made on the data set the existing ones record (so the
    test set and both networks always agree), else on lab3.mnist.load()'s choice. Raises RuntimeError
    if a freshly trained network misses its stated accuracy."""
    folder = models_dir(directory)
    if all(_usable(a, folder) for a in SCHEMA):
        return
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".train.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        todo = [a for a in SCHEMA if not _usable(a, folder)]
        if not todo:
            return  # another process trained while we waited
        from lab3 import mnist, train

        kinds = {_header(weights_path(a, folder)).get("__metadata__", {}).get("data") for a in SCHEMA if a not in todo}
        kinds.discard(None)
        data = mnist.load(next(iter(kinds)) if len(kinds) == 1 else "auto")  # LAB3_DATA still wins
        if kinds != {data.kind}:  # none left, files from two sets, or LAB3_DATA chose another: redo all
            todo = list(SCHEMA)
        for arch in ARCHS:
            if arch in todo:
                result = train.train(arch, data)
                need = train.THRESHOLDS[(data.kind, arch)]
                if result.accuracy < need:
                    raise RuntimeError(f"{arch} reached {result.accuracy:.2%} on {data.name}, below {need:.1%}")
                train.save(result, data, folder)
        if "testset" in todo:
            train.save_testset(data, folder)


# --- accuracy -----------------------------------------------------------------------------------------


def accuracy(logits_or_predictions: Any, labels: Any) -> float:
    """The fraction of the N labels predicted right: logits (N, 10) or class indices (N,) against labels (N,).

    The predictions must cover exactly the N test images: an array padded to a whole number of batches
    (more rows than labels) is refused, never counted."""
    pred, y = _numpy(logits_or_predictions), _numpy(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be (N,), got shape {y.shape}")
    if pred.ndim == 2:
        if pred.shape[1] != CLASSES:
            raise ValueError(f"logits must be (N, {CLASSES}), got shape {pred.shape}")
        pred = pred.argmax(axis=1)
    if pred.shape != y.shape:
        raise ValueError(
            f"predictions cover {pred.shape[0] if pred.ndim else 0} items, labels {y.shape[0]}: accuracy is over"
            " exactly the N test images (no padding slots from a last partial batch)"
        )
    if y.size == 0:
        raise ValueError("no labels: accuracy over an empty set is undefined")
    return float((pred.astype(np.int64) == y.astype(np.int64)).mean())


def _numpy(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor, on any device
        a = a.detach().cpu().numpy()
    return np.asarray(a)
