#!/bin/sh
# The CPU image's entrypoint. Dataflow starts an SDK container with Beam's boot flags only (--id=...,
# --logging_endpoint=..., --semi_persist_dir=...): those go to Beam's boot program. Anything else is a command
# (pipectl, python3); KFP's steps bypass this script altogether (their command replaces the entrypoint).
#
# The image runs as its non-root user (10001), also on Dataflow's workers. Beam's boot writes the job's staged
# files into --semi_persist_dir/staged (sdks/python/container/boot.go), a folder Dataflow maps from the worker VM,
# which may be root's alone: when this user cannot write there, the boot gets a folder in its home instead (with
# --sdk_location=container nothing but small files is staged), and the worker log says so.
set -e
BOOT=${BEAM_BOOT:-/opt/apache/beam/boot}
case "${1:-}" in
  --*) ;;
  *) exec "$@" ;;
esac
writable() { mkdir -p "$1/staged" 2>/dev/null && [ -w "$1/staged" ]; }
fallback="${HOME:-/home/app}/beam-semi-persist"
for arg in "$@"; do
  shift
  case "$arg" in
    --semi_persist_dir=*)
      dir=${arg#--semi_persist_dir=}
      if ! writable "$dir"; then
        echo "entrypoint.sh: user $(id -u) cannot write to --semi_persist_dir=$dir; using $fallback" >&2
        mkdir -p "$fallback"
        arg="--semi_persist_dir=$fallback"
      fi
      ;;
  esac
  set -- "$@" "$arg"
done
exec "$BOOT" "$@"
