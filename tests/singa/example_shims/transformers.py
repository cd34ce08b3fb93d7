"""Offline stand-in for the two Hugging Face ``transformers`` tokenizers SINGA's
``examples/onnx`` programs load (``gpt2/gpt2.py``: ``GPT2Tokenizer.from_pretrained('gpt2')``;
``ro_bert_a/ro_bert_a.py``: ``RobertaTokenizer.from_pretrained('roberta-base')``).

``from_pretrained`` downloads vocabularies; the tests run offline against the zoo's architecture
twins, whose vocabularies are the ``*_twin`` byte-level BPE tokenizers of
``workbench.zoo.tokenizers``. Only these two classes and these two names exist here: anything
else is an error rather than a silent substitute. Used only by tests/singa/test_examples_onnx.py
(put on ``sys.path`` for the program's process).
"""

from __future__ import annotations

from workbench.zoo import tokenizers as _tok


class _Pretrained:
    _names: dict = {}

    @classmethod
    def from_pretrained(cls, name, *args, **kwargs):
        make = cls._names.get(name)
        if make is None:
            raise OSError(f"offline transformers stand-in: {cls.__name__} knows only "
                          f"{sorted(cls._names)}, not {name!r}")
        return make()


class GPT2Tokenizer(_Pretrained):
    _names = {"gpt2": _tok.gpt2_twin_tokenizer}


class RobertaTokenizer(_Pretrained):
    _names = {"roberta-base": _tok.roberta_twin_tokenizer}
