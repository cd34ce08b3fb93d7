"""Tokenisers for the zoo's text models, in plain Python (no network at run time).

* :class:`BertTokenizer` - Google BERT's ``FullTokenizer``: a basic tokenizer (clean-up,
  lower-case, accents stripped, CJK characters and punctuation split off) then greedy
  longest-match-first WordPiece with ``##`` continuation pieces.
* :class:`ByteLevelBPE` - GPT-2's byte-level BPE (``bytes_to_unicode``, merge ranks, GPT-2's
  pre-tokenisation regex); :func:`gpt2_tokenizer` and :func:`roberta_tokenizer` (``<s>`` ...
  ``</s>``) build it from ``vocab.json`` + ``merges.txt``.

The real vocabularies are downloaded into the zoo cache (``zoo.fetch_extra``); the ``*_twin``
tokenisers need no file and match the untrained architecture twins (``zoo.twins``).

>>> tok = BertTokenizer({"[UNK]": 0, "un": 1, "##aff": 2, "##able": 3, ",": 4})
>>> tok.tokenize("Unaffable,")
['un', '##aff', '##able', ',']
>>> bpe = ByteLevelBPE({"h": 0, "i": 1, "hi": 2, "Ġ": 3}, [("h", "i")])
>>> bpe.encode("hi hi")
[2, 3, 2]
"""

from __future__ import annotations

import json
import unicodedata
from functools import lru_cache

from workbench.errors import InputError

try:  # the `regex` module knows \p{L} / \p{N}; `re` is a close stand-in
    import regex as _re

    GPT2_PATTERN = _re.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
