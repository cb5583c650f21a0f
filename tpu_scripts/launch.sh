#!/usr/bin/env bash
# Run `jaxrl-llm train` on every worker at once and stream their logs here.
#   tpu_scripts/launch.sh --gin_file=configs/X.gin [--gin_param=...]...
#       [--run_dir=gs://BUCKET/runs/NAME] [--name=NAME] [--zone=ZONE] [--project=PROJECT]
#       [--dry-run]
# Every option not listed above is passed to `jaxrl-llm train` unchanged. On a slice of several
# hosts --run_dir must be one folder every host sees (gs://...): each host writes its part of
# every Orbax checkpoint there; a local path is a different folder on each host. Runs the
# ~/jaxrl-llm/.venv that tpu_scripts/setup.sh made; each worker keeps its own log in
# ~/jaxrl-llm/train.log. JAX finds the coordinator itself on TPU VMs (JAXRL_DISTRIBUTED=auto ->
# jax.distributed.initialize()).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TRAIN_ARGS=()
for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    *) TRAIN_ARGS+=("$arg") ;;
  esac
done
[[ "${#TRAIN_ARGS[@]}" -gt 0 ]] || die "pass at least --gin_file=... for jaxrl-llm train"
gcloud_where
QUOTED=""
for arg in "${TRAIN_ARGS[@]}"; do
  QUOTED+=" $(quote "$arg")"
done
# The worker's shell runs a pipeline into tee: pipefail there, or the run's exit status would be
# tee's (0) and a failed run would read as a good one to gcloud and to whatever called this.
REMOTE="set -o pipefail && cd $REMOTE_DIR"
REMOTE+=" && { [ -x .venv/bin/jaxrl-llm ] || { echo 'error: no ~/$REMOTE_DIR/.venv/bin/jaxrl-llm on"
REMOTE+=" this worker: run tpu_scripts/setup.sh first' >&2; exit 2; }; }"
REMOTE+=" && export PATH=\"\$PWD/.venv/bin:\$PATH\" JAXRL_DISTRIBUTED=auto"
REMOTE+=" && jaxrl-llm train$QUOTED"
REMOTE+=" 2>&1 | tee train.log"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${WHERE[@]}" --worker=all \
  "--command=$REMOTE"
