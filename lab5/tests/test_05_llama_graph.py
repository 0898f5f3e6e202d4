"""Checks for lab5/llama/model.py: the LLaMA graph and the prefill/decode loop, on the CPU.

Every model is a Hugging Face `LlamaForCausalLM` made here from a transformers LlamaConfig with
seeded random weights (scaled so that the logits are O(1), not the 0.02 init's near-zeros), saved
with save_pretrained and loaded back by lab5/llama/checkpoint.py, so the test also covers the names
the graph reads. The configurations: multi-head and grouped-query attention (4 query heads over 2
kv heads), tied and untied embeddings, rope_theta 10000 and 500000, and the interleaved RoPE layout
(the same model with wq and wk rows permuted by convert_rope_layout, as a llama2.c file holds it).
Checked: the graph's inputs, buffers and constants; the logits of one prefill against Hugging
Face's forward; a prompt prefilled then decoded token by token against one prefill of the whole
sequence and against Hugging Face; a prompt in two chunks of different lengths (a second prefill
graph, compiled after the first run, shares the caches); reset() over a cache still holding a
longer conversation; refusal of a run past max_seq.

Tolerance: float32 logits within 1e-4 (absolute and relative). Both sides compute in float32 with
the same roundings at every step (HF's RMSNorm order, RoPE angles in fp32, softmax in fp32); what
differs is only the order of the sums inside matmuls and attention, a few fp32 ulps per layer on
logits of size ~1-10, so about 1e-5. A wrong head grouping, RoPE layout or position, a missing
residual or norm changes logits by O(0.1-1).

Half precision (f16 and bf16, on the CPU executor): the same checkpoint loaded in the dtype. The
graph's caches and logits are of that dtype (inv_freq stays f32), and prefill and decode return
float32 logits on the CPU, close to Hugging Face's float32 forward on the same rounded weights:
within 0.01 + 0.5% of the largest logit in f16 and 0.05 + 2% in bf16 (the activations round at every
step: the reference solution is off by 0.003 and 0.025 on logits up to 3; a wrong position or layout
by whole units). Caches made without the model's dtype, or logits returned in it,
fail here: every float32 model above hides both.

On a GPU (marked `gpu`: left out, not failed, where there is none), on your kernels (tasks 02, 03),
fusion pass (04) and lab 4's executor, with a model of head_dim 32 (dim 128, as the repo's tiny
model: the attention kernels' general path): a prompt prefilled, decoded token by token (the decode
step's CUDA graphs), then a second chunk prefilled, and a reset: every step's logits against the CPU
executor's, pos after each; and an f16 model's float32 logits. A GPU decode that never advances
pos, or that reads it stale, is caught here.

Each model is tiny (2 layers, dim 32, vocab 64): the whole file runs in a few seconds.
"""

from __future__ import annotations

import math

import pytest
import torch

from grader.tasks import PythonTask

TASK = PythonTask(
    lab="lab5",
    number="05",
    title="the LLaMA graph",
    sources=["llama/model.py"],
    packages=["llama", "kiln_llm", "../lab4/kiln"],
    builds_on=[
        "kiln_llm/cpu.py",
        "../lab4/kiln/cpu.py",
        "../lab4/kiln/planner.py",
        # the GPU checks run the model on the kernels, the fusion pass and lab 4's CUDA executor
        "kiln_llm/kernels/llama.cu",
        "kiln_llm/kernels/linear.cu",
        "kiln_llm/fusion.py",
        "../lab4/kiln/cuda.py",
        "../lab4/kiln/capture.py",
        "../lab4/kiln/kernels/pointwise.cu",
        "../lab4/kiln/kernels/matmul.cu",
        "../lab4/kiln/kernels/layout.cu",
    ],
    timeout=300,  # on a GPU the first run builds the kernels (as task 06's)
    mistakes={
        "rope layout": "test_prefill_matches_hf[interleaved]: a llama2.c-ordered checkpoint",
        "missing residual": "test_prefill_matches_hf: logits against Hugging Face's forward",
        "position": "test_prefill_then_decode and test_prefill_matches_hf: pos fed and advanced at every run",
        "caches not shared": "test_prefill_then_decode: decode after a prefill must see the prompt's rows",
        "model dtype": "test_half_precision_models: f16 and bf16 checkpoints on the CPU, caches of the "
        "model's dtype and float32 logits",
        "gpu decode position": "test_gpu_steps_match_the_cpu (GPU): the captured decode step must advance pos, "
        "its logits step by step against the CPU executor's",
    },
)

