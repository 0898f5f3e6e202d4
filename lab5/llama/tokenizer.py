"""Tokenizers for LLaMA-family models: Hugging Face tokenizer.json and llama2.c tokenizer.bin.

Both backends expose the same small interface (`Tokenizer`): encode text to ids, decode ids to
text, and decode a stream of ids as they are generated, one piece of text per token. Streaming is
the subtle part. One token is not one piece of text: a character outside the vocabulary is split
into byte tokens (three for most CJK characters), so a single token may end in the middle of a
UTF-8 sequence; and sentencepiece marks a word's leading space with "▁", which the decoder drops
at the very start of a sequence, so a token decoded alone can lose the space it has in context.
`StreamDecoder` therefore decodes a short window of recent tokens and emits the difference
between the window with and without the newest token, holding back any text that still ends in
an incomplete character (U+FFFD). Concatenating what it emits gives exactly `decode(all ids)`.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "HFTokenizer",
    "Llama2cTokenizer",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerError",
    "from_hf_json",
    "from_llama2c_bin",
    "load_tokenizer",
]

_REPLACEMENT = "\ufffd"  # what an incomplete UTF-8 sequence decodes to


class TokenizerError(ValueError):
    """A tokenizer file that is missing, truncated or malformed, or a request it cannot serve."""


class Tokenizer:
    """The interface lab 5's generation loop uses. Subclasses implement _encode and _decode."""

    bos_id: int | None
    eos_id: int | None

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode(self, ids: Sequence[int], skip_special: bool) -> str:
        raise NotImplementedError

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of text, with the beginning-of-sequence id first when bos is true."""
        ids = self._encode(text)
        if bos:
            if self.bos_id is None:
                raise TokenizerError("encode(bos=True): this tokenizer has no beginning-of-sequence token")
            ids = [self.bos_id, *ids]
        if eos:
            if self.eos_id is None:
                raise TokenizerError("encode(eos=True): this tokenizer has no end-of-sequence token")
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The text of ids. Special tokens (BOS, EOS) are left out unless skip_special is false."""
        ids = list(ids)
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"decode: token id {i} is outside the vocabulary (size {self.vocab_size})")
        return self._decode(ids, skip_special)

    def stream(self) -> StreamDecoder:
        """A decoder to feed one generated id at a time (see StreamDecoder)."""
        return StreamDecoder(self)

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:
        """Yields the new text of each id as it arrives ("" while a character is incomplete), then
        whatever is still held back at the end. The pieces join to decode(ids)."""
        s = self.stream()
        for i in ids:
            yield s.push(i)
        rest = s.flush()
        if rest:
            yield rest


