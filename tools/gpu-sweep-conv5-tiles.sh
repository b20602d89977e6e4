#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the GEMM core's blocks of 4 x 4 tiles a subgroup on the v1 model's last conv
# (8x8x64 -> 128, batch 256; all three directions run the core). perf-notes
# entry 81: the core's staging every 32-deep step, not its matrix units, holds
# it back, and in coop_peak's staged mode 8 subgroups of 4 x 4 tiles kept 318
# TFLOP/s with one workgroup a unit against 214 for the rule's 16 subgroups of
# 2 x 2. Entries 70 and 76 swept 1 x 1 to 2 x 4 tiles only. About 2 minutes.
# The conv suite passes with dinput=2x1x4x4x4,dweight=1x2x4x4x2 pinned on Mesa 26
# coop8 (not yet run on a GPU).
bash tools/gpu-sweep.sh 'coop16/conv5_b256/(forward|dweight|dinput)' <<'CONFIGS'
rule
f2x2x4x4x2 AETHER_COOP_BLOCK=forward=2x2x4x4x2
f2x2x4x4x4 AETHER_COOP_BLOCK=forward=2x2x4x4x4
f4x2x4x4x2 AETHER_COOP_BLOCK=forward=4x2x4x4x2
f2x1x4x4x2 AETHER_COOP_BLOCK=forward=2x1x4x4x2
i2x1x4x4x2 AETHER_COOP_BLOCK=dinput=2x1x4x4x2
i2x1x4x4x4 AETHER_COOP_BLOCK=dinput=2x1x4x4x4
i4x1x4x4x2 AETHER_COOP_BLOCK=dinput=4x1x4x4x2
w1x2x4x4x2 AETHER_COOP_BLOCK=dweight=1x2x4x4x2
w2x2x4x4x2 AETHER_COOP_BLOCK=dweight=2x2x4x4x2
rule_again
CONFIGS
