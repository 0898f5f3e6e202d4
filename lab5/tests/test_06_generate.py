"""Checks for lab5/llama/generate.py: the sampler, the generation loop and `generate`.

It runs on your LLaMA graph (task 05) and CPU kernels (task 01), on the GPU also on your kernels
(02, 03), fusion pass (04) and lab 4's executor; with --solutions, the reference of each.

On the CPU (graded everywhere, CI included):
- The sampler, on hand-made distributions: temperature 0 is the first arg-max and a temperature
  near 0 picks it too; top-p keeps exactly the nucleus (the smallest set of most likely tokens
  whose mass reaches p), renormalised; the same seed draws the same tokens, another seed others,
  whatever else used torch's global random generator in between; and 20,000 draws of each of a
  few distributions land within 4.5 standard deviations (sqrt(p(1-p)/n)) of softmax(logits / T),
  nucleus included: a sampler that ignores the temperature or leaks mass outside the nucleus is
  off by tens of deviations. The draws are seeded, so the verdict never changes between runs.
- The sampler at exact top-p boundaries: uniform logits over 8 tokens, whose probabilities (1/8)
  and their sums are exact in float32, with top_p 0.125, 0.25, 0.5 and 0.75: the nucleus reaches
  top_p exactly with 1, 2, 4 and 6 tokens, and one more (a `<=` where `<` belongs) is wrong. Logits
  in float16 and bfloat16 give float32 probabilities, those of the float32 logits they hold.
- The loop, on a scripted model: one prefill of the prompt, then one decode per new token but none
  for the last; stop at EOS (not returned) or after max_new_tokens; on_token sees each token, and
  sees it as soon as it is chosen (before the model is asked for the next one: streaming, not a
  list at the end); an end token with id 0 stops the loop too (a test of eos_id's truth misses it),
  and without one a token 0 is an ordinary token.
- `generate` on a random 2-layer LLaMA (dim 256, GQA: 4 query heads of 64 on 2 KV heads) that the test saves as a
  Hugging Face directory with a llama2.c tokenizer.bin: 64 greedy tokens equal Hugging Face's
  `model.generate(do_sample=False)`; the streamed pieces join to the returned text, which is
  exactly what the tokenizer decodes; the same model exported as a llama2.c file (interleaved
  RoPE rows) gives the same tokens; sampling the model with a seed is reproducible.
  The weights are drawn at scale 1/sqrt(fan-in), so the logits spread over several units and the
  top two of a step are far apart compared with float32 rounding: greedy tokens are exact there.

On a GPU (marked `gpu`: left out, not failed, where there is none):
- float32: 64 greedy tokens equal Hugging Face's, and the logits of every step (prefill rows and
  decode steps) are within 1e-3 of Hugging Face's in float32 on the CPU.
- float16: tokens may tie after rounding, so the model is fed Hugging Face's greedy tokens and the
  logits of every step are compared within 0.05 + 1% of their largest magnitude (HF run in float32
  on the float16-rounded weights; half-precision activations drift by about 1e-2 at this depth,
  a wrong layout or a stale position by whole units).
- prefill of a whole sequence equals prefill of its first token then decode of the rest, step by
  step (within 1e-4 in float32).

The point tests import the lab's code inside their bodies: the grading process loads this file
too and must not run student code.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
import torch

from grader.tasks import PythonTask

LAB4 = ["../lab4/kiln/planner.py", "../lab4/kiln/cpu.py"]
LAB4_GPU = [
    "../lab4/kiln/kernels/pointwise.cu",
    "../lab4/kiln/kernels/matmul.cu",
    "../lab4/kiln/kernels/layout.cu",
    "../lab4/kiln/cuda.py",
    "../lab4/kiln/capture.py",
]
LAB5 = [
    "kiln_llm/cpu.py",
    "kiln_llm/kernels/llama.cu",
    "kiln_llm/kernels/linear.cu",
    "kiln_llm/fusion.py",
    "llama/model.py",
]

TASK = PythonTask(
    lab="lab5",
    number="06",
    title="text generation",
    sources=["llama/generate.py"],
    packages=["llama", "kiln_llm", "tiny", "../lab4/kiln"],
    builds_on=[*LAB5, *LAB4, *LAB4_GPU],
    timeout=300,
    mistakes={
        "top-p order": "test_top_p_keeps_exactly_the_nucleus: the nucleus of probabilities not in vocabulary order",
        "global generator": "test_same_seed_same_tokens_other_seed_differs: torch's global generator used between"
        " draws",
        "top-p boundary": "test_top_p_exact_boundaries: uniform logits, top_p equal to the mass of 1, 2, 4, 6 tokens",
        "end token 0": "test_decode_loop_end_token_zero: eos_id = 0",
        "late streaming": "test_on_token_fires_as_each_token_is_chosen: the model calls made when on_token fires",
        "half logits": "test_half_precision_logits: f16 and bf16 logits give float32 probabilities",
    },
)

STEPS = 64
PROMPT = "Once upon a time the cat"


# --- the sampler -------------------------------------------------------------------------------------


def logits_of(probs: list[float]) -> torch.Tensor:
    """Logits whose softmax is probs (up to float32 rounding)."""
    return torch.tensor(probs, dtype=torch.float64).log().float()


@pytest.mark.points(2)
def test_top_p_keeps_exactly_the_nucleus():
    from llama.generate import Sampler

    probs = [0.05, 0.40, 0.10, 0.30, 0.15]  # by rank: 1 (0.40), 3 (0.30), 4 (0.15), 2 (0.10), 0 (0.05)
    logits = logits_of(probs)
    cases = {
        0.30: {1},  # the most likely token alone already reaches 0.30
        0.60: {1, 3},  # 0.40 < 0.60 <= 0.70
        0.75: {1, 3, 4},  # 0.70 < 0.75 <= 0.85
        0.90: {1, 3, 4, 2},  # 0.85 < 0.90 <= 0.95
        1.00: {0, 1, 2, 3, 4},
    }
    for p, nucleus in cases.items():
        got = Sampler(temperature=1.0, top_p=p, seed=0).distribution(logits)
        assert got.shape == (5,) and got.dtype == torch.float32, f"top_p={p}: got {got.dtype}{list(got.shape)}"
        mass = sum(probs[i] for i in nucleus)
        want = torch.tensor([probs[i] / mass if i in nucleus else 0.0 for i in range(5)])
        kept = {i for i in range(5) if got[i] > 0}
        assert kept == nucleus, f"top_p={p}: kept tokens {sorted(kept)}, the nucleus is {sorted(nucleus)}"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"top_p={p}: not the renormalised nucleus")

    # temperature first, then the nucleus of the sharpened distribution
    sharp = torch.softmax(logits / 0.5, dim=0)  # by rank: 0.5246, 0.2951, 0.0738, 0.0328, 0.0082 (about)
    got = Sampler(temperature=0.5, top_p=0.7, seed=0).distribution(logits)
    want = torch.zeros(5)
    want[[1, 3]] = sharp[[1, 3]] / sharp[[1, 3]].sum()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg="temperature 0.5 then top_p 0.7")


@pytest.mark.points(1)
def test_temperature_zero_is_greedy():
    from llama.generate import Sampler

    g = torch.Generator().manual_seed(5)
    for row in torch.randn(20, 97, generator=g):
        want = int(row.argmax())
        assert Sampler(0.0)(row) == want
        one_hot = Sampler(0.0).distribution(row)
        assert int(one_hot.argmax()) == want and float(one_hot.sum()) == 1.0 and int((one_hot > 0).sum()) == 1
        # a temperature close to 0 sharpens softmax onto the arg-max: the draw is (almost surely) it
        assert Sampler(1e-3, seed=int(want))(row) == want
    tie = torch.tensor([0.0, 3.0, 1.0, 3.0])
    assert Sampler(0.0)(tie) == 1, "equal maxima: greedy takes the first, as torch.argmax and Hugging Face do"
    with pytest.raises(ValueError):
        Sampler(-0.5)
    with pytest.raises(ValueError):
        Sampler(1.0, top_p=0.0)


@pytest.mark.points(2)
def test_same_seed_same_tokens_other_seed_differs():
    from llama.generate import Sampler

    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))

    def draws(seed: int) -> list[int]:
        s = Sampler(temperature=1.0, top_p=0.95, seed=seed)
        out = []
        for _ in range(100):
            out.append(s(logits))
            torch.rand(3)  # other code using torch's global generator must not change the draws
        return out

    first = draws(7)
    torch.manual_seed(12345)
    assert draws(7) == first, "the same seed must give the same tokens (draw with the sampler's own generator)"
    assert draws(8) != first, "another seed must give other tokens"
    assert len(set(first)) > 10, f"100 draws from 50 tokens at temperature 1 gave only {len(set(first))} distinct"


@pytest.mark.points(2)
@pytest.mark.parametrize(("temperature", "top_p"), [(0.6, 1.0), (1.7, 1.0), (1.0, 0.8)], ids=["T0.6", "T1.7", "p0.8"])
def test_draw_frequencies_match_the_distribution(temperature, top_p):
    from llama.generate import Sampler

    n = 20_000
    logits = torch.tensor([1.5, -0.5, 0.3, 2.0, 0.0, -1.2, 1.0, 0.7])
    probs = torch.softmax(logits.double() / temperature, dim=0)
    if top_p < 1.0:
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[before < top_p]] = True
        probs = torch.where(mask, probs, 0.0)
        probs = probs / probs.sum()
    s = Sampler(temperature=temperature, top_p=top_p, seed=2024)
    counts = torch.bincount(torch.tensor([s(logits) for _ in range(n)]), minlength=8).double()
    freq = counts / n
    for i in range(8):
        p = float(probs[i])
        if p == 0.0:
            assert counts[i] == 0, f"token {i} is outside the nucleus but was drawn {int(counts[i])} times"
            continue
        bound = 4.5 * math.sqrt(p * (1 - p) / n)
        assert abs(float(freq[i]) - p) <= bound, (
            f"token {i}: drawn with frequency {float(freq[i]):.4f} in {n} draws, its probability is {p:.4f} "
            f"(allowed +-{bound:.4f}, 4.5 standard deviations)"
        )


@pytest.mark.points(1)
def test_top_p_exact_boundaries():
    from llama.generate import Sampler

    logits = torch.zeros(8)  # exp(0) = 1 however softmax is computed: exactly 1/8 each, every sum exact
    for temperature in (1.0, 0.6):
        for p, size in ((0.125, 1), (0.25, 2), (0.5, 4), (0.75, 6)):
            got = Sampler(temperature=temperature, top_p=p, seed=0).distribution(logits)
            kept = int((got > 0).sum())
            assert kept == size, (
                f"top_p={p} over 8 equally likely tokens: kept {kept}; {size} of them reach a mass of {p} exactly,"
                " and the nucleus is the smallest set that reaches top_p"
            )
            torch.testing.assert_close(
                got[got > 0], torch.full((size,), 1 / size), rtol=1e-6, atol=1e-7, msg=f"top_p={p}: not renormalised"
            )


@pytest.mark.points(1)
def test_half_precision_logits():
    from llama.generate import Sampler

    row = torch.randn(40, generator=torch.Generator().manual_seed(3)) * 3
    for dtype in (torch.float16, torch.bfloat16):
        half = row.to(dtype)
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
            got = Sampler(temperature, top_p, seed=1).distribution(half)
            want = Sampler(temperature, top_p, seed=1).distribution(half.float())
            assert got.dtype == torch.float32, f"{dtype} logits: probabilities are float32, got {got.dtype}"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=lambda m, d=dtype: f"{d} logits: {m}")
        assert Sampler(0.0)(half) == int(half.float().argmax())


# --- the loop, on a scripted model -------------------------------------------------------------------


class ScriptedModel:
    """Logits that make greedy decoding follow `script`: one-hot on the next scripted token.

    It also keeps a fake clock: a prefill takes 10 s and a decode 1 s, and work is "queued" (as
    on a GPU) until sync() is called; reading the clock with work queued is a failure."""

    def __init__(self, script: list[int], vocab: int = 16) -> None:
        self.script, self.vocab = script, vocab
        self.pos = 0
        self.calls: list[tuple[str, list[int]]] = []
        self.now = 0.0
        self.queued = False

    def sync(self) -> None:
        self.queued = False

    def clock(self) -> float:
        assert not self.queued, "the clock was read with model work queued: call sync() before reading it"
        return self.now

    def _row(self, step: int) -> torch.Tensor:
        row = torch.zeros(self.vocab)
        row[self.script[step]] = 5.0
        return row

    def prefill(self, tokens, *, last=False):
        tokens = list(tokens)
        self.calls.append(("prefill", tokens))
        self.pos += len(tokens)
        self.now += 10.0
        self.queued = True
        out = torch.zeros(len(tokens), self.vocab)
        out[-1] = self._row(0)
        return out[-1] if last else out

    def decode(self, token):
        self.calls.append(("decode", [int(token)]))
        self.pos += 1
        self.now += 1.0
        self.queued = True
        return self._row(len(self.calls) - 1)

    def loop(self, prompt: list[int], **kw):
        from llama.generate import Sampler, decode_loop

        return decode_loop(self, prompt, Sampler(0.0), sync=self.sync, clock=self.clock, **kw)


@pytest.mark.points(2)
def test_decode_loop_calls_the_model_as_the_contract_says():
    eos = 15
    m = ScriptedModel([4, 7, 9, 3, 8, 6])
    seen: list[int] = []
    r = m.loop([1, 2, 3], max_new_tokens=4, eos_id=eos, on_token=seen.append)
    assert r.tokens == [4, 7, 9, 3] and seen == [4, 7, 9, 3]
    assert m.calls == [("prefill", [1, 2, 3]), ("decode", [4]), ("decode", [7]), ("decode", [9])], (
        f"one prefill, then a decode per new token except the last; the calls were {m.calls}"
    )
    assert r.decode_steps == 3 and not r.stopped_at_eos
    assert (r.prefill_seconds, r.decode_seconds) == (10.0, 3.0), (
        f"prefill took 10 s and the 3 decodes 1 s each; measured {r.prefill_seconds} s and {r.decode_seconds} s"
    )

    m = ScriptedModel([4, 7, eos, 3])
    r = m.loop([1], max_new_tokens=10, eos_id=eos)
    assert r.tokens == [4, 7] and r.stopped_at_eos, f"stop at EOS (not returned): got {r.tokens}"
    assert [c[0] for c in m.calls] == ["prefill", "decode", "decode"]

    m = ScriptedModel([eos])
    r = m.loop([1, 5], max_new_tokens=10, eos_id=eos)
    assert r.tokens == [] and r.stopped_at_eos and r.decode_steps == 0

    m = ScriptedModel([4, 5])
    r = m.loop([1], max_new_tokens=1, eos_id=None)
    assert r.tokens == [4] and m.calls == [("prefill", [1])], "max_new_tokens=1: the prefill alone gives the token"
    assert r.decode_seconds == 0.0 and r.decode_steps == 0


@pytest.mark.points(1)
def test_decode_loop_end_token_zero():
    m = ScriptedModel([4, 7, 0, 3, 5, 6])
    r = m.loop([1], max_new_tokens=5, eos_id=0)
    assert r.tokens == [4, 7] and r.stopped_at_eos, f"eos_id=0 must stop the loop (not returned): got {r.tokens}"
    assert [c[0] for c in m.calls] == ["prefill", "decode", "decode"]
    m = ScriptedModel([4, 0, 3])
    r = m.loop([1], max_new_tokens=3, eos_id=None)
    assert r.tokens == [4, 0, 3] and not r.stopped_at_eos, f"without an end token, 0 is a token: got {r.tokens}"


@pytest.mark.points(1)
def test_on_token_fires_as_each_token_is_chosen():
    m = ScriptedModel([4, 7, 9, 3, 15])
    calls_seen: list[tuple[int, int]] = []  # (token, model calls made when on_token got it)
    r = m.loop([1, 2], max_new_tokens=10, eos_id=15, on_token=lambda t: calls_seen.append((t, len(m.calls))))
    assert r.tokens == [4, 7, 9, 3]
    # token k comes from the prefill's logits (k = 0) or decode k; it is streamed before decode(token k)
    want = [(4, 1), (7, 2), (9, 3), (3, 4)]
    assert calls_seen == want, (
        f"on_token must fire as each token is chosen, before the model computes the next one: (token, model calls"
        f" so far) were {calls_seen}, expected {want}"
    )


# --- generate on a small random LLaMA ----------------------------------------------------------------

WORDS = [" Once", " upon", " a", " time", " the", " cat", " dog", " sat", " on", " mat", " and", " ran", "."]


def write_tokenizer_bin(path: Path) -> int:
    """llama2.c's tokenizer.bin: <unk> <s> </s>, the 256 byte tokens, then WORDS (each a mergeable piece)."""
    pieces = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    words = [w.encode() for w in WORDS]
    # every prefix of a word must be a piece too, or the greedy merge never reaches the word
    for w in words:
        for end in range(2, len(w) + 1):
            if w[:end] not in pieces:
                pieces.append(w[:end])
    for ch in sorted({c for w in words for c in w}):
        if bytes([ch]) not in pieces:
            pieces.append(bytes([ch]))
    scores = [0.0] * 259 + [float(len(p)) for p in pieces[259:]]
    body = b"".join(struct.pack("<fi", s, len(p)) + p for p, s in zip(pieces, scores, strict=True))
    path.write_bytes(struct.pack("<i", max(len(p) for p in pieces)) + body)
    return len(pieces)