class StreamDecoder:
    """Incremental decoding by prefix difference over a sliding window.

    `prefix` is where the window starts and `read` how far text has been emitted. Each new id is
    decoded together with the window; if the text grew and does not end in an incomplete
    character, the growth is emitted and the window slides so that it starts one emission back.
    Keeping that earlier context is what preserves a sentencepiece token's leading space, and
    the window keeps each step's cost independent of how long the generation already is.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, token_id: int) -> str:
        """Adds one id; returns the text it completes ("" if it ends mid-character)."""
        self.ids.append(token_id)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT) and after.startswith(before):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD, as in decode)."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


# --- Hugging Face tokenizer.json --------------------------------------------------------------------

_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>")
_EOS_NAMES = ("</s>", "<|end_of_text|>", "<|eot_id|>", "<eos>")


class HFTokenizer(Tokenizer):
    """A tokenizer.json run by the `tokenizers` library (BPE, byte-level or sentencepiece-style).

    Special tokens are added by this class, not by the file's post-processor, so that
    encode(text, bos=...) means the same for every backend."""

    def __init__(self, tk: object, bos_id: int | None, eos_id: int | None) -> None:
        self._tk = tk
        self.bos_id = bos_id
        self.eos_id = eos_id

    @property
    def vocab_size(self) -> int:
        return int(self._tk.get_vocab_size(with_added_tokens=True))  # type: ignore[attr-defined]

    def _encode(self, text: str) -> list[int]:
        return list(self._tk.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]

    def _decode(self, ids: Sequence[int], skip_special: bool) -> str:
        if skip_special:
            # BOS/EOS may not be flagged special in a hand-made file; drop them by id as well
            ids = [i for i in ids if i not in (self.bos_id, self.eos_id)]
        return str(self._tk.decode(list(ids), skip_special_tokens=skip_special))  # type: ignore[attr-defined]

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)  # type: ignore[attr-defined]


def _special_from_config(cfg: dict[str, object], key: str) -> str | None:
    value = cfg.get(key)
    if isinstance(value, dict):  # older tokenizer_config.json files wrap it as an AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


def from_hf_json(
    path: str | os.PathLike[str], *, bos_token: str | None = None, eos_token: str | None = None
) -> HFTokenizer:
    """Loads a Hugging Face tokenizer.json. BOS and EOS come from the arguments, else from a
    tokenizer_config.json beside it, else from the usual LLaMA names (<s>, <|begin_of_text|>, ...)."""
    try:
        from tokenizers import Tokenizer as HFBackend
    except ImportError as e:  # pragma: no cover - the course installs it
        raise TokenizerError("from_hf_json needs the 'tokenizers' package: pip install tokenizers") from e
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TokenizerError(f"{p}: tokenizer file not found")
    try:
        tk = HFBackend.from_file(str(p))
    except Exception as e:  # the library raises a bare Exception for every parse error
        raise TokenizerError(f"{p}: not a valid tokenizer.json (truncated or corrupt?): {e}") from e

    side = p.parent / "tokenizer_config.json"
    cfg: dict[str, object] = {}
    if side.is_file():
        try:
            cfg = json.loads(side.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TokenizerError(f"{side}: not valid JSON ({e})") from e

    def resolve(given: str | None, key: str, names: tuple[str, ...]) -> int | None:
        name = given or _special_from_config(cfg, key)
        if name is not None:
            tid = tk.token_to_id(name)
            if tid is None:
                raise TokenizerError(f"{p}: {key} {name!r} is not in the vocabulary")
            return int(tid)
        for n in names:
            tid = tk.token_to_id(n)
            if tid is not None:
                return int(tid)
        return None

    return HFTokenizer(tk, resolve(bos_token, "bos_token", _BOS_NAMES), resolve(eos_token, "eos_token", _EOS_NAMES))


# --- llama2.c tokenizer.bin ------------------------------------------------------------------------

_BYTE_TOKEN = re.compile(rb"<0x([0-9A-Fa-f]{2})>")
_SPIECE_SPACE = "▁".encode()


class Llama2cTokenizer(Tokenizer):
    """llama2.c's tokenizer.bin: a sentencepiece BPE vocabulary with one score per piece.

    Encoding is the greedy merge llama2.c uses: prepend a space (sentencepiece's dummy prefix),
    split the text into characters, replace each character missing from the vocabulary by its
    UTF-8 byte tokens <0xNN>, then repeatedly merge the adjacent pair whose concatenation is the
    highest-scoring piece (leftmost on ties) until no pair is a piece. Byte tokens and the special
    tokens never take part in merges: they stand for bytes or markers, not for their spelling.
    """

    def __init__(self, pieces: list[bytes], scores: list[float], *, bos_id: int = 1, eos_id: int = 2) -> None:
        if len(pieces) != len(scores):
            raise TokenizerError("pieces and scores must have the same length")
        # llama2.c's export writes "▁" as a space; accept either spelling so that a vocabulary
        # copied straight from sentencepiece works too
        self.pieces = [p.replace(_SPIECE_SPACE, b" ") for p in pieces]
        self.scores = list(scores)
        self.bos_id = bos_id if 0 <= bos_id < len(pieces) else None
        self.eos_id = eos_id if 0 <= eos_id < len(pieces) else None
        self._special = {i for i in (self.bos_id, self.eos_id, 0) if i is not None and i < len(pieces)}
        self._byte_of: dict[int, int] = {}  # token id -> the byte it stands for
        self._id_of_byte: dict[int, int] = {}
        self._lookup: dict[bytes, int] = {}  # mergeable pieces only; the first id wins on duplicates
        for i, piece in enumerate(self.pieces):
            m = _BYTE_TOKEN.fullmatch(piece)
            if m:
                b = int(m.group(1), 16)
                self._byte_of[i] = b
                self._id_of_byte.setdefault(b, i)
            elif i not in self._special:
                self._lookup.setdefault(piece, i)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        ids: list[int] = []
        for ch in " " + text:
            raw = ch.encode("utf-8")
            tid = self._lookup.get(raw)
            if tid is not None:
                ids.append(tid)
                continue
            for b in raw:
                if b not in self._id_of_byte:
                    raise TokenizerError(f"encode: {ch!r} is not in the vocabulary and byte <0x{b:02X}> has no token")
                ids.append(self._id_of_byte[b])
        # O(n^2) in the text length, like llama2.c: fine for prompts; a heap would make it O(n log n)
        while True:
            best_score, best_i, best_id = float("-inf"), -1, -1
            for i in range(len(ids) - 1):
                a, b = ids[i], ids[i + 1]
                if a in self._byte_of or b in self._byte_of:
                    continue
                merged = self._lookup.get(self.pieces[a] + self.pieces[b])
                if merged is not None and self.scores[merged] > best_score:
                    best_score, best_i, best_id = self.scores[merged], i, merged
            if best_i < 0:
                return ids
            ids[best_i : best_i + 2] = [best_id]

    def _decode(self, ids: Sequence[int], skip_special: bool) -> str:
        out = bytearray()
        first = True
        for i in ids:
            if i in (self.bos_id, self.eos_id):
                # kept only on request, and not counted as the sequence's first piece: llama2.c
                # also drops the space of the piece right after BOS
                if not skip_special:
                    out += self.pieces[i]
                continue
            if i in self._byte_of:
                out.append(self._byte_of[i])
            else:
                piece = self.pieces[i]
                # sentencepiece drops the dummy-prefix space of the first piece of a sequence
                if first and piece.startswith(b" "):
                    piece = piece[1:]
                out += piece
            first = False
        return out.decode("utf-8", errors="replace")


def from_llama2c_bin(
    path: str | os.PathLike[str], vocab_size: int | None = None, *, bos_id: int = 1, eos_id: int = 2
) -> Llama2cTokenizer:
    """Reads llama2.c's tokenizer.bin: int32 max_token_length, then per token a float32 score, an
    int32 byte length and the bytes. The file does not store the number of tokens (llama2.c takes
    it from the model), so without vocab_size every record up to the end of the file is read;
    with it, exactly that many must be there and nothing after them."""
    p = Path(path)
    if not p.is_file():
        raise TokenizerError(f"{p}: tokenizer file not found")
    data = p.read_bytes()
    if len(data) < 4:
        raise TokenizerError(f"{p}: truncated: {len(data)} bytes, not even the max_token_length header")
    (max_len,) = struct.unpack_from("<i", data, 0)
    if max_len <= 0:
        raise TokenizerError(f"{p}: max_token_length is {max_len}; not a llama2.c tokenizer.bin")
    pieces: list[bytes] = []
    scores: list[float] = []
    pos = 4
    while pos < len(data) and (vocab_size is None or len(pieces) < vocab_size):
        if pos + 8 > len(data):
            raise TokenizerError(f"{p}: truncated in the record of token {len(pieces)} (at byte {pos})")
        score, n = struct.unpack_from("<fi", data, pos)
        if not 0 <= n <= max_len:
            raise TokenizerError(f"{p}: token {len(pieces)} has length {n}, outside 0..max_token_length={max_len}")
        if pos + 8 + n > len(data):
            raise TokenizerError(f"{p}: truncated in the bytes of token {len(pieces)} (needs {n} at byte {pos + 8})")
        scores.append(score)
        pieces.append(data[pos + 8 : pos + 8 + n])
        pos += 8 + n
    if vocab_size is not None and len(pieces) < vocab_size:
        raise TokenizerError(f"{p}: truncated: {len(pieces)} tokens, expected vocab_size={vocab_size}")
    if pos != len(data):
        raise TokenizerError(f"{p}: {len(data) - pos} trailing bytes after {len(pieces)} tokens")
    if not pieces:
        raise TokenizerError(f"{p}: no tokens")
    return Llama2cTokenizer(pieces, scores, bos_id=bos_id, eos_id=eos_id)


def load_tokenizer(path: str | os.PathLike[str], vocab_size: int | None = None) -> Tokenizer:
    """tokenizer.json (or a directory holding one) -> HF backend; any other file -> llama2.c's."""
    p = Path(path)
    if p.is_dir():
        for name in ("tokenizer.json", "tokenizer.bin"):
            if (p / name).is_file():
                return load_tokenizer(p / name, vocab_size)
        raise TokenizerError(f"{p}: looked for tokenizer.json and tokenizer.bin, found neither")
    if p.suffix == ".json":
        return from_hf_json(p)
    return from_llama2c_bin(p, vocab_size)
