#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the halo kernels with position tiles stacking 16 images on the v1 model's
# last conv (8x8x64 -> 128, batch 256), narrower than a tile (perf-notes entry
# 82). The rule stacks the forward's (16 positions by 4 channel tiles over 8 x 2
# subgroups, 3 taps a step, 16 channels a stage); `core` is the GEMM core it
# replaced. A pinned block (AETHER_FORWARD_HALO=
# POSITIONSxCHANNEL_TILESxTAPSxSUBGROUPSxCOLUMNSxCHUNK with AETHER_HALO_STACK=1)
# takes dinput's transposed conv too where it fits (the rule leaves dinput on
# the GEMM core); dweight is unchanged. Positions are per image of the stack.
# Blocks over 48 KiB of workgroup memory, or whose position tiles do not split
# evenly over the subgroups, decline to the GEMM core (a time like `core`'s).
# About 4 minutes.
pin() { echo "AETHER_HALO_STACK=1 AETHER_FORWARD_HALO=$1"; }
bash tools/gpu-sweep.sh 'coop16/conv5_b256/(forward|dweight|dinput)' <<CONFIGS
rule
core AETHER_HALO_STACK=0
16x8x3x16x2 $(pin 16x8x3x16x2x16)
16x8x3x16x4 $(pin 16x8x3x16x4x16)
16x8x3x32x2 $(pin 16x8x3x32x2x16)
16x8x3x32x4 $(pin 16x8x3x32x4x16)
16x4x3x16x1 $(pin 16x4x3x16x1x16)
16x4x3x16x4 $(pin 16x4x3x16x4x16)
16x4x3x8x2 $(pin 16x4x3x8x2x16)
16x4x3x32x2 $(pin 16x4x3x32x2x16)
16x4x3x32x4 $(pin 16x4x3x32x4x16)
16x4x1x16x2 $(pin 16x4x1x16x2x16)
16x2x3x16x2 $(pin 16x2x3x16x2x16)
16x2x3x16x1 $(pin 16x2x3x16x1x16)
16x2x3x8x2 $(pin 16x2x3x8x2x16)
16x2x9x16x2 $(pin 16x2x9x16x2x16)
16x2x9x8x2 $(pin 16x2x9x8x2x16)
16x2x1x16x2 $(pin 16x2x1x16x2x16)
8x8x3x16x2 $(pin 8x8x3x16x2x16)
8x4x3x16x2 $(pin 8x4x3x16x2x16)
8x4x3x16x4 $(pin 8x4x3x16x4x16)
8x4x3x8x2 $(pin 8x4x3x8x2x16)
8x4x9x16x2 $(pin 8x4x9x16x2x16)
8x4x9x8x2 $(pin 8x4x9x8x2x16)
8x4x1x16x2x32 $(pin 8x4x1x16x2x32)
8x2x3x16x2 $(pin 8x2x3x16x2x16)
rule_again
CONFIGS
