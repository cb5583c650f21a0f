#!/usr/bin/env bash
# Delete the slice (and with it every worker's disk), or only stop it.
#   tpu_scripts/delete.sh [--stop] [--name=NAME] [--zone=ZONE] [--project=PROJECT] [--dry-run]
# --stop keeps the VM for later (single-host slices only; multi-host slices must be deleted).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ACTION=delete
for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    --stop) ACTION=stop ;;
    -h | --help) sed -n '2,4p' "$0"; exit 0 ;;
    *) die "unknown option $arg" ;;
  esac
done
gcloud_where
if [[ "$ACTION" == delete ]]; then
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${WHERE[@]}" --quiet
else
  run gcloud compute tpus tpu-vm stop "$TPU_NAME" "${WHERE[@]}"
fi
