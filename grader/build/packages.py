"""The libraries a task builds against: where their headers and shared libraries are, and which
headers, shared libraries and symbols belong to a library at all.

The course never clones a library: the cuDNN frontend and CUTLASS (with CuTe) are installed as
wheels, and their include folders are found through the installed distribution's file list. The
libraries a task links (cuBLAS, cuBLASLt, cuDNN, cuRAND, cuFFT) come from the CUDA toolkit, the
system, or the nvidia-* wheels PyTorch depends on, in that order. The same names tell the
library rule (NO_LIBRARIES) what a build reached for.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grader.toolchain import ToolchainError


@dataclass(frozen=True)
class HeaderPackage:
    dist: str  # the PyPI distribution
    marker: str  # a header inside the include folder, relative to it
    what: str


HEADER_PACKAGES: dict[str, HeaderPackage] = {
    "nvidia-cudnn-frontend": HeaderPackage(
        "nvidia-cudnn-frontend", "cudnn_frontend.h", "the cuDNN frontend (C++ graph API)"
    ),
    "nvidia-cutlass": HeaderPackage("nvidia-cutlass", "cutlass/cutlass.h", "CUTLASS and CuTe"),
}


def install_hint(dist: str) -> str:
    # --no-deps: the headers are all the course needs; the wheels' Python extras are large
    return f".venv/bin/python -m pip install --no-deps {dist}"


def header_dir(dist: str) -> Path:
    """The include folder of an installed header wheel; ToolchainError naming the fix if absent."""
    pkg = HEADER_PACKAGES.get(dist)
    if pkg is None:
        raise ToolchainError(f"unknown header package {dist!r}: known are {', '.join(HEADER_PACKAGES)}")
    try:
        dist_obj = md.distribution(pkg.dist)
    except md.PackageNotFoundError:
        raise ToolchainError(f"{pkg.what} headers are not installed: {install_hint(pkg.dist)}") from None
    for f in dist_obj.files or []:
        if str(f).replace("\\", "/").endswith("/" + pkg.marker) or str(f) == pkg.marker:
            path = Path(str(dist_obj.locate_file(f)))
            folder = path
            for _ in pkg.marker.split("/"):
                folder = folder.parent
            if path.exists():
                return folder
    raise ToolchainError(
        f"{pkg.dist} {dist_obj.version} is installed but has no {pkg.marker}: reinstall it ({install_hint(pkg.dist)})"
    )


# --- Libraries a task may link (CudaTask.libraries) -----------------------------------------


@dataclass(frozen=True)
class LinkLibrary:
    name: str  # as a spec writes it, and as -l takes it: "cublas" links libcublas.so
    header: str  # the header its users include: where it is found is where the library's headers are
    wheels: tuple[str, ...]  # PyPI distributions that ship both, newest CUDA first
    what: str


LINK_LIBRARIES: dict[str, LinkLibrary] = {
    lib.name: lib
    for lib in (
        LinkLibrary("cublas", "cublas_v2.h", ("nvidia-cublas", "nvidia-cublas-cu12"), "cuBLAS"),
        LinkLibrary("cublasLt", "cublasLt.h", ("nvidia-cublas", "nvidia-cublas-cu12"), "cuBLASLt"),
        LinkLibrary("cudnn", "cudnn.h", ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"), "cuDNN"),
        LinkLibrary("curand", "curand.h", ("nvidia-curand", "nvidia-curand-cu12"), "cuRAND"),
        LinkLibrary("cufft", "cufft.h", ("nvidia-cufft", "nvidia-cufft-cu12"), "cuFFT"),
        # the cuDNN frontend's headers include nvrtc.h and call NVRTC (its runtime-compiled engines)
        LinkLibrary("nvrtc", "nvrtc.h", ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12"), "NVRTC"),
    )
}

# where a distribution's packages put shared libraries and headers without telling anyone
_MULTIARCH = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
SYSTEM_LIB_DIRS = (Path(f"/usr/lib/{_MULTIARCH}"), Path("/usr/lib64"), Path("/usr/lib"), Path(f"/lib/{_MULTIARCH}"))
SYSTEM_INCLUDE_DIRS = (Path("/usr/include"), Path(f"/usr/include/{_MULTIARCH}"))


@dataclass(frozen=True)
class FoundLibrary:
    """Where one library of a task was found, as nvcc's link line and the build cache need it."""

    name: str
    lib_dir: Path
    file: str  # the shared library's file name in lib_dir: libcublas.so or libcublas.so.13
    include_dir: Path | None  # None: on the compiler's own search path already
    version: str  # the wheel's version, or the library's resolved file name: part of the build key
    origin: str  # "the CUDA toolkit", "the system", or the wheel's name

    @property
    def link_flags(self) -> list[str]:
        # a wheel ships only libNAME.so.MAJOR, which plain -lNAME does not find
        flag = f"-l{self.name}" if self.file == f"lib{self.name}.so" else f"-l:{self.file}"
        flags = [f"-L{self.lib_dir}", flag]
        if not any(self.lib_dir == d for d in SYSTEM_LIB_DIRS):
            # the task process must find it again when it loads the library, without LD_LIBRARY_PATH
            flags += ["-Xlinker", f"-rpath={self.lib_dir}"]
        return flags


