#!/usr/bin/env bash
# A/B timing of two revisions on the device machine, packed here.
#
#   bash tools/gpu-ab.sh BASE [HEAD]     # HEAD defaults to the working tree
#
# Builds `cifar10_breakdown`, `conv_passes` and `airbench` of BASE and HEAD (git worktrees
# building into target/ab, which keeps their dependencies between runs: a
# shared target dir would let one tree's build overwrite the other's examples
# under names cargo still thinks fresh), strips them into the git-ignored .gpu-pack/{base,head}/, and writes
# .gpu-pack/run.sh for the device (carry .gl and .gpu-pack):
#
#   bash .gpu-pack/run.sh [ROUNDS] [MODELS...]   # defaults: 2 resnet18 airbench94 v1
#
# There, base measures the conv plans once (AETHER_TUNE_CONVS=1) into one
# cache dir that both builds then read, so the kernels differ and the plans do
# not; with AB_PLANS=own each build measures its own (for a change to what
# the plans can choose), AB_RULES=1 adds a step of each build with the
# rules, and AB_HEAD_ENV='VAR=VALUE ...' a step of head with those tuning
# variables set (which turn measuring off: the rules with them) and
# airbench94's convs so, and AB_RESNET50=1 ImageNet ResNet-50's convs at batch
# 64 (`conv_passes --convs resnet50`) on head with its plans, with the rules
# and with AB_HEAD_ENV, beside cuDNN's; per model the builds alternate ROUNDS times (pipelined ms/step with the
# batch resident), then `conv_passes --parts` on ResNet-18's convs for each,
# `airbench` (its recipe on synthetic data) for each, airbench94's convs for head,
# then PyTorch's `benches/pytorch_models.py` where torch imports. Results go
# into one $OUT/results.tgz, rewritten after each model, so a run cut short
# still brings back what it measured (and stays under the file-count limit).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bash tools/gpu-ab.sh BASE [HEAD]}
head=${2:-}
examples=(--example cifar10_breakdown --example conv_passes --example airbench)
pack() { # dir target tree: copy the examples just built in target
    mkdir -p ".gpu-pack/$1"
    cp "$2"/release/examples/{cifar10_breakdown,conv_passes,airbench} ".gpu-pack/$1/"
    strip ".gpu-pack/$1"/{cifar10_breakdown,conv_passes,airbench}
    git -C "$3" rev-parse --short HEAD >".gpu-pack/$1/REV"
}
rm -rf .gpu-pack && mkdir -p .gpu-pack
build_rev() { # dir rev
    local tree
    tree=$(mktemp -d /tmp/aether-ab.XXXXXX)
    git worktree add --detach -q "$tree" "$2"
    (cd "$tree" && CARGO_TARGET_DIR="$OLDPWD/target/ab" cargo build --release "${examples[@]}")
    pack "$1" target/ab "$tree"
    git worktree remove --force "$tree"
}
build_rev base "$base"
if [ -n "$head" ]; then
    build_rev head "$head"
else
    cargo build --release "${examples[@]}"
    pack head target .
    git diff --quiet HEAD || echo "dirty" >>.gpu-pack/head/REV
fi
cat >.gpu-pack/run.sh <<'EOF'
#!/usr/bin/env bash
# Written by tools/gpu-ab.sh: base against head, alternating, the same plans.
set -u
rounds=${1:-2}
shift || true
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet18 airbench94 v1)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export XDG_RUNTIME_DIR=/tmp/xdg VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
plans=${AB_PLANS:-shared}
R=/tmp/ab-results
mkdir -p "$R"
cp .gpu-pack/base/REV "$R/base-rev.txt"
cp .gpu-pack/head/REV "$R/head-rev.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv >"$R/gpu.txt" 2>&1
save() { tar czf "$OUT/results.tgz" -C "$R" .; }
batch() { case $1 in airbench94) echo 1024 ;; *) echo 256 ;; esac; }
cache() { # build: the plans' cache dir
    if [ "$plans" = own ]; then echo "/tmp/ab-plans-$1"; else echo /tmp/ab-plans; fi
}
export AETHER_TUNE_CONVS=1
step() { # build model tag [rules]
    local tune=1 dir
    dir=$(cache "$1")
    if [ "${4:-}" = rules ]; then tune=0 dir="/tmp/ab-rules-$1"; fi
    # shellcheck disable=SC2086 # STEP_ENV: VAR=VALUE words
    env ${STEP_ENV:-} AETHER_TUNE_CONVS=$tune AETHER_CACHE_DIR=$dir timeout 150 ".gpu-pack/$1/cifar10_breakdown" \
        --model "$2" --batch-size "$(batch "$2")" --repeats 20 --device gpu >"$R/step-$2-$3.txt" 2>&1
    echo "$2 $3: $(grep -h 'train_tensors' "$R/step-$2-$3.txt" | head -1)"
}
for m in "${models[@]}"; do
    step base "$m" measure
    if [ "$plans" = own ]; then step head "$m" measure-head; fi
    if [ "${AB_RULES:-0}" = 1 ]; then step base "$m" rules-base rules; step head "$m" rules-head rules; fi
    if [ -n "${AB_HEAD_ENV:-}" ]; then STEP_ENV=$AB_HEAD_ENV step head "$m" head-env rules; fi
    for r in $(seq "$rounds"); do step base "$m" "base$r"; step head "$m" "head$r"; done
    save
