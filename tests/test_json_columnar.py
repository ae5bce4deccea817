"""Columnar JSON rows (issue 13 item 3): the text of a frame's rows built column by column must
be exactly what ``json.dumps`` writes for the row dicts, and the streamed writer exactly
``format_json``'s text. The references here are the standard library's encoder over rows built
by hand (plain Python values), not tracekit's own earlier output."""

import io
import json
import math

import polars as pl

from tracekit.analyze.sections.transfers import JsonRows, json_row_text
from tracekit.analyze.trace.cache import format_json, write_json_to


def _want_value(name, v):
    """How the JSON holds one value, by the rules of the result (vocab.json_number), by hand."""
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return None
        integral = name.endswith(("_ns", "_bytes", "count", "_pid", "samples", "windows"))
        if v.is_integer() and integral and abs(v) < 2**53:
            return int(v)
        return round(v, 6)
    return v


COLUMNS = {
    "id": [1, None, -3, 2**62, 0],
    "wall_ns": [1.0, 2.5, None, float("nan"), 2.0**60],
    "gbps": [0.1234565, float("nan"), -0.0, 1e-7, 1.5e16],
    "big": [1e20, float("inf"), float("-inf"), 0.0, 123456.7890125],
    "phase": ["forward", None, 'quo"te\\', "caf\u00e9 \x1b[0m", "forward"],
    "boundary": [True, None, False, True, False],
}


def test_row_text_equals_json_dumps_of_the_rows():
    f = pl.DataFrame(COLUMNS, schema_overrides={"id": pl.Int64})
    rows = [{k: _want_value(k, COLUMNS[k][i]) for k in COLUMNS} for i in range(f.height)]
    assert json_row_text(f, ", ") == ", ".join(json.dumps(r) for r in rows)
    assert json_row_text(f.head(1), "|") == json.dumps(rows[0])


def test_other_column_types_fall_back_to_the_encoder():
    f = pl.DataFrame({"a": [[1, 2], None], "b": [1, 2]})
    assert json_row_text(f, ", ") == '{"a": [1, 2], "b": 1}, {"a": null, "b": 2}'


def test_format_json_of_columnar_rows_equals_the_rows_and_streams_the_same_text():
    parts = [pl.DataFrame({"bin_start": [0, 10], "gbps": [0.0, 1.25], "phase": ["other", "update"]}),
             pl.DataFrame({"bin_start": [20], "gbps": [2.0 / 3.0], "phase": ["update"]}),
             pl.DataFrame({"bin_start": [], "gbps": [], "phase": []},
                          schema={"bin_start": pl.Int64, "gbps": pl.Float64, "phase": pl.String})]
    rows = [{"bin_start": 0, "gbps": 0.0, "phase": "other"}, {"bin_start": 10, "gbps": 1.25, "phase": "update"},
            {"bin_start": 20, "gbps": round(2.0 / 3.0, 6), "phase": "update"}]
    plain = {"ranks": [{"pid": 1, "timeline": {"throughput_timeline": rows, "empty": []}}], "n": 1}
    lazy = {"ranks": [{"pid": 1, "timeline": {"throughput_timeline": JsonRows(lambda: iter(parts)),
                                              "empty": JsonRows(lambda: iter(parts[2:]))}}], "n": 1}
    text = format_json(plain)
    assert format_json(lazy) == text
    assert json.loads(text) == plain
    assert JsonRows(lambda: iter(parts)).rows() == rows
    for size in (1, 7, 1 << 20):  # flushes inside rows, between them, never
        out = io.StringIO()
        write_json_to(lazy, out, buffer_chars=size)
        assert out.getvalue() == text
