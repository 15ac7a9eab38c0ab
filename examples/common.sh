# Shared by the recipes under examples/ (sourced, not run): the settings
# checks, the fairseq-train launch on CPU or 1..N GPUs, and the progress
# lines of long steps. A recipe script sets its settings at its top, then
#
#   source "$(dirname "$0")/../common.sh"
#   check_python
#   check_choice ARCH transformer transformer_dnas transformer_hnas
#   check_run_settings              # SEED, DEVICE (-> cpu|gpu), NPROC (-> a count), NNODES
#   fairseq_train_launch            # -> LAUNCH (command), LAUNCH_ARGS (device/distributed flags)
#   run_fairseq_train "$SAVE_DIR" "$MAX_UPDATE" "${LAUNCH[@]}" "${ARGS[@]}" "${LAUNCH_ARGS[@]}" "$@"
#
# Every function says its contract at its top: what it reads (settings are
# the recipe's upper-case variables), what it sets, and how it fails (die:
# one line "[script] error: ..." on stderr, exit status 1).
#
# Which Python runs everything: $PYTHON if set, else the repository's .venv
# (what scripts/install.sh makes), else python3 from PATH. PYTHON may be a
# path or a command name on PATH (PYTHON=python3). fairseq's tools are
# started through that interpreter (fairseq_dnas/recipes/run_fairseq.py, and
# python -m torch.distributed.run for torchrun), so no console script from
# another environment can sneak in.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then
    PYTHON="$REPO/.venv/bin/python"
  else
    PYTHON="$(command -v python3 || true)"
  fi
fi
USER_DIR="${USER_DIR:-$REPO/fairseq_dnas}"
# The commands run as `python -m fairseq_dnas.commands.X` and
# `python -m fairseq_dnas.recipes.X`: this checkout's package, also where the
# interpreter has another copy installed.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# say TEXT...: one line "[script] TEXT" on stderr (script: the recipe's name).
say() { echo "[$(basename "$0" .sh)] $*" >&2; }
# die TEXT...: one line "[script] error: TEXT" on stderr, then exit 1.
die() { echo "[$(basename "$0" .sh)] error: $*" >&2; exit 1; }

# check_python: makes PYTHON the full path of an interpreter that has fairseq,
# fairseq_dnas, sentencepiece and rouge-score, or dies saying how to get one.
# The import check (examples/check_python.py: about 7 s the first time, then
# remembered per installation) runs once per run: FAIRSEQ_DNAS_CHECKED_PYTHON,
# exported, tells the scripts started from here that it was done.
check_python() {
  # PYTHON may be a path or a command on PATH (PYTHON=python3); resolve it once
  # so that every later use (and every job started from here) runs the same one.
  local found
  found="$(command -v "${PYTHON:-}" 2>/dev/null || true)"
  [ -n "$PYTHON" ] && [ -n "$found" ] && [ -x "$found" ] \
    || die "no Python found at PYTHON=${PYTHON:-} (a path or a command on PATH); run 'bash scripts/install.sh' or set PYTHON"
  PYTHON="$found"
  [ "${FAIRSEQ_DNAS_CHECKED_PYTHON:-}" = "$PYTHON" ] && return 0
  local why
  why="$("$PYTHON" "$REPO/examples/check_python.py" 2>/dev/null)" \
    || die "$PYTHON lacks fairseq, fairseq_dnas, sentencepiece or rouge-score (${why:-it cannot run examples/check_python.py}); run 'bash scripts/install.sh' (or set PYTHON to the environment that has them)"
  export FAIRSEQ_DNAS_CHECKED_PYTHON="$PYTHON"
}

# ------------------------------------------------------------ settings checks

# check_choice NAME CHOICE...: dies unless the variable NAME holds one of the
# CHOICEs. A choice may carry a note after its first space, shown in the
# message but not matched: check_choice ARCH "transformer (UNAS baseline)"
# transformer_dnas -> "ARCH=x: choose transformer (UNAS baseline) or transformer_dnas".
check_choice() {
  local name="$1" value="${!1:-}" choice list="" n
  shift
  for choice in "$@"; do [ "$value" = "${choice%% *}" ] && return 0; done
  n=$#
  for choice in "$@"; do
    if [ -z "$list" ]; then list="$choice"
    elif [ "$n" = 1 ]; then list="$list or $choice"
    else list="$list, $choice"; fi
    n=$((n - 1))
  done
  die "$name=$value: choose $list"
}

