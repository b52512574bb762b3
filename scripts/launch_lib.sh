#!/usr/bin/env bash
# Shared by the distributed launchers (sourced, not run). Parses the common options, starts
# train.py under msrun, a rank table or mpirun with the Python of the current environment, and
# turns a failed launch into a non-zero exit with the failing worker's log.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
# msrun and mpirun start "python" from PATH: put the current interpreter's folder first.
PATH="$(dirname "$PYTHON"):$PATH"
export PATH
MSRUN="${MSRUN:-msrun}"  # the msrun executable (override with the MSRUN variable)

LAUNCHER=msrun
DEVICE_NUM=""        # processes on this host
WORKER_NUM=""        # processes on all hosts (default: DEVICE_NUM)
NODE_RANK=0
MASTER_ADDR=127.0.0.1
MASTER_PORT=8118
CLUSTER_TIME_OUT=120
BIND_CORE=""         # msrun --bind_core: True, False or a JSON object (empty: msrun's default)
RANK_TABLE_FILE="${RANK_TABLE_FILE:-}"

usage_common() {
    cat >&2 <<USAGE
usage: bash $0 [options] DATA_PATH CONFIG_PATH OUTPUT_DIR [train.py args...]
options:
  --device_num N        processes (devices) on this host (default: $DEFAULT_DEVICE_NUM)
  --worker_num N        processes on all hosts, multi-host msrun (default: device_num)
  --node_rank R         this host's index, multi-host msrun (default: 0)
  --master_addr ADDR    scheduler host, multi-host msrun (default: 127.0.0.1)
  --master_port PORT    scheduler port (default: 8118)
  --cluster_time_out S  seconds msrun waits for all workers to join (default: 120)
  --bind_core V         msrun binds each worker to CPU cores: true (msrun picks them by
                        device affinity), false (default) or a JSON object such as
                        '{"device0": ["0-23"], "device1": ["24-47"]}'; msrun only
$LAUNCHER_HELP
environment: PYTHON (interpreter, default: python on PATH), MSRUN (msrun executable)
USAGE
    exit 2
}

parse_launch_args() {
    while [[ $# -gt 0 && "$1" == --* ]]; do
        [[ $# -ge 2 ]] || usage_common
        case "$1" in
            --device_num) DEVICE_NUM="$2" ;;
            --worker_num) WORKER_NUM="$2" ;;
            --node_rank) NODE_RANK="$2" ;;
            --master_addr) MASTER_ADDR="$2" ;;
            --master_port) MASTER_PORT="$2" ;;
            --cluster_time_out) CLUSTER_TIME_OUT="$2" ;;
            --bind_core) BIND_CORE="$2" ;;
            --rank_table_file) RANK_TABLE_FILE="$2"; LAUNCHER=rank_table ;;
            --launcher) LAUNCHER="$2" ;;
            *) echo "error: unknown option $1" >&2; usage_common ;;
        esac
        shift 2
    done
    [[ $# -ge 3 ]] || usage_common
    DATA_PATH="$1"; CONFIG_PATH="$2"; OUTPUT_DIR="$3"; shift 3
    EXTRA_ARGS=("$@")
    DEVICE_NUM="${DEVICE_NUM:-$DEFAULT_DEVICE_NUM}"
    WORKER_NUM="${WORKER_NUM:-$DEVICE_NUM}"
    for n in DEVICE_NUM WORKER_NUM NODE_RANK MASTER_PORT CLUSTER_TIME_OUT; do
        [[ "${!n}" =~ ^[0-9]+$ ]] || { echo "error: ${n,,} must be an integer, got ${!n}" >&2; exit 2; }
    done
    case "${BIND_CORE,,}" in
        "") ;;
        true) BIND_CORE=True ;;
        false) BIND_CORE=False ;;
        "{"*) ;;  # a JSON object: msrun checks it
        *) echo "error: bind_core must be true, false or a JSON object, got $BIND_CORE" >&2; exit 2 ;;
    esac
    [[ -d "$DATA_PATH" ]] || { echo "error: DATA_PATH $DATA_PATH is not a folder" >&2; exit 2; }
    [[ -f "$CONFIG_PATH" ]] || { echo "error: CONFIG_PATH $CONFIG_PATH is not a file" >&2; exit 2; }
    mkdir -p "$OUTPUT_DIR/logs"
    DATA_PATH="$(cd "$DATA_PATH" && pwd)"
    CONFIG_PATH="$(cd "$(dirname "$CONFIG_PATH")" && pwd)/$(basename "$CONFIG_PATH")"
    OUTPUT_DIR="$(cd "$OUTPUT_DIR" && pwd)"
}

build_train_args() {
    # train.py arguments shared by every launcher; extra user arguments come last and win.
    TRAIN_ARGS=(--device_target "$DEVICE_TARGET" --run_distribute true --device_num "$WORKER_NUM"
        --data_path "$DATA_PATH" --config_path "$CONFIG_PATH" --output_dir "$OUTPUT_DIR"
        "${EXTRA_ARGS[@]}")
}

fail_with_logs() {
    # $1: launcher exit status, then the log files to show.
    local status="$1"; shift
    echo "error: distributed training failed (exit status $status); logs in $OUTPUT_DIR/logs" >&2
    local log
    for log in "$@"; do
        if grep -qE "Error|error:|Traceback|exited" "$log" 2>/dev/null; then
            echo "---- last lines of $log ----" >&2
            grep -vE "^\[(INFO|WARNING)\]" "$log" | tail -n 15 >&2
        fi
    done
    exit "$status"
}

