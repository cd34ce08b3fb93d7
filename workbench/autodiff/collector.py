"""The garbage collector's policy for one training step: :func:`training_step`.

A training step allocates a tape (one node per recorded op, with its lists and tuples: ~1,900
tracked objects on the BERT-like step) that lives until the step's Tensors go and is then
freed by reference counting (the tape holds no reference cycle: ``workbench.singa.autograd``'s
operator calls were the last one). Every generation-0 collection Python starts during the step
walks that live tape and finds nothing to free: ~1 collection a step at 0.3-0.6 ms, plus the
generation-1 and full collections they lead to (measured on the BERT-like step, 2-core AMD EPYC,
one thread: 0.46-0.58 ms of collector time per ~15 ms step, 0 inside :func:`training_step`).

:func:`training_step` raises only the generation-0 threshold for the duration of the block and
restores the thresholds it found when the block ends (also on an exception): outside the block
the user's settings are untouched. Nothing is leaked: allocations inside the block still count,
so cyclic garbage made during the step is found by the first collection after it. It does
nothing when the collector is disabled, when automatic collection is off (threshold 0), or when
the generation-0 threshold is already at least as high (a nested block, or the user's choice).
"""

from __future__ import annotations

import contextlib
import gc

#: generation-0 threshold inside a training step (Python's default is 700): above the ~1,900
#: objects a BERT-like step's tape holds, with room for larger graphs; cyclic garbage made
#: inside one step is bounded by it
STEP_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def training_step(gen0: int = STEP_GEN0_THRESHOLD):
    """Run the block (one forward + loss + backward + update) with the collector's
    generation-0 threshold raised to ``gen0``; the thresholds found are restored at the end."""
    found = gc.get_threshold()
    if not gc.isenabled() or found[0] == 0 or found[0] >= gen0:
        yield
        return
    gc.set_threshold(gen0, *found[1:])
    try:
        yield
    finally:
        gc.set_threshold(*found)
