#!/usr/bin/env bash
# Create a Cloud TPU VM slice.
#   tpu_scripts/create.sh --accelerator-type=v5p-8 [--version=RUNTIME] [--spot]
#       [--name=NAME] [--zone=ZONE] [--project=PROJECT] [--dry-run]
# The runtime defaults to the one for the accelerator's generation (v5litepod/v5e:
# v2-alpha-tpuv5-lite, v5p: v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ACCELERATOR=""
VERSION=""
SPOT=0
for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    --accelerator-type=*) ACCELERATOR="${arg#*=}" ;;
    --version=*) VERSION="${arg#*=}" ;;
    --spot) SPOT=1 ;;
    -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
    *) die "unknown option $arg" ;;
  esac
done
[[ -n "$ACCELERATOR" ]] || die "--accelerator-type is required (e.g. v5p-8, v5litepod-16, v6e-8)"
if [[ -z "$VERSION" ]]; then
  case "$ACCELERATOR" in
    v5litepod-* | v5e-*) VERSION="v2-alpha-tpuv5-lite" ;;
    v5p-*) VERSION="v2-alpha-tpuv5" ;;
    v6e-*) VERSION="v2-alpha-tpuv6e" ;;
    *) die "no default runtime for $ACCELERATOR; pass --version" ;;
  esac
fi
gcloud_where
CMD=(gcloud compute tpus tpu-vm create "$TPU_NAME" "${WHERE[@]}"
  "--accelerator-type=$ACCELERATOR" "--version=$VERSION")
if [[ "$SPOT" == 1 ]]; then
  CMD+=(--spot)
fi
run "${CMD[@]}"