def random_llama(folder: Path, *, seed: int = 0):
    """A random LlamaForCausalLM (2 layers, dim 256, 4 query heads of 64 on 2 KV heads) saved in folder, with
    a tokenizer.bin; weights at scale 1/sqrt(fan-in), so logits spread over several units."""
    transformers = pytest.importorskip("transformers")
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer_bin(folder / "tokenizer.bin")
    cfg = transformers.LlamaConfig(
        hidden_size=256,  # head_dim 64, a size every attention kernel must take
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=640,
        vocab_size=vocab,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)  # not ones: a swapped norm weight shows
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / math.sqrt(p.shape[1]))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=steps,
            eos_token_id=2,
            pad_token_id=2,
        )
    new = out[0, len(ids) :].tolist()
    return new[: new.index(2)] if 2 in new else new


def differ(got: list[int], want: list[int]) -> str:
    """Where two token lists part, for a failure message."""
    step = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return f" from step {step} on ({len(got)} tokens, {len(want)} expected):\n  got  {got}\n  want {want}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, HF model, prompt ids, HF's greedy tokens) of the random model, made once per module."""
    from llama import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny-random")
    model = random_llama(folder)
    tok = load_tokenizer(folder / "tokenizer.bin")
    ids = tok.encode(PROMPT)
    want = hf_greedy(model, ids, STEPS)
    assert len(want) == STEPS and len(set(want)) >= 8, "the test's model must not stop or loop early"
    return folder, model, ids, want


