"""Lab 5's tokenizers (lab5/llama/tokenizer.py): a Hugging Face tokenizer.json trained here on a few
sentences, and a llama2.c tokenizer.bin written here from a made-up vocabulary. Round trips, the
greedy merge order, byte fallback, streaming decode of multi-byte text, and the error messages."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

LAB5 = Path(__file__).resolve().parents[1] / "lab5"
if str(LAB5) not in sys.path:
    sys.path.insert(0, str(LAB5))

pytest.importorskip("torch")  # the llama package imports its checkpoint loaders too

from llama.tokenizer import (  # noqa: E402 (after the path set-up above)
    Llama2cTokenizer,
    TokenizerError,
    from_hf_json,
    from_llama2c_bin,
    load_tokenizer,
)

SENTENCES = [
    "hello world",
    "hello there, world!",
    "naïve café 日本",
    "the quick brown fox jumps over the lazy dog",
    "Once upon a time, there was a little girl named Lily.",
]
MULTIBYTE = "naïve café 日本 ünïcödé 🦙 done"


def joined_stream(tok, ids) -> tuple[str, list[str]]:
    pieces = list(tok.decode_stream(ids))
    return "".join(pieces), pieces


# --- Hugging Face tokenizer.json --------------------------------------------------------------------


def train_hf(tmp: Path, kind: str, *, config: dict | None = None) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tk = tokenizers.Tokenizer(models.BPE())
    if kind == "bytelevel":  # Llama 3 style: every byte is a symbol, so any text encodes
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:  # sentencepiece style: words start with "▁", which the decoder turns back into spaces
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"])
    tk.train_from_iterator(SENTENCES * 3, trainer)
    path = tmp / "tokenizer.json"
    tk.save(str(path))
    if config is not None:
        (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_hf_round_trip_and_specials(tmp_path, kind):
    tok = from_hf_json(train_hf(tmp_path, kind))
    bos, eos = ("<|begin_of_text|>", "<|end_of_text|>") if kind == "bytelevel" else ("<s>", "</s>")
    assert tok.bos_id == tok.token_to_id(bos) and tok.eos_id == tok.token_to_id(eos)
    assert tok.vocab_size == (300 if kind == "bytelevel" else 90)
    for text in SENTENCES:
        ids = tok.encode(text)
        assert ids[0] == tok.bos_id and tok.bos_id not in ids[1:]
        assert tok.decode(ids) == text
        assert tok.encode(text, bos=False) == ids[1:]
        assert tok.encode(text, eos=True)[-1] == tok.eos_id
    assert bos in tok.decode(tok.encode("hello"), skip_special=False)


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_hf_streaming_equals_full_decode(tmp_path, kind):
    tok = from_hf_json(train_hf(tmp_path, kind))
    for text in [*SENTENCES, "hello world hello world", MULTIBYTE if kind == "bytelevel" else "naïve café 日本"]:
        ids = tok.encode(text, eos=True)
        full, pieces = joined_stream(tok, ids)
        assert full == tok.decode(ids) == text
        assert len(pieces) >= len(ids) - 1
    if kind == "bytelevel":
        # the multi-byte characters really are split across tokens: some steps emit nothing
        ids = tok.encode(MULTIBYTE, bos=False)
        _, pieces = joined_stream(tok, ids)
        assert "" in pieces and "\ufffd" not in "".join(pieces)
        assert any("\ufffd" in tok.decode([i]) for i in ids)
    else:
        # a word token alone decodes without its space; the stream keeps it
        ids = tok.encode("hello world", bos=False)
        assert not tok.decode(ids[-1:]).startswith(" ")
        _, pieces = joined_stream(tok, ids)
        assert any(p.startswith(" ") for p in pieces[1:])


def test_hf_stream_object(tmp_path):
    tok = from_hf_json(train_hf(tmp_path, "bytelevel"))
    s = tok.stream()
    ids = tok.encode("日本", bos=False)
    out = [s.push(i) for i in ids]
    assert "".join(out) + s.flush() == "日本"
    # an incomplete character at the very end comes out as U+FFFD, as decode would give it
    s = tok.stream()
    first = tok.encode("日", bos=False)[0]
    assert s.push(first) == ""
    assert s.flush() == tok.decode([first])


def test_hf_specials_from_tokenizer_config_and_arguments(tmp_path):
    path = train_hf(
        tmp_path, "bytelevel", config={"bos_token": {"content": "<|end_of_text|>"}, "eos_token": "<|end_of_text|>"}
    )
    tok = from_hf_json(path)
    assert tok.bos_id == tok.eos_id == tok.token_to_id("<|end_of_text|>")
    tok = from_hf_json(path, bos_token="<|begin_of_text|>")
    assert tok.bos_id == tok.token_to_id("<|begin_of_text|>")
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        from_hf_json(path, eos_token="<|eot_id|>")
    assert load_tokenizer(tmp_path).vocab_size == 300  # a directory holding tokenizer.json


def test_hf_file_errors(tmp_path):
    pytest.importorskip("tokenizers")
    with pytest.raises(TokenizerError, match="not found"):
        from_hf_json(tmp_path / "tokenizer.json")
    path = train_hf(tmp_path, "bytelevel")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(TokenizerError, match="truncated or corrupt"):
        from_hf_json(path)
    tok_dir = tmp_path / "b"
    tok_dir.mkdir()
    tok = from_hf_json(train_hf(tok_dir, "bytelevel"))
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([5, 300])


# --- llama2.c tokenizer.bin ------------------------------------------------------------------------

# a made-up sentencepiece-style vocabulary: <unk>, BOS, EOS, 256 byte tokens, then pieces with scores
PIECES: list[tuple[str, float]] = [
    (" ", -20.0),
    ("h", -21.0),
    ("e", -22.0),
    ("l", -23.0),
    ("o", -24.0),
    ("w", -25.0),
    ("r", -26.0),
    ("d", -27.0),
    ("a", -28.0),
    ("n", -29.0),
    ("v", -30.0),
    ("c", -31.0),
    ("f", -32.0),
    ("é", -33.0),
    ("he", -1.0),
    ("ll", -2.0),
    ("lo", -3.0),  # would win over " w" but "ll" consumed its "l" first
    (" w", -4.0),
    ("or", -5.0),
    ("hell", -6.0),
    ("hello", -7.0),
    (" hello", -8.0),
    ("ca", -9.0),
    ("fé", -10.0),
    ("café", -11.0),
]
BASE = 3 + 256
ID = {p: BASE + i for i, (p, _) in enumerate(PIECES)}


def write_tokenizer_bin(path: Path, pieces: list[tuple[str, float]] = PIECES, *, space: str = " ") -> int:
    """llama2.c's layout: int32 max_token_length, then (float32 score, int32 length, bytes) per token."""
    vocab = [("<unk>", 0.0), ("\n<s>\n", 0.0), ("\n</s>\n", 0.0)]
    vocab += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab += [(p.replace(" ", space), s) for p, s in pieces]
    raw = [(p.encode("utf-8"), s) for p, s in vocab]
    body = b"".join(struct.pack("<fi", s, len(b)) + b for b, s in raw)
    path.write_bytes(struct.pack("<i", max(len(b) for b, _ in raw)) + body)
    return len(vocab)


