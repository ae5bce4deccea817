"""nsys discovery, version, GPU-metrics probing, option merging and failure diagnosis.

``tests/fake_nsys/nsys`` is a FAKE nsys (a Python script), not NVIDIA's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tracekit.capture import nsys as n
from tracekit.errors import TracekitError

FAKE_DIR = Path(__file__).parent / "fake_nsys"
FAKE_NSYS = str(FAKE_DIR / "nsys")


def make_exe(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_explicit_path_wins(tmp_path):
    a = make_exe(tmp_path / "a" / "nsys")
    b = make_exe(tmp_path / "b" / "nsys")
    env = {"TRACEKIT_NSYS": str(b), "PATH": str(b.parent)}
    loc = n.find_nsys(str(a), env, patterns=())
    assert (loc.path, loc.source) == (str(a), "--nsys")


def test_env_before_path(tmp_path):
    b = make_exe(tmp_path / "b" / "nsys")
    c = make_exe(tmp_path / "c" / "nsys")
    loc = n.find_nsys(None, {"TRACEKIT_NSYS": str(b), "PATH": str(c.parent)}, patterns=())
    assert (loc.path, loc.source) == (str(b), "TRACEKIT_NSYS")


def test_path_before_standard_folders(tmp_path):
    c = make_exe(tmp_path / "c" / "nsys")
    std = make_exe(tmp_path / "opt" / "nsight-systems" / "2025.1.1" / "bin" / "nsys")
    loc = n.find_nsys(None, {"PATH": str(c.parent)}, patterns=(str(std),))
    assert (loc.path, loc.source) == (str(c), "PATH")


def test_standard_folders_pick_highest_version(tmp_path):
    # the layout seen on the GPU machine: nsys inside Nsight Compute, plus an older Nsight Systems
    old = make_exe(tmp_path / "nsight-systems" / "2024.6.2" / "bin" / "nsys")
    new = make_exe(tmp_path / "nsight-compute" / "2025.3.1" / "host" / "target-linux-x64" / "nsys")
    patterns = (str(tmp_path / "nsight-systems" / "*" / "bin" / "nsys"),
                str(tmp_path / "nsight-compute" / "*" / "host" / "target-linux-x64" / "nsys"))
    loc = n.find_nsys(None, {"PATH": ""}, patterns=patterns)
    assert loc.path == str(new) and loc.source == "standard folder"
    assert old.exists()


def test_not_found_names_where_it_looked(tmp_path):
    with pytest.raises(TracekitError) as err:
        n.find_nsys(None, {"PATH": str(tmp_path)}, patterns=("/nowhere/*/bin/nsys",))
    msg = str(err.value)
    assert "PATH" in msg and "TRACEKIT_NSYS" in msg and "/nowhere/*/bin/nsys" in msg and "--nsys" in msg
    assert err.value.exit_code == 2


def test_bad_explicit_and_env_paths(tmp_path):
    with pytest.raises(TracekitError, match="--nsys"):
        n.find_nsys(str(tmp_path / "missing"), {})
    plain = tmp_path / "nsys"
    plain.write_text("not executable")
    with pytest.raises(TracekitError, match="TRACEKIT_NSYS"):
        n.find_nsys(None, {"TRACEKIT_NSYS": str(plain)})


def test_version_of_fake_nsys():
    assert n.nsys_version(FAKE_NSYS) == "2099.1.1.1-fake"


def test_version_failure_is_one_line_error(tmp_path):
    bad = make_exe(tmp_path / "nsys", "#!/bin/sh\necho 'broken install' >&2\nexit 1\n")
    with pytest.raises(TracekitError, match="broken install"):
        n.nsys_version(str(bad))


def test_gpu_metrics_devices(monkeypatch):
    monkeypatch.setenv("FAKE_NSYS_GPU", "supported")
    devices, _ = n.gpu_metrics_devices(FAKE_NSYS)
    assert devices == ["0: NVIDIA FAKE GPU PCI[0000:01:00.0]"]
    monkeypatch.setenv("FAKE_NSYS_GPU", "unsupported")
    devices, raw = n.gpu_metrics_devices(FAKE_NSYS)
    assert devices == [] and "not supported" in raw


def test_normalize_short_long_and_separate_values():
    pairs = n.normalize_options(["-t", "cuda,osrt", "--sample=cpu", "--stats", "-s", "none",
                                 "--delay", "5"])
    assert pairs == [("--trace", "cuda,osrt"), ("--sample", "cpu"), ("--stats", None),
                     ("--sample", "none"), ("--delay", "5")]
    with pytest.raises(TracekitError):
        n.normalize_options(["cuda"])


def test_user_options_replace_defaults():
    settings = n.ProfileSettings(output="run", user_options=("--trace=cuda,nvtx,osrt", "-s cpu"))
    cmd = n.build_profile_command("/x/nsys", settings, ["python", "t.py"])
    assert cmd[:2] == ["/x/nsys", "profile"]
    assert cmd[-3:] == ["--output=run", "python", "t.py"]
    assert "--trace=cuda,nvtx,osrt" in cmd and "--trace=cuda,nvtx" not in cmd
    assert "--sample=cpu" in cmd and "--sample=none" not in cmd
    assert cmd.count("--export=sqlite") == 1


def test_default_command_exactly():
    settings = n.ProfileSettings(output="out/z3", gpu_metrics_frequency_hz=2000, iterations=(2, 3),
                                 force=True)
    cmd = n.build_profile_command("nsys", settings, ["deepspeed", "train.py"])
    assert cmd == ["nsys", "profile", "--trace=cuda,nvtx", "--cuda-memory-usage=true",
                   "--sample=none", "--cpuctxsw=none", "--trace-fork-before-exec=true",
                   "--gpu-metrics-devices=all", "--gpu-metrics-frequency=2000",
                   "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                   "--export=sqlite", "--force-overwrite=true", "--output=out/z3",
                   "deepspeed", "train.py"]


def test_no_gpu_metrics_no_iterations():
    cmd = n.build_profile_command("nsys", n.ProfileSettings(output="o", gpu_metrics=False), ["t"])
    assert not any(c.startswith("--gpu-metrics") or c.startswith("--capture-range") for c in cmd)


def test_command_errors():
    with pytest.raises(TracekitError, match="no training command"):
        n.build_profile_command("nsys", n.ProfileSettings(output="o"), [])
    with pytest.raises(TracekitError, match="-o NAME"):
        n.build_profile_command("nsys", n.ProfileSettings(output="o", user_options=("-o x",)), ["t"])


def test_export_command():
    assert n.export_command("nsys", "r.nsys-rep", "r.sqlite") == [
        "nsys", "export", "--type=sqlite", "--force-overwrite=true", "--output=r.sqlite", "r.nsys-rep"]


def test_parse_missing_libraries_from_ldd_and_loader():
    ldd = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibdw.so.1 => not found\n"
           "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\tlibelf.so.1 => not found\n")
    assert n.parse_missing_libraries(ldd) == ["libdw.so.1", "libelf.so.1"]
    loader = ("QdstrmImporter: error while loading shared libraries: libdw.so.1: cannot open "
              "shared object file: No such file or directory")
    assert n.parse_missing_libraries(loader) == ["libdw.so.1"]
    assert n.parse_missing_libraries(ldd + loader) == ["libdw.so.1", "libelf.so.1"]
    assert n.parse_missing_libraries("all fine") == []


def test_find_importer_layouts(tmp_path):
    # Nsight Compute's bundled nsys: host/target-linux-x64/nsys + host/linux-desktop-glibc_2_11_3-x64/
    target = make_exe(tmp_path / "host" / "target-linux-x64" / "nsys")
    imp = make_exe(tmp_path / "host" / "linux-desktop-glibc_2_11_3-x64" / "QdstrmImporter")
    assert n.find_importer(str(target)) == str(imp)
    # the fake beside the fake nsys
    assert n.find_importer(FAKE_NSYS) == str(FAKE_DIR / "QdstrmImporter")
    lone = make_exe(tmp_path / "lone" / "bin" / "nsys")
    assert n.find_importer(str(lone)) is None


def test_missing_libraries_of_fake_importer():
    assert n.missing_libraries(str(FAKE_DIR / "QdstrmImporter")) == ["libdw.so.1"]
    assert os.access(FAKE_DIR / "QdstrmImporter", os.X_OK)


def test_output_percent_is_literal_for_nsys():
    # nsys expands %p, %h, %q{VAR} and %n in --output and writes %% as one % (d10)
    assert n.output_option("runs/a%p%%b") == "--output=runs/a%%p%%%%b"
    cmd = n.build_profile_command("nsys", n.ProfileSettings(output="r%q{RANK}", gpu_metrics=False), ["t"])
    assert cmd[-2:] == ["--output=r%%q{RANK}", "t"]


def test_gpu_metrics_of_one_device():
    cmd = n.build_profile_command("nsys", n.ProfileSettings(output="o", gpu_metrics_devices="3"), ["t"])
    assert "--gpu-metrics-devices=3" in cmd and "--gpu-metrics-devices=all" not in cmd
