"""Checks for lab5/kiln_llm/kernels/llama.cu: embedding, RMSNorm, RoPE, the KV-cache update and
attention (decode and prefill), each for float32, float16 and bfloat16 (the _f32, _f16, _bf16 symbols).

The inputs. A case is one model shape and one step of it: T tokens at position pos of a cache of
S rows, H query heads sharing Hkv key/value heads of Dh elements, a model dim D and a vocabulary V.
Every case runs every entry point on its own inputs, each dtype's inputs rounded from the same
float32 draw:
- embedding: T token ids, some of them outside [0, V) (-1, V, V + 7) in the cases that say so: their
  rows must be zeros;
- rmsnorm: T rows of D, D from 1 to 4100: 1, 100 and 4100 are not multiples of the 8 halves of a
  16-byte vector (4100 is of 4 floats), 1000 is not a multiple of the block; the weight is 1 plus
  noise, one row is scaled by 100 (the normalization must divide it out) and another by 1e-3, whose
  mean square (1e-6) is below eps: there eps added after the square root, or an eps of its own
  instead of the argument's, is off by a factor of two or more; eps is 1e-5, and 1e-3 and 1e-6 in
  the two cases that say so;
- rope: q (T, H, Dh) at positions pos .. pos + T - 1 (pos up to 4000: the angles are large) with
  the inverse frequencies of base 10000, in the case's layout (both layouts are among the cases);
- kv_update: T new rows written at kv_pos into a cache of S rows; in one case kv_pos + T passes
  S by one (the last row must be skipped), in another kv_pos is -1 (the first row is skipped);
- attention: q (T, H, Dh), caches (S, Hkv, Dh) whose rows at and past pos + T hold garbage: keys
  with 4 times the spread of the real ones and values of 1000, so a kernel that reads one of them
  (or ignores pos) is far off. Decode cases (T <= 4) and prefill cases (T >= 5) with pos 0 and
  pos > 0; grouped heads H / Hkv = 2, 3, 4, 8 and 1 (Hkv > 1 in most, so head h % Hkv is wrong);
  Dh 8, 32, 48, 64, 80, 100, 128 and 256; a 7B-shaped decode step at pos 4000 of 4096 and a
  512-token prefill. The scale is 1 / sqrt(Dh) but in two cases (0.05 and 0.2: a kernel that
  scales by 1 / sqrt(Dh) whatever it is given is caught), and in those two (a decode and a
  prefill) q and k share an offset that puts every score near 110, past exp's float32 range (88):
  a softmax without the running maximum overflows, and scores rounded to f16 (by up to 0.03) or
  bf16 (0.25) move the weights by percents.
  Their values lie near 1 (1 + 0.25 noise): a float32 kernel's own rounding of scores that large
  (about 1e-5 of them, whatever the order of its sums) then stays inside the tolerance.

  Head dims: the contract (llm_kernels.h) is every even Dh from 8 to 256. 64 and 128 run the
  kernels compiled for them (DH = Dh, rows read as 16-byte vectors); every other Dh runs the same
  code compiled for the next size of 64, 128 and 256, on rows of Dh elements with the ones past Dh
  taken as zeros: the tiny model's 32, llama2.c's stories260K and stories15M heads (8, 48),
  OpenLLaMA 3B's 100 (rows of 200 bytes in f16, not 16-byte aligned), 80 and 256 (f32 rows of
  two vectors per lane, the prefill's shared memory past 48 KB). A kernel that strides or writes
  rows by DH where Dh belongs, or reads a row past Dh, is right at 64 and 128 and far off at every
  other head dim, in decode and prefill.

The references are torch in float32, rounded once to the dtype (RMSNorm: twice, as Hugging Face's
LlamaRMSNorm does: x * rsqrt(mean(x^2) + eps) rounded, times w, rounded).

The tolerances. Two float32 computations of one value agree to about 1e-6 relative (another order
of the sums, fma, exp2 against exp); rounded to a 16-bit type they may still fall on the two sides
of a rounding boundary, one unit in the last place apart: 2^-10 relative for float16 (< 1e-3),
2^-7 for bfloat16 (< 8e-3). So f16 is judged with atol = rtol = 1e-3 and bf16 with 8e-3, one unit
in the last place; RMSNorm rounds twice and may be two units off, so its 16-bit outputs get twice
that. float32 (atol 1e-5, rtol 1e-4): attention's scores go through exp2(x * log2 e), a few
float32 roundings of scores up to ~10, about 1e-5 relative; a float16 rounding (5e-4) still fails.
Embedding and kv_update only move bits: exact.

The fused forms (fusion.py folds RoPE into its readers) run on every case too: kiln_rope_kv_update
(the new rows rotated at kv_pos .. kv_pos + T - 1 and written there: the kv_update reference of the
rope reference, rows outside the cache skipped) and kiln_attention_rope (the attention reference of
the rotated, rounded q), with the rope's tolerance and attention's. kiln_attention_append (the
decode attention that takes the step's new keys and values and writes them into the caches itself)
has its own check, `appends_in_the_attention`, as it is decode only: shapes like the decode cases
(T 1 to 4, GQA groups 1 to 8, both layouts, Dh 8 to 256, pos 0, mid-cache and the last rows, a
7B-shaped step with hundreds of keys over many splits), the cache rows at pos .. pos + T - 1 holding
garbage before the call (a kernel that reads them back instead of k_new and v_new is far off), the
output judged like attention_rope's, the key cache like rope's (the rotated keys at their rows,
every other row as it was, which that tolerance holds to a unit in the last place) and the value
cache exactly; T = 5 must be refused, leaving everything as it was.

Run-time positions. `replays_in_a_cuda_graph` captures, for each path of attention, a kv_update of
the new keys and values, a rope and an attention reading the updated cache into one CUDA graph
(on torch's capture stream) and replays it three times with a new pos written into the same device
tensor and new data: a kernel that took pos by value, or read it on the host, keeps the first one.
"""

