#!/bin/sh
# Runs once, when the PostgreSQL volume is first initialised (docker-entrypoint-initdb.d).
# Two login roles, passwords from the environment (docker-compose.yml refuses to start
# without them):
#   dpgate         owns the database: the privacy-budget ledger and the release store
#   dpgate_reader  may only SELECT the sample dataset, in read-only transactions
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v ledger_password="$DPGATE_LEDGER_PASSWORD" -v reader_password="$DPGATE_READER_PASSWORD" <<'SQL'
CREATE ROLE dpgate LOGIN PASSWORD :'ledger_password';
CREATE ROLE dpgate_reader LOGIN PASSWORD :'reader_password';
ALTER ROLE dpgate_reader SET default_transaction_read_only = on;
GRANT ALL ON DATABASE :"DBNAME" TO dpgate;
GRANT CREATE ON SCHEMA public TO dpgate;
CREATE SCHEMA sample;
GRANT USAGE ON SCHEMA sample TO dpgate_reader;
ALTER DEFAULT PRIVILEGES IN SCHEMA sample GRANT SELECT ON TABLES TO dpgate_reader;
SQL
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -c "SET search_path = sample" -f /docker-entrypoint-initdb.d/sample_orders.sql.in
