"""The training text: lab 5's story corpus and tokenizer, as a token stream and seeded batches (given).

Lab 5's tiny LLaMA is trained on stories written by a small grammar (lab5/tiny/corpus.py) with a
byte-level BPE of 512 tokens (lab5/tiny/train.py); this task trains on the same text with the same
tokenizer, imported from lab 5, not copied. Where the grader runs the task, lab 5's `tiny` package
is staged beside `gpt`; in the repository it is found in ../lab5.

    tokens(n_stories, seed) -> (stream, vocab_size)   one int64 stream <s> story </s> <s> ... (CPU)
    Batches(stream, batch, context, seed, device)      batch k: rows drawn with a generator seeded
                                                       by (seed, k), so two runs see the same batches
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import ModuleType

import torch

N_STORIES = 6000  # about 1.2 MB of text, 422k tokens


def _tiny() -> tuple[ModuleType, ModuleType]:
    """lab 5's tiny.corpus and tiny.train modules."""
    try:
        import tiny.corpus  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab5"))
    from tiny import corpus, train

    return corpus, train


@functools.cache
def tokens(n_stories: int = N_STORIES, seed: int = 0) -> tuple[torch.Tensor, int]:
    """The corpus of (n_stories, seed) encoded by a BPE tokenizer trained on it: (stream, vocab size)."""
    corpus, train = _tiny()
    text = corpus.corpus(n_stories, seed)
    tk = train.train_tokenizer(text, 512)
    stream = torch.tensor(train.encode_stories(tk, text), dtype=torch.int64)
    return stream, tk.get_vocab_size()


class Batches:
    """Seeded batches of (inputs, targets), each (batch, context) int64 on `device`: batch k depends
    on (seed, k) only, so the reference run and yours read the same tokens at every step."""

    def __init__(self, stream: torch.Tensor, batch: int, context: int, seed: int = 0, device: str = "cuda") -> None:
        if stream.numel() < context + 2:
            raise ValueError(f"a stream of {stream.numel()} tokens is shorter than one row of {context + 1}")
        self.stream = stream.to(device)
        self.batch, self.context, self.seed, self.device = batch, context, seed, device

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + k)
        starts = torch.randint(0, self.stream.numel() - self.context - 1, (self.batch,), generator=gen)
        rows = self.stream[starts.to(self.device)[:, None] + torch.arange(self.context + 1, device=self.device)]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
