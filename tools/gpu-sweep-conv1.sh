#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the GEMM core's blocks for the v1 model's first conv (32x32x3 -> 32, batch
# 256), whose 3 input channels give its im2col no 8-channel runs. In run A6 its
# forward sat at cuDNN's time (0.0362 against 0.0361 ms) and its backward above
# (0.0850 against 0.0737: dweight 0.0736, the rest its reduce). The rule: forward
# 256 x 32 outputs over 8 x 2 subgroups with 32-deep steps (8x2x2x1x2), dweight
# 64 x 32 over 2 x 2 subgroups (2x2x2x1x2) for its 28 rows, split-K over the
# positions. About 2 minutes.
bash tools/gpu-sweep.sh 'coop16/conv1_b256/(forward|dweight)' <<'CONFIGS'
rule
f8x2x1x1 AETHER_COOP_BLOCK=forward=8x2x1x1x2
f4x2x2x1 AETHER_COOP_BLOCK=forward=4x2x2x1x2
f8x1x2x2 AETHER_COOP_BLOCK=forward=8x1x2x2x2
f4x1x4x2 AETHER_COOP_BLOCK=forward=4x1x4x2x2
f8x2x4x1 AETHER_COOP_BLOCK=forward=8x2x4x1x2
w2x2x1x1x2 AETHER_COOP_BLOCK=dweight=2x2x1x1x2
w2x2x1x1x4 AETHER_COOP_BLOCK=dweight=2x2x1x1x4
w2x2x1x1x8 AETHER_COOP_BLOCK=dweight=2x2x1x1x8
w2x1x1x2x8 AETHER_COOP_BLOCK=dweight=2x1x1x2x8
w2x2x2x1x4 AETHER_COOP_BLOCK=dweight=2x2x2x1x4
w2x2x2x1x8 AETHER_COOP_BLOCK=dweight=2x2x2x1x8
rule_again
CONFIGS
