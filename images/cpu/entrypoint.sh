#!/bin/sh
# The CPU image's entrypoint. Dataflow starts an SDK container with Beam's boot flags only (--id=...,
# --logging_endpoint=..., ...): those go to Beam's boot program. Anything else is a command (pipectl, python3);
# KFP's steps bypass this script altogether (their command replaces the entrypoint).
set -e
case "${1:-}" in
  --*) exec /opt/apache/beam/boot "$@" ;;
  *) exec "$@" ;;
esac