def byte_ids(text: str) -> list[int]:
    return [3 + b for b in text.encode("utf-8")]


@pytest.mark.parametrize("space", [" ", "▁"])
def test_llama2c_greedy_merges(tmp_path, space):
    n = write_tokenizer_bin(tmp_path / "tokenizer.bin", space=space)
    tok = from_llama2c_bin(tmp_path / "tokenizer.bin", vocab_size=n)
    assert isinstance(tok, Llama2cTokenizer) and tok.vocab_size == n and (tok.bos_id, tok.eos_id) == (1, 2)
    # " hello world": he, ll, " w", or, hell, hello, " hello" in score order; "ld" is no piece
    assert tok.encode("hello world") == [1, ID[" hello"], ID[" w"], ID["or"], ID["l"], ID["d"]]
    assert tok.encode("hello world", bos=False, eos=True) == [ID[" hello"], ID[" w"], ID["or"], ID["l"], ID["d"], 2]
    assert tok.encode("") == [1] and tok.encode("", bos=False) == []
    # "lo" outranks " w" but is never adjacent once "ll" merged: "llo" stays ll + o until "hello"
    assert tok.encode("hallo", bos=False) == [ID[" "], ID["h"], ID["a"], ID["ll"], ID["o"]]


def test_llama2c_byte_fallback_and_round_trip(tmp_path):
    write_tokenizer_bin(tmp_path / "tokenizer.bin")
    tok = from_llama2c_bin(tmp_path / "tokenizer.bin")
    ids = tok.encode("café 日本", bos=False)
    # "é" is a piece, so "café" merges; 日 and 本 are not, so each becomes its three UTF-8 bytes
    assert ids == [ID[" "], ID["café"], ID[" "], *byte_ids("日本")]
    assert tok.decode(ids) == "café 日本"
    for text in ["hello world", MULTIBYTE, " leading space", "two  spaces", "x", "\n", "héllo wörld"]:
        assert tok.decode(tok.encode(text)) == text, text
        assert tok.decode(tok.encode(text, eos=True)) == text
    # BOS/EOS are kept on request, in llama2.c's spelling
    assert tok.decode([1, ID[" hello"], 2], skip_special=False) == "\n<s>\nhello\n</s>\n"


