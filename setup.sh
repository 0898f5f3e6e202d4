#!/usr/bin/env bash
# setup.sh — make the course's Python environment (.venv) and check the CUDA toolchain.
#
# Safe to re-run: an existing .venv is kept and only what is missing gets installed.
# Run ./setup.sh --help for the options.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
REQS="$ROOT/requirements.txt"
BASE_PY="${PYTHON:-python3}"
PTH_NAME="course-base-site.pth"
# Used when requirements.txt is missing (e.g. setup.sh copied alone); keep in sync with it.
DEFAULT_REQS=("torch>=2.4" "numpy" "pytest>=8" "ninja" "nbformat" "jupyter" "ruff")
# Without these the course cannot run at all: their absence makes the script exit non-zero.
ESSENTIAL=("torch" "numpy" "pytest")

QUIET=0
CHECK=0
INSTALL_FAILED=0
REUSED_TORCH=0
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Why: --help must explain the flags and what the script touches without running anything.
usage() {
    cat <<'EOF'
Usage: ./setup.sh [--quiet] [--check] [--help]

Makes .venv in the repository root with everything the course needs (requirements.txt:
torch, numpy, pytest, ninja, nbformat, jupyter, ruff), then prints a ✓/✗ table of the
environment: Python, each package, nvcc, GPU, driver, torch's CUDA.

  (no flag)  create .venv if missing, install what is missing, print progress and the table
  --quiet    same, but print only the table
  --check    install nothing, only print the table
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
without a GPU: GPU tests are then skipped); 1 when the Python environment could not be made.
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

# Why: one source of truth for the package list; fall back to a copy if the file is absent.
read_requirements() {
    REQ_LINES=()
    if [[ -f $REQS ]]; then
        local line
        while IFS= read -r line || [[ -n $line ]]; do
            line="${line%%#*}"
            line="${line//[[:space:]]/}"
            if [[ -n $line ]]; then REQ_LINES+=("$line"); fi
        done <"$REQS"
    else
        REQ_LINES=("${DEFAULT_REQS[@]}")
    fi
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

# Why: one interpreter start answers every question about .venv (imports, versions, torch's
# CUDA), printing tab-separated '@@' rows that bash turns into the table.
probe_venv() {
    "$VPY" - "${REQ_LINES[@]}" 2>/dev/null <<'PY' || true
import importlib, importlib.metadata as md, os, platform, re, sys

# Which imports prove that a requirement is usable (the jupyter metapackage has no module).
MODULES = {"jupyter": ["jupyter_core", "notebook"], "pyyaml": ["yaml"]}

def vtuple(v):
    out = []
    for part in re.split(r"[.+]", v):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)

def emit(*cols):
    print("@@\t" + "\t".join(str(c).replace("\t", " ").replace("\n", " ") for c in cols), flush=True)

emit("python", platform.python_version(), sys.executable)
for spec in sys.argv[1:]:
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(?:>=\s*([0-9][0-9.]*))?", spec)
    name, minimum = m.group(1), m.group(2)
    mods = MODULES.get(name.lower(), [name.replace("-", "_")])
    try:
        first = [importlib.import_module(mod) for mod in mods][0]
    except Exception as e:  # ImportError, or a broken install raising anything else
        emit("pkg", name, "missing", "-", spec, f"{type(e).__name__}: {e}"[:120])
        continue
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = getattr(first, "__version__", "?")
    where = os.path.dirname(os.path.dirname(os.path.abspath(first.__file__ or "")))
    origin = "" if where.startswith(sys.prefix) else where
    status = "old" if minimum and vtuple(version) < vtuple(minimum) else "ok"
    emit("pkg", name, status, version, spec, origin)

try:
    import torch
    available = torch.cuda.is_available()
    emit("torch", torch.version.cuda or "none", int(available),
         torch.cuda.get_device_name(0) if available else "")
except Exception as e:
    emit("torch", "error", 0, f"{type(e).__name__}: {e}"[:120])
PY
}

# Why: pip's output is noise under --quiet, but its error must survive for the ✗ rows.
pip_install() {
    local log="$VENV/setup-pip.log"
    if [[ $QUIET == 1 ]]; then
        "$VPY" -m pip install -q "$@" >"$log" 2>&1
    else
        "$VPY" -m pip install -q "$@" 2>&1 | tee "$log"
    fi
}

