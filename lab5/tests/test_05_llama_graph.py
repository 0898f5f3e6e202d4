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

Each model is tiny (2 layers, dim 32, vocab 64): the whole file runs in about a second or two.
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
    builds_on=["kiln_llm/cpu.py", "../lab4/kiln/cpu.py", "../lab4/kiln/planner.py"],
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


def hf_model(n_heads, n_kv_heads, tied, theta, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
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


def model_and_weights(name, tmp_path_factory):
    """(HF model, our config, our weights) for CONFIGS[name], through save_pretrained and llama.load."""
    if name not in _LOADED:
        import llama

        heads, kv, tied, theta, layout = CONFIGS[name]
        hf = hf_model(heads, kv, tied, theta)
        path = tmp_path_factory.mktemp(name)
        hf.save_pretrained(path)
        config, weights = llama.load(path)
        assert config.rope_theta == theta and config.tie_embeddings == tied
        if layout != "half":
            config, weights = llama.convert_rope_layout(config, weights, layout)
        _LOADED[name] = (hf, config, weights)
    return _LOADED[name]


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


def test_llama_graph(grade):
    grade(TASK)
