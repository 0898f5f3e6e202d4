"""nvcc's phases side by side: one `.cu` compiled by the tools nvcc runs, in two chains at once.

nvcc runs its phases one after the other, and for a small task file each costs a few tenths of a
second, whatever the kernel: the host preprocess and cudafe++ (which splits host from device
code), the device preprocess, cicc and ptxas, then the host compile. Only the host compile needs
both sides' output; the two chains before it share nothing but the module id, a name cudafe++
invents and cicc reads. Written here first, it lets the chains run at once: on an H200 host the
build of lab 1's task 01 took 1.37 s, most of it these phases; with the chains side by side,
which take the longer chain's time, not the sum, 0.79-0.91 s (`make bench-grader`).

`script()` asks nvcc itself what it would run (`nvcc --dryrun`), checks that the plan has the one
shape this module knows (one device architecture: host preprocess, device preprocess, cudafe++,
cicc, ptxas, fatbinary, host compile), and writes the same commands as a shell script:
    host chain:    gcc -E (host)   -> cudafe++                  \
                                                                 -> gcc -c (host compile) -> .o
    device chain:  gcc -E (device) -> cicc -> ptxas -> fatbinary /
Anything else (another nvcc, more architectures, -rdc's extra steps, a path the shell would read
differently) gets None, and the caller runs nvcc as usual. So do builds with
GRADER_NVCC_PHASES=0. What the log shows is what nvcc would show: the host chain's messages
(cudafe++ reports the front end's errors and warnings), then, only when that chain succeeded,
the device chain's (ptxas's resource lines; a device-only error), then the host compile's: a
syntax error is reported once, as nvcc reports it.

The dependency file nvcc writes with -MD lists the headers both preprocessors read; each
preprocess here writes its own, appended into one file of two rules (nvcc.py reads every rule).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import zlib
from pathlib import Path

ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([^\s\"'$`\\]*)$")  # a plain one, safe to export
QUOTED_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # INCLUDES="...": nvcc's own, unused by the phases
UNSAFE = re.compile(r"[$`\\]")  # beyond "$CICC_PATH", what sh would expand in a path nvcc quoted
DEVICE_CHAIN = ["cicc", "ptxas", "fatbinary"]


def enabled() -> bool:
    return os.environ.get("GRADER_NVCC_PHASES", "1") != "0"


def _tool(command: str) -> str:
    """The program a command runs, by name: "gcc", "cicc" (from "$CICC_PATH/cicc")."""
    m = re.match(r'"?([^"\s]+)', command)
    return m[1].rsplit("/", 1)[-1] if m else ""


def _module_id(src: Path) -> str:
    """A module id of the shape cudafe++ gives (`_<hash>_<length>_<name>_<hash>`): unique per
    source path and content, as the objects of one library need."""
    name = re.sub(r"\W", "_", src.name)
    where = zlib.crc32(str(src.resolve()).encode())
    what = zlib.crc32(src.read_bytes())
    return f"_{where:08x}_{len(name)}_{name}_{what:08x}"


def plan(command: list[str]) -> tuple[list[str], list[str]] | None:
    """nvcc's plan for `command`: (the environment it sets, as exports; the commands, as nvcc
    prints them), or None when nvcc cannot say."""
    try:
        dry = subprocess.run(
            [command[0], "--dryrun", *command[1:]], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if dry.returncode != 0:
        return None
    exports, commands = [], []
    for line in dry.stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:].strip()
        if m := ASSIGNMENT.match(body):
            exports.append(f"export {m[1]}={shlex.quote(m[2])}")
        elif not QUOTED_ASSIGNMENT.match(body):
            commands.append(body)
    return exports, commands


def script(command: list[str], src: Path, obj: Path, depfile: Path | None, keep: Path) -> str | None:
    """A shell script that compiles `src` to `obj` as `command` (nvcc ... -c src -o obj, with
    --keep-dir `keep` and, when `depfile`, -MD -MF depfile) would, its two chains at once; None
    when nvcc's plan is not the one shape this module knows."""
    if not enabled() or src.suffix != ".cu" or "--keep" not in command:
        return None
    found = plan(command)
    if found is None:
        return None
    exports, commands = found
    if any(UNSAFE.search(c.replace('"$CICC_PATH/cicc"', "")) for c in commands):
        return None
    if depfile is not None:
        # nvcc's own dependency pass: replaced by each preprocess writing its rule
        filtered = [c for c in commands if not c.startswith("-- Filter Dependencies --")]
        if len(filtered) != len(commands) - 1:
            return None
        commands = filtered
    tools = [_tool(c) for c in commands]
    host = tools[0] if tools and tools[0] in ("gcc", "g++", "clang", "clang++") else ""
    if tools != [host, host, "cudafe++", *DEVICE_CHAIN, host]:
        return None
    device_pp, host_pp, frontend, cicc, ptxas, fatbinary, host_compile = commands
    if (
        " -E " not in device_pp
        or " -E " not in host_pp
        or "-D__CUDA_ARCH__=" not in device_pp
        or "-D__CUDA_ARCH__=" in host_pp
        or " -c " not in host_compile
        or "--gen_module_id_file " not in frontend
    ):
        return None
    module = re.search(r'--module_id_file_name "([^"]+)"', frontend)
    if module is None or f'--module_id_file_name "{module[1]}"' not in cicc:
        return None
    frontend = frontend.replace("--gen_module_id_file ", "")  # it reads the id written below
    device_log = keep / "device-chain.log"
    if depfile is not None:
        device_deps = keep / "device.d"
        q = shlex.quote
        host_pp += f" -MD -MF {q(str(depfile))} -MT {q(str(obj))}"
        device_pp += f" -MD -MF {q(str(device_deps))} -MT {q(str(obj))}"
    lines = [
        "# nvcc's phases for one .cu, the host chain and the device chain at once (grader/build/phases.py)",
        *exports,
        f"printf '%s' {_module_id(src)} > {shlex.quote(module[1])}",
        f"( {' && '.join([device_pp, cicc, ptxas, fatbinary])} ) > {shlex.quote(str(device_log))} 2>&1 &",
        "device=$!",
        f"{host_pp} && {frontend}",
        "host=$?",
        "wait $device",
        "status=$?",
        # the front end's errors come from cudafe++; cicc's copy of them is not shown again
        "if [ $host -ne 0 ]; then exit $host; fi",
        f"cat {shlex.quote(str(device_log))}",
        "if [ $status -ne 0 ]; then exit $status; fi",
    ]
    if depfile is not None:
        lines.append(f"cat {shlex.quote(str(keep / 'device.d'))} >> {shlex.quote(str(depfile))}")
    lines.append(host_compile)
    return "\n".join(lines) + "\n"
