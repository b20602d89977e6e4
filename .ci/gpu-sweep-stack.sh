#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash .ci/gpu-pack.sh conv`):
# the forward's halo kernel with position tiles stacking 16 images
# (AETHER_HALO_STACK=1) on the v1 model's last conv (8x8x64 -> 128, batch 256),
# whose forward and dinput otherwise run the GEMM core (perf-notes entry 82).
# The pinned block (AETHER_FORWARD_HALO=POSITIONSxCHANNEL_TILESxTAPSxSUBGROUPSxCOLUMNSxCHUNK)
# also takes dinput's transposed conv where it fits; dweight is unchanged.
# About 2 minutes.
pin() { echo "AETHER_HALO_STACK=1 AETHER_FORWARD_HALO=$1"; }
bash .ci/gpu-sweep.sh 'coop16/conv5_b256/(forward|dweight|dinput)' <<CONFIGS
rule
s16x4x3x16x2 $(pin 16x4x3x16x2x16)
s16x8x3x16x2 $(pin 16x8x3x16x2x16)
s8x4x3x16x2 $(pin 8x4x3x16x2x16)
s8x8x3x16x2 $(pin 8x8x3x16x2x16)
s16x4x3x8x2 $(pin 16x4x3x8x2x16)
s16x4x1x16x2 $(pin 16x4x1x16x2x16)
s16x4x3x16x4 $(pin 16x4x3x16x4x16)
s8x4x1x16x2c32 $(pin 8x4x1x16x2x32)
rule_again
CONFIGS
