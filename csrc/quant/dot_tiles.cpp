// dot_tile_for: the tile kernel that reproduces a given vec_dot (see dot_tiles.hpp). The
// registries pair each tile with the vec_dot it must equal, so a kernel table chosen for
// one ISA (or the float-activation kernels) only ever meets its own.
#include "quant/dot_tiles.hpp"

namespace colibri {

const DotTile* dot_tile_for(const TypeKernels& k) {
  if (!k.vec_dot) return nullptr;
  for (const DotTile* p = float_act_tiles(); p->vec_dot; ++p)
    if (p->vec_dot == k.vec_dot) return p;
#if defined(COLIBRI_X86)
  for (const DotTile* list :
       {basic_avx2_tiles(), basic_avx512_tiles(), kquant_avx2_tiles(), kquant_avx512_tiles(), iq_avx2_tiles(), iq_avx512_tiles()})
    for (const DotTile* p = list; p->vec_dot; ++p)
      if (p->vec_dot == k.vec_dot) return p;
#endif
  return nullptr;
}

}  // namespace colibri
