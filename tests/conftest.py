import contextlib
import io
import locale
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # for tests/synthetic.py

FIXTURES = HERE / "fixtures"
ZERO3_CUT = FIXTURES / "ds_zero3_offload_iter1-2.sqlite"
#: iteration 1 of ZERO3_CUT alone (tests/fixtures/README.md): a mutation can leave it no usable iteration
ZERO3_ONE_ITERATION = FIXTURES / "ds_zero3_offload_iter1.sqlite"


def unpack_fixtures(folder: Path = FIXTURES) -> list[Path]:
    """Decompress each ``NAME.sqlite.xz`` of ``folder`` to ``NAME.sqlite`` (git-ignored) when that
    is missing or older than the archive: the repository keeps most cuts compressed (about 6x
    smaller) so that a checkout stays small enough to travel to the GPU machine. Written under a
    temporary name and renamed, so a run stopped half-way never leaves a truncated fixture."""
    import lzma
    import os
    import shutil

    done = []
    for xz in sorted(folder.glob("*.sqlite.xz")):
        target = xz.with_suffix("")
        if target.exists() and target.stat().st_mtime >= xz.stat().st_mtime:
            continue
        part = target.with_name(f".{target.name}.{os.getpid()}.part")
        with lzma.open(xz) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, target)
        done.append(target)
    return done


unpack_fixtures()
# ../shared beside the checkout (read-only); tests that need it skip when it is absent
SHARED = HERE.parent.parent / "shared" / "traces"
PUBLIC = SHARED / "public"


#: the what-if benchmark's committed cut traces (benchmarks/whatif/traces/NAME.sqlite.xz)
BENCH_TRACES = Path(__file__).resolve().parent.parent / "benchmarks" / "whatif" / "traces"


def bench_cut(run: str, folder: Path) -> Path:
    """The what-if benchmark's cut trace of ``run`` decompressed to ``folder/RUN.sqlite``."""
    import lzma

    db = Path(folder) / f"{run}.sqlite"
    db.write_bytes(lzma.decompress((BENCH_TRACES / f"{run}.sqlite.xz").read_bytes()))
    return db


@pytest.fixture
def zero3_cut() -> Path:
    return ZERO3_CUT


@pytest.fixture(scope="session")
def zero3_analysis():
    """``tracekit.analyze(ZERO3_CUT, cache=False)``, computed once per session (per xdist worker)
    and shared by every test file that reads it: tests must not change it."""
    import tracekit

    return tracekit.analyze(ZERO3_CUT, cache=False)


@pytest.fixture(scope="session")
def zero3_report_data():
    """``ReportData.load(ZERO3_CUT)`` (what every figure of ``tracekit report`` is drawn from),
    loaded once per session and shared: tests must not change it."""
    from tracekit.render.data import ReportData

    d = ReportData.load(ZERO3_CUT)
    yield d
    d.close()


@pytest.fixture(scope="session")
def _zero3_report_run(tmp_path_factory) -> dict:
    """``tracekit report ZERO3_CUT -o OUT --no-cache`` once per session (per xdist worker), in
    this process (:func:`run_cli`), ``OUT`` two folders below a new one (the command creates
    them): {"result": the ReportResult of the ``write_report`` call the command makes (the
    library's defaults, ``cache=False``), "out": OUT, "steps": every ``step(message)`` that
    call made, in order, "stdout", "stderr"}. One report instead of three (test_report.py's
    CLI report and its progress test each computed the same one, ~8 s of CPU apiece)."""
    import tracekit.render.report as R

    out = tmp_path_factory.mktemp("zero3_report") / "nested" / "r"
    run = {"out": out, "steps": []}
    real = R.write_report

    def write_report(*a, step=None, **k):
        def recorded(message):
            run["steps"].append(message)
            if step is not None:
                step(message)

        run["result"] = real(*a, step=recorded, **k)
        return run["result"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "write_report", write_report)  # the command imports it when it runs
        rc, run["stdout"], run["stderr"] = run_cli("report", ZERO3_CUT, "-o", out, "--no-cache")
    assert rc == 0 and "Traceback" not in run["stderr"], run["stderr"]
    return run