from grader.child.context import CUDA_ERROR_INVALID_VALUE as INVALID_VALUE
from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, Float, In, InOut, Int, Out
from grader.tasks.spec import Rng, Scalar, torch_dtype

STREAM = Scalar("stream", "u64")
DTYPES = ("f32", "f16", "bf16")
EPS = 1e-5
BASE = 10000.0
GARBAGE_K = 4.0  # spread of the keys in the rows past the prefix (the real ones have 1)
GARBAGE_V = 1000.0  # value of every element in the rows past the prefix
CHUNK_ROWS = 1 << 14  # rows per step of the RMSNorm reference

# the judging of module docstring; embedding and kv_update are exact
TOLERANCE = {"f32": (1e-5, 1e-4), "f16": (1e-3, 1e-3), "bf16": (8e-3, 8e-3)}
TWO_ROUNDINGS = {"f32": (1e-5, 1e-4), "f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2)}
EXACT = {d: (0.0, 0.0) for d in DTYPES}


# a case's model shape and step, in this order (a tuple: Case.size multiplies only int parameters,
# so the one int of a case is `elements`, the size of its largest tensor)
FIELDS = (
    "t",
    "pos",
    "s",
    "h",
    "hkv",
    "dh",
    "d",
    "v",
    "layout",
    "kv_shift",
    "bad_tokens",
    "rows",
    "scale",
    "eps",
    "big",
)
BIG_SCORE = 110.0  # about every score of a `big` case: past 88, where exp(score) overflows float32


def case(
    label: str,
    *,
    t: int,
    pos: int,
    s: int,
    h: int,
    hkv: int,
    dh: int,
    d: int,
    v: int = 50,
    layout: int = 0,
    kv_shift: int = 0,
    bad_tokens: bool = False,
    rows: int = 0,
    huge: bool = False,
    scale: float = 0.0,
    eps: float = EPS,
    big: bool = False,
) -> Case:
    """kv_shift moves kv_update's position off pos: S - T + 1 (kv_shift=1) or -1 (kv_shift=-1).
    rows: the rows of embedding and rmsnorm when they differ from T (the case past 2^31).
    scale: attention's (0: 1 / sqrt(Dh)); big: scores near BIG_SCORE, values near 1."""
    rows = rows or t
    cfg = (t, pos, s, h, hkv, dh, d, v, layout, kv_shift, int(bad_tokens), rows, scale or dh**-0.5, eps, int(big))
    elements = max(rows * d, s * hkv * dh, t * h * dh, v * d)
    return Case(label, small=elements <= 1 << 16, huge=huge, cfg=cfg, elements=elements)


CASES = [
    # decode: n_tokens <= 4, flash-decoding
    case("decode T=1 pos=0 (one key) H4/2 dh64 D1", t=1, pos=0, s=16, h=4, hkv=2, dh=64, d=1, bad_tokens=True),
    case("decode T=1 pos=37 H4/2 dh64 D100 interleaved", t=1, pos=37, s=64, h=4, hkv=2, dh=64, d=100, layout=1),
    case("decode T=1 pos=700 H8/2 dh128 D1000", t=1, pos=700, s=1024, h=8, hkv=2, dh=128, d=1000, kv_shift=1),
    case("decode T=3 pos=130 H4/1 dh128 D256 interleaved", t=3, pos=130, s=256, h=4, hkv=1, dh=128, d=256, layout=1),
    case("decode T=4 pos=5 H6/2 dh64 D4100", t=4, pos=5, s=40, h=6, hkv=2, dh=64, d=4100, kv_shift=-1),
    case("decode T=2 pos=61 H8/8 dh64 D64 interleaved", t=2, pos=61, s=64, h=8, hkv=8, dh=64, d=64, layout=1),
    case("decode T=1 pos=90 H4/2 dh32 D128 (the tiny model)", t=1, pos=90, s=256, h=4, hkv=2, dh=32, d=128),
    case("decode T=2 pos=3 H8/2 dh128 D512, a long cache", t=2, pos=3, s=2048, h=8, hkv=2, dh=128, d=512),
    # prefill: a fused flash attention
    case("prefill T=5 pos=0 H4/2 dh64 D96", t=5, pos=0, s=16, h=4, hkv=2, dh=64, d=96, bad_tokens=True),
    case("prefill T=21 pos=7 H4/2 dh32 D128 (the tiny model)", t=21, pos=7, s=64, h=4, hkv=2, dh=32, d=128),
    case("prefill T=17 pos=9 H8/2 dh128 D4100 interleaved", t=17, pos=9, s=64, h=8, hkv=2, dh=128, d=4100, layout=1),
    case("prefill T=70 pos=33 H6/2 dh128 D1000", t=70, pos=33, s=200, h=6, hkv=2, dh=128, d=1000),
    case("prefill T=100 pos=0 H4/4 dh64 D100 interleaved", t=100, pos=0, s=128, h=4, hkv=4, dh=64, d=100, layout=1),
    case("prefill T=33 pos=90 H8/2 dh64 D4096", t=33, pos=90, s=130, h=8, hkv=2, dh=64, d=4096, v=1000),
    # attributes off LLaMA's values, and scores past exp's float32 range (before the head dims below, so
    # that a scale or a precision mistake is named by the case made for it)
    case(
        "decode T=2 pos=50 H4/2 dh64 D256 scale=0.05 eps=1e-3, scores near 110",
        t=2,
        pos=50,
        s=64,
        h=4,
        hkv=2,
        dh=64,
        d=256,
        scale=0.05,
        eps=1e-3,
        big=True,
    ),
    case(
        "prefill T=40 pos=6 H4/2 dh128 D512 interleaved scale=0.2 eps=1e-6, scores near 110",
        t=40,
        pos=6,
        s=64,
        h=4,
        hkv=2,
        dh=128,
        d=512,
        layout=1,
        scale=0.2,
        eps=1e-6,
        big=True,
    ),
    # head dims other than 64 and 128 (issue 23): the general path's kernels, compiled for 64, 128 and
    # 256, on rows of dh; and GQA groups of 8
    case("decode T=1 pos=200 H8/1 dh8 D64 (stories260K's head)", t=1, pos=200, s=256, h=8, hkv=1, dh=8, d=64),
    case("decode T=3 pos=40 H6/6 dh48 D288 interleaved", t=3, pos=40, s=64, h=6, hkv=6, dh=48, d=288, layout=1),
    case("decode T=2 pos=300 H4/2 dh100 D400 (OpenLLaMA 3B's head)", t=2, pos=300, s=512, h=4, hkv=2, dh=100, d=400),
    case("decode T=4 pos=700 H8/2 dh256 D512", t=4, pos=700, s=1024, h=8, hkv=2, dh=256, d=512),
    case("prefill T=9 pos=0 H4/2 dh8 D32", t=9, pos=0, s=16, h=4, hkv=2, dh=8, d=32),
    case("prefill T=21 pos=7 H16/2 dh80 D1000 interleaved", t=21, pos=7, s=64, h=16, hkv=2, dh=80, d=1000, layout=1),
    case("prefill T=40 pos=3 H4/1 dh256 D256", t=40, pos=3, s=64, h=4, hkv=1, dh=256, d=256),
    # model-sized: a 7B-shaped decode step late in the context, and a long prefill
    case("7B decode T=1 pos=4000 H32/8 dh128 D4096", t=1, pos=4000, s=4096, h=32, hkv=8, dh=128, d=4096, v=32000),
    case(
        "prefill T=512 pos=0 H32/8 dh128 D4096 interleaved",
        t=512,
        pos=0,
        s=1024,
        h=32,
        hkv=8,
        dh=128,
        d=4096,
        v=32000,  # a real vocabulary (and a case too big for the CPU calibration's 2^21 elements)
        layout=1,
    ),
    # 64-bit offsets: rmsnorm and embedding over 2^19 + 1 rows of 4096 (2^31 + 4096 elements)
    case(
        "rows=2^19+1 D4096, decode T=1 pos=9",
        t=1,
        pos=9,
        s=16,
        h=4,
        hkv=2,
        dh=64,
        d=4096,
        rows=(1 << 19) + 1,
        huge=True,
    ),
]


def _args(dt: str) -> dict[str, list]:
    return {
        "embedding": [Out(f"emb_{dt}", dt), In(f"table_{dt}", dt), In("tokens", "i64"), Scalar("rows", "i64"),
                      Scalar("vocab", "i64"), Scalar("d", "i64"), STREAM],
        "rmsnorm": [Out(f"norm_{dt}", dt), In(f"x_{dt}", dt), In(f"w_{dt}", dt), Scalar("rows", "i64"),
                    Scalar("d", "i64"), Float("eps"), STREAM],
        "rope": [Out(f"rope_{dt}", dt), In(f"q_{dt}", dt), In("pos", "i64"), In("inv_freq", "f32"),
                 Scalar("n_tokens", "i64"), Scalar("heads", "i64"), Scalar("dh", "i64"), Int("layout"), STREAM],
        "kv_update": [InOut(f"cache_{dt}", dt), In(f"new_{dt}", dt), In("kv_pos", "i64"), Scalar("cache_rows", "i64"),
                      Scalar("n_tokens", "i64"), Scalar("row_elems", "i64"), STREAM],
        "attention": [Out(f"attn_{dt}", dt), In(f"q_{dt}", dt), In(f"k_{dt}", dt), In(f"v_{dt}", dt), In("pos", "i64"),
                      Scalar("n_tokens", "i64"), Scalar("heads", "i64"), Scalar("kv_heads", "i64"),
                      Scalar("dh", "i64"), Scalar("cache_rows", "i64"), Float("scale"), STREAM],
        "rope_kv_update": [InOut(f"cache_{dt}", dt), In(f"new_{dt}", dt), In("kv_pos", "i64"), In("inv_freq", "f32"),
                           Scalar("cache_rows", "i64"), Scalar("n_tokens", "i64"), Scalar("kv_heads", "i64"),
                           Scalar("dh", "i64"), Int("layout"), STREAM],
        "attention_rope": [Out(f"attn_{dt}", dt), In(f"q_{dt}", dt), In(f"k_{dt}", dt), In(f"v_{dt}", dt),
                           In("pos", "i64"), In("inv_freq", "f32"), Int("layout"), Scalar("n_tokens", "i64"),
                           Scalar("heads", "i64"), Scalar("kv_heads", "i64"), Scalar("dh", "i64"),
                           Scalar("cache_rows", "i64"), Float("scale"), STREAM],
    }  # fmt: skip


def inv_freq(dh: int, device: str):
    """config.inv_freq(): 1 / base^(2j / Dh) in float32, as Hugging Face computes it."""
    import torch

    return 1.0 / (BASE ** (torch.arange(0, dh, 2, dtype=torch.float32, device=device) / dh))


def make_inputs(p, rng):
    import torch

    c = dict(zip(FIELDS, p["cfg"], strict=True))
    t, pos, s, h, hkv, dh, d, v, rows = (c[k] for k in ("t", "pos", "s", "h", "hkv", "dh", "d", "v", "rows"))
    dev = rng.device
    tokens = rng.integers(0, v, rows, dtype="i64")
    if c["bad_tokens"]:  # outside [0, V): rows of zeros
        for i, bad in enumerate((-1, v, v + 7)[:rows]):
            tokens[(2 * i) % rows] = bad
    x = rng.randn(rows, d)
    x[rows // 2] *= 100.0  # a row far from unit scale: the normalization must divide it out
    if rows > 1:
        x[(rows // 2 + 1) % rows] *= 1e-3  # a row of small spread: mean(x^2) below eps, where eps decides
    w = 1.0 + 0.1 * rng.randn(d)
    q = rng.randn(t, h, dh)
    k = rng.randn(s, hkv, dh)
    vv = rng.randn(s, hkv, dh)
    if c["big"]:  # an offset shared by q and k: every score about BIG_SCORE, spread by a few units
        offset = (BIG_SCORE / (c["scale"] * dh)) ** 0.5
        q += offset
        k[: pos + t] += offset
        vv[: pos + t] = 1.0 + 0.25 * vv[: pos + t]
    k[pos + t :] = GARBAGE_K * rng.randn(s - pos - t, hkv, dh)  # never read: the prefix ends at pos + t
    vv[pos + t :] = GARBAGE_V
    kv_pos = {0: pos, 1: s - t + 1, -1: -1}[c["kv_shift"]]
    values = {
        "tokens": tokens,
        "pos": torch.tensor([pos], dtype=torch.int64, device=dev),
        "kv_pos": torch.tensor([kv_pos], dtype=torch.int64, device=dev),
        "inv_freq": inv_freq(dh, dev),
        "n_tokens": t,
        "rows": rows,
        "vocab": v,
        "d": d,
        "eps": c["eps"],
        "heads": h,
        "kv_heads": hkv,
        "dh": dh,
        "cache_rows": s,
        "row_elems": hkv * dh,
        "layout": c["layout"],
        "scale": c["scale"],
        "stream": rng.stream(),
    }
    table = rng.randn(v, d)
    cache = rng.randn(s, hkv, dh)
    new = rng.randn(t, hkv, dh)
    for dt in DTYPES:
        c = torch_dtype(dt)
        values |= {
            f"table_{dt}": table.to(c),
            f"x_{dt}": x.to(c),
            f"w_{dt}": w.to(c),
            f"q_{dt}": q.to(c),
            f"k_{dt}": k.to(c),
            f"v_{dt}": vv.to(c),
            f"cache_{dt}": cache.to(c),
            f"new_{dt}": new.to(c),
        }
    return values


# --- references: torch in float32, rounded once ---------------------------------------------------


def embedding_ref(table, tokens):
    ok = (tokens >= 0) & (tokens < table.shape[0])
    out = table[tokens.clamp(0, table.shape[0] - 1)]
    out[~ok] = 0
    return out


def rmsnorm_ref(x, w, eps: float):
    """HF's LlamaRMSNorm, a slab of rows at a time (the case past 2^31 must not multiply its memory)."""
    out = x.new_empty(x.shape)
    for i in range(0, x.shape[0], CHUNK_ROWS):
        xf = x[i : i + CHUNK_ROWS].float()
        y = (xf * xf.pow(2).mean(-1, keepdim=True).add(eps).rsqrt()).to(x.dtype)
        out[i : i + CHUNK_ROWS] = (y.float() * w.float()).to(x.dtype)  # HF: weight * hidden.to(input_dtype)
    return out


def rope_ref(x, pos: int, freqs, layout: int):
    import torch

    t, _, dh = x.shape
    p = torch.arange(pos, pos + t, device=x.device).float()
    angle = p[:, None] * freqs[None, :]  # (T, Dh/2), one float32 product like HF's
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    xf = x.float()
    if layout == 0:
        a, b = xf[..., : dh // 2], xf[..., dh // 2 :]
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    else:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)


def kv_update_ref(cache, new, kv_pos: int):
    out = cache.clone()
    s, t = cache.shape[0], new.shape[0]
    lo, hi = max(0, -kv_pos), min(t, s - kv_pos)  # the rows of new that land inside the cache
    if lo < hi:
        out[kv_pos + lo : kv_pos + hi] = new[lo:hi]
    return out


def attention_ref(q, k, v, pos: int, scale: float):
    """softmax(scale q.k) v over keys 0 .. pos + t of kv head h // (H / Hkv), float32."""
    import torch

    t, h, _ = q.shape
    hkv = k.shape[1]
    n = pos + t  # the filled prefix: nothing past it is read
    kf = k[:n].float().repeat_interleave(h // hkv, dim=1)  # (n, H, Dh)
    vf = v[:n].float().repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), kf) * scale  # (H, T, n)
    causal = torch.arange(n, device=q.device)[None, :] > (pos + torch.arange(t, device=q.device))[:, None]
    scores = scores.masked_fill(causal[None], float("-inf"))
    out = torch.einsum("hts,shd->thd", scores.softmax(-1), vf)
    return out.to(q.dtype)


def references(dt: str) -> dict[str, object]:
    def emb(x):
        return {f"emb_{dt}": embedding_ref(x[f"table_{dt}"], x["tokens"])}

    def norm(x):
        return {f"norm_{dt}": rmsnorm_ref(x[f"x_{dt}"], x[f"w_{dt}"], x["eps"])}

    def rope(x):
        return {f"rope_{dt}": rope_ref(x[f"q_{dt}"], int(x["pos"].item()), x["inv_freq"], x["layout"])}

    def kv(x):
        return {f"cache_{dt}": kv_update_ref(x[f"cache_{dt}"], x[f"new_{dt}"], int(x["kv_pos"].item()))}

    def attn(x):
        return {f"attn_{dt}": attention_ref(x[f"q_{dt}"], x[f"k_{dt}"], x[f"v_{dt}"], int(x["pos"].item()), x["scale"])}

    def rope_kv(x):
        kv_pos = int(x["kv_pos"].item())
        new = rope_ref(x[f"new_{dt}"], kv_pos, x["inv_freq"], x["layout"])
        return {f"cache_{dt}": kv_update_ref(x[f"cache_{dt}"], new, kv_pos)}

    def attn_rope(x):
        pos = int(x["pos"].item())
        q = rope_ref(x[f"q_{dt}"], pos, x["inv_freq"], x["layout"])
        return {f"attn_{dt}": attention_ref(q, x[f"k_{dt}"], x[f"v_{dt}"], pos, x["scale"])}

    return {
        "embedding": emb,
        "rmsnorm": norm,
        "rope": rope,
        "kv_update": kv,
        "attention": attn,
        "rope_kv_update": rope_kv,
        "attention_rope": attn_rope,
    }


def entries() -> list[Entry]:
    tolerance = {"embedding": EXACT, "kv_update": EXACT, "rmsnorm": TWO_ROUNDINGS}
    out = []
    for kernel in ("embedding", "rmsnorm", "rope", "kv_update", "attention", "rope_kv_update", "attention_rope"):
        for dt in DTYPES:
            out.append(
                Entry(
                    f"kiln_{kernel}_{dt}",
                    _args(dt)[kernel],
                    reference=references(dt)[kernel],
                    tolerance=tolerance.get(kernel, TOLERANCE),
                )
            )
    return out


# --- attention_append: the decode attention that writes the new rows itself ---------------------------

# (t, pos, s, h, hkv, dh, layout): decode steps of every GQA group, both layouts, the cache's first
# and last rows, a 7B-shaped step whose few hundred keys spread over many splits, and the general
# path's head dims
APPEND_CASES = [
    (1, 0, 16, 4, 2, 64, 0),
    (1, 37, 64, 4, 2, 64, 1),
    (1, 700, 1024, 8, 2, 128, 0),
    (3, 130, 256, 4, 1, 128, 1),
    (4, 5, 40, 6, 2, 64, 0),
    (2, 61, 64, 8, 8, 64, 1),
    (1, 90, 256, 4, 2, 32, 0),
    (4, 252, 256, 8, 2, 32, 0),
    (1, 600, 4096, 32, 32, 128, 0),
    (2, 511, 1024, 32, 8, 128, 1),
    # the general path's head dims, GQA groups of 8
    (1, 15, 16, 8, 1, 8, 1),
    (3, 37, 64, 6, 6, 48, 0),
    (2, 100, 128, 16, 2, 100, 1),
    (4, 300, 512, 4, 2, 256, 0),
]


def append_args(dt: str) -> list:
    return [Out(f"attn_{dt}", dt), In(f"q_{dt}", dt), In(f"knew_{dt}", dt), In(f"vnew_{dt}", dt),
            InOut(f"k_{dt}", dt), InOut(f"v_{dt}", dt), In("pos", "i64"), In("inv_freq", "f32"), Int("layout"),
            Scalar("n_tokens", "i64"), Scalar("heads", "i64"), Scalar("kv_heads", "i64"), Scalar("dh", "i64"),
            Scalar("cache_rows", "i64"), Float("scale"), STREAM]  # fmt: skip


def append_inputs(rng, dt: str, t: int, pos: int, s: int, h: int, hkv: int, dh: int, layout: int) -> dict:
    """The caches filled below pos, garbage from pos on (rows pos .. pos + T - 1 included: the kernel
    must take them from k_new and v_new)."""
    import torch

    c = torch_dtype(dt)
    k, v = rng.randn(s, hkv, dh), rng.randn(s, hkv, dh)
    k[pos:] = GARBAGE_K * rng.randn(s - pos, hkv, dh)
    v[pos:] = GARBAGE_V
    return {
        f"attn_{dt}": torch.full((t, h, dh), float("nan"), dtype=c, device="cuda"),
        f"q_{dt}": rng.randn(t, h, dh).to(c),
        f"knew_{dt}": rng.randn(t, hkv, dh).to(c),
        f"vnew_{dt}": rng.randn(t, hkv, dh).to(c),
        f"k_{dt}": k.to(c),
        f"v_{dt}": v.to(c),
        "pos": torch.tensor([pos], dtype=torch.int64, device="cuda"),
        "inv_freq": inv_freq(dh, "cuda"),
        "layout": layout,
        "n_tokens": t,
        "heads": h,
        "kv_heads": hkv,
        "dh": dh,
        "cache_rows": s,
        "scale": dh**-0.5,
        "stream": torch.cuda.current_stream().cuda_stream,
    }


def appends_in_the_attention(ctx: RunContext) -> None:
    """kiln_attention_append_<dt> = kiln_rope_kv_update of k_new, kiln_kv_update of v_new at pos,
    then kiln_attention_rope over the caches; T = 5 refused."""
    import torch

    from grader.child.compare import judge
    from grader.tasks.seeds import seed_for

    rng = Rng(seed_for(ctx.task, "attention append"), "cuda")
    for dt in DTYPES:
        for t, pos, s, h, hkv, dh, layout in APPEND_CASES:
            x = append_inputs(rng, dt, t, pos, s, h, hkv, dh, layout)
            freqs = x["inv_freq"]
            k_want = kv_update_ref(x[f"k_{dt}"], rope_ref(x[f"knew_{dt}"], pos, freqs, layout), pos)
            v_want = kv_update_ref(x[f"v_{dt}"], x[f"vnew_{dt}"], pos)
            q_rot = rope_ref(x[f"q_{dt}"], pos, freqs, layout)
            want = attention_ref(q_rot, k_want, v_want, pos, dh**-0.5)
            symbol = f"kiln_attention_append_{dt}"
            where = f"{symbol} at T={t} pos={pos} S={s} H{h}/{hkv} dh{dh} {('half', 'interleaved')[layout]}"
            torch.cuda.synchronize()  # the contract: the kernel before must not be the one writing pos or the caches
            ctx.check_rc(symbol, ctx.entry(symbol, append_args(dt))(x), where)
            torch.cuda.synchronize()
            atol, rtol = TOLERANCE[dt]
            for name, got, ref, tol in (
                ("k cache", x[f"k_{dt}"], k_want, (atol, rtol)),  # rope's: sincosf against torch's cos, sin
                ("v cache", x[f"v_{dt}"], v_want, (0.0, 0.0)),
                ("out", x[f"attn_{dt}"], want, (atol, rtol)),
            ):
                report = judge(name, got, ref, *tol, None)
                if report:
                    ctx.fail(
                        f"{where}: {report}. The new rows come from k_new (rotated at pos + t) and v_new, are "
                        f"attended from there and stored at rows pos + t of the caches"
                    )
        # five queries are a prefill's: the prefill kernel reads every key from the cache
        x = append_inputs(rng, dt, 5, 3, 16, 4, 2, 64, 0)
        before = {n: x[n].clone() for n in (f"attn_{dt}", f"k_{dt}", f"v_{dt}")}
        torch.cuda.synchronize()
        rc = ctx.entry(f"kiln_attention_append_{dt}", append_args(dt))(x)
        torch.cuda.synchronize()
        same = all(torch.equal(x[n], b) or (b.isnan().all() and x[n].isnan().all()) for n, b in before.items())
        if rc != INVALID_VALUE or not same:
            ctx.fail(
                f"kiln_attention_append_{dt} with T = 5 returned {rc} (left everything as it was: {same}): it is"
                f" decode only (T <= 4), so it must return cudaErrorInvalidValue ({INVALID_VALUE}) before launching"
            )


# --- a CUDA graph replayed with new positions --------------------------------------------------------


def replays_in_a_cuda_graph(ctx: RunContext) -> None:
    """kv_update of the new keys and values, rope of q, then attention over the updated caches,
    captured once into a CUDA graph and replayed with new positions (written into the same device
    tensor) and new data; for a decode step (T = 1) and a prefill (T = 9)."""
    import torch

    from grader.child.compare import judge

    s, h, hkv, dh = 48, 4, 2, 64
    atol, rtol = TOLERANCE["f16"]
    f16 = torch.float16
    for t, positions in ((1, (3, 20, 47)), (9, (0, 13, 39))):
        pos = torch.zeros(1, dtype=torch.int64, device="cuda")
        freqs = inv_freq(dh, "cuda")
        q = torch.empty(t, h, dh, dtype=f16, device="cuda")
        q_rot = torch.empty_like(q)
        k_new, v_new = (torch.empty(t, hkv, dh, dtype=f16, device="cuda") for _ in range(2))
        k_cache, v_cache = (torch.empty(s, hkv, dh, dtype=f16, device="cuda") for _ in range(2))
        out = torch.empty(t, h, dh, dtype=f16, device="cuda")
        common = {"n_tokens": t, "cache_rows": s, "pos": pos}
        calls = [
            ("kiln_kv_update_f16", {**common, "cache_f16": k_cache, "new_f16": k_new, "kv_pos": pos,
                                    "row_elems": hkv * dh}),
            ("kiln_kv_update_f16", {**common, "cache_f16": v_cache, "new_f16": v_new, "kv_pos": pos,
                                    "row_elems": hkv * dh}),
            ("kiln_rope_f16", {**common, "rope_f16": q_rot, "q_f16": q, "inv_freq": freqs, "heads": h, "dh": dh,
                               "layout": 0}),
            ("kiln_attention_f16", {**common, "attn_f16": out, "q_f16": q_rot, "k_f16": k_cache, "v_f16": v_cache,
                                    "heads": h, "kv_heads": hkv, "dh": dh, "scale": dh**-0.5}),
        ]  # fmt: skip
        gen = torch.Generator(device="cuda").manual_seed(1234 + t)

        data = (q, k_new, v_new, k_cache, v_cache)
        for x in data:
            x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
        graph = ctx.captured(calls)
        for p in positions:
            for x in data:  # new data in the same buffers
                x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
            k_cache[p + t :] = (GARBAGE_K * torch.randn(s - p - t, hkv, dh, generator=gen, device="cuda")).to(f16)
            v_cache[p + t :] = GARBAGE_V
            k_want = kv_update_ref(k_cache, k_new, p)
            v_want = kv_update_ref(v_cache, v_new, p)
            rot_want = rope_ref(q, p, freqs, 0)
            want = attention_ref(rot_want, k_want, v_want, p, dh**-0.5)
            pos.fill_(p)  # the same device tensor the graph captured
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            what = f"{'decode' if t == 1 else 'prefill'} (T={t}) replayed from a CUDA graph at pos {p}"
            for name, got, ref, tol in (
                ("k_cache", k_cache, k_want, (0.0, 0.0)),
                ("rope", q_rot, rot_want, (atol, rtol)),
                ("attention", out, want, (atol, rtol)),
            ):
                report = judge(name, got, ref, *tol, None)
                if report:
                    ctx.fail(
                        f"{what}: {report}. A graph keeps the arguments it captured: pos must be read from "
                        f"device memory when the kernel runs, and the launch may not depend on it"
                    )
        del graph


TASK = CudaTask(
    lab="lab5",
    number="02",
    title="the LLaMA kernels: embedding, RMSNorm, RoPE, KV cache, attention",
    sources=["kiln_llm/kernels/llama.cu"],
    entries=entries(),
    cases=CASES,
    make_inputs=make_inputs,
    tolerance=TOLERANCE,
    checks=[replays_in_a_cuda_graph, appends_in_the_attention],
    timeout=300,
    rules=[NO_LIBRARIES],
    mistakes={
        "reads past the prefix": "attention: cache rows at and past pos + T hold keys of 4x the spread and values"
        " of 1000",
        "gqa heads": "attention: H / Hkv = 2, 3, 4, 8 with Hkv > 1, where kv head h % Hkv is another head",
        "head dim of the instantiation": "attention: Dh 8, 32, 48, 80, 100 and 256, run by kernels compiled for"
        " 64, 128 and 256: a row strided, read or written by DH instead of Dh is far off",
        "rope layout": "rope: both layouts among the cases, against the reference of each",
        "tail": "rmsnorm: D of 1, 100, 1000 and 4100, not multiples of a vector or of the block",
        "rows outside the cache": "kv_update: kv_pos + T one past the cache, and kv_pos = -1",
        "cache write position": "rope_kv_update: rows written at kv_pos + t, checked against the whole cache",
        "append reads the cache": "appends_in_the_attention: the rows at pos .. pos + T - 1 hold garbage before"
        " the call",
        "attribute at its LLaMA value": "attention: scale 0.05 and 0.2 (not 1 / sqrt(Dh)); rmsnorm: eps 1e-3 and"
        " 1e-6 on a row of small spread",
        "small variance": "rmsnorm: a row of size 1e-3 in every case of more than one row, mean(x^2) below eps",
        "large scores": "attention: the two cases with scores near 110, past exp's float32 range",
        "precision downgrade": "attention: scores near 110 rounded to f16 or bf16 move the weights by percents",
    },
)


def test_llama_kernels(grade):
    grade(TASK)
