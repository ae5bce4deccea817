"""Reading an export: the SQLite schema (:mod:`.export`), nsys enum values (:mod:`.enums`), the
columnar read cache (:mod:`.cache`), ``--time`` trimming (:mod:`.trim`, the only code that writes a
SQLite file) and the DeepSpeed config (:mod:`.dsconfig`)."""