TOL = {"rtol": 1e-4, "atol": 1e-4}
SEQ = [5, 17, 42, 3, 63, 0, 8, 21, 34, 55, 13]  # token ids, vocab 64

# name: (n_heads, n_kv_heads, tied, rope_theta, layout)
CONFIGS = {
    "mha": (4, 4, False, 10000.0, "half"),
    "gqa": (4, 2, False, 10000.0, "half"),
    "tied": (4, 2, True, 10000.0, "half"),
    "theta": (4, 1, False, 500000.0, "half"),
    "interleaved": (4, 2, True, 10000.0, "interleaved"),
}
# the GPU checks' model: head_dim 32 (dim 128 over 4 heads), the repo's tiny model's
GPU_MODEL = "gqa_dh32"
MODELS = {**CONFIGS, GPU_MODEL: (4, 2, False, 10000.0, "half")}
HIDDEN = {GPU_MODEL: 128}


def hf_model(n_heads, n_kv_heads, tied, theta, seed=0, hidden=32):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=theta,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms: around 1, not exactly (a norm's weight left out must show)
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:  # linears and the embedding: unit-variance outputs, so logits are O(1)
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1] if "embed" not in name else 1))
    return model


_LOADED: dict[tuple, tuple] = {}


def model_and_weights(name, tmp_path_factory, dtype="float32"):
    """(HF model, our config, our weights) for MODELS[name], through save_pretrained and llama.load
    (in `dtype`: the HF model then holds the same rounded weights, in float32)."""
    if (name, dtype) not in _LOADED:
        import llama

        heads, kv, tied, theta, layout = MODELS[name]
        hf = hf_model(heads, kv, tied, theta, hidden=HIDDEN.get(name, 32))
        path = tmp_path_factory.mktemp(name)
        hf.save_pretrained(path)
        config, weights = llama.load(path, dtype=dtype)
        assert config.rope_theta == theta and config.tie_embeddings == tied and config.dtype == dtype
        if layout != "half":
            config, weights = llama.convert_rope_layout(config, weights, layout)
        if dtype != "float32":
            with torch.no_grad():
                for p in hf.parameters():
                    p.copy_(p.to(getattr(torch, dtype)).float())
        _LOADED[name, dtype] = (hf, config, weights)
    return _LOADED[name, dtype]


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()  # (T, V)


def check(got, want, what):
    assert isinstance(got, torch.Tensor), f"{what}: expected a torch tensor, got {type(got).__name__}"
    assert got.dtype == torch.float32, f"{what}: logits are float32, got {got.dtype}"
    assert got.device.type == "cpu", f"{what}: logits come back on the CPU"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{what}: {m}")


@pytest.mark.points(2)
def test_graph_conventions(tmp_path_factory):
    from kiln.ir import DType
    from llama.model import build_graph

    _, config, weights = model_and_weights("gqa", tmp_path_factory)
    g = build_graph(config, weights, n_tokens=3, max_seq=16)
    inputs = {n.attrs["name"]: str(n.type) for n in g.inputs}
    assert inputs == {"tokens": "i64[3]", "pos": "i64[1]"}, inputs
    buffers = {n.attrs["name"]: str(n.type) for n in g.buffers}
    want = {f"layers.{i}.{kv}_cache": "f32[16, 2, 8]" for i in range(2) for kv in "kv"}
    assert buffers == want, buffers
    constants = {n.attrs["name"] for n in g.of_op("constant")}
    assert "rope.inv_freq" in constants and set(weights) <= constants, sorted(constants)
    inv = g.constants["rope.inv_freq"]
    assert inv.dtype == torch.float32 and tuple(inv.shape) == (4,)
    (out,) = g.outputs
    assert out.type.shape == (3, 64) and out.type.dtype is DType.float32
    assert g.name == "llama"


@pytest.mark.points(4)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_matches_hf(name, tmp_path_factory):
    from llama.model import LlamaModel

    hf, config, weights = model_and_weights(name, tmp_path_factory)
    model = LlamaModel(config, weights, device="cpu", max_seq=32)
    got = model.prefill(SEQ)
    check(got, hf_logits(hf, SEQ), f"{name}: prefill of {len(SEQ)} tokens vs Hugging Face")
    assert model.pos == len(SEQ), f"pos is {model.pos} after a prefill of {len(SEQ)} tokens"


