"""`python -m grader doctor`: what this machine has for the course, one ✓/✗ row each with its fix.

The table used to be bash in setup.sh; it lives here so that it reuses the grader's own detection
(toolchain.find_nvcc, toolchain.gpus, the header wheels, find_sanitizer, find_ncu) and cannot
drift from what the grader actually does. setup.sh only makes .venv and then runs this.

The facts are gathered first (`gather`), then turned into rows by pure functions (`rows`), so
the tests can feed any machine they like without one. torch is never imported here: its import
takes seconds and can crash a broken install, so it is probed, with every other package, in a
child interpreter (`probe_main`) that reports one JSON line per package as it goes.

Exit status: 0 when the course can run here (Python >= 3.10, torch, numpy and pytest importable,
nvcc 12 or newer), GPU or not; 1 otherwise. `--need python` narrows that to the Python
environment, which is what setup.sh's own exit status means.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from grader import paths, toolchain
from grader.build import packages

REQUIREMENTS = paths.ROOT / "requirements.txt"
ESSENTIAL = ("torch", "numpy", "pytest")  # without these nothing runs: their ✗ makes the doctor fail
MIN_PYTHON = (3, 10)
MIN_NVCC_MAJOR = 12
MIN_CC = (7, 0)
# Which imports prove that a requirement is usable (the jupyter metapackage has no module of its own).
MODULES: dict[str, tuple[str, ...]] = {
    "jupyter": ("jupyter_core", "notebook"),
    "pyyaml": ("yaml",),
    "pytest-xdist": ("xdist",),
    "cuda-bindings": ("cuda.bindings",),
    "cuda-core": ("cuda.core",),
    "scikit-learn": ("sklearn",),
}
MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model", ".json")

State = Literal["ok", "fail", "absent"]
MARKS: dict[str, str] = {"ok": "✓", "fail": "✗", "absent": "–"}
Need = Literal["course", "python"]


@dataclass
class Row:
    """One line of the table. `blocks` names what a ✗ here stops: "python" (the environment is
    unusable), "course" (kernels cannot be built), or "" (only some labs or tools need it)."""

    label: str
    state: State
    detail: str
    fix: str = ""
    blocks: str = ""


# --------------------------------------------------------------------------- requirements


@dataclass(frozen=True)
class Requirement:
    spec: str  # as written in requirements.txt, e.g. "torch>=2.4"
    name: str
    minimum: str | None = None  # ">=": checked, as "<" is; other operators are passed to pip as they are
    below: str | None = None  # "<": a release known to break the course (requirements.txt says which)

    @property
    def modules(self) -> tuple[str, ...]:
        return MODULES.get(self.name.lower(), (self.name.replace("-", "_").lower(),))


def parse_requirement(line: str) -> Requirement | None:
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(?:>=\s*([0-9][0-9.]*))?", text)
    if not m:
        return None
    below = re.search(r"<\s*([0-9][0-9.]*)", text)
    return Requirement(text.replace(" ", ""), m.group(1), m.group(2), below.group(1) if below else None)


def requirements(path: Path | None = None) -> list[Requirement] | None:
    """The course's packages from requirements.txt, the one list setup.sh and pyproject.toml use;
    None when the file is missing."""
    try:
        lines = (path or REQUIREMENTS).read_text().splitlines()
    except OSError:
        return None
    return [r for r in map(parse_requirement, lines) if r is not None]


def vtuple(version: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0): enough to compare against a minimum without `packaging`."""
    out: list[int] = []
    for part in re.split(r"[.+]", version):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def missing_requirements(reqs: Sequence[Requirement]) -> list[str]:
    """The specs pip should install: absent or older than their minimum. Fast (nothing is
    imported), so setup.sh can ask on every run; a package that is present but broken is left to
    the table, which imports it for real."""
    missing = []
    for req in reqs:
        try:
            version: str | None = md.version(req.name)
        except md.PackageNotFoundError:
            version = None
        if version is None and not all(_findable(mod) for mod in req.modules):
            missing.append(req.spec)
        elif version and req.minimum and vtuple(version) < vtuple(req.minimum):
            missing.append(req.spec)
        elif version and req.below and vtuple(version) >= vtuple(req.below):
            missing.append(req.spec)
    return missing


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --------------------------------------------------------------------------- the package probe


