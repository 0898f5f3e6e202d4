"""Checkpoint loaders: Hugging Face safetensors directories and llama2.c `.bin` files.

Every loader returns `(LlamaConfig, weights)` where weights is a flat dict under ONE naming
scheme, whatever the file used. The names follow Meta's reference implementation (and llama2.c):

    tok_embeddings               (vocab_size, dim)        token embedding table
    layers.{i}.attention_norm    (dim,)                   RMSNorm before attention
    layers.{i}.wq                (n_heads * head_dim, dim)
    layers.{i}.wk                (n_kv_heads * head_dim, dim)
    layers.{i}.wv                (n_kv_heads * head_dim, dim)
    layers.{i}.wo                (dim, n_heads * head_dim)
    layers.{i}.ffn_norm          (dim,)                   RMSNorm before the MLP
    layers.{i}.w1                (hidden_dim, dim)        gate projection (goes through SiLU)
    layers.{i}.w2                (dim, hidden_dim)        down projection
    layers.{i}.w3                (hidden_dim, dim)        up projection
    norm                         (dim,)                   final RMSNorm
    output                       (vocab_size, dim)        classifier; the SAME tensor object as
                                                          tok_embeddings when tie_embeddings

Linear weights are in torch's (out, in) layout, so y = x @ w.T. The rows of wq and wk are in the
order config.rope_layout says ("half" for Hugging Face, "interleaved" for llama2.c);
`convert_rope_layout` switches between them.

Unknown tensors in a Hugging Face checkpoint are an error, not skipped: a name we do not know
means a model we do not implement (biases, an extra norm, another architecture), and running it
without that tensor would give plausible-looking wrong text. The one exception is the
`rotary_emb.inv_freq` buffer some old checkpoints carry: it is derived from the config, which we
recompute, so it is ignored.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from .config import DTYPES, ConfigError, LlamaConfig

__all__ = [
    "LLAMA2C_MAGIC",
    "CheckpointError",
    "Progress",
    "check_weights",
    "convert_rope_layout",
    "expected_shapes",
    "export_llama2c",
    "hf_name",
    "load",
    "load_hf",
    "load_llama2c",
    "permute_rope_rows",
]

Progress = Callable[[str, float], None]

LLAMA2C_MAGIC = 0x616B3432  # the bytes "2" "4" "k" "a" read as a little-endian uint32: "ak42"
_V1_HEADER = 256
_LEGACY_HEADER = 7 * 4
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# the tensors llama2.c stores as one block per kind, stacked over layers
_PER_LAYER = ("attention_norm", "ffn_norm", "wq", "wk", "wv", "wo", "w1", "w2", "w3")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing, truncated, corrupt, or not the model it claims."""


# --- the naming scheme --------------------------------------------------------------------------


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model under our names, with its shape, in a stable order."""
    d, h, q, kv = config.dim, config.hidden_dim, config.n_heads * config.head_dim, config.kv_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings": (config.vocab_size, d)}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attention_norm": (d,),
            p + "wq": (q, d),
            p + "wk": (kv, d),
            p + "wv": (kv, d),
            p + "wo": (d, q),
            p + "ffn_norm": (d,),
            p + "w1": (h, d),
            p + "w2": (d, h),
            p + "w3": (h, d),
        }
    shapes |= {"norm": (d,), "output": (config.vocab_size, d)}
    return shapes


def check_weights(config: LlamaConfig, weights: Mapping[str, torch.Tensor], *, source: str = "weights") -> None:
    """Raises CheckpointError unless weights holds exactly the model's tensors with the right shapes."""
    want = expected_shapes(config)
    missing = [n for n in want if n not in weights]
    if missing:
        raise CheckpointError(f"{source}: missing tensors {_short(missing)}")
    extra = [n for n in weights if n not in want]
    if extra:
        raise CheckpointError(f"{source}: unknown tensors {_short(extra)}")
    for name, shape in want.items():
        found = tuple(weights[name].shape)
        if found != shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {found}, expected {shape} from the config")


