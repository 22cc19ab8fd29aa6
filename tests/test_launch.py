"""CPU tests of launch geometry: work units per K split and the split count."""
from jitgemm.config import KernelConfig
from jitgemm.launch import cluster_tiles, num_splits


def test_cluster_tiles_pair_up_along_the_multicast_side():
    plain = KernelConfig(block_m=128, block_n=128)
    assert cluster_tiles(plain, 1000, 1000) == 8 * 8
    pair_n = KernelConfig(block_m=128, block_n=128, cluster_size=2, multicast="A")
    assert cluster_tiles(pair_n, 1000, 5 * 128) == 8 * 3        # 5 column blocks -> 3 pairs
    pair_m = KernelConfig(block_m=128, block_n=128, cluster_size=2, multicast="B")
    assert cluster_tiles(pair_m, 3 * 128, 256) == 2 * 2         # 3 row blocks -> 2 pairs


def test_num_splits_never_leaves_a_split_empty():
    cfg = KernelConfig(split_k=8)
    assert num_splits(cfg, 4096) == 8
    assert num_splits(cfg, 200) == 4          # 4 K blocks of 64
    assert num_splits(cfg, 1) == 1
    assert num_splits(KernelConfig(), 4096) == 1
