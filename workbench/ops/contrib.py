"""Ops of other runtimes' domains that the engine shows but does not run.

Models exported for onnxruntime may carry ``com.microsoft`` ops; the graph viewer colours them
by category like the standard ones. Their facts are declared here (no kernel: running such a
model raises ``UnsupportedOperatorError`` naming them).
"""

from __future__ import annotations

from workbench.ops.registry import describe

_MS = "com.microsoft"

describe("MultiHeadAttention", domain=_MS, category="layer")
describe("FastGelu", domain=_MS, category="activation")
describe("QuickGelu", domain=_MS, category="activation")
describe("SimplifiedLayerNormalization", domain=_MS, category="normalization")
describe("SkipLayerNormalization", domain=_MS, category="normalization")
