"""The kinds of bytes a rank's memory account counts (kernels/memory.py), in the one order the
account's counters, `partui report --memory` and the app's Memory tab all use. Torch-free, so the
report and the app's first frame read it without loading torch."""
from __future__ import annotations

MEANINGS = {
    "params": "the model state's parameters (the sync's ledger, set each step)",
    "grads": "their gradients (the sync's ledger)",
    "optimizer": "the optimizer's state (the sync's ledger)",
    "workspace": "the optimizer's reused scratch: held between steps, but no state",
    "activations": "what layers saved for backward, per microbatch and chunk (the pipeline's "
                   "`saved` and W queue, or a layer's context without a pipeline)",
    "gathered": "ZeRO-3's all-gathered layer weights",
    "comm": "p2p buffers in flight: posted recvs and unfinished sends",
}
KINDS = tuple(MEANINGS)