@dataclass
class PackageState:
    name: str
    status: str  # ok | missing | old | broken | crashed
    version: str = ""
    origin: str = ""  # where it was imported from, when that is outside this interpreter's prefix
    error: str = ""


@dataclass
class TorchState:
    cuda: str | None  # torch.version.cuda; None for a CPU-only build
    available: bool = False
    device: str = ""
    error: str = ""


def _emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def probe_main(specs: Sequence[str]) -> None:
    """Runs in the child interpreter: imports each requirement, then asks torch about CUDA, one
    JSON line each, flushed, so a crash part-way still tells which package it was in."""
    for spec in specs:
        req = parse_requirement(spec)
        if req is not None:
            _emit({"kind": "package", **asdict(_probe_package(req))})
    try:
        import torch

        available = bool(torch.cuda.is_available())
        state = TorchState(torch.version.cuda, available, torch.cuda.get_device_name(0) if available else "")
    except Exception as e:  # a broken CUDA install raises anything
        state = TorchState(None, error=f"{type(e).__name__}: {e}"[:160])
    _emit({"kind": "torch", **asdict(state)})


def _probe_package(req: Requirement) -> PackageState:
    try:
        imported = [importlib.import_module(mod) for mod in req.modules]  # all of them must import
        first = imported[0]
    except ModuleNotFoundError as e:
        return PackageState(req.name, "missing", error=str(e))
    except Exception as e:  # an install that imports but fails raises anything
        return PackageState(req.name, "broken", error=f"{type(e).__name__}: {e}"[:160])
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        version = str(getattr(first, "__version__", "?"))
    where = os.path.dirname(os.path.dirname(os.path.abspath(getattr(first, "__file__", None) or "")))
    origin = "" if where.startswith(sys.prefix) else where
    status = (
        "old"
        if req.minimum and vtuple(version) < vtuple(req.minimum)
        else "new"
        if req.below and vtuple(version) >= vtuple(req.below)
        else "ok"
    )
    return PackageState(req.name, status, version, origin)


def probe_packages(
    reqs: Sequence[Requirement], timeout: float = 300.0
) -> tuple[dict[str, PackageState], TorchState | None]:
    """Every requirement imported in a child interpreter, and torch's view of CUDA. A package
    whose import killed the child is reported as `crashed`."""
    code = "import sys; from grader.instructor.doctor import probe_main; probe_main(sys.argv[1:])"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, *(r.spec for r in reqs)],
            cwd=paths.ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        ).stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    found: dict[str, PackageState] = {}
    torch_state: TorchState | None = None
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        kind = record.pop("kind", "")
        if kind == "package":
            found[record["name"]] = PackageState(**record)
        elif kind == "torch":
            torch_state = TorchState(**record)
    for req in reqs:
        found.setdefault(req.name, PackageState(req.name, "crashed"))
    return found, torch_state


# --------------------------------------------------------------------------- the other probes


@dataclass
class Tool:
    path: str
    version: str = ""


def tool_version(exe: str) -> str:
    """The version a CUDA tool prints (`Version 2025.3.0.0`, `release 13.0`), or ''."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"(?:[Vv]ersion|release)\s+v?(\d[\w.\-]*)", out.stdout + out.stderr)
    return m.group(1).rstrip(".,") if m else ""


def driver_cuda_version() -> str | None:
    """The newest CUDA the driver supports, from nvidia-smi's banner (`CUDA Version: 13.0`)."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"CUDA Version:\s*([0-9.]+)", out)
    return m.group(1) if m else None


