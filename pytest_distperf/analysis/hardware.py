"""What a device can do at most: the dense BF16 tensor-core FLOP/s of common GPUs, the
denominator of model FLOPs utilisation (MFU), and the NVLink bandwidth between SXM parts, the
ceiling of nccl-tests' bus bandwidth inside a node.  Pure: no torch, no pytest.

Figures from NVIDIA's data sheets, dense (without 2:4 sparsity), per GPU.  A device that is
not listed, and every CPU, has no peak: MFU is then not reported unless the test passes
``peak_tflops=`` to ``ddp_step_timer``.  Matched by the first entry whose key is in the
device's name as torch reports it (``torch.cuda.get_device_name``), so the more specific keys
come first.
"""

from __future__ import annotations

#: (key in the device name, dense BF16 TFLOP/s).
BF16_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
)


#: Per-direction NVLink bandwidth of SXM parts, from NVIDIA's data sheets (total NVLink
#: bandwidth / 2): the ceiling of nccl-tests' busbw inside one node.  Matched against the
#: device name torch reports; PCIe cards and anything else have no peak.
LINK_PEAKS: tuple[tuple[str, float, str], ...] = (
    ("H100 80GB HBM3", 450.0, "NVLink 4"),
    ("H200", 450.0, "NVLink 4"),
    ("A100-SXM4", 300.0, "NVLink 3"),
    ("B200", 900.0, "NVLink 5"),
)
_NOT_SXM = ("PCIe", "NVL")


def link_peak(backend: str, device_type: str, device_model: str) -> tuple[float, str] | None:
    """(GB/s, what) of the NCCL link between devices of this model, where known."""
    if backend != "nccl" or device_type != "cuda":
        return None
    if any(word in device_model for word in _NOT_SXM):
        return None
    return next(((gbps, what) for key, gbps, what in LINK_PEAKS if key in device_model), None)


def peak_flops(device_model: str) -> float:
    """The device's dense BF16 peak in FLOP/s; 0.0 where it is not known."""
    return next((tflops * 1e12 for key, tflops in BF16_PEAK_TFLOPS if key in device_model), 0.0)
