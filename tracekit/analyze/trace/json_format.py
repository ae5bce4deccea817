"""tracekit's JSON text: the indented layout of ``--json`` and the result cache, strict JSON.

:func:`format_json` (and :func:`write_json_to`, the same text written piece by piece) lays out
objects and lists of containers indented and every flat value (a table's row) on one line;
:func:`dumps_strict` keeps ``json.dumps``' layout. Both write non-finite floats as ``null``
(:func:`json_safe`): RFC 8259 has no NaN or Infinity.
"""

from __future__ import annotations

import json
import math


def format_json(obj, indent: int = 1, strict: bool = False) -> str:
    """``obj`` as JSON text: objects and lists that hold containers are indented (``indent``
    spaces a level), everything else, such as each row of a table, stays on one line; ends
    with a newline. Parses to the same value as ``json.dumps(obj, indent=indent)``, many times
    faster on large results (rows go through the C encoder; the indenting encoder is Python).

    ``strict``: raise TypeError for a dict key that is not a string (JSON would turn it into
    one, so the text would not read back as ``obj``), as the result cache needs.

    A list with a ``json_blocks(sep)`` method (:class:`tracekit.analyze.sections.transfers.JsonRows`:
    table rows encoded column by column) is written from the blocks of row text it yields, in
    the layout of a list of rows.
    """
    parts: list[str] = []
    _encode_json(obj, indent, strict, parts.append)
    return "".join(parts)


def write_json_to(obj, fh, indent: int = 1, strict: bool = False, buffer_chars: int = 1 << 20) -> None:
    """Write :func:`format_json`'s text of ``obj`` to the text file ``fh`` piece by piece, about
    ``buffer_chars`` characters at a time, never holding the whole text (a long timeline's rows
    are tens of MB of it)."""
    parts: list[str] = []
    size = 0

    def out(t: str) -> None:
        nonlocal size
        parts.append(t)
        size += len(t)
        if size >= buffer_chars:
            fh.write("".join(parts))
            parts.clear()
            size = 0

    _encode_json(obj, indent, strict, out)
    fh.write("".join(parts))


def json_safe(obj):
    """``obj`` with every non-finite float (NaN, inf, -inf) replaced by None, so that it
    encodes as strict JSON (RFC 8259 has no NaN/Infinity: jq, JavaScript, Go and serde refuse
    Python's ``NaN``); dicts, lists and tuples are rebuilt, other values kept."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "json_blocks"):
        return [json_safe(v) for v in obj]
    return obj


def dumps_strict(obj, **kwargs) -> str:
    """``json.dumps(obj, **kwargs)`` as strict JSON: non-finite floats written as ``null``
    (:func:`json_safe`), ``allow_nan=False`` as the guard. For the outputs that keep
    ``json.dumps``' own layout (``compare --json``, ``compare.json``); everything else goes
    through :func:`format_json`, which does the same. Also the Perfetto file and the findings'
    ``values`` column."""
    try:  # the common case: nothing to replace, no copy made
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def _encode_json(obj, indent: int, strict: bool, out) -> None:
    """The text of :func:`format_json`, passed piece by piece to ``out(str)``. Strict JSON: a
    non-finite float is written as ``null`` (:func:`json_safe`), never ``NaN``/``Infinity``."""
    from json.encoder import c_make_encoder, encode_basestring_ascii

    if c_make_encoder is not None:  # the C encoder, built once (JSONEncoder.encode builds one per call)

        def _default(o):
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

        # allow_nan=False: ValueError on NaN/inf, the piece is then encoded again from json_safe(piece)
        _c = c_make_encoder(None, _default, encode_basestring_ascii, None, ": ", ", ", False, False, False)

        def _dumps(o) -> str:
            return "".join(_c(o, 0))
    else:  # pragma: no cover - Pythons without the C accelerator
        _dumps = json.JSONEncoder(ensure_ascii=True, separators=(", ", ": "), allow_nan=False).encode

    def dumps(o) -> str:
        try:
            return _dumps(o)
        except ValueError:  # "Out of range float values are not JSON compliant"
            return _dumps(json_safe(o))

    def nested(o) -> bool:
        if isinstance(o, dict):
            return any(isinstance(v, (dict, list, tuple)) for v in o.values())
        if isinstance(o, (list, tuple)):
            return any(isinstance(v, (dict, list, tuple)) for v in o)
        return False

    def enc(o, level: int) -> None:
        blocks = getattr(o, "json_blocks", None) if isinstance(o, list) else None
        if blocks is not None:  # rows encoded column by column, laid out as a list of rows
            pad = "\n" + " " * (indent * (level + 1))
            n = 0
            for b in blocks("," + pad):
                out(("," if n else "[") + pad + b)
                n += 1
            out("\n" + " " * (indent * level) + "]" if n else "[]")
            return
        if strict and isinstance(o, dict) and not all(type(k) is str for k in o):
            raise TypeError(f"non-string keys in {list(o)[:5]}")
        if not nested(o):
            if strict and isinstance(o, (list, tuple)):
                for v in o:  # a flat list may hold flat dicts (table rows)
                    if isinstance(v, dict) and not all(type(k) is str for k in v):
                        raise TypeError(f"non-string keys in {list(v)[:5]}")
            out(dumps(o))
            return
        pad = "\n" + " " * (indent * (level + 1))
        if isinstance(o, dict):
            out("{")
            for i, (k, v) in enumerate(o.items()):
                out(("," if i else "") + pad + dumps(str(k)) + ": ")
                enc(v, level + 1)
            out("\n" + " " * (indent * level) + "}")
        else:
            out("[")
            for i, v in enumerate(o):
                out(("," if i else "") + pad)
                enc(v, level + 1)
            out("\n" + " " * (indent * level) + "]")

    enc(obj, 0)
    out("\n")