# Why: install only what the probe found missing; an offline failure is reported, not fatal.
install_missing() {
    local out spec missing=()
    out="$(probe_venv)"
    PROBE_CACHE="$out"  # reused by the table unless pip changes something below
    # probe rows: @@ pkg NAME STATUS VERSION SPEC ORIGIN-or-ERROR
    while IFS= read -r spec; do
        if [[ -n $spec ]]; then missing+=("$spec"); fi
    done < <(awk -F'\t' '$1=="@@" && $2=="pkg" && $4!="ok" {print $6}' <<<"$out")
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "all Python packages present"
        return
    fi
    PROBE_CACHE=""
    local args=()
    if awk -F'\t' '$1=="@@" && $2=="pkg" && $3=="torch" && $4!="ok" {f=1} END {exit !f}' <<<"$out"; then
        # The CPU-CI / fresh-laptop path: everything from the index (mirror) in one resolve.
        if [[ -n ${TORCH_INDEX_URL:-} ]]; then args+=(--extra-index-url "$TORCH_INDEX_URL"); fi
        if [[ -n ${TORCH_SPEC:-} ]]; then args+=("$TORCH_SPEC"); fi
        if [[ -f $REQS ]]; then args+=(-r "$REQS"); else args+=("${DEFAULT_REQS[@]}"); fi
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

# --------------------------------------------------------------------------- the table

ROWS_OUT=""
PY_ENV_OK=1
NO_GPU=0

# Why: every check prints the same way: mark, label, detail, and the fix on the next line.
row() {
    local state="$1" label="$2" detail="$3" fix="${4:-}" mark='✓'
    if [[ $state != ok ]]; then mark='✗'; fi
    ROWS_OUT+="$(printf '  %s %-13s %s' "$mark" "$label" "$detail")"$'\n'
    if [[ -n $fix ]]; then
        ROWS_OUT+="$(printf '    %-13s fix: %s' '' "$fix")"$'\n'
    fi
}

# Why: a package row must say what to run; the notebook/lint tools are optional extras.
package_fix() {
    local name="$1" spec="$2" why=""
    case "$name" in
        nbformat|jupyter) why=" (needs network; only the notebooks need it)" ;;
        ruff) why=" (needs network; only make lint needs it)" ;;
        torch) why=" (needs network), or reuse a Python that has torch: rm -rf .venv && PYTHON=/path/to/python3 ./setup.sh" ;;
        *) why=" (needs network)" ;;
    esac
    printf "%s" ".venv/bin/python -m pip install '$spec'$why"
}

PROBE_CACHE=""
TORCH_CUDA=""
TORCH_AVAIL=0
TORCH_ERR=""

# Why: Python and its packages decide the exit status, so they come first in the table.
python_rows() {
    if ! venv_works; then
        PY_ENV_OK=0
        row fail Python "no working $VENV" "./setup.sh (or PYTHON=python3.11 ./setup.sh)"
        return
    fi
    local out kind a b c d e f
    out="${PROBE_CACHE:-$(probe_venv)}"
    while IFS=$'\t' read -r kind a b c d e f; do
        [[ $kind == "@@" ]] || continue
        case "$a" in
            python)
                if "$VPY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
                    row ok Python "$b  $VPY"
                else
                    PY_ENV_OK=0
                    row fail Python "$b  $VPY (needs >= 3.10)" "rm -rf .venv && PYTHON=python3.11 ./setup.sh"
                fi ;;
            pkg)
                # b=name c=status d=version e=spec f=origin (outside .venv) or import error
                local name="$b" status="$c" version="$d" spec="$e" extra="$f"
                if [[ $status == ok ]]; then
                    row ok "$name" "$version${extra:+  (from $extra)}"
                else
                    local what="not installed"
                    if [[ $status == old ]]; then
                        what="$version is too old (need $spec)"
                    elif [[ -n $extra && $extra != ModuleNotFoundError* ]]; then
                        what="installed but import fails: $extra"
                    fi
                    row fail "$name" "$what" "$(package_fix "$name" "$spec")"
                    local ess
                    for ess in "${ESSENTIAL[@]}"; do
                        if [[ $ess == "$name" ]]; then PY_ENV_OK=0; fi
                    done
                fi ;;
            torch)
                TORCH_CUDA="$b"; TORCH_AVAIL="$c"; TORCH_ERR="$d" ;;
        esac
    done <<<"$out"
    if [[ $out != *$'@@\tpython'* ]]; then
        PY_ENV_OK=0
        row fail Python "$VPY does not run" "rm -rf .venv && ./setup.sh"
    fi
    # An import that crashes the interpreter (not just raises) leaves its row out: say so.
    local req name
    for req in "${REQ_LINES[@]}"; do
        name="${req%%[<>=!~ ]*}"
        if [[ $out != *$'@@\tpkg\t'"$name"$'\t'* && $out == *$'@@\tpython'* ]]; then
            row fail "$name" "importing it crashed the interpreter" "$(package_fix "$name" "$req")"
            for ess in "${ESSENTIAL[@]}"; do
                if [[ $ess == "$name" ]]; then PY_ENV_OK=0; fi
            done
        fi
    done
}