@pytest.mark.points(3)
def test_greedy_generate_equals_hugging_face_on_the_cpu(tiny):
    from llama import load_tokenizer
    from llama.generate import generate

    folder, _, ids, want = tiny
    pieces: list[str] = []
    r = generate(str(folder), PROMPT, max_new_tokens=STEPS, device="cpu", on_text=pieces.append)
    assert r.prompt_tokens == ids
    assert r.tokens == want, f"greedy tokens differ from Hugging Face's{differ(r.tokens, want)}"
    tok = load_tokenizer(folder / "tokenizer.bin")
    assert "".join(pieces) == r.text, "the pieces given to on_text must join to the returned text"
    assert tok.decode(ids + want) == tok.decode(ids) + r.text, "the text is the decoding of the new tokens"
    assert r.device == "cpu" and r.gpu_memory_bytes == 0
    assert r.prefill_tokens_per_s > 0 and r.decode_tokens_per_s > 0


@pytest.mark.points(2)
def test_llama2c_export_gives_the_same_tokens(tiny, tmp_path):
    import shutil

    from llama import export_llama2c, load
    from llama.generate import generate

    folder, _, _, want = tiny
    config, weights = load(folder)
    export_llama2c(config, weights, tmp_path / "model.bin")  # rows of wq, wk in llama2.c's interleaved order
    shutil.copyfile(folder / "tokenizer.bin", tmp_path / "tokenizer.bin")
    assert load(tmp_path / "model.bin")[0].rope_layout == "interleaved"
    r = generate(str(tmp_path / "model.bin"), PROMPT, max_new_tokens=STEPS, device="cpu")
    assert r.tokens == want, f"the llama2.c file gives other tokens than the HF directory{differ(r.tokens, want)}"


