#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the halo kernel's blocks on the v1 model's 16 x 16 convs (32->64 and 64->64),
# whose forwards sit at or above cuDNN's times (run CC5: 0.0247 against 0.0241
# and 0.0364 against 0.0318 ms on an H100). Swept here: every filter tap a step
# over 16 input channels at a time (4 steps a block of the 64 -> 64 conv, 8
# barriers, against 6 steps and 12 barriers for 3 taps over 32 channels), and
# 8-subgroup blocks two workgroups a unit. Earlier sweeps: perf-notes entries
# 53-58 and 64. About 2 minutes.
bash tools/gpu-sweep.sh 'coop16/conv[34]_b256/(forward|dinput)' <<'CONFIGS'
rule
9taps_c16 AETHER_FORWARD_HALO=256x4x9x16x2x16
3taps_c16 AETHER_FORWARD_HALO=256x4x3x16x2x16
9taps_c16_sg8 AETHER_FORWARD_HALO=256x4x9x8x2x16
9taps_c16_sg8_g2 AETHER_FORWARD_HALO=256x4x9x8x2x16 AETHER_HALO_GROUPS=2
sg8_g2 AETHER_FORWARD_HALO=256x4x3x8x2 AETHER_HALO_GROUPS=2
rule_again
CONFIGS