def counters_admin_only() -> bool:
    """True when the driver lets only root read the performance counters ncu needs."""
    try:
        text = Path("/proc/driver/nvidia/params").read_text()
    except OSError:
        return False
    return bool(re.search(r"RmProfilingAdminOnly:\s*1", text)) and os.geteuid() != 0


def models_dir() -> Path:
    return paths.ROOT / "lab5" / "models"


def model_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in MODEL_SUFFIXES)


def header_facts() -> tuple[dict[str, str], dict[str, str]]:
    """Per header wheel: its include folder (or "!" and the grader's own error), and its version."""
    found: dict[str, str] = {}
    versions: dict[str, str] = {}
    for dist in packages.HEADER_PACKAGES:
        try:
            found[dist] = str(packages.header_dir(dist))
            versions[dist] = md.version(dist)
        except toolchain.ToolchainError as e:
            found[dist] = "!" + str(e)
    return found, versions


@dataclass
class Facts:
    """Everything the rows are made from, gathered once."""

    python: tuple[int, int, int]
    executable: str
    in_venv: bool
    reqs: list[Requirement] | None
    packages: dict[str, PackageState]
    torch: TorchState | None
    nvcc: str | None
    nvcc_error: str = ""
    nvcc_version: str = ""
    nvcc_on_path: bool = True
    nvcc_arches: frozenset[str] = frozenset()
    gpus: tuple[toolchain.Gpu, ...] = ()
    driver_cuda: str | None = None
    grader_arch: str = ""  # GRADER_ARCH as normalised, or its error
    headers: dict[str, str] = field(default_factory=dict)  # dist -> include folder, or "!" + error
    header_versions: dict[str, str] = field(default_factory=dict)
    sanitizer: Tool | None = None
    ncu: Tool | None = None
    nsys: Tool | None = None
    admin_only_counters: bool = False
    models: Path = field(default_factory=models_dir)
    model_files: list[Path] = field(default_factory=list)


def gather() -> Facts:
    """Asks this machine: the interpreter, the packages (in a child), nvcc, the GPUs and tools."""
    from grader.instructor.profile import find_ncu, find_nsys
    from grader.parent.sanitizer import find_sanitizer

    reqs = requirements()
    probe_reqs = reqs if reqs is not None else [Requirement(n, n) for n in ESSENTIAL]
    pkgs, torch_state = probe_packages(probe_reqs)
    if "torch" in pkgs and pkgs["torch"].status not in ("ok", "old"):
        torch_state = None  # its own row already says why; "torch.cuda raised ImportError" would only repeat it
    venv = paths.ROOT / ".venv"
    facts = Facts(
        python=(sys.version_info.major, sys.version_info.minor, sys.version_info.micro),
        executable=sys.executable,
        in_venv=not venv.exists() or Path(sys.prefix).resolve() == venv.resolve(),
        reqs=reqs,
        packages=pkgs,
        torch=torch_state,
        nvcc=None,
    )
    try:
        nvcc = toolchain.find_nvcc()
        facts.nvcc = str(nvcc)
        facts.nvcc_version = toolchain.nvcc_version()
        on_path = shutil.which("nvcc")
        facts.nvcc_on_path = on_path is not None and Path(on_path).resolve() == nvcc.resolve()
        facts.nvcc_arches = toolchain.nvcc_arches()
    except toolchain.ToolchainError as e:
        facts.nvcc_error = str(e)
    facts.gpus = toolchain.gpus()
    if facts.gpus:
        facts.driver_cuda = driver_cuda_version()
    if os.environ.get("GRADER_ARCH"):
        try:
            facts.grader_arch = toolchain.normalize_arch(os.environ["GRADER_ARCH"])
        except toolchain.ToolchainError as e:
            facts.grader_arch = "!" + str(e)
    facts.headers, facts.header_versions = header_facts()
    for attr, finder in (("sanitizer", find_sanitizer), ("ncu", find_ncu), ("nsys", find_nsys)):
        exe = finder()
        if exe:
            setattr(facts, attr, Tool(exe, tool_version(exe)))
    facts.admin_only_counters = facts.ncu is not None and facts.gpus != () and counters_admin_only()
    facts.model_files = model_files(facts.models)
    return facts


