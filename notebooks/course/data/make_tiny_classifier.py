"""Makes tiny_classifier.onnx, the exported PyTorch model that chapter 02 of the course reads.

Run with PyTorch installed (CPU is enough): ``python make_tiny_classifier.py``. The file is
committed, so the chapter itself needs no PyTorch; the weights are seeded, so a re-export
gives the same numbers (node names may differ between PyTorch versions: keep the file).
"""

import torch
from torch import nn


class TinyClassifier(nn.Module):
    """8x8 grey images -> 3 classes: conv, ReLU, global average pooling, linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, image):
        h = torch.relu(self.conv(image))
        return self.fc(torch.flatten(self.pool(h), 1))


if __name__ == "__main__":
    torch.manual_seed(0)
    net = TinyClassifier().eval()
    torch.onnx.export(net, (torch.zeros(1, 1, 8, 8),), "tiny_classifier.onnx",
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=17, dynamo=False)
