"""Timing student entry points so that the figures cannot be gamed: alone on a task's timing case,
or as the rungs of a ladder over a sweep of sizes, interleaved with the library baselines.

Every rung's timed calls rotate over K buffer sets (distinct seeded inputs, distinct guarded
outputs) that get a fresh draw of inputs every round (timing.Rotation). Before each call,
outside the timed region, that set's outputs are re-poisoned (PREFILL) and L2 is flushed; after
its end event a check on the device counts wrong and never-written elements against bounds
computed once per dataset (timing.Bounds), without the host waiting. The counts are read once,
at the end: a call that skipped its work or replayed an earlier result shows up there. The
figures are then held against the card's limits (timing.Limits): past them, the measurement is
void. Either way the grader first asks whether the work simply ran on a stream it does not wait
on, and says so when it did.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grader.child import devices, timing
from grader.child.buffers import PREFILL, Guarded, bits, twin
from grader.child.context import returned_error
from grader.child.cudalib import check_outputs, prepare, seeded_inputs, stream_failure
from grader.child.ffi import EntryPoint
from grader.records import CheckFailure, Stage, Timing, Verdict
from grader.tasks.spec import Case, CudaTask, Entry, Scalar, Values

if TYPE_CHECKING:
    import torch

    from grader.child.__main__ import Recorder

Baselines = Mapping[str, Callable[[Values, Values], Any]]
SLEEP_CYCLES = 100_000_000  # about 50 ms at a 2 GHz SM clock: far longer than a timing case's call


def _nbytes(values: Mapping[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values.values() if hasattr(v, "element_size"))


@dataclass
class Dataset:
    """One seeded draw of a case's inputs and what each rung's outputs must then hold. Its `in`
    tensors start as one slot's inputs and then travel from slot to slot; `expected` and `bounds`
    stay with the draw."""

    inputs: Values
    expected: dict[str, Values]  # rung symbol -> output name -> reference
    bounds: dict[str, dict[str, timing.Bounds]]  # rung symbol -> output name -> bounds


def draw(task: CudaTask, entries: Sequence[Entry], case: Case, k: int) -> Dataset:
    inputs = seeded_inputs(task, entries, case, k)
    expected: dict[str, Values] = {}
    bounds: dict[str, dict[str, timing.Bounds]] = {}
    by_reference: dict[int, Values] = {}  # rungs of one operation usually share their reference
    for e in entries:
        ref = by_reference.get(id(e.reference))
        if ref is None:
            ref = by_reference[id(e.reference)] = devices.reference(task, e, inputs)
        expected[e.symbol] = ref
        shapes = task.shapes(inputs, ref)
        bounds[e.symbol] = {
            b.name: timing.Bounds.of(ref[b.name].to(devices.where(b)), b.dtype, *task.tol(b.dtype, e), shapes[b.name])
            for b in e.buffers()
            if b.role != "in"
        }
    return Dataset(inputs, expected, bounds)


class BufferSets:
    """The K datasets of one case and the slots their inputs live in, shared by every rung."""

    def __init__(self, task: CudaTask, entries: Sequence[Entry], case: Case, wanted: int = timing.SETS) -> None:
        import torch

        first = draw(task, entries, case, 0)
        outputs = sum(
            _nbytes({b.name: first.expected[e.symbol][b.name] for b in e.buffers() if b.role != "in"}) for e in entries
        )
        per_set = _nbytes(first.inputs) + 4 * outputs  # inputs, reference, bounds and the guarded outputs
        host = any(e.host for e in entries)
        if host:
            free = 1 << 40
        else:
            free, _ = torch.cuda.mem_get_info()
            free += torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        k = timing.choose_sets(per_set, free, wanted)
        self.task, self.entries, self.case = task, entries, case
        self.datasets = [first] + [draw(task, entries, case, i) for i in range(1, k)]
        self.rotation = timing.Rotation(k)
        names = {b.name for e in entries for b in e.buffers("in")}
        # the tensors whose pointers the calls see; each round's draw is copied into them
        self.slots: list[dict[str, torch.Tensor]] = [{n: d.inputs[n] for n in names} for d in self.datasets]
        self.generation = 0

    @property
    def sets(self) -> int:
        return self.rotation.sets

    def each_rep(self, rep: int) -> None:
        """Before a repetition (untimed): a fresh draw into the slot it is about to use. Only that
        slot: the others keep the draw their latest call saw, which the re-check after timing uses."""
        if not self.rotation.refresh_before(rep):
            return
        self.generation += 1
        s = self.rotation.slot(rep)
        new = draw(self.task, self.entries, self.case, self.rotation.draw(rep))
        for name, tensor in self.slots[s].items():
            tensor.copy_(new.inputs[name])
        new.inputs.update(self.slots[s])
        self.datasets[s] = new

    def holding(self, slot: int) -> int:
        """The dataset whose inputs `slot` holds now."""
        return slot


class Rung:
    """One student entry point, timed over the rotating buffer sets, with its outputs checked
    after every call."""

    def __init__(
        self,
        task: CudaTask,
        entry: Entry,
        ep: EntryPoint,
        sets: BufferSets,
        limits: timing.Limits,
        max_reps: int,
        where: str,
    ) -> None:
        import torch

        self.task, self.entry, self.ep, self.sets, self.limits, self.where = task, entry, ep, sets, limits, where
        self.roles = {b.name: b.role for b in entry.buffers() if b.role != "in"}
        self.scalars = [a.name for a in entry.args if isinstance(a, Scalar)]
        self.values: list[dict[str, Any]] = []
        self.outs: list[dict[str, Guarded]] = []
        for d in sets.datasets:
            shapes = task.shapes(d.inputs, d.expected[entry.symbol])
            values, outs = prepare(task, entry, d.inputs, shapes)
            self.values.append(values)
            self.outs.append(outs)
        self._marshalled: dict[tuple[int, int], list[Any]] = {}
        device = "cpu" if entry.host else "cuda"
        self.bad = torch.zeros(max_reps, dtype=torch.int64, device=device)
        self.unwritten = torch.zeros(max_reps, dtype=torch.int64, device=device)
        self.rc, self.rc_rep = 0, -1
        self._args: list[Any] = []

    def marshalled(self, slot: int, dataset: int) -> list[Any]:
        """The slot's pointers with the dataset's scalars (alpha, ...), marshalled once."""
        key = (slot, dataset, self.sets.generation)  # a new draw brings new scalars (alpha, ...)
        if key not in self._marshalled:
            if self._marshalled and next(iter(self._marshalled))[2] != self.sets.generation:
                self._marshalled.clear()
            scalars = {n: self.sets.datasets[dataset].inputs[n] for n in self.scalars}
            self._marshalled[key] = self.ep.marshal({**self.values[slot], **scalars})
        return self._marshalled[key]

    def poison(self, slot: int, dataset: int) -> None:
        for name, g in self.outs[slot].items():
            if self.roles[name] == "out":
                bits(g.data, g.dtype).fill_(PREFILL[g.dtype])
            else:  # in-place: back to the dataset's starting value
                g.data.copy_(self.sets.datasets[dataset].inputs[name].reshape(g.shape))

    def prepare(self, rep: int) -> None:
        slot, d = self.sets.rotation.slot(rep), self.sets.rotation.dataset(rep)
        self.poison(slot, d)
        self._args = self.marshalled(slot, d)

    def run(self, rep: int) -> None:
        rc = self.ep.call_raw(self._args)
        if rc != 0 and self.rc == 0:
            self.rc, self.rc_rep = rc, rep

    def check(self, rep: int) -> None:
        slot, d = self.sets.rotation.slot(rep), self.sets.rotation.dataset(rep)
        bounds = self.sets.datasets[d].bounds[self.entry.symbol]
        for name, g in self.outs[slot].items():
            # an output on another device of the task is counted there, its count brought here
            # (after the cases: a copy between devices may enable peer access by then)
            self.bad[rep] += bounds[name].count_bad(g.data).to(self.bad.device)
            if self.roles[name] == "out":
                self.unwritten[rep] += bounds[name].count_unwritten(g.data).to(self.bad.device)

    def subject(self) -> timing.Subject:
        return timing.Subject(run=self.run, prepare=self.prepare, check=self.check)

    # --- after the timing: what the counts and the figures say ---------------------------------

    def verify(self, n: int) -> None:
        """Raises the verdict when a timed call failed, skipped its work or left wrong outputs."""
        if self.rc != 0:
            raise CheckFailure(
                Verdict.CRASH, returned_error(self.ep.lib, self.entry.symbol, self.rc, f"{self.where} (a timed call)")
            )
        bad = self.bad[:n].tolist()
        unwritten = self.unwritten[:n].tolist()
        failed = [r for r in range(n) if bad[r] > 0]
        if failed:
            if self.on_private_stream():
                raise stream_failure(self.where)
            if self.skips_repeats():
                raise CheckFailure(
                    Verdict.WRONG,
                    f"{self.where}: the timed calls were not all computed: {len(failed)} of {n} left wrong outputs, "
                    f"and the grader saw why: called twice in a row with the same arguments, the first call computed "
                    f"its outputs and the second left the grader's poison in them. Each call must compute its "
                    f"outputs from its inputs, even when the arguments repeat.",
                )
            worst = max(failed, key=lambda r: bad[r])
            detail = f"after the worst, {bad[worst]} elements were wrong"
            if unwritten[worst]:
                detail += f", {unwritten[worst]} of them never written (the grader's poison was still there)"
            raise CheckFailure(
                Verdict.WRONG,
                f"{self.where}: the timed calls were not all computed: {len(failed)} of {n} timed calls left wrong "
                f"outputs; {detail}. Results replayed from an earlier call, or work skipped when called again with "
                f"the same arguments? The grader rotates {self.sets.sets} buffer sets, draws fresh inputs into them "
                f"every round and poisons every output before each call: each call must compute its outputs from its "
                f"inputs.",
            )
        rot = self.sets.rotation
        for slot in range(self.sets.sets):
            used = [r for r in range(n) if rot.slot(r) == slot]
            if used:  # the full judge, with its report, on what each set's last call left
                d = rot.dataset(used[-1])
                where = f"{self.where}, re-checked after timing"
                check_outputs(
                    self.task, self.entry, self.outs[slot], self.sets.datasets[d].expected[self.entry.symbol], where
                )

    def on_private_stream(self) -> bool:
        """True when the work ran on a stream that torch's stream does not wait for (a private
        non-blocking one). Two calls, in order, each on its own buffer set (so that code which
        skips a call repeating the last one's arguments computes both): the first waited for, so
        its outputs must come out right; the second queued behind a long sleep and its poison on
        torch's stream. Work on torch's stream (or the legacy default stream, or a blocking
        stream) runs after the poison and is right; work on a private non-blocking stream runs
        during the sleep, and the poison then covers it."""
        import torch

        if self.entry.host:  # host-pointer entries copy synchronously: nothing escapes
            return False
        first, second = 0, 1 % self.sets.sets
        devices.synchronize()
        if not self._called_right(first):
            return False  # wrong even when waited for: not a stream problem
        torch.cuda._sleep(SLEEP_CYCLES)
        return not self._called_right(second, wait=False)

    def skips_repeats(self) -> bool:
        """True when a call that repeats the previous call's arguments leaves its outputs wrong
        although the same call, made first, computed them: work skipped because the arguments were
        recognised. Both calls use buffers no timed call has seen (fresh addresses, same values)."""

        d = self.sets.holding(0)
        data = self.sets.datasets[d]
        bounds = data.bounds[self.entry.symbol]
        shapes = {name: g.shape for name, g in self.outs[0].items()}
        values, outs = prepare(self.task, self.entry, {k: twin(v) for k, v in data.inputs.items()}, shapes)
        args = self.ep.marshal(values)

        def called_right() -> bool:
            for name, g in outs.items():
                if self.roles[name] == "out":
                    bits(g.data, g.dtype).fill_(PREFILL[g.dtype])
                else:
                    g.data.copy_(data.inputs[name].reshape(g.shape))
            devices.synchronize()
            self.ep.call_raw(args)
            devices.synchronize()
            return all(int(bounds[n].count_bad(g.data)) == 0 for n, g in outs.items())

        return called_right() and not called_right()

    def _called_right(self, slot: int, wait: bool = True) -> bool:
        """Poisons `slot`'s outputs, calls on its arguments and says whether they came out right
        (`wait`: the poison is finished before the call is made)."""

        d = self.sets.holding(slot)
        bounds = self.sets.datasets[d].bounds[self.entry.symbol]
        self.poison(slot, d)
        if wait:
            devices.synchronize()
        self.ep.call_raw(self.marshalled(slot, d))
        devices.synchronize()
        return all(int(bounds[n].count_bad(g.data)) == 0 for n, g in self.outs[slot].items())

    def check_limits(self, row: Timing, bytes_moved: float | None) -> None:
        reserved = timing.persisting_l2_bytes()
        problem = self.limits.past(
            gbps=row.gbps,
            gflops=row.gflops,
            bytes_moved=bytes_moved,
            flop_peak=self.entry.flop_peak,
            written_bytes=sum(g.numel * g.data.element_size() for g in self.outs[0].values()),
            l2_reserved=reserved is None or reserved > 0,
        )
        if problem is None:
            return
        if self.on_private_stream():
            raise stream_failure(self.where)
        raise CheckFailure(
            Verdict.WRONG,
            f"{self.where}: timing figure past what the card can do: {problem}. The measurement is void and "
            f"earns nothing: the timed call cannot have done all of its work. Is part of it done outside the "
            f"call (a private stream, a host thread, a result kept from an earlier call)?",
        )


def make_row(
    name: str,
    entry: Entry,
    case: Case,
    inputs: Values,
    stats: Mapping[str, timing.Stats],
    key: str,
    baselines: Sequence[str],
    limits: timing.Limits,
    ladder: str,
) -> Timing:
    """A Timing row with every metric the entry declares; `key` names this row's stats."""
    s = stats[key]
    row = Timing(
        entry=name,
        case=case.label,
        median_ms=s.median_ms,
        q1_ms=s.q1_ms,
        q3_ms=s.q3_ms,
        min_ms=s.min_ms,
        n=s.n,
        copy_gbps=limits.copy_gbps,
        read_gbps=limits.read_gbps,
        peak_gbps=limits.dram_gbps,
        peak_gflops=limits.rated_gflops(entry.flop_peak),
        ladder=ladder,
    )
    if baselines:
        row.vs = {b: stats[f"baseline:{b}"].median_ms / s.median_ms for b in baselines}
        row.baseline = baselines[0]
        row.baseline_median_ms = stats[f"baseline:{baselines[0]}"].median_ms
        row.speedup = row.vs[baselines[0]]
    if entry.bytes_moved is not None:
        moved = entry.bytes_moved(inputs)
        row.gbps = moved / (s.median_ms * 1e-3) / 1e9
        if entry.host:  # host-pointer entries move their bytes over the host link: a device copy is no measure
            row.copy_gbps = None
        else:
            row.copy_gbps = timing.copy_bandwidth_like(moved)
            row.share_of_copy = row.gbps / row.copy_gbps
    if entry.flops is not None:
        row.gflops = entry.flops(inputs) / (s.median_ms * 1e-3) / 1e9
    if row.gflops is not None and row.peak_gflops:
        row.share_of_peak = row.gflops / row.peak_gflops
    elif row.gbps is not None and row.peak_gbps and not entry.host:
        row.share_of_peak = row.gbps / row.peak_gbps
    return row


def time_case(
    task: CudaTask,
    rungs: Sequence[tuple[Entry, EntryPoint]],
    baselines: Baselines,
    case: Case,
    budget: timing.Budget,
    limits: timing.Limits,
    ladder: str = "",
) -> list[Timing]:
    """Times the rungs and baselines interleaved on one case. Returns one row per rung, then (for
    a ladder) one per baseline. Raises the verdict when a rung's timed calls were not all right or
    its figures are impossible."""
    import torch

    entries = [e for e, _ in rungs]
    sets = BufferSets(task, entries, case)
    prefix = f"ladder {ladder}: " if ladder else ""
    students = [
        Rung(task, e, ep, sets, limits, budget.max_reps, f"{prefix}{e.symbol}, case {case.label} (timing)")
        for e, ep in rungs
    ]
    subjects: dict[str, Callable[[], object] | timing.Subject] = {r.entry.symbol: r.subject() for r in students}
    base_inputs = sets.datasets[0].inputs
    first = entries[0]
    shapes = task.shapes(base_inputs, sets.datasets[0].expected[first.symbol])
    ref_outs = students[0].outs[0]
    base_outs = {
        k: torch.empty(s, dtype=ref_outs[k].data.dtype, device=ref_outs[k].data.device) for k, s in shapes.items()
    }
    for name, fn in baselines.items():
        subjects[f"baseline:{name}"] = lambda fn=fn: fn(base_inputs, base_outs)
    stats = timing.Timer(host=any(e.host for e in entries)).compare(subjects, budget, each_rep=sets.each_rep)
    devices.synchronize()
    names = list(baselines)
    rows = []
    for r in students:
        r.verify(stats[r.entry.symbol].n)
        row = make_row(r.entry.symbol, r.entry, case, base_inputs, stats, r.entry.symbol, names, limits, ladder)
        row.rung = r.entry.symbol if ladder else ""
        r.check_limits(row, r.entry.bytes_moved(base_inputs) if r.entry.bytes_moved else None)
        rows.append(row)
    if ladder:
        for name in names:
            row = make_row("", first, case, base_inputs, stats, f"baseline:{name}", names, limits, ladder)
            row.rung = name
            rows.append(row)
    return rows


def run_ladder(
    task: CudaTask,
    eps: Mapping[str, EntryPoint],
    limits: timing.Limits,
    rec: Recorder,
    budget: timing.Budget,
    skipped: Collection[str] = (),
) -> list[Timing]:
    """Every sweep size of the task's ladder: rungs and baselines interleaved, size by size. The
    rungs in `skipped` (this card cannot run them) are left out: their table rows stay empty."""
    import torch

    ladder = task.ladder
    assert ladder is not None
    problems = ladder.problems(task)
    if problems:
        raise CheckFailure(
            Verdict.GRADER_ERROR, f"{task.task_id}: the ladder `{ladder.name}` cannot run: " + "; ".join(problems)
        )
    rows: list[Timing] = []
    for case in ladder.sweep:
        rec.at(Stage.TIMING, f"ladder {ladder.name}, case {case.label}")
        rungs = [(task.entry(s), eps[s]) for s in ladder.rungs if s not in skipped]
        if not rungs:
            break  # no rung runs on this card: nothing to compare the baselines with
        rows += time_case(task, rungs, ladder.baselines, case, budget, limits, ladder=ladder.name)
        torch.cuda.empty_cache()  # the next size's buffer sets start from free memory
    return rows