# check_number NAME [MIN]: dies unless the variable NAME is a whole number
# >= MIN (default 0), e.g. check_number SEED, check_number JOBS 1.
check_number() {
  local name="$1" value="${!1:-}" min="${2:-0}"
  [[ "$value" =~ ^[0-9]+$ ]] && [ "$value" -ge "$min" ] \
    || die "$name=$value: give a whole number >= $min"
}

# resolve_device DEVICE: prints cpu or gpu; auto is gpu when torch sees a GPU.
# Needs PYTHON (check_python first); dies on another value.
resolve_device() {
  case "$1" in
    cpu|gpu) echo "$1" ;;
    auto) "$PYTHON" -c 'import torch; print("gpu" if torch.cuda.is_available() else "cpu")' ;;
    *) die "DEVICE=$1: choose cpu, gpu or auto" ;;
  esac
}

# check_run_settings: the settings every training recipe shares. Reads SEED,
# DEVICE (cpu|gpu|auto), NPROC (processes on this node; 0: every GPU, 1 on
# CPU), NNODES (default 1). Sets DEVICE to cpu or gpu, NPROC to a count >= 1,
# NNODES and WORLD (= NPROC x NNODES). Dies with the setting to change.
check_run_settings() {
  check_number SEED
  DEVICE="$(resolve_device "${DEVICE:-auto}")"
  NPROC="${NPROC:-0}"
  if [ "$NPROC" = 0 ]; then
    if [ "$DEVICE" = gpu ]; then NPROC="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')"; else NPROC=1; fi
  fi
  [ "$NPROC" -ge 1 ] 2>/dev/null || die "NPROC=$NPROC: no GPU found or not a positive number (DEVICE=cpu trains on CPU)"
  NNODES="${NNODES:-1}"
  check_number NNODES 1
  WORLD=$((NPROC * NNODES))
}

# split_batch NAME TOTAL WORLD MAX_PER_PROC exact|floor: the effective batch
# TOTAL (the setting NAME, for the message) over WORLD processes, at most
# MAX_PER_PROC per process and step. Sets PER_PROC (per process and step) and
# UPDATE_FREQ (fairseq's --update-freq) with PER_PROC x WORLD x UPDATE_FREQ:
#   exact: = TOTAL (sentences); dies when TOTAL is not a multiple of WORLD;
#   floor: <= TOTAL, rounded down (tokens, where fairseq's batches vary anyway).
split_batch() {
  local name="$1" total="$2" world="$3" max="$4" mode="$5" per_world
  if [ "$mode" = exact ]; then
    [ $((total % world)) = 0 ] || die "$name=$total cannot be split evenly over $world processes; choose a multiple of $world"
  fi
  per_world=$((total / world))
  UPDATE_FREQ=$(( (per_world + max - 1) / max ))
  if [ "$mode" = exact ]; then
    while [ $((per_world % UPDATE_FREQ)) != 0 ]; do UPDATE_FREQ=$((UPDATE_FREQ + 1)); done
  fi
  PER_PROC=$((per_world / UPDATE_FREQ))
}

# ------------------------------------------------------------ fairseq-train launch

# default_cpu_threads: prints the CPU threads a new training job gets when
# CPU_THREADS is not set: the usable cores minus the load already on them, at
# least 1 (fairseq_dnas/recipes/cpu_threads.py says why: a thread without a
# free core slows all the others down).
default_cpu_threads() {
  "$PYTHON" -m fairseq_dnas.recipes.cpu_threads 2>/dev/null || echo 1
}