NVCC_BIN=""
NVCC_VER=""

# Why: the grader builds every kernel with nvcc; look where CUDA installs put it, not just PATH.
nvcc_row() {
    local c
    for c in "${NVCC:-}" "$(command -v nvcc || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" \
             "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
        if [[ -n $c && -x $c ]]; then NVCC_BIN="$c"; break; fi
    done
    local fix="install the CUDA toolkit 12.x or 13.x and put its bin on PATH or set CUDA_HOME"
    if [[ -z $NVCC_BIN ]]; then
        row fail nvcc "not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)" "$fix"
        return
    fi
    NVCC_VER="$("$NVCC_BIN" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n1)"
    local major="${NVCC_VER%%.*}"
    if [[ -z $NVCC_VER ]]; then
        row fail nvcc "$NVCC_BIN does not run" "$fix"
    elif (( major < 12 )); then
        row fail nvcc "$NVCC_BIN  release $NVCC_VER (too old)" "$fix"
    elif [[ $(command -v nvcc || true) != "$NVCC_BIN" ]]; then
        row ok nvcc "$NVCC_BIN  release $NVCC_VER  (not on PATH: export PATH=$(dirname "$NVCC_BIN"):\$PATH)"
    else
        row ok nvcc "$NVCC_BIN  release $NVCC_VER"
    fi
}

DRIVER_CUDA=""

