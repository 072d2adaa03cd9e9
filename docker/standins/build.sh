#!/usr/bin/env bash
# Stand-ins for the two base images compose names, built from Debian's packages, for machines that
# cannot pull from Docker Hub: `python:3.11-slim` (bookworm's Python 3.11 in a venv at /usr/local, as
# the real image has it under /usr/local) and `postgres:16` (bookworm's PostgreSQL 15 behind an
# entrypoint that honours POSTGRES_USER / _PASSWORD / _DB and /docker-entrypoint-initdb.d, and
# pg_isready). The host's CA bundle goes into the python stand-in (pip behind a TLS-re-signing proxy);
# the project's Dockerfile stays as it is. Each carries the label org.memsweep.standin. Run as root with
# a Docker daemon; about 1.5 minutes for both.
#   docker/standins/build.sh [IMAGE...]     # default: both
# The Debian mirror is the one this machine's apt uses (its sources, and its apt proxy if it has one:
# apt_sources.py), so no mirror host is written here; DEBIAN_MIRROR (and APT_PROXY) name another.
set -euo pipefail
IMAGES=("$@")
((${#IMAGES[@]})) || IMAGES=(python:3.11-slim postgres:16)
HERE=$(cd "$(dirname "$0")" && pwd)
if [[ -n ${DEBIAN_MIRROR:-} ]]; then
  MIRROR=$DEBIAN_MIRROR
  APT_PROXY=${APT_PROXY:-}
else
  command -v "${PYTHON:-python3}" >/dev/null || {
    echo "stand-ins: no ${PYTHON:-python3} to read this machine's apt sources with; set DEBIAN_MIRROR to a Debian mirror it reaches (and APT_PROXY if it goes through one)" >&2
    exit 1
  }
  given_proxy=${APT_PROXY:-}
  found=$("${PYTHON:-python3}" "$HERE/apt_sources.py") || exit 1  # it says what to set
  eval "$found"  # MIRROR=… APT_PROXY=…
  APT_PROXY=${given_proxy:-$APT_PROXY}
fi
if [[ -n $APT_PROXY ]]; then  # debootstrap's downloads and the chroot's apt-get both honour these
  export http_proxy=$APT_PROXY https_proxy=$APT_PROXY
fi
echo "stand-ins: Debian from $MIRROR${APT_PROXY:+ through the proxy $APT_PROXY}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }

root() {  # a minimal bookworm with these packages, in $WORK/$1: a copy of one debootstrapped base
  if [[ ! -d $WORK/base ]]; then  # once for both stand-ins, with its package lists
    debootstrap --variant=minbase --include=ca-certificates bookworm "$WORK/base" "$MIRROR" >/dev/null
    cp /etc/resolv.conf "$WORK/base/etc/resolv.conf"
    chroot "$WORK/base" apt-get update -qq
  fi
  cp -a "$WORK/base" "$WORK/$1"
  chroot "$WORK/$1" sh -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $2 >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*"
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
