"""Lab 5's embedded tiny LLaMA (lab5/tiny/): the story corpus is deterministic and stays inside its grammar,
and a few training steps of a shrunken model write a checkpoint that transformers and tokenizers load.
CPU only and quick: the full training (minutes) is never run here."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

LAB5 = Path(__file__).resolve().parents[1] / "lab5"
if str(LAB5) not in sys.path:
    sys.path.insert(0, str(LAB5))

from tiny import corpus  # noqa: E402 (after the path set-up above; the corpus needs nothing installed)

# --- the corpus --------------------------------------------------------------------------------------


def test_corpus_is_deterministic() -> None:
    assert corpus.corpus(300, seed=7) == corpus.corpus(300, seed=7)
    assert corpus.corpus(300, seed=7) != corpus.corpus(300, seed=8)
    assert corpus.corpus(0) == ""
    with pytest.raises(ValueError, match="n_stories"):
        corpus.corpus(-1)


def test_corpus_words_are_the_grammars() -> None:
    text = corpus.corpus(2000, seed=0)
    vocab = corpus.vocabulary()
    assert 150 <= len(vocab) <= 400, len(vocab)  # "a few hundred words": small enough to learn in minutes
    used = set(corpus.words(text))
    assert used <= vocab, sorted(used - vocab)
    assert len(used) > 0.9 * len(vocab)  # 2000 stories reach nearly every word
    assert re.fullmatch(r"[A-Za-z ,.\n]+", text), "only letters, spaces, commas, full stops and newlines"


def test_stories_have_three_to_six_sentences_about_one_character() -> None:
    stories = corpus.corpus(500, seed=1).split(corpus.STORY_SEPARATOR)
    assert len(stories) == 500
    names = {c[0] for c in corpus.CHARACTERS}
    for story in stories:
        sentences = [s for s in story.split(". ") if s]
        assert 3 <= len(sentences) <= 6, story
        assert story.endswith(".")
        hero = next(w for w in re.findall(r"[A-Z][a-z]+", sentences[0]) if w in names)
        assert hero in sentences[-1], story  # the ending comes back to the character the story opened with


# --- a short training run ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_train() -> ModuleType:
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from tiny import train

    return train


def small(tiny_train: ModuleType, **changes: object) -> Any:
    # a model and corpus small enough that 30 steps take about a second
    cfg = tiny_train.TrainConfig(
        steps=30,
        n_stories=300,
        vocab_size=300,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=64,
        context=32,
        batch_size=8,
        lr=1e-2,
        warmup=5,
        log_every=10,
        eval_batches=2,
    )
    return replace(cfg, **changes)


@pytest.fixture(scope="module")
def trained(tiny_train: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    lines: list[str] = []
    result = tiny_train.train(small(tiny_train), out, lines.append)
    result.log = lines
    return result


def test_short_training_writes_a_loadable_checkpoint(tiny_train: ModuleType, trained: Any) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    out = trained.out
    assert tiny_train.is_usable(out)
    for name in (*tiny_train.REQUIRED_FILES, "tiny.json"):
        assert (out / name).is_file(), name
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tiny-llama.")]  # no temporary left

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "llama"
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (4, 2)  # GQA
    tk = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert model.config.vocab_size == tk.get_vocab_size()
    side = json.loads((out / "tokenizer_config.json").read_text())
    assert (side["bos_token"], side["eos_token"]) == ("<s>", "</s>")
    assert (tk.token_to_id("<s>"), tk.token_to_id("</s>")) == (model.config.bos_token_id, model.config.eos_token_id)

    text = "Once upon a time, Lily met a dog by the pond."
    ids = tk.encode(text).ids
    assert ids[0] == tk.token_to_id("<s>")
    assert tk.decode(ids) == text
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), tk.get_vocab_size())
    assert torch.isfinite(logits).all()


def test_short_training_lowers_the_loss(trained: Any) -> None:
    losses = [v for _, v in trained.losses]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert trained.final_loss == pytest.approx(sum(losses[-10:]) / 10)
    assert trained.sample.startswith("Once upon a time")
    assert any("step    30/30" in line for line in trained.log)


def test_training_is_deterministic(tiny_train: ModuleType, trained: Any, tmp_path: Path) -> None:
    again = tiny_train.train(small(tiny_train), tmp_path / "again")
    assert again.losses == trained.losses
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (trained.out / "model.safetensors").read_bytes()


def test_ensure_tiny_model_trains_only_when_missing(
    tiny_train: ModuleType, trained: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    assert tiny_train.ensure_tiny_model(trained.out, said.append) == trained.out
    assert said == []  # present: nothing trained, nothing said

    quick = small(tiny_train, steps=3)  # made before the patch below, which small() would see
    monkeypatch.setattr(tiny_train, "TrainConfig", lambda: quick)
    out = tmp_path / "models" / "tiny-llama"
    started: list[int] = []
    # on_train runs once training is decided, after the line that says so and before any step
    assert tiny_train.ensure_tiny_model(out, said.append, on_train=lambda: started.append(len(said))) == out
    assert tiny_train.is_usable(out)
    assert str(out) in said[0] and "training" in said[0]  # says what it makes and where, before it starts
    assert said[-1].startswith(f"lab5: saved {out}")
    assert started == [1]
    assert tiny_train.ensure_tiny_model(out, said.append, on_train=lambda: started.append(-1)) == out
    assert started == [1]  # there now: nothing trained, on_train not called


def test_batches_are_the_rows_the_seeded_offsets_pick(tiny_train: ModuleType) -> None:
    """A batch is one gather at offsets drawn per step from the seeded generator: the same rows as
    slicing the stream at each offset, and the same offsets whether drawn one step at a time or
    all up front, so the training on the CPU gives the weights it gave before batches were gathered."""
    import torch

    cfg = small(tiny_train)
    data = torch.arange(5000) * 7 % 300
    gen, again = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    offsets = torch.stack([tiny_train._starts(data, cfg, gen) for _ in range(4)])
    for starts in offsets:
        expected = torch.stack([data[s : s + cfg.context + 1] for s in tiny_train._starts(data, cfg, again).tolist()])
        x, y = tiny_train._rows(data, starts, cfg)
        assert torch.equal(x, expected[:, :-1]) and torch.equal(y, expected[:, 1:])


def test_training_records_where_its_seconds_went(trained: Any) -> None:
    assert list(trained.phases) == ["imports", "text", "model", "steps", "evaluation", "save"]
    assert all(v >= 0 for v in trained.phases.values())
    assert sum(trained.phases.values()) == pytest.approx(trained.seconds, abs=0.05)  # one after another, t0 to saved
    record = json.loads((trained.out / "tiny.json").read_text())
    assert set(record["phases"]) == set(trained.phases)
    assert any("set up in" in line for line in trained.log)
