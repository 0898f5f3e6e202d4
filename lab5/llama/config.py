"""The shape of a LLaMA-family model, independent of the file it came from.

Every loader in this package turns its own format's header or config.json into one `LlamaConfig`,
so the rest of lab 5 (the model builder, the checks, the tests) reads the same fields whatever the
checkpoint was. The field names follow Meta's reference code (dim, n_layers, ...) because those are
short and are also what llama2.c's header stores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CUDA_HEAD_DIMS", "CUDA_ROW_MULTIPLE", "DTYPES", "ROPE_LAYOUTS", "ConfigError", "LlamaConfig", "RopeScaling"]

# The float formats a checkpoint may hold. Anything else (int8 blocks, fp8) needs a dequantiser,
# which lab 5 does not have, so it is rejected early rather than misread.
DTYPES = ("float32", "float16", "bfloat16")

# Where the two halves of each rotated pair of a head live:
#   "half":        pairs are (j, j + head_dim/2): Hugging Face's checkpoints and rotate_half.
#   "interleaved": pairs are (2j, 2j + 1): Meta's original checkpoints and llama2.c.
# The same model can be stored either way; only the rows of wq and wk differ (see checkpoint.py).
ROPE_LAYOUTS = ("half", "interleaved")

# What lab 5's CUDA kernels run (kiln_llm/kernels/llm_kernels.h), checked when a model is compiled for
# the GPU (LlamaModel), so that a model they cannot run is refused by name before anything is built:
# attention takes any even head_dim in CUDA_HEAD_DIMS (and any GQA ratio); the linear kernels read
# f16 and bf16 rows in 16-byte vectors, so in those dtypes the length of every row they reduce over
# (dim, and hidden_dim for the MLP's down projection) must be a multiple of CUDA_ROW_MULTIPLE.
CUDA_HEAD_DIMS = (8, 256)
CUDA_ROW_MULTIPLE = 8


class ConfigError(ValueError):
    """A model configuration that lab 5 cannot run; the message names the offending field."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's "llama3" frequency scaling (the only scaling type accepted).

    Wavelengths shorter than original_max_position_embeddings / high_freq_factor keep their
    frequency, those longer than original_max_position_embeddings / low_freq_factor are divided by
    `factor`, and the band in between is blended linearly. This stretches the slow rotations for a
    longer context while keeping the fast ones that encode nearby positions.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ConfigError(f"rope_scaling.rope_type: only 'llama3' is supported, got {self.rope_type!r}")
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            if not (isinstance(getattr(self, name), (int, float)) and getattr(self, name) > 0):
                raise ConfigError(f"rope_scaling.{name}: must be a positive number, got {getattr(self, name)!r}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must be larger than "
                f"rope_scaling.low_freq_factor ({self.low_freq_factor})"
            )
        if not (isinstance(self.original_max_position_embeddings, int) and self.original_max_position_embeddings > 0):
            raise ConfigError(
                "rope_scaling.original_max_position_embeddings: must be a positive integer, "
                f"got {self.original_max_position_embeddings!r}"
            )


@dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of one LLaMA-family decoder.

    dim is Hugging Face's hidden_size and hidden_dim its intermediate_size (the SwiGLU width).
    n_kv_heads < n_heads is grouped-query attention: n_heads / n_kv_heads query heads share one
    key/value head. dtype names the float format the weights were loaded in.
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    rope_layout: str = "half"
    dtype: str = "float32"
    rope_scaling: RopeScaling | None = field(default=None)
    # where it was loaded from (a checkpoint's folder or file name), for messages; not part of the shape
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "max_seq_len"):
            value = getattr(self, name)
            # bool is an int in Python; a True here is always a config mistake
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
        if self.dim % self.n_heads:
            raise ConfigError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            # RoPE rotates pairs of coordinates, so a head needs an even width
            raise ConfigError(f"head_dim (dim / n_heads = {self.head_dim}) must be even for rotary embeddings")
        if not (isinstance(self.norm_eps, (int, float)) and 0 < self.norm_eps < 1):
            raise ConfigError(f"norm_eps: must be a small positive number, got {self.norm_eps!r}")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 1):
            raise ConfigError(f"rope_theta: must be a number larger than 1, got {self.rope_theta!r}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ConfigError(f"rope_layout: must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"rope_scaling: must be a RopeScaling or None, got {type(self.rope_scaling).__name__}")

    def cuda_limits(self) -> list[str]:
        """What lab 5's CUDA kernels cannot run in this model, a phrase each; [] when they run all of it."""
        low, high = CUDA_HEAD_DIMS
        out = []
        if self.head_dim > high:
            out.append(f"head_dim {self.head_dim} is past the CUDA kernels' limit of {high}")
        elif self.head_dim < low:
            out.append(f"head_dim {self.head_dim} is below the CUDA kernels' minimum of {low}")
        if self.dtype != "float32":
            for key in ("dim", "hidden_dim"):
                value = getattr(self, key)
                if value % CUDA_ROW_MULTIPLE:
                    out.append(
                        f"{key} {value} is not a multiple of {CUDA_ROW_MULTIPLE}, which the CUDA linear kernels "
                        f"need in {self.dtype} (float32 has no such limit)"
                    )
        return out

    def check_cuda(self) -> None:
        """Refuses, naming the model, every value the CUDA kernels cannot run (cuda_limits)."""
        limits = self.cuda_limits()
        if limits:
            what = self.name or f"of dim {self.dim} with {self.n_heads} heads"
            raise ConfigError(f"model {what}: " + "; ".join(limits))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's keys (and values): n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    def inv_freq(self) -> list[float]:
        """The head_dim/2 rotation frequencies of RoPE, with Llama 3's scaling applied if any.

        Frequency j is theta^(-2j/head_dim); pair j of a head at position p turns by p * freq[j].
        Returned as plain floats so that this module needs no torch.
        """
        half = self.head_dim // 2
        freqs = [self.rope_theta ** (-(2 * j) / self.head_dim) for j in range(half)]
        s = self.rope_scaling
        if s is None:
            return freqs
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        out = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                out.append(f)
            elif wavelen > low_wavelen:
                out.append(f / s.factor)
            else:
                smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                    s.high_freq_factor - s.low_freq_factor
                )
                out.append((1 - smooth) * f / s.factor + smooth * f)
        return out

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], *, dtype: str | None = None) -> LlamaConfig:
        """Reads a Hugging Face config.json (already parsed) of Llama 2, Llama 3/3.1 or TinyLlama.

        Handles both the transformers 4.x spelling (rope_theta, rope_scaling at the top level)
        and the 5.x one (a rope_parameters dict). Options that change the computation but that
        lab 5's model does not implement (biases, another activation, a head_dim that is not
        dim / n_heads, an unknown RoPE scaling) are rejected here, naming the field, so that a
        model never silently runs with the wrong maths.
        """

        def need(key: str) -> Any:
            if key not in config:
                raise ConfigError(f"config.json: required field {key!r} is missing")
            return config[key]

        model_type = config.get("model_type", "llama")
        if model_type != "llama":
            raise ConfigError(f"model_type: expected 'llama', got {model_type!r}")
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act: LLaMA's SwiGLU needs 'silu', got {act!r}")
        for flag in ("attention_bias", "mlp_bias"):
            if config.get(flag):
                raise ConfigError(f"{flag}: biases are not supported by lab 5's LLaMA (got {config[flag]!r})")
        dim = need("hidden_size")
        n_heads = need("num_attention_heads")
        n_kv = config.get("num_key_value_heads")
        n_kv = n_heads if n_kv is None else n_kv  # absent in Llama 1/2-7B configs: plain multi-head
        head_dim = config.get("head_dim")
        if (
            head_dim is not None
            and isinstance(dim, int)
            and isinstance(n_heads, int)
            and n_heads > 0
            and head_dim != dim // n_heads
        ):
            raise ConfigError(
                f"head_dim: must equal hidden_size / num_attention_heads = {dim // n_heads}, got {head_dim}"
            )

        # transformers 5 nests rope settings in rope_parameters; 4.x has them at the top level
        rope_params = dict(config.get("rope_parameters") or {})
        theta = rope_params.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling_dict = config.get("rope_scaling")
        if rope_params.get("rope_type", "default") != "default":
            scaling_dict = rope_params
        scaling = _rope_scaling_from_hf(scaling_dict)

        if dtype is None:
            dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        if dtype not in DTYPES:
            raise ConfigError(f"torch_dtype/dtype: must be one of {DTYPES}, got {dtype!r}")

        return cls(
            dim=dim,
            n_layers=need("num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            vocab_size=need("vocab_size"),
            hidden_dim=need("intermediate_size"),
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_seq_len=config.get("max_position_embeddings", 2048),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_layout="half",
            dtype=dtype,
            rope_scaling=scaling,
        )


def _rope_scaling_from_hf(d: Mapping[str, Any] | None) -> RopeScaling | None:
    if not d:
        return None
    # transformers renamed "type" to "rope_type"; old Llama 3.1 configs still carry both
    kind = d.get("rope_type", d.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(
            f"rope_scaling: type {kind!r} is not supported (lab 5 implements 'llama3' scaling only); "
            "running without it would give wrong positions beyond the trained context"
        )
    missing = [
        k for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings") if k not in d
    ]
    if missing:
        raise ConfigError(f"rope_scaling: 'llama3' scaling needs {missing}")
    return RopeScaling(
        factor=float(d["factor"]),
        low_freq_factor=float(d["low_freq_factor"]),
        high_freq_factor=float(d["high_freq_factor"]),
        original_max_position_embeddings=d["original_max_position_embeddings"],
    )
