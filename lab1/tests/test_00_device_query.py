"""Checks for lab1/00_device_query.cu: the device's properties, and a first kernel."""

import ctypes

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, Int, Out


class DeviceInfo(ctypes.Structure):
    """Mirrors `struct DeviceInfo` in the task file, field for field."""

    _fields_ = [
        ("name", ctypes.c_char * 256),
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("sm_count", ctypes.c_int),
        ("warp_size", ctypes.c_int),
        ("max_threads_per_block", ctypes.c_int),
        ("max_threads_per_sm", ctypes.c_int),
        ("l2_cache_bytes", ctypes.c_int),
        ("total_global_mem", ctypes.c_ulonglong),
        ("shared_mem_per_block", ctypes.c_ulonglong),
    ]


def device_properties_match_torch(ctx: RunContext) -> None:
    import torch

    fn = ctx.lib.cdll.query_device
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(DeviceInfo)]
    info = DeviceInfo()
    ctypes.memset(ctypes.byref(info), 0xA5, ctypes.sizeof(info))
    ctx.check_rc("query_device", fn(0, ctypes.byref(info)), "device 0")
    props = torch.cuda.get_device_properties(0)
    expected = {
        "name": props.name,
        "major": props.major,
        "minor": props.minor,
        "sm_count": props.multi_processor_count,
        "total_global_mem": props.total_memory,
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "warp_size": getattr(props, "warp_size", 32),
        "max_threads_per_sm": getattr(props, "max_threads_per_multi_processor", None),
        "shared_mem_per_block": getattr(props, "shared_memory_per_block", None),
        "max_threads_per_block": 1024,
    }
    got = {name: getattr(info, name) for name, _ in DeviceInfo._fields_}
    got["name"] = info.name.decode(errors="replace")
    wrong = [f"{k}: got {got[k]!r}, expected {v!r}" for k, v in expected.items() if v is not None and got[k] != v]
    if wrong:
        ctx.fail("query_device filled DeviceInfo wrongly:\n  " + "\n  ".join(wrong))
    ctx.note(
        f"{got['name']}: compute capability {got['major']}.{got['minor']}, {got['sm_count']} SMs, "
        f"{got['total_global_mem'] / 2**30:.1f} GiB, L2 {got['l2_cache_bytes'] / 2**20:.0f} MiB, "
        f"{got['shared_mem_per_block'] // 1024} KiB shared memory per block, "
        f"{got['max_threads_per_sm']} threads per SM"
    )
    bad_index = torch.cuda.device_count() + 7
    if fn(bad_index, ctypes.byref(info)) == 0:
        ctx.fail(
            f"query_device({bad_index}) returned cudaSuccess for a device that does not exist: "
            "return the error cudaGetDeviceProperties reports (wrap it in CUDA_CHECK)"
        )


LAUNCHES = [(1, 1), (1, 32), (2, 33), (4, 256), (7, 1024), (1000, 96)]


def make_inputs(p, rng):
    return {"blocks": p["blocks"], "threads_per_block": p["threads"]}


def reference(v):
    import torch

    g = torch.arange(v["blocks"] * v["threads_per_block"], dtype=torch.int32)
    return {"block_ids": g // v["threads_per_block"], "thread_ids": g % v["threads_per_block"]}


TASK = CudaTask(
    lab="lab1",
    number="00",
    title="device query + first kernel",
    sources=["00_device_query.cu"],
    entries=[
        Entry(
            "whoami",
            [Out("block_ids", "i32"), Out("thread_ids", "i32"), Int("blocks"), Int("threads_per_block")],
            reference=reference,
        )
    ],
    cases=[Case(f"<<<{b},{t}>>>", blocks=b, threads=t) for b, t in LAUNCHES],
    make_inputs=make_inputs,
    rules=[NO_LIBRARIES],
    checks=[device_properties_match_torch],
    mistakes={
        "global index": "launches of several blocks (<<<2,33>>>, <<<1000,96>>>): a slot indexed by threadIdx.x "
        "alone is written by every block and the other slots stay unwritten",
        "swallowed error": "query_device on a device index that does not exist must return the error, not cudaSuccess",
    },
)


def test_device_query(grade):
    grade(TASK)