@pytest.fixture(scope="session")
def zero3_report(_zero3_report_run):
    """``tracekit report ZERO3_CUT -o OUT --no-cache`` once per session: (the ReportResult of
    its ``write_report(ZERO3_CUT, OUT)`` call, OUT). Tests read the files; one that changes
    them makes its own report."""
    return _zero3_report_run["result"], _zero3_report_run["out"]


@pytest.fixture(scope="session")
def zero3_report_steps(_zero3_report_run) -> list[str]:
    """The ``step(message)`` calls of :func:`zero3_report`'s ``write_report``, in order."""
    return _zero3_report_run["steps"]


def cheap_figure_bytes(fig, ext: str, dpi=None) -> bytes:
    """What :func:`cheap_figures` puts in place of a figure's PNG/SVG/PDF: one line naming the
    format and the figure's first axes title (the same for the same figure of the same trace)."""
    title = next((a.get_title() for a in fig.axes if a.get_title()), "")
    return f"tracekit test figure ({ext}): {title}\n".encode()


@pytest.fixture
def cheap_figures(monkeypatch):
    """Figures built but not rasterised: ``tracekit.render.style.figure_bytes`` (what ``report``
    and ``compare`` save every figure with) returns :func:`cheap_figure_bytes`. For tests of what
    surrounds the figures (cache keys and entries, which files a report writes, which rank it
    names), in this process only: saving is ~75 % of a report's time (ZERO3_CUT: 3.5 s -> 0.9 s
    per report). The figures' own bytes are checked where they are drawn for real (test_report,
    test_figures, test_figure_bytes, test_report_cache's first test)."""
    import tracekit.render.style as S

    monkeypatch.setattr(S, "figure_bytes", cheap_figure_bytes)


def public_exports():
    return sorted(PUBLIC.glob("*.sqlite")) if PUBLIC.exists() else []


FULL_TRACE_XZ = SHARED / "ds-zero3-offload-134m-bf16-gas2-h200.sqlite.xz"


@pytest.fixture(scope="session")
def full_trace(tmp_path_factory) -> Path:
    """The full shared DeepSpeed trace (624 MB), decompressed once per test session into a
    temporary folder; skips when ../shared is not beside the checkout."""
    import lzma
    import shutil

    if not FULL_TRACE_XZ.exists():
        pytest.skip("full shared trace not present")
    out = tmp_path_factory.mktemp("full") / "ds-zero3-offload-134m-bf16-gas2-h200.sqlite"
    with lzma.open(FULL_TRACE_XZ) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    return out


# ---------------------------------------------------------------- shared test helpers
#: commands that start other programs writing to the real file descriptors 1 and 2 (the
#: training, nsys): :func:`run_cli` runs these in a subprocess so that their output is captured
_SUBPROCESS_COMMANDS = {"capture"}