def test_llama2c_streaming_equals_full_decode(tmp_path):
    write_tokenizer_bin(tmp_path / "tokenizer.bin")
    tok = from_llama2c_bin(tmp_path / "tokenizer.bin")
    for text in ["hello world", "naïve café 日本", MULTIBYTE, "hello\nworld 🦙"]:
        ids = tok.encode(text, eos=True)
        full, pieces = joined_stream(tok, ids)
        assert full == tok.decode(ids) == text
    ids = tok.encode("naïve café 日本", bos=False)
    _, pieces = joined_stream(tok, ids)
    # the dummy prefix " " is a token of its own here and emits nothing: decode drops it too
    assert pieces[:2] == ["", "n"]
    assert "" in pieces  # the middle bytes of ï and 日本
    assert "café" in pieces and "日" in pieces and "本" in pieces


def test_llama2c_file_errors(tmp_path):
    path = tmp_path / "tokenizer.bin"
    with pytest.raises(TokenizerError, match="not found"):
        from_llama2c_bin(path)
    n = write_tokenizer_bin(path)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(TokenizerError, match=r"truncated in the bytes of token 283"):
        from_llama2c_bin(path)
    path.write_bytes(data[: -len("café") - 6])
    with pytest.raises(TokenizerError, match=r"truncated in the record of token 283"):
        from_llama2c_bin(path)
    path.write_bytes(data)
    with pytest.raises(TokenizerError, match=rf"truncated: {n} tokens, expected vocab_size={n + 1}"):
        from_llama2c_bin(path, vocab_size=n + 1)
    with pytest.raises(TokenizerError, match=r"trailing bytes after 100 tokens"):
        from_llama2c_bin(path, vocab_size=100)
    path.write_bytes(data[:2])
    with pytest.raises(TokenizerError, match="truncated"):
        from_llama2c_bin(path)
    path.write_bytes(struct.pack("<i", 0) + data[4:])
    with pytest.raises(TokenizerError, match="max_token_length"):
        from_llama2c_bin(path)
    path.write_bytes(struct.pack("<i", 3) + data[4:])
    with pytest.raises(TokenizerError, match=r"token 0 has length 5, outside 0..max_token_length=3"):
        from_llama2c_bin(path)
    path.write_bytes(data)
    assert load_tokenizer(path).vocab_size == n
    assert load_tokenizer(tmp_path, vocab_size=n).vocab_size == n


def test_llama2c_missing_byte_token_is_reported(tmp_path):
    tok = Llama2cTokenizer([b"<unk>", b"<s>", b"</s>", b" ", b"a"], [0.0] * 5)
    assert tok.encode("a a", bos=False) == [3, 4, 3, 4]
    with pytest.raises(TokenizerError, match=r"'b' is not in the vocabulary and byte <0x62> has no token"):
        tok.encode("ab")
