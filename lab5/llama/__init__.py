"""Lab 5's model-side inputs: LLaMA configurations, checkpoint loaders and tokenizers.

Import from `lab5/` as `import llama` (the tests put lab5 on sys.path, as lab 4's do for kiln).
"""

from .checkpoint import (
    CheckpointError,
    check_weights,
    convert_rope_layout,
    expected_shapes,
    export_llama2c,
    load,
    load_hf,
    load_llama2c,
    permute_rope_rows,
)
from .config import ConfigError, LlamaConfig, RopeScaling
from .tokenizer import Tokenizer, TokenizerError, from_hf_json, from_llama2c_bin, load_tokenizer

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LlamaConfig",
    "RopeScaling",
    "Tokenizer",
    "TokenizerError",
    "check_weights",
    "convert_rope_layout",
    "expected_shapes",
    "export_llama2c",
    "from_hf_json",
    "from_llama2c_bin",
    "load",
    "load_hf",
    "load_llama2c",
    "load_tokenizer",
    "permute_rope_rows",
]
