"""A cluster as the planner sees it: N nodes × G devices, memory, peak FLOP/s, an α–β link per level.

Bandwidths are *bus bandwidths* per device as NCCL's ring tests report them (busbw), so that a
collective's time is α·steps + bus_factor·bytes / bandwidth (see cost.comm). Presets cite public
figures; `uniap profile` replaces them with measured ones.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from uniap.errors import UniapError

GiB = 1024**3


@dataclass(frozen=True)
class Link:
    latency_s: float  # α: per message step
    bandwidth: float  # β⁻¹: bytes/s per device achievable by a ring collective (busbw)


@dataclass(frozen=True)
class DeviceType:
    """One accelerator kind. Efficiency figures turn peak FLOP/s into what a layer really gets."""

    name: str
    memory_bytes: float
    peak_flops: dict[str, float]  # dense, per precision: fp32 | fp16 | bf16
    memory_bandwidth: float  # bytes/s (optimizer step and other memory-bound work)
    intra: Link  # inside a node
    inter: Link  # across nodes, per device
    gemm_efficiency: float = 0.75  # fraction of peak a large layer reaches (fwd+bwd, all kernels of a block)
    half_efficiency_flops: float = 2e9  # per-device FLOPs of one layer call at which it gets half of gemm_efficiency
    layer_overhead_s: float = 1e-4  # fixed cost per layer per micro-batch (kernel launches, dispatch), fwd+bwd
    reserve_bytes: float = 2 * GiB  # framework buffers, allocator fragmentation, communication buffers
    kind: str = "cuda"  # cuda | cpu


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: int
    devices_per_node: int
    device: DeviceType
    profile: dict = field(default_factory=dict, compare=False)  # measured figures, when calibrated

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def memory_capacity(self) -> float:
        """Bytes a plan may use on one device."""
        return self.device.memory_bytes - self.device.reserve_bytes

    def peak(self, precision: str) -> float:
        flops = self.device.peak_flops.get(precision, 0.0)
        if flops <= 0:
            raise UniapError(f"{self.device.name} has no {precision} support (choose one of "
                             f"{', '.join(p for p, f in self.device.peak_flops.items() if f > 0)})")
        return flops

    def node_of(self, rank):
        """Node of a rank (or an array of ranks): ranks fill nodes in order."""
        return rank // self.devices_per_node



# ---------------------------------------------------------------------------------------------
# Presets. Sources:
# A100: NVIDIA A100 datasheet (2021): 312 TFLOP/s dense bf16/fp16 tensor core, 19.5 TFLOP/s fp32
#   (non-tensor; 156 with TF32), HBM2e 2,039 GB/s (80 GB) / 1,555 GB/s (40 GB). NVLink3 600 GB/s
#   bidirectional per GPU; nccl-tests all_reduce busbw on DGX A100 ≈ 230 GB/s. Inter-node: DGX A100
#   has 8× 200 Gb/s HDR InfiniBand, one per GPU = 25 GB/s, busbw ≈ 20–23 GB/s measured (NVIDIA
#   Selene, Megatron-LM paper, Narayanan et al. 2021 §5).
# H100 SXM: datasheet 989 TFLOP/s dense bf16/fp16, 67 TFLOP/s fp32, HBM3 3.35 TB/s; NVLink4
#   900 GB/s bidirectional, all_reduce busbw ≈ 360–480 GB/s; 8× 400 Gb/s NDR = 50 GB/s per GPU.
# V100 SXM2 32 GB: datasheet 125 TFLOP/s fp16 tensor, 15.7 fp32, no bf16, HBM2 900 GB/s; DGX-1
#   NVLink2 hybrid cube mesh (≈ 130 GB/s busbw); 4× 100 Gb/s EDR per 8 GPUs ≈ 6 GB/s per GPU.
# TITAN Xp: 12 GB GDDR5X 547.6 GB/s, 12.1 TFLOP/s fp32, fp16 at 1/64 rate (GP102), no bf16; PCIe
#   3.0 x16 ≈ 10 GB/s measured busbw without NVLink; 10 GbE-class inter-node ≈ 1 GB/s (the UniAP
#   paper's EnvB: TITAN Xp nodes on a slow network).
# cpu: this development machine class (x86 core, AVX2 FMA: ~50 GFLOP/s fp32 peak per core, gloo
#   over loopback ~ 50 µs, ~1 GB/s); small layers are overhead-bound (DESIGN.md), hence the large
#   per-layer overhead. `uniap profile` replaces all of these with measured figures.
# ---------------------------------------------------------------------------------------------
_A100_INTRA = Link(latency_s=8e-6, bandwidth=230e9)
_A100_INTER = Link(latency_s=15e-6, bandwidth=22e9)

DEVICE_TYPES: dict[str, DeviceType] = {
    "a100-40g": DeviceType("A100-SXM4-40GB", 40e9, {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}, 1.555e12,
                           _A100_INTRA, _A100_INTER),
    "a100-80g": DeviceType("A100-SXM4-80GB", 80e9, {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}, 2.039e12,
                           _A100_INTRA, _A100_INTER),
    "h100-80g": DeviceType("H100-SXM5-80GB", 80e9, {"fp32": 67e12, "fp16": 989e12, "bf16": 989e12}, 3.35e12,
                           Link(8e-6, 400e9), Link(15e-6, 45e9), half_efficiency_flops=6e9),
    "v100-32g": DeviceType("V100-SXM2-32GB", 32e9, {"fp32": 15.7e12, "fp16": 125e12, "bf16": 0.0}, 0.9e12,
                           Link(10e-6, 130e9), Link(20e-6, 6e9), half_efficiency_flops=1e9),
    "titanxp-12g": DeviceType("TITAN Xp 12GB", 12e9, {"fp32": 12.1e12, "fp16": 0.19e12, "bf16": 0.0}, 0.5476e12,
                              Link(15e-6, 10e9), Link(50e-6, 1.2e9), half_efficiency_flops=2e8,
                              reserve_bytes=1 * GiB),
    "cpu": DeviceType("CPU core (gloo)", 4 * GiB, {"fp32": 50e9, "fp16": 0.0, "bf16": 25e9}, 10e9,
                      Link(50e-6, 1e9), Link(50e-6, 1e9), gemm_efficiency=0.5, half_efficiency_flops=2e6,
                      layer_overhead_s=2e-3, reserve_bytes=0.5 * GiB, kind="cpu"),
}

_PRESET_RE = re.compile(r"^(?P<kind>[a-z0-9-]+):(?P<nodes>\d+)x(?P<gpus>\d+)$")


def preset_names() -> list[str]:
    return sorted(DEVICE_TYPES)


def load_cluster(text: str) -> ClusterSpec:
    """`PRESET:NODESxDEVICES` (e.g. `a100-80g:4x8`) or a path to a YAML file."""
    match = _PRESET_RE.match(text.strip().lower())
    if match:
        kind, nodes, gpus = match["kind"], int(match["nodes"]), int(match["gpus"])
        if kind not in DEVICE_TYPES:
            near = difflib.get_close_matches(kind, DEVICE_TYPES, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else f" (presets: {', '.join(preset_names())})"
            raise UniapError(f"unknown cluster preset {kind!r}{hint}")
        if nodes < 1 or gpus < 1:
            raise UniapError(f"cluster {text!r} needs at least one node and one device per node")
        return ClusterSpec(name=f"{kind}:{nodes}x{gpus}", nodes=nodes, devices_per_node=gpus, device=DEVICE_TYPES[kind])
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml") or path.exists():
        return _load_yaml(path)
    raise UniapError(f"cluster {text!r} is neither PRESET:NODESxDEVICES (e.g. a100-80g:4x8) nor a YAML file")


def _load_yaml(path: Path) -> ClusterSpec:
    """YAML: nodes, devices_per_node, memory_gb, peak_tflops {fp32, fp16, bf16}, intra/inter {latency_us,
    bandwidth_gbps (GB/s)}; optional base (a preset whose remaining figures are kept), name."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UniapError(f"cannot read cluster file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UniapError(f"cluster file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UniapError(f"cluster file {path} must be a mapping of fields")
    base = DEVICE_TYPES.get(str(data.get("base", "a100-80g")).lower())
    if base is None:
        raise UniapError(f"cluster file {path}: unknown base preset {data.get('base')!r}")
    try:
        nodes = int(data["nodes"])
        per_node = int(data["devices_per_node"])
        device = base
        if "memory_gb" in data:
            device = replace(device, memory_bytes=float(data["memory_gb"]) * 1e9)
        if "peak_tflops" in data:
            peaks = dict(device.peak_flops)
            peaks.update({k: float(v) * 1e12 for k, v in dict(data["peak_tflops"]).items()})
            device = replace(device, peak_flops=peaks)
        if "memory_bandwidth_gbps" in data:
            device = replace(device, memory_bandwidth=float(data["memory_bandwidth_gbps"]) * 1e9)
        for level in ("intra", "inter"):
            if level in data:
                link = dict(data[level])
                old = getattr(device, level)
                device = replace(device, **{level: Link(
                    latency_s=float(link.get("latency_us", old.latency_s * 1e6)) * 1e-6,
                    bandwidth=float(link.get("bandwidth_gbps", old.bandwidth / 1e9)) * 1e9)})
        if "reserve_gb" in data:
            device = replace(device, reserve_bytes=float(data["reserve_gb"]) * 1e9)
        if "name" in data:
            device = replace(device, name=str(data["name"]))
    except KeyError as exc:
        raise UniapError(f"cluster file {path}: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UniapError(f"cluster file {path}: bad value ({exc})") from None
    if nodes < 1 or per_node < 1 or device.memory_bytes <= 0:
        raise UniapError(f"cluster file {path}: nodes, devices_per_node and memory must be positive")
    return ClusterSpec(name=str(data.get("name", path.stem)), nodes=nodes, devices_per_node=per_node, device=device)
