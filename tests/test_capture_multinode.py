"""Multi-node and per-rank capture (issue 15 item 5): ``tracekit capture --per-rank`` as the
program each rank runs, started by the launcher.

What runs for real here: DeepSpeed 0.19.8's own ``deepspeed`` launcher (runner.py and
launch.py, multi-node path with a hostfile) and PyTorch's ``torchrun``. What cannot run on one
CPU machine is faked, in ``tests/fake_launchers/``: ``pdsh`` (runs each host's command locally
in a *fresh* environment, as a remote login shell would), ``srun`` (Slurm's task variables)
and nsys (``tests/fake_nsys/nsys``). The "training" is ``record_rank.py``, which writes the
argv and environment it received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

from tracekit.capture import runner

HERE = Path(__file__).parent
FAKE_NSYS = str(HERE / "fake_nsys" / "nsys")
LAUNCHERS = HERE / "fake_launchers"
RECORD = str(LAUNCHERS / "record_rank.py")
BIN = Path(sys.executable).parent


def _records(folder: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in folder.glob("rank-*.json")),
                  key=lambda r: int(r["env"].get("RANK", r["env"].get("SLURM_PROCID", -1))))


def _manifests(runs: Path) -> dict[int, dict]:
    return {json.loads(p.read_text())["rank"]["rank"]: json.loads(p.read_text()) for p in runs.glob("*.json")}


@pytest.mark.deepspeed
@pytest.mark.skipif(not (BIN / "deepspeed").exists(), reason="the deepspeed launcher is not installed")
def test_deepspeed_launcher_hostfile_pdsh(tmp_path):
    """deepspeed --hostfile (2 hosts, 3 slots) --launcher pdsh --module tracekit.capture --per-rank:
    every rank runs under its own nsys with its own outputs; TRACEKIT_NSYS reaches the remote
    ranks through .deepspeed_env (the launcher's own mechanism; the fake pdsh gives each host a
    fresh environment); the launcher's --local_rank=N reaches the training."""
    (tmp_path / "rec").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "hostfile").write_text("nodeA slots=2\nnodeB slots=1\n")
    (tmp_path / ".deepspeed_env").write_text(f"TRACEKIT_NSYS={FAKE_NSYS}\n")
    env = dict(os.environ, PATH=f"{LAUNCHERS}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
               FAKE_PDSH_LOG=str(tmp_path / "pdsh.jsonl"), HOME=str(tmp_path / "home"))
    env.pop("TRACEKIT_NSYS", None)
    done = subprocess.run([str(BIN / "deepspeed"), "--hostfile", "hostfile", "--launcher", "pdsh",
                           "--master_addr", "127.0.0.1", "--no_ssh_check",
                           "--module", "tracekit.capture", "--per-rank", "-o", "runs/z3", "--no-gpu-metrics",
                           "--", sys.executable, RECORD, str(tmp_path / "rec")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == [f"z3.rank{r}.{s}" for r in range(3) for s in ("json", "nsys-rep", "sqlite")]
    pdsh = json.loads((tmp_path / "pdsh.jsonl").read_text().splitlines()[0])["argv"]
    assert pdsh[:5] == ["-S", "-f", "1024", "-w", "nodeA,nodeB"]
    assert f"export TRACEKIT_NSYS={FAKE_NSYS};" in pdsh[5]  # from .deepspeed_env
    recs = _records(tmp_path / "rec")
    assert [r["env"]["RANK"] for r in recs] == ["0", "1", "2"]
    for r in recs:
        rank, local = int(r["env"]["RANK"]), int(r["env"]["LOCAL_RANK"])
        assert local == [0, 1, 0][rank]
        assert r["argv"][-1] == f"--local_rank={local}"  # launch.py's argument, handed on
        assert r["env"]["TRACEKIT_HOOK"] == "1" and r["env"]["TRACEKIT_NSYS"] == FAKE_NSYS
        assert r["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(runner.HOOK_DIR)
    mans = _manifests(tmp_path / "runs")
    assert sorted(mans) == [0, 1, 2]
    assert [mans[r]["rank"]["node_rank"] for r in range(3)] == [0, 0, 1]  # CROSS_RANK of launch.py
    assert all(mans[r]["rank"]["world_size"] == 3 and mans[r]["nsys"]["found_via"] == "TRACEKIT_NSYS"
               for r in range(3))


@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun is not installed")
def test_torchrun_no_python(tmp_path):
    (tmp_path / "rec").mkdir()
    done = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "--no-python",
                           str(BIN / "tracekit"), "capture", "--per-rank", "--nsys", FAKE_NSYS,
                           "-o", "t_{node_rank}", "--", sys.executable, RECORD, str(tmp_path / "rec"), "--lr", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("t_0.rank*.sqlite")) == ["t_0.rank0.sqlite", "t_0.rank1.sqlite"]
    recs = _records(tmp_path / "rec")
    assert [(r["env"]["RANK"], r["env"]["LOCAL_RANK"]) for r in recs] == [("0", "0"), ("1", "1")]
    assert all(r["argv"][1:] == ["--lr", "1"] for r in recs)  # torchrun adds no --local-rank
    # each nsys samples GPU metrics of its own GPU only (the fake lists GPU 0): rank 1's are off
    mans = _manifests(tmp_path)
    assert mans[0]["options"]["gpu_metrics_devices"] == "0"
    assert "--gpu-metrics-devices=0" in mans[0]["nsys"]["command"]
    assert mans[1]["options"]["gpu_metrics"] is False and "this rank's GPU (1" in mans[1]["gpu_metrics_note"]


def test_srun_tasks(tmp_path):
    (tmp_path / "rec").mkdir()
    env = dict(os.environ, PATH=f"{LAUNCHERS}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="3")
    done = subprocess.run(["srun", "-n", "2", "--ntasks-per-node", "1", sys.executable, "-m", "tracekit.capture",
                           "--per-rank", "--nsys", FAKE_NSYS, "-o", "s.{host}", "--", sys.executable, RECORD,
                           str(tmp_path / "rec")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    host = runner.rank_identity({})["host"]
    assert sorted(p.name for p in tmp_path.glob("*.sqlite")) == [f"s.{host}.rank0.sqlite", f"s.{host}.rank1.sqlite"]
    mans = _manifests(tmp_path)
    assert [mans[r]["rank"]["rank_from"] for r in (0, 1)] == ["SLURM_PROCID"] * 2
    assert [mans[r]["rank"]["node_rank"] for r in (0, 1)] == [0, 1]
    # one GPU per task (CUDA_VISIBLE_DEVICES=3): the fake nsys lists only GPU 0, so metrics are off
    assert all("this rank's GPU (3" in mans[r]["gpu_metrics_note"] for r in (0, 1))


def test_multinode_deepspeed_under_one_nsys_is_refused(tmp_path):
    (tmp_path / "hosts").write_text("a slots=8\nb slots=8 # comment\n\n")
    rc, out, err = run_cli("capture", "--nsys", FAKE_NSYS, "-o", tmp_path / "r", "--", "deepspeed", "--hostfile",
                           tmp_path / "hosts", "train.py", "--hostfile", "not-the-launchers")
    assert_one_line_error(rc, out, err, "outside this nsys")
    assert "--per-rank" in err and not list(tmp_path.glob("r.*"))


@pytest.mark.parametrize("cmd,multi", [
    (["deepspeed", "--hostfile", "H2", "t.py"], True),
    (["deepspeed", "-H=H2", "t.py"], True),
    (["deepspeed", "--hostfile", "H1", "t.py"], False),
    (["deepspeed", "--num_gpus", "2", "t.py", "--num_nodes", "4"], False),  # the script's own option
    (["deepspeed", "--num_nodes", "2", "t.py"], True),
    (["deepspeed", "--force_multi", "--hostfile", "H1", "t.py"], True),
    (["deepspeed", "--no_ssh", "--node_rank", "1", "--hostfile", "H2", "t.py"], False),
    (["torchrun", "--nnodes", "2", "t.py"], False),
    (["python", "t.py"], False),
])
def test_multinode_problem(tmp_path, cmd, multi):
    (tmp_path / "H1").write_text("a slots=2\n")
    (tmp_path / "H2").write_text("a slots=2\nb slots=2\n")
    assert (runner.multinode_problem(cmd, cwd=str(tmp_path)) is not None) == multi


def test_rank_identity_and_output_names():
    ident = runner.rank_identity({"RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "2", "WORLD_SIZE": "8",
                                  "SLURM_PROCID": "0"})
    assert (ident["rank"], ident["rank_from"], ident["local_rank"], ident["node_rank"], ident["world_size"]) == \
        (5, "RANK", 1, 2, 8)
    assert runner.rank_identity({"OMPI_COMM_WORLD_RANK": "3"})["rank"] == 3
    assert runner.rank_identity({"PMI_RANK": "x"})["rank"] is None
    assert runner.expand_output("runs/z3", ident, per_rank=True) == "runs/z3.rank5"
    assert runner.expand_output("runs/n{node_rank}/r{rank}.nsys-rep", ident, True) == "runs/n2/r5"
    assert runner.expand_output("a{b}", ident, False) == "a{b}"
    with pytest.raises(runner.TracekitError, match="RANK, OMPI_COMM_WORLD_RANK"):
        runner.expand_output("runs/z3", runner.rank_identity({}), per_rank=True)


@pytest.mark.parametrize("visible,local,gpu", [
    (None, 2, "2"), ("0,1,2,3", 2, "2"), ("4,5", 1, "5"), ("7", 3, "7"), ("4,5", 3, None),
    ("GPU-8f3e", 0, None), ("", 1, "1"), ("0,1", None, None),
])
def test_rank_gpu(visible, local, gpu):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert runner.rank_gpu(env, local) == gpu


def test_per_rank_without_rank_variables_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in runner.RANK_VARS}
    rc, out, err = run_cli("capture", "--per-rank", "--nsys", FAKE_NSYS, "-o", tmp_path / "r", "--", "true", env=env)
    assert_one_line_error(rc, out, err, "{rank} needs one of RANK")


def test_examples_have_main_guard():
    """SuperOffload's and ZenFlow's workers are spawned and re-import the main module."""
    root = HERE.parent
    for script in [root / "examples" / "train_llama.py", LAUNCHERS / "record_rank.py"]:
        assert 'if __name__ == "__main__":' in script.read_text(), script
    assert 'if __name__ == "__main__":' in (root / "docs" / "capture.md").read_text()
