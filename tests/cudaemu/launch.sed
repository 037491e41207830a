# cudaemu (docs/CUDAEMU.md): what g++ cannot read of a .cu file, rewritten.
# A launch k<<<cfg>>>(args) becomes hyb_emu_launch(k, "k", cfg)(args).
s/\([A-Za-z_][A-Za-z_0-9]*\(<[^<>]*>\)\{0,1\}\)<<<\(.*\)>>>(/hyb_emu_launch(\1, "\1", \3)(/
# extern __shared__ T name[]; becomes a pointer to the block's dynamic shared memory.
s/extern __shared__ \(__align__([0-9]*) \)\{0,1\}\(.*[^A-Za-z_0-9]\)\([A-Za-z_][A-Za-z_0-9]*\)\[\];/\2*const \3 = (\2*)hyb_emu_dyn_smem();/
