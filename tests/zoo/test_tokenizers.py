"""Tokenisers against tiny vocabularies with hand-checked outputs (Google BERT's own unit-test
cases for the WordPiece side; GPT-2's published byte map and pre-tokenisation for BPE)."""

from __future__ import annotations

import json

import pytest

from workbench.errors import InputError
from workbench.zoo import tokenizers as T

# --------------------------------------------------------------------------- BERT
GOOGLE_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn",
                "##ing", ","]


@pytest.mark.parametrize("text, want", [
    (" \tHeLLo!how  \n Are yoU?  ", ["hello", "!", "how", "are", "you", "?"]),
    ("H\u00e9llo", ["hello"]),
    ("Héllo, Wörld!", ["hello", ",", "world", "!"]),
    ("ah\u535a\u63a8zz", ["ah", "\u535a", "\u63a8", "zz"]),       # CJK split off
    ("a\x00b\u200bc\ufffd d", ["abc", "d"]),                       # control / format removed
    ("$6.77 (7,400 m2)", ["$", "6", ".", "77", "(", "7", ",", "400", "m2", ")"]),
    ("", []),
])
def test_basic_tokenizer_lower(text, want):
    assert T.basic_tokenize(text) == want


def test_basic_tokenizer_keeps_case_when_asked():
    assert T.basic_tokenize(" \tHeLLo!how  \n Are yoU?  ", do_lower_case=False) == \
        ["HeLLo", "!", "how", "Are", "yoU", "?"]


def test_wordpiece_greedy_longest_match_first():
    vocab = {t: i for i, t in enumerate(GOOGLE_VOCAB)}
    assert T.wordpiece("unwanted", vocab) == ["un", "##want", "##ed"]
    assert T.wordpiece("running", vocab) == ["runn", "##ing"]
    assert T.wordpiece("unwantedX", vocab) == ["[UNK]"]             # a missing piece
    assert T.wordpiece("wa", vocab) == ["wa"]
    assert T.wordpiece("x" * 101, vocab) == ["[UNK]"]                # over max_chars


def test_full_tokenizer_from_vocab_file(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_text("\n".join(GOOGLE_VOCAB) + "\n", encoding="utf-8")
    tok = T.BertTokenizer(str(f))
    tokens = tok.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tok.convert_tokens_to_ids(tokens) == [7, 4, 5, 10, 8, 9]
    assert tok.convert_ids_to_tokens([7, 4]) == ["un", "##want"]
    assert tok.convert_tokens_to_ids(["nope"]) == [0]
    assert len(tok) == len(GOOGLE_VOCAB)
    with pytest.raises(InputError, match="unknown token"):
        T.BertTokenizer(["a", "b"])


def test_bert_twin_vocab_covers_ascii():
    tok = T.BertTokenizer(T.bert_twin_vocab())
    assert tok.tokenize("Where is the Moscone Center?") == \
        ["where", "is", "the", "moscone", "center", "?"]
    assert tok.tokenize("Zyx") == ["z", "##y", "##x"]
    assert tok.tokenize("é") == ["e"]
    assert "[UNK]" in tok.tokenize("\u03a9")                       # not ASCII


# --------------------------------------------------------------------------- byte-level BPE
def test_bytes_to_unicode_is_gpt2s_map():
    m = T.bytes_to_unicode()
    assert len(m) == 256 and len(set(m.values())) == 256
    assert m[ord(" ")] == "\u0120" and m[ord("\n")] == "\u010a"    # 'Ġ', 'Ċ'
    assert m[ord("!")] == "!" and m[0] == "\u0100" and m[0xAD] == "\u0143"


def test_gpt2_pretokenisation_regex():
    assert T.GPT2_PATTERN.findall("Hello world's 123  test\n") == \
        ["Hello", " world", "'s", " 123", " ", " test", "\n"]
    assert T.GPT2_PATTERN.findall("I'll go!!") == ["I", "'ll", " go", "!!"]
    assert T.GPT2_PATTERN.findall("naïve café") == ["naïve", " café"]


def _char_vocab(extra=()):
    vocab = {ch: i for i, ch in enumerate(T.bytes_to_unicode().values())}
    for t in extra:
        vocab[t] = len(vocab)
    return vocab


def test_bpe_merges_follow_rank_order():
    vocab = _char_vocab(["er", "we", "lo", "low", "lower"])
    assert T.ByteLevelBPE(vocab, [("e", "r"), ("w", "e")]).bpe("lower") == ["l", "o", "w", "er"]
    assert T.ByteLevelBPE(vocab, [("w", "e"), ("e", "r")]).bpe("lower") == ["l", "o", "we", "r"]
    full = T.ByteLevelBPE(vocab, [("l", "o"), ("lo", "w"), ("e", "r"), ("low", "er")])
    assert full.bpe("lower") == ["lower"]
    assert full.bpe("lowlow") == ["low", "low"]


def test_bpe_encode_decode_with_files(tmp_path):
    vocab = _char_vocab(["Ġw", "or", "Ġwor", "ld", "Ġworld", "<|endoftext|>"])
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ w\no r\nĠw or\nl d\nĠwor ld\n",
                                         encoding="utf-8")
    tok = T.gpt2_tokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert tok.tokenize("hi world") == ["h", "i", "Ġworld"]
    ids = tok.encode("hi world")
    assert ids == [vocab["h"], vocab["i"], vocab["Ġworld"]]
    assert tok.decode(ids) == "hi world"
    assert tok.decode(ids + [vocab["<|endoftext|>"]]) == "hi world"
    assert tok.decode([vocab["<|endoftext|>"]], skip_special_tokens=False) == "<|endoftext|>"


def test_bpe_unknown_token_without_unk_is_an_error():
    tok = T.ByteLevelBPE({"a": 0}, [])
    with pytest.raises(InputError, match="not in the BPE vocabulary"):
        tok.encode("ab")
    with pytest.raises(InputError, match="special token"):
        T.ByteLevelBPE({"a": 0}, [], bos="<s>")


def test_roberta_specials_and_twin_tokenizers():
    tok = T.roberta_twin_tokenizer()
    assert len(tok) == 260
    ids = tok.encode("hi")
    assert ids[0] == 0 and ids[-1] == 2 and len(ids) == 4
    assert tok.decode(ids) == "hi"
    g = T.gpt2_twin_tokenizer()
    text = "héllo ✓ wörld"
    assert len(g.encode(text)) == len(text.encode("utf-8"))        # one id per byte
    assert g.decode(g.encode(text)) == text
    assert len(g) == 257
