"""The zoo registry: the ONNX Model Zoo models of SINGA's ten demos.

Facts (file names, sizes, sha256, opsets, input/output specs) come from the ONNX Model Zoo's
``ONNX_HUB_MANIFEST.json`` for the canonical files under ``validated/`` in onnx/models; see
``shared/reference/zoo-facts.md``. Downloads fetch the ``.onnx`` file itself (no archive).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from workbench.errors import WorkbenchError

MODELS_BASE = "https://github.com/onnx/models/raw/main/validated/"


@dataclass(frozen=True)
class IOSpec:
    name: str
    dtype: str
    shape: tuple


@dataclass(frozen=True)
class ZooEntry:
    name: str
    title: str
    task: str
    path: str                     # under validated/ in onnx/models
    size: int
    sha256: str
    opset: int
    inputs: tuple
    outputs: tuple
    licence: str
    source: str
    paper: str
    aliases: tuple = ()
    extra_files: dict = field(default_factory=dict)   # name -> (url, sha256 or None)
    notes: str = ""

    @property
    def url(self) -> str:
        return MODELS_BASE + self.path

    @property
    def file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


_IMAGENET_LABELS = {"synset.txt": (MODELS_BASE + "vision/classification/synset.txt", None)}
# Tokeniser files, as the SINGA demos' tokenisers (Google BERT, transformers 2.5.1) used them;
# the Hugging Face copies are the files transformers downloads for these model names. Their
# sha256 is not recorded upstream, so it is None (size and sha256 are then not verified).
_HF = "https://huggingface.co/"
_BERT_VOCAB = {"vocab.txt": (_HF + "bert-base-uncased/resolve/main/vocab.txt", None)}
_GPT2_BPE = {"vocab.json": (_HF + "gpt2/resolve/main/vocab.json", None),
             "merges.txt": (_HF + "gpt2/resolve/main/merges.txt", None)}
_ROBERTA_BPE = {"vocab.json": (_HF + "roberta-base/resolve/main/vocab.json", None),
                "merges.txt": (_HF + "roberta-base/resolve/main/merges.txt", None)}
_APACHE_ZOO = ("Apache-2.0 (ONNX Model Zoo; see the model's README in onnx/models for upstream "
               "terms)")

REGISTRY: dict[str, ZooEntry] = {e.name: e for e in [
    ZooEntry("mobilenetv2", "MobileNet v2 (1.0)", "image-classification",
             "vision/classification/mobilenet/model/mobilenetv2-7.onnx", 14_246_826,
             "c1c513582d56afceff8516c73804e484c81c6a830712ab6d682253f4a3cd042f", 7,
             (IOSpec("data", "float32", (1, 3, 224, 224)),),
             (IOSpec("mobilenetv20_output_flatten0_reshape0", "float32", (1, 1000)),),
             _APACHE_ZOO, "MXNet GluonCV", "Sandler et al., arXiv:1801.04381",
             aliases=("mobilenet", "mobilenet_v2", "mobilenetv2-7"),
             extra_files=_IMAGENET_LABELS),
    ZooEntry("resnet18", "ResNet-18 v1", "image-classification",
             "vision/classification/resnet/model/resnet18-v1-7.onnx", 46_820_737,
             "4e8f8653e7a2222b3904cc3fe8e304cd8b339ce1d05fd24688162f86fb6df52c", 7,
             (IOSpec("data", "float32", ("N", 3, 224, 224)),),
             (IOSpec("resnetv15_dense0_fwd", "float32", ("N", 1000)),),
             _APACHE_ZOO, "MXNet GluonCV", "He et al., arXiv:1512.03385",
             aliases=("resnet", "resnet18v1", "resnet18-v1-7"), extra_files=_IMAGENET_LABELS),
    ZooEntry("vgg16", "VGG-16", "image-classification",
             "vision/classification/vgg/model/vgg16-7.onnx", 553_437_328,
             "f20805a3ecccaa88647bbab4ad011ff2412a9838485ea844de0fcbce349820b9", 7,
             (IOSpec("data", "float32", (1, 3, 224, 224)),),
             (IOSpec("vgg0_dense2_fwd", "float32", (1, 1000)),),
             _APACHE_ZOO, "MXNet GluonCV", "Simonyan et al., arXiv:1409.1556",
             aliases=("vgg", "vgg16-7"), extra_files=_IMAGENET_LABELS),
    ZooEntry("shufflenetv2", "ShuffleNet v2", "image-classification",
             "vision/classification/shufflenet/model/shufflenet-v2-10.onnx", 9_218_554,
             "8b85e969a0a5518b554c99548379d1ba54d973733a6a12012138d91852308584", 10,
             (IOSpec("input", "float32", (1, 3, 224, 224)),),
             (IOSpec("output", "float32", (1, 1000)),),
             _APACHE_ZOO, "PyTorch", "Ma et al., arXiv:1807.11164",
             aliases=("shufflenet", "shufflenet_v2", "shufflenet-v2-10"),
             extra_files=_IMAGENET_LABELS),
    ZooEntry("tinyyolov2", "Tiny YOLOv2 (Pascal VOC)", "object-detection",
             "vision/object_detection_segmentation/tiny-yolov2/model/tinyyolov2-8.onnx",
             63_480_982, "583fb7fdc948435ceac9fa82efc7708701efe8382a859a3dd46526b155f5f2ae", 8,
             (IOSpec("image", "float32", ("None", 3, 416, 416)),),
             (IOSpec("grid", "float32", ("None", 125, 13, 13)),),
             _APACHE_ZOO, "CoreML -> ONNX (onnxmltools)", "Redmon et al., arXiv:1612.08242",
             aliases=("tiny_yolov2", "yolo", "tinyyolov2-8")),
    ZooEntry("arcface", "ArcFace (LResNet100E-IR)", "face-recognition",
             "vision/body_analysis/arcface/model/arcfaceresnet100-8.onnx", 261_036_388,
             "f3a6bc281e72f88862f5748b53be3d76b3b48f8f1ab1f4a537941bdc4e1b01da", 8,
             (IOSpec("data", "float32", (1, 3, 112, 112)),),
             (IOSpec("fc1", "float32", (1, 512)),),
             _APACHE_ZOO, "MXNet (InsightFace)", "Deng et al., arXiv:1801.07698",
             aliases=("arcfaceresnet100", "arcfaceresnet100-8")),
    ZooEntry("emotion_ferplus", "Emotion FER+", "emotion-recognition",
             "vision/body_analysis/emotion_ferplus/model/emotion-ferplus-8.onnx", 35_040_571,
             "a2a2ba6a335a3b29c21acb6272f962bd3d47f84952aaffa03b60986e04efa61c", 8,
             (IOSpec("Input3", "float32", (1, 1, 64, 64)),),
             (IOSpec("Plus692_Output_0", "float32", (1, 8)),),
             _APACHE_ZOO, "CNTK", "Barsoum et al., arXiv:1608.01041",
             aliases=("ferplus", "fer", "emotion", "emotion-ferplus-8")),
    ZooEntry("bertsquad", "BERT-Squad (BERT-base uncased, SQuAD 1.1)", "question-answering",
             "text/machine_comprehension/bert-squad/model/bertsquad-10.onnx", 435_852_734,
             "5945dee6478abdab2d5e4ce3868b4d969741e3dad2134cc669da65a4f092755b", 10,
             (IOSpec("unique_ids_raw_output___9:0", "int64", ("N",)),
              IOSpec("segment_ids:0", "int64", ("N", 256)),
              IOSpec("input_mask:0", "int64", ("N", 256)),
              IOSpec("input_ids:0", "int64", ("N", 256))),
             (IOSpec("unstack:1", "float32", ("N", 256)),
              IOSpec("unstack:0", "float32", ("N", 256)),
              IOSpec("unique_ids:0", "int64", ("N",))),
             "Apache-2.0 (Google BERT)", "TensorFlow -> ONNX (tf2onnx)",
             "Devlin et al., arXiv:1810.04805", aliases=("bert", "bert-squad", "bertsquad-10"),
             extra_files=_BERT_VOCAB),
    ZooEntry("roberta", "RoBERTa-base sequence classification (SST-2)", "sentiment",
             "text/machine_comprehension/roberta/model/roberta-sequence-classification-9.onnx",
             498_658_080, "8b28f588889de84ef45918765b25bd0e74179b9be5d9320dafdddcb2553784cc", 9,
             (IOSpec("input", "int64", ("batch", "sentence_length")),),
             (IOSpec("output", "float32", ("batch", 2)),),
             "MIT (fairseq RoBERTa)", "PyTorch", "Liu et al., arXiv:1907.11692",
             aliases=("ro_bert_a", "roberta-sequence-classification-9"),
             extra_files=_ROBERTA_BPE),
    ZooEntry("gpt2", "GPT-2 with LM head", "text-generation",
             "text/machine_comprehension/gpt-2/model/gpt2-lm-head-10.onnx", 664_871_060,
             "12fbb1ec2d2d70c8ebd21a290a348a4109447b98582af64c6f93b6526d5c8f35", 10,
             (IOSpec("input1", "int64", ("d1", "d2", "d3")),),
             (IOSpec("output1", "float32", ("d1", "d2", "d3", 50257)),),
             "MIT (OpenAI GPT-2)", "PyTorch", "Radford et al., 2019",
             aliases=("gpt-2", "gpt2-lm-head", "gpt2-lm-head-10"), extra_files=_GPT2_BPE),
]}

_ALIASES = {a.lower(): e.name for e in REGISTRY.values() for a in (e.name,) + e.aliases}


def get(name: str) -> ZooEntry:
    """The registry entry for a zoo name or alias (case-insensitive); suggests on a typo."""
    key = str(name).strip().lower()
    if key in _ALIASES:
        return REGISTRY[_ALIASES[key]]
    close = difflib.get_close_matches(key, list(_ALIASES), n=6, cutoff=0.5)
    close = list(dict.fromkeys(_ALIASES[c] for c in close))[:3]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise WorkbenchError(f"unknown zoo model {name!r}{hint} (known: "
                         f"{', '.join(sorted(REGISTRY))})")


def names() -> list[str]:
    return sorted(REGISTRY)