@pytest.mark.points(1)
def test_sampling_the_model_is_reproducible(tiny):
    from llama import load
    from llama.generate import Sampler, decode_loop
    from llama.model import LlamaModel

    folder, _, ids, _ = tiny
    config, weights = load(folder)
    model = LlamaModel(config, weights, device="cpu", max_seq=len(ids) + 24)

    def sample(seed: int) -> list[int]:
        model.reset()
        return decode_loop(model, ids, Sampler(0.9, 0.95, seed), max_new_tokens=24, eos_id=None).tokens

    first = sample(3)
    assert sample(3) == first, "the same seed must give the same text"
    assert sample(4) != first, "another seed must give another text"


# --- on a GPU ------------------------------------------------------------------------------------------


def reference_logits(hf_model, ids: list[int], new: list[int]) -> torch.Tensor:
    """Hugging Face's float32 logits for every position of ids + new, on the CPU: (T, V)."""
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([ids + new])).logits[0].float()


def stepwise_logits(model, ids: list[int], new: list[int]) -> torch.Tensor:
    """Our logits for ids + new: the prompt's rows from one prefill, then one row per decode step."""
    rows = [model.prefill(ids)]
    for t in new:
        rows.append(model.decode(t)[None])
    return torch.cat(rows)


def compare_steps(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> None:
    assert got.shape == want.shape, f"{what}: logits {list(got.shape)}, expected {list(want.shape)}"
    diff = (got - want).abs().amax(dim=1)
    bad = (diff > atol).nonzero().flatten().tolist()
    assert not bad, (
        f"{what}: the logits of position {bad[0]} differ by {float(diff[bad[0]]):.3g} (allowed {atol:.3g});"
        f" {len(bad)} of {len(diff)} positions are off"
    )


@pytest.mark.gpu  # left out (not failed) where there is no GPU
@pytest.mark.points(3)
def test_greedy_generate_equals_hugging_face_on_the_gpu_f32(tiny):
    from llama import load
    from llama.generate import generate
    from llama.model import LlamaModel

    folder, hf_model, ids, want = tiny
    r = generate(str(folder), PROMPT, max_new_tokens=STEPS, device="cuda", dtype="float32")
    assert r.tokens == want, f"greedy tokens on the GPU differ from Hugging Face's{differ(r.tokens, want)}"
    assert r.device.startswith("cuda") and r.gpu_memory_bytes > 0
    assert r.prefill_tokens_per_s > 0 and r.decode_tokens_per_s > 0

    config, weights = load(folder, dtype="float32")
    model = LlamaModel(config, weights, device="cuda", max_seq=len(ids) + STEPS)
    compare_steps(stepwise_logits(model, ids, want), reference_logits(hf_model, ids, want), 1e-3, "float32 on GPU")


@pytest.mark.gpu  # left out (not failed) where there is no GPU
@pytest.mark.points(2)
def test_float16_logits_follow_hugging_face_step_by_step(tiny):
    import copy

    from llama import load
    from llama.model import LlamaModel

    folder, hf_model, ids, _ = tiny
    rounded = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())  # the same float16 weights, computed in float32
    new = hf_greedy(rounded, ids, STEPS)
    want = reference_logits(rounded, ids, new)
    config, weights = load(folder, dtype="float16")
    model = LlamaModel(config, weights, device="cuda", max_seq=len(ids) + len(new))
    got = stepwise_logits(model, ids, new)
    assert got.dtype == torch.float32, "prefill and decode return float32 logits whatever the model's dtype"
    compare_steps(got, want, 0.05 + 0.01 * float(want.abs().max()), "float16 on GPU")


@pytest.mark.gpu  # left out (not failed) where there is no GPU
@pytest.mark.points(2)
def test_prefill_then_decode_equals_one_prefill_on_the_gpu(tiny):
    from llama import load
    from llama.model import LlamaModel

    folder, _, ids, want = tiny
    seq = ids + want[:40]
    config, weights = load(folder, dtype="float32")
    whole = LlamaModel(config, weights, device="cuda", max_seq=len(seq)).prefill(seq)
    step = LlamaModel(config, weights, device="cuda", max_seq=len(seq))
    rows = [step.prefill(seq[:1])] + [step.decode(t)[None] for t in seq[1:]]
    assert step.pos == len(seq)
    compare_steps(torch.cat(rows), whole, 1e-4, "token by token against one prefill")


def test_generate(grade):
    grade(TASK)
