{#
  Included by templates/sm90/gemm.cu.j2 and templates/sm100/gemm.cu.j2. Reads the Jinja values
  `pair_along` ('m' or 'n': the kernel dimension along which a 2-CTA cluster pairs neighbouring
  tiles; None for one CTA, see `pair_along` in each arch's layout.py) and `cfg.raster`, and the
  C++ constant GROUP (cfg.group_size) the including template defines.
#}
// ---- Tile scheduler (templates/common/scheduler.cuh; the sm_90a and sm_100a kernels share it) ----
// The persistent CTAs walk "cluster tiles": one kernel tile, or with a 2-CTA cluster a pair of
// neighbouring kernel tiles (one per CTA, by `rank`) that share one operand tile. The walk goes
// through groups of GROUP cluster-rows (raster 'm': down the group's rows, then on to the next
// column) or GROUP cluster-columns (raster 'n'), so that consecutive work shares operand tiles
// in L2. With an odd number of blocks along the pair, the second CTA of the last pair lies past
// the edge: it recomputes the last block, its peer's tile (so the pair's shared loads and
// barriers keep both CTAs in step), and stores nothing.
// jitgemm.geometry.tile_order mirrors this walk (the heuristics' L2 model): change both together.
{% if pair_along == 'm' %}
// Here: pairs along kernel M (neighbouring m blocks of one n block share the B tile), raster '{{ cfg.raster }}'.
{% elif pair_along == 'n' %}
// Here: pairs along kernel N (neighbouring n blocks of one m block share the A tile), raster '{{ cfg.raster }}'.
{% else %}
// Here: one tile per cluster tile, raster '{{ cfg.raster }}'.
{% endif %}
struct TileCoord { int m_block; int n_block; bool valid; };   // valid: this CTA stores the tile

// The grid of cluster tiles over num_m x num_n kernel tiles.
__device__ __forceinline__ int cluster_grid_m(int num_m) { return {{ '(num_m + 1) / 2' if pair_along == 'm' else 'num_m' }}; }
__device__ __forceinline__ int cluster_grid_n(int num_n) { return {{ '(num_n + 1) / 2' if pair_along == 'n' else 'num_n' }}; }
__device__ __forceinline__ int num_cluster_tiles(int num_m, int num_n) {
    return cluster_grid_m(num_m) * cluster_grid_n(num_n);
}

// This CTA's kernel tile of cluster tile t, the t-th of the walk.
__device__ __forceinline__ TileCoord tile_of(int t, int num_m, int num_n, u32 rank) {
    const int grid_m = cluster_grid_m(num_m), grid_n = cluster_grid_n(num_n);
{% if cfg.raster == 'm' %}
    const int per_group = GROUP * grid_n;
    const int first = (t / per_group) * GROUP;
    const int rows = min(GROUP, grid_m - first);
    const int cm = first + (t % per_group) % rows;
    const int cn = (t % per_group) / rows;
{% else %}
    const int per_group = GROUP * grid_m;
    const int first = (t / per_group) * GROUP;
    const int cols = min(GROUP, grid_n - first);
    const int cn = first + (t % per_group) % cols;
    const int cm = (t % per_group) / cols;
{% endif %}
    TileCoord c;
{% if pair_along == 'm' %}
    c.m_block = 2 * cm + (int)rank; c.n_block = cn;
    c.valid = c.m_block < num_m;
    if (!c.valid) c.m_block = num_m - 1;
{% elif pair_along == 'n' %}
    c.m_block = cm; c.n_block = 2 * cn + (int)rank;
    c.valid = c.n_block < num_n;
    if (!c.valid) c.n_block = num_n - 1;
{% else %}
    c.m_block = cm; c.n_block = cn; c.valid = true;
{% endif %}
    return c;
}
