"""Analysis layer: read nsys SQLite exports with polars and attribute GPU work to training phases."""
