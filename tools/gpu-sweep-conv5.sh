#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the GEMM core's blocks for the v1 model's last conv (8x8x64 -> 128, batch 256),
# whose outputs are narrower than a halo tile, so all three directions run the
# GEMM core. In run C6 it sat furthest above cuDNN: forward 0.0261 against
# 0.0159 ms, backward 0.0766 against 0.0523. Entry 70 swept the forward's
# 128 x 128 and 64 x 128 blocks; this sweeps 64- and 128-row blocks 64 wide,
# and dinput's and dweight's blocks. About 2.5 minutes.
bash tools/gpu-sweep.sh 'coop16/conv5_b256/(forward|dweight|dinput)' <<'CONFIGS'
rule
f4x4x2x1x2 AETHER_COOP_BLOCK=forward=4x4x2x1x2
f4x4x1x1x2 AETHER_COOP_BLOCK=forward=4x4x1x1x2
f8x2x1x2x2 AETHER_COOP_BLOCK=forward=8x2x1x2x2
f4x2x2x2x2 AETHER_COOP_BLOCK=forward=4x2x2x2x2
i4x4x2x1x2 AETHER_COOP_BLOCK=dinput=4x4x2x1x2
i4x4x1x1x4 AETHER_COOP_BLOCK=dinput=4x4x1x1x4
i8x2x1x2x2 AETHER_COOP_BLOCK=dinput=8x2x1x2x2
i8x2x2x1x2 AETHER_COOP_BLOCK=dinput=8x2x2x1x2
w4x4x2x2x2 AETHER_COOP_BLOCK=dweight=4x4x2x2x2
w4x2x2x2x2 AETHER_COOP_BLOCK=dweight=4x2x2x2x2
w2x2x2x2x2 AETHER_COOP_BLOCK=dweight=2x2x2x2x2
w2x4x2x2x4 AETHER_COOP_BLOCK=dweight=2x4x2x2x4
rule_again
CONFIGS