# fairseq_train_launch: how to start fairseq-train (fairseq_dnas/recipes/run_fairseq.py
# train: fairseq's own CLI, with bad files reported in one line) on this
# node. Reads DEVICE (cpu|gpu, from check_run_settings), NPROC, NNODES, WORLD,
# NODE_RANK, MASTER_ADDR, MASTER_PORT (multi-node), CPU_THREADS (CPU: the
# threads shared by the processes). Sets
#   LAUNCH       the command up to fairseq's arguments: python, or torchrun
#                (python -m torch.distributed.run) when WORLD > 1;
#   LAUNCH_ARGS  fairseq flags for the device and the process group: --fp16
#                on GPUs, --cpu and gloo with fairseq's legacy DDP on CPU;
# and exports OMP_NUM_THREADS on CPU (CPU_THREADS / NPROC, at least 1;
# CPU_THREADS unset: default_cpu_threads).
fairseq_train_launch() {
  local torchrun
  if [ "${NNODES:-1}" = 1 ]; then
    # One node: torchrun picks a free port itself (--standalone).
    torchrun=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC")
  else
    torchrun=("$PYTHON" -m torch.distributed.run --nproc_per_node "$NPROC" --nnodes "$NNODES"
              --node_rank "${NODE_RANK:-0}" --master_addr "${MASTER_ADDR:-127.0.0.1}"
              --master_port "${MASTER_PORT:-29500}")
  fi
  LAUNCH=("$PYTHON" -m fairseq_dnas.recipes.run_fairseq train)
  [ "$WORLD" -gt 1 ] && LAUNCH=("${torchrun[@]}" -m fairseq_dnas.recipes.run_fairseq train)
  if [ "$DEVICE" = gpu ]; then
    LAUNCH_ARGS=(--fp16)
    # fairseq reads torchrun's environment (MASTER_ADDR, RANK, WORLD_SIZE).
    [ "$WORLD" -gt 1 ] && LAUNCH_ARGS+=(--distributed-world-size "$WORLD")
  else
    LAUNCH_ARGS=(--cpu)
    local threads="${CPU_THREADS:-}"
    if [ -n "$threads" ]; then check_number CPU_THREADS 1; else threads="$(default_cpu_threads)"; fi
    export OMP_NUM_THREADS=$(( threads / NPROC > 0 ? threads / NPROC : 1 ))
    if [ "$WORLD" -gt 1 ]; then
      # fairseq only sets up torchrun's environment for GPUs; on CPU we give the
      # init method ourselves. --distributed-rank -1 lets torch read each
      # process's RANK from torchrun's environment; gloo is the CPU backend and
      # legacy_ddp fairseq's DDP that works on CPU modules (torch's DDP wrapper
      # is given a GPU device id by fairseq).
      LAUNCH_ARGS+=(--distributed-world-size "$WORLD" --distributed-init-method env:// --distributed-rank -1
                    --distributed-no-spawn --distributed-backend gloo --ddp-backend legacy_ddp)
    fi
  fi
  return 0
}

# schedule_args N: sets SCHEDULE_ARGS, fairseq-train flags that validate and
# save every N updates and only then (not also at each epoch's end: the same
# schedule whatever the corpus size; the final update always does both),
# keeping checkpoint_last.pt, checkpoint_best.pt and the latest interval
# checkpoint only.
schedule_args() {
  SCHEDULE_ARGS=(--validate-interval-updates "$1" --validate-interval 1000000
                 --save-interval-updates "$1" --save-interval 1000000
                 --keep-interval-updates 1 --no-epoch-checkpoints)
}

# quote_command CMD...: prints CMD as one shell-quoted line (what DRY_RUN=1
# shows and SAVE_DIR/train.cmd keeps: paste it into a shell to run it again).
quote_command() { printf '%q ' "$@"; echo; }

# ------------------------------------------------------------ seed loops

