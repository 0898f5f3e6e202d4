"""Header-only libraries that come from PyPI wheels: where their headers landed.

The course never clones a library: the cuDNN frontend and CUTLASS (with CuTe) are installed as
wheels, and their include folders are found through the installed distribution's file list.
"""

from __future__ import annotations

import importlib.metadata as md
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
