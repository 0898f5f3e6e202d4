"""Checks for lab6/01_peer.cu: the peer-access matrix, and a copy from device 1 to device 0 made by a
kernel on device 0 that reads device 1's memory through peer access. Needs 2 GPUs that are peers
(skipped, naming the counts, on a machine that shows fewer; skipped by `devices_are_peers` where
devices 0 and 1 cannot reach each other).

How the harness places things (grader/child/devices.py): dst is allocated on device 0, src is drawn
on device 0 and moved to device 1 through the host, keeping its offset from the 16-byte grid, and
the reference is computed on CPU copies. Nothing the grader does before the student's first call
copies between the two devices, because torch enables peer access the first time it does: a
submission that never enables it must find it disabled. Each call is made with device 0 current
and every device idle; a long sleep is then queued on device 1, so a kernel launched there
instead of on device 0 cannot be finished when the outputs are read: the outputs are wrong until
the grader waits for both devices, and the verdict says the work ran on another device. A call must
leave device 0 current.

Cases: n = 1 and 3 (all tail, nothing for a float4), 1000 (whole float4s), 2^20 + 1 (one float
after the last float4, past one wave of blocks), 2^26 (256 MB, the timing case), src one float
into its buffer at n = 3 and 1001 (4 bytes past the 16-byte grid: a float4 load of it is a
misaligned address), and past 2^31 elements under `make grade` (size_t indices). Every case is
called at least twice (the second run, then once more on refilled buffers), so an enable that
reports cudaErrorPeerAccessAlreadyEnabled on the second call is seen. peer_can_access is compared
with torch.cuda.can_device_access_peer on every case, for the task's 2 devices and, in one case,
for every device the process sees. The copy is exact: tolerance 0.

Timing: CUDA events on device 0; the baseline is torch's `dst.copy_(src)`, a copy-engine copy (the
first one enables peer access in torch, so from then on it is a cudaMemcpyAsync between the
devices, over the link); bytes_moved is the 4n bytes that cross the link.
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, HostOut, In, Int, Out, PerfTarget, Size, Verdict
from grader.tasks.rules import executes, never_calls

TIMING = 1 << 26
HUGE = (1 << 31) + 5


def make_inputs(p, rng):
    import torch

    n, offset = p["n"], p.get("offset", 0)
    src = rng.randn(n + offset)[offset:]  # offset 1: 4 bytes past the 16-byte grid
    devices = p.get("devices", 2)
    if str(rng.device).startswith("cuda"):
        count = torch.cuda.device_count() if devices == "all" else devices
        pairs = [[i != j and torch.cuda.can_device_access_peer(i, j) for j in range(count)] for i in range(count)]
    else:  # calibration, on the CPU: two devices that reach each other
        count = 2
        pairs = [[i != j for j in range(count)] for i in range(count)]
    access = torch.tensor(pairs, dtype=torch.int32).flatten()
    return {"src": src, "n": n, "devices": count, "access": access}


def access_reference(v):
    return {"out": v["access"].clone()}


def copy_reference(v):
    return {"dst": v["src"].clone()}


def copy_engine(v, o):
    o["dst"].copy_(v["src"])


def devices_are_peers(ctx: RunContext) -> None:
    """peer_copy needs device 0 to reach device 1; a machine where it cannot is not graded here."""
    import torch

    if not torch.cuda.can_device_access_peer(0, 1):
        ctx.fail(
            "devices 0 and 1 of this machine cannot access each other's memory (cudaDeviceCanAccessPeer says 0: "
            "`nvidia-smi topo -m` shows the path between them): run on a machine whose GPUs are peers",
            Verdict.SKIPPED,
        )


MISTAKES = {
    "peer access not enabled": "every case of peer_copy: a kernel on device 0 reading device 1's memory faults "
    "unless device 0's access to it was enabled (UVA alone gives the address, not the mapping)",
    "already enabled": "each case calls peer_copy again: the second enable reports "
    "cudaErrorPeerAccessAlreadyEnabled, and left in the last error it comes back from cudaGetLastError",
    "tail": "n = 1, 3 and 2^20 + 1: floats after the last whole float4",
    "unaligned pointer": "src one float into its buffer (n = 3 and 1001): a float4 load there is misaligned",
    "wrong device": "the sleep queued on device 1 before each call: a kernel launched on device 1 has not run when "
    "the outputs are read",
    "diagonal": "peer_can_access against torch.cuda.can_device_access_peer: 0 on the diagonal",
    "copy engine": "the rule on the build: peer_copy's code reaches no cudaMemcpy*",
}

TASK = CudaTask(
    lab="lab6",
    number="01",
    title="peer memory",
    sources=["01_peer.cu"],
    gpus=2,
    timeout=120,  # 256 MB draws travel to device 1 through the host, and each call waits out a sleep there
    mistakes=MISTAKES,
    entries=[
        Entry("peer_can_access", [HostOut("out", "i32"), Int("devices")], reference=access_reference),
        Entry(
            "peer_copy",
            [Out("dst", device=0), In("src", device=1), Size("n")],
            reference=copy_reference,
            baseline=copy_engine,
            bytes_moved=lambda v: 4 * v["n"],  # what crosses the link
        ),
    ],
    cases=[
        Case("n=1", n=1),
        Case("n=3", n=3),
        Case("n=1000", n=1000),
        Case("n=3, src one float in", n=3, offset=1),
        Case("n=1001, src one float in", n=1001, offset=1),
        Case("n=1000, every visible GPU", n=1000, devices="all"),
        Case("n=2^20+1", n=(1 << 20) + 1),
        Case("n=2^26", n=TIMING),
        Case("n=2^31+5", huge=True, n=HUGE),
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},  # a copy is exact
    timing_case="n=2^26",
    checks=[devices_are_peers],
    rules=[
        NO_LIBRARIES,
        never_calls(
            r"cudaMemcpy\w*|cuMemcpy\w*",
            "peer_copy is a kernel that reads the peer's memory: the copy engine (cudaMemcpyPeer*, cudaMemcpy*) is "
            "the baseline it is timed against",
            "peer_copy",
        ),
        executes(
            r"LDG(\.\w+)*\.128",
            "peer_copy loads 16 bytes at a time (float4) where dst and src allow it",
            "peer_copy",
            each_call=False,
        ),
    ],
    # the ratio a kernel's loads over NVLink reach against the copy engine: the lead sets the target
    # (and makes it a gate) from a measurement on a machine of two H100s
    perf=[PerfTarget("peer_copy", "speedup", 0.85, 2, gate=False)],  # reference: 0.96x on 2 H200s
)


def test_peer(grade):
    grade(TASK)
