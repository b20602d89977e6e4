#!/usr/bin/env bash
# Builds the release binaries the device machine runs (it has no Rust
# toolchain) and packs them into the git-ignored .gpu-pack/bins.tgz: the
# examples, the criterion conv bench and the test binaries, every one, or
# those named (`bash tools/gpu-pack.sh conv model`: tests/conv.rs and
# tests/model.rs). All of them (66 MiB) no longer fit the device's 64 MiB
# carry, so name them: the script fails where the pack would not fit.
# On the device (carrying .gl and .gpu-pack), `source tools/gpu-env.sh` unpacks it.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-bin .gpu-pack && mkdir -p .gpu-bin/tests .gpu-pack
cargo build --release --examples --benches
cp target/release/examples/{cifar10,cifar10_breakdown,conv_passes} .gpu-bin/
bench=$(cargo bench --no-run --bench conv 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
cp "$bench" .gpu-bin/conv_bench
tests=(--tests)
for name in "$@"; do tests+=(--test "$name"); done
[ $# -eq 0 ] || tests=("${tests[@]:1}")
cargo test --release --no-run "${tests[@]}" 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' \
    | grep '/deps/' | xargs cp -t .gpu-bin/tests
strip .gpu-bin/tests/* .gpu-bin/{cifar10,cifar10_breakdown,conv_passes,conv_bench}
tar -C .gpu-bin -czf .gpu-pack/bins.tgz .
ls -la .gpu-pack .gpu-bin/tests
# The device takes at most 64 MiB of carried paths (.gl included).
size=$(du -cb .gpu-pack .gl 2>/dev/null | tail -1 | cut -f1)
if [ "$size" -gt $((64 * 1024 * 1024)) ]; then
    echo "gpu-pack: .gpu-pack and .gl hold $size bytes, over the device's 64 MiB carry: name fewer tests" >&2
    exit 1
fi
