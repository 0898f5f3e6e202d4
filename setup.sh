#!/usr/bin/env bash
# setup.sh — make the course's Python environment (.venv), then run the environment check.
#
# Safe to re-run: an existing .venv is kept and only what is missing gets installed. The ✓/✗
# table itself is `python -m grader doctor` (grader/instructor/doctor.py), which this script
# runs at the end; `make doctor` runs it alone. Run ./setup.sh --help for the options.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
REQS="$ROOT/requirements.txt"  # the package list: the only copy (pyproject.toml reads it too)
BASE_PY="${PYTHON:-python3}"
PTH_NAME="course-base-site.pth"

QUIET=0
CHECK=0
INSTALL_FAILED=0
REUSED_TORCH=0
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Why: --help must explain the flags and what the script touches without running anything.
usage() {
    cat <<'EOF'
Usage: ./setup.sh [--quiet] [--check] [--help]

Makes .venv in the repository root with the packages of requirements.txt (torch, numpy,
pytest, pytest-xdist, ninja, nbformat, jupyter, ruff), then runs `python -m grader doctor`: a ✓/✗ table
of the environment (Python, each package, nvcc, GPU, driver, torch's CUDA, the cuDNN
frontend and CUTLASS headers, compute-sanitizer, Nsight Compute and Systems, lab 5's
model files), each ✗ with the command that fixes it.

  (no flag)  create .venv if missing, install what is missing, print progress and the table
  --quiet    same, but print only the table
  --check    install nothing, only print the table (`make doctor` prints the same one)
  --help     this text

Reuses an installed torch: if the base interpreter ($PYTHON, default python3) can already
import torch (typical on GPU machines without network), .venv is created with
--system-site-packages plus a .pth file that also exposes that interpreter's own
site-packages (it may itself be a venv), and only the missing packages are pip-installed.
If that install fails (offline), the missing rows show ✗ with the command to fix them.
Otherwise everything is installed from requirements.txt with pip.

Environment:
  PYTHON           base interpreter, Python >= 3.10 (default: python3)
  TORCH_SPEC       pin torch when installing from scratch, e.g. torch==2.13.0 (CPU CI does)
  TORCH_INDEX_URL  extra pip index for torch when installing from scratch,
                   e.g. https://download.pytorch.org/whl/cpu on a CPU-only CI runner
  NVCC, CUDA_HOME  where to find nvcc if it is not on PATH

Exit status: 0 when .venv/bin/python can import torch, numpy and pytest (also on a machine
without a GPU or without nvcc: the table says what is missing); 1 when the Python
environment could not be made.
EOF
}

# Why: progress lines must disappear under --quiet so that only the table is printed.
say() {
    if [[ $QUIET == 0 ]]; then printf '==> %s\n' "$*"; fi
}

# Why: errors go to stderr with a fix, so a failing CI log says what to do next.
die() {
    printf 'setup.sh: error: %s\n' "$*" >&2
    exit 1
}

# Why: reject unknown flags early instead of silently doing a full install.
parse_args() {
    local arg
    for arg in "$@"; do
        case "$arg" in
            --quiet|-q) QUIET=1 ;;
            --check) CHECK=1 ;;
            --help|-h) usage; exit 0 ;;
            *) printf 'setup.sh: unknown option %s\n\n' "$arg" >&2; usage >&2; exit 2 ;;
        esac
    done
}

# Why: the course uses match statements, PEP 604 types etc.; fail with the fix, not a traceback.
check_base_python() {
    if ! command -v "$BASE_PY" >/dev/null 2>&1; then
        die "no Python interpreter '$BASE_PY' found. Fix: install Python >= 3.10 and run PYTHON=python3.11 ./setup.sh"
    fi
    if ! "$BASE_PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
        local v
        v="$("$BASE_PY" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?')"
        die "$BASE_PY is Python $v; the course needs Python >= 3.10. Fix: PYTHON=python3.11 ./setup.sh (any Python >= 3.10)"
    fi
}

# Why: a venv whose interpreter no longer runs (moved repo, removed Python) must be rebuilt.
venv_works() {
    [[ -x $VPY ]] && "$VPY" -c 'import sys' >/dev/null 2>&1
}

# Why: GPU machines have no network but a Python with a CUDA torch; reusing it avoids a
# multi-gigabyte download that would fail anyway. The .pth file is needed because
# --system-site-packages only exposes the *underlying* Python's packages, and the base
# interpreter may itself be a venv (e.g. /opt/torch/.venv) whose site-packages it would miss.
write_base_pth() {
    local site_dir
    site_dir="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$BASE_PY" - "$site_dir/$PTH_NAME" <<'PY'
import os, site, sys
dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
with open(sys.argv[1], "w") as f:
    f.write(f"# written by setup.sh: site-packages of {sys.executable}\n")
    f.writelines(d + "\n" for d in dirs)
PY
}

# Why: create .venv once; re-runs keep it (idempotent) unless its interpreter is broken.
ensure_venv() {
    if venv_works; then
        say "reusing $VENV"
        return
    fi
    check_base_python
    local flags=()
    if [[ -e $VENV ]]; then
        say "$VENV exists but its Python does not run: recreating it"
        flags+=(--clear)
    fi
    if "$BASE_PY" -c 'import torch' >/dev/null 2>&1; then
        REUSED_TORCH=1
        flags+=(--system-site-packages)
        say "$BASE_PY already has torch: creating .venv on top of it (no torch download)"
    else
        say "creating .venv with $BASE_PY; torch and the rest come from pip"
    fi
    local err
    if ! err="$("$BASE_PY" -m venv "${flags[@]}" "$VENV" 2>&1)"; then
        printf '%s\n' "$err" >&2
        die "could not create $VENV with $BASE_PY. Fix: install the venv module (Debian/Ubuntu: apt install python3-venv) or use another interpreter: PYTHON=python3.11 ./setup.sh"
    fi
    if [[ $REUSED_TORCH == 1 ]]; then write_base_pth; fi
}

