"""Suite-wide setup: Triton kernels on CPU run through Triton's interpreter.

`triton.jit` reads TRITON_INTERPRET when a kernel (or one of triton.language's own jitted
helpers) is decorated, i.e. when triton is first imported, which some torch modules do at
collection time. So it is set here, before any test module is imported; on a machine
with CUDA the kernels compile for the GPU as usual.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