def _short(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{f', ... ({len(names)} in all)' if len(names) > limit else ''}]"


# Hugging Face's per-layer module paths -> our per-layer names
_HF_LAYER = {
    "input_layernorm.weight": "attention_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "w1",
    "mlp.down_proj.weight": "w2",
    "mlp.up_proj.weight": "w3",
}
_HF_TOP = {"embed_tokens.weight": "tok_embeddings", "norm.weight": "norm"}
_HF_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)")


def _hf_name(name: str) -> str | None:
    """Our name for a Hugging Face tensor name, "" for one to ignore, None for one we do not know."""
    if name == "lm_head.weight":
        return "output"
    # LlamaForCausalLM prefixes the body with "model."; a bare LlamaModel checkpoint does not
    body = name.removeprefix("model.")
    if body in _HF_TOP:
        return _HF_TOP[body]
    m = _HF_LAYER_RE.fullmatch(body)
    if m:
        if m.group(2) == "self_attn.rotary_emb.inv_freq":
            return ""  # a cached buffer derived from rope_theta; the model recomputes it
        if m.group(2) in _HF_LAYER:
            return f"layers.{m.group(1)}.{_HF_LAYER[m.group(2)]}"
    return None


def hf_name(ours: str) -> str:
    """The Hugging Face (LlamaForCausalLM) name of one of our tensor names: `layers.3.wq` ->
    `model.layers.3.self_attn.q_proj.weight`, the inverse of the loader's table."""
    if ours == "output":
        return "lm_head.weight"
    top = {v: k for k, v in _HF_TOP.items()}
    if ours in top:
        return f"model.{top[ours]}"
    layer = {v: k for k, v in _HF_LAYER.items()}
    _, i, short = ours.split(".")
    return f"model.layers.{i}.{layer[short]}"


# --- Hugging Face ---------------------------------------------------------------------------------


def _dtype_name(dtype: str | torch.dtype | None) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        for name, td in _TORCH_DTYPES.items():
            if td == dtype:
                return name
        raise CheckpointError(f"dtype: must be one of {DTYPES}, got {dtype}")
    aliases = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16", "bf16": "bfloat16"}
    name = aliases.get(dtype, dtype)
    if name not in DTYPES:
        raise CheckpointError(f"dtype: must be one of {DTYPES}, got {dtype!r}")
    return name


