"""Data-parallel training on CPU with msrun: 2 workers, 127.0.0.1 only, every run time-bounded."""
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from src.utils.device import check_fusion_config, fusion_config_for
from tests.helpers import CIFAR_SAMPLE, ROOT

LAUNCH_TIMEOUT = 420  # seconds any launch may take before the test fails


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_first_env():
    """The environment with this interpreter's folder first on PATH: msrun starts its workers
    with ``python`` from PATH, which must be the one running the tests (venv or not)."""
    return dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def launcher(*args, timeout=LAUNCH_TIMEOUT):
    env = python_first_env()
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"),
                           *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_two_ranks_hold_identical_parameters_equal_to_a_single_process(tmp_path):
    data = os.path.join(CIFAR_SAMPLE, "test")  # 3 steps x 16 images: 5 of each class
    worker = os.path.join(ROOT, "tests", "dist_worker.py")
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    dist = subprocess.run([msrun, "--worker_num", "2", "--local_worker_num", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                           "--log_dir", str(tmp_path / "logs"), "--join", "True",
                           "--cluster_time_out", "60", worker, "--out", str(tmp_path),
                           "--data_path", data], env=python_first_env(), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT, check=False)
    assert dist.returncode == 0, dist.stdout[-2000:] + dist.stderr[-2000:]
    single = subprocess.run([sys.executable, worker, "--out", str(tmp_path), "--single",
                             "--data_path", data], capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT, check=False)
    assert single.returncode == 0, single.stderr[-2000:]
    ranks = [np.load(tmp_path / f"rank{r}_of2.npz") for r in range(2)]
    ref = np.load(tmp_path / "single.npz")
    assert len(ref.files) == 62
    for name in ref.files:
        # the all-reduce hands both ranks the same averaged gradient: bit-identical
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    # vs one process over the concatenated batch: the same gradient, summed in another order
    # (two half-batch means averaged vs one full-batch mean), so float32 rounding only.
    worst = max(float(np.abs(ranks[0][n] - ref[n]).max() / np.abs(ref[n]).max()) for n in ref.files)
    print(f"\n[dist] 3 steps, 2 ranks x 8 vs 1 x 16: worst parameter rel diff {worst:.2e}")
    assert worst < 1e-5


def worker_pids(marker):
    """PIDs of train.py worker processes (not msrun's scheduler, which runs the same script)
    whose command line contains ``marker``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 1 and argv[1].endswith(b"train.py") and marker.encode() in b" ".join(argv)
                and b"MS_ROLE=MS_WORKER" in environ):
            pids.append(int(pid))
    return pids


def test_a_killed_worker_fails_the_launch_quickly(tmp_path):
    out = tmp_path / "killed"
    env = python_first_env()
    proc = subprocess.Popen(
        ["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"), "--master_port",
         str(free_port()), "--cluster_time_out", "30", "data/cifar10_sample/train",
         "configs/quick_start.yaml", str(out), "--epoch_size", "50", "--run_eval", "false"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:  # wait until both ranks train
            logs = [out / "logs" / f"worker_{r}.log" for r in range(2)]
            if all(p.exists() and "loss" in p.read_text(errors="replace") for p in logs):
                break
            time.sleep(2)
        pids = worker_pids(str(out))
        assert len(pids) == 2, f"expected 2 workers, found {pids}"
        killed_at = time.time()
        os.kill(max(pids), signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
        elapsed = time.time() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in worker_pids(str(out)):
            os.kill(pid, signal.SIGKILL)
    print(f"\n[dist] launch exited {proc.returncode} {elapsed:.0f} s after a worker was killed")
    assert proc.returncode != 0
    assert "distributed training failed" in stderr and str(out / "logs") in stderr
    assert elapsed < 240


def test_two_hosts_on_loopback(tmp_path):
    """Multi-host msrun, as documented: two launches, one worker each, node ranks 0 and 1."""
    port = free_port()
    env = python_first_env()
    common = ["--device_num", "1", "--worker_num", "2", "--master_addr", "127.0.0.1",
              "--master_port", str(port), "--cluster_time_out", "90"]
    # msrun starts the scheduler on the host that owns master_addr; on one machine both
    # "hosts" own 127.0.0.1, so the second host's launcher gets an msrun that answers as a
    # real second machine would (not the master) and starts workers only.
    not_master = tmp_path / "msrun_not_master"
    not_master.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "from mindspore.parallel.cluster.process_entity import _api\n"
        "_api._is_local_ip = lambda address: False\n"
        "from mindspore.parallel.cluster.run import main\nsys.exit(main())\n")
    not_master.chmod(0o755)
    hosts = []
    for node in range(2):
        node_env = dict(env, MSRUN=str(not_master)) if node else env
        hosts.append(subprocess.Popen(
            ["bash", os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh"), *common,
             "--node_rank", str(node), "data/cifar10_sample/train", "configs/quick_start.yaml",
             str(tmp_path / f"host{node}"), "--epoch_size", "1", "--run_eval", "false",
             "--batch_size", "16"],
            cwd=ROOT, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [h.communicate(timeout=LAUNCH_TIMEOUT) for h in hosts]
    for h, (stdout, stderr) in zip(hosts, results):
        assert h.returncode == 0, stdout[-1500:] + stderr[-1500:]
    log0 = (tmp_path / "host0" / "train.log").read_text()
    assert "16 per device x 2 devices" in log0
    assert (tmp_path / "host0" / "resnet18-1_31.ckpt").exists()  # rank 0 saves
    assert not list((tmp_path / "host1").glob("*.ckpt"))  # rank 1 does not


def test_launcher_usage_and_argument_errors(tmp_path):
    result = launcher()
    assert result.returncode == 2 and "usage: bash" in result.stderr
    result = launcher(tmp_path / "nope", "configs/quick_start.yaml", tmp_path / "out")
    assert result.returncode == 2 and "is not a folder" in result.stderr
    result = launcher("--device_num", "two", "data", "configs/quick_start.yaml", tmp_path)
    assert result.returncode == 2 and "device_num must be an integer" in result.stderr


def test_fusion_config_is_checked_against_the_network():
    check_fusion_config([85, 160], 161, "resnet50")
    with pytest.raises(ValueError, match=r"within \[1, 61\] \(62 trainable tensors\).*33,61"):
        check_fusion_config([85, 160], 62, "resnet18")
    with pytest.raises(ValueError, match="strictly increasing"):
        check_fusion_config([100, 50], 161, "resnet50")
    assert fusion_config_for(161) == [85, 160]
