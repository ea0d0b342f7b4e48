"""The analyst-query corpus: real queries from public DP SQL test suites, tutorials and docs,
rewritten for the shared data and the repository's sample data (``queries.toml``), with the
harness that runs them through the gateway and compares with exact DuckDB answers."""