# Why: kernels only run with an NVIDIA GPU of compute capability 7.0+ and a new enough driver;
# without one, everything else still works and that must be said plainly, not as an error.
gpu_rows() {
    local none="no NVIDIA GPU: kernels will still compile and CPU checks run; GPU tests are skipped"
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        NO_GPU=1
        row fail GPU "$none"
        row fail driver "no NVIDIA driver (nvidia-smi not found)" "only needed on a machine with an NVIDIA GPU"
        return
    fi
    local q first count name cap
    q="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null || true)"
    if [[ -z $q ]]; then  # drivers older than 510 lack compute_cap
        q="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true)"
    fi
    if [[ -z $q || $q == *"No devices"* || $q == *"failed"* ]]; then
        NO_GPU=1
        row fail GPU "$none"
    else
        first="$(head -n1 <<<"$q")"
        count="$(grep -c . <<<"$q")"
        name="${first%%,*}"
        cap=""
        if [[ $first == *,* ]]; then cap="$(tr -d ' ' <<<"${first#*,}")"; fi
        local detail="$name${cap:+  compute capability $cap (sm_${cap/./})}"
        if (( count > 1 )); then detail+="  ×$count"; fi
        if [[ -n $cap ]] && (( ${cap%%.*} < 7 )); then
            row fail GPU "$detail" "the course needs Volta or newer (compute capability 7.0+)"
        else
            row ok GPU "$detail"
        fi
    fi
    local drv
    drv="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
    DRIVER_CUDA="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1 || true)"
    if [[ -z $drv ]]; then
        row fail driver "nvidia-smi does not report a driver version" "reinstall the NVIDIA driver"
    elif [[ -n $NVCC_VER && -n $DRIVER_CUDA ]] && version_lt "$DRIVER_CUDA" "$NVCC_VER"; then
        row fail driver "$drv (supports CUDA $DRIVER_CUDA, older than nvcc $NVCC_VER: its kernels will not load)" \
            "update the NVIDIA driver, or use a CUDA $DRIVER_CUDA toolkit"
    else
        row ok driver "$drv${DRIVER_CUDA:+  (supports CUDA up to $DRIVER_CUDA)}"
    fi
}

# Why: compare dotted versions (driver CUDA vs nvcc) without external tools.
version_lt() {
    [[ $1 != "$2" && $(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1) == "$1" ]]
}

# Why: the right PyTorch wheel index for this machine's driver, for the CPU-only-torch fix.
torch_index() {
    local d="${DRIVER_CUDA:-13.0}"
    if ! version_lt "$d" 13.0; then echo https://download.pytorch.org/whl/cu130
    elif ! version_lt "$d" 12.8; then echo https://download.pytorch.org/whl/cu128
    else echo https://download.pytorch.org/whl/cu126
    fi
}

# Why: torch computes the references and times the baselines on the GPU; a CPU-only wheel on
# a GPU machine is the most common silent misconfiguration.
torch_rows() {
    local label="torch CUDA"
    if [[ $PY_ENV_OK == 0 && -z $TORCH_CUDA ]]; then
        row fail "$label" "not checked: torch is not importable in .venv"
    elif [[ $TORCH_CUDA == error ]]; then
        row fail "$label" "torch.cuda raised $TORCH_ERR"
    elif [[ $TORCH_CUDA == none ]]; then
        if [[ $NO_GPU == 1 ]]; then
            row fail "$label" "CPU-only torch build (fine without a GPU: GPU tests are skipped)"
        else
            row fail "$label" "CPU-only torch build, but this machine has a GPU" \
                ".venv/bin/python -m pip install --force-reinstall torch --index-url $(torch_index)"
        fi
    elif [[ $TORCH_AVAIL == 1 ]]; then
        row ok "$label" "CUDA $TORCH_CUDA, torch.cuda.is_available() = True ($TORCH_ERR)"
    elif [[ $NO_GPU == 1 ]]; then
        row fail "$label" "CUDA $TORCH_CUDA build, torch.cuda.is_available() = False: no GPU, GPU tests are skipped"
    else
        row fail "$label" "CUDA $TORCH_CUDA build, torch.cuda.is_available() = False although a GPU is present" \
            "update the driver (supports CUDA ${DRIVER_CUDA:-?}) or install a matching wheel: --index-url $(torch_index)"
    fi

    local label2="nvcc vs torch"
    local nv="${NVCC_VER%%.*}" tc="${TORCH_CUDA%%.*}"
    if [[ -z $NVCC_VER || -z $TORCH_CUDA || $TORCH_CUDA == none || $TORCH_CUDA == error ]]; then
        row fail "$label2" "not compared (needs nvcc and a CUDA build of torch; warning only)"
    elif [[ $nv == "$tc" ]]; then
        row ok "$label2" "same CUDA major: nvcc $NVCC_VER, torch CUDA $TORCH_CUDA"
    else
        row fail "$label2" "nvcc $NVCC_VER vs torch CUDA $TORCH_CUDA (warning only: the grader's kernels are fine; PyTorch C++ extensions in lab 3 need the same major)" \
            "a CUDA $tc.x toolkit, or a torch wheel for CUDA $nv"
    fi
}

# Why: one place decides the verdict line and the exit status.
print_table() {
    python_rows
    nvcc_row
    gpu_rows
    torch_rows
    printf '\nEnvironment (%s)\n%s' "$ROOT" "$ROWS_OUT"
    echo
    if [[ $PY_ENV_OK == 0 ]]; then
        echo "✗ The Python environment is not usable: fix the ✗ rows for Python/torch/numpy/pytest above."
        return 1
    fi
    if [[ $INSTALL_FAILED == 1 ]]; then
        echo "  Some optional packages could not be installed (no network?); the course runs without them."
    fi
    if [[ $NO_GPU == 1 ]]; then
        echo "✓ Python environment ready. No NVIDIA GPU here: GPU work will be skipped (kernels still compile, CPU checks run)."
    else
        echo "✓ Python environment ready. Next: make test-lab1"
    fi
}

main() {
    parse_args "$@"
    cd "$ROOT"
    read_requirements
    if [[ $CHECK == 0 ]]; then
        ensure_venv
        install_missing
        link_ninja
    fi
    print_table
    # A fresh timestamp a Makefile can depend on (.venv/bin/python is a symlink to an old binary).
    if [[ $CHECK == 0 ]]; then touch "$VENV/.setup-stamp"; fi
}

main "$@"
