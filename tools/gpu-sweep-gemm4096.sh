#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the 4096^3 GEMM's forward blocks (AETHER_COOP_BLOCK=forward=SG_MxSG_NxTMxTNxKT)
# with naga's index clamping left out (perf-notes entry 83), where the rule's
# 16 subgroups of 2 x 4 tiles fell from 158 to 115 TFLOP/s (run W7) and the
# blocks before entry 62 rose from 73 to 141. `checks` is the rule with the
# clamping kept (AETHER_SHADER_CHECKS=1). About 2 minutes.
pin() { echo "AETHER_COOP_BLOCK=forward=$1"; }
bash tools/gpu-sweep.sh 'coop16/gemm4096_b1/forward' <<CONFIGS
rule
checks AETHER_SHADER_CHECKS=1
4x2x4x4x2 $(pin 4x2x4x4x2)
2x4x4x4x2 $(pin 2x4x4x4x2)
4x4x2x2x2 $(pin 4x4x2x2x2)
4x4x4x2x2 $(pin 4x4x4x2x2)
8x2x2x4x2 $(pin 8x2x2x4x2)
4x4x2x4x1 $(pin 4x4x2x4x1)
4x4x2x4x4 $(pin 4x4x2x4x4)
2x2x4x4x2 $(pin 2x2x4x4x2)
rule_again
CONFIGS