def _shared_lib(folder: Path, name: str) -> str | None:
    exact = folder / f"lib{name}.so"
    if exact.exists():
        return exact.name
    versioned = sorted(folder.glob(f"lib{name}.so.[0-9]*"), key=lambda p: len(p.name))
    return versioned[0].name if versioned else None


def _header_in(folders: Sequence[Path], header: str) -> Path | None:
    return next((d for d in folders if (d / header).is_file()), None)


def _from_wheel(lib: LinkLibrary) -> FoundLibrary | None:
    for dist in lib.wheels:
        try:
            d = md.distribution(dist)
        except md.PackageNotFoundError:
            continue
        lib_file = header_file = None
        for f in d.files or []:
            name = f.name
            if name == lib.header and header_file is None:
                header_file = Path(str(d.locate_file(f)))
            elif (name == f"lib{lib.name}.so" or name.startswith(f"lib{lib.name}.so.")) and lib_file is None:
                lib_file = Path(str(d.locate_file(f)))
        if lib_file is not None and header_file is not None and lib_file.exists():
            return FoundLibrary(lib.name, lib_file.parent, lib_file.name, header_file.parent, d.version, dist)
    return None


def find_library(name: str, toolkit_lib_dirs: Sequence[Path], toolkit_include_dirs: Sequence[Path]) -> FoundLibrary:
    """Where library `name` and its header are: the toolkit's, the system's, then an installed
    wheel's (the nvidia-* wheels torch itself depends on). ValueError for a name the course does
    not link (a spec error); ToolchainError naming the fix when it is not on this machine."""
    lib = LINK_LIBRARIES.get(name)
    if lib is None:
        raise ValueError(f"unknown library {name!r} in the task's libraries: known are {', '.join(LINK_LIBRARIES)}")
    # the compiler searches these already; naming /usr/include again with -I breaks #include_next
    default_includes = [*toolkit_include_dirs, *SYSTEM_INCLUDE_DIRS]
    for lib_dirs, origin in ((toolkit_lib_dirs, "the CUDA toolkit"), (SYSTEM_LIB_DIRS, "the system")):
        for lib_dir in lib_dirs:
            file = _shared_lib(lib_dir, name) if lib_dir.is_dir() else None
            if file is not None and _header_in(default_includes, lib.header) is not None:
                return FoundLibrary(name, lib_dir, file, None, (lib_dir / file).resolve().name, origin)
    found = _from_wheel(lib)
    if found is not None:
        return found
    where = ", ".join(map(str, toolkit_lib_dirs)) or "not found"
    raise ToolchainError(
        f"{lib.what} (lib{name}.so and {lib.header}) is not installed here: not in the CUDA toolkit ({where}), "
        f"the system's library folders or an installed wheel. Install the toolkit's {lib.what}, or: "
        f".venv/bin/python -m pip install {lib.wheels[0]}"
    )


# --- What belongs to a library, for the rule that forbids them (grader/tasks/rules.py) -------

# a header inside one of these folders belongs to that library (cccl/thrust/..., cutlass/..., torch/...)
LIBRARY_FOLDERS = ("thrust", "cub", "cutlass", "cute", "torch", "ATen", "c10")
# a header, folder, shared library or symbol whose name starts so belongs to a CUDA math library
LIBRARY_PREFIXES = ("cublas", "cudnn", "cufft", "curand", "cusparse", "cusolver")
_SONAME = re.compile(r"^lib(cublas\w*|cudnn\w*|cufft\w*|curand\w*|cusparse\w*|cusolver\w*|nvblas|torch\w*|c10\w*)\.so")
_SYMBOL = re.compile(r"^(cublas|cudnn|cufft|curand|cusparse|cusolver)\w*")


def library_of_header(path: str | Path, root: Path | None = None) -> str | None:
    """The library a header belongs to, judged by its path (below `root` when it lies there, so
    that the folder a repository was cloned into never counts), or None for everything else:
    the CUDA runtime, CCCL's libcu++ (cuda/std/...), the C++ library, the course's own headers."""
    p = Path(os.path.normpath(str(path)))
    if root is not None and p.is_absolute():
        try:
            p = p.relative_to(root)
        except ValueError:
            pass
    parts = p.parts
    for i, part in enumerate(parts):
        if part in LIBRARY_FOLDERS and i < len(parts) - 1:
            return part
        low = part.lower()
        for prefix in LIBRARY_PREFIXES:
            if low.startswith(prefix):
                return prefix
    return None


def library_of_soname(soname: str) -> str | None:
    m = _SONAME.match(soname)
    return m.group(1) if m else None


def library_of_symbol(symbol: str) -> str | None:
    m = _SYMBOL.match(symbol)
    return m.group(1) if m else None