# --------------------------------------------------------------------------- facts -> rows


def package_fix(name: str, spec: str) -> str:
    why = {
        "nbformat": " (needs network; only the notebooks need it)",
        "jupyter": " (needs network; only the notebooks need it)",
        "ruff": " (needs network; only make lint needs it)",
        "torch": (
            " (needs network), or reuse a Python that has torch: rm -rf .venv && PYTHON=/path/to/python3 ./setup.sh"
        ),
    }.get(name, " (needs network)")
    return f".venv/bin/python -m pip install '{spec}'{why}"


def python_rows(f: Facts) -> list[Row]:
    version = ".".join(map(str, f.python))
    where = f.executable + ("" if f.in_venv else "  (not the course's .venv: run .venv/bin/python -m grader doctor)")
    rows = []
    if f.python[:2] >= MIN_PYTHON:
        rows.append(Row("Python", "ok", f"{version}  {where}"))
    else:
        rows.append(
            Row(
                "Python",
                "fail",
                f"{version}  {where} (the course needs >= {'.'.join(map(str, MIN_PYTHON))})",
                "rm -rf .venv && PYTHON=python3.11 ./setup.sh (any Python >= 3.10)",
                "python",
            )
        )
    if f.reqs is None:
        rows.append(
            Row("requirements", "fail", f"{paths.rel(REQUIREMENTS)} is missing", "git checkout requirements.txt")
        )
    for req in f.reqs if f.reqs is not None else [Requirement(n, n) for n in ESSENTIAL]:
        p = f.packages.get(req.name, PackageState(req.name, "crashed"))
        blocks = "python" if req.name in ESSENTIAL else ""
        if p.status == "ok":
            rows.append(Row(req.name, "ok", p.version + (f"  (from {p.origin})" if p.origin else "")))
            continue
        what = {
            "missing": "not installed",
            "old": f"{p.version} is too old (need {req.spec})",
            "new": f"{p.version} is a release the course cannot use (need {req.spec}: requirements.txt says why)",
            "broken": f"installed but its import fails: {p.error}",
            "crashed": "importing it crashed the interpreter",
        }.get(p.status, p.status)
        rows.append(Row(req.name, "fail", what, package_fix(req.name, req.spec), blocks))
    return rows


NVCC_FIX = "install the CUDA toolkit 12.x or 13.x and put its bin folder on PATH (or set CUDA_HOME or NVCC)"


def nvcc_row(f: Facts) -> Row:
    if f.nvcc is None:
        return Row("nvcc", "fail", "not found (PATH, $NVCC, $CUDA_HOME/bin, /usr/local/cuda/bin)", NVCC_FIX, "course")
    major = vtuple(f.nvcc_version)[:1]
    if not major:
        return Row("nvcc", "fail", f"{f.nvcc} does not run (no version)", NVCC_FIX, "course")
    if major[0] < MIN_NVCC_MAJOR:
        return Row("nvcc", "fail", f"{f.nvcc}  release {f.nvcc_version} (too old)", NVCC_FIX, "course")
    detail = f"{f.nvcc}  release {f.nvcc_version}"
    if not f.nvcc_on_path:
        detail += f"  (not on PATH: export PATH={Path(f.nvcc).parent}:$PATH)"
    return Row("nvcc", "ok", detail)


