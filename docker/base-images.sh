#!/usr/bin/env bash
# The two base images docker/compose.yaml builds on and runs, `python:3.11-slim` and `postgres:16`:
# kept when present, pulled from Docker Hub when it answers, and otherwise built as stand-ins from
# Debian's packages (docker/standins/build.sh, about 1.5 minutes), which this says. Stand-ins carry the
# label org.memsweep.standin (so a test tier that made them can remove them).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
missing=()
for image in python:3.11-slim postgres:16; do
  if docker image inspect "$image" >/dev/null 2>&1; then
    echo "base-images: $image is here"
  elif timeout 300 docker pull -q "$image" >/dev/null 2>&1; then
    echo "base-images: $image pulled from Docker Hub"
  else
    missing+=("$image")
  fi
done
if ((${#missing[@]})); then
  echo "base-images: Docker Hub cannot be reached for ${missing[*]}: building stand-ins from Debian's packages (docker/standins/build.sh)"
  "$HERE/standins/build.sh" "${missing[@]}"
fi
