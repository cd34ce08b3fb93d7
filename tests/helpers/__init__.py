"""Test helpers: PyTorch model builders/exporters (``torch_models``) and oracles (``compare``)."""
