#!/usr/bin/env bash
# One device run for issue 36's networks with the planner's rules and with
# measured plans (AETHER_TUNE_CONVS=1: the first process measures, the second
# plans from the file), ResNet-18's convs beside cuDNN's, and PyTorch's steps
# in the same run (run E9 in docs/lab/runs.md). Carry .gl and .gpu-pack
# holding release builds of examples/cifar10_breakdown and examples/conv_passes:
#   cargo build --release --example cifar10_breakdown --example conv_passes
#   mkdir -p .gpu-pack && cp target/release/examples/{cifar10_breakdown,conv_passes} .gpu-pack/
# then on the device: bash tools/gpu-measured-plans.sh (results under $OUT).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p $XDG_RUNTIME_DIR; chmod 700 $XDG_RUNTIME_DIR
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
P=.gpu-pack
B=$P/cifar10_breakdown
net() { # model batch repeats
  echo "== $1 rules"; AETHER_CACHE_DIR=/tmp/rules timeout 90 $B --model $1 --batch-size $2 --repeats $3 --device gpu
  echo "== $1 measured (first)"; AETHER_TUNE_CONVS=1 AETHER_CACHE_DIR=/tmp/tuned timeout 120 $B --model $1 --batch-size $2 --repeats $3 --device gpu
  echo "== $1 measured (from the file)"; AETHER_TUNE_CONVS=1 AETHER_CACHE_DIR=/tmp/tuned timeout 90 $B --model $1 --batch-size $2 --repeats $3 --device gpu
}
{ net resnet18 256 20; net airbench94 1024 20; net v1 256 30; } > "$OUT/aether.txt" 2>&1
{
  echo "== rules"; AETHER_CACHE_DIR=/tmp/rules timeout 120 $P/conv_passes --convs resnet18 --batch-size 256 --repeats 20
  echo "== measured"; AETHER_TUNE_CONVS=1 AETHER_CACHE_DIR=/tmp/tuned timeout 120 $P/conv_passes --convs resnet18 --batch-size 256 --repeats 20
} > "$OUT/aether-convs.txt" 2>&1
cp /tmp/tuned/conv-plans-*.json "$OUT/" 2>/dev/null
timeout 120 python3 benches/pytorch_reference.py --convs resnet18 --batch-size 256 --repeats 20 > "$OUT/pytorch-convs.txt" 2>&1
{
  timeout 90 python3 benches/pytorch_models.py --model resnet18 --batch-size 256
  timeout 90 python3 benches/pytorch_models.py --model airbench94 --batch-size 1024
  timeout 60 python3 benches/pytorch_models.py --model v1 --batch-size 256
} > "$OUT/pytorch.txt" 2>&1
grep -h "^==\|train_tensors\|first step\|all convs" "$OUT/aether.txt"
grep -h "resident" "$OUT/pytorch.txt"
grep -v "^parts" "$OUT/aether-convs.txt"
tail -20 "$OUT/pytorch-convs.txt"
