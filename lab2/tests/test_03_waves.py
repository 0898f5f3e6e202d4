"""Checks for lab2/03_waves.cu: the occupancy of two given kernels, the SM count and the number of
waves a grid takes, all against the GPU the task runs on (no card is assumed).

The expected occupancy comes from the driver's own calculator (cuOccupancyMaxActiveBlocksPerMultiprocessor
in libcuda), asked about the very kernels the student's library holds, through kernel_handle, given in
the file: the same registers, the same static shared memory, the same device. The SM count is torch's
multi_processor_count. On an H100 or an A100 each limit decides at least one configuration: threads
(1024 and 256 threads), threads counted in whole warps (100 threads), the 32-block cap per SM (32
threads, 1 thread), shared memory (8, 40 and 48 KiB of dynamic shared memory per block, plus the 1 KiB
the driver reserves for each block), registers (heavy_kernel: 84 registers per thread for sm_90 under
CUDA 13), and a block that does not fit at all (heavy_kernel with 1024 threads: 0 blocks).
maxThreadsPerMultiProcessor / threads, which ignores every limit but one, is wrong for 9 of the 11.

There is no tolerance: every answer is an integer and must be exact. waves is checked on edges (no
blocks, one block short of a wave, one block past it), on multiples of the device's own wave, and past
2^53, where a double no longer holds every integer (ceil((double)b / w) is then wrong).

run_busy, given, is checked like any entry point: each thread writes its block index after its block
has spun for SPIN_CYCLES clock cycles. The tail effect itself (one block past a full wave doubling the
time) is explained in the chapter, not timed here: timing never decides a verdict.

The configurations with 8, 40 and 48 KiB of dynamic shared memory per block fail an occupancy
asked without it. The student derives the occupancy from the kernel's resources (a compiled rule:
occupancy_report reaches cudaFuncGetAttributes and no occupancy calculator), so each rounding the
chapter teaches must change an answer: heavy_kernel with 96 threads fails a register count that
ignores the quarters of the file (7 blocks, not 6), busy_kernel with 64 threads and 8 KiB one that
leaves out the reserved kilobyte (28, not 25).
"""

import ctypes

from grader.child.context import RunContext
from grader.child.ffi import HarnessError
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, Int, Out, Rule
from grader.tasks.rules import calls, never_calls

BUSY, HEAVY = 0, 1
NAMES = {BUSY: "busy_kernel", HEAVY: "heavy_kernel"}
KIB = 1024

# (kernel, threads per block, dynamic shared memory per block in bytes): what limits each on an
# H100 or A100 is in the docstring; the expected numbers are the driver's on the GPU at hand.
CONFIGS = [
    (BUSY, 1024, 0),
    (BUSY, 256, 0),
    (BUSY, 256, 40 * KIB),
    (BUSY, 128, 48 * KIB),
    (BUSY, 100, 0),
    (BUSY, 32, 0),
    (BUSY, 1, 0),
    (BUSY, 64, 8 * KIB),
    (HEAVY, 256, 0),
    (HEAVY, 96, 0),
    (HEAVY, 1024, 0),
]

SENTINEL = -7  # written into every output before the call: left there means never written


def _driver() -> ctypes.CDLL:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")  # torch has initialised it already
    except OSError as e:
        raise HarnessError(f"libcuda.so.1 does not load: {e}") from e
    return cuda


def _handle(ctx: RunContext, kernel: int) -> ctypes.c_void_p:
    fn = ctx.lib.cdll.kernel_handle
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    handle = ctypes.c_void_p()
    ctx.check_rc("kernel_handle", fn(kernel, ctypes.byref(handle)), NAMES[kernel])
    return handle


def _driver_blocks_per_sm(cuda: ctypes.CDLL, handle: ctypes.c_void_p, threads: int, smem: int) -> int:
    n = ctypes.c_int()
    rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), handle, ctypes.c_int(threads), ctypes.c_size_t(smem)
    )
    if rc != 0:
        raise HarnessError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed ({rc}) for {threads} threads, {smem} B")
    return n.value


def _function_attribute(cuda: ctypes.CDLL, handle: ctypes.c_void_p, attribute: int) -> int | None:
    value = ctypes.c_int()
    return value.value if cuda.cuFuncGetAttribute(ctypes.byref(value), attribute, handle) == 0 else None


