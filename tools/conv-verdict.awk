# awk -f tools/conv-verdict.awk BREAKDOWN_OUTPUT PYTORCH_OUTPUT (run by tools/gpu-check.sh).
# Goal 2 of issue 7: each conv's forward and backward in the step (cifar10_breakdown)
# against cuDNN's for the same shape (benches/pytorch_reference.py), matched by shape.
$2 == "Conv2d" && FILENAME == ARGV[1] { ours[$3] = $4 " " $5 }
$2 == "Conv2d" && FILENAME == ARGV[2] && $1 != "large" { order[++n] = $3; theirs[$3] = $4 " " $5 }
END {
    for (i = 1; i <= n; i++) {
        shape = order[i]
        if (!(shape in ours)) { print shape ": not in the breakdown"; continue }
        split(ours[shape], a); split(theirs[shape], c)
        line = shape
        for (d = 1; d <= 2; d++) {
            ok = a[d] + 0 <= c[d] + 0
            passes += ok; total++
            line = line sprintf("  %s %s vs %s%s", d == 1 ? "fwd" : "bwd", a[d], c[d], ok ? "" : " (above)")
        }
        print line
    }
    printf "%d of %d conv passes at or below cuDNN's\n", passes, total
}