def load_hf(
    path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    progress: Progress | None = None,
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Loads a Hugging Face LLaMA directory: config.json plus model.safetensors, or a sharded set
    listed by model.safetensors.index.json. dtype=None keeps the file's dtype; otherwise every
    tensor is cast to it. config.dtype is the dtype the weights come back in."""
    from safetensors import SafetensorError, safe_open

    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (a Hugging Face checkpoint is a directory with config.json)")
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{root}: no config.json")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from e
    want_dtype = _dtype_name(dtype)
    try:
        config = replace(LlamaConfig.from_hf(raw), name=root.resolve().name)
    except ConfigError as e:
        raise CheckpointError(f"{cfg_path}: {e}") from e

    # Which file holds which tensor. With an index, the index is the table of contents and every
    # listed shard must exist; without one, everything is in model.safetensors.
    index_path = root / "model.safetensors.index.json"
    single = root / "model.safetensors"
    if index_path.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index_path}: not a safetensors index with a 'weight_map' ({e})") from e
        files = sorted(set(weight_map.values()))
        for shard in files:
            if not (root / shard).is_file():
                first = next(n for n, f in weight_map.items() if f == shard)
                raise CheckpointError(
                    f"{root}: shard {shard!r} is listed in {index_path.name} (e.g. for {first!r}) but missing"
                )
    elif single.is_file():
        weight_map, files = {}, [single.name]
    else:
        others = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        hint = f"; found {others}: only safetensors is supported, convert with save_pretrained" if others else ""
        raise CheckpointError(
            f"{root}: looked for model.safetensors.index.json and model.safetensors, found neither{hint}"
        )

    want = expected_shapes(config)
    total = len(want)
    weights: dict[str, torch.Tensor] = {}
    hf_lm_head: torch.Tensor | None = None
    file_dtype: str | None = None
    unknown: list[str] = []
    for fname in files:
        fpath = root / fname
        try:
            # safe_open checks that the header is well formed and that its offsets fit the file,
            # which is what catches a truncated download
            with safe_open(str(fpath), framework="pt") as f:
                keys = list(f.keys())
                for name in keys:
                    ours = _hf_name(name)
                    if ours is None:
                        unknown.append(name)
                        continue
                    if ours == "":
                        continue
                    if ours not in want:
                        # a layer index past n_layers: the config and the weights disagree
                        unknown.append(f"{name} (config.json has {config.n_layers} layers)")
                        continue
                    sl = f.get_slice(name)
                    st_dtype = sl.get_dtype()
                    if st_dtype not in _SAFETENSORS_DTYPES:
                        raise CheckpointError(
                            f"{fpath.name}: tensor {name!r} has dtype {st_dtype}; accepted are F32, F16 and BF16"
                        )
                    shape = tuple(sl.get_shape())
                    if shape != want[ours]:
                        raise CheckpointError(
                            f"{fpath.name}: tensor {name!r} ({ours}) has shape {shape}, "
                            f"expected {want[ours]} from config.json"
                        )
                    t = f.get_tensor(name)
                    if want_dtype is not None:
                        t = t.to(_TORCH_DTYPES[want_dtype])
                    if ours == "output" and config.tie_embeddings:
                        hf_lm_head = t  # compared with the embedding once both are loaded
                        continue
                    if ours in weights:
                        raise CheckpointError(f"{root}: tensor {name!r} appears in more than one file")
                    weights[ours] = t
                    if ours == "tok_embeddings":
                        file_dtype = _SAFETENSORS_DTYPES[st_dtype]
                    if progress is not None:
                        progress(f"loaded {ours}", len(weights) / total)
            for name in weight_map:
                if weight_map[name] == fname and name not in keys:
                    raise CheckpointError(f"{fpath.name}: tensor {name!r} is listed in the index but not in the file")
        except SafetensorError as e:
            raise CheckpointError(f"{fpath}: not a valid safetensors file (truncated or corrupt?): {e}") from e
        except OSError as e:
            raise CheckpointError(f"{fpath}: cannot read ({e})") from e
    if unknown:
        raise CheckpointError(
            f"{root}: unknown tensors {_short(unknown)}; they belong to a model lab 5 does not implement"
        )

    if config.tie_embeddings and "tok_embeddings" in weights:
        if hf_lm_head is not None and not torch.equal(hf_lm_head, weights["tok_embeddings"]):
            raise CheckpointError(f"{root}: tie_word_embeddings is true but lm_head.weight differs from embed_tokens")
        weights["output"] = weights["tok_embeddings"]
    missing = [n for n in want if n not in weights]
    if missing:
        hint = " (untied model: lm_head.weight is needed)" if missing == ["output"] else ""
        raise CheckpointError(f"{root}: missing tensors {_short(missing)}{hint}")
    # keep the model's order, which is also the order lab 5 builds its graph in
    weights = {n: weights[n] for n in want}
    config = replace(config, dtype=want_dtype or file_dtype or config.dtype)
    if progress is not None:
        progress("done", 1.0)
    return config, weights


# --- llama2.c ---------------------------------------------------------------------------------------


def _plausible_header(dim: int, hidden: int, layers: int, heads: int, kv: int, vocab: int, seq: int) -> bool:
    """Whether 7 int32s look like a llama2.c header. Used to tell a legacy .bin (which has no
    magic number) from any other file before trusting its sizes."""
    return (
        0 < dim <= 1 << 16
        and 0 < hidden <= 1 << 18
        and 0 < layers <= 1024
        and 0 < heads <= dim
        and 0 < kv <= heads
        and dim % heads == 0
        and heads % kv == 0
        and 0 < abs(vocab) <= 1 << 22
        and 0 < seq <= 1 << 22
    )


def _read_llama2c_header(path: Path) -> tuple[int, tuple[int, ...], bool, int]:
    """(version, 7 params with vocab made positive, shared classifier, header bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_V1_HEADER)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e})") from e
    if len(head) >= 8 and struct.unpack_from("<I", head)[0] == LLAMA2C_MAGIC:
        version = struct.unpack_from("<i", head, 4)[0]
        if version == 2:
            raise CheckpointError(
                f"{path}: llama2.c version 2 (int8 Q8_0 quantized) is not supported; export version 1 (fp32)"
            )
        if version != 1:
            raise CheckpointError(f"{path}: llama2.c checkpoint version {version} is not supported (only 0 and 1)")
        if len(head) < _V1_HEADER:
            raise CheckpointError(f"{path}: truncated header: {len(head)} bytes, a version 1 header is {_V1_HEADER}")
        params = struct.unpack_from("<7i", head, 8)
        shared = bool(head[8 + 28])
        if not _plausible_header(*params) or params[5] <= 0:
            raise CheckpointError(f"{path}: version 1 header has implausible parameters {params}")
        return 1, params, shared, _V1_HEADER
    if len(head) < _LEGACY_HEADER:
        raise CheckpointError(f"{path}: {len(head)} bytes is too short for a llama2.c header")
    params = struct.unpack_from("<7i", head)
    if not _plausible_header(*params):
        raise CheckpointError(
            f"{path}: neither the llama2.c magic 0x{LLAMA2C_MAGIC:08x} nor a plausible legacy header "
            f"(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) = {params}"
        )
    # legacy: a negative vocab_size is how the format says "the classifier is stored separately"
    shared = params[5] > 0
    params = (*params[:5], abs(params[5]), params[6])
    return 0, params, shared, _LEGACY_HEADER


