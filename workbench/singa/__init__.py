"""SINGA's API over the engine; here so far: SINGA's ``last_layers`` counting (``counting``)."""
