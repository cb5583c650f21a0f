#!/usr/bin/env bash
# Copy this checkout to every worker of the slice and install it with jax[tpu].
#   tpu_scripts/setup.sh [--name=NAME] [--zone=ZONE] [--project=PROJECT] [--dry-run]
# The tree is packed without .git, .venv and runs/; `pip install -e .[tpu]` pulls jax[tpu]
# (and libtpu) from PyPI on each worker.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    -h | --help) sed -n '2,5p' "$0"; exit 0 ;;
    *) die "unknown option $arg" ;;
  esac
done
gcloud_where
TARBALL="/tmp/${TPU_NAME}-jaxrl-llm.tar.gz"
run tar --exclude=.git --exclude=.venv --exclude=runs --exclude=__pycache__ \
  -czf "$TARBALL" -C "$REPO_ROOT" .
run gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:jaxrl-llm.tar.gz" "${WHERE[@]}" \
  --worker=all
INSTALL="mkdir -p $REMOTE_DIR && tar -xzf jaxrl-llm.tar.gz -C $REMOTE_DIR"
INSTALL+=" && cd $REMOTE_DIR && python3 -m pip install --upgrade pip"
INSTALL+=" && python3 -m pip install -e '.[tpu]'"
INSTALL+=" && python3 -c 'import jax; print(jax.process_index(), jax.device_count())'"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${WHERE[@]}" --worker=all \
  "--command=$INSTALL"