# run_jobs FUNCTION LOG_OF NAME:SEED...: runs "FUNCTION NAME SEED" for every
# NAME:SEED (e.g. transformer_hnas:3: an architecture or a task, and a seed),
# JOBS at a time, each shown as "NAME seed SEED":
#   JOBS=1 (default): one after the other, here, output on the console;
#   JOBS=N: N at once, each in the background with its output in the file
#     that "LOG_OF NAME SEED" prints; on GPUs (DEVICE gpu, or auto with a GPU) each
#     job gets one GPU, those of GPUS (default CUDA_VISIBLE_DEVICES, else all)
#     taken in turn, and NPROC=1; on CPU the cores are shared (CPU_THREADS
#     each, default the cores not already busy / JOBS). Each job runs in its own process group,
#     so Ctrl-C or a kill of the script stops every process of every running
#     job, and nothing else ("interrupted: ..." and exit 130).
# FUNCTION sees the recipe's variables and runs in a subshell when JOBS > 1.
# Sets JOBS_FAILED to the number of failed jobs (JOBS > 1; with JOBS=1 the
# first failure ends the script, as under set -e).
run_jobs() {
  local job_function="$1" log_of="$2"
  shift 2
  JOBS_FAILED=0
  local item
  if [ "${JOBS:-1}" = 1 ]; then
    for item in "$@"; do "$job_function" "${item%%:*}" "${item#*:}"; done
    return 0
  fi
  local gpu_list=() where log n=0 gpus="${GPUS:-}"
  if [ "$(resolve_device "${DEVICE:-auto}")" = gpu ]; then
    [ -n "$gpus" ] || gpus="${CUDA_VISIBLE_DEVICES:-$("$PYTHON" -c 'import torch; print(",".join(map(str, range(torch.cuda.device_count()))))')}"
    IFS=', ' read -r -a gpu_list <<< "$gpus"
    export NPROC=1
  else
    local free
    free="$(default_cpu_threads)"
    export CPU_THREADS="${CPU_THREADS:-$(( free / JOBS > 0 ? free / JOBS : 1 ))}"
  fi
  set -m
  JOB_PIDS=()
  JOB_NAMES=()
  trap _stop_jobs INT TERM
  for item in "$@"; do
    while [ "${#JOB_PIDS[@]}" -ge "$JOBS" ]; do _reap_job; done
    log="$("$log_of" "${item%%:*}" "${item#*:}")"
    if [ "${#gpu_list[@]}" -gt 0 ]; then
      local gpu="${gpu_list[$((n % ${#gpu_list[@]}))]}"
      where="GPU $gpu"
      ( export CUDA_VISIBLE_DEVICES="$gpu"; "$job_function" "${item%%:*}" "${item#*:}" ) >> "$log" 2>&1 &
    else
      where="CPU, $CPU_THREADS threads"
      ( "$job_function" "${item%%:*}" "${item#*:}" ) >> "$log" 2>&1 &
    fi
    JOB_PIDS+=("$!"); JOB_NAMES+=("${item//:/ seed }")
    say "${item//:/ seed }: started ($where; log: $log)"
    n=$((n + 1))
  done
  while [ "${#JOB_PIDS[@]}" -gt 0 ]; do _reap_job; done
  set +m
  trap - INT TERM
}

# (run_jobs) Stop every running job's process group, then exit 130.
_stop_jobs() {
  trap - INT TERM
  local pid
  for pid in ${JOB_PIDS[@]+"${JOB_PIDS[@]}"}; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  say "interrupted: running jobs stopped; re-run the same command to resume"
  exit 130
}

# (run_jobs) Wait until one job ends; count it in JOBS_FAILED if it failed.
_reap_job() {
  local i
  while :; do
    for i in "${!JOB_PIDS[@]}"; do
      if ! kill -0 "${JOB_PIDS[$i]}" 2>/dev/null; then
        if wait "${JOB_PIDS[$i]}"; then say "${JOB_NAMES[$i]}: finished"
        else JOBS_FAILED=$((JOBS_FAILED + 1)); say "${JOB_NAMES[$i]}: FAILED (see its log)"; fi
        unset "JOB_PIDS[$i]" "JOB_NAMES[$i]"
        return 0
      fi
    done
    sleep 1
  done
}

# ------------------------------------------------------------ progress lines

# start_progress KIND FILE TOTAL [fairseq_dnas/recipes/progress.py options]: shows on the
# console (stderr) how far the job writing FILE is, until stop_progress:
#   train: FILE is fairseq-train's log; TOTAL the updates in all
#          ("[train] update 300/1500 (20%) loss 5.21 elapsed 2m10s left 8m40s",
#          and one line per validation);
#   lines: FILE grows a line per item (--prefix H-: only those lines count);
#          TOTAL the lines in all ("[generate] 250/500 sentences (50%) ...").
# A refreshed line on a terminal, else a line every 5% (--step). FILE is read
# from its start (--from-byte N: from byte N, for a log appended to). Runs in
# the background (PROGRESS_PID) and stops by itself when this script is gone;
# an EXIT trap stops it too (a script with its own EXIT trap calls
# stop_progress there). PROGRESS=0 shows nothing. Never fails the caller.
start_progress() {
  local kind="$1" file="$2" total="$3"
  shift 3
  PROGRESS_PID=""
  [ "${PROGRESS:-1}" = 0 ] && return 0
  local shell="$BASHPID"  # this shell (read here: inside "... &" it is the child's own id)
  "$PYTHON" -m fairseq_dnas.recipes.progress "$kind" "$file" --total "$total" --watch "$shell" "$@" &
  PROGRESS_PID=$!
  trap stop_progress EXIT
  return 0
}

# stop_progress: the follower reads FILE a last time, prints its last line
# and exits (SIGTERM; killed after 5 s if it hangs). Its exit status is
# ignored: the job's status is what counts. Safe to call twice.
stop_progress() {
  local pid="${PROGRESS_PID:-}" i
  PROGRESS_PID=""
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return 0
}

# run_with_line_progress OUTPUT TOTAL LABEL CMD...: runs CMD, which writes
# OUTPUT a line per input line (the scripts of prepare.sh write OUTPUT.tmp,
# renamed at the end: give that; a stale one is removed first), with "[LABEL] n/TOTAL lines" on the console
# when TOTAL is at least PROGRESS_MIN_LINES (default 100000: small files are
# done before a line would help). Returns CMD's status.
run_with_line_progress() {
  local output="$1" total="$2" label="$3" status=0
  shift 3
  if [ "$total" -ge "${PROGRESS_MIN_LINES:-100000}" ]; then
    rm -f "$output"
    start_progress lines "$output" "$total" --label "$label"
  fi
  "$@" || status=$?
  stop_progress
  return "$status"
}

# last_error_line FILE FROM_BYTE: prints the last line of FILE after byte
# FROM_BYTE that starts with "error: " (fairseq_dnas/recipes/run_fairseq.py's one-line
# report of a bad checkpoint or data file), without that prefix; nothing if none.
last_error_line() {
  tail -c +"$(( $2 + 1 ))" "$1" 2>/dev/null | grep -a '^error: ' | tail -1 | sed 's/^error: //' || true
}

# run_fairseq_train SAVE_DIR TOTAL_UPDATES CMD...: runs CMD (the
# fairseq-train command: LAUNCH, the recipe's ARGS, LAUNCH_ARGS, the user's
# flags), its whole output appended to SAVE_DIR/train.log and the command kept
# in SAVE_DIR/train.cmd, with the progress on the console. Returns 0 when CMD succeeds. When it fails: a bad
# file reported by run_fairseq.py ends the script with that one line (exit
# 1); anything else shows the log's last 20 lines and exits with CMD's status.
run_fairseq_train() {
  local save_dir="$1" total="$2" status=0 from=0 bad
  shift 2
  export PYTHONUNBUFFERED=1  # progress lines reach the log as they happen
  mkdir -p "$save_dir"
  quote_command "$@" > "$save_dir/train.cmd"
  say "command: $save_dir/train.cmd; log: $save_dir/train.log"
  [ -f "$save_dir/train.log" ] && from="$(wc -c < "$save_dir/train.log")"
  start_progress train "$save_dir/train.log" "$total" --from-byte "$from"
  "$@" >> "$save_dir/train.log" 2>&1 || status=$?
  stop_progress
  [ "$status" = 0 ] && return 0
  bad="$(last_error_line "$save_dir/train.log" "$from")"
  [ -n "$bad" ] && die "$bad"
  tail -n 20 "$save_dir/train.log" >&2
  echo "[$(basename "$0" .sh)] error: fairseq-train failed with exit status $status (log: $save_dir/train.log)" >&2
  exit "$status"
}

# run_fairseq_generate OUT_PREFIX TOTAL CMD...: runs CMD (fairseq_dnas/recipes/run_fairseq.py
# generate ...) with its output in OUT_PREFIX.generate.log (written as .tmp,
# renamed when CMD succeeds: no half log passes for a whole one) and its
# stderr in OUT_PREFIX.generate.err; the console shows the sentences decoded
# of TOTAL. When CMD fails: run_fairseq.py's one-line report of a bad file,
# else the last 20 lines of the .err file, then exit 1.
run_fairseq_generate() {
  local prefix="$1" total="$2" status=0 bad
  shift 2
  rm -f "$prefix.generate.log.tmp"
  start_progress lines "$prefix.generate.log.tmp" "$total" --prefix H- --label "$(basename "$0" .sh)" \
    --unit sentences
  PYTHONUNBUFFERED=1 "$@" > "$prefix.generate.log.tmp" 2> "$prefix.generate.err" || status=$?
  stop_progress
  if [ "$status" != 0 ]; then
    rm -f "$prefix.generate.log.tmp"
    bad="$(last_error_line "$prefix.generate.err" 0)"
    [ -n "$bad" ] && die "$bad"
    tail -20 "$prefix.generate.err" >&2
    die "fairseq-generate failed (see $prefix.generate.err)"
  fi
  mv "$prefix.generate.log.tmp" "$prefix.generate.log"
}

# ------------------------------------------------------------ decoding

# check_checkpoint: dies unless CHECKPOINT names an existing file (decoding
# and scoring scripts; a damaged one is reported by run_fairseq.py).
check_checkpoint() {
  [ -n "${CHECKPOINT:-}" ] || die "set CHECKPOINT to a checkpoint from train.sh"
  [ -f "$CHECKPOINT" ] || die "no checkpoint at CHECKPOINT=$CHECKPOINT"
}

# device_args cpu|gpu: prints fairseq's device flag for decoding: --cpu, or
# --fp16 on a GPU.
device_args() { if [ "$1" = gpu ]; then echo --fp16; else echo --cpu; fi; }

# collect_hypotheses OUT_PREFIX SOURCES: OUT_PREFIX.generate.log's best
# hypotheses in the order of SOURCES (the encoded input, a line each), with
# SentencePiece removed, into OUT_PREFIX.hyp (fairseq_dnas/recipes/collect_hypotheses.py:
# refuses a log that misses or repeats a sentence).
collect_hypotheses() {
  "$PYTHON" -m fairseq_dnas.recipes.collect_hypotheses --generate-log "$1.generate.log" --sources "$2" \
    --out "$1.hyp"
}

# ------------------------------------------------------------ preparing data

# check_settings_file OUT SETTINGS [NAME]: OUT/settings.txt keeps the
# settings a prepared folder was made with; dies (saying both, and to set
# NAME, default OUT_DIR, to another folder) when they differ from SETTINGS,
# so that a changed setting never mixes old and new outputs; writes the file
# when OUT has none.
check_settings_file() {
  local out="$1" settings="$2" name="${3:-OUT_DIR}"
  if [ -f "$out/settings.txt" ]; then
    [ "$(cat "$out/settings.txt")" = "$settings" ] || die "$out was prepared with other settings:
  before: $(cat "$out/settings.txt")
  now:    $settings
Use another $name, or delete $out to start over."
  else
    echo "$settings" > "$out/settings.txt"
  fi
}

# encode_pieces MODEL INPUT OUTPUT [sentencepiece_tool.py encode options]:
# INPUT -> OUTPUT in SentencePiece pieces (fairseq_dnas/recipes/sentencepiece_tool.py:
# written as OUTPUT.tmp, renamed when whole), with "[script] n/N lines" on
# the console for a large file (run_with_line_progress).
encode_pieces() {
  local model="$1" input="$2" output="$3"
  shift 3
  run_with_line_progress "$output.tmp" "$(wc -l < "$input")" "$(basename "$0" .sh)" \
    "$PYTHON" -m fairseq_dnas.recipes.sentencepiece_tool encode --model "$model" --input "$input" \
    --output "$output" "$@"
}

# preprocess_size [fairseq-preprocess options]: prints "LINES BYTES", the
# lines of the text files these options name (--trainpref/--validpref/
# --testpref, with .SRC and .TGT unless --only-source) and the bytes
# fairseq-preprocess writes for them to its .bin files: one item per piece
# plus </s> per line, 2 bytes an item (uint16, dictionaries under 65,500
# types), 4 for a larger VOCAB_SIZE / VOCAB. Never fails (unknown: "0 0").
preprocess_size() {
  local args=("$@") prefs=() langs=() files=() only=0 i prefix lang lines words item=2
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
      --trainpref | --validpref | --testpref) prefs+=("${args[i + 1]:-}") ;;
      --source-lang) langs=("${args[i + 1]:-}" "${langs[@]}") ;;
      --target-lang) langs+=("${args[i + 1]:-}") ;;
      --only-source) only=1 ;;
    esac
  done
  [ "$only" = 1 ] && [ "${#langs[@]}" -gt 1 ] && langs=("${langs[0]}")
  for prefix in "${prefs[@]}"; do
    if [ "${#langs[@]}" -eq 0 ]; then files+=("$prefix"); fi
    for lang in "${langs[@]}"; do files+=("$prefix.$lang"); done
  done
  [ "${VOCAB_SIZE:-${VOCAB:-0}}" -ge 65500 ] 2>/dev/null && item=4
  read -r lines words < <( (cat "${files[@]}" 2>/dev/null || true) | wc -lw) || true
  echo "${lines:-0} $(( (${words:-0} + ${lines:-0}) * item ))"
}

