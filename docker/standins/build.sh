#!/usr/bin/env bash
# Stand-ins for the two base images compose names, built from Debian's packages, for machines that
# cannot pull from Docker Hub: `python:3.11-slim` (bookworm's Python 3.11 in a venv at /usr/local, as
# the real image has it under /usr/local) and `postgres:16` (bookworm's PostgreSQL 15 behind an
# entrypoint that honours POSTGRES_USER / _PASSWORD / _DB and /docker-entrypoint-initdb.d, and
# pg_isready). The host's CA bundle goes into the python stand-in (pip behind a TLS-re-signing proxy);
# the project's Dockerfile stays as it is. Each carries the label org.memsweep.standin. Run as root with
# a Docker daemon; about 1.5 minutes for both.
#   docker/standins/build.sh [IMAGE...]     # default: both; DEBIAN_MIRROR picks the mirror
set -euo pipefail
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGES=("$@")
((${#IMAGES[@]})) || IMAGES=(python:3.11-slim postgres:16)
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }

root() {  # a minimal bookworm with these packages, in $WORK/$1
  debootstrap --variant=minbase --include=ca-certificates bookworm "$WORK/$1" "$MIRROR" >/dev/null
  cp /etc/resolv.conf "$WORK/$1/etc/resolv.conf"
  chroot "$WORK/$1" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $2 >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*"
  rm -f "$WORK/$1/etc/resolv.conf"
}

want() { [[ " ${IMAGES[*]} " == *" $1 "* ]]; }

if want python:3.11-slim; then
root python "python3 python3-venv"
chroot "$WORK/python" python3 -m venv /usr/local
cp /etc/ssl/certs/ca-certificates.crt "$WORK/python/etc/ssl/certs/ca-certificates.crt"
tar -C "$WORK/python" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'LABEL org.memsweep.standin=true' \
  --change 'CMD ["python3"]' - python:3.11-slim
fi

if want postgres:16; then
root postgres "postgresql-15 gosu"
install -m 755 "$HERE/postgres-entrypoint.sh" "$WORK/postgres/usr/local/bin/docker-entrypoint.sh"
ln -sf /usr/lib/postgresql/15/bin/pg_isready "$WORK/postgres/usr/local/bin/pg_isready"
tar -C "$WORK/postgres" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'LABEL org.memsweep.standin=true' \
  --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' - postgres:16
fi