def gpu_rows(f: Facts) -> list[Row]:
    if not f.gpus:
        why = "GRADER_NO_GPU=1" if os.environ.get("GRADER_NO_GPU") == "1" else "nvidia-smi finds none"
        return [
            Row(
                "GPU",
                "fail",
                f"no NVIDIA GPU ({why}): kernels still compile and CPU checks run; GPU tests are skipped",
            ),
            Row("driver", "absent", "no NVIDIA driver in use: only needed with a GPU"),
        ]
    rows = []
    kinds: dict[tuple[str, str], int] = {}
    for g in f.gpus:
        kinds[(g.name, g.compute_capability)] = kinds.get((g.name, g.compute_capability), 0) + 1
    for (name, cc), count in kinds.items():
        arch = "sm_" + cc.replace(".", "")
        detail = f"{name}  compute capability {cc} ({arch})" + (f"  ×{count}" if count > 1 else "")
        if vtuple(cc)[:2] < MIN_CC:
            rows.append(Row("GPU", "fail", detail, "the course needs Volta or newer (compute capability 7.0+)"))
        elif f.nvcc_arches and arch not in f.nvcc_arches and not f.grader_arch:
            oldest = min(f.nvcc_arches, key=lambda a: vtuple(a.removeprefix("sm_")))
            rows.append(
                Row(
                    "GPU",
                    "fail",
                    f"{detail}: nvcc {f.nvcc_version} cannot build for {arch} (its oldest is {oldest})",
                    f"install a CUDA toolkit whose `nvcc --list-gpu-code` lists {arch}, or set NVCC to one",
                )
            )
        else:
            rows.append(Row("GPU", "ok", detail))
    if f.grader_arch.startswith("!"):
        rows.append(Row("GRADER_ARCH", "fail", f.grader_arch[1:], "unset GRADER_ARCH or give e.g. sm_90"))
    elif f.grader_arch:
        rows.append(Row("GRADER_ARCH", "ok", f"kernels are built for {f.grader_arch}, not the GPU's own"))
    driver = f.gpus[0].driver
    supports = f"  (supports CUDA up to {f.driver_cuda})" if f.driver_cuda else ""
    if not driver:
        rows.append(Row("driver", "fail", "nvidia-smi reports no driver version", "reinstall the NVIDIA driver"))
    elif f.driver_cuda and f.nvcc_version and vtuple(f.driver_cuda) < vtuple(f.nvcc_version)[:2]:
        rows.append(
            Row(
                "driver",
                "fail",
                f"{driver}{supports}: older than nvcc {f.nvcc_version}, so its kernels will not load",
                f"update the NVIDIA driver, or use a CUDA {f.driver_cuda} toolkit",
            )
        )
    else:
        rows.append(Row("driver", "ok", driver + supports))
    return rows


def torch_index(driver_cuda: str | None) -> str:
    """The PyTorch wheel index for this driver, for the fix of a CPU-only torch on a GPU machine."""
    d = vtuple(driver_cuda or "13.0")
    if d >= (13, 0):
        return "https://download.pytorch.org/whl/cu130"
    if d >= (12, 8):
        return "https://download.pytorch.org/whl/cu128"
    return "https://download.pytorch.org/whl/cu126"