@pytest.mark.points(4)
@pytest.mark.parametrize("name", ["gqa", "interleaved"])
def test_prefill_then_decode(name, tmp_path_factory):
    """The prompt's logits, then one decode step per token: the same logits as one prefill of the
    whole sequence, and as Hugging Face's."""
    from llama.model import LlamaModel

    hf, config, weights = model_and_weights(name, tmp_path_factory)
    model = LlamaModel(config, weights, device="cpu", max_seq=16)
    steps = [model.prefill(SEQ[:4])]
    model.reset()
    last = model.prefill(SEQ[:4], last=True)
    assert tuple(last.shape) == (64,), f"prefill(last=True) returns logits [V], got {list(last.shape)}"
    check(last, steps[0][-1], f"{name}: prefill(last=True) is the last row of prefill")
    for k, tok in enumerate(SEQ[4:]):
        logits = model.decode(tok)
        assert tuple(logits.shape) == (64,), f"decode returns logits [V], got {list(logits.shape)}"
        assert model.pos == 5 + k
        steps.append(logits[None])
    got = torch.cat(steps)
    check(got, hf_logits(hf, SEQ), f"{name}: prefill(4) then decode vs Hugging Face")
    whole = LlamaModel(config, weights, device="cpu", max_seq=16).prefill(SEQ)
    check(got, whole, f"{name}: prefill(4) then decode vs one prefill")


@pytest.mark.points(2)
def test_chunks_and_reset(tmp_path_factory):
    """A prompt in chunks of 3, 5 and 3 tokens (two more prefill graphs, compiled after runs that
    filled the cache) equals one prefill; after reset() a shorter sequence is right although the
    caches still hold the longer one's rows."""
    from llama.model import LlamaModel

    hf, config, weights = model_and_weights("tied", tmp_path_factory)
    model = LlamaModel(config, weights, device="cpu", max_seq=16)
    got = torch.cat([model.prefill(SEQ[:3]), model.prefill(SEQ[3:8]), model.prefill(SEQ[8:])])
    check(got, hf_logits(hf, SEQ), "prefill in chunks of 3, 5, 3 vs Hugging Face")
    model.reset()
    assert model.pos == 0
    other = [9, 8, 7, 6]
    got = torch.cat([model.prefill(other[:3]), model.decode(other[3])[None]])
    check(got, hf_logits(hf, other), "after reset(): a new sequence vs Hugging Face")


@pytest.mark.points(1)
def test_refuses_past_max_seq(tmp_path_factory):
    from llama.model import LlamaModel

    hf, config, weights = model_and_weights("gqa", tmp_path_factory)
    model = LlamaModel(config, weights, device="cpu", max_seq=8)
    model.prefill(SEQ[:6])
    with pytest.raises(ValueError) as err:
        model.prefill(SEQ[6:9])  # rows 6..8 of a cache of 8
    assert "8" in str(err.value), f"the message should name max_seq: {err.value}"
    assert model.pos == 6, "a refused run leaves pos alone"
    model.decode(SEQ[6])
    last = model.decode(SEQ[7])  # the last row
    check(last[None], hf_logits(hf, SEQ[:8])[-1:], "decode into the cache's last row")
    with pytest.raises(ValueError):
        model.decode(SEQ[8])
    assert model.memory_bytes() > 0


# (absolute, share of the largest logit): the solution is off by about 0.003 in f16 and 0.025 in bf16
# on logits up to 3; a wrong position or layout by whole units (see the module docstring)
HALF_TOL = {"float16": (0.01, 0.005), "bfloat16": (0.05, 0.02)}


def check_half(got, want, dtype, what, tol=None):
    """float32 logits on the CPU within HALF_TOL[dtype] (or `tol`) of HF's float32 logits."""
    assert isinstance(got, torch.Tensor), f"{what}: expected a torch tensor, got {type(got).__name__}"
    assert got.dtype == torch.float32, f"{what}: logits are float32 whatever the model's dtype, got {got.dtype}"
    assert got.device.type == "cpu", f"{what}: logits come back on the CPU"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    atol, share = tol or HALF_TOL[dtype]
    bound = atol + share * float(want.abs().max())
    err = float((got - want).abs().max())
    assert err <= bound, f"{what}: logits differ from Hugging Face's by {err:.3g} (allowed {bound:.3g})"


