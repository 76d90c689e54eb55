"""The fleet stage (thesis ch. 4–5): agent windows → Dask tasks (window × VM) → Parquet store → DuckDB."""
