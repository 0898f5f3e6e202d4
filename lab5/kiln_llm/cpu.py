"""Lab 5 task 01 · LLaMA's operators on the CPU: the reference every GPU kernel is checked against.

Implement: the CPU kernel of each operator of kiln_llm/ops.py (embedding, rmsnorm, linear,
           linear_add, linear_swiglu, rope, kv_update, attention), in the TODO regions. The
           chapter's sections "RMSNorm", "Rotary embeddings" and "Attention with a KV cache"
           explain them.
Contract:  a kernel `fn(node, args)` gets the node (its attrs and its output type) and its inputs
           as CPU tensors, and returns a contiguous tensor of `node.type`, except `kv_update`,
           which writes into the cache (its input 0) and returns it. Floats are F (f32, f16 or
           bf16): compute in float32 and round to F once at the end, except rmsnorm, which rounds
           the normalised x to F before multiplying by the weight in F (Hugging Face's
           LlamaRMSNorm, so that checkpoints give HF's numbers). `pos` is an i64[1] tensor read at
           run time: token t of this run sits at absolute position pos + t.
           embedding: KilnRunError for a token outside [0, V). kv_update: KilnRunError when the
           rows pos..pos+T-1 do not fit in the cache. attention: query t of head h attends cache
           rows 0..pos+t of kv head h // (H / Hkv), and never reads a row past pos+T-1 (the
           cache holds anything there: an earlier, longer conversation).
Test:      make test-lab5 TASK=01
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kiln.cpu import register_cpu
from kiln.ir import Node
from kiln.runtime import KilnRunError


def _rows(node: Node, pos: torch.Tensor, n_tokens: int, cache_rows: int) -> int:
    """The run-time position, checked: rows pos..pos+T-1 must lie in a cache of cache_rows."""
    p = int(pos.item())
    if p < 0 or p + n_tokens > cache_rows:
        raise KilnRunError(
            f"%{node.name} ({node.op}): pos {p} with {n_tokens} token(s) needs cache rows "
            f"{p}..{p + n_tokens - 1}, the cache has rows 0..{cache_rows - 1}"
        )
    return p


@register_cpu("embedding")
def embedding(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: table[tokens] (T, D); refuse a token outside [0, V); see the chapter's section "Embedding"
    raise NotImplementedError("lab5/01: embedding")  # ~
    # TODO(lab5/01) end


@register_cpu("rmsnorm")
def rmsnorm(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: normalise in fp32, round to F, then times w in F (about 3 lines); see "RMSNorm"
    raise NotImplementedError("lab5/01: rmsnorm")  # ~
    # TODO(lab5/01) end


@register_cpu("linear")
def linear(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: x @ w.T, fp32 accumulation, one rounding (1 line)
    raise NotImplementedError("lab5/01: linear")  # ~
    # TODO(lab5/01) end


@register_cpu("linear_add")
def linear_add(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: x @ w.T + r, all in fp32, one rounding (1 line)
    raise NotImplementedError("lab5/01: linear_add")  # ~
    # TODO(lab5/01) end


@register_cpu("linear_swiglu")
def linear_swiglu(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: silu(x @ w1.T) * (x @ w3.T), all in fp32, one rounding (about 3 lines)
    raise NotImplementedError("lab5/01: linear_swiglu")  # ~
    # TODO(lab5/01) end


# --- the fused forms fusion.py makes (given): what the decode GEMV's RMSNorm prologue computes


def _normalized(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """rmsnorm(x, g) in float32, never rounded to F: the row the GEMV multiplies by."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g.float()  # (M, K)


@register_cpu("rmsnorm_linear")
def rmsnorm_linear(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    x, g, w = args
    return (_normalized(x, g, node.attrs["eps"]) @ w.float().T).to(x.dtype)  # (M, N)


@register_cpu("rmsnorm_linear_swiglu")
def rmsnorm_linear_swiglu(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    x, g, w1, w3 = args
    h = _normalized(x, g, node.attrs["eps"])
    return (torch.nn.functional.silu(h @ w1.float().T) * (h @ w3.float().T)).to(x.dtype)  # (M, N)


@register_cpu("rope")
def rope(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: turn pair j by (pos + t) * inv_freq[j] in fp32, in the node's layout; see "Rotary embeddings"
    raise NotImplementedError("lab5/01: rope")  # ~
    # TODO(lab5/01) end


@register_cpu("kv_update")
def kv_update(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: cache[pos:pos+T] = value, refused when it does not fit; return the cache itself
    raise NotImplementedError("lab5/01: kv_update")  # ~
    # TODO(lab5/01) end


@register_cpu("attention")
def attention(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab5/01) begin: causal GQA over the filled prefix only, softmax in fp32; see "Attention with a KV cache"
    raise NotImplementedError("lab5/01: attention")  # ~
    # TODO(lab5/01) end


# --- the forms fusion.py folds RoPE and the cache writes into (given): the operators they stand for,
# one after the other


@register_cpu("rope_kv_update")
def rope_kv_update(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    cache, value, pos, inv_freq = args
    return kv_update(node, [cache, rope(node, [value, pos, inv_freq]), pos])


@register_cpu("attention_rope")
def attention_rope(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    q, k, v, pos, inv_freq = args
    return attention(node, [rope(node, [q, pos, inv_freq]), k, v, pos])


@register_cpu("attention_append")
def attention_append(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    q, k_new, v_new, cache_k, cache_v, pos, inv_freq = args  # the caches are written in place
    k = rope_kv_update(node, [cache_k, k_new, pos, inv_freq])
    v = kv_update(node, [cache_v, v_new, pos])
    return attention_rope(node, [q, k, v, pos, inv_freq])


@register_cpu("rmsnorm_linear_qkv")
def rmsnorm_linear_qkv(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    x, g, *weights = args
    return torch.cat([rmsnorm_linear(node, [x, g, w]) for w in weights], dim=1)  # (M, Nq + Nk + Nv)


@register_cpu("attention_append_qkv")
def attention_append_qkv(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    qkv, cache_k, cache_v, pos, inv_freq = args  # qkv (1, (H + 2 Hkv) Dh)
    _, kv_heads, dh = cache_k.shape
    q, k_new, v_new = qkv.view(1, -1, dh).split([qkv.shape[1] // dh - 2 * kv_heads, kv_heads, kv_heads], dim=1)
    return attention_append(node, [q, k_new, v_new, cache_k, cache_v, pos, inv_freq])