# Why: pip's output is noise under --quiet, but its error must survive for the ✗ rows.
# The byte-compiling is done apart, on every core: pip compiles the modules of every package one
# after the other (torch's thousands: 93 s of a fresh install's 168 s on two cores), compileall -j 0
# in 55 s. It must be done: with PYTHONDONTWRITEBYTECODE set (as on CI machines) Python never
# writes the .pyc of what it imports, and every process would compile torch again (make check
# took a sixth longer without them).
pip_install() {
    local log="$VENV/setup-pip.log" rc
    if [[ $QUIET == 1 ]]; then
        "$VPY" -m pip install -q --no-compile "$@" >"$log" 2>&1
        rc=$?
    else
        "$VPY" -m pip install -q --no-compile "$@" 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
    fi
    # a file or two of some package does not compile (Python 2 examples, templates): not an error here
    "$VPY" -m compileall -q -j 0 "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        >/dev/null 2>&1 || true
    return "$rc"
}

# Why: install only what the doctor finds missing (it reads requirements.txt, imports nothing,
# so this is instant on a re-run); an offline failure is reported by the table, not fatal.
install_missing() {
    local out spec missing=()
    if ! out="$(cd "$ROOT" && "$VPY" -m grader doctor --missing 2>&1)"; then
        INSTALL_FAILED=1
        say "could not list the missing packages: $out"
        return
    fi
    while IFS= read -r spec; do
        if [[ -n $spec ]]; then missing+=("$spec"); fi
    done <<<"$out"
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "all Python packages present"
        return
    fi
    local args=()
    if printf '%s\n' "${missing[@]}" | grep -Eq '^torch([<>=!~;[:space:]]|$)'; then
        # The CPU-CI / fresh-laptop path: everything from the index (mirror) in one resolve.
        if [[ -n ${TORCH_INDEX_URL:-} ]]; then args+=(--extra-index-url "$TORCH_INDEX_URL"); fi
        if [[ -n ${TORCH_SPEC:-} ]]; then args+=("$TORCH_SPEC"); fi
        args+=(-r "$REQS")
        say "pip install ${args[*]}  (torch is a large download the first time)"
    else
        # torch is reused; the rest is small. Short timeouts: GPU machines are often offline.
        args+=(--timeout 10 --retries 1 "${missing[@]}")
        say "pip install ${missing[*]}"
    fi
    if ! pip_install "${args[@]}"; then
        INSTALL_FAILED=1
        say "pip install failed (offline?): the missing packages are marked ✗ below; log: $VENV/setup-pip.log"
    fi
}

# Why: torch's C++ extensions and the grader call the `ninja` program, which pip puts in the
# base interpreter's bin/ when torch is reused; expose it as .venv/bin/ninja as well.
link_ninja() {
    [[ -e $VENV/bin/ninja ]] && return
    local bin
    # The ninja wheel's RECORD knows where its script went (../../../bin/ninja of its prefix).
    bin="$("$VPY" - 2>/dev/null <<'PY' || true
import importlib.metadata as md, os
dist = md.distribution("ninja")
for f in dist.files or []:
    if f.name == "ninja" and f.parent.name == "bin":
        print(os.path.realpath(dist.locate_file(f)))
        break
PY
)"
    if [[ -z $bin || ! -x $bin ]]; then bin="$(command -v ninja || true)"; fi
    if [[ -n $bin && -x $bin ]]; then ln -sf "$bin" "$VENV/bin/ninja"; fi
}

# Why: the table and the verdict are the doctor's (one implementation, shared with make
# doctor); --need python makes its exit status this script's: only an unusable Python
# environment fails, a missing GPU or nvcc does not.
run_doctor() {
    if ! venv_works; then
        printf '\nEnvironment (%s)\n  ✗ Python  no working %s\n            fix: ./setup.sh (or PYTHON=python3.11 ./setup.sh)\n\n' "$ROOT" "$VENV"
        echo "✗ The Python environment is not usable: run ./setup.sh to make it."
        return 1
    fi
    local rc=0
    echo
    (cd "$ROOT" && "$VPY" -m grader doctor --need python) || rc=$?
    if (( rc > 1 )); then
        echo "✗ python -m grader doctor itself failed (exit $rc): the grader cannot run in $VENV."
        return 1
    fi
    if [[ $INSTALL_FAILED == 1 && $QUIET == 0 ]]; then
        echo "  Some packages could not be installed (no network?): their ✗ rows above say how to get them."
    fi
    return "$rc"
}

# Why: bootstrap first (unless --check), then the doctor; its verdict is this script's exit status.
main() {
    parse_args "$@"
    cd "$ROOT"
    if [[ $CHECK == 0 ]]; then
        ensure_venv
        install_missing
        link_ninja
    fi
    local rc=0
    run_doctor || rc=$?
    # A fresh timestamp a Makefile can depend on (.venv/bin/python is a symlink to an old binary).
    if [[ $CHECK == 0 && $rc == 0 ]]; then touch "$VENV/.setup-stamp"; fi
    return "$rc"
}

main "$@"
