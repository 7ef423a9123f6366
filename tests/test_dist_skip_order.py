"""The skip decision reaches every rank: four gloo ranks on CPU, DTensor parameters on 2-D meshes
((Shard(0), Shard(0)) and HSDP's (Replicate, Shard(0))), a NaN planted in each rank's shard in
turn. Every launch is a fresh set of processes (object identities differ from launch to
launch, so an order of collectives taken from them would differ too); each has a time limit, so
a hang fails the test instead of stalling CI.

Run by pytest; ``python test_dist_skip_order.py OUT_DIR`` runs one launch (what the test does
five times).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import require

WORLD = 4
LAUNCHES = 5
LAUNCH_TIMEOUT_S = 180
STEPS = 6  # step s plants a NaN on rank s (s < WORLD); steps 4 and 5 are clean
SHAPES = [(13, 5), (8,), (30, 3)]  # 13 and 30 rows split unevenly over the mesh
MESHES = {"shard-shard": ("shard", "shard"), "replicate-shard": ("replicate", "shard")}
CONFIGS = {  # each backend that runs on CPU, with clip (S reduced) and without
    "cpu-clip": dict(backend="cpu", clip=1.0),
    "reference-clip": dict(backend="reference", clip=1.0),
    "cpu-noclip": dict(backend="cpu", clip=0.0),
}


def _worker(rank: int, out_dir: str) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from conftest import dtensor_api
    from luminamoon import LuminaMoon

    _, Shard, Replicate, distribute_tensor = dtensor_api()
    mesh = init_device_mesh("cpu", (2, 2))
    out = {}
    for mesh_name, kinds in MESHES.items():
        placements = [Shard(0) if k == "shard" else Replicate() for k in kinds]
        for cfg_name, cfg in CONFIGS.items():
            gen = torch.Generator().manual_seed(0)
            params = [torch.nn.Parameter(distribute_tensor(torch.randn(s, generator=gen), mesh,
                                                           placements))
                      for s in SHAPES]
            opt = LuminaMoon(params, lr=1e-2, seed=5, **cfg)
            record = []
            for step in range(STEPS):
                for p, s in zip(params, SHAPES):
                    p.grad = distribute_tensor(torch.randn(s, generator=gen), mesh, placements)
                if step == rank:  # this rank's own shard of the first tensor only
                    params[0].grad.to_local().view(-1)[0] = float("nan")
                before = [p.to_local().clone() for p in params]
                counters = [int(opt.state[p]["step"]) if p in opt.state else 0 for p in params]
                opt.step()
                record.append(dict(
                    skipped=int(opt.skipped_steps),
                    changed=any(not torch.equal(b, p.to_local()) for b, p in zip(before, params)),
                    counters_moved=[int(opt.state[p]["step"]) - c for p, c in zip(params, counters)],
                ))
            full = [p.detach().full_tensor().tolist() for p in params]
            out[f"{mesh_name}/{cfg_name}"] = dict(record=record, full=full)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


def launch(out_dir: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import spawn_ranks

    spawn_ranks(_worker, WORLD, out_dir, out_dir)


def _run_launch(out_dir: str) -> None:
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), out_dir], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"a launch of {WORLD} ranks hung (> {LAUNCH_TIMEOUT_S} s):\n{output[-3000:]}")
    assert proc.returncode == 0, f"a launch of {WORLD} ranks failed:\n{output[-3000:]}"


def _check_launch(out_dir: str) -> None:
    ranks = []
    for r in range(WORLD):
        with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
            ranks.append(json.load(fh))
    for name in ranks[0]:
        records = [rank[name]["record"] for rank in ranks]
        expected_skipped = 0
        for step in range(STEPS):
            nan_this_step = step < WORLD
            expected_skipped += nan_this_step
            for r, rec in enumerate(records):
                got = rec[step]
                # every rank skips exactly the steps where any rank saw the NaN
                assert got["skipped"] == expected_skipped, (name, step, r, got)
                if nan_this_step:
                    assert not got["changed"], f"{name}: rank {r} changed a parameter on skipped step {step}"
                    assert got["counters_moved"] == [0] * len(SHAPES), (name, step, r, got)
                else:
                    assert got["changed"] and got["counters_moved"] == [1] * len(SHAPES), \
                        (name, step, r, got)
        # and all ranks hold the same whole tensors at the end
        for rank in ranks[1:]:
            assert rank[name]["full"] == ranks[0][name]["full"], name


@pytest.mark.slow
def test_every_rank_skips_the_same_steps_in_fresh_launches(tmp_path):
    require("gloo", "native")
    for i in range(LAUNCHES):
        out = tmp_path / f"launch{i}"
        out.mkdir()
        _run_launch(str(out))
        _check_launch(str(out))


if __name__ == "__main__":
    launch(sys.argv[1])