def _described(kernel: int, threads: int, smem: int) -> str:
    shared = f" and {smem} B of dynamic shared memory" if smem else ""
    return f"{NAMES[kernel]} with {threads} threads{shared}"


def occupancy_matches_the_driver(ctx: RunContext) -> None:
    """Every configuration of CONFIGS: blocks_per_sm as the driver computes it for the same kernel,
    sms as torch reports it, blocks_per_wave their product."""
    import torch

    fn = ctx.lib.cdll.occupancy_report
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_longlong),
    ]
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    sms_expected = props.multi_processor_count
    threads_per_sm = props.max_threads_per_multi_processor
    cuda = _driver()
    handles = {k: _handle(ctx, k) for k in NAMES}
    registers = {k: _function_attribute(cuda, h, 4) for k, h in handles.items()}  # CU_FUNC_ATTRIBUTE_NUM_REGS
    for kernel, threads, smem in CONFIGS:
        config = _described(kernel, threads, smem)
        where = f"occupancy_report for {config}"
        per_sm = _driver_blocks_per_sm(cuda, handles[kernel], threads, smem)
        bps, sms, bpw = ctypes.c_int(SENTINEL), ctypes.c_int(SENTINEL), ctypes.c_longlong(SENTINEL)
        rc = fn(kernel, threads, smem, ctypes.byref(bps), ctypes.byref(sms), ctypes.byref(bpw))
        ctx.check_rc("occupancy_report", rc, config)
        got = {"blocks_per_sm": bps.value, "sms": sms.value, "blocks_per_wave": bpw.value}
        unwritten = [name for name, value in got.items() if value == SENTINEL]
        if unwritten:
            ctx.fail(f"{where}: {', '.join(unwritten)} never written (still {SENTINEL}, as the grader filled it)")
        if sms.value != sms_expected:
            ctx.fail(
                f"{where}: sms = {sms.value}, but this GPU ({props.name}) has {sms_expected} SMs: ask the device "
                "(cudaDevAttrMultiProcessorCount), cards of one name differ"
            )
        if bps.value != per_sm:
            regs = f"{registers[kernel]} registers per thread, " if registers[kernel] is not None else ""
            hint = ""
            if bps.value == threads_per_sm // threads:
                hint = (
                    f"; {bps.value} is maxThreadsPerMultiProcessor / threads, which counts threads only: "
                    "registers, shared memory, whole warps and the per-SM block cap limit a block too"
                )
            ctx.fail(
                f"{where}: blocks_per_sm = {bps.value}, but the driver's occupancy calculator says {per_sm} "
                f"for this kernel ({regs}on {props.name}){hint}"
            )
        if bpw.value != per_sm * sms_expected:
            ctx.fail(
                f"{where}: blocks_per_wave = {bpw.value}, expected blocks_per_sm × sms = "
                f"{per_sm} × {sms_expected} = {per_sm * sms_expected}"
            )
    ctx.note(
        f"{props.name}: {sms_expected} SMs; busy_kernel with 1024 threads: "
        f"{_driver_blocks_per_sm(cuda, handles[BUSY], 1024, 0) * sms_expected} blocks per wave"
    )


# (blocks, blocks per wave), on top of the multiples of the device's own wave
WAVES = [
    (0, 1),
    (0, 264),
    (1, 1),
    (1, 264),
    (263, 264),
    (264, 264),
    (265, 264),
    (528, 264),
    (529, 264),
    (216, 216),
    (217, 216),
    (7, 3),
    ((1 << 53) + 1, 1),  # a double rounds 2^53 + 1 to 2^53
    ((1 << 53) + 1, 2),
    ((1 << 62) - 1, 3),
    (1 << 62, 3),
    (1 << 62, (1 << 62) - 1),
    (1 << 62, 1 << 62),
]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def waves_round_up(ctx: RunContext) -> None:
    """waves(blocks, per_wave) on WAVES and around k whole waves of busy_kernel with 1024 threads on
    this device (k = 1, 2, 3): one block short, exactly k, one block past."""
    import torch

    fn = ctx.lib.cdll.waves
    fn.restype = ctypes.c_longlong
    fn.argtypes = [ctypes.c_longlong, ctypes.c_longlong]
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    per_wave = _driver_blocks_per_sm(_driver(), _handle(ctx, BUSY), 1024, 0) * props.multi_processor_count
    device = [(k * per_wave + d, per_wave) for k in (1, 2, 3) for d in (-1, 0, 1)]
    for blocks, per in WAVES + device:
        got = fn(blocks, per)
        expected = _ceil_div(blocks, per)
        if got != expected:
            why = ""
            if got == blocks // per:
                why = ": a partly filled last wave still costs a whole wave (round up, not down)"
            elif blocks > 1 << 53:
                why = ": past 2^53 a double cannot hold every integer; stay in integers"
            ctx.fail(f"waves({blocks}, {per}) returned {got}, expected {expected}{why}")


