"""Lab 5's checkpoint loaders (lab5/llama): Hugging Face safetensors directories and llama2.c
.bin files, their error messages, the llama2.c export and the RoPE row permutation. CPU only;
every file a test reads is written by the test into tmp_path."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")

LAB5 = Path(__file__).resolve().parents[1] / "lab5"
if str(LAB5) not in sys.path:
    sys.path.insert(0, str(LAB5))

from llama import (  # noqa: E402 (after the path set-up above)
    CheckpointError,
    ConfigError,
    LlamaConfig,
    convert_rope_layout,
    expected_shapes,
    export_llama2c,
    load,
    load_hf,
    load_llama2c,
    permute_rope_rows,
)
from llama.checkpoint import LLAMA2C_MAGIC  # noqa: E402

HF_NAMES = {
    "attention_norm": "input_layernorm",
    "wq": "self_attn.q_proj",
    "wk": "self_attn.k_proj",
    "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "w1": "mlp.gate_proj",
    "w2": "mlp.down_proj",
    "w3": "mlp.up_proj",
}


def hf_name(ours: str) -> str:
    """The Hugging Face name of one of our tensor names (written out independently of the loader)."""
    if ours == "tok_embeddings":
        return "model.embed_tokens.weight"
    if ours == "norm":
        return "model.norm.weight"
    if ours == "output":
        return "lm_head.weight"
    _, i, short = ours.split(".")
    return f"model.layers.{i}.{HF_NAMES[short]}.weight"


def tiny_hf(tmp: Path, *, tie: bool = False, llama3: bool = False, shard: bool = False, dtype=None):
    """A random 2-layer LlamaForCausalLM with GQA (4 query heads, 2 key/value heads), saved to tmp."""
    transformers = pytest.importorskip("transformers")
    kw: dict = {}
    if llama3:
        kw = {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "max_position_embeddings": 256,
        }
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=97,
        tie_word_embeddings=tie,
        **kw,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # HF initialises norms to ones; random values catch a swapped norm
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {"max_shard_size": "20KB"} if shard else {}
    model.save_pretrained(tmp, safe_serialization=True, **kwargs)
    return model


def assert_matches_state_dict(weights: dict, model) -> None:
    sd = model.state_dict()
    for name, t in weights.items():
        ref = sd[hf_name(name)] if name != "output" or "lm_head.weight" in sd else sd["model.embed_tokens.weight"]
        assert t.dtype == ref.dtype, name
        assert torch.equal(t, ref), name


# --- Hugging Face ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("shard", [False, True], ids=["single", "sharded"])
def test_load_hf_matches_state_dict(tmp_path, tie, shard):
    model = tiny_hf(tmp_path, tie=tie, shard=shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").is_file()
        assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    seen: list[tuple[str, float]] = []
    config, weights = load_hf(tmp_path, progress=lambda what, frac: seen.append((what, frac)))
    assert config == LlamaConfig(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=97,
        hidden_dim=128,
        norm_eps=model.config.rms_norm_eps,
        rope_theta=10000.0,
        max_seq_len=model.config.max_position_embeddings,
        tie_embeddings=tie,
        rope_layout="half",
        dtype="float32",
    )
    assert list(weights) == list(expected_shapes(config))
    assert len(weights) == 2 + 9 * 2 + 1
    assert_matches_state_dict(weights, model)
    assert (weights["output"] is weights["tok_embeddings"]) == tie
    assert seen and seen[-1][1] == 1.0 and all(0 <= f <= 1 for _, f in seen)


def test_load_hf_llama3_config(tmp_path):
    model = tiny_hf(tmp_path, llama3=True)
    config, weights = load_hf(tmp_path)
    assert config.rope_theta == 500000.0 and config.n_kv_heads == 2 and config.max_seq_len == 256
    s = config.rope_scaling
    assert s is not None and (s.factor, s.low_freq_factor, s.high_freq_factor) == (8.0, 1.0, 4.0)
    assert s.original_max_position_embeddings == 64
    assert_matches_state_dict(weights, model)
    # the stored scaling reproduces the frequencies HF's model actually uses
    ours = torch.tensor(config.inv_freq(), dtype=torch.float32)
    torch.testing.assert_close(ours, model.model.rotary_emb.inv_freq.float(), rtol=1e-5, atol=0)


def test_from_hf_transformers4_spelling():
    raw = {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "intermediate_size": 5632,
        "vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    }
    c = LlamaConfig.from_hf(raw)
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.kv_dim) == (2048, 22, 32, 4, 64, 256)
    assert c.rope_theta == 500000.0 and c.rope_scaling is not None and c.rope_scaling.factor == 32.0
    assert c.dtype == "bfloat16" and c.norm_eps == 1e-5
    # TinyLlama-style: no scaling, no head_dim, rope_theta at the top level
    raw = {k: v for k, v in raw.items() if k not in ("rope_scaling", "rope_theta")}
    c = LlamaConfig.from_hf(raw)
    assert c.rope_scaling is None and c.rope_theta == 10000.0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope_scaling"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"model_type": "mistral"}, "model_type"),
        ({"head_dim": 32}, "head_dim"),
        ({"num_key_value_heads": 3}, "n_heads"),
        ({"hidden_size": 0}, "dim"),
        ({"torch_dtype": "int8"}, "dtype"),
    ],
)
def test_from_hf_errors_name_the_field(change, field):
    raw = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 97,
    }
    assert LlamaConfig.from_hf(raw).n_kv_heads == 4  # absent num_key_value_heads: plain multi-head
    with pytest.raises(ConfigError, match=field):
        LlamaConfig.from_hf({**raw, **change})


def test_from_hf_missing_field():
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        LlamaConfig.from_hf({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 9})


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"dim": -1}, "dim"),
        ({"n_kv_heads": 3}, "n_kv_heads"),
        ({"rope_layout": "zigzag"}, "rope_layout"),
        ({"dtype": "int4"}, "dtype"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"n_layers": True}, "n_layers"),
    ],
)
def test_config_validation(kw, field):
    base = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 97, "hidden_dim": 128}
    with pytest.raises(ConfigError, match=field):
        LlamaConfig(**{**base, **kw})


def test_load_hf_dtypes(tmp_path):
    model = tiny_hf(tmp_path, dtype=torch.float16)
    config, weights = load_hf(tmp_path)
    assert config.dtype == "float16" and all(t.dtype == torch.float16 for t in weights.values())
    assert_matches_state_dict(weights, model)
    config, weights = load_hf(tmp_path, dtype="bfloat16")
    assert config.dtype == "bfloat16" and all(t.dtype == torch.bfloat16 for t in weights.values())
    config, weights = load_hf(tmp_path, dtype=torch.float32)
    assert config.dtype == "float32"
    torch.testing.assert_close(weights["layers.1.w2"], model.model.layers[1].mlp.down_proj.weight.float())
    with pytest.raises(CheckpointError, match="dtype"):
        load_hf(tmp_path, dtype="int8")


def test_load_hf_rejects_integer_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_hf(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    sd["model.norm.weight"] = torch.ones(64, dtype=torch.int8)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' has dtype I8"):
        load_hf(tmp_path)


@pytest.mark.parametrize(
    "keep",
    [lambda n: n - 100, lambda n: n // 2, lambda n: 20, lambda n: 0],
    ids=["tail-cut", "half", "inside-header", "empty"],
)
def test_truncated_safetensors(tmp_path, keep):
    tiny_hf(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: keep(len(data))])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_hf(tmp_path)


def test_missing_shard(tmp_path):
    tiny_hf(tmp_path, shard=True)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=rf"shard '{victim.name}' is listed .* but missing"):
        load_hf(tmp_path)


def test_index_lists_tensor_absent_from_its_shard(tmp_path):
    tiny_hf(tmp_path, shard=True)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = next(iter(index["weight_map"].values()))
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model.layers.9.mlp.up_proj.weight' is listed in the index"):
        load_hf(tmp_path)


def test_wrong_shape_names_tensor(tmp_path):
    tiny_hf(tmp_path)
    cfg_path = tmp_path / "config.json"
    raw = json.loads(cfg_path.read_text())
    raw["intermediate_size"] = 96
    cfg_path.write_text(json.dumps(raw))
    with pytest.raises(
        CheckpointError,
        # whichever MLP tensor the file lists first; each names itself, our name, found and expected
        match=r"'model\.layers\.\d\.mlp\.(gate|up|down)_proj\.weight' \(layers\.\d\.w[123]\) "
        r"has shape \((128, 64|64, 128)\), expected \((96, 64|64, 96)\)",
    ):
        load_hf(tmp_path)


def test_more_layers_in_file_than_config(tmp_path):
    tiny_hf(tmp_path)
    cfg_path = tmp_path / "config.json"
    raw = json.loads(cfg_path.read_text())
    raw["num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config\.json has 1 layers"):
        load_hf(tmp_path)


def test_unknown_tensor_is_an_error_inv_freq_is_not(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_hf(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(sd, tmp_path / "model.safetensors")
    _, weights = load_hf(tmp_path)  # a derived buffer: ignored
    assert_matches_state_dict(weights, model)
    sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unknown tensors \['model.layers.0.self_attn.q_proj.bias'\]"):
        load_hf(tmp_path)


def test_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_hf(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    del sd["model.layers.1.post_attention_layernorm.weight"]
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.1.ffn_norm'\]"):
        load_hf(tmp_path)


def test_untied_config_needs_lm_head(tmp_path):
    tiny_hf(tmp_path, tie=True)
    cfg_path = tmp_path / "config.json"
    raw = json.loads(cfg_path.read_text())
    raw["tie_word_embeddings"] = False
    cfg_path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"lm_head\.weight is needed"):
        load_hf(tmp_path)


def test_tied_with_different_lm_head_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_hf(tmp_path, tie=True)
    sd = load_file(tmp_path / "model.safetensors")
    sd["lm_head.weight"] = torch.randn(97, 64)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"lm_head\.weight differs"):
        load_hf(tmp_path)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, tmp_path / "model.safetensors")
    _, weights = load_hf(tmp_path)
    assert weights["output"] is weights["tok_embeddings"]


def test_directory_errors(tmp_path):
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_hf(tmp_path)
    tiny_hf(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"found neither; found \['pytorch_model.bin'\]"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_hf(tmp_path)


# --- llama2.c ---------------------------------------------------------------------------------------

SMALL = LlamaConfig(
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=11,
    hidden_dim=24,
    max_seq_len=8,
    rope_layout="interleaved",
)


def random_weights(config: LlamaConfig, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = {n: torch.randn(s, generator=g) for n, s in expected_shapes(config).items()}
    if config.tie_embeddings:
        w["output"] = w["tok_embeddings"]
    return w


def write_llama2c_by_hand(path: Path, config: LlamaConfig, w: dict, version: int) -> None:
    """The two fp32 layouts, written directly from the format description (not with export_llama2c)."""
    c, layers = config, range(config.n_layers)
    params = [c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq_len]
    per_layer = lambda short: [w[f"layers.{i}.{short}"] for i in layers]  # noqa: E731
    mats = [t for s in ("wq", "wk", "wv", "wo") for t in per_layer(s)]
    ffn = [t for s in ("w1", "w2", "w3") for t in per_layer(s)]
    if version == 0:
        if not c.tie_embeddings:
            params[5] = -params[5]
        head = struct.pack("<7i", *params)
        rope = torch.zeros(2 * c.max_seq_len * c.head_dim // 2)  # freq_cis_real, freq_cis_imag: skipped
        order = [
            w["tok_embeddings"],
            *per_layer("attention_norm"),
            *mats,
            *per_layer("ffn_norm"),
            *ffn,
            w["norm"],
            rope,
        ]
    else:
        head = struct.pack("<Ii7iB", LLAMA2C_MAGIC, 1, *params, int(c.tie_embeddings))
        head += bytes(256 - len(head))
        order = [*per_layer("attention_norm"), *per_layer("ffn_norm"), w["norm"], w["tok_embeddings"], *mats, *ffn]
    if not c.tie_embeddings:
        order.append(w["output"])
    path.write_bytes(head + b"".join(t.float().numpy().astype("<f4").tobytes() for t in order))


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_llama2c_reads_hand_written_files(tmp_path, version, tie):
    config = LlamaConfig(**{**SMALL.__dict__, "tie_embeddings": tie})
    w = random_weights(config)
    path = tmp_path / "model.bin"
    write_llama2c_by_hand(path, config, w, version)
    got_config, got = load_llama2c(path)
    assert got_config == config
    assert list(got) == list(w)
    for name in w:
        assert torch.equal(got[name], w[name]), name
    assert (got["output"] is got["tok_embeddings"]) == tie
    assert load(path)[0] == config


@pytest.mark.parametrize("version", [0, 1])
def test_llama2c_size_is_checked_exactly(tmp_path, version):
    path = tmp_path / "model.bin"
    write_llama2c_by_hand(path, SMALL, random_weights(SMALL), version)
    size = path.stat().st_size
    data = path.read_bytes()
    path.write_bytes(data[:-4])
    with pytest.raises(CheckpointError, match=rf"truncated: .* implies {size} bytes, the file has {size - 4}"):
        load_llama2c(path)
    path.write_bytes(data + b"\0" * 8)
    with pytest.raises(CheckpointError, match=rf"trailing bytes .* implies {size} bytes, the file has {size + 8}"):
        load_llama2c(path)


def test_llama2c_version2_and_unknown_versions_rejected(tmp_path):
    path = tmp_path / "q80.bin"
    path.write_bytes(struct.pack("<Ii", LLAMA2C_MAGIC, 2) + bytes(4096))
    with pytest.raises(CheckpointError, match=r"version 2 \(int8 Q8_0 quantized\) is not supported"):
        load_llama2c(path)
    with pytest.raises(CheckpointError, match="version 2"):
        load(path)
    path.write_bytes(struct.pack("<Ii", LLAMA2C_MAGIC, 7) + bytes(4096))
    with pytest.raises(CheckpointError, match="version 7 is not supported"):
        load_llama2c(path)


def test_unknown_format(tmp_path):
    junk = tmp_path / "weights.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(CheckpointError, match=r"unrecognised checkpoint; looked for a directory with config\.json"):
        load(junk)
    with pytest.raises(CheckpointError, match=r"directory without config\.json"):
        load(tmp_path)
    with pytest.raises(CheckpointError, match="no such file"):
        load(tmp_path / "absent.bin")
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(b"\1\2")
    with pytest.raises(CheckpointError):
        load(tiny)


# --- RoPE layouts and the export ------------------------------------------------------------------


def rope_half(x, pos, theta=10000.0):
    """HF's variant: coordinate j is paired with j + hd/2 (rotate_half). x: (T, n_heads, hd)."""
    hd = x.shape[-1]
    freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None].double() * freq[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2].double(), x[..., hd // 2 :].double()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rope_interleaved(x, pos, theta=10000.0):
    """llama2.c's variant: coordinates 2j and 2j+1 form pair j."""
    hd = x.shape[-1]
    freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None].double() * freq[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    a, b = x[..., 0::2].double(), x[..., 1::2].double()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def test_permute_rope_rows_is_an_involution_pair():
    w = torch.randn(4 * 8, 5)
    inter = permute_rope_rows(w, 4, "interleaved")
    assert not torch.equal(inter, w)
    assert torch.equal(permute_rope_rows(inter, 4, "half"), w)
    assert torch.equal(permute_rope_rows(permute_rope_rows(w, 4, "half"), 4, "interleaved"), w)
    # within a head, half-split row j goes to 2j and row hd/2 + j to 2j + 1
    assert torch.equal(inter[2], w[1]) and torch.equal(inter[3], w[4 + 1]) and torch.equal(inter[8], w[8])
    with pytest.raises(ValueError, match="heads of even width"):
        permute_rope_rows(torch.randn(12, 3), 4)
    with pytest.raises(ValueError, match="to"):
        permute_rope_rows(w, 4, "sideways")


def test_permuted_rows_give_the_same_rope_and_attention():
    torch.manual_seed(1)
    n_heads, n_kv, hd, dim, t = 4, 2, 8, 16, 6
    x = torch.randn(t, dim)
    wq, wk = torch.randn(n_heads * hd, dim), torch.randn(n_kv * hd, dim)
    pos = torch.arange(t)
    q_half = rope_half((x @ wq.T).view(t, n_heads, hd), pos)
    k_half = rope_half((x @ wk.T).view(t, n_kv, hd), pos)
    wq_i, wk_i = permute_rope_rows(wq, n_heads), permute_rope_rows(wk, n_kv)
    q_int = rope_interleaved((x @ wq_i.T).view(t, n_heads, hd), pos)
    k_int = rope_interleaved((x @ wk_i.T).view(t, n_kv, hd), pos)
    # the rotated vectors are the same up to the same row order the weights were given
    back = permute_rope_rows(q_int.reshape(t, -1).T, n_heads, "half").T.reshape(t, n_heads, hd)
    torch.testing.assert_close(back, q_half)
    # and the attention scores, which only see dot products within a head, are identical
    rep = n_heads // n_kv
    s_half = torch.einsum("qhd,khd->hqk", q_half, k_half.repeat_interleave(rep, 1))
    s_int = torch.einsum("qhd,khd->hqk", q_int, k_int.repeat_interleave(rep, 1))
    torch.testing.assert_close(s_half, s_int)


def reference_logits(config: LlamaConfig, w: dict, tokens: list[int]):
    """A plain float64 LLaMA forward on our weight names, with the RoPE variant of config.rope_layout."""
    c, t = config, len(tokens)
    rope = rope_half if c.rope_layout == "half" else rope_interleaved
    pos = torch.arange(t)

    def rms(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * g.double()

    def lin(x, name):
        return x @ w[name].double().T

    h = w["tok_embeddings"].double()[torch.tensor(tokens)]
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c.n_layers):
        p = f"layers.{i}."
        x = rms(h, w[p + "attention_norm"])
        q = rope(lin(x, p + "wq").view(t, c.n_heads, c.head_dim), pos, c.rope_theta)
        k = rope(lin(x, p + "wk").view(t, c.n_kv_heads, c.head_dim), pos, c.rope_theta)
        v = lin(x, p + "wv").view(t, c.n_kv_heads, c.head_dim)
        rep = c.n_heads // c.n_kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / c.head_dim**0.5 + mask, -1)
        h = h + lin(torch.einsum("hqk,khd->qhd", att, v).reshape(t, -1), p + "wo")
        x = rms(h, w[p + "ffn_norm"])
        h = h + lin(torch.nn.functional.silu(lin(x, p + "w1")) * lin(x, p + "w3"), p + "w2")
    return lin(rms(h, w["norm"]), "output")


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_export_llama2c_round_trip_and_same_logits(tmp_path, version, tie):
    model = tiny_hf(tmp_path / "hf", tie=tie)
    config, weights = load_hf(tmp_path / "hf")
    tokens = [1, 5, 42, 7, 96, 3, 3]
    with torch.no_grad():
        hf = model(torch.tensor([tokens])).logits[0].double()
    # our names and layouts really are the model HF runs
    torch.testing.assert_close(reference_logits(config, weights, tokens), hf, rtol=1e-4, atol=1e-4)

    seen: list[float] = []
    path = tmp_path / "model.bin"
    export_llama2c(config, weights, path, version=version, progress=lambda _, f: seen.append(f))
    assert seen[-1] == 1.0
    c2, w2 = load(path)
    assert c2.rope_layout == "interleaved" and c2.tie_embeddings == tie
    assert (c2.dim, c2.n_layers, c2.n_heads, c2.n_kv_heads, c2.vocab_size, c2.hidden_dim, c2.max_seq_len) == (
        64,
        2,
        4,
        2,
        97,
        128,
        model.config.max_position_embeddings,
    )
    # llama2.c does not store norm_eps; the same model with HF's eps gives HF's logits with the
    # interleaved RoPE on the permuted rows
    c2 = LlamaConfig(**{**c2.__dict__, "norm_eps": config.norm_eps})
    torch.testing.assert_close(reference_logits(c2, w2, tokens), hf, rtol=1e-4, atol=1e-4)
    # and switching back gives HF's tensors bit for bit
    c3, w3 = convert_rope_layout(c2, w2, "half")
    assert c3.rope_layout == "half"
    assert_matches_state_dict(w3, model)


def test_export_writes_what_the_format_says(tmp_path):
    config = LlamaConfig(**{**SMALL.__dict__, "tie_embeddings": False})
    w = random_weights(config, seed=3)
    by_hand, exported = tmp_path / "hand.bin", tmp_path / "export.bin"
    for version in (0, 1):
        write_llama2c_by_hand(by_hand, config, w, version)
        export_llama2c(config, w, exported, version=version)
        a, b = by_hand.read_bytes(), exported.read_bytes()
        assert len(a) == len(b)
        if version == 1:
            assert a == b
        else:  # identical apart from the RoPE tables, which the hand-written file leaves zero
            rope_bytes = 4 * config.max_seq_len * config.head_dim
            end = len(a) - 4 * config.vocab_size * config.dim
            assert a[: end - rope_bytes] == b[: end - rope_bytes] and a[end:] == b[end:]


def test_export_rejects_what_llama2c_cannot_store(tmp_path):
    config = LlamaConfig(**{**SMALL.__dict__, "rope_theta": 500000.0})
    with pytest.raises(CheckpointError, match="rope_theta"):
        export_llama2c(config, random_weights(config), tmp_path / "x.bin")
    w = random_weights(SMALL)
    w["layers.0.wk"] = torch.randn(3, 16)
    with pytest.raises(CheckpointError, match=r"'layers.0.wk' has shape \(3, 16\), expected \(8, 16\)"):
        export_llama2c(SMALL, w, tmp_path / "x.bin")
    with pytest.raises(CheckpointError, match="version 2"):
        export_llama2c(SMALL, random_weights(SMALL), tmp_path / "x.bin", version=2)


def test_load_llama2c_casts_on_request(tmp_path):
    path = tmp_path / "m.bin"
    config = LlamaConfig(**{**SMALL.__dict__, "tie_embeddings": True})
    write_llama2c_by_hand(path, config, random_weights(config), 1)
    c, w = load(path, dtype="float16")
    assert c.dtype == "float16" and all(t.dtype == torch.float16 for t in w.values())
    assert w["output"] is w["tok_embeddings"]


def test_hf_name_is_the_loaders_table_inverted():
    """`llama.checkpoint.hf_name` (the benchmark builds transformers' model with it) against the
    names written out above, for every tensor of a two-layer model."""
    from llama.checkpoint import hf_name as ours_to_hf

    for name in ["tok_embeddings", "norm", "output"] + [f"layers.{i}.{s}" for i in (0, 1) for s in HF_NAMES]:
        assert ours_to_hf(name) == hf_name(name), name