def run_cli_process(*args, env=None):
    """Run ``tracekit ARGS`` in a subprocess (``python -m tracekit.cli``); returns (exit code,
    stdout, stderr). For the tests of the real entry point; others use :func:`run_cli`.

    Without ``env``, the child gets this environment less ``COLUMNS`` and ``LINES``: GNU
    readline (imported by pytest through pdb) exports the terminal's size into the process
    environment, and tracekit honours ``COLUMNS``; tests that want a width pass it."""
    import subprocess

    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    p = subprocess.run([sys.executable, "-m", "tracekit.cli", *map(str, args)],
                       capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


@contextlib.contextmanager
def _environment(env: dict):
    """``os.environ`` replaced by ``env`` for the duration (restored after, also on errors)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _decoded(raw: bytes) -> str:
    """What ``subprocess.run(..., text=True)`` makes of a child's output: the locale's encoding,
    universal newlines (``\\r\\n`` and ``\\r`` read as ``\\n``)."""
    return io.TextIOWrapper(io.BytesIO(raw), encoding=locale.getpreferredencoding(False)).read()


def run_cli(*args, env=None):
    """``tracekit ARGS`` as :func:`run_cli_process` would run it, but in this process through
    :func:`tracekit.cli.main` (a subprocess costs ~1 s of imports; the suite ran ~110 of them);
    returns (exit code, stdout, stderr).

    What the child would see is reproduced: the environment ``env`` (default: this one less
    ``COLUMNS`` and ``LINES``) for the call, stdout and stderr that are no terminal, with the
    encodings and error handlers of this interpreter's own streams, read back as
    ``text=True`` reads a pipe; Python's default warning filters, warnings printed to the
    captured stderr; ``sys.exit`` turned into its exit code and an exception that escapes
    ``main`` into a traceback on stderr and exit code 1, as the interpreter would. ``capture``
    starts programs that write to the real file descriptors: it runs in a subprocess."""
    args = [str(a) for a in args]
    if args and args[0] in _SUBPROCESS_COMMANDS:
        return run_cli_process(*args, env=env)
    import traceback
    import warnings

    from tracekit.cli import main

    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    raw_out, raw_err = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(raw_out, encoding=sys.__stdout__.encoding or "utf-8",
                           errors=getattr(sys.__stdout__, "errors", None) or "strict", write_through=True)
    err = io.TextIOWrapper(raw_err, encoding=sys.__stderr__.encoding or "utf-8",
                           errors="backslashreplace", write_through=True)
    saved_argv = sys.argv
    with _environment(env), warnings.catch_warnings():
        warnings.resetwarnings()  # the interpreter's defaults, not pytest's
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        sys.argv = [str(Path(sys.modules["tracekit.cli"].__file__).with_name("__main__.py")), *args]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(args)
                except SystemExit as e:
                    code = e.code
                    if code is None:
                        rc = 0
                    elif isinstance(code, int):
                        rc = code
                    else:
                        print(code, file=sys.stderr)
                        rc = 1
                except KeyboardInterrupt:
                    raise
                except BaseException:
                    traceback.print_exc(file=sys.stderr)
                    rc = 1
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
        finally:
            sys.argv = saved_argv
    try:
        out.flush()
        err.flush()
    except (OSError, ValueError):
        pass
    return rc, _decoded(raw_out.getvalue()), _decoded(raw_err.getvalue())


def sql_indexed(path) -> sqlite3.Connection:
    """An in-memory copy of the export ``path`` (the file only read), with indexes on
    ``CUPTI_ACTIVITY_KIND_RUNTIME``'s ``correlationId`` and ``start``, for the tests' plain-SQL
    references: an nsys export has no index, so SQLite runs a copy's lookup of its API call
    (a correlated subquery, or a join on a range of ``start``) as a scan of the runtime table
    per copy, ~15 s of CPU on the zero-3 cut instead of ~0.05 s. The rows a query gives are
    the same; an index only changes how SQLite finds them, which for some queries (a self-join
    of NVTX_EVENTS first) is slower: use it where it is measured to help."""
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con = sqlite3.connect(":memory:")
    try:
        src.backup(con)
    finally:
        src.close()
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in names:
        con.execute("CREATE INDEX test_runtime_correlation ON CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)")
        con.execute("CREATE INDEX test_runtime_start ON CUPTI_ACTIVITY_KIND_RUNTIME(start)")
    return con


def assert_one_line_error(rc, out, err, pattern):
    """Exit code 2, no traceback, exactly one ``tracekit: error:`` line containing ``pattern``."""
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), err
    assert pattern in lines[0], lines[0]


def union_length_loop(intervals) -> int:
    """Brute-force union length of (start, end) pairs: a plain loop over the sorted list,
    the independent reference for tracekit's vectorized interval algebra."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


# ---------------------------------------------------------------- session-wide settings
@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole suite (``pytest`` with no paths, as the README and ``.ci/run`` run it) runs on
    one pytest-xdist worker per core (``-n auto``) when pytest-xdist is installed; a run that
    names files or tests, ``-n 0``/``-n N``, ``-p no:xdist`` or ``--pdb`` is left as asked.
    ``--dist loadgroup``: the tests of one ``xdist_group`` (the full shared trace, decompressed
    once per worker) run on one worker."""
    opt = config.option
    if (not hasattr(opt, "numprocesses") or hasattr(config, "workerinput") or opt.numprocesses is not None
            or config.args_source == pytest.Config.ArgsSource.ARGS or opt.usepdb or opt.collectonly):
        return None
    opt.numprocesses = "auto"
    if opt.dist == "no":
        opt.dist = "loadgroup"
    return None


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: none without it (-p no:xdist)
def pytest_configure_node(node):
    """(pytest-xdist, in the controller) Tell each worker whether the run is ``--dist
    loadgroup``: a worker parses the command line afresh, so the ``loadgroup`` that
    :func:`pytest_cmdline_main` chose for a run without ``--dist`` never reached it, it wrote
    no group into the node ids, and every ``xdist_group`` ran spread over the workers (each
    module fixture and the session's zero-3 report computed on both)."""
    node.workerinput["tracekit_loadgroup"] = node.config.option.dist == "loadgroup"


def pytest_configure(config):
    """One cache folder per test session (per xdist worker), removed at the end: tracekit's
    caches (``TRACEKIT_CACHE_DIR``, which every cache of tracekit honours) never go beside the
    fixtures or into the user's ``~/.cache``, a run never reuses what an earlier run or another
    checkout left, and a test file gets this without doing anything. Tests of the cache's
    placement set or drop ``TRACEKIT_CACHE_DIR`` themselves (monkeypatch or their own ``env``)."""
    import tempfile

    if getattr(config, "workerinput", {}).get("tracekit_loadgroup"):
        config.option.loadgroup = True  # see pytest_configure_node
    if hasattr(config, "workerinput"):
        # an xdist worker gets COLUMNS=80 and LINES=24 from its launcher, no terminal of the
        # user's: without them it lays out tables as a run of one process does
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
        # the thread budget tracekit gives its own --jobs workers (multi_runners.worker_threads):
        # cores // workers for polars' pool and the GPU_METRICS readers, so that N workers
        # each with a pool of every core do not fight over the cores (2 workers on 2 cores:
        # 11 % less wall and 12 % less CPU on the report-heavy files). Set before any test
        # module imports polars (its pool is sized at import); the user's own setting is kept,
        # and a test of the budget drops the variables itself
        workers = int(config.workerinput.get("workercount", 1) or 1)
        each = str(max(1, (os.cpu_count() or 1) // workers))
        config._tracekit_thread_env = {k: os.environ.get(k) for k in ("POLARS_MAX_THREADS", "TRACEKIT_READ_THREADS")}
        os.environ.setdefault("POLARS_MAX_THREADS", each)
        os.environ.setdefault("TRACEKIT_READ_THREADS", each)
    if "TRACEKIT_TEST_CPUINFO" not in os.environ:
        # py-cpuinfo's answer, kept once for the whole session (the xdist workers inherit the
        # variable): tests/pythonpath/sitecustomize.py, on the DeepSpeed tests' PYTHONPATH
        folder = tempfile.mkdtemp(prefix="tracekit-test-cpuinfo-")
        config._tracekit_cpuinfo_dir = folder
        os.environ["TRACEKIT_TEST_CPUINFO"] = os.path.join(folder, "cpuinfo.json")
    root = tempfile.mkdtemp(prefix="tracekit-test-cache-")
    config._tracekit_saved_cache_env = os.environ.get("TRACEKIT_CACHE_DIR")
    config._tracekit_cache_root = root
    os.environ["TRACEKIT_CACHE_DIR"] = root


def pytest_unconfigure(config):
    import shutil

    for k, v in getattr(config, "_tracekit_thread_env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    cpuinfo_dir = getattr(config, "_tracekit_cpuinfo_dir", None)
    if cpuinfo_dir is not None:
        shutil.rmtree(cpuinfo_dir, ignore_errors=True)
        os.environ.pop("TRACEKIT_TEST_CPUINFO", None)
    root = getattr(config, "_tracekit_cache_root", None)
    if root is None:
        return
    shutil.rmtree(root, ignore_errors=True)
    saved = config._tracekit_saved_cache_env
    if saved is None:
        os.environ.pop("TRACEKIT_CACHE_DIR", None)
    else:
        os.environ["TRACEKIT_CACHE_DIR"] = saved


def _module_fixture_user(item) -> bool:
    """Whether ``item`` uses (directly or through other fixtures) a module- or class-scoped
    fixture that is not autouse."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name) or ()
        if defs and defs[-1].scope in ("module", "class") and not getattr(defs[-1], "_autouse", False):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups to name the tests
def pytest_collection_modifyitems(config, items):
    """A test of the full shared trace (the ``full_trace`` fixture) is ``slow`` without saying so,
    and all of them run on one xdist worker (``xdist_group``), which decompresses the trace once.

    The tests of one file that use a module- or class-scoped fixture of it (a report, a cut, a
    Dask cluster) form one ``xdist_group`` too: ``--dist loadgroup`` sends every other test on
    its own to whichever worker is free, so such a fixture was computed once per worker (a
    report with ``--perfetto`` twice, ~30 s each on the loaded 2-core machine). An autouse
    module fixture (cheap set-up, as in test_mutations.py) does not group its file's tests."""
    # DeepSpeed's trainings (~30-70 s each on the loaded machine) first: the workers then end
    # on short tests together, not one on a training while the other waits (xdist sends the
    # groups, largest first, then the other tests in this order)
    items.sort(key=lambda item: item.get_closest_marker("deepspeed") is None)
    # the session's report of the zero-3 cut (~8 s of CPU) is written once in all, not once per
    # worker: its users, and the other tests of a module group that holds one, are one group
    shared = {item.path.name for item in items if _session_report_user(item) and _module_fixture_user(item)}
    for item in items:
        if "full_trace" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
            _xdist_group(config, item, "full_trace")
        elif _session_report_user(item) or (item.path.name in shared and _module_fixture_user(item)):
            _xdist_group(config, item, "session:zero3_report")
        elif _module_fixture_user(item):
            _xdist_group(config, item, f"module:{item.path.name}")


def _session_report_user(item) -> bool:
    """Whether ``item`` reads conftest's ``zero3_report`` (directly, through other fixtures, or
    as test_report.py's ``test_report_on_every_fixture`` does for the zero-3 cut)."""
    if "_zero3_report_run" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return (getattr(item, "originalname", None) == "test_report_on_every_fixture" and callspec is not None
            and callspec.params.get("trace") == ZERO3_CUT)


def _xdist_group(config, item, name: str) -> None:
    """``item`` marked ``xdist_group(name)``. pytest-xdist's workers tell the scheduler a test's
    group as a ``@name`` suffix of its node id, which xdist 3.8 writes into ``item._nodeid``;
    pytest 9.2 keeps the id in ``item._id`` (a ``NodeId``), so that write is lost and every
    group ran spread over the workers: on such a pytest the suffix is written here."""
    if not config.pluginmanager.has_plugin("xdist"):  # -p no:xdist: no such mark, no groups
        return
    item.add_marker(pytest.mark.xdist_group(name))
    if getattr(config.option, "loadgroup", False) and hasattr(item, "_id") and not item.nodeid.endswith(f"@{name}"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(f"{item.nodeid}@{name}")


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """SIGINT and SIGTERM handlers as they were before each test: a command run in process as
    the memory guard's child installs the once-only handlers (tracekit.signals.install), which
    set both signals to SIG_IGN when one arrives; an ignored signal is inherited by every later
    subprocess of the worker, whose SIGTERM tests then hang or finish with exit 0."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        if h is not None:
            signal.signal(s, h)
