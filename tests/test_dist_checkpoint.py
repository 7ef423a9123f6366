"""torch.distributed.checkpoint (DCP) of a sharded LuminaMoon, on CPU ranks over gloo.

Four ranks on a 2x2 mesh (FSDP2-style Shard(0) x tensor-parallel Shard(1), and HSDP's
Replicate x Shard(0)) take two steps, save the model and optimizer with
get_model_state_dict/get_optimizer_state_dict and dcp.save, and take two more. The same four
ranks, from fresh modules, load and take the last two steps again: bitwise the run that never
stopped. Two ranks on a 1-D mesh with other placements load the same checkpoint (DCP reshards
it) and take the last two steps: bitwise the unsharded single-process run of all four steps.
Moments, p_init, step counters, the seed, the skipped-step count and the rounding format all
travel through the checkpoint (a NaN gradient at step 2 is skipped before the save)."""
from __future__ import annotations

import pytest
import torch

from conftest import bits, dtensor_api, require, spawn_ranks

require("gloo", "distributed checkpoint")

STEPS = 4
SAVE_AFTER = 2
NAN_STEP = 1  # 0-based: the second step is skipped, before the save
SHAPES = {"w": (13, 10), "b": (21,)}
HYPER = dict(lr=2e-2, clip=0.0, bound_mode="rel", bound=0.5, state_dtype=torch.bfloat16,
             seed=4321)
PLACEMENTS_4 = {"w": ("S0", "S1"), "b": ("R", "S0")}  # mesh (2, 2)
PLACEMENTS_2 = {"w": ("S1",), "b": ("S0",)}  # mesh (2,)


class _Model(torch.nn.Module):
    def __init__(self, init):
        super().__init__()
        self.w = torch.nn.Parameter(init["w"].clone())
        self.b = torch.nn.Parameter(init["b"].clone())


def _data():
    gen = torch.Generator().manual_seed(11)
    init = {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in SHAPES.items()}
    grads = [{n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in SHAPES.items()}
             for _ in range(STEPS)]
    grads[NAN_STEP]["w"][12, 9] = float("nan")  # in the last shard
    return init, grads


def _placements(names):
    _, Shard, Replicate, _ = dtensor_api()
    return [Replicate() if n == "R" else Shard(int(n[1:])) for n in names]


def _sharded_model(init, mesh, placements):
    _, _, _, distribute_tensor = dtensor_api()
    model = _Model(init)
    for name, names in placements.items():
        p = getattr(model, name)
        setattr(model, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh,
                                                                  _placements(names))))
    return model


def _steps(model, opt, grads, mesh=None, placements=None):
    _, _, _, distribute_tensor = dtensor_api()
    for g in grads:
        for name, p in model.named_parameters():
            full = g[name].clone()
            p.grad = full if mesh is None else distribute_tensor(full, mesh,
                                                                 _placements(placements[name]))
        opt.step()


def _full(model, opt):
    """The whole tensors of every parameter and state, and the scalars, keyed by name."""
    def whole(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    out = {"skipped": int(opt.skipped_steps), "seed": opt.param_groups[0]["seed"],
           "rounding_stream": opt.param_groups[0]["rounding_stream"]}
    for name, p in model.named_parameters():
        out[name] = whole(p.detach()).clone()
        for key in ("exp_avg", "exp_avg_sq", "p_init"):
            out[f"{name}.{key}"] = whole(opt.state[p][key]).clone()
        out[f"{name}.step"] = int(opt.state[p]["step"])
    return out


def _save_and_continue(rank, ckpt, out_path):
    """4 ranks: two steps, save, two steps (the run that never stopped); then fresh modules
    load the checkpoint and take the same two steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh

    from luminamoon import LuminaMoon

    mesh = init_device_mesh("cpu", (2, 2))
    init, grads = _data()
    model = _sharded_model(init, mesh, PLACEMENTS_4)
    opt = LuminaMoon(model.parameters(), **HYPER)
    _steps(model, opt, grads[:SAVE_AFTER], mesh, PLACEMENTS_4)
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=ckpt)
    _steps(model, opt, grads[SAVE_AFTER:], mesh, PLACEMENTS_4)
    straight = _full(model, opt)

    # fresh modules (other initial values, another seed): everything must come from the file
    other = {n: torch.zeros_like(t) for n, t in init.items()}
    model2 = _sharded_model(other, mesh, PLACEMENTS_4)
    opt2 = LuminaMoon(model2.parameters(), **{**HYPER, "seed": 99})
    state = {"model": get_model_state_dict(model2), "optim": get_optimizer_state_dict(model2, opt2)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model2, state["model"])
    set_optimizer_state_dict(model2, opt2, optim_state_dict=state["optim"])
    loaded = _full(model2, opt2)
    _steps(model2, opt2, grads[SAVE_AFTER:], mesh, PLACEMENTS_4)
    resumed = _full(model2, opt2)
    if rank == 0:
        torch.save({"straight": straight, "resumed": resumed, "loaded": loaded}, out_path)


def _reshard(rank, ckpt, out_path):
    """2 ranks, another mesh and other placements: load the 4-rank checkpoint, two steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh

    from luminamoon import LuminaMoon

    mesh = init_device_mesh("cpu", (2,))
    init, grads = _data()
    other = {n: torch.zeros_like(t) for n, t in init.items()}
    model = _sharded_model(other, mesh, PLACEMENTS_2)
    opt = LuminaMoon(model.parameters(), **{**HYPER, "seed": 5})
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, optim_state_dict=state["optim"])
    _steps(model, opt, grads[SAVE_AFTER:], mesh, PLACEMENTS_2)
    result = _full(model, opt)  # (full_tensor is a collective: every rank)
    if rank == 0:
        torch.save(result, out_path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcp")
    ckpt = str(tmp / "ckpt")
    four, two = str(tmp / "four.pt"), str(tmp / "two.pt")
    (tmp / "s4").mkdir()
    (tmp / "s2").mkdir()
    spawn_ranks(_save_and_continue, 4, str(tmp / "s4"), ckpt, four)
    spawn_ranks(_reshard, 2, str(tmp / "s2"), ckpt, two)
    return torch.load(four), torch.load(two)


def _plain():
    from luminamoon import LuminaMoon

    init, grads = _data()
    model = _Model(init)
    opt = LuminaMoon(model.parameters(), **HYPER)
    _steps(model, opt, grads)
    return _full(model, opt)


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert torch.equal(bits(got[key]), bits(want[key])), key
        else:
            assert got[key] == want[key], key


def test_the_sharded_run_is_the_unsharded_run(runs):
    four, _ = runs
    want = _plain()
    assert want["skipped"] == 1 and want["w.step"] == STEPS - 1
    _assert_same(four["straight"], want)


def test_a_load_brings_back_every_state_and_scalar(runs):
    four, _ = runs
    loaded = four["loaded"]
    assert loaded["seed"] == HYPER["seed"]  # not the fresh optimizer's 99
    assert loaded["skipped"] == 1 and loaded["rounding_stream"] == 2
    assert loaded["w.step"] == loaded["b.step"] == SAVE_AFTER - 1
    init, _ = _data()
    assert torch.equal(bits(loaded["w.p_init"]), bits(init["w"]))  # not the fresh zeros


def test_resume_on_the_same_mesh_is_bitwise_the_run_that_never_stopped(runs):
    four, _ = runs
    _assert_same(four["resumed"], four["straight"])


def test_resume_on_another_mesh_continues_as_the_unsharded_run(runs):
    _, two = runs
    _assert_same(two, _plain())
