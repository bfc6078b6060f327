"""Model FLOPs utilisation (MFU): achieved training FLOP/s against the device's peak.

Each architecture counts its own training FLOPs per token (its spec's flops_per_token: e.g.
mars.model.gpt.flops_per_token, mars.model.llama.flops_per_token), all in one convention: the matmuls
of one forward + backward pass (backward = 2x forward), as in the PaLM paper's appendix B and
nanoGPT's estimate_mfu:

    6 * N_matmul + 12 * n_layer * n_embd * seq_len

N_matmul = the transformer blocks' weights + the output head matrix (n_embd x vocab_size; the
embedding lookups are not matmuls); the second term is the attention scores (q k^T) and the
weighted sum of values, counted for the full T x T square as PaLM does (no causal discount).
"""

from __future__ import annotations

import os

import torch

PEAK_FLOPS_ENV = "MARS_PEAK_FLOPS"

# Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from the vendor data sheets. Matched
# against torch.cuda.get_device_name in order, first substring wins (so "H100 PCIe" is tried
# before "H100", and "GH200" / "H200" both give the H200 figure).
PEAK_FLOPS_BF16: tuple[tuple[str, float], ...] = (
    ("A100", 312e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM / HBM3
    ("H200", 989e12),
)


def peak_flops(device: torch.device | str | None = None, override: float | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of one device: ``override``, else $MARS_PEAK_FLOPS, else the table
    entry matching the CUDA device's name. None on CPU and for GPUs not in the table."""
    if override is not None:
        return float(override)
    env = os.environ.get(PEAK_FLOPS_ENV)
    if env:
        try:
            return float(env)
        except ValueError as e:
            raise ValueError(f"{PEAK_FLOPS_ENV}={env!r} is not a number (FLOP/s, e.g. 989e12)") from e
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_FLOPS_BF16:
        if key in name:
            return peak
    return None


def mfu(
    tokens_per_s: float,
    flops_per_token: float,
    device: torch.device | str | None = None,
    num_devices: int = 1,
    peak: float | None = None,
) -> float | None:
    """Achieved / peak FLOP/s, as a fraction. tokens_per_s is the throughput of all num_devices
    together. None when the peak is unknown (CPU, or a GPU missing from the table and no override)."""
    peak = peak_flops(device, override=peak)
    if peak is None:
        return None
    return tokens_per_s * flops_per_token / (peak * num_devices)
