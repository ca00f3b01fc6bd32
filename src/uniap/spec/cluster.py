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
from uniap.spec.engine import Engine

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Link:
    latency_s: float  # α: per message step
    bandwidth: float  # β⁻¹: bytes/s per device achievable by a ring collective (busbw)
    # α per step of a ring all-gather / reduce-scatter where it differs from an all-reduce's (None: latency_s). A ring
    # across nodes sets it (cost.tables._slowest): NCCL runs those two as rings only, where it runs an all-reduce as a
    # ring or a tree, whichever its tuning model finds faster.
    gather_latency_s: float | None = None

    @property
    def gather_step_s(self) -> float:
        return self.latency_s if self.gather_latency_s is None else self.gather_latency_s


@dataclass(frozen=True)
class DeviceType:
    """One accelerator kind: what `cost.compute` needs to price GEMMs, attention and memory-bound operators.

    Each preset below states the source of every figure (docs/cost-model.md explains the terms).
    """

    name: str
    memory_bytes: float  # capacity as the driver reports it (nvidia-smi's MiB)
    peak_flops: dict[str, float]  # dense, per precision: fp32 | fp16 | bf16 | fp8 (fp8: the GEMMs' peak)
    memory_bandwidth: float  # bytes/s, datasheet HBM bandwidth
    intra: Link  # inside a node
    inter: Link  # across nodes, per device
    gemm_efficiency: float = 0.80  # fraction of dense peak a large, well-shaped GEMM sustains
    fp8_gemm_efficiency: float = 0.0  # the same for an fp8 GEMM, of the fp8 peak (0: no fp8 GEMMs)
    sm_count: int = 0  # streaming multiprocessors that GEMM tiles are spread over in waves (0: no wave model)
    gemm_half_k: float = 0.0  # inner dimension k at which operand loads halve a GEMM's efficiency
    attention_efficiency: tuple[float, float] = (0.5, 0.4)  # flash attention fwd, bwd (eager SDPA): fraction of peak
    fused_attention_efficiency: tuple[float, float] = (0.5, 0.4)  # the same, with a fused engine's attention kernel
    memory_efficiency: float = 0.85  # fraction of memory_bandwidth a streaming (element-wise) kernel reaches
    kernel_gap_s: float = 0.0  # fixed time per kernel on the device timeline (launch, tail, dependency)
    layer_overhead_s: float = 0.0  # fixed cost per layer call, fwd+bwd (host dispatch, hooks; CPU)
    overlap_slowdown: float = 0.0  # compute runs this fraction slower while data-parallel traffic overlaps it
    elementwise: bool = True  # price memory-bound operators (False: a measured FLOP rate already includes them)
    reserve_bytes: float = 2 * GiB  # framework buffers, allocator fragmentation, communication buffers
    kind: str = "cuda"  # cuda | cpu
    engine: Engine = Engine()  # the engine a cluster of these devices is costed with unless told otherwise


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: int
    devices_per_node: int
    device: DeviceType
    engine: Engine | None = None  # the engine plans are costed under; None: the device's default
    # Where layer and collective costs come from: None for the analytic model (cost.compute, cost.comm), or a
    # measured source (cost.source.CostSource; `uniap profile` + `profile.calibrate` make one).
    costs: object = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.engine is None:
            object.__setattr__(self, "engine", self.device.engine)

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
# Presets. Sources, per figure (docs/cost-model.md has the terms; "fitted" = benchmarks/published_runs.py
# --fit on the calibration half of benchmarks/data/published_runs.yaml; "estimate" = our reasoning, no source):
# memory   nvidia-smi's reported total: A100-SXM4-80GB 81,920 MiB, A100-SXM4-40GB 40,960 MiB, H100-SXM5-80GB
#          81,559 MiB, V100-SXM2-32GB 32,768 MiB (32 GiB HBM2), TITAN Xp 12,196 MiB.
# peak     datasheets, dense: A100 312 TFLOP/s bf16/fp16 tensor core, 19.5 fp32, no fp8; H100 SXM 989 bf16/fp16,
#          1,979 fp8, 67 fp32 (H800 the same); H100 NVL 1,670 fp8 (3,341 with sparsity);
#          V100 125 fp16 tensor, 15.7 fp32, no bf16; TITAN Xp 12.1 fp32, fp16 at 1/64 rate (GP102), no bf16.
# HBM      datasheets: A100 80 GB 2,039 GB/s, 40 GB 1,555 GB/s; H100 SXM 3.35 TB/s; V100 900 GB/s; TITAN Xp 547.6 GB/s.
# SMs      whitepapers: A100 108, H100 SXM5 132, V100 80, TITAN Xp 30.
# links    A100: NVLink3 600 GB/s bidirectional per GPU, nccl-tests all_reduce busbw on DGX A100 ~230 GB/s; 8x HDR
#          200 Gb/s InfiniBand per node = 25 GB/s per GPU, busbw ~20-23 GB/s (Narayanan et al. 2021 §5).
#          H100: NVLink4 900 GB/s bidirectional, all_reduce busbw ~360-480 GB/s (nccl-tests on DGX H100);
#          8x NDR 400 Gb/s = 50 GB/s per GPU. V100: DGX-1 hybrid cube mesh ~130 GB/s busbw; 4x EDR 100 Gb/s per
#          8 GPUs ~6 GB/s per GPU. TITAN Xp: PCIe 3.0 x16 ~10 GB/s busbw; 10 GbE-class network ~1 GB/s (UniAP EnvB).
#          Latency α per ring step (A100, H100): 3.4 µs over NVLink, 9.6 µs over the network — NCCL's own tuning
#          model (src/graph/tuning.cc, hwLat, Ring/Simple); other presets: estimates.
# GEMM     gemm_efficiency: sustained fraction of dense peak of large bf16 GEMMs in training — fitted. Wave and tile
#          quantisation (cost.compute) use the SM count and 256×128 tiles (NVIDIA, "Matrix Multiplication
#          Background User's Guide", tile and wave quantization). gemm_half_k = 64: estimate.
# attention FlashAttention-2 (Dao 2023, Figs. 4-6): A100, head dim 128, fwd 50-73 % of peak, bwd lower → 0.65 / 0.5.
#          On H100, FlashAttention-2 (what eager PyTorch SDPA runs) reaches ~35 % of peak and FlashAttention-3 /
#          cuDNN (Transformer Engine, fused engines) 60-75 % fwd (Shah et al. 2024, FlashAttention-3, Figs. 5-7).
#          V100 and TITAN Xp have no flash kernel (needs sm80): their engine defaults to standard attention.
# memory-bound  memory_efficiency 0.85 of datasheet bandwidth for streaming kernels: estimate (STREAM-like copy
#          kernels reach 80-90 % of HBM peak). kernel_gap_s 3 µs per kernel: estimate (launch latency).
# overlap  overlap_slowdown: compute slowdown while NCCL kernels run beside it (they hold 8-32 SMs and HBM
#          bandwidth) — fitted (grid 0, 0.1, 0.2, 0.3).
#          Across nodes a group's ring is one NIC rail per rank on a node wide (cost.tables._slowest; nccl-tests),
#          its all-gather / reduce-scatter steps cost at least NCCL's 14 µs network step and its bandwidth falls
#          5.7 % per doubling of the nodes past 4 (cost.tables.RING_STEP_ACROSS_NODES_S, fabric_share; the
#          published figures at scale, NVIDIA/nccl#1229 and #1218).
# h100-96g H100 with 96 GB HBM2e capped at 500 W (Meta's Grand Teton; the machines of torchtitan's published
#          benchmarks): 96 GB and 2.4 TB/s as torchtitan's docs/performance.md states; its peak "lies between the SXM
#          and the NVL": we take the H100 NVL datasheet's 835 TFLOP/s dense bf16, the lower end (an estimate
#          within a sourced range); everything else as the H100 SXM (same GH100 chip, NVLink4, 400 Gb/s NICs).
# h800     H800 SXM5 80 GB (DeepSeek-V3's cluster): the H100 SXM5's GH100 chip and HBM3 with NVLink cut to 400 GB/s
#          bidirectional (H100: 900). Compute, memory, SMs, attention and GEMM efficiencies: as the H100 SXM (the
#          nvidia-smi total of 81,559 MiB is the H100 SXM5 80 GB's; not checked on an H800). NVLink busbw 160 GB/s:
#          DeepSeek-V3 technical report (arXiv 2412.19437) §3.2.2, "NVLink offers a bandwidth of 160 GB/s, roughly
#          3.2 times that of IB (50 GB/s)", and DeepEP's README (deepseek-ai/DeepEP README.md @0aaa6744, "H800 (~160
#          GB/s NVLink maximum bandwidth)", intranode EP8 dispatch/combine 153/158 GB/s) — the same ~0.8 of the
#          200 GB/s per direction that the H100's 400 GB/s busbw is of its 450. Network: 8 GPUs per node (report
#          §3.1), one CX7 400 Gb/s InfiniBand NIC per GPU, "~50 GB/s maximum bandwidth" (DeepEP README) → 45 GB/s
#          busbw as the H100 (same NIC). Latencies as the H100 (NCCL's tuning model has no H800 entry).
# cpu      this development machine class (x86 core, AVX2 FMA: ~50 GFLOP/s fp32 peak per core, gloo over loopback
#          ~50 µs, ~1 GB/s); small layers are overhead-bound, hence the per-layer overhead (estimate). `uniap
#          profile` replaces all of these with measured figures.
# ---------------------------------------------------------------------------------------------
_A100_INTRA = Link(latency_s=3.4e-6, bandwidth=230e9)
_A100_INTER = Link(latency_s=9.6e-6, bandwidth=22e9)
_A100_PEAK = {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}
_STANDARD = Engine(kernels="eager", attention="standard")

