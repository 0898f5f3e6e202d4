"""Checks for lab2/02_divergence.cu: y = f(x) for a piecewise polynomial f, computed with one code
path for every lane, timed against piecewise_branchy, given in the file (an if / else if chain with
one polynomial per piece).

f, as the file defines it: four pieces split at -1, 0 and 1, a boundary belonging to the piece on
its left; piece p maps x to t = a x + b in [-1, 1] and returns s P(t) + o, with P(t) = sum c_j t^j
over j <= 56, c_j = (-1)^j / (j + 1)^2 rounded to float32 (the file's coefficients, exactly).

The inputs. x is uniform in (-2, 2) (2 erf(z / sqrt 2) of a standard normal z), so each piece
holds a quarter of the elements and a warp of 32 misses one of them with probability
4 (3/4)^32 ~ 4e-4: nearly every warp of the branchy kernel runs all four branches. Every 16th
element from the 6th is then set to -1, 0, 1, -2 and 2 in turn (n >= 22 reaches 0), so a kernel
that puts a boundary value into the wrong piece is caught: f jumps there by 0.25 to 0.69.

The tolerance. The reference evaluates the same pieces in float64 (a, b, s and o are exact in
float32) and is stored in float32, a rounding of at most 2^-24 |y| (u = 2^-24, float32's unit
roundoff). A float32 kernel that evaluates P by Horner's rule with fmaf rounds once per step, so
for |t| <= 1 its error is at most gamma_56 * sum |c_j| = 56u * 1.628 = 5.4e-6 (Higham, Accuracy
and Stability of Numerical Algorithms, section 5.1), times |s| <= 1.5: 8.2e-6. Rounding t adds at
most u |s P'(t)| <= u * 1.5 * 3.0 = 2.7e-7, the last fmaf u |y| <= 1.1e-7; the branchy kernel's
coefficients s c_j, each rounded once, add u * 1.5 * 1.628 = 1.5e-7 instead. Every term together
stays under 9e-6, below float32's default tolerance (1e-5 + 1e-5 |y|), which this task uses; in
practice the errors are a few 1e-7. Zeros, a pass-through of x, an fp16 rounding (2^-11
relative), a boundary value on the wrong side (0.25 away or more) or a value of the wrong piece
fail it by orders of magnitude.

The injected -2, -1, 0, 1 and 2 map to t = +-1, where every term of P counts in full: a Horner loop
that drops the top coefficient (c_56 t^56 = 3.1e-4 there) fails on them, though the term is under
the tolerance wherever |t| < 0.93.
"""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Out, PerfTarget, Rule, Size
from grader.tasks.rules import never_executes

ARGS = [In("x"), Out("y"), Size("n")]
SIZES = [1, 31, 32, 33, 1000, (1 << 20) + 7]
TIMING = 1 << 24

# f as lab2/solutions/02_divergence.cu defines it (keep the two in step)
DEGREE = 56
BOUNDS = (-1.0, 0.0, 1.0)  # the upper end of pieces 0, 1 and 2
PIECES = (  # (a, b, s, o) of each piece: t = a x + b, f = s P(t) + o
    (2.0, 3.0, 1.5, -2.0),
    (2.0, 1.0, -1.0, 1.25),
    (-2.0, 1.0, 0.75, 0.5),
    (-2.0, 3.0, -1.25, 2.5),
)
EDGES = (-1.0, 0.0, 1.0, -2.0, 2.0)  # the boundaries and the ends of [-2, 2]
CHUNK = 1 << 24  # elements the reference evaluates at a time (its float64 temporaries stay small)


def label(n):
    names = {(1 << 20) + 7: "n=2^20+7", 1 << 24: "n=2^24", (1 << 31) + 17: "n=2^31+17"}
    return names.get(n, f"n={n}")


