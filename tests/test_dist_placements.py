"""Every DTensor placement torch's parallelisms give a parameter, on CPU ranks over gloo:
1-D meshes of 2 ranks and 2-D meshes of 4 (FSDP2 Shard(0) on the data-parallel dim with tensor
parallelism's Shard(0)/Shard(1) on the model-parallel dim, HSDP's Replicate x Shard(0)), uneven
shards and shards that start inside a group of eight elements. Each sharded run is compared
with the unsharded single-process run of the same steps: bitwise without the clip (params,
moments, the skip decision and, with bf16 storage, every stochastic rounding bit); with the
clip, where S is summed shard by shard, to the last float32 bit of the threshold."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import bits, dtensor_api, require, spawn_ranks

require("gloo")

STEPS = 4
NAN_STEP = 2
# shapes whose shards are uneven on 2 ranks and start off a multiple of eight
SHAPES = {"mat": (13, 11), "cube": (5, 6, 7), "vec": (29,)}

CONFIGS = {
    # bitwise against the unsharded run
    "bf16-sr": dict(dtype=torch.bfloat16, cfg=dict(clip=0.0, bound_mode="abs", bound=0.05,
                                                     state_dtype=torch.bfloat16)),
    "fp32": dict(dtype=torch.float32, cfg=dict(clip=0.0, weight_decay=0.1)),
    # S summed over shards: the threshold may move in its last float32 bit
    "bf16-sr-clip": dict(dtype=torch.bfloat16, cfg=dict(clip=1.0, bound_mode="rel", bound=0.5)),
}

# (mesh shape, placements by name); 1-D meshes run on 2 ranks, 2-D meshes on 4
PLACEMENTS_1D = {
    "S0": ("S0",), "S1": ("S1",), "S-1": ("S-1",), "R": ("R",),
}
PLACEMENTS_2D = {
    "fsdp-tp-colwise": ("S0", "S0"),  # FSDP2 Shard(0) over TP Shard(0)
    "fsdp-tp-rowwise": ("S0", "S1"),  # FSDP2 Shard(0) over TP Shard(1)
    "hsdp": ("R", "S0"),
    "tp-only": ("R", "S1"),
    "S1-S0": ("S1", "S0"),
}
# (FSDP2 over a tensor-parallel Shard(0) gives _StridedShard, which distribute_tensor does not
# make: test_dist_wrappers.py steps it through fully_shard over parallelize_module)


def _placements(names):
    _, Shard, Replicate, _ = dtensor_api()
    out = []
    for n in names:
        out.append(Replicate() if n == "R" else Shard(int(n[1:])))
    return out


def _dim(name: str) -> int:
    return int(name[1:])


def _data(shape, dtype, nan_at):
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    init = torch.randn(shape, generator=gen).to(dtype)
    grads = [torch.randn(shape, generator=gen).to(dtype) for _ in range(STEPS)]
    flat = grads[NAN_STEP].view(-1)
    flat[nan_at % flat.numel()] = float("nan")
    return init, grads


def _nan_at(shape):
    return math.prod(shape) - 3  # in the last shard on every mesh


def _run(make, cfg, dtype, shape):
    """Steps the parameter that ``make(tensor)`` wraps; the full results."""
    from luminamoon import LuminaMoon

    init, grads = _data(shape, dtype, _nan_at(shape))
    p = torch.nn.Parameter(make(init.clone()))
    opt = LuminaMoon([p], lr=2e-2, seed=1234, **cfg)
    for g in grads:
        p.grad = make(g.clone())
        opt.step()
    full = (lambda t: t.full_tensor()) if hasattr(p, "full_tensor") else (lambda t: t)
    state = opt.state[p]
    return {"p": full(p.detach()), "m": full(state["exp_avg"]), "v": full(state["exp_avg_sq"]),
            "skipped": int(opt.skipped_steps), "step": int(state["step"])}


def _worker(rank, mesh_shape, placements, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    _, _, _, distribute_tensor = dtensor_api()
    mesh = init_device_mesh("cpu", mesh_shape)
    results = {}
    for pname, names in placements.items():
        for shape_name, shape in SHAPES.items():
            if any(n[0] == "S" and _dim(n) >= len(shape) for n in names):
                continue
            pl = _placements(names)
            for cname, c in CONFIGS.items():
                make = lambda t: distribute_tensor(t, mesh, pl)  # noqa: E731
                results[(pname, shape_name, cname)] = _run(make, c["cfg"], c["dtype"], shape)
    if len(mesh_shape) == 1:
        results["refusals"] = _refusals(mesh, distribute_tensor)
    if rank == 0:
        torch.save(results, out_path)


def _refusals(mesh, distribute_tensor):
    """What an explicit fast backend says to a Shard(1) with stochastic rounding, and what a
    Partial placement gets; the parameter must be left as it was."""
    from luminamoon import LuminaMoon

    try:
        from torch.distributed.tensor import DTensor, Partial
    except ImportError:
        from torch.distributed._tensor import DTensor
        from torch.distributed._tensor.placement_types import _Partial as Partial
    _, Shard, _, _ = dtensor_api()
    out = {}
    init = torch.randn(6, 10, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    p = torch.nn.Parameter(distribute_tensor(init.clone(), mesh, [Shard(1)]))
    p.grad = distribute_tensor(torch.ones(6, 10, dtype=torch.bfloat16), mesh, [Shard(1)])
    before = p.detach().to_local().clone()
    try:
        LuminaMoon([p], lr=1e-2, backend="cpu").step()
        out["cpu-shard1"] = None
    except ValueError as exc:
        out["cpu-shard1"] = str(exc)
    out["cpu-shard1-unchanged"] = torch.equal(bits(before), bits(p.detach().to_local()))
    # without stochastic rounding the index map does not matter: the engine steps it
    opt = LuminaMoon([p], lr=1e-2, backend="cpu", stochastic_rounding=False)
    opt.step()
    out["cpu-shard1-rne-stepped"] = not torch.equal(bits(before), bits(p.detach().to_local()))
    q = torch.nn.Parameter(DTensor.from_local(torch.ones(4), mesh, [Partial()]))
    try:
        LuminaMoon([q], lr=1e-2)
        out["partial"] = None
    except ValueError as exc:
        out["partial"] = str(exc)
    return out


def _sharded(tmp_path_factory, world, mesh_shape, placements):
    tmp = tmp_path_factory.mktemp(f"placements{world}")
    out = str(tmp / "out.pt")
    spawn_ranks(_worker, world, str(tmp), mesh_shape, placements, out)
    return torch.load(out)


@pytest.fixture(scope="module")
def results_1d(tmp_path_factory):
    return _sharded(tmp_path_factory, 2, (2,), PLACEMENTS_1D)


@pytest.fixture(scope="module")
def results_2d(tmp_path_factory):
    return _sharded(tmp_path_factory, 4, (2, 2), PLACEMENTS_2D)


_PLAIN = {}


def _plain(shape_name, cname):
    key = (shape_name, cname)
    if key not in _PLAIN:
        c = CONFIGS[cname]
        _PLAIN[key] = _run(lambda t: t, c["cfg"], c["dtype"], SHAPES[shape_name])
    return _PLAIN[key]


def _check(got, want, cname):
    assert got["skipped"] == want["skipped"] == 1  # every rank skipped for one rank's NaN
    assert got["step"] == want["step"] == STEPS - 1
    if CONFIGS[cname]["cfg"]["clip"] == 0:
        for name in ("p", "m", "v"):
            assert torch.equal(bits(got[name]), bits(want[name])), name
        return
    # the moments do not depend on S: bitwise; the params move only where q is at an edge
    for name in ("m", "v"):
        assert torch.equal(bits(got[name]), bits(want[name])), name
    diff = got["p"].double() - want["p"].double()
    ulp = want["p"].double().abs() * 2.0**-7 + 1e-30
    assert int((diff != 0).sum()) <= max(2, want["p"].numel() // 50)
    assert bool((diff.abs() <= ulp).all())


def _cases(placements):
    out = []
    for pname, names in placements.items():
        for shape_name, shape in SHAPES.items():
            if any(n[0] == "S" and _dim(n) >= len(shape) for n in names):
                continue
            for cname in CONFIGS:
                out.append((pname, shape_name, cname))
    return out


@pytest.mark.parametrize("case", _cases(PLACEMENTS_1D), ids="-".join)
def test_1d_mesh_placement_equals_unsharded(case, results_1d):
    pname, shape_name, cname = case
    _check(results_1d[case], _plain(shape_name, cname), cname)


def test_explicit_engine_refuses_a_strided_shard_with_rounding_and_changes_nothing(results_1d):
    got = results_1d["refusals"]
    assert got["cpu-shard1"] is not None and "Shard(1)" in got["cpu-shard1"]
    assert "backend='auto' or 'reference'" in got["cpu-shard1"]
    assert got["cpu-shard1-unchanged"]
    assert got["cpu-shard1-rne-stepped"]


def test_partial_placement_is_refused_with_the_fix(results_1d):
    msg = results_1d["refusals"]["partial"]
    assert msg is not None and "Partial" in msg and "redistribute" in msg


@pytest.mark.parametrize("case", _cases(PLACEMENTS_2D), ids="-".join)
def test_2d_mesh_placement_equals_unsharded(case, results_2d):
    pname, shape_name, cname = case
    _check(results_2d[case], _plain(shape_name, cname), cname)