def _llama2c_layout(config: LlamaConfig, version: int, shared: bool) -> list[tuple[str, tuple[int, ...]]]:
    """The blocks of float32s after the header, in file order. Per-layer blocks are stacked over
    layers: ("wq", (n_layers, q, dim)) etc. "freq_cis_*" blocks are precomputed RoPE tables of the
    legacy format that we skip (the model recomputes them from rope_theta)."""
    c = config
    nl, d, h, q, kv = c.n_layers, c.dim, c.hidden_dim, c.n_heads * c.head_dim, c.kv_dim
    mats = [("wq", (nl, q, d)), ("wk", (nl, kv, d)), ("wv", (nl, kv, d)), ("wo", (nl, d, q))]
    ffn = [("w1", (nl, h, d)), ("w2", (nl, d, h)), ("w3", (nl, h, d))]
    emb = ("tok_embeddings", (c.vocab_size, d))
    if version == 0:
        half = c.max_seq_len * c.head_dim // 2
        blocks = [emb, ("attention_norm", (nl, d)), *mats, ("ffn_norm", (nl, d)), *ffn, ("norm", (d,))]
        blocks += [("freq_cis_real", (half,)), ("freq_cis_imag", (half,))]
    else:
        # version 1 puts all the small norm vectors first, then the matrices, and has no RoPE tables
        blocks = [("attention_norm", (nl, d)), ("ffn_norm", (nl, d)), ("norm", (d,)), emb, *mats, *ffn]
    if not shared:
        blocks.append(("output", (c.vocab_size, d)))
    return blocks