except ImportError:  # pragma: no cover - regex is usually installed
    import re as _re

    GPT2_PATTERN = _re.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+|_+""")


# --------------------------------------------------------------------------- BERT
def _is_control(c: str) -> bool:
    if c in "\t\n\r":
        return False
    return unicodedata.category(c) in ("Cc", "Cf")


def _is_ws(c: str) -> bool:
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def _is_punct(c: str) -> bool:
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text: str, do_lower_case: bool = True) -> list[str]:
    """BERT's BasicTokenizer: drop control characters, split on whitespace, lower-case and
    strip accents (NFD, drop combining marks), split punctuation and CJK characters off."""
    chars = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or _is_control(c):
            continue
        if _is_cjk(cp):
            chars.extend((" ", c, " "))
        else:
            chars.append(" " if _is_ws(c) else c)
    out = []
    for word in "".join(chars).split():
        if do_lower_case:
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower())
                           if unicodedata.category(c) != "Mn")
        piece = ""
        for c in word:
            if _is_punct(c):
                if piece:
                    out.append(piece)
                out.append(c)
                piece = ""
            else:
                piece += c
        if piece:
            out.append(piece)
    return out


def wordpiece(word: str, vocab, unk: str = "[UNK]", max_chars: int = 100) -> list[str]:
    """Greedy longest-match-first WordPiece of one word; ``[unk]`` if a piece is missing."""
    if len(word) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end, cur = len(word), None
        while start < end:
            sub = word[start:end]
            if start > 0:
                sub = "##" + sub
            if sub in vocab:
                cur = sub
                break
            end -= 1
        if cur is None:
            return [unk]
        pieces.append(cur)
        start = end
    return pieces


class BertTokenizer:
    """Google BERT's FullTokenizer over a vocabulary (a ``vocab.txt`` path, a list of tokens
    in id order, or a ``{token: id}`` dict)."""

    def __init__(self, vocab, do_lower_case: bool = True, unk_token: str = "[UNK]"):
        if isinstance(vocab, (str, bytes)) or hasattr(vocab, "__fspath__"):
            with open(vocab, encoding="utf-8") as f:
                vocab = [line.rstrip("\r\n") for line in f]
        if not isinstance(vocab, dict):
            vocab = {t: i for i, t in enumerate(vocab) if t != "" or i == 0}
        self.vocab = dict(vocab)
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.unk_token = unk_token
        if unk_token not in self.vocab:
            raise InputError(f"the BERT vocabulary has no unknown token {unk_token!r}")

    def __len__(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        out = []
        for word in basic_tokenize(text, self.do_lower_case):
            out.extend(wordpiece(word, self.vocab, self.unk_token))
        return out

    def convert_tokens_to_ids(self, tokens) -> list[int]:
        unk = self.vocab[self.unk_token]
        return [self.vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab.get(int(i), self.unk_token) for i in ids]


BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


_TWIN_WORDS = (
    "the of and to a in is was for on that by with as it at from this be are or an were which "
    "its new early years convention center failed meet attendance revenue expectations many "
    "silicon valley businesses choosing much larger moscone san francisco jose due latter "
    "limited space ballot measure finance expansion via hotel tax reach required two thirds "
    "majority pass june team built south hall million blue white tent adding square feet "
    "exhibit where how what when who why year may votes did need go film so good bad movie "
    "here some text encode hello world")


def bert_twin_vocab() -> list[str]:
    """A small WordPiece vocabulary: the specials, ~130 common (and demo) words, then each
    printable lower-case ASCII character and its ``##`` form, so every ASCII word tokenises
    (unknown words letter by letter). For the BERT twin only."""
    chars = [chr(c) for c in range(33, 127) if not ("A" <= chr(c) <= "Z")]
    words = list(dict.fromkeys(w for w in _TWIN_WORDS.split() if w not in chars))
    return BERT_SPECIALS + words + chars + ["##" + c for c in chars]


# --------------------------------------------------------------------------- byte-level BPE
@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _pairs(word: tuple) -> set:
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class ByteLevelBPE:
    """GPT-2's byte-level BPE. ``vocab``: ``{token: id}`` (a path to ``vocab.json`` works);
    ``merges``: pairs in rank order (a path to ``merges.txt`` works, its ``#version`` line is
    skipped); ``bos``/``eos``: special tokens added by :meth:`encode` (RoBERTa: ``<s>``,
    ``</s>``)."""

    def __init__(self, vocab, merges, *, bos: str | None = None, eos: str | None = None,
                 unk: str | None = None, specials=()):
        if not isinstance(vocab, dict):
            with open(vocab, encoding="utf-8") as f:
                vocab = json.load(f)
        if isinstance(merges, (str, bytes)) or hasattr(merges, "__fspath__"):
            with open(merges, encoding="utf-8") as f:
                merges = [tuple(line.split()) for line in f
                          if line.strip() and not line.startswith("#version")]
        self.encoder = {str(k): int(v) for k, v in vocab.items()}
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.bos, self.eos, self.unk = bos, eos, unk
        self.specials = {t for t in (bos, eos, unk, *specials) if t}
        for t in self.specials:
            if t not in self.encoder:
                raise InputError(f"the BPE vocabulary has no special token {t!r}")
        self._cache: dict = {}

    def __len__(self) -> int:
        return len(self.encoder)

    def bpe(self, token: str) -> list[str]:
        """Merge the characters of one pre-token by rank until no known pair is left."""
        if token in self._cache:
            return self._cache[token]
        word = tuple(token)
        pairs = _pairs(word)
        while pairs:
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            first, second = best
            new, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    new.append(first + second)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = tuple(new)
            pairs = _pairs(word)
        out = list(word)
        if len(self._cache) < 100_000:
            self._cache[token] = out
        return out

    def tokenize(self, text: str) -> list[str]:
        """Pre-tokenise with GPT-2's regex, map bytes to unicode, apply BPE."""
        out = []
        for piece in GPT2_PATTERN.findall(text):
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            out.extend(self.bpe(mapped))
        return out

    def convert_tokens_to_ids(self, tokens) -> list[int]:
        ids = []
        for t in tokens:
            if t in self.encoder:
                ids.append(self.encoder[t])
            elif self.unk is not None:
                ids.append(self.encoder[self.unk])
            else:
                raise InputError(f"token {t!r} is not in the BPE vocabulary and it has no "
                                 f"unknown token; is merges.txt from the same model as "
                                 f"vocab.json?")
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.convert_tokens_to_ids(self.tokenize(text))
        if add_special_tokens:
            if self.bos:
                ids = [self.encoder[self.bos]] + ids
            if self.eos:
                ids = ids + [self.encoder[self.eos]]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        toks = [self.decoder.get(int(i), "") for i in ids]
        if skip_special_tokens:
            toks = [t for t in toks if t not in self.specials]
        data = bytearray()
        for t in toks:
            if t in self.specials:
                data.extend(t.encode("utf-8"))
            else:
                data.extend(self.byte_decoder[c] for c in t if c in self.byte_decoder)
        return data.decode("utf-8", errors="replace")


def gpt2_tokenizer(vocab_json, merges_txt) -> ByteLevelBPE:
    """GPT-2's tokenizer (``<|endoftext|>`` is a special token, no tokens are added)."""
    return ByteLevelBPE(vocab_json, merges_txt, specials=("<|endoftext|>",))


def roberta_tokenizer(vocab_json, merges_txt) -> ByteLevelBPE:
    """RoBERTa's tokenizer: GPT-2's BPE with ``<s>`` ... ``</s>`` around each text."""
    return ByteLevelBPE(vocab_json, merges_txt, bos="<s>", eos="</s>", unk="<unk>",
                        specials=("<pad>",))


def _byte_vocab(specials: list) -> dict:
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    return vocab


def gpt2_twin_tokenizer() -> ByteLevelBPE:
    """A byte-level BPE without merges (one token per byte) and ``<|endoftext|>``: 257 ids.
    For the GPT-2 twin only."""
    return ByteLevelBPE(_byte_vocab(["<|endoftext|>"]), [], specials=("<|endoftext|>",))


def roberta_twin_tokenizer() -> ByteLevelBPE:
    """RoBERTa's specials (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3) and one token per
    byte: 260 ids. For the RoBERTa twin only."""
    return ByteLevelBPE(_byte_vocab(["<s>", "<pad>", "</s>", "<unk>"]), [], bos="<s>",
                        eos="</s>", unk="<unk>", specials=("<pad>",))
