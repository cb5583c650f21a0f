#!/usr/bin/env bash
# Copy this checkout to every worker of the slice and install it there with jax[tpu].
#   tpu_scripts/setup.sh [--name=NAME] [--zone=ZONE] [--project=PROJECT] [--dry-run]
# Packs what git would commit (tracked files and new ones .gitignore does not name; without
# git, the tree less .git, .venv*, egg-info, caches and runs/), then on each worker runs
# tpu_scripts/install_worker.sh: a Python 3.11+ venv in ~/jaxrl-llm/.venv (apt adds python3.11
# where the runtime has only 3.10) and `pip install -e '.[tpu]'` (jax[tpu] and libtpu from PyPI).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for arg in "$@"; do
  common_option "$arg" && continue
  case "$arg" in
    -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
    *) die "unknown option $arg" ;;
  esac
done

# The files to copy, NUL-separated, relative to the checkout.
list_files() {
  if git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    local f
    while IFS= read -r -d '' f; do
      if [[ -e "$REPO_ROOT/$f" ]]; then  # a tracked file deleted here is not there to pack
        printf '%s\0' "$f"
      fi
    done < <(git -C "$REPO_ROOT" ls-files -z --cached --others --exclude-standard)
  else
    (cd "$REPO_ROOT" && find . \( -name .git -o -name '.venv*' -o -name '*.egg-info' \
      -o -name __pycache__ -o -name '.*_cache' -o -name .hypothesis -o -path ./runs \
      -o -path ./build -o -path ./dist -o -path ./.whl -o -path ./.gl \) -prune \
      -o -type f ! -name '*.pyc' -print0)
  fi
}

gcloud_where
TARBALL="${TMPDIR:-/tmp}/${TPU_NAME}-jaxrl-llm.tar.gz"
FILES="${TARBALL%.tar.gz}.files"
list_files >"$FILES"  # also under --dry-run: the tar command it prints reads this list
run tar -czf "$TARBALL" -C "$REPO_ROOT" --null -T "$FILES"
run gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:jaxrl-llm.tar.gz" "${WHERE[@]}" \
  --worker=all
INSTALL="mkdir -p $REMOTE_DIR && tar -xzf jaxrl-llm.tar.gz -C $REMOTE_DIR"
INSTALL+=" && cd $REMOTE_DIR && bash tpu_scripts/install_worker.sh"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${WHERE[@]}" --worker=all \
  "--command=$INSTALL"
