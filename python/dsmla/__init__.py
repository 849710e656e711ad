"""dsmla: DeepSeek sparse attention (DeepSeek-V3.2 MLA) with a dense fast path.

The C++ API from Python: ``Attention`` (plan once, run many), case files
(``load_case``, ``run_case``). Arrays cross without copies: NumPy (or any
buffer / DLPack host array) on the cpu backend, any DLPack CUDA tensor
(PyTorch, CuPy) on the cuda backend. Importing dsmla never imports torch;
``dsmla.torch`` (a torch.library op) and ``dsmla.integrations.transformers``
do, when imported.

Errors: bad input raises ``dsmla.Error`` (a ``ValueError``), a failed run
``dsmla.RuntimeFailure`` (a ``RuntimeError``), with the C++ message.
"""
from ._dsmla import (
    Error,
    RuntimeFailure,
    __version__,
    bytes_per_token,
    cost_factor_for,
    cuda_available,
    cuda_compiled,
    default_softmax_scale,
    load_case,
    make_case,
    run_case,
)
from ._attention import Attention, Plan, bf16_bits_to_float32, float32_to_bf16_bits

__all__ = [
    "Attention",
    "Error",
    "Plan",
    "RuntimeFailure",
    "__version__",
    "bf16_bits_to_float32",
    "bytes_per_token",
    "cost_factor_for",
    "cuda_available",
    "cuda_compiled",
    "default_softmax_scale",
    "float32_to_bf16_bits",
    "load_case",
    "make_case",
    "run_case",
]
