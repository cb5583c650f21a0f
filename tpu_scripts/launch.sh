#!/usr/bin/env bash
# Run `jaxrl-llm train` on every worker at once and stream their logs here.
#   tpu_scripts/launch.sh --gin_file=configs/X.gin [--gin_param=...]... [--run_dir=DIR]
#       [--name=NAME] [--zone=ZONE] [--project=PROJECT] [--dry-run]
# Every option not listed above is passed to `jaxrl-llm train` unchanged. Each worker also
# keeps its own log in ~/jaxrl-llm/train.log. JAX finds the coordinator itself on TPU VMs
# (JAXRL_DISTRIBUTED=auto -> jax.distributed.initialize()).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TRAIN_ARGS=()
for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
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
REMOTE="set -o pipefail && cd $REMOTE_DIR && export PATH=\"\$HOME/.local/bin:\$PATH\" JAXRL_DISTRIBUTED=auto"
REMOTE+=" && jaxrl-llm train$QUOTED"
REMOTE+=" 2>&1 | tee train.log"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${WHERE[@]}" --worker=all \
  "--command=$REMOTE"
