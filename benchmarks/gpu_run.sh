#!/usr/bin/env bash
# One GPU session for the CIFAR-10 speedrun, sized for 15 minutes of a single GPU (an H200):
#   1. install bnn with the `gpu` extra into $VENV (default .venv-gpu); a $VENV whose TensorFlow
#      already sees the GPU only gets bnn itself (no downloads);
#   2. `bnn bench` of the binary and float twins of vgg_small and reactnet_resnet (the builders'
#      default widths, bfloat16, XLA on, batch 256);
#   3. the speedrun recipe: the float teacher, then the distilled binary student, each timed; the
#      student gets as many epochs (up to the recipe's) as the teacher's pace fits in its limit;
#   4. everything measured, into $OUT (default ./gpu-results): machine.txt, bench.json/.md,
#      teacher/ and student/ run directories with their reports, times.tsv, summary.md.
# Each stage has its own time limit, so a slow stage leaves the others their time and the
# figures of the finished stages are written whatever happens later; a run cut short by its
# limit keeps its checkpoints, and a teacher cut short teaches from its last one.
#
#   BNN_DATA_DIR=/path/with/cifar-10-python.tar.gz benchmarks/gpu_run.sh
#
# Settings (environment): OUT, VENV, BNN_DATA_DIR (default: shared/datasets, then ../shared/datasets),
# TEACHER_EPOCHS (default 30), STUDENT_EPOCHS (default: what fits), INSTALL_LIMIT_S (150),
# BENCH_LIMIT_S (60), TEACHER_LIMIT_S (120), STUDENT_LIMIT_S (480), BENCH_ARGS (more `bnn bench`
# flags), and for a rehearsal on a CPU: DEVICE=cpu (default gpu) and EXTRA="KEY=VALUE ..." (more
# --set assignments for both runs), e.g.
#   VENV=.venv DEVICE=cpu EXTRA="dataset.limit_train=256 dataset.limit_test=128" \
#     TEACHER_EPOCHS=1 BENCH_ARGS=--quick benchmarks/gpu_run.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
RECIPE=experiments/cifar10_speedrun.yaml
VENV=${VENV:-.venv-gpu}
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
DEVICE=${DEVICE:-gpu}
if [ "$DEVICE" != gpu ]; then
    "$VENV/bin/python" -c "import bnn" > /dev/null 2>&1 || { echo "gpu_run.sh: bnn is not installed in $VENV" >&2; exit 1; }
elif gpu_ready; then
    "$VENV/bin/python" -c "import bnn" > /dev/null 2>&1 || stage install "${INSTALL_LIMIT_S:-150}" \
        "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e .
else
    stage install "${INSTALL_LIMIT_S:-150}" bash -c \
        "python3 -m venv $VENV && $VENV/bin/pip install -q -e '.[gpu]'"
    gpu_ready || { echo "gpu_run.sh: TensorFlow in $VENV sees no GPU; see $OUT/log.txt" >&2; exit 1; }
fi
"$VENV/bin/pip" freeze 2>/dev/null | grep -i -E '^(tensorflow|keras|nvidia-cudnn|numpy)' >> "$OUT/machine.txt"
BNN="$VENV/bin/bnn"

# binary vs float train step of reactnet_resnet, XLA on, at the speedrun's batch size
# shellcheck disable=SC2086  # BENCH_ARGS: words on purpose
stage bench "${BENCH_LIMIT_S:-60}" "$BNN" bench --models vgg_small,reactnet_resnet --xla on \
    --mixed-precision bfloat16 --batch-size 256 --blocks 5 --steps 10 ${BENCH_ARGS:-} \
    --json "$OUT/bench.json" --markdown "$OUT/bench.md"

extra=(--set "training.device=$DEVICE")
for assignment in ${EXTRA:-}; do extra+=(--set "$assignment"); done

# the teacher: the float twin, fewer epochs than the student
stage teacher "${TEACHER_LIMIT_S:-120}" "$BNN" train "$RECIPE" --precision float "${extra[@]}" \
    --set "training.epochs=${TEACHER_EPOCHS:-30}" --output-dir "$OUT/teacher" --overwrite --quiet

# its model (or, cut short, its last checkpoint), and the epochs the student has time for
read -r TEACHER STUDENT_FIT < <("$VENV/bin/python" - "$OUT/teacher/float" "$RECIPE" \
    "${STUDENT_LIMIT_S:-480}" <<'PY'
import json, math, pathlib, sys, yaml
twin, recipe, limit = pathlib.Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
checkpoints = sorted(twin.glob("checkpoints/epoch-*.keras"))
model = twin / "model.keras" if (twin / "model.keras").is_file() else (
    checkpoints[-1] if checkpoints else twin / "checkpoints" / "interrupted.keras")
states = sorted(twin.glob("checkpoints/state-*.json"))
epochs = yaml.safe_load(open(recipe))["training"]["epochs"]
if states:  # the teacher's pace, compilation included; the student's step costs a bit more
    state = json.loads(states[-1].read_text())
    per_epoch = state["wall_seconds"] / max(state["epoch"], 1)
    epochs = max(1, min(epochs, math.floor(0.8 * limit / (1.3 * per_epoch))))
print(model, epochs)
PY
)
echo "teacher: $TEACHER; student epochs that fit: $STUDENT_FIT" | tee -a "$OUT/log.txt"

# the student, distilled from that teacher
stage student "${STUDENT_LIMIT_S:-480}" "$BNN" train "$RECIPE" --precision binary "${extra[@]}" \
    --set "training.distill.teacher=$TEACHER" --set "training.epochs=${STUDENT_EPOCHS:-$STUDENT_FIT}" \
    --output-dir "$OUT/student" --overwrite --quiet

for run in teacher student; do
    if [ -f "$OUT/$run/report.md" ]; then
        echo "## $run"; cat "$OUT/$run/report.md"
    else  # cut short: the last evaluated epoch of its checkpoint state
        for state in "$OUT/$run"/*/checkpoints/*.json; do
            [ -f "$state" ] && echo "## $run (cut short): $state" && "$VENV/bin/python" -c \
                "import json,sys; s=json.load(open(sys.argv[1])); print(s['epoch'], 'epochs,', round(s['wall_seconds']), 's;', [h.get('test_accuracy') for h in s['history']])" "$state"
        done
    fi
done > "$OUT/summary.md"
cat "$TIMES" "$OUT/summary.md"