@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"], ids=["f16", "bf16"])
def test_half_precision_models(dtype, tmp_path_factory):
    from kiln.ir import DType
    from llama.model import LlamaModel, build_graph

    hf, config, weights = model_and_weights("gqa", tmp_path_factory, dtype)
    short = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    g = build_graph(config, weights, n_tokens=3, max_seq=16)
    buffers = {n.attrs["name"]: str(n.type) for n in g.buffers}
    want = {f"layers.{i}.{kv}_cache": f"{short}[16, 2, 8]" for i in range(2) for kv in "kv"}
    assert buffers == want, f"the caches hold the model's dtype: {buffers}"
    (out,) = g.outputs
    assert out.type.dtype is DType[dtype], f"the graph's logits are {short}[T, V] (the model's dtype): {out.type}"
    assert g.constants["rope.inv_freq"].dtype == torch.float32

    model = LlamaModel(config, weights, device="cpu", max_seq=16)
    steps = [model.prefill(SEQ[:4])]
    check_half(steps[0], hf_logits(hf, SEQ[:4]), dtype, f"{dtype}: prefill of 4 tokens")
    for tok in SEQ[4:]:
        steps.append(model.decode(tok)[None])
    check_half(torch.cat(steps), hf_logits(hf, SEQ), dtype, f"{dtype}: prefill(4) then decode vs Hugging Face")
    model.reset()
    last = model.prefill(SEQ[:6], last=True)
    assert tuple(last.shape) == (64,), f"prefill(last=True) returns logits [V], got {list(last.shape)}"
    check_half(last[None], hf_logits(hf, SEQ[:6])[-1:], dtype, f"{dtype}: prefill(last=True)")


# --- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu  # left out (not failed) where there is no GPU
@pytest.mark.points(3)
def test_gpu_steps_match_the_cpu(tmp_path_factory):
    """Prefill, decode steps (the captured step graphs), a second prefill chunk and a reset, on the
    GPU and on the CPU executor side by side: the same logits and pos after every run."""
    from llama.model import LlamaModel

    _, config, weights = model_and_weights(GPU_MODEL, tmp_path_factory)
    cpu = LlamaModel(config, weights, device="cpu", max_seq=24)
    gpu = LlamaModel(config, weights, device="cuda", max_seq=24)
    # prefill 4, decode 5, prefill 2 (another length, compiled after runs), decode 2; reset; again
    script = [("prefill", SEQ[:4]), *(("decode", [t]) for t in SEQ[4:9]), ("prefill", SEQ[9:11])]
    script += [("decode", [9]), ("decode", [8]), ("reset", []), ("prefill", SEQ[3:6]), ("decode", [7])]
    for k, (what, tokens) in enumerate(script):
        if what == "reset":
            cpu.reset()
            gpu.reset()
            continue
        run = f"step {k} ({what} of {tokens} at pos {cpu.pos})"
        want = cpu.prefill(tokens) if what == "prefill" else cpu.decode(tokens[0])
        got = gpu.prefill(tokens) if what == "prefill" else gpu.decode(tokens[0])
        assert got.device.type == "cpu" and got.dtype == torch.float32, f"{run}: {got.dtype} on {got.device}"
        assert tuple(got.shape) == tuple(want.shape), f"{run}: shape {list(got.shape)}, expected {list(want.shape)}"
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=lambda m, run=run: f"{run}: {m}")
        assert gpu.pos == cpu.pos, f"{run}: pos is {gpu.pos} on the GPU after the run, {cpu.pos} expected"


@pytest.mark.gpu  # left out (not failed) where there is no GPU
@pytest.mark.points(1)
def test_gpu_half_model_returns_float32_logits(tmp_path_factory):
    from llama.model import LlamaModel

    hf, config, weights = model_and_weights(GPU_MODEL, tmp_path_factory, "float16")
    model = LlamaModel(config, weights, device="cuda", max_seq=16)
    rows = [model.prefill(SEQ[:4])] + [model.decode(t)[None] for t in SEQ[4:]]
    assert model.pos == len(SEQ)
    # the GPU rounds at other places than the CPU executor (fused epilogues, the norm's prologue):
    # task 06's bound for its f16 model
    tol = (0.05, 0.01)
    check_half(torch.cat(rows), hf_logits(hf, SEQ), "float16", "float16 on the GPU: prefill(4) then decode", tol)
    last = model.prefill([3], last=True)[None]
    check_half(last, hf_logits(hf, [*SEQ, 3])[-1:], "float16", "float16 on the GPU: prefill(last=True)", tol)


def test_llama_graph(grade):
    grade(TASK)