def torch_rows(f: Facts) -> list[Row]:
    label = "torch CUDA"
    t = f.torch
    gpu = bool(f.gpus)
    reinstall = f".venv/bin/python -m pip install --force-reinstall torch --index-url {torch_index(f.driver_cuda)}"
    if t is None:
        first = Row(label, "fail", "not checked: torch does not import (see its row)")
    elif t.error:
        first = Row(label, "fail", f"torch.cuda raised {t.error}")
    elif t.cuda is None:
        first = (
            Row(label, "fail", "CPU-only torch build, but this machine has a GPU", reinstall)
            if gpu
            else Row(label, "absent", "CPU-only torch build (fine without a GPU: GPU tests are skipped)")
        )
    elif t.available:
        first = Row(label, "ok", f"CUDA {t.cuda}, torch.cuda.is_available() = True ({t.device})")
    elif not gpu:
        first = Row(label, "absent", f"CUDA {t.cuda} build, no GPU here: GPU tests are skipped")
    else:
        first = Row(
            label,
            "fail",
            f"CUDA {t.cuda} build, torch.cuda.is_available() = False although a GPU is present",
            f"update the driver (it supports CUDA {f.driver_cuda or '?'}) or install a matching wheel: {reinstall}",
        )
    label2 = "nvcc vs torch"
    if not f.nvcc_version or t is None or not t.cuda:
        second = Row(label2, "absent", "not compared (needs nvcc and a CUDA build of torch)")
    elif vtuple(f.nvcc_version)[:1] == vtuple(t.cuda)[:1]:
        second = Row(label2, "ok", f"same CUDA major: nvcc {f.nvcc_version}, torch CUDA {t.cuda}")
    else:
        nv, tc = vtuple(f.nvcc_version)[0], vtuple(t.cuda)[0]
        second = Row(
            label2,
            "fail",
            f"nvcc {f.nvcc_version} vs torch CUDA {t.cuda} (warning only: the grader's kernels are fine; "
            f"PyTorch C++ extensions in lab 3 need the same major)",
            f"a CUDA {tc}.x toolkit, or a torch wheel for CUDA {nv}",
        )
    return [first, second]


HEADER_LABELS = {"nvidia-cudnn-frontend": "cuDNN frontend", "nvidia-cutlass": "CUTLASS"}


def header_rows(f: Facts) -> list[Row]:
    rows = []
    for dist, found in f.headers.items():
        label = HEADER_LABELS.get(dist, dist)
        if not found.startswith("!"):
            version = f.header_versions.get(dist, "")
            rows.append(Row(label, "ok", f"{version}  headers in {paths.rel(Path(found))}".strip()))
        elif "is installed but" in found:
            rows.append(Row(label, "fail", found[1:], packages.install_hint(dist) + " (needs network)"))
        else:
            rows.append(
                Row(
                    label,
                    "fail",
                    "headers not installed (lab 3 needs them; optional until then)",
                    packages.install_hint(dist) + " (needs network)",
                )
            )
    return rows


