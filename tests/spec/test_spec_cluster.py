"""Cluster presets: the H800 is an H100 SXM with NVLink cut to 400 GB/s (DeepSeek-V3's cluster)."""

from uniap.spec.cluster import DEVICE_TYPES, load_cluster, preset_names


def test_h800_is_an_h100_with_a_narrower_nvlink():
    h800, h100 = DEVICE_TYPES["h800-80g"], DEVICE_TYPES["h100-80g"]
    assert "h800-80g" in preset_names()
    # same GH100 chip and HBM3: compute, memory, SMs
    assert h800.peak_flops == h100.peak_flops and h800.memory_bytes == h100.memory_bytes
    assert h800.memory_bandwidth == h100.memory_bandwidth and h800.sm_count == h100.sm_count
    # NVLink: 160 GB/s measured (DeepSeek-V3 report §3.2.2, DeepEP README), well under the H100's 400 GB/s busbw
    assert h800.intra.bandwidth == 160e9 < h100.intra.bandwidth
    # one 400 Gb/s CX7 NIC per GPU, as the H100 preset
    assert h800.inter == h100.inter


def test_deepseek_v3_cluster_loads():
    cluster = load_cluster("h800-80g:256x8")  # 2,048 H800 GPUs, 8 per node (DeepSeek-V3 report §3.1)
    assert cluster.devices == 2048 and cluster.device.name == "H800-SXM5-80GB"
