"""`python -m grader doctor` and setup.sh: every row is there, a missing GPU is not fatal, the exit
status follows the essentials (Python, torch, numpy, pytest, nvcc), and each ✗ names its fix."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.build import packages
from grader.instructor import doctor
from grader.instructor.doctor import Facts, PackageState, Requirement, Tool, TorchState

H100 = toolchain.Gpu("NVIDIA H100 80GB HBM3", "9.0", "580.65", 81559, "1980", "2619", "1980")
ARCHES = frozenset({"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"})  # nvcc 13.0's list


def facts(**kw: object) -> Facts:
    """A CPU-only machine with every package and nvcc 13.0, no header wheels, tools or models."""
    reqs = [Requirement(s, n, m) for s, n, m in [("torch>=2.4", "torch", "2.4"), ("numpy", "numpy", None)]]
    reqs += [Requirement("pytest>=8", "pytest", "8"), Requirement("nbformat", "nbformat")]
    base = Facts(
        python=(3, 11, 7),
        executable="/repo/.venv/bin/python",
        in_venv=True,
        reqs=reqs,
        packages={r.name: PackageState(r.name, "ok", "1.0") for r in reqs},
        torch=TorchState(None),
        nvcc="/usr/local/cuda/bin/nvcc",
        nvcc_version="13.0",
        nvcc_arches=ARCHES,
        headers={d: "!" + f"{d} headers are not installed" for d in packages.HEADER_PACKAGES},
        models=paths.ROOT / "lab5" / "models-that-are-not-there",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def by_label(f: Facts) -> dict[str, doctor.Row]:
    return {r.label: r for r in doctor.rows(f)}


def test_every_row_is_there():
    labels = [r.label for r in doctor.rows(facts())]
    for label in (
        "Python",
        "torch",
        "numpy",
        "pytest",
        "nbformat",
        "nvcc",
        "GPU",
        "driver",
        "torch CUDA",
        "nvcc vs torch",
        "cuDNN frontend",
        "CUTLASS",
        "compute-sanitizer",
        "Nsight Compute",
        "Nsight Systems",
        "lab 5 models",
    ):
        assert label in labels
    assert labels[0] == "Python" and labels.index("nvcc") < labels.index("GPU")


def test_no_gpu_is_not_fatal_and_says_so():
    table = doctor.rows(facts())
    rows = {r.label: r for r in table}
    assert rows["GPU"].state == "fail" and "GPU tests are skipped" in rows["GPU"].detail
    assert rows["torch CUDA"].state == "absent"  # a CPU torch is right on a CPU machine
    assert doctor.exit_code(table) == 0
    assert "No NVIDIA GPU here" in doctor.verdict(table, gpu=False)[0]


def test_missing_nvcc_fails_the_course_but_not_the_python_environment():
    table = doctor.rows(facts(nvcc=None, nvcc_version="", nvcc_arches=frozenset()))
    row = {r.label: r for r in table}["nvcc"]
    assert row.state == "fail" and "CUDA toolkit" in row.fix
    assert doctor.exit_code(table, "course") == 1
    assert doctor.exit_code(table, "python") == 0
    assert "nvcc" in doctor.verdict(table, gpu=False)[0]


def test_old_nvcc_is_fatal():
    row = by_label(facts(nvcc_version="11.8"))["nvcc"]
    assert row.state == "fail" and "too old" in row.detail and row.blocks == "course"


@pytest.mark.parametrize("name", ["torch", "numpy", "pytest"])
def test_a_missing_essential_package_makes_the_environment_unusable(name: str):
    f = facts()
    f.packages[name] = PackageState(name, "missing")
    table = doctor.rows(f)
    row = {r.label: r for r in table}[name]
    assert row.state == "fail" and "pip install" in row.fix
    assert doctor.exit_code(table, "python") == 1
    assert name in doctor.verdict(table, gpu=False)[0]


def test_optional_package_missing_old_or_broken_is_not_fatal():
    f = facts()
    f.packages["nbformat"] = PackageState("nbformat", "broken", error="ImportError: boom")
    table = doctor.rows(f)
    assert "import fails: ImportError: boom" in {r.label: r for r in table}["nbformat"].detail
    assert doctor.exit_code(table) == 0
    f.packages["torch"] = PackageState("torch", "old", "2.1.0")
    row = by_label(f)["torch"]
    assert "2.1.0 is too old (need torch>=2.4)" in row.detail and "'torch>=2.4'" in row.fix


def test_old_python_is_fatal():
    table = doctor.rows(facts(python=(3, 9, 18)))
    assert {r.label: r for r in table}["Python"].state == "fail"
    assert doctor.exit_code(table, "python") == 1


def test_gpu_machine_with_cpu_only_torch_names_the_wheel_index():
    f = facts(gpus=(H100, H100), driver_cuda="13.0", torch=TorchState(None))
    rows = by_label(f)
    assert rows["GPU"].state == "ok" and "×2" in rows["GPU"].detail and "sm_90" in rows["GPU"].detail
    assert rows["torch CUDA"].state == "fail"
    assert "--index-url https://download.pytorch.org/whl/cu130" in rows["torch CUDA"].fix
    table = doctor.rows(f)
    assert doctor.exit_code(table) == 0  # the course runs; the verdict says GPU tasks will not
    assert "torch CUDA" in doctor.verdict(table, gpu=True)[1]


def test_gpu_machine_all_good():
    f = facts(gpus=(H100,), driver_cuda="13.0", torch=TorchState("13.0", True, "NVIDIA H100 80GB HBM3"))
    rows = by_label(f)
    assert all(rows[k].state == "ok" for k in ("GPU", "driver", "torch CUDA", "nvcc vs torch"))
    assert doctor.verdict(doctor.rows(f), gpu=True) == ["✓ Ready. Next: make test-lab1"]


def test_gpu_too_old_or_not_in_nvccs_list():
    pascal = replace(H100, name="Tesla P100", compute_capability="6.0")
    assert "Volta or newer" in by_label(facts(gpus=(pascal,), driver_cuda="13.0"))["GPU"].fix
    volta = replace(H100, name="Tesla V100", compute_capability="7.0")
    row = by_label(facts(gpus=(volta,), driver_cuda="13.0"))["GPU"]
    assert row.state == "fail" and "cannot build for sm_70 (its oldest is sm_75)" in row.detail
    assert "--list-gpu-code" in row.fix


def test_driver_older_than_nvcc_and_major_mismatch_are_flagged():
    f = facts(gpus=(H100,), driver_cuda="12.4", torch=TorchState("12.8", True, "H100"))
    rows = by_label(f)
    assert rows["driver"].state == "fail" and "will not load" in rows["driver"].detail
    assert rows["nvcc vs torch"].state == "fail" and "warning only" in rows["nvcc vs torch"].detail
    assert doctor.exit_code(doctor.rows(f)) == 0


def test_missing_header_wheel_gives_the_pip_fix(monkeypatch: pytest.MonkeyPatch):
    def not_installed(name: str) -> md.Distribution:
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(packages.md, "distribution", not_installed)
    headers, _ = doctor.header_facts()
    rows = by_label(facts(headers=headers))
    for label, dist in (("cuDNN frontend", "nvidia-cudnn-frontend"), ("CUTLASS", "nvidia-cutlass")):
        assert rows[label].state == "fail" and "optional until then" in rows[label].detail
        assert rows[label].fix.startswith(f".venv/bin/python -m pip install --no-deps {dist}")
        assert rows[label].blocks == ""  # not fatal before lab 3


def test_tools_and_models_rows(tmp_path: Path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "model.safetensors").write_bytes(b"\0" * 10)
    f = facts(
        sanitizer=Tool("/cuda/bin/compute-sanitizer", "2025.3.0"),
        ncu=Tool("/cuda/bin/ncu", "2025.3.0.0"),
        models=tmp_path,
        model_files=doctor.model_files(tmp_path),
    )
    rows = by_label(f)
    assert rows["Nsight Compute"].state == "ok" and "2025.3.0.0" in rows["Nsight Compute"].detail
    assert rows["Nsight Systems"].state == "absent" and "nsys" in rows["Nsight Systems"].fix
    assert rows["lab 5 models"].state == "ok" and "model.safetensors" in rows["lab 5 models"].detail
    absent = by_label(facts())
    assert absent["lab 5 models"].state == "absent" and "fine until lab 5" in absent["lab 5 models"].detail
    assert absent["compute-sanitizer"].state == "fail" and absent["compute-sanitizer"].blocks == ""
    root_only = by_label(replace(f, gpus=(H100,), admin_only_counters=True))["Nsight Compute"]
    assert root_only.state == "fail" and "NVreg_RestrictProfilingToAdminUsers=0" in root_only.fix


def test_requirements_are_parsed_and_missing_ones_listed(tmp_path: Path):
    req = tmp_path / "requirements.txt"
    req.write_text("# comment\npytest>=8  # the runner\nnumpy>=999\ngrader-surely-not-installed-pkg\n\n")
    reqs = doctor.requirements(req)
    assert reqs is not None and [r.name for r in reqs] == ["pytest", "numpy", "grader-surely-not-installed-pkg"]
    assert reqs[0].minimum == "8" and reqs[0].spec == "pytest>=8"
    assert doctor.missing_requirements(reqs) == ["numpy>=999", "grader-surely-not-installed-pkg"]
    assert doctor.requirements(tmp_path / "nope.txt") is None
    # an upper bound names a release the course cannot use: the installed one at or past it is reinstalled
    bounded = doctor.parse_requirement("pytest>=8,<1.0  # why")
    assert bounded is not None and bounded.minimum == "8" and bounded.below == "1.0"
    assert doctor.missing_requirements([bounded]) == ["pytest>=8,<1.0"]
    assert doctor.missing_requirements([doctor.parse_requirement("pytest>=8,<999")]) == []
    assert doctor.vtuple("2.13.0+cu130") == (2, 13, 0) and doctor.vtuple("13.0") > doctor.vtuple("12.8")


def test_the_course_requirements_are_the_one_list():
    reqs = doctor.requirements()
    assert reqs is not None and {"torch", "numpy", "pytest"} <= {r.name for r in reqs}
    text = (paths.ROOT / "setup.sh").read_text()
    assert "DEFAULT_REQS" not in text and "torch>=" not in text
    assert 'dynamic = ["dependencies"]' in (paths.ROOT / "pyproject.toml").read_text()


def _machine(monkeypatch: pytest.MonkeyPatch, *, nvcc: bool, gpu: bool = False) -> None:
    """No GPU (or one H100), nvcc there or not, every package present, no tools: without asking."""
    from grader.instructor import profile
    from grader.parent import sanitizer

    def no_nvcc() -> Path:
        raise toolchain.ToolchainError("nvcc not found: install the CUDA toolkit")

    def probe(reqs: list[Requirement]) -> tuple[dict[str, PackageState], TorchState]:
        return {r.name: PackageState(r.name, "ok", "1.0") for r in reqs}, TorchState(None)

    monkeypatch.setattr(toolchain, "find_nvcc", (lambda: Path("/usr/local/cuda/bin/nvcc")) if nvcc else no_nvcc)
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: "13.0")
    monkeypatch.setattr(toolchain, "nvcc_arches", lambda: ARCHES)
    monkeypatch.setattr(toolchain, "gpus", lambda: (H100,) if gpu else ())
    monkeypatch.setattr(doctor, "driver_cuda_version", lambda: "13.0")
    monkeypatch.setattr(doctor, "probe_packages", probe)
    for module, name in ((profile, "find_ncu"), (profile, "find_nsys"), (sanitizer, "find_sanitizer")):
        monkeypatch.setattr(module, name, lambda: None)


def test_exit_status_gpu_or_not(monkeypatch: pytest.MonkeyPatch):
    out: list[str] = []
    _machine(monkeypatch, nvcc=True)
    assert doctor.run(out.append) == 0
    assert out[0].startswith("Environment (") and any("✗ GPU" in line for line in out)
    _machine(monkeypatch, nvcc=True, gpu=True)
    assert doctor.run(out.append) == 0
    _machine(monkeypatch, nvcc=False)
    out.clear()
    assert doctor.run(out.append) == 1
    assert doctor.run(out.append, need="python") == 0
    assert any("fix: install the CUDA toolkit" in line for line in out)


def test_json_output(monkeypatch: pytest.MonkeyPatch):
    _machine(monkeypatch, nvcc=False)
    out: list[str] = []
    assert doctor.run(out.append, as_json=True) == 1
    data = json.loads(out[0])
    assert data["python_ready"] is True and data["ready"] is False and data["gpu"] is False
    assert {"label", "state", "detail", "fix", "blocks"} <= set(data["rows"][0])


def test_missing_mode_prints_specs_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    req = tmp_path / "requirements.txt"
    req.write_text("pytest\ngrader-surely-not-installed-pkg>=1\n")
    monkeypatch.setattr(doctor, "REQUIREMENTS", req)
    out: list[str] = []
    assert doctor.run(out.append, missing=True) == 0
    assert out == ["grader-surely-not-installed-pkg>=1"]


def test_probe_imports_in_a_child_and_reports_each_package():
    found, torch_state = doctor.probe_packages(
        [
            Requirement("pytest", "pytest"),
            Requirement("grader-surely-not-installed-pkg", "grader-surely-not-installed-pkg"),
        ]
    )
    assert found["pytest"].status == "ok" and found["pytest"].version
    assert found["grader-surely-not-installed-pkg"].status == "missing"
    assert torch_state is not None  # a CPU torch answers too: cuda None, or the error


def test_every_installed_requirement_is_found_by_its_import_name():
    # a distribution whose module is named otherwise (pytest-xdist is `xdist`) must be in MODULES,
    # or the table calls an installed package missing and the fix it prints changes nothing
    wrong = []
    for req in doctor.requirements() or []:
        try:
            md.version(req.name)
        except md.PackageNotFoundError:
            continue
        if not all(importlib.util.find_spec(m.split(".")[0]) for m in req.modules):
            wrong.append(f"{req.name}: no module {req.modules}")
    assert not wrong, "add them to doctor.MODULES: " + "; ".join(wrong)


def _comment_above(lines: list[str], i: int) -> list[str]:
    block = []
    while i > 0 and lines[i - 1].startswith("#"):
        i -= 1
        block.append(lines[i])
    return block


def test_setup_sh_is_a_bootstrap_with_a_why_per_function():
    text = (paths.ROOT / "setup.sh").read_text()
    assert "set -euo pipefail" in text and "-m grader doctor" in text
    for name in ("python_rows", "nvcc_row", "gpu_rows", "torch_rows", "print_table", "probe_venv"):
        assert f"{name}()" not in text, f"{name} belongs to the doctor now"
    lines = text.splitlines()
    functions = [(m.group(1), i) for i, line in enumerate(lines) if (m := re.match(r"^(\w+)\(\) \{", line))]
    assert len(functions) > 5
    for name, i in functions:
        assert any(c.startswith("# Why:") for c in _comment_above(lines, i)), f"{name}() has no '# Why:' comment"


@pytest.mark.skipif(not (paths.ROOT / ".venv" / "bin" / "python").exists(), reason="no .venv here: run ./setup.sh")
def test_setup_sh_check_prints_the_doctors_table():
    env = {**os.environ, "GRADER_NO_GPU": "1"}
    run = subprocess.run(
        ["bash", "setup.sh", "--check"], cwd=paths.ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Environment (" in run.stdout and "✓ Python" in run.stdout and "GRADER_NO_GPU=1" in run.stdout
    help_text = subprocess.run(["bash", "setup.sh", "--help"], cwd=paths.ROOT, capture_output=True, text=True)
    assert help_text.returncode == 0 and "--check" in help_text.stdout


def test_other_gpu_processes_leave_out_this_process_and_other_gpus(monkeypatch) -> None:
    import os
    import subprocess
    from types import SimpleNamespace

    from grader import toolchain

    monkeypatch.setattr(toolchain, "gpus", lambda: ("a GPU",))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    apps = f"{os.getpid()}, /usr/bin/python3, 900, GPU-a\n4242, /opt/bin/leftover, 1200, GPU-a\n4343, x, 5, GPU-b\n"

    def run(cmd, **_kw):
        out = "0, GPU-a\n1, GPU-b\n" if "--query-gpu=index,uuid" in cmd else apps
        return SimpleNamespace(stdout=out, returncode=0)

    monkeypatch.setattr(subprocess, "run", run)
    assert toolchain.other_gpu_processes() == ["4242 leftover (1200 MiB)"]
