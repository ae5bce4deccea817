"""``--explain abc``: one line saying --explain takes an item number, exit 2 (it used to say
"one trace, table output", as if two traces were given)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli

ONE = Path(__file__).resolve().parent / "fixtures" / "ds_zero3_offload_iter1-2.sqlite"


def test_explain_with_a_word():
    rc, out, err = run_cli("analyze", ONE, "--explain", "abc")
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [
        "tracekit: error: --explain takes an advice item number (1, 2, ...) or nothing; 'abc' is neither a number "
        "nor a trace"]


def test_explain_with_two_traces_keeps_its_message():
    rc, _, err = run_cli("analyze", ONE, ONE, "--explain")
    assert rc == 2 and "--explain: one trace, table output" in err
