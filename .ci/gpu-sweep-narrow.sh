#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash .ci/gpu-pack.sh conv`):
# the halo kernels for outputs narrower than a tile (perf-notes entry 78) on the
# v1 model's last conv (8x8x64 -> 128, batch 256), against the GEMM core that ran
# it before (all three halo kernels off), with the forward's and dinput's
# blocks, workgroups per compute unit and dweight's block positions varied.
# Criterion times in the bench's order: forward | dweight | dinput. About 3
# minutes.
bash .ci/gpu-sweep.sh 'coop16/conv5_b256/(forward|dweight|dinput)' <<'CONFIGS'
rule
gemm_core AETHER_FORWARD_HALO=0 AETHER_DWEIGHT_HALO=0 AETHER_DINPUT_HALO=0
groups0 AETHER_HALO_GROUPS=0
groups1 AETHER_HALO_GROUPS=1
groups4 AETHER_HALO_GROUPS=4
f64x4x3x8x2 AETHER_FORWARD_HALO=64x4x3x8x2
f64x4x3x4x1 AETHER_FORWARD_HALO=64x4x3x4x1
f64x8x3x4x2x16 AETHER_FORWARD_HALO=64x8x3x4x2x16
f64x8x3x8x4x16 AETHER_FORWARD_HALO=64x8x3x8x4x16
f64x4x9x4x2x16 AETHER_FORWARD_HALO=64x4x9x4x2x16
w32 AETHER_DWEIGHT_HALO=32
rule_again
CONFIGS