# run_fairseq_preprocess LOG DESTDIR [fairseq-preprocess options]: runs
# fairseq-preprocess into DESTDIR, its output appended to LOG, with
# "[script] binarized 120.5/480.2 MB (25%) ... left ..." on the console
# while it writes (fairseq_dnas/recipes/progress.py bytes) when the text has at least
# PROGRESS_MIN_LINES lines (default 100000). fairseq logs nothing until a
# whole split is done; on a large corpus it first reads the training text
# for its dictionary (no bytes yet, no line), then binarizes. Returns
# fairseq-preprocess's status.
run_fairseq_preprocess() {
  local log="$1" destdir="$2" status=0 lines bytes
  shift 2
  read -r lines bytes < <(preprocess_size "$@")
  if [ "${lines:-0}" -ge "${PROGRESS_MIN_LINES:-100000}" ] && [ "${bytes:-0}" -gt 0 ]; then
    say "fairseq-preprocess: $lines lines (log: $log)"
    start_progress bytes "$destdir/*.bin" "$bytes" --label "$(basename "$0" .sh)" --unit binarized
  fi
  "$PYTHON" -m fairseq_cli.preprocess "$@" --destdir "$destdir" >> "$log" 2>&1 || status=$?
  stop_progress
  return "$status"
}

# binarize OUT [fairseq-preprocess options]: runs fairseq-preprocess with
# --destdir OUT/bin.tmp, its log in OUT/preprocess.log, and renames
# OUT/bin.tmp to OUT/bin when it succeeds (an interrupted run leaves no
# OUT/bin that looks finished). When it fails: the log's last 20 lines, then die.
binarize() {
  local out="$1"
  shift
  rm -rf "$out/bin.tmp"
  : > "$out/preprocess.log"
  run_fairseq_preprocess "$out/preprocess.log" "$out/bin.tmp" "$@" \
    || { tail -20 "$out/preprocess.log" >&2; die "fairseq-preprocess failed (log: $out/preprocess.log)"; }
  rm -rf "$out/bin"
  mv "$out/bin.tmp" "$out/bin"
}
