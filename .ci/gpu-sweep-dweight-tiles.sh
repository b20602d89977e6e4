#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash .ci/gpu-pack.sh conv`):
# dweight's halo kernel with more channel tiles per tap (AETHER_DWEIGHT_HALO=
# POSITIONSxIN_TILESxOUT_TILES; perf-notes entry 79) on the v1 model's convs 2-5,
# the reduce included in each time. The rule is 64 positions, 2 x 2 tiles: per
# 16 positions each tap's subgroup loads 2 + 2 tiles for 4 MMAs; 4 x 4 tiles
# load 4 + 4 for 16. A block that does not fit a conv leaves it to the GEMM core
# (an [aether] line says so). About 2.5 minutes.
bash .ci/gpu-sweep.sh 'coop16/conv[2-5]_b256/dweight' <<'CONFIGS'
rule
t2x4 AETHER_DWEIGHT_HALO=64x2x4
t4x2 AETHER_DWEIGHT_HALO=64x4x2
t4x4 AETHER_DWEIGHT_HALO=64x4x4
t1x4 AETHER_DWEIGHT_HALO=64x1x4
t2x4p128 AETHER_DWEIGHT_HALO=128x2x4
t4x4p32 AETHER_DWEIGHT_HALO=32x4x4
t2x4s1 AETHER_DWEIGHT_HALO=64x2x4 AETHER_DWEIGHT_SPLIT=1
t4x4s1 AETHER_DWEIGHT_HALO=64x4x4 AETHER_DWEIGHT_SPLIT=1
rule_again
CONFIGS