done
for b in base head; do
    AETHER_CACHE_DIR=$(cache $b) timeout 150 ".gpu-pack/$b/conv_passes" --convs resnet18 \
        --batch-size 256 --repeats 20 --parts >"$R/passes-$b.txt" 2>&1
    echo "passes $b: $(grep -h 'all convs' "$R/passes-$b.txt" | head -1)"
done
# airbench's recipe (examples/airbench, synthetic data), each build once.
for b in base head; do
    AETHER_CACHE_DIR=$(cache $b) timeout 120 ".gpu-pack/$b/airbench" --device gpu \
        >"$R/airbench-$b.txt" 2>&1
    echo "airbench $b: $(tail -1 "$R/airbench-$b.txt")"
done
save
# airbench94's convs (24-channel and 15-wide ones the rules fit least); base
# too where each build has plans of its own.
for b in base head; do
    [ "$b" = base ] && [ "$plans" != own ] && continue
    AETHER_CACHE_DIR=$(cache $b) timeout 150 ".gpu-pack/$b/conv_passes" --convs airbench94 \
        --batch-size 1024 --repeats 20 --parts >"$R/passes-airbench94-$b.txt" 2>&1
done
if [ -n "${AB_HEAD_ENV:-}" ]; then
    env $AB_HEAD_ENV timeout 150 .gpu-pack/head/conv_passes --convs airbench94 --batch-size 1024 \
        --repeats 20 --parts >"$R/passes-airbench94-head-env.txt" 2>&1
fi
if [ "${AB_RESNET50:-0}" = 1 ]; then
    r50() { # tag [VAR=VALUE...]: head's ResNet-50 convs
        local tag=$1
        shift
        env "$@" timeout 240 .gpu-pack/head/conv_passes --convs resnet50 --batch-size 64 \
            --repeats 10 --parts >"$R/passes-resnet50-$tag.txt" 2>&1
        echo "resnet50 $tag: $(grep -h 'all convs' "$R/passes-resnet50-$tag.txt" | head -1)"
    }
    r50 plans AETHER_CACHE_DIR="$(cache head)"
    r50 rules AETHER_TUNE_CONVS=0 AETHER_CACHE_DIR=/tmp/ab-rules-head
    # shellcheck disable=SC2086 # AB_HEAD_ENV: VAR=VALUE words
    [ -n "${AB_HEAD_ENV:-}" ] && r50 env AETHER_CACHE_DIR=/tmp/ab-rules-head $AB_HEAD_ENV
    if python3 -c "import torch" 2>/dev/null; then
        timeout 240 python3 benches/pytorch_reference.py --convs resnet50 --batch-size 64 \
            --repeats 10 >"$R/cudnn-resnet50.txt" 2>&1
    fi
    save
fi
for d in /tmp/ab-plans*; do
    for f in "$d"/*.json; do [ -f "$f" ] && cp "$f" "$R/$(basename "$d")-$(basename "$f")"; done
done
save
if python3 -c "import torch" 2>/dev/null; then
    for m in "${models[@]}"; do
        timeout 240 python3 benches/pytorch_models.py --model "$m" --batch-size "$(batch "$m")" \
            --repeats 30 >"$R/pytorch-$m.txt" 2>&1
        grep -h "pipelined" "$R/pytorch-$m.txt" | grep -i "resident\|compile"
        save
    done
fi
EOF
chmod +x .gpu-pack/run.sh
size=$(du -cb .gpu-pack .gl 2>/dev/null | tail -1 | cut -f1)
echo "gpu-ab: base $(cat .gpu-pack/base/REV), head $(tr '\n' ' ' <.gpu-pack/head/REV); $size bytes to carry"
if [ "$size" -gt $((64 * 1024 * 1024)) ]; then
    echo "gpu-ab: over the device's 64 MiB carry" >&2
    exit 1
fi