NCU_FIX = (
    "it ships with the CUDA toolkit (its bin/ncu) and as the nsight-compute package; install it or put it on PATH "
    "(only make profile-labN needs it)"
)
NSYS_FIX = (
    "install Nsight Systems (developer.nvidia.com/nsight-systems, or the nsight-systems package of NVIDIA's CUDA "
    "repository) and put nsys on PATH (only the timeline of make profile-labN needs it)"
)
SANITIZER_FIX = "it ships with the CUDA toolkit (bin/compute-sanitizer): put the toolkit's bin folder on PATH"
COUNTERS_FIX = (
    "run make profile-labN as root, or let every user read them: "
    "echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | sudo tee /etc/modprobe.d/nvidia-profiling.conf "
    "and reboot (see https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)


def _tool_detail(tool: Tool) -> str:
    return f"{tool.path}" + (f"  {tool.version}" if tool.version else "")


def tool_rows(f: Facts) -> list[Row]:
    rows = []
    if f.sanitizer:
        rows.append(Row("compute-sanitizer", "ok", _tool_detail(f.sanitizer)))
    else:
        why = "not found: make sanitize-labN and make grade need it"
        rows.append(Row("compute-sanitizer", "fail", why, SANITIZER_FIX))
    if f.ncu is None:
        rows.append(Row("Nsight Compute", "absent", "ncu not found", NCU_FIX))
    elif f.admin_only_counters:
        rows.append(
            Row(
                "Nsight Compute",
                "fail",
                f"{_tool_detail(f.ncu)}: only root may read the GPU's counters here (RmProfilingAdminOnly=1)",
                COUNTERS_FIX,
            )
        )
    else:
        rows.append(Row("Nsight Compute", "ok", _tool_detail(f.ncu)))
    if f.nsys is None:
        rows.append(Row("Nsight Systems", "absent", "nsys not found", NSYS_FIX))
    else:
        rows.append(Row("Nsight Systems", "ok", _tool_detail(f.nsys)))
    return rows


def model_row(f: Facts) -> Row:
    where = paths.rel(f.models)
    if not f.model_files:
        return Row(
            "lab 5 models", "absent", f"no model files in {where}: fine until lab 5, the only lab that loads them"
        )
    size = sum(p.stat().st_size for p in f.model_files)
    names = ", ".join(p.name for p in f.model_files[:3]) + (", …" if len(f.model_files) > 3 else "")
    return Row("lab 5 models", "ok", f"{len(f.model_files)} files, {size / 1e9:.1f} GB in {where} ({names})")


def rows(f: Facts) -> list[Row]:
    return [
        *python_rows(f),
        nvcc_row(f),
        *gpu_rows(f),
        *torch_rows(f),
        *header_rows(f),
        *tool_rows(f),
        model_row(f),
    ]


# --------------------------------------------------------------------------- verdict and output


def blocked(table: Sequence[Row], level: str) -> list[Row]:
    return [r for r in table if r.state == "fail" and r.blocks == level]


def exit_code(table: Sequence[Row], need: Need = "course") -> int:
    """0 when what `need` names can run: the Python environment, or the course (that plus nvcc)."""
    levels = ("python",) if need == "python" else ("python", "course")
    return 1 if any(blocked(table, level) for level in levels) else 0


def verdict(table: Sequence[Row], gpu: bool) -> list[str]:
    if blocked(table, "python"):
        names = ", ".join(r.label for r in blocked(table, "python"))
        return [f"✗ The Python environment is not usable: fix the ✗ rows for {names} above."]
    if blocked(table, "course"):
        return ["✗ Python environment ready, but kernels cannot be built here: fix the nvcc row above."]
    if not gpu:
        return [
            "✓ Ready. No NVIDIA GPU here: GPU work will be skipped (kernels still compile, CPU checks run).",
        ]
    lines = ["✓ Ready. Next: make test-lab1"]
    gpu_blockers = [r.label for r in table if r.state == "fail" and r.label in ("GPU", "driver", "torch CUDA")]
    if gpu_blockers:
        lines.append(f"  GPU tasks will not run until the ✗ rows for {', '.join(gpu_blockers)} are fixed.")
    return lines


def format_table(table: Sequence[Row]) -> list[str]:
    width = max(len(r.label) for r in table)
    out = []
    for r in table:
        out.append(f"  {MARKS[r.state]} {r.label:<{width}}  {r.detail}")
        if r.fix:
            out.append(f"    {'':<{width}}  fix: {r.fix}")
    return out


def run(say: Callable[[str], None], *, as_json: bool = False, missing: bool = False, need: Need = "course") -> int:
    """The `doctor` command: the table (or JSON) and the exit status; `missing` only prints the
    requirement specs pip should install, one a line, for setup.sh."""
    if missing:
        reqs = requirements()
        if reqs is None:
            say(f"error: {paths.rel(REQUIREMENTS)} is missing")
            return 1
        for spec in missing_requirements(reqs):
            say(spec)
        return 0
    facts = gather()
    table = rows(facts)
    code = exit_code(table, need)
    if as_json:
        say(
            json.dumps(
                {
                    "root": str(paths.ROOT),
                    "platform": platform.platform(),
                    "rows": [asdict(r) for r in table],
                    "python_ready": exit_code(table, "python") == 0,
                    "ready": exit_code(table, "course") == 0,
                    "gpu": bool(facts.gpus),
                },
                indent=2,
            )
        )
        return code
    say(f"Environment ({paths.ROOT})")
    for line in format_table(table):
        say(line)
    say("")
    for line in verdict(table, bool(facts.gpus)):
        say(line)
    return code