def make_inputs(p, rng):
    import torch

    n = p["n"]
    x = torch.special.erf(rng.randn(n).mul_(2**-0.5)).mul_(2.0)  # uniform in (-2, 2)
    edges = x[5::16]
    if edges.numel():
        cycle = torch.tensor(EDGES, device=x.device)
        edges.copy_(cycle.repeat(edges.numel() // len(EDGES) + 1)[: edges.numel()])
    return {"x": x, "n": n}


def coefficients():
    import torch

    c = torch.tensor([(-1.0) ** j / (j + 1) ** 2 for j in range(DEGREE + 1)], dtype=torch.float32)
    return c.double().tolist()  # c_j as the kernel holds them, exactly


def f64(x):
    """f of a float64 vector, in float64."""
    import torch

    piece = sum((x > b).long() for b in BOUNDS)
    a, b, s, o = torch.tensor(PIECES, dtype=torch.float64, device=x.device)[piece].unbind(-1)
    t = a * x + b
    c = coefficients()
    acc = torch.full_like(t, c[DEGREE])
    for cj in reversed(c[:DEGREE]):
        acc.mul_(t).add_(cj)
    return acc.mul_(s).add_(o)


def reference(v):
    import torch

    x = v["x"]
    y = torch.empty_like(x)
    for start in range(0, x.numel(), CHUNK):
        y[start : start + CHUNK] = f64(x[start : start + CHUNK].double())
    return {"y": y}


def bytes_moved(v):
    return 8 * v["n"]  # x read once, y written once


def flops(v):
    return 2 * (DEGREE + 2) * v["n"]  # one evaluation of the element's piece: t, P by Horner, s P + o


ENTRY = r"COURSE_API\s+cudaError_t\s+"

# A Rule reads the whole file (comments and strings stripped), so the lookahead scopes this one: a
# branch token that comes after piecewise_branchy's entry point and before piecewise_uniform's, that
# is, in the TODO region that holds piecewise_uniform_kernel and whatever helper is written beside it.
NO_BRANCH = Rule(
    "forbid",
    rf"(?s)(?:\b(?:if|else|switch)\b|\?)(?=(?:(?!{ENTRY}piecewise_branchy\b).)*{ENTRY}piecewise_uniform\b)",
    "piecewise_uniform_kernel and the helpers beside it must not branch: choose the piece's parameters "
    "without if, else, switch or ?: (with arithmetic on comparisons, or an index into a table)",
)

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "wrong piece": "every case from n = 1: a value given another piece's parameters is off by far",
    "boundary value": "the injected -1, 0 and 1 (every 16th element from the 6th, n >= 22)",
    "no grid-stride loop": "n = 2^20 + 7 and 2^24, more elements than the fixed grid has threads",
    "polynomial degree": "the injected -2, -1, 0, 1 and 2, which map to t = +-1, where the top term c_56 t^56 is 3e-4",
    "divergent branch": (
        "the compiled rule: no kernel piecewise_uniform reaches has BSSY or BSYNC, the reconvergence a divergent"
        " branch compiles to, however the source spells the branch"
    ),
}

TASK = CudaTask(
    lab="lab2",
    number="02",
    title="warp divergence",
    mistakes=MISTAKES,
    sources=["02_divergence.cu"],
    entries=[
        Entry("piecewise_uniform", ARGS, reference=reference, bytes_moved=bytes_moved, flops=flops),
        Entry("piecewise_branchy", ARGS, reference=reference, bytes_moved=bytes_moved, flops=flops),
    ],
    cases=[Case(label(n), n=n) for n in [*SIZES, TIMING]]
    + [Case(label((1 << 31) + 17), huge=True, n=(1 << 31) + 17)],  # size_t indices (make grade only)
    make_inputs=make_inputs,
    tolerance={"f32": (1e-5, 1e-5)},
    timing_case=label(TIMING),
    rules=[
        NO_LIBRARIES,
        NO_BRANCH,
        # the compiled half: a branch spelled some other way (a macro, a helper above the region)
        # still compiles to a divergent region that reconverges; a select or predicated code does not
        never_executes(
            r"BSSY|BSYNC",
            "piecewise_uniform_kernel must not branch by piece: its compiled code may not diverge and reconverge",
            "piecewise_uniform",
        ),
    ],
    perf=[PerfTarget("piecewise_uniform", "speedup_over:piecewise_branchy", 2.0, 2, gate=True)],
)


def test_divergence(grade):
    grade(TASK)
