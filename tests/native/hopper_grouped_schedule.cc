// Prints, as JSON, the schedule the grouped Hopper kernel runs for one problem, computed with the
// kernel's own functions (csrc/ragged_dot/hopper_grouped_schedule.h): the tile table, the items
// each persistent CTA computes (its tile, column block and which consumer warpgroups have rows
// there), where each TMA box of each K tile starts, the three tensor maps' shapes and the bytes
// the producer expects per stage. Built with g++ and checked against TMA's rules and an
// independent model by tests/ragged_dot/test_ragged_dot_hopper.py.
//
//   hopper_grouped_schedule CAPACITY SMS M N K size_0 ... size_{G-1}
//   hopper_grouped_schedule wgrad SMS M K N size_0 ... size_{G-1}
//
// CAPACITY < 0: the contiguous layout; >= 0: the masked layout (M = G * CAPACITY). SMS: the
// multiprocessors the persistent grid is sized by. The tile table is built as the tile-table
// kernel (csrc/ragged_dot/grouped_layout.cu GroupedTilesKernel) builds it: an inclusive scan of
// max(size, 0) clamped by ClampGroup (or MaskedGroup), split by TilesOfGroup / TileOfGroup; only
// the scan itself is sequential here.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "csrc/ragged_dot/hopper_grouped_schedule.h"

using namespace gpuext;
using namespace gpuext::hopper_grouped;

static void PrintMap(const char* name, const MapShape& s, bool last) {
  std::printf("\"%s\": {\"dims\": [%lld, %lld, %lld], \"box\": [%d, %d, 1], \"elem_bytes\": %d, "
              "\"swizzle_128b\": %s}%s",
              name, static_cast<long long>(s.d0), static_cast<long long>(s.d1), static_cast<long long>(s.d2), s.box0,
              s.box1, s.elem_bytes, s.swizzle_128b ? "true" : "false", last ? "" : ", ");
}