stopped_by_signal() {
    # A run stopped by SIGINT/SIGTERM (to any worker: the ranks stop after the same step and
    # each exits 128 + signal, so msrun fails): say so with the workers' "stopped by" line and
    # exit 128 + signal. Returns (nothing printed) when no worker log has that line.
    local line sig
    line="$(grep -h "stopped by SIG[A-Z]* at global step" "$@" 2>/dev/null | head -n 1)" || true
    [[ -n "$line" ]] || return 0
    sig="$(sed -E 's/.*stopped by SIG([A-Z]+) .*/\1/' <<< "$line")"
    echo "training stopped by SIG$sig ${line#*stopped by SIG$sig }" >&2
    grep -h "received SIG" "$@" 2>/dev/null | head -n 3 >&2 || true
    echo "logs in $OUTPUT_DIR/logs" >&2
    exit $((128 + $(kill -l "$sig")))
}

run_msrun() {
    local status=0 bind=()
    [[ -z "$BIND_CORE" ]] || bind=(--bind_core "$BIND_CORE")
    "$MSRUN" --worker_num "$WORKER_NUM" --local_worker_num "$DEVICE_NUM" \
        --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --node_rank "$NODE_RANK" \
        --log_dir "$OUTPUT_DIR/logs" --join True --cluster_time_out "$CLUSTER_TIME_OUT" \
        "${bind[@]}" "$REPO_ROOT/train.py" "${TRAIN_ARGS[@]}" \
        > "$OUTPUT_DIR/logs/msrun_node$NODE_RANK.log" 2>&1 || status=$?
    [[ $status -eq 0 ]] || stopped_by_signal "$OUTPUT_DIR"/logs/worker_*.log
    [[ $status -eq 0 ]] || fail_with_logs "$status" "$OUTPUT_DIR"/logs/worker_*.log \
        "$OUTPUT_DIR/logs/msrun_node$NODE_RANK.log"
    echo "training done; rank 0 outputs in $OUTPUT_DIR, logs in $OUTPUT_DIR/logs"
}

run_rank_table() {
    # Ascend with a rank table: one process per device, DEVICE_ID/RANK_ID/RANK_SIZE per process.
    [[ -f "$RANK_TABLE_FILE" ]] || { echo "error: rank table $RANK_TABLE_FILE not found" >&2; exit 2; }
    export RANK_TABLE_FILE RANK_SIZE="$WORKER_NUM"
    local pids=() logs=() i status=0
    for ((i = 0; i < DEVICE_NUM; i++)); do
        logs+=("$OUTPUT_DIR/logs/rank_$i.log")
        DEVICE_ID=$i RANK_ID=$((NODE_RANK * DEVICE_NUM + i)) \
            "$PYTHON" "$REPO_ROOT/train.py" "${TRAIN_ARGS[@]}" > "${logs[$i]}" 2>&1 &
        pids+=($!)
    done
    # The first process to fail stops the others: no rank waits forever on a dead peer.
    for ((i = 0; i < ${#pids[@]}; i++)); do
        wait -n "${pids[@]}" || { status=$?; break; }
    done
    if [[ $status -ne 0 ]]; then
        kill "${pids[@]}" 2>/dev/null || true   # SIGTERM: save and stop at the next step
        sleep "${KILL_GRACE_S:-30}"
        kill -9 "${pids[@]}" 2>/dev/null || true  # ranks blocked in a collective
        wait "${pids[@]}" 2>/dev/null || true
        stopped_by_signal "${logs[@]}"
        fail_with_logs "$status" "${logs[@]}"
    fi
    echo "training done; rank 0 outputs in $OUTPUT_DIR, logs in $OUTPUT_DIR/logs"
}

run_mpirun() {
    command -v mpirun > /dev/null || { echo "error: --launcher mpirun but mpirun is not installed" >&2; exit 2; }
    local status=0
    mpirun -n "$DEVICE_NUM" --output-filename "$OUTPUT_DIR/logs/mpirun" --merge-stderr-to-stdout \
        "$PYTHON" "$REPO_ROOT/train.py" "${TRAIN_ARGS[@]}" || status=$?
    [[ $status -eq 0 ]] || stopped_by_signal "$OUTPUT_DIR"/logs/mpirun/*/rank.*/stdout
    [[ $status -eq 0 ]] || fail_with_logs "$status" "$OUTPUT_DIR"/logs/mpirun/*/rank.*/stdout
    echo "training done; rank 0 outputs in $OUTPUT_DIR, logs in $OUTPUT_DIR/logs"
}

launch() {
    # $ALLOWED_LAUNCHERS: the launchers the calling script supports (space-separated)
    [[ " ${ALLOWED_LAUNCHERS:-msrun} " == *" $LAUNCHER "* ]] || {
        echo "error: launcher $LAUNCHER is not available for $DEVICE_TARGET (use: ${ALLOWED_LAUNCHERS:-msrun})" >&2
        exit 2
    }
    if [[ -n "$BIND_CORE" && "$LAUNCHER" != msrun ]]; then
        echo "error: --bind_core is an msrun option; the $LAUNCHER launcher does not bind cores" >&2
        exit 2
    fi
    build_train_args
    case "$LAUNCHER" in
        msrun) run_msrun ;;
        rank_table) run_rank_table ;;
        mpirun) run_mpirun ;;
        *) echo "error: unknown launcher $LAUNCHER" >&2; exit 2 ;;
    esac
}
