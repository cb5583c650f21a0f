#!/usr/bin/env bash
# Copy checkpoints and data from Cloud Storage to the same local folder on every worker.
#   tpu_scripts/stage.sh --to=/LOCAL/DIR gs://BUCKET/PATH... [--name=NAME] [--zone=ZONE]
#       [--project=PROJECT] [--dry-run]
# Each gs:// object or folder lands in --to under its own name (gs://b/Qwen2.5-Math-7B ->
# /LOCAL/DIR/Qwen2.5-Math-7B). Needed for HF checkpoint folders (read from local disk);
# data files, --run_dir and Orbax checkpoints can also stay on gs:// (docs/tpu.md).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TO=""
SOURCES=()
for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
    --to=*) TO="${arg#*=}" ;;
    gs://*) SOURCES+=("$arg") ;;
    *) die "unknown option $arg (sources must be gs:// paths)" ;;
  esac
done
[[ "$TO" == /* ]] || die "pass --to=/an/absolute/folder on the workers"
[[ "${#SOURCES[@]}" -gt 0 ]] || die "pass at least one gs:// source"
gcloud_where
COPY="mkdir -p $(quote "$TO") && gcloud storage cp -r"
for src in "${SOURCES[@]}"; do
  COPY+=" $(quote "$src")"
done
COPY+=" $(quote "$TO")/"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${WHERE[@]}" --worker=all "--command=$COPY"
