#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# the GEMM core's blocks (AETHER_COOP_BLOCK=DIRECTION=SG_MxSG_NxTMxTNxKT) for the
# v1 model's last conv's backward (8x8x64 -> 128, batch 256), whose dinput and
# dweight run the core, and dweight's split over every v1 conv, swept again
# once naga's index clamping was left out (perf-notes entry 83): the 4096^3
# GEMM's best forward block changed then. Entries 70, 76 and 81 swept them
# with the clamping. About 5 minutes.
pin() { echo "AETHER_COOP_BLOCK=$1"; }
bash tools/gpu-sweep.sh 'coop16/conv5_b256/(dweight|dinput)' <<CONFIGS
rule
i4x4x2x2x2 $(pin dinput=4x4x2x2x2)
i4x4x4x1x2 $(pin dinput=4x4x4x1x2)
i8x2x2x2x2 $(pin dinput=8x2x2x2x2)
i8x2x2x1x2 $(pin dinput=8x2x2x1x2)
i4x2x4x2x2 $(pin dinput=4x2x4x2x2)
i4x4x2x1x2 $(pin dinput=4x4x2x1x2)
i8x2x1x2x2 $(pin dinput=8x2x1x2x2)
w4x2x2x2x2 $(pin dweight=4x2x2x2x2)
w4x4x2x2x2 $(pin dweight=4x4x2x2x2)
w2x2x2x2x2 $(pin dweight=2x2x2x2x2)
w2x4x4x2x2 $(pin dweight=2x4x4x2x2)
w4x2x4x2x2 $(pin dweight=4x2x4x2x2)
w2x4x2x2x4 $(pin dweight=2x4x2x2x4)
w2x4x1x2x2 $(pin dweight=2x4x1x2x2)
rule_again
CONFIGS
# dweight's splits on every v1 conv (run Y7 ran them without split 8).
bash tools/gpu-sweep-dweight.sh
