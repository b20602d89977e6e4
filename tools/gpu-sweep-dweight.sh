#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# dweight's split of the reduction over positions (AETHER_DWEIGHT_SPLIT:
# workgroups per compute unit) on the v1 model's five convs, its reduce
# included in each time. The rule: 2 per unit for the halo kernel (convs 2-4)
# and for the GEMM core, 4 where the GEMM core's output is one block (conv 1).
# Each slice writes a whole partial dW that the reduce reads back. About 2
# minutes.
bash tools/gpu-sweep.sh 'coop16/conv[1-5]_b256/dweight' <<'CONFIGS'
rule
split1 AETHER_DWEIGHT_SPLIT=1
split2 AETHER_DWEIGHT_SPLIT=2
split3 AETHER_DWEIGHT_SPLIT=3
split4 AETHER_DWEIGHT_SPLIT=4
split6 AETHER_DWEIGHT_SPLIT=6
split8 AETHER_DWEIGHT_SPLIT=8
rule_again
CONFIGS