# Fitted constants (benchmarks/published_runs.py --fit, calibration half only); see the table above.
A100_GEMM_EFFICIENCY = 0.70  # also used for V100 and TITAN Xp: no training data of theirs to fit on (a guess)
H100_GEMM_EFFICIENCY = 0.60
# fp8 GEMMs (fraction of the fp8 peak), fitted second, on the fp8 calibration rows alone with the others held.
H100_FP8_GEMM_EFFICIENCY = 0.55
OVERLAP_SLOWDOWN = 0.20

_H100_PEAK = {"fp32": 67e12, "fp16": 989e12, "bf16": 989e12, "fp8": 1979e12}
_GPU = dict(gemm_half_k=64.0, memory_efficiency=0.85, kernel_gap_s=3e-6, overlap_slowdown=OVERLAP_SLOWDOWN)

DEVICE_TYPES: dict[str, DeviceType] = {
    "a100-40g": DeviceType("A100-SXM4-40GB", 40960 * MiB, _A100_PEAK, 1.555e12, _A100_INTRA, _A100_INTER,
                           gemm_efficiency=A100_GEMM_EFFICIENCY, sm_count=108, attention_efficiency=(0.65, 0.5),
                           fused_attention_efficiency=(0.65, 0.5), **_GPU),
    "a100-80g": DeviceType("A100-SXM4-80GB", 81920 * MiB, _A100_PEAK, 2.039e12, _A100_INTRA, _A100_INTER,
                           gemm_efficiency=A100_GEMM_EFFICIENCY, sm_count=108, attention_efficiency=(0.65, 0.5),
                           fused_attention_efficiency=(0.65, 0.5), **_GPU),
    "h100-80g": DeviceType("H100-SXM5-80GB", 81559 * MiB, _H100_PEAK, 3.35e12,
                           Link(3.4e-6, 400e9), Link(9.6e-6, 45e9), gemm_efficiency=H100_GEMM_EFFICIENCY,
                           fp8_gemm_efficiency=H100_FP8_GEMM_EFFICIENCY, sm_count=132,
                           attention_efficiency=(0.35, 0.3), fused_attention_efficiency=(0.6, 0.45), **_GPU),
    "h100-96g": DeviceType("H100-96GB-HBM2e-500W", 96e9, {"fp32": 67e12 * 835 / 989, "fp16": 835e12, "bf16": 835e12,
                                                             "fp8": 1670e12},
                           2.4e12, Link(3.4e-6, 400e9), Link(9.6e-6, 45e9), gemm_efficiency=H100_GEMM_EFFICIENCY,
                           fp8_gemm_efficiency=H100_FP8_GEMM_EFFICIENCY,
                           sm_count=132, attention_efficiency=(0.35, 0.3), fused_attention_efficiency=(0.6, 0.45),
                           **_GPU),
    "h800-80g": DeviceType("H800-SXM5-80GB", 81559 * MiB, _H100_PEAK, 3.35e12,
                           Link(3.4e-6, 160e9), Link(9.6e-6, 45e9), gemm_efficiency=H100_GEMM_EFFICIENCY,
                           fp8_gemm_efficiency=H100_FP8_GEMM_EFFICIENCY, sm_count=132,
                           attention_efficiency=(0.35, 0.3), fused_attention_efficiency=(0.6, 0.45), **_GPU),
    "v100-32g": DeviceType("V100-SXM2-32GB", 32768 * MiB, {"fp32": 15.7e12, "fp16": 125e12, "bf16": 0.0}, 0.9e12,
                           Link(10e-6, 130e9), Link(20e-6, 6e9), gemm_efficiency=A100_GEMM_EFFICIENCY, sm_count=80,
                           engine=_STANDARD, **_GPU),
    "titanxp-12g": DeviceType("TITAN Xp 12GB", 12196 * MiB, {"fp32": 12.1e12, "fp16": 0.19e12, "bf16": 0.0},
                              0.5476e12, Link(15e-6, 10e9), Link(50e-6, 1.2e9), gemm_efficiency=A100_GEMM_EFFICIENCY,
                              sm_count=30, reserve_bytes=1 * GiB, engine=_STANDARD, **_GPU),
    "cpu": DeviceType("CPU core (gloo)", 4 * GiB, {"fp32": 50e9, "fp16": 0.0, "bf16": 25e9}, 10e9,
                      Link(50e-6, 1e9), Link(50e-6, 1e9), gemm_efficiency=0.5, layer_overhead_s=2e-3,
                      reserve_bytes=0.5 * GiB, kind="cpu", engine=_STANDARD),
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
    """YAML: nodes, devices_per_node, memory_gib (2³⁰ bytes, what nvidia-smi's MiB add up to) or memory_gb
    (10⁹ bytes), peak_tflops {fp32, fp16, bf16}, intra/inter {latency_us, bandwidth_gbps (GB/s)}, kernels
    (fused | eager), attention (flash | standard); optional base (a preset whose remaining figures are
    kept), name."""
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
        if "memory_gb" in data and "memory_gib" in data:
            raise UniapError(f"cluster file {path}: give memory_gib or memory_gb, not both")
        if "memory_gb" in data:
            device = replace(device, memory_bytes=float(data["memory_gb"]) * 1e9)
        if "memory_gib" in data:
            device = replace(device, memory_bytes=float(data["memory_gib"]) * GiB)
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
        engine = Engine(kernels=str(data.get("kernels", device.engine.kernels)),
                        attention=str(data.get("attention", device.engine.attention)))
    except KeyError as exc:
        raise UniapError(f"cluster file {path}: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UniapError(f"cluster file {path}: bad value ({exc})") from None
    if nodes < 1 or per_node < 1 or device.memory_bytes <= 0:
        raise UniapError(f"cluster file {path}: nodes, devices_per_node and memory must be positive")
    return ClusterSpec(name=str(data.get("name", path.stem)), nodes=nodes, devices_per_node=per_node, device=device,
                       engine=engine)
