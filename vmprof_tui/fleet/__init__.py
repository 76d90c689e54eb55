"""The fleet stage (thesis ch. 4–5): agent windows → one Dask task per window (every VM read in one pass) →
Parquet store → DuckDB."""