def load_llama2c(
    path: str | os.PathLike[str],
    progress: Progress | None = None,
    *,
    norm_eps: float = 1e-5,
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Loads a llama2.c `.bin`: the legacy format (version 0, no magic) or version 1 (fp32 with a
    256-byte header). Version 2 (Q8_0) is rejected. The tensors are views of a copy-on-write
    memory map, so nothing is read until used and nothing is copied.

    The format stores neither norm_eps nor rope_theta: llama2.c's run.c fixes them at 1e-5 and
    10000, and so do we (norm_eps can be overridden for an export of a model trained otherwise).
    """
    p = Path(path)
    version, params, shared, header = _read_llama2c_header(p)
    dim, hidden, layers, heads, kv, vocab, seq = params
    try:
        config = LlamaConfig(
            dim=dim,
            n_layers=layers,
            n_heads=heads,
            n_kv_heads=kv,
            vocab_size=vocab,
            hidden_dim=hidden,
            norm_eps=norm_eps,
            rope_theta=10000.0,
            max_seq_len=seq,
            tie_embeddings=shared,
            rope_layout="interleaved",
            dtype="float32",
            name=p.name,
        )
    except ConfigError as e:
        raise CheckpointError(f"{p}: {e}") from e
    blocks = _llama2c_layout(config, version, shared)
    n_floats = sum(math.prod(shape) for _, shape in blocks)
    expected = header + 4 * n_floats
    actual = p.stat().st_size
    if actual != expected:
        what = "truncated" if actual < expected else "trailing bytes after the weights"
        raise CheckpointError(
            f"{p}: {what}: the header (version {version}, {params}) implies {expected} bytes, the file has {actual}"
        )
    # mode "c" (copy-on-write) gives writable arrays, which torch.from_numpy wants, without ever
    # writing to the file and without reading pages until a tensor is used
    flat = np.memmap(p, dtype="<f4", mode="c", offset=header, shape=(n_floats,))
    weights: dict[str, torch.Tensor] = {}
    pos = 0
    for i, (name, shape) in enumerate(blocks):
        n = math.prod(shape)
        block = torch.from_numpy(flat[pos : pos + n]).view(shape)
        pos += n
        if name.startswith("freq_cis"):
            continue
        if name in _PER_LAYER:
            for layer in range(layers):
                weights[f"layers.{layer}.{name}"] = block[layer]
        else:
            weights[name] = block
        if progress is not None:
            progress(f"mapped {name}", (i + 1) / len(blocks))
    if shared:
        weights["output"] = weights["tok_embeddings"]
    weights = {n: weights[n] for n in expected_shapes(config)}
    return config, weights


def permute_rope_rows(w: torch.Tensor, n_heads: int, to: str = "interleaved") -> torch.Tensor:
    """Reorders the rows of a query or key projection between the two RoPE layouts.

    Within each head of width hd, the "half" layout keeps the first coordinates of the rotated
    pairs in rows 0..hd/2-1 and their partners in rows hd/2..hd-1; the "interleaved" layout keeps
    pair j in rows 2j and 2j+1. to="interleaved" maps half -> interleaved, to="half" the inverse.
    Pass n_kv_heads for wk. Works on any tensor whose first dimension is the projection's rows.
    """
    if to not in ("interleaved", "half"):
        raise ValueError(f"to: must be 'interleaved' or 'half', got {to!r}")
    rows, rest = w.shape[0], tuple(w.shape[1:])
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even width")
    half = rows // n_heads // 2
    # view each head as a (2, half) grid (half layout: [which-of-pair, pair]) or as a (half, 2)
    # grid (interleaved: [pair, which-of-pair]); the other layout is that grid transposed
    grid = (n_heads, 2, half) if to == "interleaved" else (n_heads, half, 2)
    return w.reshape(*grid, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()


def convert_rope_layout(
    config: LlamaConfig, weights: Mapping[str, torch.Tensor], layout: str
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """The same model with wq and wk rows in the given RoPE layout ("half" or "interleaved")."""
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout: must be 'half' or 'interleaved', got {layout!r}")
    if layout == config.rope_layout:
        return config, dict(weights)
    out = dict(weights)
    for i in range(config.n_layers):
        out[f"layers.{i}.wq"] = permute_rope_rows(weights[f"layers.{i}.wq"], config.n_heads, layout)
        out[f"layers.{i}.wk"] = permute_rope_rows(weights[f"layers.{i}.wk"], config.n_kv_heads, layout)
    return replace(config, rope_layout=layout), out


def _write_f32(f: BinaryIO, t: torch.Tensor) -> None:
    # one tensor at a time, so exporting never holds a second float32 copy of the whole model
    np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy(), dtype="<f4").tofile(f)


def export_llama2c(
    config: LlamaConfig,
    weights: Mapping[str, torch.Tensor],
    path: str | os.PathLike[str],
    version: int = 1,
    progress: Progress | None = None,
) -> None:
    """Writes a llama2.c checkpoint in float32: version 1 (256-byte header, the default) or the
    legacy version 0 (the only one llama2.c's run.c reads). Weights in the "half" RoPE layout are
    permuted to llama2.c's interleaved one on the way out."""
    if version not in (0, 1):
        raise CheckpointError(f"export_llama2c: version {version} is not supported (0 = legacy, 1 = fp32)")
    # the format cannot record these; a reader would silently use the defaults and get wrong text
    if config.rope_theta != 10000.0:
        raise CheckpointError(f"export_llama2c: rope_theta {config.rope_theta} cannot be stored (llama2.c fixes 10000)")
    if config.rope_scaling is not None:
        raise CheckpointError("export_llama2c: rope_scaling cannot be stored in a llama2.c checkpoint")
    check_weights(config, weights, source="export_llama2c")
    config, w = convert_rope_layout(config, weights, "interleaved")
    shared = config.tie_embeddings
    params = (
        config.dim,
        config.hidden_dim,
        config.n_layers,
        config.n_heads,
        config.n_kv_heads,
        config.vocab_size if (shared or version == 1) else -config.vocab_size,
        config.max_seq_len,
    )
    blocks = _llama2c_layout(config, version, shared)
    with open(path, "wb") as f:
        if version == 1:
            header = struct.pack("<Ii7iB", LLAMA2C_MAGIC, 1, *params, int(shared))
            f.write(header + b"\0" * (_V1_HEADER - len(header)))
        else:
            f.write(struct.pack("<7i", *params))
        for i, (name, _) in enumerate(blocks):
            if name.startswith("freq_cis"):
                # legacy readers expect cos (real) then sin (imag) of position * frequency
                pos = torch.arange(config.max_seq_len, dtype=torch.float64)[:, None]
                freqs = torch.tensor(config.inv_freq(), dtype=torch.float64)[None, :]
                table = torch.cos(pos * freqs) if name == "freq_cis_real" else torch.sin(pos * freqs)
                _write_f32(f, table)
            elif name in _PER_LAYER:
                for layer in range(config.n_layers):
                    _write_f32(f, w[f"layers.{layer}.{name}"])
            else:
                _write_f32(f, w[name])
            if progress is not None:
                progress(f"wrote {name}", (i + 1) / len(blocks))


# --- format detection -------------------------------------------------------------------------------


def load(
    path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    progress: Progress | None = None,
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Loads whichever supported checkpoint is at path: a directory with config.json (Hugging
    Face) or a llama2.c `.bin` (magic number, or a plausible legacy header). dtype applies to
    Hugging Face checkpoints, and casts llama2.c's float32 weights when given."""
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").is_file():
            return load_hf(p, dtype=dtype, progress=progress)
        raise CheckpointError(f"{p}: a directory without config.json; looked for a Hugging Face checkpoint")
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    try:
        _read_llama2c_header(p)
    except CheckpointError as e:
        if "not supported" in str(e) or "truncated header" in str(e):
            raise
        raise CheckpointError(
            f"{p}: unrecognised checkpoint; looked for a directory with config.json (Hugging Face), a file "
            f"starting with the llama2.c magic 0x{LLAMA2C_MAGIC:08x}, or a plausible llama2.c legacy header"
        ) from e
    config, weights = load_llama2c(p, progress=progress)
    name = _dtype_name(dtype)
    if name is not None and name != "float32":
        tied = config.tie_embeddings
        weights = {n: t.to(_TORCH_DTYPES[name]) for n, t in weights.items() if not (tied and n == "output")}
        if tied:
            weights["output"] = weights["tok_embeddings"]
        weights = {n: weights[n] for n in expected_shapes(config)}
        config = replace(config, dtype=name)
    return config, weights