LAUNCHES = [(1, 1), (2, 33), (133, 256), (1000, 100), (265, 1024)]


def make_inputs(p, rng):
    return {"blocks": p["blocks"], "threads": p["threads"]}


def reference(v):
    import torch

    g = torch.arange(v["blocks"] * v["threads"], dtype=torch.int32)
    return {"block_ids": g // v["threads"]}


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "threads-only occupancy": "occupancy_matches_the_driver: limits of registers, shared memory, warps, block cap",
    "calculator as the answer": "the compiled rule: occupancy_report reaches no cudaOccupancy*/cuOccupancy* call",
    "register rounding": "occupancy_matches_the_driver's heavy_kernel with 96 threads: per warp rounded up to 256"
    " registers and placed per quarter of the file (16 384 / 2816 = 5 warps a quarter, 20 an SM: 6 blocks),"
    " not 65 536 / 2816 = 23 warps (7 blocks)",
    "reserved shared memory": "occupancy_matches_the_driver's busy_kernel with 64 threads and 8 KiB: 9 KiB a block"
    " with the driver's reserved kilobyte, 25 blocks, not 228 / 8 = 28",
    "dynamic shared memory": "occupancy_matches_the_driver's 8, 40 and 48 KiB of dynamic shared memory per block",
    "hard-coded device": "the source rule on the SM count, and torch's SM count on any card but an H100 SXM or H200",
    "waves rounded down": "waves_round_up: one block past a whole wave",
    "double past 2^53": "waves_round_up's block counts past 2^53",
}

TASK = CudaTask(
    lab="lab2",
    number="03",
    title="waves and tails",
    mistakes=MISTAKES,
    sources=["03_waves.cu"],
    entries=[Entry("run_busy", [Out("block_ids", "i32"), Int("blocks"), Int("threads")], reference=reference)],
    cases=[Case(f"<<<{b},{t}>>>", blocks=b, threads=t) for b, t in LAUNCHES],
    make_inputs=make_inputs,
    rules=[
        NO_LIBRARIES,
        Rule(
            "require",
            r"cudaDevAttrMultiProcessorCount|multiProcessorCount",
            "the SM count comes from the device (cudaDevAttrMultiProcessorCount), never from a constant: "
            "an H100 SXM has 132 SMs, an H100 PCIe 114, an A100 108",
        ),
        # the compiled half: occupancy_report's own code asks the device (a call in a helper it
        # never calls does not count); the attribute's name is a constant, which only the text shows
        calls(
            "cudaDeviceGetAttribute|cudaGetDeviceProperties",
            "the SM count comes from the device (cudaDeviceGetAttribute), never from a constant",
            entries="occupancy_report",
        ),
        # the lesson is the derivation: the kernel's own resources, then the four limits by hand. The
        # runtime's and the driver's calculators (and cuda_occupancy.h's, where not inlined away) are
        # what the grader checks against, so they may not be the answer
        calls(
            "cudaFuncGetAttributes|cudaFuncGetAttribute",
            "blocks per SM come from the kernel's own resources: cudaFuncGetAttributes gives its registers"
            " and static shared memory",
            entries="occupancy_report",
        ),
        never_calls(
            r"(?:.* )?(?:cudaOccupancy|cudaOcc|cuOccupancy)\w*(?:<.*)?(?:\(.*)?",
            "derive blocks per SM from the resources, as the chapter's worked example does: the occupancy"
            " calculator is the grader's check, not the answer",
            entries="occupancy_report",
        ),
    ],
    checks=[occupancy_matches_the_driver, waves_round_up],
)


def test_waves(grade):
    grade(TASK)
