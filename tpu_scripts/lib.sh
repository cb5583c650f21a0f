# shellcheck shell=bash
# Shared by the tpu_scripts: option parsing for the slice's name/zone/project and a `run`
# that, under --dry-run, prints each command exactly (shell-quoted) instead of running it.

set -euo pipefail

TPU_NAME="${TPU_NAME:-jaxrl-llm}"
ZONE="${ZONE:-us-east5-a}"
PROJECT="${PROJECT:-}"
DRY_RUN=0
# shellcheck disable=SC2034  # REPO_ROOT and REMOTE_DIR are read by the sourcing scripts.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC2034
REMOTE_DIR="jaxrl-llm"

# One word as a shell would need it typed: bare when safe, else single-quoted.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf '%s' "${1@Q}"
  fi
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    local sep=""
    for word in "$@"; do
      printf '%s%s' "$sep" "$(quote "$word")"
      sep=" "
    done
    printf '\n'
  else
    "$@"
  fi
}

die() {
  echo "error: $*" >&2
  exit 2
}

# Sets a global from one of the options every script takes; fails for any other.
common_option() {
  case "$1" in
    --name=*) TPU_NAME="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    *) return 1 ;;
  esac
}

# gcloud flags every command takes.
gcloud_where() {
  WHERE=("--zone=$ZONE")
  if [[ -n "$PROJECT" ]]; then
    WHERE+=("--project=$PROJECT")
  fi
}
