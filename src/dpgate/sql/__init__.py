"""SQL front end: parse (sqlglot, allow-list), plan (canonical QueryPlan), bound (DuckDB SQL)."""
