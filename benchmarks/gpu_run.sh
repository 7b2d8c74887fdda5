#!/usr/bin/env bash
# One GPU session for the CIFAR-10 speedrun, sized for 15 minutes of a single GPU (an H200):
#   1. install bnn with the `gpu` extra into .venv-gpu (skipped when it already imports on a GPU);
#   2. `bnn bench` of reactnet_resnet's binary and float twins (the builder's default width,
#      bfloat16, XLA on, batch 256);
#   3. the speedrun recipe: the float teacher, then the distilled binary student, each timed;
#   4. everything measured, into $OUT (default ./gpu-results): machine.txt, bench.json/.md,
#      teacher/ and student/ run reports, times.tsv.
# Each stage has its own time limit, so a slow stage leaves the others their time and the
# figures of the finished stages are written whatever happens later.
#
#   BNN_DATA_DIR=/path/with/cifar-10-python.tar.gz benchmarks/gpu_run.sh
#
# Settings (environment): OUT, BNN_DATA_DIR (default: shared/datasets, then ../shared/datasets),
# TEACHER_EPOCHS (default 15), STUDENT_EPOCHS (default: the recipe's), INSTALL_LIMIT_S (240),
# BENCH_LIMIT_S (90), TEACHER_LIMIT_S (150), STUDENT_LIMIT_S (600).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
RECIPE=experiments/cifar10_speedrun.yaml
VENV=.venv-gpu
TIMES="$OUT/times.tsv"
printf 'stage\tseconds\texit_code\n' > "$TIMES"

stage() {  # stage NAME LIMIT_S COMMAND...: run with a time limit, log, record the wall time
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/log.txt"
    timeout --signal=TERM --kill-after=20 "$limit" "$@" >> "$OUT/log.txt" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$rc" >> "$TIMES"
    echo "== $name: exit $rc after $((SECONDS - start))s" | tee -a "$OUT/log.txt"
    return $rc
}

if [ -z "${BNN_DATA_DIR:-}" ]; then
    for candidate in shared/datasets ../shared/datasets; do
        if [ -e "$candidate/cifar-10-python.tar.gz" ] || [ -d "$candidate/cifar-10-batches-py" ]; then
            BNN_DATA_DIR=$(cd "$candidate" && pwd)
            break
        fi
    done
fi
if [ -z "${BNN_DATA_DIR:-}" ]; then
    echo "gpu_run.sh: no CIFAR-10 found; set BNN_DATA_DIR to a folder with cifar-10-python.tar.gz" >&2
    exit 2
fi
export BNN_DATA_DIR TF_CPP_MIN_LOG_LEVEL=2

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
    echo "data: $BNN_DATA_DIR"
} > "$OUT/machine.txt"

gpu_ready() {
    "$VENV/bin/python" -c "import tensorflow as tf, sys; sys.exit(0 if tf.config.list_physical_devices('GPU') else 1)" \
        > /dev/null 2>&1
}
if ! gpu_ready; then
    stage install "${INSTALL_LIMIT_S:-240}" bash -c \
        "python3 -m venv $VENV && $VENV/bin/pip install -q -e '.[gpu]'"
    gpu_ready || { echo "gpu_run.sh: TensorFlow in $VENV sees no GPU; see $OUT/log.txt" >&2; exit 1; }
fi
"$VENV/bin/pip" freeze 2>/dev/null | grep -i -E '^(tensorflow|keras|nvidia-cudnn|numpy)' >> "$OUT/machine.txt"
BNN="$VENV/bin/bnn"

# binary vs float train step of reactnet_resnet, XLA on, at the speedrun's batch size
stage bench "${BENCH_LIMIT_S:-90}" "$BNN" bench --models reactnet_resnet --xla on --mixed-precision bfloat16 \
    --batch-size 256 --blocks 5 --steps 10 --json "$OUT/bench.json" --markdown "$OUT/bench.md"

# the teacher: the float twin, fewer epochs than the student
stage teacher "${TEACHER_LIMIT_S:-150}" "$BNN" train "$RECIPE" --precision float \
    --set training.device=gpu --set "training.epochs=${TEACHER_EPOCHS:-15}" \
    --output-dir "$OUT/teacher" --overwrite --quiet

# the student, distilled from that teacher
student_args=(--set training.device=gpu --set "training.distill.teacher=$OUT/teacher")
[ -n "${STUDENT_EPOCHS:-}" ] && student_args+=(--set "training.epochs=$STUDENT_EPOCHS")
stage student "${STUDENT_LIMIT_S:-600}" "$BNN" train "$RECIPE" --precision binary \
    "${student_args[@]}" --output-dir "$OUT/student" --overwrite --quiet

for run in teacher student; do
    [ -f "$OUT/$run/report.md" ] && { echo "## $run"; cat "$OUT/$run/report.md"; }
done > "$OUT/summary.md"
cat "$TIMES" "$OUT/summary.md"
