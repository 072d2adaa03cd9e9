#!/bin/sh
# A stand-in for the postgres image's entrypoint: initialise PGDATA once (POSTGRES_USER, _PASSWORD,
# _DB; *.sql in /docker-entrypoint-initdb.d), then run the server as the postgres user.
set -e
PGBIN=/usr/lib/postgresql/15/bin
export PGDATA=${PGDATA:-/var/lib/postgresql/data}
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp); printf '%s' "$POSTGRES_PASSWORD" > "$pw"; chown postgres "$pw"
  # UTF-8, as the postgres image initialises it (a minimal Debian has no locale: initdb would pick SQL_ASCII)
  gosu postgres $PGBIN/initdb -U "${POSTGRES_USER:-postgres}" --pwfile="$pw" -A scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pw"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses='*'" >> "$PGDATA/postgresql.conf"
  gosu postgres $PGBIN/pg_ctl -w -o "-c listen_addresses=''" start >/dev/null
  export PGPASSWORD="$POSTGRES_PASSWORD"
  if [ -n "$POSTGRES_DB" ] && [ "$POSTGRES_DB" != postgres ]; then
    gosu postgres psql -v ON_ERROR_STOP=1 -U "${POSTGRES_USER:-postgres}" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] && gosu postgres psql -v ON_ERROR_STOP=1 -U "${POSTGRES_USER:-postgres}" -d "${POSTGRES_DB:-postgres}" -f "$f"
  done
  gosu postgres $PGBIN/pg_ctl -w stop >/dev/null
fi
exec gosu postgres $PGBIN/postgres
