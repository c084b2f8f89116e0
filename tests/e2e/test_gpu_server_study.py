"""Real Snakemake jobs in the GPU job server (`PIPELINE_GPU_SERVER=1`, on the CPU: its logic is the
device's) train the same models as jobs in their own processes, each job with its own log and
peak RSS (issue 41, item 3)."""
from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import results_of, snakemake
from tests.e2e.conftest import copy_study, tiny_config
from tests.e2e.test_interrupt import processes_naming

pytestmark = pytest.mark.e2e
MODELS = [f"{m}/n2_s0/shard{i}" for m in ("nlft-1", "taft-1") for i in (0, 1)]


def test_jobs_in_the_gpu_server_train_the_models_of_jobs_in_their_own_process(tmp_path, sockets):
    cfg = tiny_config()
    cfg.update(methods={k: cfg["methods"][k] for k in ("nlft-1", "taft-1")}, shards=[2],
               fusion={"enabled": False}, forget={"study": {"enabled": False}}, last_grid={"enabled": False},
               search={"enabled": False})
    models = {}
    try:
        for mode in ("0", "1"):  # the second run starts from the first's prepared data, backbone and features
            wd = tmp_path / f"gpu_server_{mode}"
            if mode == "1":
                copy_study(tmp_path / "gpu_server_0", wd)
            wd.mkdir(exist_ok=True)
            (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
            targets = [f"results/tiny/train/{m}.safetensors" for m in MODELS]
            snakemake(wd, "--cores", "2", *targets, timeout=900, PIPELINE_GPU_SERVER=mode, PIPELINE_FORKSERVER="0",
                      TMPDIR=str(sockets))
            models[mode] = {m: load_file(results_of(wd) / "train" / f"{m}.safetensors") for m in MODELS}
            for m in MODELS:
                log = results_of(wd) / "logs" / "train" / f"{m}.log"
                rss = json.loads(log.with_name(log.stem + ".rss.json").read_text())
                assert "[launch] peak RSS" in log.read_text()
                assert rss["measured_by"] == ("VmHWM: gpu-server worker" if mode == "1" else "wait4: job process")
                assert rss["peak_rss_mb"] > 50  # torch, the model and its data
    finally:
        for pid in processes_naming(sockets):  # the server and its workers, started here
            os.kill(pid, signal.SIGKILL)
    for m in MODELS:
        own, served = models["0"][m], models["1"][m]
        assert own.keys() == served.keys()
        for k in own:  # the same code and thread count; a tolerance, not bit equality (threads may split sums)
            torch.testing.assert_close(served[k], own[k], rtol=1e-5, atol=1e-6, msg=f"{m}: {k}")