// The weight gradient's schedule: the groups' token blocks (the tile table's per-group first tiles,
// tile_rows 128 over the M tokens), the grid, every CTA's items with the box starts per block
// [a.c0, a.c1, b.c0, b.c1, sa.c0, sa.c1, sb.c0, sb.c1], and the four maps.
static int Wgrad(int64_t sms, int64_t m, int64_t k, int64_t n, const std::vector<int64_t>& sizes) {
  const int64_t groups = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> tile_start;
  int64_t end = 0, tiles = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t size = sizes[g] > 0 ? sizes[g] : 0;
    end += size;
    tile_start.push_back(tiles);
    tiles += TilesOfGroup(ClampGroup(end, size, m).rows, kTileRows);
  }
  tile_start.push_back(tiles);
  // the slot layout's blocks: grouped_block_count(m, groups, 128), as Python sizes it
  const int64_t most = (m + (groups + 1) * (kBlockK - 1)) / kBlockK;
  const int64_t blocks = most < m ? most : m;
  const bool launched = groups > 0 && k > 0 && n > 0 && m > 0 && blocks > 0;
  const int64_t grid = launched ? WgradGrid(groups, k, n, sms) : 0;
  const int64_t items = WgradItems(groups, k, n);
  std::printf("{\"blocks\": %lld, \"grid\": %lld, \"stage_tx_bytes\": %d, \"tile_start\": [",
              static_cast<long long>(blocks), static_cast<long long>(grid), kWgradStageTxBytes);
  for (size_t i = 0; i < tile_start.size(); ++i)
    std::printf("%s%lld", i ? ", " : "", static_cast<long long>(tile_start[i]));
  std::printf("], \"maps\": ");
  if (launched) {
    const WgradMapShapes s = WgradTensorMapShapes(k, n, blocks);
    std::printf("{");
    PrintMap("a", s.a, false);
    PrintMap("b", s.b, false);
    PrintMap("sa", s.sa, false);
    PrintMap("sb", s.sb, true);
    std::printf("}");
  } else {
    std::printf("null");
  }
  std::printf(", \"ctas\": [");
  for (int64_t cta = 0; cta < grid; ++cta) {
    std::printf("%s[", cta ? ", " : "");
    for (int64_t item = cta; item < items; item += grid) {
      const WgradItem it = WgradItemOf(static_cast<int>(item), static_cast<int>(k), static_cast<int>(n));
      std::printf("%s{\"g\": %d, \"m0\": %d, \"n0\": %d, \"active\": [%s, %s], \"loads\": [", item == cta ? "" : ", ",
                  it.g, it.m0, it.n0, WgradWarpgroupActive(it, 0, static_cast<int>(k)) ? "true" : "false",
                  WgradWarpgroupActive(it, 1, static_cast<int>(k)) ? "true" : "false");
      for (int64_t b = tile_start[it.g]; b < tile_start[it.g + 1]; ++b) {
        const WgradLoads l = WgradLoadsOf(it, static_cast<int>(b));
        std::printf("%s[%d, %d, %d, %d, %d, %d, %d, %d]", b == tile_start[it.g] ? "" : ", ", l.a.c0, l.a.c1, l.b.c0,
                    l.b.c1, l.sa.c0, l.sa.c1, l.sb.c0, l.sb.c1);
      }
      std::printf("]}");
    }
    std::printf("]");
  }
  std::printf("]}\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[1]) == "wgrad") {
    std::vector<int64_t> sizes;
    for (int i = 6; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
    return Wgrad(std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]), sizes);
  }
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s CAPACITY SMS M N K size...\n", argv[0]);
    return 2;
  }
  const int64_t capacity = std::atoll(argv[1]), sms = std::atoll(argv[2]);
  const int64_t m = std::atoll(argv[3]), n = std::atoll(argv[4]), k = std::atoll(argv[5]);
  std::vector<int64_t> sizes;
  for (int i = 6; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  const int64_t groups = static_cast<int64_t>(sizes.size());

  std::vector<GroupTile> tiles;
  std::vector<int64_t> tile_start;
  int64_t end = 0;  // unclamped, as the scan's carry
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t size = sizes[g] > 0 ? sizes[g] : 0;
    end += size;
    const GroupSpan span = capacity < 0 ? ClampGroup(end, size, m) : MaskedGroup(g, sizes[g], capacity);
    tile_start.push_back(static_cast<int64_t>(tiles.size()));
    for (int64_t i = 0; i < TilesOfGroup(span.rows, kTileRows); ++i)
      tiles.push_back(TileOfGroup(g, span, i, kTileRows));
  }
  tile_start.push_back(static_cast<int64_t>(tiles.size()));
  const int64_t tile_capacity = TileCapacity(m, groups, kTileRows);
  const int64_t n_blocks = (n + kBlockN - 1) / kBlockN;
  // Launch runs the matmul kernel only for m, n, groups > 0 (hopper_grouped.cu).
  const bool launched = m > 0 && n > 0 && groups > 0;
  const int64_t grid = launched ? PersistentGrid(tile_capacity, n, sms) : 0;
  const int count = static_cast<int>(tiles.size());
  const int64_t items = static_cast<int64_t>(count) * n_blocks;

  std::printf("{\"capacity\": %lld, \"grid\": %lld, \"k_tiles\": %lld, \"stage_tx_bytes\": %d, \"tiles\": [",
              static_cast<long long>(tile_capacity), static_cast<long long>(grid),
              static_cast<long long>(KTiles(k)), kStageTxBytes);
  for (size_t i = 0; i < tiles.size(); ++i)
    std::printf("%s[%d, %d, %d]", i ? ", " : "", tiles[i].group, tiles[i].row0, tiles[i].row_end);
  std::printf("], \"tile_start\": [");
  for (size_t i = 0; i < tile_start.size(); ++i)
    std::printf("%s%lld", i ? ", " : "", static_cast<long long>(tile_start[i]));
  std::printf("], \"maps\": ");
  if (launched) {
    const MapShapes s = TensorMapShapes(m, n, k, groups);
    std::printf("{");
    PrintMap("a", s.a, false);
    PrintMap("b", s.b, false);
    PrintMap("sa", s.sa, true);
    std::printf("}");
  } else {
    std::printf("null");
  }
  // Every CTA's items, in the order it runs them (the kernel's loop: item = cta, cta + grid, ...):
  // its (t, n0), whether each consumer warpgroup computes, and per K tile the box starts
  // [a.c0, a.c1, b.c0, b.c1, sa.c0, sa.c1, scale_skip].
  std::printf(", \"ctas\": [");
  for (int64_t cta = 0; cta < grid; ++cta) {
    std::printf("%s[", cta ? ", " : "");
    bool first = true;
    for (int64_t item = cta; item < items; item += grid) {
      const CtaTile c = CtaTileOf(static_cast<int>(item), count, static_cast<int>(n));
      std::printf("%s{\"t\": %d, \"n0\": %d", first ? "" : ", ", c.t, c.n0);
      first = false;
      if (c.t < 0 || c.t >= count) {
        std::printf(", \"active\": [], \"loads\": []}");
        continue;
      }
      std::printf(", \"active\": [%s, %s], \"loads\": [", WarpgroupActive(tiles[c.t], 0) ? "true" : "false",
                  WarpgroupActive(tiles[c.t], 1) ? "true" : "false");
      for (int kt = 0; kt < KTiles(k); ++kt) {
        const TileLoads l = LoadsOf(tiles[c.t], c.n0, kt, static_cast<int>(n));
        std::printf("%s[%d, %d, %d, %d, %d, %d, %d]", kt ? ", " : "", l.a.c0, l.a.c1, l.b.c0, l.b.c1, l.sa.c0, l.sa.c1,
                    l.scale_skip);
      }
      std::printf("]}");
    }
    std::printf("]");
  }
  std::printf("]}\n");
  return 0;
}
