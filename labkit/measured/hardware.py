"""Dense peak FLOP/s of accelerators: the one table that MFU (``labkit.measured.metrics``) and the
planner's time estimate (``labkit.planner.flops``) both read. Pure data, no imports beyond labkit.
"""

from __future__ import annotations

from labkit.errors import LabkitError

# Dense peak TFLOP/s per GPU by precision. Sources: NVIDIA / AMD product datasheets; the
# datasheets quote tensor-core numbers "with sparsity", which are halved here.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # Tesla V100 SXM2 datasheet: 125 TFLOPS tensor (fp16), 15.7 fp32. No bf16.
    "V100": {"fp16": 125.0, "fp32": 15.7},
    # V100 PCIe: 112 tensor, 14 fp32.
    "V100 PCIE": {"fp16": 112.0, "fp32": 14.0},
    # A100 (SXM4 and PCIe) datasheet: bf16/fp16 312 (624 sparse), tf32 156 (312 sparse), fp32 19.5.
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # A10 datasheet: bf16/fp16 125 (250 sparse), tf32 62.5 (125 sparse), fp32 31.2.
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    # RTX A6000 datasheet: tensor 309.7 sparse -> 154.8 dense, fp32 38.7.
    "A6000": {"bf16": 154.8, "fp16": 154.8, "fp32": 38.7},
    # L4 datasheet: bf16/fp16 121 (242 sparse), fp8 242.5 (485 sparse), fp32 30.3.
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "fp32": 30.3},
    # L40S datasheet: bf16/fp16 362.05 (733 sparse), fp8 733 (1466 sparse), tf32 183, fp32 91.6.
    "L40S": {"bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
    # H100 SXM5 datasheet: bf16/fp16 989.4 (1979 sparse), fp8 1978.9, tf32 494.7, fp32 66.9.
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    # H100 PCIe datasheet: bf16/fp16 756.5 (1513 sparse), fp8 1513, tf32 378, fp32 51.2.
    "H100 PCIE": {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2},
    # H100 NVL (NVIDIA H100 datasheet, the "H100 NVL" column, per GPU: 94 GB, 350-400 W):
    # bf16/fp16 1,671 (sparse) -> 835.5 dense, fp8 3,341 -> 1670.5, tf32 835 -> 417.5, fp32 60.
    # torch names it "NVIDIA H100 NVL"; without this entry it would read as an H100 SXM (989).
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "tf32": 417.5, "fp32": 60.0},
    # H200 SXM datasheet: the H100 SXM compute (bf16 989, fp8 1979, fp32 67) with more memory.
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    # GH200 datasheet: the same Hopper GPU, bf16 989 dense.
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    # HGX B200 datasheet (per GPU): bf16/fp16 4.5 PF sparse -> 2.25 dense, fp8 9 PF sparse -> 4.5.
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    # AMD Instinct MI250X datasheet: bf16/fp16 383, fp32 matrix 95.7.
    "MI250X": {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7},
    # AMD Instinct MI300X datasheet: bf16/fp16 1307.4 dense, fp8 2614.9, fp32 matrix 163.4.
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "fp32": 163.4},
}


def _device_key(device: str) -> str | None:
    name = " ".join(device.upper().replace("NVIDIA", "").replace("-", " ").replace("_", " ").split())
    if name in PEAK_TFLOPS:
        return name
    # the longest table key contained in the name: "H100 PCIE" before "H100", "A100 SXM4 80GB" -> A100
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        words = key.split()
        if all(w in name.split() for w in words):
            return key
    return None


def peak_tflops(device: str, precision: str) -> float:
    """The dense peak TFLOP/s of one ``device`` (e.g. "H100", "NVIDIA A100-SXM4-80GB") in ``precision``.

    Raises LabkitError for a device or precision missing from ``PEAK_TFLOPS``.
    """
    key = _device_key(device)
    if key is None:
        raise LabkitError(
            f"unknown device {device!r}: no peak FLOPs for it in labkit.measured.hardware.PEAK_TFLOPS "
            f"(known: {', '.join(PEAK_TFLOPS)}). Pass peak_tflops=<dense TFLOP/s per device from its "
            f"datasheet, without sparsity>; CPUs have no entry, MFU is a GPU figure.")
    table = PEAK_TFLOPS[key]
    if precision not in table:
        raise LabkitError(f"no {precision} peak for {key} in PEAK_TFLOPS (it lists {', '.join(table)}). "
                          f"Pass peak_tflops=<dense TFLOP/s from the datasheet> or pick one of those.")
    return table[precision]
